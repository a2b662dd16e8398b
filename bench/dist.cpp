// bench/dist.cpp (mpi_bench_dist): three tables, each row interleaved with MPI's blocking
// collective on the same buffers, in the same run, repetition by repetition (the order rotated each
// repetition).
//
// allreduce_bus_bandwidth: hone::dist::mpi_comm::all_reduce (sum, in place) against raw
// MPI_Allreduce (MPI_IN_PLACE), 1 KiB .. 256 MiB in powers of 4. Rows: mpi (MPI_Allreduce,
// MPI_IN_PLACE), hone (the default communicator, which publishes its progress in a one-word
// window: missing_ranks::named), nowin (missing_ranks::not_named: the window's cost is the
// difference) and mpi_nb (MPI_Iallreduce + MPI_Wait: what MPI's own non-blocking path costs,
// hone's polling aside).
//
// reduce_scatter_bus_bandwidth: hone::dist::mpi_comm::reduce_scatter (sum, float, `in` of the
// given bytes, `out` of bytes / ranks) + wait() against raw MPI_Reduce_scatter_block (Open MPI's
// coll/tuned), 4 KiB .. 64 MiB of input in powers of 4 (sizes rounded down to a multiple of the
// ranks). Rows: mpi (MPI_Reduce_scatter_block), hone, and mpi_nb (MPI_Ireduce_scatter_block +
// MPI_Wait: libnbc's binomial reduce and scatter, which hone ran before its ring). With
// allgather_bus_bandwidth: hone::dist::mpi_comm::all_gather (in place: `in` is this rank's block of
// `out`) + wait() against raw MPI_Allgather (MPI_IN_PLACE), 1 KiB .. 64 MiB of output in powers of
// 4 (rounded down to a multiple of the ranks). Rows: mpi, hone, and mpi_nb (MPI_Iallgather +
// MPI_Wait: libnbc).
//
// With --type bf16 or fp16 the elements of every table are hone::bfloat16 or hone::half
// (data_parallel's 16-bit wires, or a user's 16-bit all_reduce): MPI's reducing rows then use an
// MPI_Op with the same sum as mpi_comm's (each pair widened to float, added, rounded back; the
// MPI_Op's loop is scalar, hone's runs on hone::active_isa(), so HONE_ISA=scalar gives hone's rows
// the element loop as well).
//
// Run under mpirun (it is not a Google Benchmark program, so scripts/bench's driver does not run
// it: every rank must run the same number of calls):
//   scripts/bench-dist                         # builds the bench preset's target, mpirun -np 2
//   mpirun -np 2 build/bench/bench/mpi_bench_dist [--max-bytes N] [--repetitions N]
//       [--collective all_reduce|reduce_scatter|all_gather|both|all] [--type float|bf16|fp16]
// (both: all_reduce and reduce_scatter, the default; all: the three tables)
// A sample is the time of a batch of calls divided by its calls, the slowest rank's (MPI_MAX
// over the ranks after the batch), after a barrier. The batch is sized once per message size
// from the raw MPI row (doubled until the fastest of 3 batches takes 5 ms, then scaled to about
// 30 ms; one call for the largest sizes). Reported per size and row: the median time per call,
// busbw (nccl-tests' definitions: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n for
// all_reduce and algbw * (n - 1) / n for reduce_scatter and all_gather, bytes being the input,
// the output for all_gather), and the median over repetitions of mpi time / row time (the same
// repetition's samples; >= 0.95 is hone's goal).
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

struct args {
  std::size_t max_bytes = std::size_t{256} << 20;
  int repetitions = 0;  // 0: by size
  bool all_reduce = true;
  bool reduce_scatter = true;
  bool all_gather = false;
  std::string type = "float";  // both tables' elements: float, bf16 or fp16
};

