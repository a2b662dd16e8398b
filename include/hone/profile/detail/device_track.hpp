// hone/profile/detail/device_track.hpp: the collector's side of device timelines. A device source
// (hone/profile/cuda/zone.hpp registers one per process when its first CUDA zone is recorded)
// hands the collector the begin and end marks of device zones that have completed, each track's
// (a GPU stream's) in time order, already on the host time base (steady_clock nanoseconds, as
// hone::profile::clock_calibration maps the host's stamps). The collector writes each track as a
// track of its own in the trace ("GPU 0 stream 13"), beside the threads' tracks.
//
// Host code: nothing here needs CUDA, so the collector and the writers stay host-only, and a host
// test can feed synthetic device marks through the same path (tests/profile/interop_helper.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace profile {

/// One begin or end of a device zone, resolved to the host time base.
struct device_mark {
  std::uint64_t track = 0;     ///< the source's id of the track (a stream)
  bool begin = false;          ///< a zone's begin (else the end of the innermost open zone)
  const char* name = nullptr;  ///< a begin's zone name (static storage duration); ends: unused
  std::uint64_t ns = 0;        ///< steady_clock nanoseconds
};

namespace detail {

/// What the collector reads device zones from.
class device_source {
 public:
  virtual ~device_source() = default;
  /// Appends the marks that completed since the last call, each track's in time order. With
  /// `wait`, first waits for every mark recorded so far (a trace being closed).
  virtual void collect(std::vector<device_mark>& out, bool wait) = 0;
  /// The name of track `id`, shown in traces ("GPU 0 stream 13").
  [[nodiscard]] virtual std::string track_name(std::uint64_t id) = 0;
  /// Zones that were not recorded for want of memory since the source started.
  [[nodiscard]] virtual std::uint64_t dropped() const = 0;
};

/// The device sources of the process (the CUDA zones' event pool; a test's fake source).
class device_registry {
 public:
  void add(device_source* s) {
    const std::lock_guard lock(mu_);
    if (std::find(sources_.begin(), sources_.end(), s) == sources_.end()) sources_.push_back(s);
  }
  void remove(device_source* s) {
    const std::lock_guard lock(mu_);
    sources_.erase(std::remove(sources_.begin(), sources_.end(), s), sources_.end());
  }
  /// A copy of the list (sources are added once and live as long as they are registered).
  [[nodiscard]] std::vector<device_source*> list() const {
    const std::lock_guard lock(mu_);
    return sources_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<device_source*> sources_;
};

inline device_registry& device_sources() {
  static device_registry r;
  return r;
}

}  // namespace detail
}  // namespace profile
HONE_NAMESPACE_END
