// tests/dist/thread_comm.hpp, the thread ranks of the dist tests: a rank whose body throws or
// returns early fails the run with an error naming it instead of leaving the others blocked until
// CTest's timeout; the group runs again after a failure. (Its collectives' results are checked
// by every test that uses it, against one process.)
#define BOOST_TEST_MODULE hone_dist_thread_comm
#include <boost/test/unit_test.hpp>

#include <array>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "thread_comm.hpp"

namespace hd = hone::dist;

namespace {
bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_rank_that_throws_releases_the_others_and_run_rethrows_its_error) {
  thread_group g(3);
  std::vector<std::string> seen(3);  // what ranks 0 and 2 caught
  std::string rethrown;
  try {
    g.run([&](int r) {
      thread_comm c(g, r);
      std::array<float, 2> x{1.0F, 2.0F};
      c.all_reduce(std::span<float>(x), hd::reduce_op::sum).wait();  // every rank: completes
      if (r == 1) throw std::runtime_error("rank 1's own failure");
      try {
        c.all_reduce(std::span<float>(x), hd::reduce_op::sum).wait();
        seen[static_cast<std::size_t>(r)] = "completed";
      } catch (const thread_group_stopped& e) {
        seen[static_cast<std::size_t>(r)] = e.what();
      }
    });
  } catch (const std::runtime_error& e) {
    rethrown = e.what();
  }
  BOOST_TEST(rethrown == "rank 1's own failure");
  for (const int r : {0, 2}) {
    BOOST_TEST_CONTEXT("rank " << r) {
      BOOST_TEST(contains(seen[static_cast<std::size_t>(r)], "rank 1 left by throwing"),
                 seen[static_cast<std::size_t>(r)]);
    }
  }

  // The same group runs again, and its collectives sum in rank order.
  std::vector<float> sums(3, 0.0F);
  g.run([&](int r) {
    thread_comm c(g, r);
    std::array<float, 1> x{static_cast<float>(r + 1)};
    c.all_reduce(std::span<float>(x), hd::reduce_op::sum).wait();
    sums[static_cast<std::size_t>(r)] = x[0];
  });
  for (const float s : sums) BOOST_TEST(s == 6.0F);
}

BOOST_AUTO_TEST_CASE(a_rank_that_calls_fewer_collectives_is_named_not_waited_for) {
  thread_group g(2);
  std::string rethrown;
  try {
    g.run([&](int r) {
      thread_comm c(g, r);
      c.barrier().wait();
      if (r == 0) c.barrier().wait();  // rank 1 never calls a second barrier
    });
  } catch (const thread_group_stopped& e) {
    rethrown = e.what();
  }
  BOOST_TEST(contains(rethrown, "rank 0 is in collective 1, which rank 1 will never call"),
             rethrown);
}
