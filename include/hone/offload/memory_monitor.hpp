// hone/offload/memory_monitor.hpp: host RSS and device memory sampled in the background.
//
// A memory_monitor owns one std::thread that samples every `interval`: the resident set size of
// this process (from /proc/self/statm) and, in builds with the CUDA runtime, the memory in use on
// the CUDA device current where the monitor was built, or options.cuda_device (cudaMemGetInfo).
// Thresholds call user callbacks once per crossing: `on_above` when the value reaches `bytes` (then
// the threshold is disarmed) and `on_below` when it falls under `bytes - hysteresis` again (then it
// is re-armed), so a value hovering around the level does not fire on every sample. Peaks are
// tracked. The destructor stops the thread.
//
//   hone::offload::memory_monitor mon({.interval = std::chrono::milliseconds(50)});
//   mon.add_threshold({.what = hone::offload::memory_source::host_rss, .bytes = 48ull << 30,
//                      .on_above = [&](const auto&) { cache.clear(); }});
//
// Callbacks run on the monitor thread, one at a time (on the caller's thread for sample_now());
// they must not throw (an exception escaping the monitor thread ends the program), nor call stop()
// or add_threshold.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

#if defined(__unix__)
#include <unistd.h>
#endif

#if HONE_HAS_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#endif

HONE_NAMESPACE_BEGIN
namespace offload {

/// Resident set size of this process in bytes (second field of /proc/self/statm times the page
/// size); 0 where /proc is not available.
inline std::size_t host_rss_bytes() noexcept {
#if defined(__linux__)
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  if (n != 2) return 0;
  const long page = sysconf(_SC_PAGESIZE);
  return static_cast<std::size_t>(resident) * static_cast<std::size_t>(page > 0 ? page : 4096);
#else
  return 0;
#endif
}

/// One sample. Device fields are 0 without the CUDA runtime or without a device.
struct memory_sample {
  std::size_t host_rss = 0;
  std::size_t device_used = 0;
  std::size_t device_total = 0;
};

/// Device memory in use and total on CUDA device `device` (cudaMemGetInfo; -1: the calling
/// thread's current device); zeros without CUDA. The calling thread's current device is left as
/// it was.
inline memory_sample device_memory(int device = -1) noexcept {
  memory_sample s;
#if HONE_HAS_CUDA_RUNTIME
  int current = -1;
  if (device >= 0 && cudaGetDevice(&current) == cudaSuccess && current != device) {
    if (cudaSetDevice(device) != cudaSuccess) {
      (void)cudaGetLastError();
      return s;
    }
  } else {
    (void)cudaGetLastError();
    current = -1;
  }
  std::size_t free_b = 0, total_b = 0;
  const cudaError_t status = cudaMemGetInfo(&free_b, &total_b);
  if (current >= 0) (void)cudaSetDevice(current);
  if (status == cudaSuccess) {
    s.device_total = total_b;
    s.device_used = total_b - free_b;
  } else {
    (void)cudaGetLastError();
  }
#else
  (void)device;
#endif
  return s;
}

/// Host RSS and, with CUDA, device memory, now.
inline memory_sample sample_memory() noexcept {
  memory_sample s = device_memory();
  s.host_rss = host_rss_bytes();
  return s;
}

enum class memory_source { host_rss, device_used };

/// A level and its callbacks. on_above fires when the value reaches `bytes`; on_below when it
/// falls under `bytes - hysteresis_bytes` afterwards (hysteresis_bytes 0 means bytes / 16).
struct memory_threshold {
  memory_source what = memory_source::host_rss;
  std::size_t bytes = 0;
  std::function<void(const memory_sample&)> on_above = nullptr;
  std::function<void(const memory_sample&)> on_below = nullptr;
  std::size_t hysteresis_bytes = 0;
};

struct memory_monitor_options {
  std::chrono::microseconds interval = std::chrono::milliseconds(100);
  /// Whether to sample device memory (ignored without the CUDA runtime).
  bool device = true;
  /// The CUDA device to sample; -1: the device current on the thread that constructs the
  /// monitor (the monitor's own thread would otherwise see device 0).
  int cuda_device = -1;
};

class memory_monitor {
 public:
  /// Starts the sampling thread. Throws config_error for a zero interval.
  explicit memory_monitor(memory_monitor_options options = {}) : options_(options) {
    HONE_REQUIRE(options_.interval.count() > 0,
                 "hone::offload::memory_monitor: the sampling interval must be positive");
#if HONE_HAS_CUDA_RUNTIME
    if (options_.device && options_.cuda_device < 0) {
      int d = 0;
      if (cudaGetDevice(&d) == cudaSuccess) {
        options_.cuda_device = d;
      } else {
        (void)cudaGetLastError();
      }
    }
#endif
    sample_once();
    thread_ = std::thread([this] { run(); });
  }
  memory_monitor(const memory_monitor&) = delete;
  memory_monitor& operator=(const memory_monitor&) = delete;
  ~memory_monitor() {
    stop();
  }

