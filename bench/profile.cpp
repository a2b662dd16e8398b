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
//                          one tensor of 1024, a step of about half a microsecond, where the
//                          observer's own cost is visible. Every trainer starts at step 10^6 (see
//                          step_bench). off: no step observer (the default), timed alone;
//                          off_vs_off: the A/A control, a second observer-less trainer built the
//                          same way paired against off (its paired_ratio and added_ns are the
//                          pairing's own bias and noise; switch_ratio: the first step after a
//                          switch between the trainers against a warm one); phase_timer:
//                          hone::profile::phase_timer with recording off (timings only);
//                          phase_timer_recording: recording on too (a collector thread discards
//                          the zones every millisecond; in the pairing it runs during the observed
//                          trainer's groups only and is parked during off's, so that its wake-ups,
//                          which take a core from the trainer's two oneTBB threads on the 2-core
//                          VM, count against recording); phase_timer_recording_50ms: the same
//                          with a drain every 50 ms (hone::profile::trace's default
//                          flush_interval; 1 Mi only); phase_timer_recording_idle and
//                          phase_timer_recording_50ms_idle: those two with the collector thread
//                          in the SCHED_IDLE class (hone::profile::trace_options::idle_collector:
//                          it then takes only a core nobody else wants); phase_timer_metrics:
//                          phase_timer and,
//                          after each step, metrics_sink::log(report) (5 scalars) to a CSV and a
//                          TensorBoard file (counter stalls: times the queue was full). Counters
//                          paired_ratio and added_ns: the medians of the ratios and of the
//                          differences per step between this row's trainer and the off trainer,
//                          in the same process, group by group: the two alternate strictly, each
//                          group 2 warm-up steps (left out) then 4 timed steps, each observed
//                          group compared with the off group before it and with the one after it
//                          (201 observed groups; 4001 for 1K). See paired() for why: the earlier
//                          pairing (4 steps, no warm-up, order alternating by pair) read 0.74 for
//                          the A/A control, because the two 1 Mi trainers (20 MiB each) do not
//                          fit the 32 MiB L3 together, so the first steps after a switch ran cold
//                          (2.5-3 times a warm step), and an odd number of pairs put the median in
//                          the half where the observed trainer ran warm and off cold. The 1K A/A
//                          control still reads 0.95-1.04 from one process to the next (constant
//                          within a process: where the two trainers' data lie), so a 1K added_ns
//                          is good to about 20 ns.
// metrics/scalar           one metrics_sink::scalar call, the cost on the logging thread (the
//                          CSV and TensorBoard writers run on the sink's thread; counter stalls)
#include <sys/resource.h>

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <hone/profile.hpp>
#include <initializer_list>
#include <mutex>
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

