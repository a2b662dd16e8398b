// hone/rl/n_step.hpp: n-step returns, aggregated as the transitions arrive (per writer, so every
// actor / environment keeps its own window and episodes never mix).
//
// With hone::n_step<N> a stored item t holds
//   reward      r_t + gamma r_{t+1} + ... + gamma^(k-1) r_{t+k-1}
//   next_*      the next_* fields of step t+k-1 (every field whose name starts with "next_")
//   terminated  terminated of step t+k-1 (true: the episode ended in a terminal state)
//   truncated   truncated of step t+k-1 (true: cut by a time limit; bootstrap from next_obs)
//   discount    gamma^k, the factor of the bootstrap value
// and every other field (obs, action, ...) from step t, where k = N, or fewer when the episode
// ended (terminated or truncated) within N steps. The learner's target is
//   reward + discount * (1 - terminated) * V(next_obs),
// which is right in all three cases: a terminal state has no value, a truncated episode is
// bootstrapped from its last observation with gamma^k (not gamma^N), and a full window with
// gamma^N. When an episode ends, the window is flushed: its last k < N steps each give one item.
//
// The field names are template arguments with the usual defaults:
//   hone::n_step<3>                                   "reward", "terminated", "truncated",
//                                                     "discount"
//   hone::n_step<3, "r", "done", "timeout", "gamma_k">  the user's own names
#pragma once

#include <array>
#include <cstddef>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/rl/roles.hpp"
#include "hone/rl/transition.hpp"

HONE_NAMESPACE_BEGIN

template <class Transition>
class one_step_window;
template <class Transition, class Policy>
class n_step_window;

/// Returns policy: every added transition is stored as it is (the default).
struct one_step {
  using role = roles::replay_returns;
  static constexpr std::size_t steps = 1;
  template <class Transition>
  using window_type = one_step_window<Transition>;
};

/// Returns policy: N-step returns with correct episode boundaries (see the top of this file).
template <std::size_t N, fixed_string Reward = "reward", fixed_string Terminated = "terminated",
          fixed_string Truncated = "truncated", fixed_string Discount = "discount">
struct n_step {
  static_assert(N >= 1, "hone::n_step<N>: N must be at least 1.");
  using role = roles::replay_returns;
  static constexpr std::size_t steps = N;
  static constexpr auto reward_name = Reward;
  static constexpr auto terminated_name = Terminated;
  static constexpr auto truncated_name = Truncated;
  static constexpr auto discount_name = Discount;
  template <class Transition>
  using window_type = n_step_window<Transition, n_step>;

  double gamma = 0.99;  ///< discount per step
};

/// The window of hone::one_step: passes every transition through.
template <class Transition>
class one_step_window {
 public:
  using record_type = typename Transition::record;
  explicit one_step_window(const one_step& /*policy*/ = {}) noexcept {}
  template <class Emit>
  void push(const record_type& r, Emit&& emit) {
    emit(r);
  }
  template <class Emit>
  void flush(Emit&& /*emit*/) noexcept {}
  void reset() noexcept {}
  [[nodiscard]] std::size_t pending() const noexcept { return 0; }
};

namespace detail {
template <class T>
inline constexpr bool flag_type_v = std::is_same_v<T, bool> || std::is_integral_v<T>;
template <class F>
inline constexpr bool is_next_field_v = F::name.view().starts_with("next_");
}  // namespace detail

/// The window of hone::n_step<N>: up to N pending steps of one stream of transitions.
template <class Transition, class Policy>
class n_step_window {
  static constexpr std::size_t N = Policy::steps;
  static constexpr std::size_t reward_i = Transition::template find<Policy::reward_name>;
  static constexpr std::size_t terminated_i = Transition::template find<Policy::terminated_name>;
  static constexpr std::size_t truncated_i = Transition::template find<Policy::truncated_name>;
  static constexpr std::size_t discount_i = Transition::template find<Policy::discount_name>;
  static constexpr std::size_t nf = Transition::field_count;
  static_assert(reward_i < nf,
                "hone::n_step: the transition has no reward field (default name \"reward\"; pass "
                "yours as hone::n_step<N, \"your_reward\">).");
  static_assert(terminated_i < nf,
                "hone::n_step: the transition has no terminated field (default name "
                "\"terminated\"): n-step returns must know where episodes end.");
  static_assert(truncated_i < nf,
                "hone::n_step: the transition has no truncated field (default name \"truncated\"): "
                "a time-limit cut must be told apart from a terminal state.");
  static_assert(
      discount_i < nf,
      "hone::n_step: the transition has no discount field (default name \"discount\", "
      "e.g. hone::field<\"discount\", float>): it receives gamma^k, the bootstrap factor, "
      "which is smaller than gamma^N when an episode ends inside the window.");

