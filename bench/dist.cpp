// bench/dist.cpp (mpi_bench_dist): allreduce_bus_bandwidth, hone::dist::mpi_comm::all_reduce
// (sum, float, in place) against raw MPI_Allreduce (MPI_IN_PLACE) on the same buffer, in the same
// run, interleaved repetition by repetition (the order rotated each repetition), for 1 KiB ..
// 256 MiB in powers of 4. Rows: mpi (MPI_Allreduce, MPI_IN_PLACE), hone (the default
// communicator, which publishes its progress in a one-word window: missing_ranks::named), nowin
// (missing_ranks::not_named: the window's cost is the difference) and mpi_nb (MPI_Iallreduce +
// MPI_Wait: what MPI's own non-blocking path costs, hone's polling aside).
//
// Run under mpirun (it is not a Google Benchmark program, so scripts/bench's driver does not run
// it: every rank must run the same number of calls):
//   scripts/bench-dist                         # builds the bench preset's target, mpirun -np 2
//   mpirun -np 2 build/bench/bench/mpi_bench_dist [--max-bytes N] [--repetitions N]
// A sample is the time of a batch of calls divided by its calls, the slowest rank's (MPI_MAX
// over the ranks after the batch), after a barrier. The batch is sized once per message size
// from raw MPI_Allreduce (doubled until it takes 5 ms, then scaled to about 30 ms; one call for
// the largest sizes). Reported per size and row: the median time per call, busbw = algbw *
// 2 (n - 1) / n with algbw = bytes / time (nccl-tests' definitions for all_reduce), and the
// median over repetitions of mpi time / row time (the same repetition's samples; >= 0.95 is
// hone's goal).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <span>
#include <string>
#include <vector>

namespace {

namespace hd = hone::dist;
using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

enum class impl { raw, hone, hone_no_window, raw_nonblocking };
constexpr int impls = 4;

struct args {
  std::size_t max_bytes = std::size_t{256} << 20;
  int repetitions = 0;  // 0: by size
};

args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--max-bytes" && i + 1 < argc) {
      a.max_bytes = std::strtoull(argv[++i], nullptr, 10);
    } else if (s == "--repetitions" && i + 1 < argc) {
      a.repetitions = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "mpi_bench_dist: unknown argument '%s'; use --max-bytes N (largest message, "
                   "default 268435456) and --repetitions N (default: 15, fewer for large sizes)\n",
                   s.c_str());
      std::exit(2);
    }
  }
  return a;
}

/// Seconds per call of `calls` calls of `op`, the slowest rank's, between barriers.
template <class Op>
double sample(MPI_Comm world, long calls, Op&& op) {
  MPI_Barrier(world);
  const auto t0 = clock_type::now();
  for (long i = 0; i < calls; ++i) op();
  double t =
      std::chrono::duration<double>(clock_type::now() - t0).count() / static_cast<double>(calls);
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  hd::mpi_environment env(argc, argv);
  const args a = parse(argc, argv);
  MPI_Comm world = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  hd::mpi_comm named(world);
  hd::mpi_comm not_named(world, hd::mpi_comm::default_timeout, hd::missing_ranks::not_named);
  // Raw MPI gets its own duplicate too, as hone does (a fresh communicator each).
  MPI_Comm raw_comm = MPI_COMM_NULL;
  MPI_Comm_dup(world, &raw_comm);

  const std::size_t max_floats = a.max_bytes / sizeof(float);
  // Zeros: the sums stay 0 (no overflow to inf, no subnormals) however many calls run in place.
  std::vector<float> buffer(max_floats, 0.0f);

  if (rank == 0) {
    std::printf(
        "allreduce_bus_bandwidth: %d ranks, float sum in place; time per call (median), "
        "algbw = bytes/time, busbw = algbw*2(n-1)/n, ratio = median over repetitions of "
        "mpi time / row time\n",
        size);
    std::printf("%10s %6s %3s | %10s %7s |", "bytes", "calls", "rep", "mpi us", "busbw");
    for (const char* name : {"hone", "nowin", "mpi_nb"}) {
      std::printf(" %7s us %7s %5s |", name, "busbw", "ratio");
    }
    std::printf("\n");
  }
  for (std::size_t bytes = 1024; bytes <= a.max_bytes; bytes *= 4) {
    const std::size_t n = bytes / sizeof(float);
    std::span<float> data(buffer.data(), n);
    auto run = [&](impl which) {
      switch (which) {
        case impl::raw:
          MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                        raw_comm);
          break;
        case impl::hone:
          named.all_reduce(data, hd::reduce_op::sum).wait();
          break;
        case impl::hone_no_window:
          not_named.all_reduce(data, hd::reduce_op::sum).wait();
          break;
        case impl::raw_nonblocking: {
          MPI_Request req = MPI_REQUEST_NULL;
          MPI_Iallreduce(MPI_IN_PLACE, data.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                         raw_comm, &req);
          MPI_Wait(&req, MPI_STATUS_IGNORE);
          break;
        }
      }
    };
    // Warm-up (first touch of the pages, MPI's connections and registrations), then rank 0 sizes
    // the batch: about 30 ms per sample.
    for (int w = 0; w < impls; ++w) run(static_cast<impl>(w));
    long calls = 1;
    for (;;) {  // double the batch until it takes 5 ms (every rank sees the same slowest time)
      const double t = sample(world, calls, [&] { run(impl::raw); }) * static_cast<double>(calls);
      if (t >= 0.005) {
        calls = std::max(1L, static_cast<long>(static_cast<double>(calls) * 0.03 / t));
        break;
      }
      calls *= 2;
    }
    MPI_Bcast(&calls, 1, MPI_LONG, 0, world);
    const int reps = a.repetitions > 0                  ? a.repetitions
                     : bytes >= (std::size_t{64} << 20) ? 5
                     : bytes >= (std::size_t{4} << 20)  ? 9
                                                        : 15;
    std::vector<double> times[impls];
    std::vector<double> ratio[impls];
    for (int r = 0; r < reps; ++r) {
      double t[impls] = {};
      for (int k = 0; k < impls; ++k) {
        const int w = (k + r) % impls;  // rotated order
        t[w] = sample(world, calls, [&] { run(static_cast<impl>(w)); });
      }
      for (int w = 0; w < impls; ++w) {
        times[w].push_back(t[w]);
        ratio[w].push_back(t[0] / t[w]);
      }
    }
    if (rank == 0) {
      const double factor = 2.0 * (size - 1) / size;
      double med[impls];
      for (int w = 0; w < impls; ++w) med[w] = median(times[w]);
      auto busbw = [&](double t) { return static_cast<double>(bytes) / t * factor / 1e9; };
      std::printf("%10zu %6ld %3d | %10.2f %7.3f |", bytes, calls, reps, med[0] * 1e6,
                  busbw(med[0]));
      for (int w = 1; w < impls; ++w) {
        std::printf(" %10.2f %7.3f %5.3f |", med[w] * 1e6, busbw(med[w]), median(ratio[w]));
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  MPI_Comm_free(&raw_comm);
  return 0;
}
