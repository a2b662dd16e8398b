// hone/profile/cuda/zone.hpp: device zones, the time a stream's work takes on the GPU.
//
//   {
//     HONE_ZONE("optimizer");               // host time: enqueuing the kernels
//     HONE_CUDA_ZONE(stream, "optimizer");  // device time: the stream running them
//     launch_update_kernels(stream);
//   }
//
// hone::profile::cuda_zone z(stream, name) records a CUDA event on `stream` where it is built and
// another where it is destroyed, both taken from a per-device pool of recycled events (no
// cudaEventCreate per zone once the pool has grown to what is in flight), and never synchronizes
// the stream. A trace's collector (hone/profile/trace.hpp) later finds the completed events
// (cudaEventQuery, no waiting), converts them to the host time base and writes the zones as slices
// on a track of their own per stream, "GPU <device> stream <id>" (id: cudaStreamGetId), in both
// the Perfetto and the Chrome JSON file; trace::close() waits for the events still pending
// (cudaEventSynchronize), so every zone recorded before it is written. A zone also gets a
// "<name> (device)" row in trace::summary().
//
// Time base: a device's events are placed by a calibration: an event recorded on a private idle
// stream, timed on the host (the clock of hone's host zones) just before cudaEventRecord and just
// after cudaEventSynchronize returns; the event's device time lies between the two, so its host
// time is their midpoint within half their distance (best of 3 tries; cuda_clock_error_ns
// returns that bound). A mark's host time is that midpoint plus cudaEventElapsedTime from the
// calibration event (resolution about 0.5 us). The collector recalibrates a device that is in use
// every 100 ms, which keeps the float milliseconds of cudaEventElapsedTime short (under 0.1 us of
// rounding) and the drift between the GPU's timer and the host clock to their rate difference
// times 100 ms (10 us at 100 ppm). Times on one track never go back.
//
// Rules: like HONE_ZONE, a zone follows the run-time switch (hone::profile::set_enabled; off: one
// relaxed load) and HONE_CUDA_ZONE is compiled out by HONE_PROFILE_DISABLED; `name` has static
// storage duration. Zones on one stream must nest (RAII on one thread does). The first zone on a
// device calibrates it (a wait of some microseconds on the private stream, once;
// prepare_cuda_zones(device) does it ahead). The pool holds at most 65536 events per device and
// 262144 completed marks waiting for a collector; a zone that finds neither free (recording on
// while no trace drains) is dropped and counted in trace::dropped_events(). A CUDA error in a
// zone's constructor throws hone::cuda_error; in its destructor it is kept and thrown by the next
// drain (trace::flush or close). Host header: needs the CUDA runtime (link hone::cuda).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/cuda/error.hpp"
#include "hone/core/error.hpp"
#include "hone/profile/clock.hpp"
#include "hone/profile/detail/device_track.hpp"
#include "hone/profile/zone.hpp"

HONE_NAMESPACE_BEGIN
namespace profile {

/// The state of the CUDA zones' event pool, over every device.
struct cuda_event_pool_stats {
  std::size_t events_created = 0;  ///< CUDA events created so far (kept for reuse, never freed)
  std::size_t events_free = 0;     ///< events ready for the next zones
  std::size_t marks_pending = 0;   ///< begins/ends recorded, not yet seen completed
  std::size_t marks_resolved = 0;  ///< completed and timed, waiting for the collector
  std::uint64_t dropped = 0;       ///< zones not recorded: the pool was at its limit
};

namespace detail {

/// Sets the current device for a scope, restoring the previous one.
class cuda_device_scope {
 public:
  explicit cuda_device_scope(int device) {
    HONE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) HONE_CUDA_CHECK(cudaSetDevice(device));
    device_ = device;
  }
  ~cuda_device_scope() {
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }
  cuda_device_scope(const cuda_device_scope&) = delete;
  cuda_device_scope& operator=(const cuda_device_scope&) = delete;

 private:
  int previous_ = 0;
  int device_ = 0;
};

/// The host time now, on the host zones' time base (hone::profile::clock_calibration).
inline std::uint64_t host_now_ns() {
  return clock_calibration::get().to_ns(ticks());
}

/// The process's CUDA event pool and device source (see the top of this file).
class cuda_event_pool final : public device_source {
 public:
  static constexpr std::size_t max_events_per_device = std::size_t{1} << 16;
  static constexpr std::size_t max_resolved = std::size_t{1} << 18;
  static constexpr std::size_t grow_by = 64;
  static constexpr std::uint64_t recalibrate_after_ns = 100'000'000;

