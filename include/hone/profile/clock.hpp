// hone/profile/clock.hpp: the clock zones are stamped with, and its conversion to nanoseconds.
//
// On x86-64 with an invariant TSC (cpuid 0x80000007, EDX bit 8: the counter runs at a constant
// rate in every power state and is synchronized across cores), a stamp is the TSC itself
// (__rdtsc, measured at 13 ns on the 2-core VM hone is developed on, against 32 ns for
// std::chrono::steady_clock::now() through the vDSO). Elsewhere a stamp is
// steady_clock's count in nanoseconds. Stamps become nanoseconds of steady_clock (CLOCK_MONOTONIC
// on Linux, the clock Perfetto's system traces also read) through one calibration per process:
// two (tick, steady) pairs taken at least 20 ms apart, so one tick's length is known to a few
// parts per million (a drift of some milliseconds after an hour; durations are exact to that
// ratio).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

#include "hone/core/config.hpp"

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <x86intrin.h>
#define HONE_PROFILE_HAS_TSC 1
#else
#define HONE_PROFILE_HAS_TSC 0
#endif

HONE_NAMESPACE_BEGIN
namespace profile {
namespace detail {

/// steady_clock's count in nanoseconds.
inline std::uint64_t steady_ns() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

/// Whether stamps are TSC ticks (else steady_clock nanoseconds): decided once per process.
inline bool detect_invariant_tsc() noexcept {
#if HONE_PROFILE_HAS_TSC
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0x80000000u, &a, &b, &c, &d) == 0 || a < 0x80000007u) return false;
  if (__get_cpuid(0x80000007u, &a, &b, &c, &d) == 0) return false;
  return (d & (1u << 8)) != 0;
#else
  return false;
#endif
}
inline const bool use_tsc = detect_invariant_tsc();

/// The current stamp, in ticks.
HONE_FORCEINLINE std::uint64_t ticks() noexcept {
#if HONE_PROFILE_HAS_TSC
  if (use_tsc) return __rdtsc();
#endif
  return steady_ns();
}

/// A (tick, steady nanosecond) pair read as close together as the clocks allow: the tick read
/// is the midpoint of two around the steady read.
struct clock_pair {
  std::uint64_t tick = 0;
  std::uint64_t ns = 0;
};
inline clock_pair read_pair() noexcept {
  const std::uint64_t t0 = ticks();
  const std::uint64_t ns = steady_ns();
  const std::uint64_t t1 = ticks();
  return {t0 + (t1 - t0) / 2, ns};
}

/// The first pair of the calibration: taken when the process first touches the profiler.
inline const clock_pair& anchor() noexcept {
  static const clock_pair a = read_pair();
  return a;
}

}  // namespace detail

/// Converts stamps (ticks) to steady_clock nanoseconds.
class clock_calibration {
 public:
  /// ns = anchor_ns + (tick - anchor_tick) * ns_per_tick.
  [[nodiscard]] std::uint64_t to_ns(std::uint64_t tick) const noexcept {
    const auto d = static_cast<double>(static_cast<std::int64_t>(tick - anchor_tick_));
    return anchor_ns_ + static_cast<std::uint64_t>(static_cast<std::int64_t>(d * ns_per_tick_));
  }
  /// A duration in ticks as nanoseconds.
  [[nodiscard]] double duration_ns(double ticks) const noexcept { return ticks * ns_per_tick_; }
  [[nodiscard]] double ns_per_tick() const noexcept { return ns_per_tick_; }
  /// Whether stamps are TSC ticks (else steady_clock nanoseconds, and ns_per_tick() is 1).
  [[nodiscard]] static bool tsc() noexcept { return detail::use_tsc; }

  /// The process's calibration, measured on first use: with a TSC it waits until 20 ms have
  /// passed since the anchor (at most 20 ms, once per process), without one it is exact at once.
  static const clock_calibration& get() {
    static const clock_calibration c = measure();
    return c;
  }

 private:
  static clock_calibration measure() {
    const detail::clock_pair a = detail::anchor();
    clock_calibration c;
    c.anchor_tick_ = a.tick;
    c.anchor_ns_ = a.ns;
    if (!detail::use_tsc) return c;
    constexpr std::uint64_t span_ns = 20'000'000;
    detail::clock_pair b = detail::read_pair();
    if (b.ns - a.ns < span_ns) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(span_ns - (b.ns - a.ns)));
      b = detail::read_pair();
    }
    c.ns_per_tick_ = static_cast<double>(b.ns - a.ns) / static_cast<double>(b.tick - a.tick);
    return c;
  }
  std::uint64_t anchor_tick_ = 0;
  std::uint64_t anchor_ns_ = 0;
  double ns_per_tick_ = 1.0;
};

}  // namespace profile
HONE_NAMESPACE_END
