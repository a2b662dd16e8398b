// Tests of mpi_comm's progress thread (start_progress_thread), run under mpirun with 2 and 3 ranks
// and MPI_THREAD_MULTIPLE: every kind of collective started and waited while the thread polls
// (results against closed-form oracles and the documented summation orders, bit for bit), stop
// and restart, a request outliving a stopped thread, a communicator
// destroyed with its thread running, a thread left running into MPI_Finalize (stopped by it), and
// the sentences for a bad interval. The refusal without MPI_THREAD_MULTIPLE is in test_mpi_comm.
#define BOOST_TEST_MODULE hone_dist_mpi_progress
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../support/error_text.hpp"

namespace hd = hone::dist;

namespace {
// A communicator whose progress thread is still running when the fixture's environment
// finalizes MPI: MPI_Finalize must stop the thread before it tears MPI down.
std::optional<hd::mpi_comm> outliving;

struct mpi_fixture {
  hd::mpi_environment env{hd::thread_level::multiple};
  ~mpi_fixture() {
    if (!outliving) return;
    MPI_Finalize();     // with the thread running: its hook stops it first
    outliving.reset();  // after MPI_Finalize the communicator frees nothing (env: finalized)
  }
};

hd::mpi_comm make_comm() {
  return hd::mpi_comm(MPI_COMM_WORLD, std::chrono::seconds(20));
}

// Values whose sums round (the order of the additions shows in the bits).
float inexact(int rank, std::size_t j) {
  const std::uint64_t h = (j * 2654435761u + static_cast<std::uint64_t>(rank) * 40503u) % 1000003u;
  return static_cast<float>(static_cast<double>(h) / 997.0) / 3.0f;
}
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(mpi_fixture);

// With the thread polling every 20 us, the main thread starts and waits collectives of every kind
// and size (the small exchange, the ring, hone's reduce-scatter, libnbc's all_gather, broadcast
// and barrier), several in flight at once and waited out of order, 50 rounds: every result exact.
BOOST_AUTO_TEST_CASE(collectives_are_exact_while_the_thread_polls) {
  auto c = make_comm();
  BOOST_TEST(!c.has_progress_thread());
  c.start_progress_thread(std::chrono::microseconds(20));
  BOOST_TEST(c.has_progress_thread());
  const int n = c.size();
  const auto un = static_cast<std::size_t>(n);
  for (int round = 0; round < 50; ++round) {
    const std::size_t small = 1 + static_cast<std::size_t>(round) * 37;  // the exchange
    const std::size_t large = 70001 + static_cast<std::size_t>(round);   // MPI_Iallreduce
    std::vector<float> a(small), b(large);
    for (std::size_t j = 0; j < small; ++j) a[j] = inexact(c.rank(), j);
    for (std::size_t j = 0; j < large; ++j) b[j] = static_cast<float>(c.rank() + 1);
    const std::size_t m = 1000 + static_cast<std::size_t>(round);  // per rank
    std::vector<float> in(m * un), out(m);
    for (std::size_t j = 0; j < in.size(); ++j) in[j] = inexact(c.rank(), j);
    std::vector<std::int32_t> gathered(3 * un);
    std::vector<std::int32_t> mine{c.rank(), -c.rank(), round};
    std::vector<double> bc(5, c.rank() == n - 1 ? 2.5 : 0.0);
    auto ra = c.all_reduce(std::span<float>(a), hd::reduce_op::sum);
    auto rb = c.all_reduce(std::span<float>(b), hd::reduce_op::sum);
    auto rs =
        c.reduce_scatter(std::span<const float>(in), std::span<float>(out), hd::reduce_op::sum);
    auto rg = c.all_gather(std::span<const std::int32_t>(mine), std::span<std::int32_t>(gathered));
    auto rc = c.broadcast(std::span<double>(bc), n - 1);
    auto rr = c.barrier();
    if (round % 3 == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the thread alone
    rr.wait();
    rc.wait();
    rg.wait();
    rs.wait();
    rb.wait();
    ra.wait();
    std::size_t wrong = 0;
    for (std::size_t j = 0; j < small; ++j) {  // rank order
      float acc = inexact(0, j);
      for (int r = 1; r < n; ++r) acc = acc + inexact(r, j);
      wrong += std::memcmp(&acc, &a[j], sizeof acc) != 0;
    }
    for (std::size_t j = 0; j < large; ++j) wrong += b[j] != static_cast<float>(n * (n + 1) / 2);
    const std::size_t base = static_cast<std::size_t>(c.rank()) * m;
    for (std::size_t k = 0; k < m; ++k) {  // reduce_scatter's documented order
      float acc = inexact((c.rank() + 1) % n, base + k);
      for (int step = 2; step <= n; ++step) acc = acc + inexact((c.rank() + step) % n, base + k);
      wrong += std::memcmp(&acc, &out[k], sizeof acc) != 0;
    }
    for (int r = 0; r < n; ++r) {
      const auto q = static_cast<std::size_t>(r) * 3;
      wrong += gathered[q] != r || gathered[q + 1] != -r || gathered[q + 2] != round;
    }
    for (double v : bc) wrong += v != 2.5;
    BOOST_TEST(wrong == 0u, "round " << round);
  }
  c.stop_progress_thread();
  BOOST_TEST(!c.has_progress_thread());
}

// A collective started before the thread stops completes by wait() alone; the thread restarts;
// a communicator destroyed with its thread running stops it first.
BOOST_AUTO_TEST_CASE(stop_restart_and_destroy_with_the_thread_running) {
  auto c = make_comm();
  c.start_progress_thread();
  std::vector<float> x(100000, 1.0f);
  auto r = c.all_reduce(std::span<float>(x), hd::reduce_op::sum);
  c.stop_progress_thread();
  r.wait();
  BOOST_TEST(x[99999] == static_cast<float>(c.size()));
  c.start_progress_thread(std::chrono::microseconds(5));
  c.start_progress_thread(std::chrono::microseconds(100));  // replaces the running one
  std::vector<double> y(3, 1.0);
  c.all_reduce(std::span<double>(y), hd::reduce_op::max).wait();
  BOOST_TEST(y[0] == 1.0);
  {
    auto d = make_comm();
    d.start_progress_thread();
    std::vector<float> z(10, 2.0f);
    d.all_reduce(std::span<float>(z), hd::reduce_op::sum).wait();
    BOOST_TEST(z[0] == 2.0f * static_cast<float>(c.size()));
  }  // destroyed (collective over the ranks) with its thread running
  c.barrier().wait();
}

BOOST_AUTO_TEST_CASE(a_bad_interval_is_refused_with_a_sentence) {
  auto c = make_comm();
  const std::string m = hone_test::error_of<hone::config_error>(
      [&] { c.start_progress_thread(std::chrono::microseconds(0)); });
  BOOST_TEST(m.find("the interval must be positive (it is 0 us)") != std::string::npos, m);
  BOOST_TEST(!c.has_progress_thread());
}

// The last test leaves a communicator with a running thread to the fixture, which finalizes MPI
// while it runs: MPI_Finalize stops it (its hook), so the process exits cleanly.
BOOST_AUTO_TEST_CASE(a_thread_left_running_into_mpi_finalize) {
  outliving.emplace(make_comm());
  outliving->start_progress_thread(std::chrono::microseconds(10));
  std::vector<float> x(8, 1.0f);
  outliving->all_reduce(std::span<float>(x), hd::reduce_op::sum).wait();
  BOOST_TEST(x[0] == static_cast<float>(outliving->size()));
}