  struct track;
  /// A begun zone: its track and the event reserved for its end (no track: not recorded).
  struct ticket {
    track* t = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t end = nullptr;
  };

  /// The pool, registered as a device source on first use. Never destroyed: its events must not
  /// be destroyed after the CUDA runtime has shut down at exit.
  static cuda_event_pool& get() {
    static cuda_event_pool* const p = [] {
      auto* q = new cuda_event_pool;
      device_sources().add(q);
      return q;
    }();
    return *p;
  }

  /// Records a zone's begin on `stream` and reserves its end's event.
  ticket begin(cudaStream_t stream, const char* name) {
    int dev = 0;
    HONE_CUDA_CHECK(cudaStreamGetDevice(stream, &dev));
    unsigned long long sid = 0;
    HONE_CUDA_CHECK(cudaStreamGetId(stream, &sid));
    const std::lock_guard lock(mu_);
    device_state& d = device(dev);
    if (d.current == 0) calibrate(d);
    track& t = track_for(dev, sid);
    if (!reserve(d, 2)) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return {};
    }
    const cudaEvent_t b = d.free.back();
    d.free.pop_back();
    const cudaEvent_t e = d.free.back();
    d.free.pop_back();
    const cudaError_t st = cudaEventRecord(b, stream);
    if (st != cudaSuccess) {
      d.free.push_back(e);
      d.free.push_back(b);
      ::hone::detail::cuda_check(st, "cudaEventRecord (hone::profile::cuda_zone's begin)");
    }
    push(d, t, mark{b, name, d.current, true});
    return {&t, stream, e};
  }

  /// Records the end of the zone begun with `z` on its stream.
  void end(const ticket& z) noexcept {
    const std::lock_guard lock(mu_);
    device_state& d = devices_.at(z.t->device);
    const cudaError_t st = cudaEventRecord(z.end, z.stream);
    if (st == cudaSuccess) {
      push(d, *z.t, mark{z.end, nullptr, d.current, false});
      return;
    }
    (void)cudaGetLastError();
    if (error_.empty()) {
      error_ = std::string("cudaEventRecord (hone::profile::cuda_zone's end) failed: ") +
               cudaGetErrorString(st) + " (" + cudaGetErrorName(st) + ")";
      error_code_ = static_cast<int>(st);
    }
    d.free.push_back(z.end);
    push(d, *z.t, mark{nullptr, nullptr, d.current, false});  // placed at the track's last time
  }

  void collect(std::vector<device_mark>& out, bool wait) override {
    const std::lock_guard lock(mu_);
    if (!error_.empty()) {
      const std::string e = std::exchange(error_, {});
      throw cuda_error(e + "; the device zones after it on that stream may be misplaced",
                       error_code_);
    }
    for (const auto& t : by_id_) {
      resolve(*t, wait);
      out.insert(out.end(), t->resolved.begin(), t->resolved.end());
      resolved_count_ -= t->resolved.size();
      t->resolved.clear();
    }
    const std::uint64_t now = host_now_ns();
    for (auto& [dev, d] : devices_) {
      if (d.used_since_calibration && now > d.epochs.at(d.current).taken_ns + recalibrate_after_ns)
        calibrate(d);
    }
  }

  [[nodiscard]] std::string track_name(std::uint64_t id) override {
    const std::lock_guard lock(mu_);
    return id >= 1 && id <= by_id_.size() ? by_id_[id - 1]->name : std::string("GPU stream ?");
  }

  [[nodiscard]] std::uint64_t dropped() const override {
    return dropped_.load(std::memory_order_relaxed);
  }

  [[nodiscard]] cuda_event_pool_stats stats() {
    const std::lock_guard lock(mu_);
    cuda_event_pool_stats s;
    for (const auto& [dev, d] : devices_) {
      s.events_created += d.created;
      s.events_free += d.free.size();
    }
    for (const auto& t : by_id_) s.marks_pending += t->pending.size();
    s.marks_resolved = resolved_count_;
    s.dropped = dropped();
    return s;
  }

  /// Calibrates `dev` now if it has no calibration yet; returns the current one's error bound.
  std::uint64_t prepare(int dev) {
    const std::lock_guard lock(mu_);
    device_state& d = device(dev);
    if (d.current == 0) calibrate(d);
    return d.epochs.at(d.current).error_ns;
  }
  /// The current calibration's error bound on `dev` in nanoseconds (0: not calibrated yet).
  [[nodiscard]] std::uint64_t error_ns(int dev) {
    const std::lock_guard lock(mu_);
    const auto it = devices_.find(dev);
    if (it == devices_.end() || it->second.current == 0) return 0;
    return it->second.epochs.at(it->second.current).error_ns;
  }

