// A rank killed with SIGKILL never leaves the others hanging. After a barrier the last rank kills
// itself; every other rank waits for an all_reduce with a 1 s timeout. What follows depends on the
// launcher (docs/dist.md, "A killed rank"); CMakeLists.txt runs this program twice under Open
// MPI's mpirun and checks its output:
//  - by default mpirun ends the whole job as soon as a process dies by a signal, naming the
//    rank itself ("process rank 1 ... exited on signal 9"), before any survivor's timeout;
//  - with `--mca orte_abort_on_non_zero_status 0` the survivors live on: their wait times out and
//    the message names the killed rank ("rank 1 has not started it ... rank 1 shows no sign of
//    life"); the first survivor to catch it prints it and ends the job (mpi_comm::abort).
// With the argument `inside`, the last rank starts the all_reduce before it kills itself: it dies
// inside the collective, so every rank has started it and only the heartbeat names the dead one
// ("every other rank has started it; rank 1 shows no sign of life"). That all_reduce is 100000
// floats, which MPI_Iallreduce carries: the 1000 floats of the other cases would take hone's own
// exchange (detail/p2p_all_reduce.hpp), whose eager messages a rank may have delivered before it
// dies, and then the survivors complete the collective with the right sum (a valid outcome, but
// not this test's).
// Not a Boost test: a survivor ends the job with MPI_Abort, and CTest's PASS_REGULAR_EXPRESSION
// (and its TIMEOUT, the guard against a hang) judge the run.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <span>
#include <string_view>
#include <vector>

int main(int argc, char** argv) {
  namespace hd = hone::dist;
  hd::mpi_environment env(argc, argv);
  hd::mpi_comm c(MPI_COMM_WORLD, std::chrono::seconds(1));
  const bool inside = argc > 1 && std::string_view(argv[1]) == "inside";
  c.barrier().wait();  // #0
  std::vector<float> x(inside ? 100000 : 1000, 1.0f);
  const auto die = [&] {
    std::fprintf(stderr, "rank %d: killing itself (SIGKILL)\n", c.rank());
    std::fflush(stderr);
    std::raise(SIGKILL);
  };
  if (c.rank() == c.size() - 1 && !inside) die();
  auto r = c.all_reduce(std::span<float>(x), hd::reduce_op::sum);  // #1
  if (c.rank() == c.size() - 1) die();                             // inside the collective
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