/// A collector thread like discarding_collector's that drains only while active: the paired
/// trainer_step_recording row switches it on for the observed trainer's groups and off (parked on a
/// condition variable, no wake-ups) for the off trainer's, so that the collector thread's cost is
/// counted against recording only. set_active(false) returns once the thread is parked. Drains
/// every `period` while active; with `idle` from a SCHED_IDLE thread.
class gated_collector {
 public:
  explicit gated_collector(std::chrono::milliseconds period = std::chrono::milliseconds(1),
                           bool idle = false)
      : period_(period), thread_([this, idle] {
          // what hone::profile::trace does with idle_collector
          if (idle && hp::detail::set_idle_class(pthread_self()) != 0) std::abort();
          hp::collector c;
          std::unique_lock lock(mutex_);
          while (!stop_) {
            if (!active_) {
              parked_ = true;
              changed_.notify_all();
              changed_.wait(lock, [this] { return active_ || stop_; });
              parked_ = false;
              continue;
            }
            lock.unlock();
            c.discard();
            lock.lock();
            changed_.wait_for(lock, period_, [this] { return !active_ || stop_; });
          }
          c.discard();
        }) {}
  gated_collector(const gated_collector&) = delete;
  gated_collector& operator=(const gated_collector&) = delete;
  ~gated_collector() {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  void set_active(bool on) {
    std::unique_lock lock(mutex_);
    active_ = on;
    changed_.notify_all();
    if (!on) changed_.wait(lock, [this] { return parked_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool active_ = false, parked_ = false, stop_ = false;
  std::chrono::milliseconds period_;
  std::thread thread_;  // last: starts once the members above exist
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
  // Every trainer starts at step 10^6 (set_steps_done), so that all of them, whatever rows ran
  // before, are past the steps where AdamW's bias corrections 1 - beta^t underflow: std::pow's
  // result turns subnormal then zero for beta1 = 0.9 after about 6,700 steps and for beta2 = 0.999
  // after about 708,000, and glibc's pow then takes its slow path (about 30-40 ns instead of 9 on
  // the 2-core VM). Trainers on either side of 708,000 steps differed by 10-30 ns per step, a few
  // percent of the 1K step, whichever arm they were in.
  step_bench() { trainer.set_steps_done(1'000'000); }
  void step() { benchmark::DoNotOptimize(trainer.step(no_batch{})); }
};

template <bool Tiny>
step_bench<Tiny>& off_bench() {
  static step_bench<Tiny> b;
  return b;
}
/// A second observer-less trainer built the same way, the peer of off_vs_off (the A/A control).
template <bool Tiny>
step_bench<Tiny>& twin_bench() {
  static step_bench<Tiny> b;
  return b;
}
template <bool Tiny>
step_bench<Tiny, hp::phase_timer>& timer_bench() {
  static step_bench<Tiny, hp::phase_timer> b;
  return b;
}

struct paired_result {
  double ratio;         // median of t_on / t_off
  double added_ns;      // median of (t_on - t_off) per step
  double switch_ratio;  // median of (first step of a group) / (a timed step of that group)
};

/// How paired() times its two arms: groups of `warm` untimed steps then `timed` timed steps.
struct pairing {
  int pairs;      // groups of the on arm (pairs + 1 of the off arm; 2 * pairs ratios)
  int warm = 2;   // steps at the start of each group left out of the comparison (see paired())
  int timed = 4;  // timed steps after them
};

/// One arm of paired(): a step through a function pointer, so that both arms are timed by the same
/// machine code (one timing loop, not one per lambda type) and differ only in the step they call.
struct arm {
  void (*run)(void*);
  void* self;
  template <class F>
  explicit arm(F& f) : run([](void* s) { (*static_cast<F*>(s))(); }), self(&f) {}
  void operator()() const { run(self); }
};

/// The medians of `p.pairs` ratios and differences between steps of `on` and steps of `off`. The
/// arms alternate strictly, group by group (off, on, off, on, ..., off), so that every group
/// follows a group of the other arm and both arms see the same cache state; each group first runs
/// `p.warm` steps left out of the comparison, which bring its arm's arenas back into the caches (on
/// the 2-core VM with a 32 MiB L3, over two 1 Mi trainers of about 20 MiB each, the first step
/// after a switch took 2.5-3 times a warm one and the second 1.3 times: switch_ratio), and then
/// times `p.timed` steps: the warm step, as in a training loop that runs one trainer. Each on group
/// is compared with the off group before it and, separately, with the one after it (2 * p.pairs
/// ratios, half with on first and half with off first, so that a drift of the machine's speed
/// cancels; not with the mean of the two, which a noise spike in either inflates, making on look
/// faster). Both arms run through one timing loop and one call site (arm).
/// What paired() calls before each group of one arm, outside the timed steps (e.g. to switch a
/// collector thread on for the observed arm only).
struct group_hooks {
  std::function<void()> before_on, before_off;
};

template <class On, class Off>
paired_result paired(On&& on_step, Off&& off_step, pairing p, const group_hooks& hooks = {}) {
  const arm on(on_step), off(off_step);
  std::vector<double> ratios, added, switches;
  auto seconds = [&](const arm& f) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    for (int i = 0; i < p.warm; ++i) {
      f();
      if (i == 0) switches.push_back(std::chrono::duration<double>(clock::now() - t0).count());
    }
    const auto t1 = clock::now();
    for (int i = 0; i < p.timed; ++i) f();
    const double t = std::chrono::duration<double>(clock::now() - t1).count();
    if (p.warm > 0) switches.back() /= t / p.timed;
    return t;
  };
  // One call site for both arms: group g runs off when g is even, on when odd.
  std::vector<double> t(2 * static_cast<std::size_t>(p.pairs) + 1);
  for (std::size_t g = 0; g < t.size(); ++g) {
    const auto& before = g % 2 == 0 ? hooks.before_off : hooks.before_on;
    if (before) before();
    t[g] = seconds(g % 2 == 0 ? off : on);
  }
  for (std::size_t g = 1; g < t.size(); g += 2) {
    for (const double t_off : {t[g - 1], t[g + 1]}) {
      ratios.push_back(t[g] / t_off);
      added.push_back((t[g] - t_off) / p.timed * 1e9);
    }
  }
  auto median = [](std::vector<double>& v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  return {median(ratios), median(added), median(switches)};
}

/// The pairing of the trainer_step rows: 201 on groups for the 1 Mi step (about 0.5 s), 4001 for
/// the 1K (402 and 8002 ratios: the median of the 1 Mi A/A control moved by 1-2% between
/// repetitions with 41 groups on the shared VM).
template <bool Tiny>
constexpr pairing step_pairing{.pairs = Tiny ? 4001 : 201};

void report(benchmark::State& state, const paired_result& r) {
  state.counters["paired_ratio"] = r.ratio;
  state.counters["added_ns"] = r.added_ns;
}

template <bool Tiny>
void trainer_step_off(benchmark::State& state) {
  auto& b = off_bench<Tiny>();
  for (auto _ : state) b.step();
}

/// The A/A control: a second observer-less trainer against the off trainer, paired as the observed
/// rows are; its paired_ratio and added_ns are the pairing's own bias and noise.
template <bool Tiny>
void trainer_step_twin(benchmark::State& state) {
  auto& twin = twin_bench<Tiny>();
  auto& off = off_bench<Tiny>();
  for (auto _ : state) twin.step();
  const paired_result r = paired([&] { twin.step(); }, [&] { off.step(); }, step_pairing<Tiny>);
  report(state, r);
  // The first step after a switch from the other trainer against a warm step (both arms).
  state.counters["switch_ratio"] = r.switch_ratio;
}

/// drain_period: how often recording's collector drains (0: recording off).
template <bool Tiny>
void trainer_step_timer(benchmark::State& state, std::chrono::milliseconds drain_period,
                        bool idle = false) {
  const bool recording = drain_period.count() > 0;
  auto& on = timer_bench<Tiny>();
  auto& off = off_bench<Tiny>();
  std::optional<gated_collector> drain;
  group_hooks hooks;
  if (recording) {
    drain.emplace(drain_period, idle);
    hooks = {[&] { drain->set_active(true); }, [&] { drain->set_active(false); }};
    drain->set_active(true);
  }
  hp::set_enabled(recording);
  for (auto _ : state) on.step();
  report(state, paired([&] { on.step(); }, [&] { off.step(); }, step_pairing<Tiny>, hooks));
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
                      logged_step, [&] { off.step(); }, step_pairing<Tiny>));
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
  hone_bench::add(workload, "off_vs_off", trainer_step_twin<Tiny>)->Unit(benchmark::kMicrosecond);
  hone_bench::add(workload, "phase_timer", [](benchmark::State& s) {
    trainer_step_timer<Tiny>(s, std::chrono::milliseconds(0));
  })->Unit(benchmark::kMicrosecond);
  hone_bench::add(workload, "phase_timer_recording", [](benchmark::State& s) {
    trainer_step_timer<Tiny>(s, std::chrono::milliseconds(1));
  })->Unit(benchmark::kMicrosecond);
  // The drain of hone::profile::trace's default flush_interval (50 ms); the 1 Mi step only: the
  // 1K step's zones of 50 ms would pass the 16 MiB buffer limit and be dropped.
  if constexpr (!Tiny) {
    hone_bench::add(workload, "phase_timer_recording_50ms", [](benchmark::State& s) {
      trainer_step_timer<Tiny>(s, std::chrono::milliseconds(50));
    })->Unit(benchmark::kMicrosecond);
    hone_bench::add(workload, "phase_timer_recording_50ms_idle", [](benchmark::State& s) {
      trainer_step_timer<Tiny>(s, std::chrono::milliseconds(50), true);
    })->Unit(benchmark::kMicrosecond);
  }
  hone_bench::add(workload, "phase_timer_recording_idle", [](benchmark::State& s) {
    trainer_step_timer<Tiny>(s, std::chrono::milliseconds(1), true);
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
