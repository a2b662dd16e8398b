// Failure is never a hang: the last rank skips a collective (it arrives 3 s late); every other
// rank's wait() must throw hone::dist_error naming the operation, its number, the timeout and the
// rank within the timeout (0.5 s) and well before the late rank arrives. The request then stays
// pending: once the late rank joins, waiting again completes it with the right sum.
#define BOOST_TEST_MODULE hone_dist_mpi_timeout
#include <boost/test/unit_test.hpp>

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
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(mpi_fixture);

BOOST_AUTO_TEST_CASE(a_skipped_collective_times_out_on_the_others) {
  using namespace std::chrono;
  hd::mpi_comm c(MPI_COMM_WORLD, milliseconds(500));
  BOOST_TEST(c.timeout() == milliseconds(500));
  c.barrier().wait();  // #0: everybody is here
  const int late = c.size() - 1;
  std::vector<float> x(1000, static_cast<float>(c.rank() + 1));
  if (c.rank() == late) {
    std::this_thread::sleep_for(seconds(3));
    c.all_reduce(std::span<float>(x), hd::reduce_op::sum).wait();
  } else {
    auto r = c.all_reduce(std::span<float>(x), hd::reduce_op::sum);  // #1
    const auto start = steady_clock::now();
    std::string message;
    try {
      r.wait();
    } catch (const hone::dist_error& e) {
      message = e.what();
    }
    const auto waited = duration_cast<milliseconds>(steady_clock::now() - start).count();
    BOOST_TEST_MESSAGE("rank " << c.rank() << ": " << message);
    BOOST_TEST(!message.empty(), "wait() returned after " << waited << " ms without an error");
    BOOST_TEST(waited >= 500);
    BOOST_TEST(waited < 2500);
    BOOST_TEST(message.find("all_reduce #1 (sum of 1000 float)") != std::string::npos, message);
    BOOST_TEST(message.find("within 500 ms") != std::string::npos, message);
    const std::string who =
        "on rank " + std::to_string(c.rank()) + " of " + std::to_string(c.size());
    BOOST_TEST(message.find(who) != std::string::npos, message);
    BOOST_TEST(!r.test());
    c.set_timeout(seconds(20));
    r.wait();  // the late rank arrives
  }
  const float expected = static_cast<float>(c.size() * (c.size() + 1) / 2);
  BOOST_TEST(x.front() == expected);
  BOOST_TEST(x.back() == expected);
  c.barrier().wait();
}
