// hone/train/roles.hpp: policy roles and the compile-time machinery that picks one policy per
// role from a trainer's parameter pack, in any order, with defaults for missing roles.
//
// A policy names its role with a nested alias:   struct my_clip { using role =
// hone::roles::clipping; ... }; hone::pick<Role, Default, Policies...> is the policy of that role
// (Default when absent) and stops compilation with a sentence when two policies claim the same
// role.
#pragma once

#include <cstddef>
#include <type_traits>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN

namespace roles {
struct precision {
  static constexpr const char* name = "precision";
};
struct accumulation {
  static constexpr const char* name = "accumulation";
};
struct optimizer {
  static constexpr const char* name = "optimizer";
};
struct clipping {
  static constexpr const char* name = "clipping";
};
struct schedule {
  static constexpr const char* name = "schedule";
};
struct checkpoint {
  static constexpr const char* name = "checkpoint";
};
struct offload {
  static constexpr const char* name = "offload";
};
}  // namespace roles

/// True when P declares `using role = ...`.
template <class P>
concept has_role = requires {
  typename P::role;
};

template <class P, class Role>
inline constexpr bool plays_role_v = [] {
  if constexpr (has_role<P>) {
    return std::is_same_v<typename P::role, Role>;
  } else {
    return false;
  }
}();

/// How many of Policies play Role.
template <class Role, class... Policies>
inline constexpr std::size_t role_count_v = (std::size_t{0} + ... +
                                             (plays_role_v<Policies, Role> ? 1 : 0));

namespace detail {
template <class Role, class Default, class... Policies>
struct pick_impl {
  using type = Default;
};
template <class Role, class Default, class P, class... Rest>
struct pick_impl<Role, Default, P, Rest...> {
  using type = std::conditional_t<plays_role_v<P, Role>, P,
                                  typename pick_impl<Role, Default, Rest...>::type>;
};

template <class Role, class... Policies>
struct unique_role_check {
  static_assert(role_count_v<Role, Policies...> <= 1,
                "hone::trainer: two policies play the same role (see Role in this message's "
                "instantiation, e.g. hone::roles::optimizer). Keep one policy per role: remove "
                "the duplicate from the trainer's template arguments.");
  static constexpr bool value = role_count_v<Role, Policies...> <= 1;
};
}  // namespace detail

/// The policy of Policies playing Role, or Default when none does. A duplicate is a compile error.
template <class Role, class Default, class... Policies>
requires detail::unique_role_check<Role, Policies...>::value using pick =
    typename detail::pick_impl<Role, Default, Policies...>::type;

/// Every policy given to a trainer must name a role (a plain type by mistake, or a policy meant
/// for another library, is caught here with a sentence instead of being ignored).
template <class... Policies>
consteval bool check_policies_have_roles() {
  static_assert((has_role<Policies> && ...),
                "hone::trainer: one of the template arguments is not a hone policy: it has no "
                "nested `using role = hone::roles::<role>;`. Pass policies such as "
                "hone::bf16_mixed, hone::accumulate::steps<4>, hone::adamw, "
                "hone::clip_grad_norm, hone::one_cycle.");
  return (has_role<Policies> && ...);
}

HONE_NAMESPACE_END