  struct mark {
    cudaEvent_t event;  // null: its record failed (placed at the track's last time)
    const char* name;   // a begin's name
    std::uint32_t epoch;
    bool begin;
  };
  struct track {
    std::uint64_t id = 0;
    int device = 0;
    std::string name;
    std::deque<mark> pending;          // record order, which is the stream's order
    std::deque<device_mark> resolved;  // completed, timed
    std::uint64_t last_ns = 0;
  };

 private:
  cuda_event_pool() = default;

  /// A calibration: an event whose host time is `ns`, within `error_ns`.
  struct calibration {
    cudaEvent_t event = nullptr;
    std::uint64_t ns = 0;
    std::uint64_t error_ns = 0;
    std::uint64_t taken_ns = 0;
    std::size_t uses = 0;  // pending marks placed by it
  };
  struct device_state {
    int device = 0;
    cudaStream_t calibration_stream = nullptr;
    std::vector<cudaEvent_t> free;
    std::size_t created = 0;
    std::map<std::uint32_t, calibration> epochs;
    std::uint32_t current = 0;  // 0: not calibrated yet
    std::uint32_t next_epoch = 1;
    bool used_since_calibration = false;
  };

  device_state& device(int dev) {
    auto [it, fresh] = devices_.try_emplace(dev);
    if (fresh) it->second.device = dev;
    return it->second;
  }

  track& track_for(int dev, unsigned long long sid) {
    auto [it, fresh] = tracks_.try_emplace({dev, sid}, nullptr);
    if (fresh) {
      auto t = std::make_unique<track>();
      t->id = by_id_.size() + 1;
      t->device = dev;
      t->name = "GPU " + std::to_string(dev) + " stream " + std::to_string(sid);
      it->second = t.get();
      by_id_.push_back(std::move(t));
    }
    return *it->second;
  }

  void push(device_state& d, track& t, const mark& m) {
    t.pending.push_back(m);
    ++d.epochs.at(m.epoch).uses;
    d.used_since_calibration = true;
  }

  /// Creates `n` more events on `d` (its device made current for the call).
  void grow(device_state& d, std::size_t n) {
    const cuda_device_scope scope(d.device);
    for (std::size_t i = 0; i < n; ++i) {
      cudaEvent_t e = nullptr;
      HONE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
      d.free.push_back(e);
      ++d.created;
    }
  }

  /// Makes `n` events free on `d`: resolves the marks that completed on its tracks (no waiting),
  /// then grows the pool up to its limit. False: none to be had.
  bool reserve(device_state& d, std::size_t n) {
    if (d.free.size() >= n) return true;
    for (const auto& t : by_id_) {
      if (t->device == d.device) resolve(*t, false);
    }
    if (d.free.size() >= n) return true;
    if (d.created + grow_by > max_events_per_device) return false;
    grow(d, grow_by);
    return true;
  }

  void release(device_state& d, std::uint32_t epoch) {
    const auto it = d.epochs.find(epoch);
    if (--it->second.uses == 0 && epoch != d.current) {
      d.free.push_back(it->second.event);
      d.epochs.erase(it);
    }
  }

  /// Moves the completed marks at the front of t's pending list to its resolved list, timed;
  /// with `wait`, waits for each.
  void resolve(track& t, bool wait) {
    device_state& d = devices_.at(t.device);
    while (!t.pending.empty()) {
      if (!wait && resolved_count_ >= max_resolved) break;
      const mark m = t.pending.front();
      std::uint64_t ns = t.last_ns;
      if (m.event != nullptr) {
        if (wait) {
          HONE_CUDA_CHECK(cudaEventSynchronize(m.event));
        } else {
          const cudaError_t st = cudaEventQuery(m.event);
          if (st == cudaErrorNotReady) break;
          ::hone::detail::cuda_check(st, "cudaEventQuery (hone::profile's device zones)");
        }
        const calibration& c = d.epochs.at(m.epoch);
        float ms = 0.0f;
        HONE_CUDA_CHECK(cudaEventElapsedTime(&ms, c.event, m.event));
        const double off = static_cast<double>(ms) * 1e6;
        ns = off > 0.0 ? c.ns + static_cast<std::uint64_t>(std::llround(off)) : c.ns;
        ns = std::max(ns, t.last_ns);
        d.free.push_back(m.event);
      }
      t.last_ns = ns;
      t.pending.pop_front();
      release(d, m.epoch);
      t.resolved.push_back(device_mark{t.id, m.begin, m.name, ns});
      ++resolved_count_;
    }
  }

