// hone/schedule/one_cycle.hpp: hone::one_cycle, the 1cycle policy (Smith & Topin, "Super-
// Convergence", arXiv:1708.07120) with PyTorch's torch.optim.lr_scheduler.OneCycleLR semantics.
//
// With T = total_steps, p = pct_start, initial = max_lr / div_factor and
// min = initial / final_div_factor, the schedule is a list of phases, each annealing a value from
// `start` to `end` as the update index t goes from the previous phase's end step to its own:
//
//   two phases (default)          end step          lr               momentum
//     1                           p*T - 1           initial -> max   max_m  -> base_m
//     2                           T - 1             max -> min       base_m -> max_m
//   three_phase                   end step          lr               momentum
//     1                           p*T - 1           initial -> max   max_m  -> base_m
//     2                           2*p*T - 2         max -> initial   base_m -> max_m
//     3                           T - 1             initial -> min   max_m  -> max_m
//
// Update t belongs to the first phase whose end step is >= t (or to the last phase); with
// `start_step` the end of the phase before (0 for the first), pct = (t - start_step) /
// (end_step - start_step) and
//
//   cos:    value = end + (start - end) / 2 * (cos(pi * pct) + 1)
//   linear: value = (end - start) * pct + start
//
// all in double precision and in PyTorch's order of operations, so hone's values are PyTorch's
// (the end steps are the floats `float(pct_start * total_steps) - 1`, not rounded to integers).
// Past the last update (t >= T, where PyTorch raises or extrapolates) hone returns the value of
// update T - 1, i.e. min.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>

#include "hone/core/detail/separate_compilation.hpp"
#include "hone/schedule/common.hpp"

HONE_NAMESPACE_BEGIN

/// The 1cycle learning-rate (and momentum) policy, as PyTorch's OneCycleLR.
///
///   hone::one_cycle{.max_lr = 0.1, .total_steps = 10000}
///   hone::one_cycle{.max_lr = 0.1, .total_steps = 10000, .pct_start = 0.25,
///                   .anneal_strategy = hone::one_cycle::anneal::linear, .three_phase = true}
struct one_cycle {
  using role = roles::schedule;

  /// How values move within a phase: PyTorch's anneal_strategy 'cos' or 'linear'.
  enum class anneal { cos, linear };

  /// The peak learning rate, > 0.
  double max_lr = 0.0;
  /// Number of updates in the cycle, > 0; update total_steps - 1 ends at the minimum.
  std::uint64_t total_steps = 0;
  /// Fraction of the cycle spent raising the learning rate, in (0, 1) (<= 0.5 with three_phase).
  double pct_start = 0.3;
  /// Shape of each phase.
  anneal anneal_strategy = anneal::cos;
  /// The cycle starts at max_lr / div_factor; > 0.
  double div_factor = 25.0;
  /// The cycle ends at max_lr / div_factor / final_div_factor; > 0.
  double final_div_factor = 1e4;
  /// Use the paper's three phases (up, down to the initial rate, annihilate) instead of fastai's
  /// two.
  bool three_phase = false;
  /// Whether momentum (or Adam's beta1) is cycled inversely to the learning rate. When false,
  /// momentum() returns std::nullopt and the optimizer keeps its own momentum.
  bool cycle_momentum = true;
  /// Momentum at the learning-rate peak, in [0, 1].
  double base_momentum = 0.85;
  /// Momentum at the start (and end) of the cycle, in [0, 1].
  double max_momentum = 0.95;

  /// The first update's learning rate: max_lr / div_factor.
  HONE_HOST_DEVICE constexpr double initial_lr() const noexcept { return max_lr / div_factor; }
  /// The last update's learning rate: initial_lr() / final_div_factor.
  HONE_HOST_DEVICE constexpr double min_lr() const noexcept {
    return initial_lr() / final_div_factor;
  }

  /// The learning rate of update `step` (0-based). Usable in kernels.
  HONE_HOST_DEVICE double lr(std::uint64_t step) const noexcept {
    return evaluate(step, initial_lr(), max_lr, min_lr());
  }

  /// The momentum (or beta1) of update `step`, or std::nullopt when cycle_momentum is false.
  std::optional<double> momentum(std::uint64_t step) const noexcept {
    if (!cycle_momentum) return std::nullopt;
    return evaluate(step, max_momentum, base_momentum, max_momentum);
  }

  /// Throws hone::config_error with a sentence for any value PyTorch rejects or cannot evaluate:
  /// a non-positive max_lr, div_factor or final_div_factor, total_steps = 0, pct_start outside
  /// (0, 1) (or above 0.5 with three_phase), pct_start * total_steps = 1 (a zero-length first
  /// phase: PyTorch divides by zero), or a momentum outside [0, 1] when cycle_momentum is set.
  HONE_DETAIL_DECL void validate() const;

