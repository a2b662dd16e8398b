// A killed actor rank never leaves the learner hanging (hone/rl/dist_actors.hpp over
// hone::dist::mpi_comm). Two modes (the first argument):
//  - "before": after two rounds the last rank kills itself (SIGKILL) before round 3; the
//    learner's third round times out after its communicator's timeout (1 s) and throws
//    hone::dist_error naming the round, the collective and the dead rank ("rank 2 has not
//    started it");
//  - "inside": the last rank is killed (by a thread of its own, 200 ms in) while it waits inside
//    round 3's all_gather, which the learner enters late (500 ms); the learner's round still
//    throws within its timeout (mpi_comm cannot name a rank that had started the collective:
//    the message says which collective and that every rank had started it).
// The other actors wait with a longer timeout (10 s), so the learner's message comes first; the
// learner prints it and ends the job (mpi_comm::abort). Run under `mpirun --mca
// orte_abort_on_non_zero_status 0` (the survivors live on after the kill); CTest's
// PASS_REGULAR_EXPRESSION judges the output and its TIMEOUT guards against a hang. Not a Boost
// test: the job ends with MPI_Abort.
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <hone/rl/dist_actors.hpp>
#include <hone/rl/replay_buffer.hpp>
#include <string_view>
#include <thread>
#include <vector>

namespace {
using step = hone::transition<hone::field<"obs", float, 4>, hone::field<"reward", float>,
                              hone::field<"policy_version", std::uint64_t>>;
}  // namespace

int main(int argc, char** argv) {
  namespace hd = hone::dist;
  const bool inside = argc > 1 && std::string_view(argv[1]) == "inside";
  hd::mpi_environment env(argc, argv);
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  hd::mpi_comm comm(MPI_COMM_WORLD,
                    world_rank == 0 ? std::chrono::seconds(1) : std::chrono::seconds(10));
  const hone::dist_actor_options opt{.block = 16, .max_lag = 4};
  if (comm.rank() == 0) {
    hone::replay_buffer<step> buffer(1024);
    std::vector<float> params(100, 0.5f);
    hone::dist_learner<hd::mpi_comm, hone::replay_buffer<step>> learner(comm, buffer, params, opt);
    const auto start = std::chrono::steady_clock::now();
    try {
      for (int r = 1; r <= 5; ++r) {
        if (inside && r == 3) std::this_thread::sleep_for(std::chrono::milliseconds(500));
        learner.round();
        learner.publish(params);
      }
    } catch (const hone::dist_error& e) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("learner caught after %.2f s (%llu transitions received): %s\n", waited,
                  static_cast<unsigned long long>(learner.received()), e.what());
      std::fflush(stdout);
      comm.abort(2);  // the round is still pending: end the job
    }
    std::printf("learner: five rounds completed without the killed rank\n");
    return 1;
  }
  hone::dist_actor<hd::mpi_comm, step> actor(comm, opt);
  for (int r = 1; r <= 5; ++r) {
    if (inside && r == 3 && comm.rank() == comm.size() - 1) {
      std::thread([rank = comm.rank()] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        std::fprintf(stderr, "rank %d: killed (SIGKILL) inside round 3\n", rank);
        std::fflush(stderr);
        std::raise(SIGKILL);
      }).detach();
    } else if (r == 3 && comm.rank() == comm.size() - 1) {
      std::fprintf(stderr, "rank %d: killing itself (SIGKILL) before round 3\n", comm.rank());
      std::fflush(stderr);
      std::raise(SIGKILL);
    }
    step::record rec{};
    hone::get<"policy_version">(rec) = actor.version();
    while (actor.room() > 0) actor.add(rec);
    actor.round();
  }
  return 1;
}
