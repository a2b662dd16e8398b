// bench/profile_gpu.cpp (bench_profile_gpu): what hone's device zones (hone/profile/cuda/zone.hpp)
// cost on the host, and how fast a trace drains them. Host C++ on the CUDA runtime (no kernels);
// without a CUDA device it prints a skip message and exits 0.
//
// cuda_zone/<row>: the host time to enqueue a tiny stream operation (cudaMemsetAsync of 4 bytes
// on a non-blocking stream) with or without a device zone around it. One iteration is 128 of
// them, timed with steady_clock around the enqueueing alone (manual time, in microseconds per
// iteration); the stream is then synchronized outside the timed part, so its queue stays short.
// Counter ns_per_zone: the time per operation (per zone); the difference to baseline is the
// zone's cost.
//   baseline          the cudaMemsetAsync alone
//   disabled          HONE_CUDA_ZONE around it, recording switched off at run time (one relaxed
//                     load, no event)
//   enabled           recording on: two cudaEventRecord per zone, events from the zones' pool; a
//                     hone::profile::trace with no file drains every millisecond on its own
//                     thread and discards (its event reads are on that thread; the zones wait
//                     for the pool's lock while it holds it)
//   enabled_host_zone HONE_ZONE and HONE_CUDA_ZONE together (the documented pattern: host time
//                     and device time of one piece of work), recording on as above
//   Counters of the enabled rows: events_created (the pool's events at the end: none are created
//   in steady state) and dropped (events lost, host and device).
// The NVTX range has no row: device zones record no NVTX range (host zones do, in programs built
// with HONE_PROFILE_NVTX; bench_profile's zone rows give the host zone's cost).
//
// cuda_zone_drain_256/<sink>: trace::flush(true) draining 256 completed device zones (each around
// a cudaMemsetAsync of 4 bytes): every event read back (cudaEventSynchronize, already complete,
// then cudaEventElapsedTime from the calibration event), placed on the host time base, handed to
// the sinks, and given back to the pool; once every 100 ms the drain also recalibrates the device
// (a few event round trips), as in a trace. The warm-up records the 256 zones behind a host
// function (cudaLaunchHostFunc) that holds the stream (empty zones: 512 event records wait in its
// queue), so none completes and the pool grows to 512 free events; then every iteration opens a new
// trace (flush_interval 0: no background drain), records the 256 zones (the pool has the events, so
// none is read before the flush: the row checks that all 512 are pending), synchronizes the stream,
// and times the flush alone (manual time, in microseconds per iteration; 200 iterations, since
// the untimed part of each is several times the flush). Counters zones_per_s and ns_per_zone (per
// device zone, two events), file_bytes.
//   statistics   no file: the per-zone statistics only (trace::summary's "(device)" rows)
//   perfetto     a Perfetto file in the temp directory
//   chrome_json  a Chrome JSON file in the temp directory
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <hone/core/space.hpp>
#include <hone/profile.hpp>
#include <hone/profile/cuda/zone.hpp>
#include <string>
#include <thread>

#include "support/gpu_host.hpp"
#include "support/harness.hpp"

namespace {

namespace hp = hone::profile;
using clock_type = std::chrono::steady_clock;

constexpr int zones_per_iter = 128;  // zones enqueued per timed iteration (cuda_zone rows)
// Zones per drain (cuda_zone_drain rows): the warm-up holds the stream while it records them, so
// their 2 x 256 event records and 256 memsets must fit in the stream's queue.
constexpr std::uint64_t drain_zones = 256;
constexpr std::uint64_t drain_events = 2 * drain_zones;

/// A non-blocking stream for one run.
struct stream_holder {
  cudaStream_t s = nullptr;
  stream_holder() { HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~stream_holder() { (void)cudaStreamDestroy(s); }
  stream_holder(const stream_holder&) = delete;
  stream_holder& operator=(const stream_holder&) = delete;
};

/// Holds a stream at a host function until open() (or destruction, so that an exception cannot
/// leave the stream blocked): the zones recorded behind it cannot complete meanwhile.
class stream_gate {
 public:
  /// How long the host function waits at most: if the stream's queue fills before open() (the
  /// host then blocks in a CUDA call until the stream moves on), the gate opens by itself instead
  /// of deadlocking, and timed_out() says so.
  static constexpr std::chrono::seconds limit{2};

