// A checkpoint of a ZeRO trainer across world sizes under mpirun (tests/dist/CMakeLists.txt runs
// it three times, in order): `save DIR` on 2 ranks trains steps 0..3 of a 6-micro-batch global
// batch with hone::zero<2> (3 micro-batches per rank) and captures a checkpoint on every rank
// (capture is collective), which rank 0 writes under DIR; `resume DIR` on 1 and on 3 ranks
// restores the newest valid checkpoint of DIR into hone::zero<1> and hone::zero<2> trainers (6 and
// 2 micro-batches per rank), trains steps 4..7 and checks that every rank holds the same bits and
// that the weights match one process that never stopped within 1e-6. `save-sharded DIR` on 2
// ranks trains the same steps and saves a sharded checkpoint (hone::checkpoint::save_sharded:
// every rank writes its own part of the optimizer state, rank 0 commits one MANIFEST for the
// set); `resume DIR` then resumes it on 1 and 3 ranks the same way. Exit status 0 when every
// check holds, 1 otherwise (each failure printed with its rank).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <hone/checkpoint/directory.hpp>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <string>
#include <vector>

#include "zero_scenario.hpp"

namespace hd = hone::dist;
namespace ck = hone::checkpoint;

namespace {
int failures = 0;

void check(bool ok, int rank, const std::string& what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "test_mpi_zero_resume: rank %d: FAILED: %s\n", rank, what.c_str());
  }
}

/// Whether every rank holds rank 0's bits of `w`.
bool same_on_every_rank(hd::mpi_comm& c, const std::vector<float>& w) {
  std::vector<float> all(w.size() * static_cast<std::size_t>(c.size()));
  c.all_gather(std::span<const float>(w), std::span<float>(all)).wait();
  for (int q = 1; q < c.size(); ++q) {
    if (std::memcmp(all.data() + w.size() * static_cast<std::size_t>(q), all.data(),
                    w.size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  hd::mpi_environment env(argc, argv);
  hd::mpi_comm c(MPI_COMM_WORLD, std::chrono::seconds(20));
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "save" && mode != "save-sharded" && mode != "resume") {
    std::fprintf(stderr, "usage: test_mpi_zero_resume save|save-sharded|resume DIR\n");
    return 2;
  }
  const std::filesystem::path root = argv[2];
  try {
    if (mode == "save") {
      if (c.rank() == 0) {
        std::filesystem::remove_all(root);
        std::filesystem::create_directories(root);
      }
      ck::snapshot s;
      (void)zero_segment<2>(c, {}, 0, 4, &s);
      if (c.rank() == 0) {
        const auto dir =
            ck::write_snapshot(root, 4, s, {.compression = std::nullopt, .sync = false});
        std::printf("rank 0 of %d wrote %s\n", c.size(), dir.string().c_str());
      }
      c.barrier().wait();
    } else if (mode == "save-sharded") {
      if (c.rank() == 0) {
        std::filesystem::remove_all(root);
        std::filesystem::create_directories(root);
      }
      c.barrier().wait();
      (void)zero_segment_sharded<2>(c, {}, 0, 4, root);
      const auto dir = root / ck::step_dir_name(4);
      // Committed on every rank's return: one MANIFEST for the set, one part per rank.
      const auto report = ck::verify_directory(dir);
      check(report.ok(), c.rank(),
            "the sharded checkpoint does not verify: " +
                (report.ok() ? std::string() : report.problems.front()));
      check(std::filesystem::exists(dir / ck::shard_file_name(c.rank(), c.size(), false)), c.rank(),
            "this rank's part is missing");
      std::printf("rank %d of %d wrote its part of %s\n", c.rank(), c.size(), dir.string().c_str());
    } else {
      const auto newest = ck::newest_valid(root);
      check(newest.has_value(), c.rank(), "no valid checkpoint under " + root.string());
      if (newest) {
        const std::vector<float> want = six_batch_reference(8);
        const auto w1 = zero_segment<1>(c, newest->path, 4, 8);
        const auto w2 = zero_segment<2>(c, newest->path, 4, 8);
        check(same_on_every_rank(c, w1), c.rank(), "zero<1>: the ranks' weights differ");
        check(same_on_every_rank(c, w2), c.rank(), "zero<2>: the ranks' weights differ");
        const double d1 = max_abs_diff(w1, want), d2 = max_abs_diff(w2, want);
        check(d1 <= 1e-6, c.rank(), "zero<1> differs from one process by " + std::to_string(d1));
        check(d2 <= 1e-6, c.rank(), "zero<2> differs from one process by " + std::to_string(d2));
        // The weights moved since the checkpoint: a resume that trained nothing would not match.
        const auto at4 = zero_segment<2>(c, newest->path, 4, 4);
        check(max_abs_diff(at4, want) > 1e-4, c.rank(), "steps 4..7 changed nothing");
        std::printf(
            "rank %d of %d resumed a 2-rank %s checkpoint: zero<1> %.3g, zero<2> %.3g from "
            "one process\n",
            c.rank(), c.size(),
            ck::is_sharded_checkpoint(newest->path) ? "sharded" : "consolidated", d1, d2);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_mpi_zero_resume: rank %d: %s\n", c.rank(), e.what());
    c.abort(1);
  }
  return failures == 0 ? 0 : 1;
}
