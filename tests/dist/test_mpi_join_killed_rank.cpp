// A rank that has joined (hone::dist::join: it has no batch left) while another rank dies gets a
// dist_error naming the dead rank, never a hang. Rank 0 has no batch and joins at once; the other
// ranks train one step; then the last rank kills itself (SIGKILL) before its second step. Rank 0,
// waiting in the exchange of the still-active flags of step 2, throws after the communicator's
// 1 s timeout; the message names the step, that it has joined, and the killed rank (read from the
// one-word progress window, docs/dist.md "How the missing rank is found"). Rank 0 prints it and
// ends the job (mpi_comm::abort). Run by CMakeLists.txt under Open MPI's mpirun with
// `--mca orte_abort_on_non_zero_status 0` (so the survivors live on); CTest's
// PASS_REGULAR_EXPRESSION and TIMEOUT judge the run. Not a Boost test (the job ends in MPI_Abort).
#include <chrono>
#include <csignal>
#include <cstdio>
#include <hone/dist/data_parallel.hpp>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <thread>

#include "dp_scenario.hpp"

int main(int argc, char** argv) {
  namespace hd = hone::dist;
  hd::mpi_environment env(argc, argv);
  hd::mpi_comm c(MPI_COMM_WORLD, std::chrono::seconds(1));
  const scenario sc{};
  mlp<hone::half> m;
  hone::data_parallel_options o = scenario_buckets;
  o.uneven_inputs = true;
  auto t = scenario_trainer(m, hone::data_parallel(c, o));
  const auto start = std::chrono::steady_clock::now();
  try {
    if (c.rank() != 0) {
      (void)t.step(scenario_batch(sc, 0, c.rank()));
      if (c.rank() == c.size() - 1) {
        std::fprintf(stderr, "rank %d: killing itself (SIGKILL)\n", c.rank());
        std::fflush(stderr);
        std::raise(SIGKILL);
      }
      (void)t.step(scenario_batch(sc, 1, c.rank()));
    }
    (void)hd::join(t);
  } catch (const hone::dist_error& e) {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (c.rank() == 0) {
      std::printf("rank 0 (joined) caught after %.2f s: %s\n", waited, e.what());
      std::fflush(stdout);
      c.abort(2);
    }
    // Another survivor leaves rank 0 the time to report, then ends the job itself.
    std::this_thread::sleep_for(std::chrono::seconds(10));
    c.abort(3);
  }
  std::printf("rank %d: the join completed without the killed rank\n", c.rank());
  return 1;
}
