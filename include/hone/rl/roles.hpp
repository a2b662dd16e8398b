// hone/rl/roles.hpp: the roles of a replay buffer's policies, and the compile-time pick of one
// policy per role from hone::replay_buffer's parameter pack (any order, defaults for the missing
// roles, a sentence for duplicates and for arguments that are not replay policies).
//
//   storage      where transitions live          hone::auto_storage (default), hone::ring_storage,
//                                                hone::packed_storage, hone::mmap_storage
//   sampler      which items a sample returns    hone::uniform (default), hone::prioritized<>
//   concurrency  who may call what at once       hone::single_thread (default), hone::many_writers
//   returns      what one stored item sums up    hone::one_step (default), hone::n_step<N>
#pragma once

#include <cstddef>
#include <type_traits>

#include "hone/core/config.hpp"
#include "hone/core/roles.hpp"

HONE_NAMESPACE_BEGIN

namespace roles {
struct replay_storage {
  static constexpr const char* name = "replay storage";
};
struct replay_sampler {
  static constexpr const char* name = "replay sampler";
};
struct replay_concurrency {
  static constexpr const char* name = "replay concurrency";
};
struct replay_returns {
  static constexpr const char* name = "replay returns";
};
}  // namespace roles

namespace detail {
/// The default "slots are known" hook of the samplers: nothing.
struct ignore_slots {
  template <class Span>
  void operator()(const Span& /*slots*/) const noexcept {}
};

template <class P>
concept has_replay_role = requires {
  typename P::role;
}
&&(std::is_same_v<typename P::role, roles::replay_storage> ||
   std::is_same_v<typename P::role, roles::replay_sampler> ||
   std::is_same_v<typename P::role, roles::replay_concurrency> ||
   std::is_same_v<typename P::role, roles::replay_returns>);

template <class... Policies>
consteval bool check_replay_policies() {
  static_assert((has_replay_role<Policies> && ...),
                "hone::replay_buffer<Transition, Policies...>: one of the policies is not a replay "
                "policy (it has no nested `using role = hone::roles::replay_...;`). Pass "
                "hone::ring_storage, hone::packed_storage, hone::uniform, hone::prioritized<>, "
                "hone::single_thread, "
                "hone::many_writers, hone::one_step or hone::n_step<N>.");
  static_assert(role_count_v<roles::replay_storage, Policies...> <= 1,
                "hone::replay_buffer: two storage policies; keep one.");
  static_assert(role_count_v<roles::replay_sampler, Policies...> <= 1,
                "hone::replay_buffer: two sampler policies (e.g. hone::uniform and "
                "hone::prioritized<>); keep one.");
  static_assert(role_count_v<roles::replay_concurrency, Policies...> <= 1,
                "hone::replay_buffer: two concurrency policies (hone::single_thread and "
                "hone::many_writers); keep one.");
  static_assert(role_count_v<roles::replay_returns, Policies...> <= 1,
                "hone::replay_buffer: two return policies (hone::one_step and hone::n_step<N>); "
                "keep one.");
  return true;
}
}  // namespace detail

HONE_NAMESPACE_END
