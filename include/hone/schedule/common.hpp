// hone/schedule/common.hpp: what every learning-rate schedule shares: the step type, pi, the
// half-cosine factor, and the checks behind each schedule's validate().
//
// A schedule is a pure function of the step: the 0-based index of the optimizer update it is
// asked about (the first update uses lr(0); PyTorch's `scheduler.last_epoch` and HF's
// `current_step` count the same way). Schedules keep no state, so resuming a run is evaluating
// them at the resumed step.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/roles.hpp"

HONE_NAMESPACE_BEGIN

namespace detail {

/// The double nearest to pi (the value of Python's math.pi, which the peers' formulas use).
inline constexpr double schedule_pi = 3.141592653589793238462643383279502884;

/// 0.5 * (1 + cos(pi * progress)): 1 at progress 0, 0 at progress 1, the half-cosine every
/// cosine schedule here uses. Written as in HF transformers' schedules, whose
/// `math.pi * num_cycles * 2.0 * progress` with num_cycles = 0.5 is exactly `pi * progress`.
HONE_HOST_DEVICE double half_cosine(double progress) noexcept {
  return 0.5 * (1.0 + std::cos(schedule_pi * progress));
}

/// Shortest text that reads back as `v` ("0.3", "1e-05", "inf", "nan").
inline std::string schedule_number(double v) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof(text), v);
  return std::string(text, result.ptr);
}

/// Throws config_error("hone::<schedule>: <sentence>"): the failure side of
/// HONE_DETAIL_SCHEDULE_REQUIRE, out of line and cold (see HONE_REQUIRE).
[[noreturn, gnu::cold, gnu::noinline]] inline void schedule_failure(std::string_view schedule,
                                                                    const std::string& sentence) {
  std::string message = "hone::";
  message.append(schedule).append(": ").append(sentence);
  throw config_error(message);
}

/// Throws config_error("hone::<schedule>: <sentence>") unless `condition` holds; the sentence
/// (anything a std::string can be made from) is built only then.
#define HONE_DETAIL_SCHEDULE_REQUIRE(condition, schedule, ...)              \
  do {                                                                      \
    if (!(condition)) [[unlikely]]                                          \
      ::hone::detail::schedule_failure(schedule, std::string(__VA_ARGS__)); \
  } while (false)

/// A peak learning rate must be positive and finite; 0 is rejected because it is what a field
/// left out of a designated initializer holds.
inline void schedule_require_peak_lr(double value, std::string_view schedule,
                                     std::string_view field) {
  HONE_DETAIL_SCHEDULE_REQUIRE(
      std::isfinite(value) && value > 0.0, schedule,
      std::string(field) + " must be a positive finite learning rate, got " +
          schedule_number(value) + (value == 0.0 ? " (was it left unset?)." : "."));
}

/// A floor learning rate must lie in [0, peak].
inline void schedule_require_floor_lr(double value, double peak, std::string_view schedule,
                                      std::string_view field, std::string_view peak_field) {
  HONE_DETAIL_SCHEDULE_REQUIRE(std::isfinite(value) && value >= 0.0 && value <= peak, schedule,
                               std::string(field) + " must be a finite learning rate in [0, " +
                                   std::string(peak_field) + "] = [0, " + schedule_number(peak) +
                                   "], got " + schedule_number(value) + ".");
}

}  // namespace detail

HONE_NAMESPACE_END
