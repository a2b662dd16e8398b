// bench/support/harness.hpp: what every hone benchmark program shares.
//
// Naming: a benchmark is registered as "<workload>/<impl>", impl being "hone", "limit" or a
// variant ("hone_grain16K"); bench/report.py splits the name at the last '/' (after dropping
// Google Benchmark's own suffixes such as "/real_time"), so new workloads need no converter change.
//
// Counters: `bytes_per_iter` (bytes one iteration moves), `threads` (oneTBB threads), and Google
// Benchmark's bytes_per_second, so the console table shows the bandwidth and results.json gets
// GB/s = bytes_per_iter / time.
//
// Program flags (besides --benchmark_*): --hone_threads=N limits oneTBB to N threads (default:
// all); --hone_print_sizes=<workload> prints the tensor sizes of a workload, one per line, and
// exits (the peer scripts read them to run the very same tensors); --hone_list_workloads;
// --hone_print_data=<workload> writes the raw little-endian bytes of a workload that has data
// (the trained tensors of the compression benchmarks) to stdout, so a peer compresses the very
// same bytes; --hone_list_data names those workloads.
#pragma once

#include <benchmark/benchmark.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hone_bench {

/// oneTBB threads a parallel loop of this program may use (the --hone_threads limit applies).
inline std::size_t thread_count() {
  const std::size_t arena = static_cast<std::size_t>(tbb::this_task_arena::max_concurrency());
  const std::size_t limit =
      tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
  return arena < limit ? arena : limit;
}

/// Records the bytes an iteration moves; call after the timing loop.
inline void report_bytes(benchmark::State& state, std::size_t bytes_per_iter) {
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes_per_iter) *
                          static_cast<std::int64_t>(state.iterations()));
  state.counters["bytes_per_iter"] = static_cast<double>(bytes_per_iter);
}

/// Records the number of oneTBB threads the benchmark ran on.
inline void report_threads(benchmark::State& state) {
  state.counters["threads"] = static_cast<double>(thread_count());
}

/// A named tensor-size mix (for --hone_print_sizes), and optionally its data (for
/// --hone_print_data).
struct workload_mix {
  std::string name;
  std::function<std::vector<std::size_t>()> sizes;
  std::function<std::vector<std::byte>()> data = {};
};

/// Registers `fn` as "<workload>/<impl>", timed in wall-clock time and reported in milliseconds.
template <class Fn>
benchmark::internal::Benchmark* add(const std::string& workload, const std::string& impl, Fn fn) {
  return benchmark::RegisterBenchmark((workload + "/" + impl).c_str(), std::move(fn))
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

/// The main() of a hone benchmark program. `prepare` runs after the flags are parsed and before
/// the benchmarks (register them there); it returns false to skip the whole program (exit 0).
inline int main(int argc, char** argv, const std::vector<workload_mix>& mixes,
                const std::function<bool()>& prepare) {
  benchmark::Initialize(&argc, argv);
  std::unique_ptr<tbb::global_control> threads;
  int rest = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--hone_threads=")) {
      const long n = std::strtol(argv[i] + 15, nullptr, 10);
      if (n <= 0) {
        std::fprintf(stderr, "%s: --hone_threads needs a positive number\n", argv[0]);
        return 2;
      }
      threads = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                      static_cast<std::size_t>(n));
    } else if (arg.starts_with("--hone_print_sizes=")) {
      const std::string_view name = arg.substr(19);
      for (const auto& m : mixes) {
        if (m.name == name) {
          for (std::size_t n : m.sizes()) std::printf("%zu\n", n);
          return 0;
        }
      }
      std::fprintf(stderr, "%s: no workload named '%.*s' (see --hone_list_workloads)\n", argv[0],
                   static_cast<int>(name.size()), name.data());
      return 2;
    } else if (arg.starts_with("--hone_print_data=")) {
      const std::string_view name = arg.substr(18);
      for (const auto& m : mixes) {
        if (m.name == name && m.data) {
          const std::vector<std::byte> bytes = m.data();
          if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size() ||
              std::fflush(stdout) != 0) {
            std::fprintf(stderr, "%s: writing the data of '%.*s' to stdout failed\n", argv[0],
                         static_cast<int>(name.size()), name.data());
            return 1;
          }
          return 0;
        }
      }
      std::fprintf(stderr, "%s: no workload with data named '%.*s' (see --hone_list_data)\n",
                   argv[0], static_cast<int>(name.size()), name.data());
      return 2;
    } else if (arg == "--hone_list_workloads" || arg == "--hone_list_data") {
      for (const auto& m : mixes) {
        if (arg == "--hone_list_workloads" || m.data) std::printf("%s\n", m.name.c_str());
      }
      return 0;
    } else {
      argv[rest++] = argv[i];
    }
  }
  argc = rest;
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::AddCustomContext("hone_threads", std::to_string(thread_count()));
#if defined(__clang__)
  benchmark::AddCustomContext("hone_compiler", "clang " __clang_version__);
#elif defined(__GNUC__)
  benchmark::AddCustomContext("hone_compiler", "gcc " __VERSION__);
#endif
  if (!prepare()) return 0;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace hone_bench
