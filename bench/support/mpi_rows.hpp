// bench/support/mpi_rows.hpp: what the benchmarks run under mpirun share (mpi_bench_zero,
// mpi_bench_ddp_overlap): the median, one sample of the slowest rank's seconds per call (a
// barrier, the timed calls, an MPI_MAX of the time), rows interleaved repetition by repetition
// with their order rotated, and samples as a JSON list of milliseconds (mpi_bench_ddp too).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace hone_bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  if (n == 0) return 0.0;
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Seconds per call of `calls` calls of f(), the slowest rank's: a barrier of `comm`, the calls,
/// then the maximum over MPI_COMM_WORLD.
template <class Comm, class F>
double slowest_seconds_per_call(Comm& comm, int calls, F&& f) {
  comm.barrier().wait();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) f();
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
               static_cast<double>(calls);
  MPI_Allreduce(MPI_IN_PLACE, &sec, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return sec;
}

/// `repetitions` samples of every row, each repetition running the rows once in an order rotated
/// by one (repetition r starts with row (r + rotate) mod N): result[row][repetition].
template <std::size_t N>
std::array<std::vector<double>, N> interleaved(int repetitions,
                                               const std::array<std::function<double()>, N>& rows,
                                               int rotate = 0) {
  std::array<std::vector<double>, N> out;
  for (int r = 0; r < repetitions; ++r) {
    for (std::size_t k = 0; k < N; ++k) {
      const std::size_t row = (k + static_cast<std::size_t>(r + rotate)) % N;
      if (out[row].size() < static_cast<std::size_t>(r + 1)) out[row].resize(r + 1);
      out[row][static_cast<std::size_t>(r)] = rows[row]();
    }
  }
  return out;
}

/// Samples in seconds as a JSON list of milliseconds ("[1.5, 2.25]", six significant digits).
inline std::string json_ms_list(const std::vector<double>& seconds) {
  std::string s = "[";
  char buf[32];
  for (std::size_t i = 0; i < seconds.size(); ++i) {
    std::snprintf(buf, sizeof(buf), "%s%.6g", i ? ", " : "", seconds[i] * 1e3);
    s += buf;
  }
  return s + "]";
}

}  // namespace hone_bench
