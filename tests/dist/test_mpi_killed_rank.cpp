// A rank killed with SIGKILL never leaves the others hanging. After a barrier the last rank kills
// itself; every other rank waits for an all_reduce with a 1 s timeout. What follows depends on the
// launcher (docs/dist.md, "A killed rank"); CMakeLists.txt runs this program twice under Open
// MPI's mpirun and checks its output:
//  - by default mpirun ends the whole job as soon as a process dies by a signal, naming the
//    rank itself ("process rank 1 ... exited on signal 9"), before any survivor's timeout;
//  - with `--mca orte_abort_on_non_zero_status 0` the survivors live on: their wait times out and
//    the message names the killed rank ("rank 1 has not started it"); the first survivor to catch
//    it prints it and ends the job (mpi_comm::abort).
// Not a Boost test: a survivor ends the job with MPI_Abort, and CTest's PASS_REGULAR_EXPRESSION
// (and its TIMEOUT, the guard against a hang) judge the run.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <span>
#include <vector>

int main(int argc, char** argv) {
  namespace hd = hone::dist;
  hd::mpi_environment env(argc, argv);
  hd::mpi_comm c(MPI_COMM_WORLD, std::chrono::seconds(1));
  c.barrier().wait();  // #0
  if (c.rank() == c.size() - 1) {
    std::fprintf(stderr, "rank %d: killing itself (SIGKILL)\n", c.rank());
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
  std::vector<float> x(1000, 1.0f);
  auto r = c.all_reduce(std::span<float>(x), hd::reduce_op::sum);  // #1
  const auto start = std::chrono::steady_clock::now();
  try {
    r.wait();
  } catch (const std::exception& e) {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("caught after %.2f s: %s\n", waited, e.what());
    std::fflush(stdout);
    c.abort(2);  // the request is still pending: end the job rather than wait in its destructor
  }
  std::printf("rank %d: the all_reduce completed without the killed rank\n", c.rank());
  return 1;
}
