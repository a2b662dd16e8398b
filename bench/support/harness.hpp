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
//
// Serve mode (--hone_serve; bench/driver.py runs every program this way, next to the peers, and
// interleaves their repetitions): the program registers its benchmarks, then answers requests
// read from stdin, one per line, with one line of JSON on stdout, and keeps its data (the
// function-local statics) from one request to the next:
//   list         {"benchmarks": ["<workload>/<impl>", ...]}  (those registered through add,
//                add_limits or register_named)
//   run <name>   one repetition of the benchmark <workload>/<impl> (iterations calibrated to
//                --benchmark_min_time, as Google Benchmark does):
//                {"name": ..., "runs": [{"run_name", "real_time", "time_unit", "iterations",
//                 <counters>...}]}, each run shaped as an entry of Google Benchmark's JSON
//                output (a benchmark with its own Repetitions() gives several runs), or
//                {"name": ..., "error": ...}
//   quit         exits (as does the end of stdin)
// The first line it writes is {"hello": <program>, "protocol": 1, "context": {...}}. Whatever
// else the program prints to stdout goes to stderr in this mode, so stdout holds only answers.
#pragma once

#include <benchmark/benchmark.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/limit.hpp"

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

/// The names ("<workload>/<impl>") registered through this header, for serve mode's `list`.
inline std::vector<std::string>& registered_names() {
  static std::vector<std::string> names;
  return names;
}

/// benchmark::RegisterBenchmark(name, fn), with the name recorded for serve mode.
template <class Fn>
benchmark::internal::Benchmark* register_named(const std::string& name, Fn fn) {
  registered_names().push_back(name);
  return benchmark::RegisterBenchmark(name.c_str(), std::move(fn));
}

/// The suffix of every implementation name this program registers: the environment variable
/// HONE_BENCH_IMPL_SUFFIX (e.g. "_O2"), so that two builds of one program (a generic -O2 build
/// next to the -march=native one) run in one bench/driver.py session as distinct rows ("hone_O2"
/// beside "hone"; "limit_O2" is still a limit row).
inline const std::string& impl_suffix() {
  static const std::string suffix = [] {
    const char* s = std::getenv("HONE_BENCH_IMPL_SUFFIX");
    return std::string(s != nullptr ? s : "");
  }();
  return suffix;
}

/// Registers `fn` as "<workload>/<impl>", timed in wall-clock time and reported in milliseconds.
template <class Fn>
benchmark::internal::Benchmark* add(const std::string& workload, const std::string& impl, Fn fn) {
  return register_named(workload + "/" + impl + impl_suffix(), std::move(fn))
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

/// Registers the limit of `workload`, one row per streaming kernel of `kernels` ("limit",
/// "limit_nt", "limit_arena"; bench/report.py takes the best row as the workload's limit).
/// `pass(kernel)` runs one pass with that kernel and returns the bytes it moved; it runs once
/// untimed before the timing loop (the arena kernel allocates on its first pass).
template <class Pass>
void add_limits(const std::string& workload, Pass pass,
                std::vector<stream_kernel> kernels = {stream_kernels.begin(),
                                                      stream_kernels.end()}) {
  for (const stream_kernel k : kernels) {
    add(workload, limit_impl(k), [pass, k](benchmark::State& state) {
      std::size_t bytes = pass(k);  // warm-up
      for (auto _ : state) {
        bytes = pass(k);
        benchmark::ClobberMemory();
      }
      report_bytes(state, bytes);
      report_threads(state);
    });
  }
}

namespace detail {
/// `text` as a JSON string literal.
inline std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

/// `v` as a JSON number (null when not finite).
inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

inline const char* unit_name(benchmark::TimeUnit u) {
  switch (u) {
    case benchmark::kNanosecond:
      return "ns";
    case benchmark::kMicrosecond:
      return "us";
    case benchmark::kMillisecond:
      return "ms";
    case benchmark::kSecond:
      return "s";
  }
  return "ns";
}

/// Keeps the runs Google Benchmark reports (serve mode's display reporter; prints nothing).
class capture_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type == Run::RT_Iteration) runs_.push_back(r);
    }
  }
  std::vector<Run> take() { return std::exchange(runs_, {}); }

 private:
  std::vector<Run> runs_;
};

