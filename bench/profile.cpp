// bench/profile.cpp (bench_profile): what hone's profiling zones cost (docs/benchmarks.md,
// "Profiling"). Each iteration of the zone rows is one HONE_ZONE scope around
// benchmark::DoNotOptimize(++i); times are per zone, in nanoseconds.
//
// zone/baseline            the loop with no zone
// zone/compiled_out        HONE_ZONE built with HONE_PROFILE_DISABLED (bench/profile_disabled.cpp)
// zone/disabled            recording switched off at run time (set_enabled(false))
// zone/enabled             recording on: two stamps and two 32-byte events per zone; a collector
//                          thread drains the buffers every millisecond and discards the events
//                          (the writer's cost is on that thread, not in this row)
// counter/enabled          HONE_COUNTER with recording on, drained the same way
// trace_10M_zones/perfetto 10^7 zones (nested two deep; _paced: 2 us of busy waiting in each)
//                          streamed to a Perfetto file by hone::profile::trace: counters
//                          file_bytes, dropped (events lost for want of buffer memory),
//                          max_rss_mib (the process's peak RSS after the run), buffer_limit_mib
// trace_write_1M_zones/<format>  the drain of 10^6 recorded zones into a file, timed alone
//                          (manual time): ns_per_event is the collector's and writer's cost
// trainer_step/<observer>  one hone::trainer step (fp32, AdamW, clip_grad_norm, constant lr) over
//                          a 1 Mi-parameter model whose forward_backward copies fixed gradients
//                          (bench_optim's trainer_overhead model); trainer_step_1K: the same over
//                          one tensor of 1024, a step of about a microsecond, where the observer's
//                          own cost is visible. off: no step observer (the default);
//                          phase_timer: hone::profile::phase_timer with recording off (timings
//                          only); phase_timer_recording: recording on too (a collector thread
//                          discards the zones every millisecond); phase_timer_metrics:
//                          phase_timer and, after each step, metrics_sink::log(report) (5 scalars)
//                          to a CSV and a TensorBoard file (counter stalls: times the queue was
//                          full). Counters paired_ratio and added_ns: the medians of the ratios
//                          and of the differences per step between this row's trainer and the off
//                          trainer (two identical models), each from 4 steps of one then 4 of the
//                          other in adjacent pairs, order alternating (41 pairs; 1001 for 1K), so
//                          that both halves of a pair see the same machine
// metrics/scalar           one metrics_sink::scalar call, the cost on the logging thread (the
//                          CSV and TensorBoard writers run on the sink's thread; counter stalls)
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <hone/profile.hpp>
#include <optional>
#include <thread>

#include <algorithm>
#include <cstddef>
#include <hone/core/arena.hpp>
#include <hone/core/multi_tensor.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/schedule/constant.hpp>
#include <hone/train/trainer.hpp>
#include <vector>

#include "support/fixed_grad_model.hpp"
#include "support/harness.hpp"
#include "support/optim_data.hpp"

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

// ---- trainer_step ------------------------------------------------------------------------------

// The model: bench_optim's trainer_overhead model (bench/support/fixed_grad_model.hpp).
using hone_bench::fixed_grad_model;
using hone_bench::no_batch;

/// The tensor sizes of the two models: bench_optim's 1 Mi mix, and one tensor of 1024 (a step
/// of a few microseconds, where the observer's own cost shows).
std::vector<std::size_t> model_sizes(bool tiny) {
  return tiny ? std::vector<std::size_t>{1024} : hone_bench::optim_mix(hone_bench::optim_1M);
}

template <bool Tiny, class... Observer>
struct step_bench {
  fixed_grad_model model{model_sizes(Tiny)};
  hone::trainer<fixed_grad_model, hone::fp32, hone::adamw, hone::clip_grad_norm, hone::constant_lr,
                Observer...>
      trainer{model,
              hone::fp32{},
              hone::adamw{},
              hone::clip_grad_norm{.max_norm = 1.0f},
              hone::constant_lr{.base_lr = 1e-3f},
              Observer{}...};
  void step() { benchmark::DoNotOptimize(trainer.step(no_batch{})); }
};

template <bool Tiny>
step_bench<Tiny>& off_bench() {
  static step_bench<Tiny> b;
  return b;
}
template <bool Tiny>
step_bench<Tiny, hp::phase_timer>& timer_bench() {
  static step_bench<Tiny, hp::phase_timer> b;
  return b;
}

struct paired_result {
  double ratio;     // median of t_on / t_off
  double added_ns;  // median of (t_on - t_off) per step
};

