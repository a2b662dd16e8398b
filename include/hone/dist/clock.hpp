// hone/dist/clock.hpp: one time base for the traces of every rank. estimate_clock_offset_ns(comm)
// returns what to add to this rank's steady_clock to read rank 0's: pass it to
// hone::profile::trace_options::clock_offset_ns, and the per-rank traces merged by
// hone/profile/merge.hpp line up.
//
// How: `rounds` times, every rank leaves a barrier, reads its clock and all-gathers the reading;
// the offset is the median over the rounds of (rank 0's reading - this rank's). It needs only the
// communicator's collectives (no point-to-point), so it works over any hone communicator. Its
// error is how far apart the ranks leave a barrier (microseconds between processes of one host,
// the barrier's latency across hosts); the median discards rounds where a rank was descheduled.
// On one host steady_clock (CLOCK_MONOTONIC) is already shared, and the estimate is that error.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/dist/communicator.hpp"

HONE_NAMESPACE_BEGIN
namespace dist {

/// steady_clock's reading in nanoseconds (the clock hone::profile stamps are converted to).
struct steady_clock_ns {
  [[nodiscard]] std::int64_t operator()() const noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

/// Nanoseconds to add to this rank's clock `now()` to read rank 0's (0 on rank 0). Every rank
/// calls it (it runs 2 * rounds collectives). config_error for rounds < 1.
template <communicator Comm, class Now = steady_clock_ns>
[[nodiscard]] std::int64_t estimate_clock_offset_ns(Comm& comm, int rounds = 16, Now now = {}) {
  HONE_REQUIRE(rounds >= 1, "hone::dist::estimate_clock_offset_ns: rounds is " +
                                std::to_string(rounds) + "; at least 1 round is needed");
  const auto ranks = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  std::vector<double> all(ranks);
  std::vector<std::int64_t> offsets;
  offsets.reserve(static_cast<std::size_t>(rounds));
  for (int r = 0; r < rounds; ++r) {
    comm.barrier().wait();
    // Sent as a double: exact for readings below 2^53 ns (104 days of uptime), and beyond that
    // rounded by a few ns, far below the barrier's skew.
    const std::int64_t t = now();
    const double mine = static_cast<double>(t);
    comm.all_gather(std::span<const double>(&mine, 1), std::span<double>(all)).wait();
    offsets.push_back(static_cast<std::int64_t>(std::llround(all[0] - all[me])));
  }
  if (me == 0) return 0;
  const auto mid = offsets.begin() + static_cast<std::ptrdiff_t>(offsets.size() / 2);
  std::nth_element(offsets.begin(), mid, offsets.end());
  return *mid;
}

}  // namespace dist
HONE_NAMESPACE_END
