// hone::dist::estimate_clock_offset_ns: ranks as threads (thread_comm) whose clocks are the
// steady clock shifted by known amounts: every rank recovers its shift to rank 0 within the
// barrier's skew; one rank (local_comm) gives 0; bad arguments are config errors.
#define BOOST_TEST_MODULE hone_dist_clock
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <hone/dist/clock.hpp>
#include <hone/dist/local_comm.hpp>
#include <vector>

#include "thread_comm.hpp"

namespace hd = hone::dist;

BOOST_AUTO_TEST_CASE(thread_ranks_with_shifted_clocks_recover_the_shift) {
  for (const int n : {2, 3, 4}) {
    thread_group g(n);
    std::vector<std::int64_t> got(static_cast<std::size_t>(n), -1);
    // Rank r's clock runs r * 7.3 s ahead of (odd r) or behind (even r) the steady clock.
    auto shift = [](int r) -> std::int64_t {
      return (r % 2 == 1 ? 1 : -1) * static_cast<std::int64_t>(r) * 7'300'000'000;
    };
    g.run([&](int r) {
      thread_comm c(g, r);
      got[static_cast<std::size_t>(r)] = hd::estimate_clock_offset_ns(
          c, 16, [&] { return hd::steady_clock_ns{}() + shift(r); });
    });
    BOOST_TEST_CONTEXT(n << " ranks") {
      BOOST_TEST(got[0] == 0);
      for (int r = 1; r < n; ++r) {
        // rank 0's clock - rank r's = shift(0) - shift(r); within 20 ms of barrier skew.
        const std::int64_t want = shift(0) - shift(r);
        BOOST_TEST(std::llabs(got[static_cast<std::size_t>(r)] - want) < 20'000'000,
                   "rank " << r << ": " << got[static_cast<std::size_t>(r)] << " vs " << want);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(one_rank_is_its_own_time_base) {
  hd::local_comm c;
  BOOST_TEST(hd::estimate_clock_offset_ns(c) == 0);
  BOOST_TEST(hd::estimate_clock_offset_ns(c, 1) == 0);
  BOOST_CHECK_THROW((void)hd::estimate_clock_offset_ns(c, 0), hone::config_error);
}
