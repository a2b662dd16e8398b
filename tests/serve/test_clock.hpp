// tests/serve/test_clock.hpp: a clock for the serving tests that stands still until a test
// advances it (std::chrono's Clock requirements), so delays, deadlines and TTLs are exact.
#pragma once

#include <chrono>
#include <cstdint>

/// Starts at Start nanoseconds; each instantiation has its own time.
template <std::int64_t Start = 0>
struct basic_test_clock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<basic_test_clock>;
  static constexpr bool is_steady = true;
  static inline time_point t{duration(Start)};
  static time_point now() noexcept { return t; }
  static void advance(duration d) noexcept { t += d; }
};
using test_clock = basic_test_clock<>;