/// The medians of `pairs` ratios and differences: 4 steps of `on` against 4 steps of `off`, timed
/// back to back in alternating order.
template <class On, class Off>
paired_result paired(On&& on, Off&& off, int pairs) {
  auto seconds = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 4; ++i) f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> ratios, added;
  for (int k = 0; k < pairs; ++k) {
    double t_on = 0.0, t_off = 0.0;
    if (k % 2 == 0) {
      t_on = seconds(on);
      t_off = seconds(off);
    } else {
      t_off = seconds(off);
      t_on = seconds(on);
    }
    ratios.push_back(t_on / t_off);
    added.push_back((t_on - t_off) / 4 * 1e9);
  }
  std::sort(ratios.begin(), ratios.end());
  std::sort(added.begin(), added.end());
  return {ratios[ratios.size() / 2], added[added.size() / 2]};
}

void report(benchmark::State& state, const paired_result& r) {
  state.counters["paired_ratio"] = r.ratio;
  state.counters["added_ns"] = r.added_ns;
}

template <bool Tiny>
void trainer_step_off(benchmark::State& state) {
  auto& b = off_bench<Tiny>();
  for (auto _ : state) b.step();
}

template <bool Tiny>
void trainer_step_timer(benchmark::State& state, bool recording) {
  auto& on = timer_bench<Tiny>();
  auto& off = off_bench<Tiny>();
  std::optional<discarding_collector> drain;
  if (recording) drain.emplace();
  hp::set_enabled(recording);
  for (auto _ : state) on.step();
  report(state, paired([&] { on.step(); }, [&] { off.step(); }, Tiny ? 1001 : 41));
  hp::set_enabled(false);
  // phase_timer's own p50 of whole steps (its "step" row, the last of summary()).
  state.counters["step_p50_us"] = on.trainer.observer().summary().back().p50_ns / 1e3;
}

/// A trainer step followed by metrics_sink::log(report) (5 scalars queued for the sink's thread,
/// which writes them to a CSV file and a TensorBoard event file), against the off trainer.
template <bool Tiny>
void trainer_step_metrics(benchmark::State& state) {
  auto& on = timer_bench<Tiny>();
  auto& off = off_bench<Tiny>();
  const auto dir = std::filesystem::temp_directory_path() / "hone_bench_profile_metrics";
  std::filesystem::remove_all(dir);
  {
    hp::metrics_sink sink({.csv = dir / "m.csv", .tensorboard = dir / "tb"});
    std::int64_t step = 0;
    auto logged_step = [&] {
      const hone::step_report r = on.trainer.step(no_batch{});
      sink.log(r, step++);
    };
    for (auto _ : state) logged_step();
    report(state, paired(
                      logged_step, [&] { off.step(); }, Tiny ? 1001 : 41));
    sink.close();
    state.counters["stalls"] = static_cast<double>(sink.stalls());
  }
  std::filesystem::remove_all(dir);
}

/// metrics_sink::scalar alone: the cost on the logging thread (the writers run on the sink's).
void metrics_scalar(benchmark::State& state) {
  const auto dir = std::filesystem::temp_directory_path() / "hone_bench_profile_scalar";
  std::filesystem::remove_all(dir);
  {
    hp::metrics_sink sink({.csv = dir / "m.csv", .tensorboard = dir / "tb"});
    std::int64_t i = 0;
    for (auto _ : state) {
      sink.scalar("train/loss", i, static_cast<double>(i));
      ++i;
    }
    sink.close();
    state.counters["stalls"] = static_cast<double>(sink.stalls());
  }
  std::filesystem::remove_all(dir);
}

template <bool Tiny>
void register_trainer_rows(const char* workload) {
  hone_bench::add(workload, "off", trainer_step_off<Tiny>)->Unit(benchmark::kMicrosecond);
  hone_bench::add(workload, "phase_timer", [](benchmark::State& s) {
    trainer_step_timer<Tiny>(s, false);
  })->Unit(benchmark::kMicrosecond);
  hone_bench::add(workload, "phase_timer_recording", [](benchmark::State& s) {
    trainer_step_timer<Tiny>(s, true);
  })->Unit(benchmark::kMicrosecond);
  hone_bench::add(workload, "phase_timer_metrics", trainer_step_metrics<Tiny>)
      ->Unit(benchmark::kMicrosecond);
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
  register_trainer_rows<false>("trainer_step");
  register_trainer_rows<true>("trainer_step_1K");
  hone_bench::add("metrics", "scalar", metrics_scalar)->Unit(benchmark::kNanosecond);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