 private:
  HONE_HOST_DEVICE double anneal_value(double start, double end, double pct) const noexcept {
    if (anneal_strategy == anneal::cos) {
      const double cos_out = std::cos(detail::schedule_pi * pct) + 1.0;
      return end + (start - end) / 2.0 * cos_out;
    }
    return (end - start) * pct + start;
  }

  // The value at `step` of a cycle that goes first -> peak -> last (two phases) or
  // first -> peak -> first -> last (three phases).
  HONE_HOST_DEVICE double evaluate(std::uint64_t step, double first, double peak,
                                   double last) const noexcept {
    const std::uint64_t final_step = total_steps > 0 ? total_steps - 1 : 0;
    const double t = static_cast<double>(step < final_step ? step : final_step);
    const double up_end = pct_start * static_cast<double>(total_steps) - 1.0;
    const double end_step = static_cast<double>(total_steps) - 1.0;

    double start_step = 0.0;
    if (t <= up_end) return anneal_value(first, peak, phase_pct(t, start_step, up_end));
    start_step = up_end;
    if (three_phase) {
      const double down_end = 2.0 * pct_start * static_cast<double>(total_steps) - 2.0;
      if (t <= down_end) return anneal_value(peak, first, phase_pct(t, start_step, down_end));
      start_step = down_end;
      return anneal_value(first, last, phase_pct(t, start_step, end_step));
    }
    return anneal_value(peak, last, phase_pct(t, start_step, end_step));
  }

  // Where t lies in [start, end] as a fraction. A zero-length phase (rejected by validate(); a
  // division by zero in PyTorch) counts as finished.
  HONE_HOST_DEVICE static double phase_pct(double t, double start, double end) noexcept {
    const double length = end - start;
    return length != 0.0 ? (t - start) / length : 1.0;
  }
};

// With separate compilation, defined in hone::compiled (src/functions.cpp).
#if HONE_DETAIL_DEFINITIONS
HONE_DETAIL_DECL void one_cycle::validate() const {
  constexpr const char* name = "one_cycle";
  detail::schedule_require_peak_lr(max_lr, name, "max_lr");
  HONE_DETAIL_SCHEDULE_REQUIRE(total_steps > 0, name,
                               "total_steps must be positive (the number of updates in the cycle), "
                               "got 0 (was it left unset?).");
  HONE_DETAIL_SCHEDULE_REQUIRE(
      std::isfinite(pct_start) && pct_start > 0.0 && pct_start < 1.0, name,
      "pct_start must be in (0, 1) (the fraction of the cycle spent raising the learning "
      "rate; PyTorch's default is 0.3), got " +
          detail::schedule_number(pct_start) + ".");
  HONE_DETAIL_SCHEDULE_REQUIRE(!three_phase || pct_start <= 0.5, name,
                               "with three_phase, pct_start must be at most 0.5 (the first two "
                               "phases take 2 * pct_start of the cycle), got " +
                                   detail::schedule_number(pct_start) + ".");
  HONE_DETAIL_SCHEDULE_REQUIRE(
      pct_start * static_cast<double>(total_steps) != 1.0, name,
      "pct_start * total_steps = 1 makes the first phase zero steps long (its end step is "
      "pct_start * total_steps - 1 = 0, where PyTorch divides by zero); change pct_start or "
      "total_steps.");
  HONE_DETAIL_SCHEDULE_REQUIRE(std::isfinite(div_factor) && div_factor > 0.0, name,
                               "div_factor must be positive and finite (initial_lr = max_lr / "
                               "div_factor), got " +
                                   detail::schedule_number(div_factor) + ".");
  HONE_DETAIL_SCHEDULE_REQUIRE(
      std::isfinite(final_div_factor) && final_div_factor > 0.0, name,
      "final_div_factor must be positive and finite (min_lr = initial_lr / "
      "final_div_factor), got " +
          detail::schedule_number(final_div_factor) + ".");
  if (cycle_momentum) {
    HONE_DETAIL_SCHEDULE_REQUIRE(
        std::isfinite(base_momentum) && base_momentum >= 0.0 && base_momentum <= 1.0, name,
        "base_momentum must be in [0, 1], got " + detail::schedule_number(base_momentum) +
            " (set cycle_momentum = false to leave momentum alone).");
    HONE_DETAIL_SCHEDULE_REQUIRE(
        std::isfinite(max_momentum) && max_momentum >= 0.0 && max_momentum <= 1.0, name,
        "max_momentum must be in [0, 1], got " + detail::schedule_number(max_momentum) +
            " (set cycle_momentum = false to leave momentum alone).");
  }
}
#endif

HONE_NAMESPACE_END