 public:
  using record_type = typename Transition::record;

  explicit n_step_window(const Policy& policy = {}) : gamma_(policy.gamma) {
    static_assert(check_fields());
    HONE_REQUIRE(gamma_ >= 0.0 && gamma_ <= 1.0, "hone::n_step: gamma must be in [0, 1]");
  }

  /// Adds one environment step; emit(record) is called for each item that is complete (one per
  /// step once N are pending, all pending ones when this step ends the episode).
  template <class Emit>
  void push(const record_type& r, Emit&& emit) {
    steps_[(head_ + count_) % N] = r;
    ++count_;
    const bool ends = flag(Transition::template value<terminated_i>(r)) ||
                      flag(Transition::template value<truncated_i>(r));
    if (ends) {
      while (count_ > 0) pop(emit);
    } else if (count_ == N) {
      pop(emit);
    }
  }

  /// Emits every pending step with the horizon it has (the stream stops in mid-episode; the
  /// discount field carries the right bootstrap factor).
  template <class Emit>
  void flush(Emit&& emit) {
    while (count_ > 0) pop(emit);
  }
  /// Drops the pending steps (the environment was reset without a final step).
  void reset() noexcept { count_ = 0; }
  [[nodiscard]] std::size_t pending() const noexcept { return count_; }
  [[nodiscard]] double gamma() const noexcept { return gamma_; }

 private:
  static constexpr bool check_fields() {
    if constexpr (reward_i < nf && terminated_i < nf && truncated_i < nf && discount_i < nf) {
      using R = typename Transition::template field_at<reward_i>;
      using Te = typename Transition::template field_at<terminated_i>;
      using Tr = typename Transition::template field_at<truncated_i>;
      using D = typename Transition::template field_at<discount_i>;
      static_assert(R::count == 1 && std::is_floating_point_v<typename R::element_type>,
                    "hone::n_step: the reward field must be a floating-point scalar.");
      static_assert(D::count == 1 && std::is_floating_point_v<typename D::element_type>,
                    "hone::n_step: the discount field must be a floating-point scalar.");
      static_assert(Te::count == 1 && detail::flag_type_v<typename Te::element_type> &&
                        Tr::count == 1 && detail::flag_type_v<typename Tr::element_type>,
                    "hone::n_step: terminated and truncated must be bool (or integer) scalars.");
    }
    return true;
  }
  template <class T>
  static bool flag(const T& v) noexcept {
    return v != T{};
  }

  // Emits the item that starts at the oldest pending step and covers all pending steps.
  template <class Emit>
  void pop(Emit& emit) {
    record_type out = steps_[head_];
    const record_type& last = steps_[(head_ + count_ - 1) % N];
    double ret = 0.0;
    double g = 1.0;
    for (std::size_t k = 0; k < count_; ++k) {
      ret += g * static_cast<double>(Transition::template value<reward_i>(steps_[(head_ + k) % N]));
      g *= gamma_;
    }
    using RE = typename Transition::template field_at<reward_i>::element_type;
    using DE = typename Transition::template field_at<discount_i>::element_type;
    Transition::template value<reward_i>(out) = static_cast<RE>(ret);
    Transition::template value<discount_i>(out) = static_cast<DE>(g);
    Transition::template value<terminated_i>(out) = Transition::template value<terminated_i>(last);
    Transition::template value<truncated_i>(out) = Transition::template value<truncated_i>(last);
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      if constexpr (detail::is_next_field_v<F>) {
        std::memcpy(Transition::template elements<i>(out), Transition::template elements<i>(last),
                    F::bytes);
      }
    });
    emit(static_cast<const record_type&>(out));
    head_ = (head_ + 1) % N;
    --count_;
  }

  double gamma_;
  std::array<record_type, N> steps_{};
  std::size_t head_ = 0;
  std::size_t count_ = 0;
};

HONE_NAMESPACE_END
