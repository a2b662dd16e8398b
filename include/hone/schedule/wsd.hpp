// hone/schedule/wsd.hpp: hone::wsd, the warmup-stable-decay schedule (Hu et al., "MiniCPM",
// arXiv:2404.06395; the 1-sqrt decay shape from Hägele et al., "Scaling Laws and Compute-Optimal
// Training Beyond Fixed Training Durations", arXiv:2405.18392).
//
// With W = warmup_steps, S = stable_steps, D = decay_steps and r = min_lr / base_lr:
//
//   t < W:              f = (t / W) * (1 - r) + r                 linear warmup from min_lr
//   W <= t < W+S:       f = 1                                     stable at base_lr
//   W+S <= t < W+S+D:   p = (t - W - S) / D
//                       g = 1 - p                  (linear)
//                           0.5 * (1 + cos(pi p))  (cosine)
//                           1 - sqrt(p)            (one_minus_sqrt)
//                       f = g * (1 - r) + r                        decay to min_lr
//   t >= W+S+D:         f = r                                     min_lr for ever after
//   lr(t) = base_lr * f
//
// This is HF transformers' get_wsd_schedule(num_warmup_steps=W, num_stable_steps=S,
// num_decay_steps=D, warmup_type="linear", decay_type=..., min_lr_ratio=r, num_cycles=0.5),
// evaluated in the same order.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "hone/schedule/common.hpp"

HONE_NAMESPACE_BEGIN

/// Warmup-stable-decay.
///
///   hone::wsd{.base_lr = 1e-3, .warmup_steps = 1000, .stable_steps = 80000,
///             .decay_steps = 19000, .min_lr = 1e-5, .decay = hone::wsd::shape::one_minus_sqrt}
struct wsd {
  using role = roles::schedule;

  /// Shape of the decay phase (HF's decay_type "linear", "cosine", "1-sqrt").
  enum class shape { linear, cosine, one_minus_sqrt };

  /// The learning rate of the stable phase, > 0.
  double base_lr = 0.0;
  /// Updates of linear warmup from min_lr to base_lr (0: none).
  std::uint64_t warmup_steps = 0;
  /// Updates at base_lr after the warmup.
  std::uint64_t stable_steps = 0;
  /// Updates of decay from base_lr to min_lr, > 0.
  std::uint64_t decay_steps = 0;
  /// The learning rate at the start of the warmup and from the end of the decay on; in
  /// [0, base_lr].
  double min_lr = 0.0;
  /// Decay shape; HF's default is cosine.
  shape decay = shape::cosine;

  /// warmup_steps + stable_steps + decay_steps: the first update at min_lr.
  HONE_HOST_DEVICE constexpr std::uint64_t total_steps() const noexcept {
    return warmup_steps + stable_steps + decay_steps;
  }

  /// The learning rate of update `step` (0-based). Usable in kernels.
  HONE_HOST_DEVICE double lr(std::uint64_t step) const noexcept {
    const double rate = min_lr / base_lr;
    if (step < warmup_steps) {
      const double progress = static_cast<double>(step) / static_cast<double>(warmup_steps);
      return base_lr * floor_at_zero(progress * (1.0 - rate) + rate);
    }
    if (step - warmup_steps < stable_steps) return base_lr;
    const std::uint64_t into_decay = step - warmup_steps - stable_steps;
    if (into_decay < decay_steps) {
      const double progress = static_cast<double>(into_decay) / static_cast<double>(decay_steps);
      double factor = 0.0;
      switch (decay) {
        case shape::linear:
          factor = 1.0 - progress;
          break;
        case shape::cosine:
          factor = detail::half_cosine(progress);
          break;
        case shape::one_minus_sqrt:
          factor = 1.0 - std::sqrt(progress);
          break;
      }
      return base_lr * floor_at_zero(factor * (1.0 - rate) + rate);
    }
    return base_lr * rate;
  }

  /// Throws hone::config_error with a sentence for a non-positive base_lr, a min_lr outside
  /// [0, base_lr], decay_steps = 0, or phase lengths whose sum does not fit in 64 bits.
  void validate() const {
    detail::schedule_require_peak_lr(base_lr, "wsd", "base_lr");
    detail::schedule_require_floor_lr(min_lr, base_lr, "wsd", "min_lr", "base_lr");
    HONE_DETAIL_SCHEDULE_REQUIRE(
        decay_steps > 0, "wsd",
        "decay_steps must be positive, got 0: without a decay phase the "
        "learning rate would drop from base_lr to min_lr in one update. For "
        "warmup then constant, use hone::linear_warmup.");
    constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
    HONE_DETAIL_SCHEDULE_REQUIRE(
        stable_steps <= max - decay_steps && warmup_steps <= max - decay_steps - stable_steps,
        "wsd", "warmup_steps + stable_steps + decay_steps does not fit in 64 bits.");
    HONE_DETAIL_SCHEDULE_REQUIRE(
        decay == shape::linear || decay == shape::cosine || decay == shape::one_minus_sqrt, "wsd",
        "decay must be shape::linear, shape::cosine or "
        "shape::one_minus_sqrt, got the value " +
            std::to_string(static_cast<int>(decay)) + ".");
  }

 private:
  HONE_HOST_DEVICE static double floor_at_zero(double x) noexcept { return x > 0.0 ? x : 0.0; }
};

HONE_NAMESPACE_END
