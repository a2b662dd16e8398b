// Failure is never a hang, and the missing rank is named: some ranks skip a collective (they
// arrive 1.5 s late); every other rank's wait() must throw hone::dist_error within the timeout
// (0.3 s, and well before the late ranks arrive) naming the operation, its number, the timeout,
// its own rank, the ranks that have not started the collective (with the last collective they
// started) and the ranks that have, and never call a late (sleeping, alive) rank dead. Cases: the
// last rank late; rank 1 late (the middle rank with 3 ranks); with 3 ranks, ranks 1 and 2 late; and
// a communicator without the progress window, whose message says it cannot tell. The request then
// stays pending: once the late ranks join, waiting again completes it with the right sum.
#define BOOST_TEST_MODULE hone_dist_mpi_timeout
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace hd = hone::dist;

namespace {
struct mpi_fixture {
  hd::mpi_environment env;
};

/// "1", "1 and 2", "0, 1 and 3".
std::string list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += i + 1 == ranks.size() ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

/// Collective #0 is a barrier; then the ranks in `late` sleep 1.5 s before all_reduce #1 while
/// the others start it at once and wait with a 300 ms timeout. Returns the message the waiting
/// rank caught (empty on a late rank), after checking the timing and completing the request.
std::string late_all_reduce(hd::mpi_comm& c, const std::vector<int>& late) {
  using namespace std::chrono;
  c.set_timeout(milliseconds(300));
  c.barrier().wait();  // #0: everybody is here
  std::vector<float> x(1000, static_cast<float>(c.rank() + 1));
  std::string message;
  if (std::find(late.begin(), late.end(), c.rank()) != late.end()) {
    std::this_thread::sleep_for(milliseconds(1500));
    c.set_timeout(seconds(20));
    c.all_reduce(std::span<float>(x), hd::reduce_op::sum).wait();
  } else {
    auto r = c.all_reduce(std::span<float>(x), hd::reduce_op::sum);  // #1
    const auto start = steady_clock::now();
    try {
      r.wait();
    } catch (const hone::dist_error& e) {
      message = e.what();
    }
    const auto waited = duration_cast<milliseconds>(steady_clock::now() - start).count();
    BOOST_TEST_MESSAGE("rank " << c.rank() << ": " << message);
    BOOST_TEST(!message.empty(), "wait() returned after " << waited << " ms without an error");
    BOOST_TEST(waited >= 300);
    BOOST_TEST(waited < 1400);
    BOOST_TEST(message.find("all_reduce #1 (sum of 1000 float)") != std::string::npos, message);
    BOOST_TEST(message.find("within 300 ms") != std::string::npos, message);
    const std::string who =
        "on rank " + std::to_string(c.rank()) + " of " + std::to_string(c.size()) + ": ";
    BOOST_TEST(message.find(who) != std::string::npos, message);
    BOOST_TEST(message.find("The request is still pending") != std::string::npos, message);
    // The late ranks sleep but live: their heartbeat moves, so none is called dead.
    BOOST_TEST(message.find("no sign of life") == std::string::npos, message);
    BOOST_TEST(!r.test());
    c.set_timeout(seconds(20));
    r.wait();  // the late ranks arrive
  }
  const float expected = static_cast<float>(c.size() * (c.size() + 1) / 2);
  BOOST_TEST(x.front() == expected);
  BOOST_TEST(x.back() == expected);
  c.barrier().wait();
  return message;
}

/// Checks that a waiting rank's message names exactly `late` as missing (their last collective
/// being the barrier #0) and the other waiting ranks as present.
void check_names(const hd::mpi_comm& c, const std::vector<int>& late, const std::string& message) {
  if (std::find(late.begin(), late.end(), c.rank()) != late.end()) return;
  const bool one = late.size() == 1;
  std::string expected = (one ? "rank " : "ranks ") + list(late) +
                         (one ? " has not started it (the last collective it started: #0"
                              : " have not started it (the last collectives they started: #0");
  for (std::size_t i = 1; i < late.size(); ++i)
    expected += i + 1 == late.size() ? " and #0" : ", #0";
  expected += ")";
  std::vector<int> present;
  for (int q = 0; q < c.size(); ++q) {
    if (q != c.rank() && std::find(late.begin(), late.end(), q) == late.end()) present.push_back(q);
  }
  if (!present.empty()) {
    expected += "; " + std::string(present.size() == 1 ? "rank " : "ranks ") + list(present) +
                (present.size() == 1 ? " has." : " have.");
  } else {
    expected += ".";
  }
  const std::string head =
      "on rank " + std::to_string(c.rank()) + " of " + std::to_string(c.size()) + ": " + expected;
  BOOST_TEST(message.find(head) != std::string::npos,
             "expected \"" << head << "\" in: " << message);
}
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(mpi_fixture);

BOOST_AUTO_TEST_CASE(the_last_rank_is_named_when_it_skips_a_collective) {
  hd::mpi_comm c(MPI_COMM_WORLD, std::chrono::milliseconds(500));
  BOOST_TEST(c.timeout() == std::chrono::milliseconds(500));
  BOOST_TEST(c.names_missing_ranks());
  const std::vector<int> late{c.size() - 1};
  check_names(c, late, late_all_reduce(c, late));
}

BOOST_AUTO_TEST_CASE(rank_1_is_named_when_it_skips_a_collective) {  // the middle one of 3
  hd::mpi_comm c;
  const std::vector<int> late{1};
  check_names(c, late, late_all_reduce(c, late));
}

BOOST_AUTO_TEST_CASE(every_missing_rank_is_named) {
  hd::mpi_comm c;
  if (c.size() < 3) return;  // needs two late ranks and one waiting
  std::vector<int> late;
  for (int q = 1; q < c.size(); ++q) late.push_back(q);
  check_names(c, late, late_all_reduce(c, late));
}

BOOST_AUTO_TEST_CASE(without_the_window_the_message_says_it_cannot_tell) {
  hd::mpi_comm c(MPI_COMM_WORLD, std::chrono::seconds(20), hd::missing_ranks::not_named);
  BOOST_TEST(!c.names_missing_ranks());
  const std::vector<int> late{c.size() - 1};
  const std::string message = late_all_reduce(c, late);
  if (c.rank() != late.front()) {
    BOOST_TEST(
        message.find(": another rank has not started it (this communicator does not track "
                     "which: it was created with missing_ranks::not_named). ") != std::string::npos,
        message);
    BOOST_TEST(message.find("has not started it (the last") == std::string::npos, message);
  }
}
