// hone/schedule/linear_warmup.hpp: hone::linear_warmup, a linear ramp from
// start_factor * base_lr to base_lr over warmup_steps updates, then base_lr.
//
//   lr(t) = base_lr * (start_factor + (1 - start_factor) * t / warmup_steps)   for t < warmup_steps
//   lr(t) = base_lr                                                           for t >= warmup_steps
//
// PyTorch's torch.optim.lr_scheduler.LinearLR(start_factor, end_factor=1, total_iters=warmup_steps)
// in its closed form (_get_closed_form_lr), evaluated in the same order. PyTorch's step() uses a
// recursive form equal to it up to rounding; after the ramp hone returns base_lr itself.
// warmup_steps = 0 means no ramp (PyTorch would divide by zero).
#pragma once

#include <cmath>
#include <cstdint>

#include "hone/schedule/common.hpp"

HONE_NAMESPACE_BEGIN

/// Linear warmup, then constant.
///
///   hone::linear_warmup{.base_lr = 3e-4, .warmup_steps = 1000, .start_factor = 0.01}
struct linear_warmup {
  using role = roles::schedule;

  /// The learning rate after the ramp, > 0.
  double base_lr = 0.0;
  /// Number of updates the ramp lasts; update `warmup_steps` is the first at base_lr.
  std::uint64_t warmup_steps = 0;
  /// Fraction of base_lr used by update 0, in (0, 1]. PyTorch LinearLR's default is 1/3.
  double start_factor = 1.0 / 3.0;

  /// The learning rate of update `step` (0-based). Usable in constant expressions and kernels.
  HONE_HOST_DEVICE constexpr double lr(std::uint64_t step) const noexcept {
    if (step >= warmup_steps) return base_lr;
    return base_lr * (start_factor + (1.0 - start_factor) * static_cast<double>(step) /
                                         static_cast<double>(warmup_steps));
  }

  /// Throws hone::config_error with a sentence for a non-positive base_lr or a start_factor
  /// outside (0, 1].
  void validate() const {
    detail::schedule_require_peak_lr(base_lr, "linear_warmup", "base_lr");
    HONE_DETAIL_SCHEDULE_REQUIRE(
        std::isfinite(start_factor) && start_factor > 0.0 && start_factor <= 1.0, "linear_warmup",
        "start_factor must be in (0, 1] (the first update uses start_factor * base_lr), got " +
            detail::schedule_number(start_factor) + ".");
  }
};

HONE_NAMESPACE_END
