// hone/schedule/constant.hpp: hone::constant_lr, the same learning rate at every step.
//
//   lr(t) = base_lr
//
// The trainer's default schedule when none is given; PyTorch: no scheduler, HF:
// get_constant_schedule.
#pragma once

#include <cstdint>

#include "hone/schedule/common.hpp"

HONE_NAMESPACE_BEGIN

/// Constant learning rate.
///
///   hone::constant_lr{.base_lr = 1e-3}
struct constant_lr {
  using role = roles::schedule;

  /// The learning rate, > 0.
  double base_lr = 0.0;

  /// The learning rate of update `step` (0-based). Usable in constant expressions and kernels.
  HONE_HOST_DEVICE constexpr double lr(std::uint64_t /*step*/) const noexcept { return base_lr; }

  /// Throws hone::config_error with a sentence when base_lr is not a positive finite number.
  void validate() const { detail::schedule_require_peak_lr(base_lr, "constant_lr", "base_lr"); }
};

HONE_NAMESPACE_END
