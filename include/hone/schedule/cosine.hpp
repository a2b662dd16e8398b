// hone/schedule/cosine.hpp: hone::cosine_with_warmup, a linear warmup from 0 followed by a
// half-cosine decay from base_lr to min_lr.
//
//   t <  W:  lr(t) = base_lr * (t / W)
//   t >= W:  p = min(1, (t - W) / max(1, T - W))
//            f = 0.5 * (1 + cos(pi * p))
//            r = min_lr / base_lr
//            lr(t) = base_lr * (f * (1 - r) + r)
//
// with W = warmup_steps and T = total_steps. This is HF transformers'
// get_cosine_schedule_with_warmup (num_cycles = 0.5) when min_lr = 0, and its
// get_cosine_with_min_lr_schedule_with_warmup(min_lr=...) otherwise, evaluated in the same order.
// The decay reaches min_lr at t = max(T, W + 1) (T, unless the warmup takes the whole run). One
// deliberate difference: past that point HF's cosine climbs again (p > 1); hone clamps p to 1 and
// stays at min_lr.
#pragma once

#include <cmath>
#include <cstdint>

#include "hone/schedule/common.hpp"

HONE_NAMESPACE_BEGIN

/// Linear warmup from 0, then cosine decay to min_lr at total_steps.
///
///   hone::cosine_with_warmup{.base_lr = 3e-4, .warmup_steps = 2000, .total_steps = 100000,
///                            .min_lr = 3e-5}
struct cosine_with_warmup {
  using role = roles::schedule;

  /// The peak learning rate, reached at update warmup_steps; > 0.
  double base_lr = 0.0;
  /// Number of warmup updates (the ramp starts at 0: update 0 has learning rate 0, as in HF).
  std::uint64_t warmup_steps = 0;
  /// The update at which the decay reaches min_lr (warmup_steps + 1 if they are equal); > 0 and
  /// >= warmup_steps.
  std::uint64_t total_steps = 0;
  /// The floor of the decay, in [0, base_lr].
  double min_lr = 0.0;

  /// The learning rate of update `step` (0-based). Usable in kernels.
  HONE_HOST_DEVICE double lr(std::uint64_t step) const noexcept {
    if (step < warmup_steps) {
      return base_lr * (static_cast<double>(step) / static_cast<double>(warmup_steps));
    }
    const std::uint64_t decay = total_steps > warmup_steps ? total_steps - warmup_steps : 1;
    double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(decay);
    if (progress > 1.0) progress = 1.0;
    const double rate = min_lr / base_lr;
    const double factor = detail::half_cosine(progress) * (1.0 - rate) + rate;
    return base_lr * (factor > 0.0 ? factor : 0.0);
  }

  /// Throws hone::config_error with a sentence for a non-positive base_lr, a min_lr outside
  /// [0, base_lr], total_steps = 0 or warmup_steps > total_steps.
  void validate() const {
    detail::schedule_require_peak_lr(base_lr, "cosine_with_warmup", "base_lr");
    detail::schedule_require_floor_lr(min_lr, base_lr, "cosine_with_warmup", "min_lr", "base_lr");
    HONE_DETAIL_SCHEDULE_REQUIRE(
        total_steps > 0, "cosine_with_warmup",
        "total_steps must be positive (the update at which the decay reaches "
        "min_lr), got 0 (was it left unset?).");
    HONE_DETAIL_SCHEDULE_REQUIRE(
        warmup_steps <= total_steps, "cosine_with_warmup",
        "warmup_steps (" + std::to_string(warmup_steps) + ") must not exceed total_steps (" +
            std::to_string(total_steps) + "): the warmup is part of the total.");
  }
};

HONE_NAMESPACE_END