  /// A new calibration of `d` (see the top of this file): the best of 3 events recorded on the
  /// device's private stream, each timed on the host around its record and synchronization.
  void calibrate(device_state& d) {
    const cuda_device_scope scope(d.device);
    if (d.calibration_stream == nullptr) {
      HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&d.calibration_stream, cudaStreamNonBlocking));
    }
    if (d.free.size() < 3) grow(d, grow_by);
    calibration best;
    best.error_ns = std::numeric_limits<std::uint64_t>::max();
    for (int i = 0; i < 3; ++i) {
      const cudaEvent_t e = d.free.back();
      d.free.pop_back();
      const std::uint64_t t0 = host_now_ns();
      cudaError_t st = cudaEventRecord(e, d.calibration_stream);
      if (st == cudaSuccess) st = cudaEventSynchronize(e);
      const std::uint64_t t1 = host_now_ns();
      if (st != cudaSuccess) {
        d.free.push_back(e);
        if (best.event != nullptr) d.free.push_back(best.event);
        ::hone::detail::cuda_check(st,
                                   "cudaEventRecord/cudaEventSynchronize (hone::profile's "
                                   "GPU calibration)");
      }
      const std::uint64_t span = t1 >= t0 ? t1 - t0 : 0;
      if (span / 2 + 1 < best.error_ns) {
        if (best.event != nullptr) d.free.push_back(best.event);
        best.event = e;
        best.ns = t0 + span / 2;
        best.error_ns = span / 2 + 1;
        best.taken_ns = t1;
      } else {
        d.free.push_back(e);
      }
    }
    const std::uint32_t old = d.current;
    d.current = d.next_epoch++;
    d.epochs.emplace(d.current, best);
    d.used_since_calibration = false;
    if (old != 0) {
      const auto it = d.epochs.find(old);
      if (it->second.uses == 0) {
        d.free.push_back(it->second.event);
        d.epochs.erase(it);
      }
    }
  }

  std::mutex mu_;
  std::map<int, device_state> devices_;
  std::map<std::pair<int, unsigned long long>, track*> tracks_;
  std::vector<std::unique_ptr<track>> by_id_;  // track id - 1
  std::size_t resolved_count_ = 0;
  std::atomic<std::uint64_t> dropped_{0};
  std::string error_;  // a failed record in a zone's end, thrown by the next collect
  int error_code_ = 0;
};

}  // namespace detail

/// A device zone on `stream` from construction to destruction (see the top of this file).
class cuda_zone {
 public:
  /// Throws hone::cuda_error when recording its begin fails (a bad stream, a dead context).
  cuda_zone(cudaStream_t stream, const char* name) {
    if (enabled()) ticket_ = detail::cuda_event_pool::get().begin(stream, name);
  }
  ~cuda_zone() {
    if (ticket_.t != nullptr) detail::cuda_event_pool::get().end(ticket_);
  }
  cuda_zone(const cuda_zone&) = delete;
  cuda_zone& operator=(const cuda_zone&) = delete;

  /// Whether the zone is being recorded (recording was on and the pool had events).
  [[nodiscard]] bool recorded() const noexcept { return ticket_.t != nullptr; }

 private:
  detail::cuda_event_pool::ticket ticket_{};
};

/// Calibrates device `device`'s clock for device zones now (else the first zone on it does, a
/// wait of some microseconds); returns the calibration's error bound in nanoseconds.
inline std::uint64_t prepare_cuda_zones(int device) {
  return detail::cuda_event_pool::get().prepare(device);
}

/// The error bound, in nanoseconds, of the current mapping of device `device`'s event times to
/// the host time base (half the host time around the calibration event's record and
/// synchronization); 0 before the device's first zone.
[[nodiscard]] inline std::uint64_t cuda_clock_error_ns(int device) {
  return detail::cuda_event_pool::get().error_ns(device);
}

/// Events created, free and in use, and zones dropped, over every device.
[[nodiscard]] inline cuda_event_pool_stats cuda_zone_pool_stats() {
  return detail::cuda_event_pool::get().stats();
}

}  // namespace profile
HONE_NAMESPACE_END

#if defined(HONE_PROFILE_DISABLED)
#define HONE_CUDA_ZONE(stream, name) static_cast<void>(0)
#else
/// A device zone on `stream` named by a string literal, to the end of the enclosing scope.
#define HONE_CUDA_ZONE(stream, name)                                                       \
  const ::hone::profile::cuda_zone HONE_PROFILE_CONCAT(hone_profile_cuda_zone_, __LINE__)( \
      (stream), "" name "")
#endif
