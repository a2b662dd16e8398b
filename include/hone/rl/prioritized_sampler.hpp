// hone/rl/prioritized_sampler.hpp: proportional prioritized replay (Schaul et al. 2016).
//
// An item's priority is p = (|raw| + epsilon)^alpha, raw being what the learner passes to
// update_priorities (typically the TD error). P(i) = p_i / sum p, drawn stratified: sample k of B
// takes target (k + U_k) * total / B with U_k uniform in [0, 1), so every B-quantile of the
// priority mass gets one sample. Importance weights are (p_i / p_min)^-beta (the PER weight
// (N P(i))^-beta normalized by its maximum, p_min from the min tree), beta annealed linearly from
// `beta` to `beta_final` over `beta_steps` sample calls. New items enter at the running maximum
// priority (so each is seen at least once, soon); an item whose priority is 0 is never sampled.
//
// The sum tree is hone::sum_tree<Arity> (double sums recomputed from the children: no drift).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/rl/rng.hpp"
#include "hone/rl/roles.hpp"
#include "hone/rl/sum_tree.hpp"

HONE_NAMESPACE_BEGIN

template <std::size_t Arity>
class prioritized_sampler;

namespace detail {
/// The stored priority for a valid raw value: (raw + epsilon)^alpha, rounded to float once (host
/// and device alike).
HONE_HOST_DEVICE float per_priority(float raw, double epsilon, double alpha) {
  const double base = static_cast<double>(raw) + epsilon;
  if (base == 0.0) return 0.0f;
  return static_cast<float>(alpha == 1.0 ? base : pow(base, alpha));
}
/// Importance weight (p / p_min)^-beta as the samplers compute it (in float).
HONE_HOST_DEVICE float per_weight(float priority, float inv_min, float neg_beta) {
  return powf(priority * inv_min, neg_beta);
}
}  // namespace detail

/// Sampler policy: proportional prioritized replay over an Arity-ary sum tree (16: one float leaf
/// node per cache line, the best layout beyond the cache; 2: the classic binary tree).
template <std::size_t Arity = 16>
struct prioritized {
  using role = roles::replay_sampler;
  using sampler_type = prioritized_sampler<Arity>;

  double alpha = 0.6;       ///< priority exponent (0: uniform, 1: fully proportional)
  double beta = 0.4;        ///< importance-weight exponent at the first sample call
  double beta_final = 1.0;  ///< ... reached after beta_steps sample calls
  std::uint64_t beta_steps = 100000;
  double epsilon = 1e-6;          ///< added to |raw| before the exponent (0 allows p = 0)
  double initial_priority = 1.0;  ///< the running maximum before any update
};

/// The prioritized sampler's engine (what hone::replay_buffer holds for hone::prioritized<A>).
template <std::size_t Arity>
class prioritized_sampler {
 public:
  static constexpr bool is_prioritized = true;
  using config_type = hone::prioritized<Arity>;

  prioritized_sampler(std::size_t capacity, const config_type& config)
      : config_(config),
        tree_(capacity),
        max_priority_(static_cast<float>(config.initial_priority)) {
    HONE_REQUIRE(config.alpha >= 0.0 && std::isfinite(config.alpha),
                 "hone::prioritized: alpha must be finite and >= 0 (0.6 is the PER default)");
    HONE_REQUIRE(config.beta >= 0.0 && config.beta_final >= 0.0,
                 "hone::prioritized: beta and beta_final must be >= 0 (PER: 0.4 annealed to 1)");
    HONE_REQUIRE(config.epsilon >= 0.0, "hone::prioritized: epsilon must be >= 0");
    HONE_REQUIRE(config.initial_priority > 0.0 && std::isfinite(config.initial_priority),
                 "hone::prioritized: initial_priority must be positive and finite");
  }

  /// New items in slots [first, first + n) (no wrap) enter at the running maximum priority.
  void insert(std::size_t first, std::size_t n) noexcept {
    if (n == 1) {
      tree_.set(first, max_priority_);
    } else {
      tree_.fill(first, n, max_priority_);
    }
  }
  /// The item in `slot` is going away (the slot is being rewritten): it is never sampled again.
  void retire(std::size_t slot) noexcept { tree_.set(slot, 0.0f); }

  /// The current importance-weight exponent.
  [[nodiscard]] double beta() const noexcept {
    const double t =
        config_.beta_steps == 0
            ? 1.0
            : std::min(1.0, static_cast<double>(steps_) / static_cast<double>(config_.beta_steps));
    return config_.beta + (config_.beta_final - config_.beta) * t;
  }