args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--max-bytes" && i + 1 < argc) {
      a.max_bytes = std::strtoull(argv[++i], nullptr, 10);
    } else if (s == "--repetitions" && i + 1 < argc) {
      a.repetitions = std::atoi(argv[++i]);
    } else if (s == "--collective" && i + 1 < argc) {
      const std::string c = argv[++i];
      a.all_reduce = c == "all_reduce" || c == "both" || c == "all";
      a.reduce_scatter = c == "reduce_scatter" || c == "both" || c == "all";
      a.all_gather = c == "all_gather" || c == "all";
      if (!a.all_reduce && !a.reduce_scatter && !a.all_gather) {
        std::fprintf(stderr,
                     "mpi_bench_dist: --collective takes all_reduce, reduce_scatter, all_gather, "
                     "both or all, not '%s'\n",
                     c.c_str());
        std::exit(2);
      }
    } else if (s == "--type" && i + 1 < argc) {
      const std::string t = argv[++i];
      if (t != "float" && t != "bf16" && t != "fp16") {
        std::fprintf(stderr, "mpi_bench_dist: --type takes float, bf16 or fp16, not '%s'\n",
                     t.c_str());
        std::exit(2);
      }
      a.type = t;
    } else {
      std::fprintf(
          stderr,
          "mpi_bench_dist: unknown argument '%s'; use --max-bytes N (largest message, "
          "default 268435456), --repetitions N (default: 15, fewer for large sizes), "
          "--collective all_reduce|reduce_scatter|all_gather|both|all (default both) and --type "
          "float|bf16|fp16 (the elements, default float)\n",
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

/// One table: for each size, row 0 (raw MPI: it sizes the batch) and the other rows interleaved,
/// their order rotated each repetition. run(row, bytes) makes one call; factor turns algbw into
/// busbw.
template <class Run>
void table(MPI_Comm world, int rank, const args& a, std::size_t min_bytes, std::size_t max_bytes,
           const std::vector<const char*>& rows, double factor, Run&& run) {
  const int impls = static_cast<int>(rows.size());
  if (rank == 0) {
    std::printf("%10s %6s %3s | %10s %7s |", "bytes", "calls", "rep", "mpi us", "busbw");
    for (int w = 1; w < impls; ++w) std::printf(" %7s us %7s %5s |", rows[w], "busbw", "ratio");
    std::printf("\n");
  }
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    // Warm-up (first touch of the pages, MPI's connections and registrations), then rank 0 sizes
    // the batch: about 30 ms per sample.
    for (int w = 0; w < impls; ++w) run(w, bytes);
    long calls = 1;
    for (;;) {  // double the batch until it takes 5 ms (every rank sees the same slowest time)
      // The fastest of 3 samples: one descheduled rank must not shrink the batch to a call.
      double t = 1e30;
      for (int i = 0; i < 3; ++i) {
        t = std::min(t, sample(world, calls, [&] { run(0, bytes); }) * static_cast<double>(calls));
      }
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
    std::vector<std::vector<double>> times(rows.size()), ratio(rows.size());
    std::vector<double> t(rows.size());
    for (int r = 0; r < reps; ++r) {
      for (int k = 0; k < impls; ++k) {
        const int w = (k + r) % impls;  // rotated order
        t[static_cast<std::size_t>(w)] = sample(world, calls, [&] { run(w, bytes); });
      }
      for (std::size_t w = 0; w < rows.size(); ++w) {
        times[w].push_back(t[w]);
        ratio[w].push_back(t[0] / t[w]);
      }
    }
    if (rank == 0) {
      auto busbw = [&](double s) { return static_cast<double>(bytes) / s * factor / 1e9; };
      const double mpi = median(times[0]);
      std::printf("%10zu %6ld %3d | %10.2f %7.3f |", bytes, calls, reps, mpi * 1e6, busbw(mpi));
      for (std::size_t w = 1; w < rows.size(); ++w) {
        const double m = median(times[w]);
        std::printf(" %10.2f %7.3f %5.3f |", m * 1e6, busbw(m), median(ratio[w]));
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
}

/// The sizes of hone's exchange for small all_reduces and all_gathers on this communicator.
void print_exchange(const hd::mpi_comm& comm) {
  const auto x = comm.exchange();
  std::printf(
      "hone's exchange: all_reduce up to %zu bytes, all_gather blocks up to %zu bytes (outputs up "
      "to %zu), messages of up to %zu bytes (eager limit %zu, 0: unknown)\n",
      x.max_bytes, x.gather_block_bytes, x.max_bytes, x.message_bytes, comm.eager_limit());
}

/// allreduce_bus_bandwidth for elements of type T (float, hone::bfloat16 or hone::half), MPI's rows
/// reducing with `sum`.
template <class T>
void all_reduce_table(MPI_Comm world, int rank, int size, const args& a, hd::mpi_comm& named,
                      hd::mpi_comm& not_named, MPI_Comm raw_comm, MPI_Op sum) {
  const MPI_Datatype type = hd::detail::mpi_type<T>();
  // Zeros: the sums stay 0 (no overflow to inf, no subnormals) however many calls run in place.
  std::vector<T> buffer(a.max_bytes / sizeof(T), T(0.0f));
  if (rank == 0) {
    std::printf(
        "allreduce_bus_bandwidth: %d ranks, %s sum in place; time per call (median), "
        "algbw = bytes/time, busbw = algbw*2(n-1)/n, ratio = median over repetitions of "
        "mpi time / row time\n",
        size, hd::detail::type_name<T>());
    print_exchange(named);
  }
  auto run = [&](int which, std::size_t bytes) {
    const std::size_t n = bytes / sizeof(T);
    std::span<T> data(buffer.data(), n);
    switch (which) {
      case 0:
        MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(n), type, sum, raw_comm);
        break;
      case 1:
        named.all_reduce(data, hd::reduce_op::sum).wait();
        break;
      case 2:
        not_named.all_reduce(data, hd::reduce_op::sum).wait();
        break;
      default: {
        MPI_Request req = MPI_REQUEST_NULL;
        MPI_Iallreduce(MPI_IN_PLACE, data.data(), static_cast<int>(n), type, sum, raw_comm, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        break;
      }
    }
  };
  table(world, rank, a, 1024, a.max_bytes, {"mpi", "hone", "nowin", "mpi_nb"},
        2.0 * (size - 1) / size, run);
}

/// reduce_scatter_bus_bandwidth for elements of type T (float, hone::bfloat16 or hone::half), MPI's
/// rows reducing with `sum`.
template <class T>
void reduce_scatter_table(MPI_Comm world, int rank, int size, const args& a, hd::mpi_comm& named,
                          MPI_Comm raw_comm, MPI_Op sum) {
  const std::size_t rs_max = std::min(a.max_bytes, std::size_t{64} << 20);
  const auto ranks = static_cast<std::size_t>(size);
  const MPI_Datatype type = hd::detail::mpi_type<T>();
  // Small multiples of 1/8, exact in every type (their sums too): not zeros, which the portable
  // 16-bit conversions take on a shorter path. `in` is only read, so the sums do not grow.
  std::vector<T> in_buffer(rs_max / sizeof(T));
  for (std::size_t j = 0; j < in_buffer.size(); ++j) {
    in_buffer[j] = T(static_cast<float>(j % 13) * 0.125f);
  }
  std::vector<T> out(rs_max / sizeof(T) / ranks + 1, T(0.0f));
  if (rank == 0) {
    std::printf(
        "reduce_scatter_bus_bandwidth: %d ranks, %s sum, bytes = the input (out = bytes / "
        "ranks); time per call (median), algbw = bytes/time, busbw = algbw*(n-1)/n, ratio = "
        "median over repetitions of mpi time / row time\n",
        size, hd::detail::type_name<T>());
  }
  auto run = [&](int which, std::size_t bytes) {
    const std::size_t m = bytes / sizeof(T) / ranks;
    std::span<const T> in(in_buffer.data(), m * ranks);
    std::span<T> block(out.data(), m);
    switch (which) {
      case 0:
        MPI_Reduce_scatter_block(in.data(), block.data(), static_cast<int>(m), type, sum, raw_comm);
        break;
      case 1:
        named.reduce_scatter(in, block, hd::reduce_op::sum).wait();
        break;
      default: {
        MPI_Request req = MPI_REQUEST_NULL;
        MPI_Ireduce_scatter_block(in.data(), block.data(), static_cast<int>(m), type, sum, raw_comm,
                                  &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        break;
      }
    }
  };
  table(world, rank, a, 4096, rs_max, {"mpi", "hone", "mpi_nb"},
        static_cast<double>(size - 1) / static_cast<double>(size), run);
}

/// allgather_bus_bandwidth for elements of type T (in place).
template <class T>
void all_gather_table(MPI_Comm world, int rank, int size, const args& a, hd::mpi_comm& named,
                      MPI_Comm raw_comm) {
  const std::size_t ag_max = std::min(a.max_bytes, std::size_t{64} << 20);
  const auto ranks = static_cast<std::size_t>(size);
  const MPI_Datatype type = hd::detail::mpi_type<T>();
  std::vector<T> out(ag_max / sizeof(T), T(1.0f));
  if (rank == 0) {
    std::printf(
        "allgather_bus_bandwidth: %d ranks, %s, in place, bytes = the output (in = bytes / "
        "ranks); time per call (median), algbw = bytes/time, busbw = algbw*(n-1)/n, ratio = "
        "median over repetitions of mpi time / row time\n",
        size, hd::detail::type_name<T>());
    print_exchange(named);
  }
  auto run = [&](int which, std::size_t bytes) {
    const std::size_t m = bytes / sizeof(T) / ranks;
    std::span<T> all(out.data(), m * ranks);
    std::span<const T> mine(out.data() + m * static_cast<std::size_t>(rank), m);
    switch (which) {
      case 0:
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all.data(), static_cast<int>(m), type,
                      raw_comm);
        break;
      case 1:
        named.all_gather(mine, all).wait();
        break;
      default: {
        MPI_Request req = MPI_REQUEST_NULL;
        MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all.data(), static_cast<int>(m), type,
                       raw_comm, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        break;
      }
    }
  };
  table(world, rank, a, 1024, ag_max, {"mpi", "hone", "mpi_nb"},
        static_cast<double>(size - 1) / static_cast<double>(size), run);
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

  // The element type of both tables and, for the 16-bit floats, MPI's rows' operation (the same
  // sum as mpi_comm's own).
  MPI_Op sum16 = MPI_OP_NULL;
  if (a.type == "bf16") MPI_Op_create(&hd::detail::mpi_bf16_sum, 1, &sum16);
  if (a.type == "fp16") MPI_Op_create(&hd::detail::mpi_half_sum, 1, &sum16);
  const auto tables = [&]<class T>(MPI_Op sum) {
    if (a.all_reduce) all_reduce_table<T>(world, rank, size, a, named, not_named, raw_comm, sum);
    if (a.reduce_scatter) reduce_scatter_table<T>(world, rank, size, a, named, raw_comm, sum);
    if (a.all_gather) all_gather_table<T>(world, rank, size, a, named, raw_comm);
  };
  if (a.type == "bf16") {
    tables.template operator()<hone::bfloat16>(sum16);
  } else if (a.type == "fp16") {
    tables.template operator()<hone::half>(sum16);
  } else {
    tables.template operator()<float>(MPI_SUM);
  }
  if (sum16 != MPI_OP_NULL) MPI_Op_free(&sum16);
  MPI_Comm_free(&raw_comm);
  return 0;
}