/// One run as an entry of Google Benchmark's JSON output (the fields bench/report.py reads).
inline std::string run_json(const benchmark::BenchmarkReporter::Run& r) {
  std::string out =
      "{\"name\": " + json_string(r.benchmark_name()) +
      ", \"run_name\": " + json_string(r.run_name.str()) +
      ", \"run_type\": \"iteration\", \"repetition_index\": " + std::to_string(r.repetition_index) +
      ", \"iterations\": " + std::to_string(r.iterations) +
      ", \"real_time\": " + json_number(r.GetAdjustedRealTime()) +
      ", \"cpu_time\": " + json_number(r.GetAdjustedCPUTime()) + ", \"time_unit\": \"" +
      unit_name(r.time_unit) + "\"";
  if (r.error_occurred) {
    out += ", \"error_occurred\": true, \"error_message\": " + json_string(r.error_message);
  }
  for (const auto& [key, counter] : r.counters) {
    out += ", " + json_string(key) + ": " + json_number(counter.value);
  }
  return out + "}";
}

/// The regex that selects exactly the benchmark "<workload>/<impl>" (Google Benchmark appends
/// "/real_time" and the like to the registered name).
inline std::string exact_filter(std::string_view name) {
  std::string out = "^";
  for (const char c : name) {
    if (std::string_view(".[]{}()*+?^$|\\").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out + "(/|$)";
}

inline std::map<std::string, std::string>& context() {
  static std::map<std::string, std::string> c;
  return c;
}

inline void add_context(const std::string& key, const std::string& value) {
  benchmark::AddCustomContext(key, value);
  context()[key] = value;
}

/// Serve mode's request loop (see the top of this file); `out` is the saved stdout.
inline int serve(const char* program, std::FILE* out) {
  auto reply = [out](const std::string& line) {
    std::fputs(line.c_str(), out);
    std::fputc('\n', out);
    std::fflush(out);
  };
  std::string hello = "{\"hello\": " + json_string(program) + ", \"protocol\": 1, \"context\": {";
  bool first = true;
  for (const auto& [key, value] : context()) {
    hello += (first ? "" : ", ") + json_string(key) + ": " + json_string(value);
    first = false;
  }
  reply(hello + "}}");
  capture_reporter reporter;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "quit") break;
    if (line == "list") {
      std::string names = "{\"benchmarks\": [";
      for (std::size_t i = 0; i < registered_names().size(); ++i) {
        names += (i ? ", " : "") + json_string(registered_names()[i]);
      }
      reply(names + "]}");
    } else if (line.starts_with("run ")) {
      const std::string name = line.substr(4);
      const std::size_t matched = benchmark::RunSpecifiedBenchmarks(&reporter, exact_filter(name));
      const auto runs = reporter.take();
      if (matched == 0 || runs.empty()) {
        reply("{\"name\": " + json_string(name) + ", \"error\": \"no benchmark named " + name +
              " (see list)\"}");
        continue;
      }
      std::string answer = "{\"name\": " + json_string(name) + ", \"runs\": [";
      for (std::size_t i = 0; i < runs.size(); ++i) answer += (i ? ", " : "") + run_json(runs[i]);
      reply(answer + "]}");
    } else if (!line.empty()) {
      reply("{\"error\": " + json_string("unknown request '" + line + "' (list, run NAME, quit)") +
            "}");
    }
  }
  return 0;
}
}  // namespace detail

/// The main() of a hone benchmark program. `prepare` runs after the flags are parsed and before
/// the benchmarks (register them there); it returns false to skip the whole program (exit 0).
inline int main(int argc, char** argv, const std::vector<workload_mix>& mixes,
                const std::function<bool()>& prepare) {
  benchmark::Initialize(&argc, argv);
  std::unique_ptr<tbb::global_control> threads;
  bool serve = false;
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
    } else if (arg == "--hone_serve") {
      serve = true;
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
  detail::add_context("hone_threads", std::to_string(thread_count()));
#if defined(__clang__)
  detail::add_context("hone_compiler", "clang " __clang_version__);
#elif defined(__GNUC__)
  detail::add_context("hone_compiler", "gcc " __VERSION__);
#endif
  std::FILE* answers = nullptr;
  if (serve) {  // stdout carries the answers only: anything else printed goes to stderr
    std::fflush(stdout);
    std::cout.flush();
    const int fd = ::dup(STDOUT_FILENO);
    if (fd < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0 ||
        (answers = ::fdopen(fd, "w")) == nullptr) {
      std::fprintf(stderr, "%s: --hone_serve could not set up its output\n", argv[0]);
      return 1;
    }
  }
  const bool run = prepare();
  int status = 0;
  if (serve) {
    if (!run) registered_names().clear();  // a skipped program serves no benchmark
    status = detail::serve(argv[0], answers);
    std::fclose(answers);
  } else if (run) {
    benchmark::RunSpecifiedBenchmarks();
  }
  benchmark::Shutdown();
  return status;
}

}  // namespace hone_bench
