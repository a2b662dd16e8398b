// hone/core/roles.hpp: policy roles and the compile-time machinery that picks one policy per role
// from a composing type's parameter pack (hone::trainer, hone::replay_buffer, and every later
// composing type: loader, batcher, ...), in any order, with defaults for missing roles.
//
// A policy names its role with a nested alias:
//   struct my_clip { using role = hone::roles::clipping; ... };
// hone::pick<Role, Default, Policies...> is the policy of that role (Default when absent);
// hone::pick_for<Composer, Role, Default, Policies...> is the same with the composing type named
// in the sentence that stops compilation when two policies claim one role. A composing type
// declares its name once with HONE_DETAIL_DECLARE_COMPOSER (below), so every message of the role
// machinery starts with "hone::trainer: ...", "hone::replay_buffer: ...", and so on.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN

/// The roles of the training step's policies. Other modules add their own roles to this
/// namespace (hone/rl/roles.hpp: replay_storage, replay_sampler, ...).
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
/// How the accumulated gradients of several processes are combined before the update (the
/// default, hone::local_gradients, leaves them as they are: one process).
struct gradient_reduction {
  static constexpr const char* name = "gradient reduction";
};
/// Who is told when each phase of a step begins and ends (timings, traces); the default,
/// hone::no_step_observer, compiles to nothing.
struct step_observer {
  static constexpr const char* name = "step observer";
};
/// Who watches a metric the caller measures (a validation loss) and says when training should
/// stop, keeping the best weights; the default, hone::no_early_stopping, watches nothing.
struct early_stopping {
  static constexpr const char* name = "early stopping";
};
/// What holds the master weights to a rule after every applied update (pruning masks that keep
/// pruned weights at zero, ...); the default, hone::no_weight_constraint, leaves them as they are.
struct weight_constraint {
  static constexpr const char* name = "weight constraint";
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

/// Index of the (first) policy playing Role in the pack; sizeof...(Policies) when none does.
template <class Role, class... Policies>
inline constexpr std::size_t role_index_v = [] {
  constexpr bool plays[] = {plays_role_v<Policies, Role>..., false};
  for (std::size_t i = 0; i < sizeof...(Policies); ++i) {
    if (plays[i]) return i;
  }
  return sizeof...(Policies);
}();

/// Tags naming the composing types in the role machinery's messages.
namespace composers {
struct any {};  ///< a composing type that declared no name of its own
struct trainer {};
struct replay_buffer {};
}  // namespace composers

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

/// The checks behind pick_for and check_roles_for, one specialization per composing type (each
/// with its own sentences: static_assert messages must be literals). The primary template serves
/// composing types that declared no name.
template <class Composer>
struct role_checks {
  template <class Role, class... Policies>
  struct unique {
    static_assert(role_count_v<Role, Policies...> <= 1,
                  "hone: two policies play the same role in one composing type (see Role in this "
                  "message's instantiation, e.g. hone::roles::optimizer). Keep one policy per "
                  "role: remove the duplicate from its template arguments.");
    static constexpr bool value = role_count_v<Role, Policies...> <= 1;
  };
  template <class... Policies>
  static consteval bool all_have_roles() {
    static_assert((has_role<Policies> && ...),
                  "hone: one of the template arguments is not a hone policy: it has no nested "
                  "`using role = hone::roles::<role>;`.");
    return (has_role<Policies> && ...);
  }
};
}  // namespace detail

/// Declares a composing type's name for the role machinery's sentences: NAME is a string literal
/// such as "hone::trainer", EXAMPLES a sentence listing policies a user may pass. Expands at
/// namespace scope inside HONE_NAMESPACE_BEGIN/END, after this header.
#define HONE_DETAIL_DECLARE_COMPOSER(TAG, NAME, EXAMPLES)                                     \
  namespace detail {                                                                          \
  template <>                                                                                 \
  struct role_checks<TAG> {                                                                   \
    template <class Role, class... Policies>                                                  \
    struct unique {                                                                           \
      static_assert(role_count_v<Role, Policies...> <= 1, NAME                                \
                    ": two policies play the same role (see Role in this message's "          \
                    "instantiation, e.g. hone::roles::optimizer). Keep one policy per role: " \
                    "remove the duplicate from the " NAME "'s template arguments.");          \
      static constexpr bool value = role_count_v<Role, Policies...> <= 1;                     \
    };                                                                                        \
    template <class... Policies>                                                              \
    static consteval bool all_have_roles() {                                                  \
      static_assert((has_role<Policies> && ...), NAME                                         \
                    ": one of the template arguments is not a hone policy: it has no "        \
                    "nested `using role = hone::roles::<role>;`. " EXAMPLES);                 \
      return (has_role<Policies> && ...);                                                     \
    }                                                                                         \
  };                                                                                          \
  }

HONE_DETAIL_DECLARE_COMPOSER(composers::trainer, "hone::trainer",
                             "Pass policies such as hone::bf16_mixed, hone::accumulate::steps<4>, "
                             "hone::adamw, hone::clip_grad_norm, hone::one_cycle.")

/// The policy of Policies playing Role, or Default when none does; a duplicate stops compilation
/// with a sentence that names Composer (a tag of hone::composers).
template <class Composer, class Role, class Default, class... Policies>
requires detail::role_checks<Composer>::template unique<Role, Policies...>::value using pick_for =
    typename detail::pick_impl<Role, Default, Policies...>::type;

/// pick_for without a composing type's name in the messages.
template <class Role, class Default, class... Policies>
using pick = pick_for<composers::any, Role, Default, Policies...>;

/// Every policy given to a composing type must name a role (a plain type by mistake, or a policy
/// meant for another library, is caught here with a sentence instead of being ignored).
template <class Composer, class... Policies>
consteval bool check_roles_for() {
  return detail::role_checks<Composer>::template all_have_roles<Policies...>();
}

/// check_roles_for<composers::trainer, Policies...>: the trainer's check (kept under its
/// historical name).
template <class... Policies>
consteval bool check_policies_have_roles() {
  return check_roles_for<composers::trainer, Policies...>();
}

/// The object playing Role among `policies`, or Default{} when none does (a copy).
template <class Role, class Default, class... Policies>
auto policy_of(const Policies&... policies) {
  using picked = typename detail::pick_impl<Role, Default, Policies...>::type;
  constexpr std::size_t i = role_index_v<Role, Policies...>;
  if constexpr (i < sizeof...(Policies)) {
    return picked(std::get<i>(std::forward_as_tuple(policies...)));
  } else {
    return Default{};
  }
}

HONE_NAMESPACE_END