  explicit stream_gate(cudaStream_t s) : stream_(s) {
    HONE_CUDA_CHECK(cudaLaunchHostFunc(s, &stream_gate::wait, &state_));
  }
  /// Opens the gate and waits for the stream, so that the host function is done with state_.
  ~stream_gate() {
    open();
    (void)cudaStreamSynchronize(stream_);
  }
  stream_gate(const stream_gate&) = delete;
  stream_gate& operator=(const stream_gate&) = delete;
  void open() noexcept { state_.open.store(true, std::memory_order_release); }
  /// Whether the host function gave up waiting (valid once the stream has passed it).
  [[nodiscard]] bool timed_out() const noexcept {
    return state_.timed_out.load(std::memory_order_acquire);
  }

 private:
  struct shared {
    std::atomic<bool> open{false};
    std::atomic<bool> timed_out{false};
  };
  // Runs on the CUDA runtime's callback thread (no CUDA call allowed there).
  static void CUDART_CB wait(void* p) {
    auto* st = static_cast<shared*>(p);
    const auto until = clock_type::now() + limit;
    while (!st->open.load(std::memory_order_acquire)) {
      if (clock_type::now() > until) {
        st->timed_out.store(true, std::memory_order_release);
        return;
      }
      std::this_thread::yield();
    }
  }
  cudaStream_t stream_ = nullptr;
  shared state_;
};

/// Runs `body(state)`, turning an exception (a CUDA error) into the row's error message instead
/// of ending the program.
template <class Body>
void guarded(benchmark::State& state, Body&& body) {
  try {
    body(state);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

/// The device memory the memsets write (4 bytes).
void* target() {
  static hone::buffer<std::uint32_t, hone::cuda_space> b(1);
  return b.data();
}

/// Times `zones_per_iter` calls of `op(stream)` per iteration, enqueueing only (see the top).
template <class Op>
void time_enqueue(benchmark::State& state, cudaStream_t s, Op&& op) {
  for (int i = 0; i < zones_per_iter; ++i) op(s);  // warm-up: the pool grown, the device calibrated
  HONE_CUDA_CHECK(cudaStreamSynchronize(s));
  double seconds = 0.0;
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    for (int i = 0; i < zones_per_iter; ++i) op(s);
    const double t = std::chrono::duration<double>(clock_type::now() - t0).count();
    HONE_CUDA_CHECK(cudaStreamSynchronize(s));
    state.SetIterationTime(t);
    seconds += t;
  }
  state.counters["zones_per_iter"] = zones_per_iter;
  state.counters["ns_per_zone"] =
      seconds * 1e9 / (static_cast<double>(state.iterations()) * zones_per_iter);
}

void memset4(cudaStream_t s) {
  HONE_CUDA_CHECK(cudaMemsetAsync(target(), 0, 4, s));
}

void zone_baseline(benchmark::State& state) {
  const stream_holder stream;
  time_enqueue(state, stream.s, memset4);
}

void zone_disabled(benchmark::State& state) {
  const stream_holder stream;
  hp::set_enabled(false);
  time_enqueue(state, stream.s, [](cudaStream_t s) {
    HONE_CUDA_ZONE(s, "zone");
    memset4(s);
  });
}

void report_pool(benchmark::State& state, hp::trace& tr) {
  const hp::cuda_event_pool_stats st = hp::cuda_zone_pool_stats();
  state.counters["events_created"] = static_cast<double>(st.events_created);
  state.counters["dropped"] = static_cast<double>(tr.dropped_events());  // host and device
}

void zone_enabled(benchmark::State& state, bool with_host_zone) {
  const stream_holder stream;
  int dev = 0;
  HONE_CUDA_CHECK(cudaGetDevice(&dev));
  (void)hp::prepare_cuda_zones(dev);
  hp::trace tr({.flush_interval = std::chrono::milliseconds(1)});  // no file: discards
  if (with_host_zone) {
    time_enqueue(state, stream.s, [](cudaStream_t s) {
      HONE_ZONE("zone");
      HONE_CUDA_ZONE(s, "zone");
      memset4(s);
    });
  } else {
    time_enqueue(state, stream.s, [](cudaStream_t s) {
      HONE_CUDA_ZONE(s, "zone");
      memset4(s);
    });
  }
  tr.close();
  report_pool(state, tr);
}

enum class sink { statistics, perfetto, chrome_json };

void zone_drain(benchmark::State& state, sink k) {
  const stream_holder stream;
  int dev = 0;
  HONE_CUDA_CHECK(cudaGetDevice(&dev));
  (void)hp::prepare_cuda_zones(dev);
  const auto path =
      std::filesystem::temp_directory_path() /
      (k == sink::perfetto ? "hone_bench_profile_gpu.pftrace" : "hone_bench_profile_gpu.json");
  const auto record = [&](bool work) {
    for (std::uint64_t i = 0; i < drain_zones; ++i) {
      HONE_CUDA_ZONE(stream.s, "zone");
      if (work) memset4(stream.s);
    }
  };
  // Warm-up: the pool grown to 2 x drain_zones events while the stream is held (no zone
  // completes, so the pool cannot reuse the events of earlier zones), then drained. Empty zones:
  // only their 512 event records wait in the stream's queue behind the gate.
  {
    hp::trace tr({.flush_interval = std::chrono::milliseconds(0)});
    {
      stream_gate gate(stream.s);
      record(false);
      gate.open();
      HONE_CUDA_CHECK(cudaStreamSynchronize(stream.s));
      if (gate.timed_out()) {
        state.SkipWithError(
            "the stream's queue filled before the warm-up's zones were recorded (the gate "
            "opened by itself); lower drain_zones in bench/profile_gpu.cpp");
        return;
      }
    }
    tr.close();
  }
  double seconds = 0.0;
  std::uint64_t count = 0, dropped = 0, bytes = 0, pending = 0;
  for (auto _ : state) {
    hp::trace_options opt{.flush_interval = std::chrono::milliseconds(0)};
    if (k == sink::perfetto) opt.perfetto = path;
    if (k == sink::chrome_json) opt.chrome_json = path;
    hp::trace tr(opt);
    record(true);  // the pool has the events: none of these zones' events is read before the flush
    HONE_CUDA_CHECK(cudaStreamSynchronize(stream.s));
    pending = hp::cuda_zone_pool_stats().marks_pending;
    const auto t0 = clock_type::now();
    tr.flush(/*wait_device=*/true);
    const double t = std::chrono::duration<double>(clock_type::now() - t0).count();
    state.SetIterationTime(t);
    seconds += t;
    tr.close();
    count = 0;
    for (const auto& r : tr.summary())
      if (r.name == "zone (device)") count = r.count;
    dropped = tr.dropped_events();
    if (k != sink::statistics) bytes = std::filesystem::file_size(path);
    if (pending != drain_events || count != drain_zones || dropped != 0) break;
  }
  if (k != sink::statistics) std::filesystem::remove(path);
  if (pending != drain_events || count != drain_zones || dropped != 0) {
    const std::string why = std::to_string(pending) + " of " + std::to_string(drain_events) +
                            " events were pending at the flush, the trace saw " +
                            std::to_string(count) + " of " + std::to_string(drain_zones) +
                            " device zones, " + std::to_string(dropped) +
                            " events were dropped; all pending and none dropped was expected";
    state.SkipWithError(why.c_str());
    return;
  }
  const double zones = static_cast<double>(state.iterations() * drain_zones);
  state.counters["zones_per_iter"] = static_cast<double>(drain_zones);
  state.counters["zones_per_s"] = zones / seconds;
  state.counters["ns_per_zone"] = seconds * 1e9 / zones;
  state.counters["file_bytes"] = static_cast<double>(bytes);
  state.counters["events_created"] = static_cast<double>(hp::cuda_zone_pool_stats().events_created);
}

/// Registers "<workload>/<impl>" timed by the row itself (manual time).
template <class Fn>
benchmark::internal::Benchmark* add_manual(const std::string& workload, const std::string& impl,
                                           Fn fn) {
  return hone_bench::register_named(workload + "/" + impl + hone_bench::impl_suffix(),
                                    [fn](benchmark::State& s) { guarded(s, fn); })
      ->UseManualTime();
}

bool register_benchmarks() {
  if (!hone_bench::device_present("bench_profile_gpu")) return false;
  add_manual("cuda_zone", "baseline", zone_baseline)->Unit(benchmark::kMicrosecond);
  add_manual("cuda_zone", "disabled", zone_disabled)->Unit(benchmark::kMicrosecond);
  add_manual("cuda_zone", "enabled", [](benchmark::State& s) {
    zone_enabled(s, false);
  })->Unit(benchmark::kMicrosecond);
  add_manual("cuda_zone", "enabled_host_zone", [](benchmark::State& s) {
    zone_enabled(s, true);
  })->Unit(benchmark::kMicrosecond);
  add_manual("cuda_zone_drain_256", "statistics",
             [](benchmark::State& s) { zone_drain(s, sink::statistics); })
      ->Unit(benchmark::kMicrosecond)
      ->Iterations(200);
  add_manual("cuda_zone_drain_256", "perfetto",
             [](benchmark::State& s) { zone_drain(s, sink::perfetto); })
      ->Unit(benchmark::kMicrosecond)
      ->Iterations(200);
  add_manual("cuda_zone_drain_256", "chrome_json",
             [](benchmark::State& s) { zone_drain(s, sink::chrome_json); })
      ->Unit(benchmark::kMicrosecond)
      ->Iterations(200);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