  /// Adds a threshold; returns its index. Evaluated from the next sample on (a value already
  /// above the level fires on_above at that sample). Throws config_error for bytes == 0 or a
  /// hysteresis larger than the level.
  std::size_t add_threshold(memory_threshold t) {
    HONE_REQUIRE(t.bytes > 0, "hone::offload::memory_monitor: a threshold needs bytes > 0");
    if (t.hysteresis_bytes == 0) t.hysteresis_bytes = t.bytes / 16;
    HONE_REQUIRE(t.hysteresis_bytes <= t.bytes,
                 "hone::offload::memory_monitor: hysteresis_bytes must not exceed the level");
    std::lock_guard lock(mutex_);
    thresholds_.push_back({std::move(t), true, 0, 0});
    return thresholds_.size() - 1;
  }

  /// How many times threshold `i` fired on_above / on_below so far.
  [[nodiscard]] std::size_t times_above(std::size_t i) const {
    std::lock_guard lock(mutex_);
    return thresholds_.at(i).above_count;
  }
  [[nodiscard]] std::size_t times_below(std::size_t i) const {
    std::lock_guard lock(mutex_);
    return thresholds_.at(i).below_count;
  }

  /// The latest sample and the peaks since construction (or reset_peaks).
  [[nodiscard]] memory_sample latest() const {
    std::lock_guard lock(mutex_);
    return latest_;
  }
  [[nodiscard]] memory_sample peak() const {
    std::lock_guard lock(mutex_);
    return peak_;
  }
  void reset_peaks() {
    std::lock_guard lock(mutex_);
    peak_ = latest_;
  }
  /// Number of samples taken.
  [[nodiscard]] std::size_t samples() const {
    std::lock_guard lock(mutex_);
    return samples_;
  }

  /// Takes one sample now, on the calling thread, and evaluates the thresholds (callbacks run
  /// here then). Useful right after a large allocation.
  void sample_now() {
    sample_once();
  }

  /// Stops and joins the thread (idempotent). Not to be called from a callback.
  void stop() {
    {
      std::lock_guard lock(wake_mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct armed_threshold {
    memory_threshold t;
    bool armed;
    std::size_t above_count;
    std::size_t below_count;
  };

  void run() {
    std::unique_lock lock(wake_mutex_);
    while (!stopping_) {
      if (wake_.wait_for(lock, options_.interval, [this] { return stopping_; })) break;
      lock.unlock();
      sample_once();
      lock.lock();
    }
  }

  void sample_once() {
    memory_sample s;
    s.host_rss = host_rss_bytes();
    if (options_.device) {
      const memory_sample d = device_memory(options_.cuda_device);
      s.device_used = d.device_used;
      s.device_total = d.device_total;
    }
    // Callbacks run outside mutex_ (they may read latest() or peak()), serialized by fire_mutex_.
    std::lock_guard fire(fire_mutex_);
    std::vector<std::function<void(const memory_sample&)>> calls;
    {
      std::lock_guard lock(mutex_);
      latest_ = s;
      peak_.host_rss = std::max(peak_.host_rss, s.host_rss);
      peak_.device_used = std::max(peak_.device_used, s.device_used);
      peak_.device_total = std::max(peak_.device_total, s.device_total);
      ++samples_;
      for (auto& a : thresholds_) {
        const std::size_t v = a.t.what == memory_source::host_rss ? s.host_rss : s.device_used;
        if (a.armed && v >= a.t.bytes) {
          a.armed = false;
          ++a.above_count;
          if (a.t.on_above) calls.push_back(a.t.on_above);
        } else if (!a.armed && v < a.t.bytes - a.t.hysteresis_bytes) {
          a.armed = true;
          ++a.below_count;
          if (a.t.on_below) calls.push_back(a.t.on_below);
        }
      }
    }
    for (auto& c : calls) c(s);
  }

  memory_monitor_options options_;
  mutable std::mutex mutex_;  // guards thresholds_, latest_, peak_, samples_
  std::mutex fire_mutex_;     // one sample (and its callbacks) at a time
  std::mutex wake_mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<armed_threshold> thresholds_;
  memory_sample latest_;
  memory_sample peak_;
  std::size_t samples_ = 0;
  std::thread thread_;
};

}  // namespace offload
HONE_NAMESPACE_END