  /// Stratified draw of slots.size() items with their importance weights (one sample call: beta
  /// advances one step). `size` and `accept` are not needed (items that may not be sampled have
  /// priority 0). on_slots(slots) runs between the descent and the weights (the buffer prefetches
  /// the rows it will gather there, so their misses overlap the weights' arithmetic).
  template <class Accept, class OnSlots = detail::ignore_slots>
  void sample(std::size_t /*size*/, replay_rng& rng, std::span<std::size_t> slots,
              std::span<float> weights, const Accept& /*accept*/, const OnSlots& on_slots = {}) {
    const std::size_t n = slots.size();
    if (n == 0) return;
    const double total = tree_.total();
    if (!(total > 0.0)) {
      throw error(
          "hone::prioritized: every stored item has priority 0 (or the buffer is empty), so "
          "nothing can be sampled; add transitions or give some items a positive priority");
    }
    double targets[sum_tree<Arity>::batch_chunk];
    for (std::size_t begin = 0; begin < n; begin += sum_tree<Arity>::batch_chunk) {
      const std::size_t m = std::min(sum_tree<Arity>::batch_chunk, n - begin);
      for (std::size_t k = 0; k < m; ++k) {
        targets[k] = detail::stratified_target(begin + k, rng.uniform(), total, n);
      }
      tree_.find_batch(std::span<const double>(targets, m), slots.subspan(begin, m));
    }
    on_slots(std::span<const std::size_t>(slots));  // e.g. prefetch the rows to gather
    compute_weights(slots, weights, beta());
    ++steps_;
  }

  /// sample() with the uniforms given (one per sample, in [0, 1)) instead of drawn: what the GPU
  /// sampler is compared with.
  void sample_from(std::span<const double> uniforms, std::span<std::size_t> slots,
                   std::span<float> weights) {
    const std::size_t n = uniforms.size();
    if (n == 0) return;
    const double total = tree_.total();
    if (!(total > 0.0)) {
      throw error("hone::prioritized: every stored item has priority 0; nothing can be sampled");
    }
    double targets[sum_tree<Arity>::batch_chunk];
    for (std::size_t begin = 0; begin < n; begin += sum_tree<Arity>::batch_chunk) {
      const std::size_t m = std::min(sum_tree<Arity>::batch_chunk, n - begin);
      for (std::size_t k = 0; k < m; ++k) {
        targets[k] = detail::stratified_target(begin + k, uniforms[begin + k], total, n);
      }
      tree_.find_batch(std::span<const double>(targets, m), slots.subspan(begin, m));
    }
    compute_weights(slots.first(n), weights.first(n), beta());
    ++steps_;
  }

  /// Importance weights (p_i / p_min)^-beta of the given slots.
  void compute_weights(std::span<const std::size_t> slots, std::span<float> weights,
                       double beta) const noexcept {
    const float inv_min = 1.0f / tree_.min();
    const auto neg_beta = static_cast<float>(-beta);
    for (std::size_t k = 0; k < slots.size(); ++k) {
      weights[k] = detail::per_weight(tree_.get(slots[k]), inv_min, neg_beta);
    }
  }

  /// The stored priority for a raw value: (raw + epsilon)^alpha. Throws config_error for a
  /// negative, NaN or infinite raw value.
  [[nodiscard]] float transform(float raw) const {
    if (!(raw >= 0.0f) || !std::isfinite(raw)) {
      throw config_error("hone::prioritized: priority " + std::to_string(raw) +
                         " is negative, NaN or infinite; pass |TD error| (finite, >= 0)");
    }
    return detail::per_priority(raw, config_.epsilon, config_.alpha);
  }

  /// Sets the priorities of the given slots from raw values (all validated before any is
  /// applied). The running maximum follows.
  void update(std::span<const std::size_t> slots, std::span<const float> raw) {
    float stored[sum_tree<Arity>::batch_chunk];
    for (std::size_t begin = 0; begin < slots.size(); begin += sum_tree<Arity>::batch_chunk) {
      const std::size_t m = std::min(sum_tree<Arity>::batch_chunk, slots.size() - begin);
      float mx = max_priority_;
      for (std::size_t k = 0; k < m; ++k) {
        stored[k] = transform(raw[begin + k]);
        mx = std::max(mx, stored[k]);
      }
      max_priority_ = mx;
      tree_.set_batch(slots.subspan(begin, m), std::span<const float>(stored, m));
    }
  }

  [[nodiscard]] const sum_tree<Arity>& tree() const noexcept { return tree_; }
  [[nodiscard]] const config_type& config() const noexcept { return config_; }
  [[nodiscard]] float max_priority() const noexcept { return max_priority_; }
  /// Sample calls so far (drives the beta schedule).
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }

  // State for saving and restoring a buffer.
  void restore(std::span<const float> priorities, float max_priority, std::uint64_t steps) {
    tree_.assign(priorities);
    max_priority_ = max_priority;
    steps_ = steps;
  }

 private:
  config_type config_;
  sum_tree<Arity> tree_;
  float max_priority_;
  std::uint64_t steps_ = 0;
};

HONE_NAMESPACE_END
