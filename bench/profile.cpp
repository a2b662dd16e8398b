// bench/profile.cpp (bench_profile): what hone's profiling zones cost (docs/benchmarks.md,
// "Profiling"). Each iteration of the zone rows is one HONE_ZONE scope around
// benchmark::DoNotOptimize(++i); times are per zone, in nanoseconds.
//
// zone/baseline            the loop with no zone
// zone/compiled_out        HONE_ZONE compiled with HONE_PROFILE_DISABLED
// (bench/profile_disabled.cpp) zone/disabled            recording switched off at run time
// (set_enabled(false)) zone/enabled             recording on: two stamps and two 32-byte events per
// zone; a
//                          collector thread drains the buffers every millisecond and discards
//                          the events (the writer's cost is on that thread, not in this row)
// counter/enabled          HONE_COUNTER with recording on, drained the same way
// trace_10M_zones/perfetto 10^7 zones (nested two deep; _paced: 512 dependent multiply-adds inside
// each)
//                          streamed to a Perfetto file by
//                          hone::profile::trace: counters file_bytes, dropped (events lost for
//                          want of buffer memory), max_rss_mib (the process's peak RSS after the
//                          run), buffer_limit_mib
// trace_write_1M_zones/<format>  the drain of 10^6 recorded zones into a file, timed alone
//                          (manual time): ns_per_event is the collector's and writer's cost
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <hone/profile.hpp>
#include <thread>

#include "support/harness.hpp"

namespace hone_bench_profile {
void zone_loop_compiled_out(benchmark::State& state);
}

namespace {

namespace hp = hone::profile;

/// A collector on its own thread that drains and discards every millisecond while it lives.
class discarding_collector {
 public:
  discarding_collector()
      : thread_([this] {
          hp::collector c;
          while (!stop_.load()) {
            c.discard();
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          c.discard();
        }) {}
  ~discarding_collector() {
    stop_.store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void zone_baseline(benchmark::State& state) {
  std::uint64_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(++i);
}

void zone_disabled(benchmark::State& state) {
  hp::set_enabled(false);
  std::uint64_t i = 0;
  for (auto _ : state) {
    HONE_ZONE("zone");
    benchmark::DoNotOptimize(++i);
  }
}

void zone_enabled(benchmark::State& state) {
  const discarding_collector drain;
  hp::set_enabled(true);
  std::uint64_t i = 0;
  for (auto _ : state) {
    HONE_ZONE("zone");
    benchmark::DoNotOptimize(++i);
  }
  hp::set_enabled(false);
  state.counters["tsc"] = hp::clock_calibration::tsc() ? 1 : 0;
}

void counter_enabled(benchmark::State& state) {
  const discarding_collector drain;
  hp::set_enabled(true);
  std::uint64_t i = 0;
  for (auto _ : state) {
    HONE_COUNTER("counter", ++i);
  }
  hp::set_enabled(false);
}

/// Busy-waits `ns` nanoseconds (paced rows: work inside each zone, at a known rate).
inline void spin(int ns) {
  if (ns == 0) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  while (std::chrono::steady_clock::now() < until) {
  }
}

void trace_10m_zones(benchmark::State& state, int work_ns) {
  const auto path = std::filesystem::temp_directory_path() / "hone_bench_profile.pftrace";
  std::uint64_t bytes = 0, dropped = 0;
  for (auto _ : state) {
    hp::trace tr({.perfetto = path, .flush_interval = std::chrono::milliseconds(2)});
    for (int outer = 0; outer < 5'000'000; ++outer) {
      HONE_ZONE("outer");
      HONE_ZONE("inner");
      spin(work_ns);
    }
    tr.close();
    dropped = tr.dropped_events();
    bytes = std::filesystem::file_size(path);
  }
  std::filesystem::remove(path);
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  state.counters["file_bytes"] = static_cast<double>(bytes);
  state.counters["dropped"] = static_cast<double>(dropped);
  state.counters["max_rss_mib"] = static_cast<double>(ru.ru_maxrss) / 1024.0;
  state.counters["buffer_limit_mib"] = static_cast<double>(hp::buffer_limit()) / (1 << 20);
}

/// The writer's side: 10^6 zones recorded (buffers raised to hold them all), then one drain into
/// a file, timed alone: the collector's and the writer's cost per event, which bounds the rate a
/// trace can stream without dropping.
void trace_write(benchmark::State& state, bool perfetto) {
  const auto path = std::filesystem::temp_directory_path() /
                    (perfetto ? "hone_bench_profile_w.pftrace" : "hone_bench_profile_w.json");
  const std::size_t old_limit = hp::buffer_limit();
  hp::set_buffer_limit(std::size_t{96} << 20);
  std::uint64_t bytes = 0;
  for (auto _ : state) {
    hp::trace_options opt{.flush_interval = std::chrono::milliseconds(0)};
    (perfetto ? opt.perfetto : opt.chrome_json) = path;
    hp::trace tr(opt);
    for (int z = 0; z < 1'000'000; ++z) {
      HONE_ZONE("zone");
    }
    const auto t0 = std::chrono::steady_clock::now();
    tr.close();
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (tr.dropped_events() != 0) state.SkipWithError("events were dropped");
    bytes = std::filesystem::file_size(path);
  }
  std::filesystem::remove(path);
  hp::set_buffer_limit(old_limit);
  state.counters["file_bytes"] = static_cast<double>(bytes);
  state.counters["ns_per_event"] = benchmark::Counter(
      2e6, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

bool register_benchmarks() {
  for (auto* b :
       {hone_bench::add("zone", "baseline", zone_baseline),
        hone_bench::add("zone", "compiled_out", hone_bench_profile::zone_loop_compiled_out),
        hone_bench::add("zone", "disabled", zone_disabled),
        hone_bench::add("zone", "enabled", zone_enabled),
        hone_bench::add("counter", "enabled", counter_enabled)}) {
    b->Unit(benchmark::kNanosecond);
  }
  hone_bench::add("trace_10M_zones", "perfetto", [](benchmark::State& s) {
    trace_10m_zones(s, 0);
  })->Iterations(1);
  // The same with 2 us of busy waiting in each inner zone: 2 * 10^7 events at the rate the
  // collector sustains, or below.
  hone_bench::add("trace_10M_zones", "perfetto_paced", [](benchmark::State& s) {
    trace_10m_zones(s, 2000);
  })->Iterations(1);
  hone_bench::register_named("trace_write_1M_zones/perfetto",
                             [](benchmark::State& s) { trace_write(s, true); })
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  hone_bench::register_named("trace_write_1M_zones/chrome_json",
                             [](benchmark::State& s) { trace_write(s, false); })
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
