// hone/profile/collector.hpp: the one reader of every thread's buffer. drain() hands each new
// event, in each thread's order, to a sink with its time in steady_clock nanoseconds, gives the
// consumed chunks back to the pool, forgets threads that exited once their events are read, and
// keeps per-zone duration statistics. It also reads the device sources (hone/profile/cuda/zone.hpp:
// CUDA zones' completed events) and hands their zones to the sinks on one track per GPU stream.
// At most one collector exists at a time (the buffers are single-consumer): hone::profile::trace
// owns one.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/profile/clock.hpp"
#include "hone/profile/detail/buffer.hpp"
#include "hone/profile/detail/device_track.hpp"
#include "hone/profile/stats.hpp"

HONE_NAMESPACE_BEGIN
namespace profile {

/// A thread as traces show it.
struct thread_info {
  std::uint64_t serial = 0;  ///< registration order in this process (unique, never reused)
  std::uint64_t tid = 0;     ///< the operating system's thread id
  std::uint32_t pid = 0;
  std::string name;  ///< set_thread_name's, or empty
  /// A device track (a GPU stream's zones, hone/profile/cuda/zone.hpp), not an OS thread: the
  /// n-th device track seen (from 1) has `serial` 2^62 + n (apart from the threads'), `tid`
  /// 2^30 + n (above any Linux thread id) and `name` the track's ("GPU 0 stream 13").
  bool device = false;
};

/// What a collector hands events to. A begin/end pair is always matched: an end is passed only
/// when its begin was (ends whose begin was dropped for want of memory are skipped and counted).
class trace_sink {
 public:
  virtual ~trace_sink() = default;
  /// A thread seen for the first time, or renamed.
  virtual void thread(const thread_info& t) = 0;
  /// One event of thread t at time `ns`; for an end, `name` is the zone's (from its begin).
  virtual void event(const thread_info& t, event_kind kind, const char* name, std::uint64_t ns,
                     std::uint64_t arg) = 0;
  /// The end of one drain: write out what is buffered.
  virtual void flush() = 0;
};

class collector {
 public:
  collector() : cal_(&clock_calibration::get()) {
    if (!detail::registry::get().claim()) {
      throw config_error(
          "hone::profile: a second trace (or collector) was started while one is running; each "
          "thread's buffer has one reader, so close the running hone::profile::trace first");
    }
  }
  ~collector() { detail::registry::get().unclaim(); }
  collector(const collector&) = delete;
  collector& operator=(const collector&) = delete;

  /// Reads every event recorded since the last drain into `sinks` (none: the events are
  /// discarded, statistics included), then the device zones that completed. With `wait_device`,
  /// first waits for the device zones recorded so far (a trace being closed: synchronizing with
  /// their events).
  void drain(std::span<trace_sink* const> sinks, bool wait_device = false) {
    auto& reg = detail::registry::get();
    auto& pool = detail::thread_buffer::pool();
    reg.for_each([&](detail::thread_buffer& b) {
      const bool finished = b.finished.load(std::memory_order_acquire);
      auto [it, fresh] = threads_.try_emplace(b.serial);
      state& st = it->second;
      const std::uint32_t nv = b.name_version.load(std::memory_order_acquire);
      if (fresh || !st.announced || nv != st.name_version) {
        st.info.serial = b.serial;
        st.info.tid = b.tid;
        st.info.pid = b.pid;
        {
          const std::lock_guard lock(b.name_mu);
          st.info.name = b.name;
        }
        st.name_version = nv;
        st.announced = !sinks.empty();
        for (trace_sink* s : sinks) s->thread(st.info);
      }
      if (b.head == nullptr) b.head = b.first.load(std::memory_order_acquire);
      while (b.head != nullptr) {
        detail::chunk* c = b.head;
        const std::uint32_t n = c->count.load(std::memory_order_acquire);
        for (std::uint32_t i = c->consumed; i < n; ++i) process(st, c->events[i], sinks);
        c->consumed = n;
        if (n < detail::chunk_events) break;
        detail::chunk* next = c->next.load(std::memory_order_acquire);
        if (next == nullptr) break;
        pool.release(c);
        b.head = next;
      }
      st.dropped = b.dropped.load(std::memory_order_relaxed);
      if (finished) {
        // Every event of an exited thread is read now: give its last chunk back and forget it.
        if (b.head != nullptr) pool.release(b.head);
        b.head = nullptr;
        b.first.store(nullptr, std::memory_order_relaxed);  // every chunk is back in the pool
        dropped_exited_ += st.dropped;
        threads_.erase(it);
        gone_.push_back(b.serial);
      }
    });
    if (!gone_.empty()) {
      reg.remove_if([&](const detail::thread_buffer& b) {
        return std::find(gone_.begin(), gone_.end(), b.serial) != gone_.end();
      });
      gone_.clear();
    }
    drain_devices(sinks, wait_device);
    for (trace_sink* s : sinks) s->flush();
  }

  /// Adds `ns` to every time handed to the sinks (durations are unchanged): a rank's offset to
  /// rank 0's clock (hone::dist::estimate_clock_offset_ns), so the traces of several processes
  /// share one time base. A time that the offset would make negative is passed as 0.
  void set_time_offset_ns(std::int64_t ns) noexcept { offset_ns_ = ns; }
  [[nodiscard]] std::int64_t time_offset_ns() const noexcept { return offset_ns_; }

  /// Reads and forgets every event recorded so far (and the statistics and counts): what a
  /// trace that starts now should not show.
  void discard() {
    drain({});
    // The sinks of later drains have not seen the threads yet (their names included).
    for (auto& [serial, st] : threads_) st.announced = false;
    for (auto& [key, st] : devices_) st.announced = false;
    stats_.clear();
    device_stats_.clear();
    by_pointer_.clear();
    dropped_base_ = dropped_total();
  }

  /// Events lost for want of buffer memory, on every thread, since this collector started (or
  /// discarded): events dropped when recorded, and zone ends whose begin was dropped.
  [[nodiscard]] std::uint64_t dropped_events() const noexcept {
    return dropped_total() - dropped_base_;
  }

  /// Count, total, mean, p50/p95/p99 and max of each zone name's durations, on every thread,
  /// over the zones that ended in the events drained so far (largest total first). Device zones
  /// have rows of their own, named "<name> (device)".
  [[nodiscard]] std::vector<summary_row> summary() const {
    std::vector<summary_row> rows;
    for (const auto& [name, s] : stats_) rows.push_back(make_row(std::string(name), s, 1.0));
    for (const auto& [name, s] : device_stats_) {
      rows.push_back(make_row(std::string(name) + " (device)", s, 1.0));
    }
    std::sort(rows.begin(), rows.end(),
              [](const summary_row& a, const summary_row& b) { return a.total_ns > b.total_ns; });
    return rows;
  }

 private:
  struct state {
    thread_info info;
    std::uint32_t name_version = 0;
    bool announced = false;  // thread() was called with this name (false after discard())
    std::uint64_t dropped = 0;
    std::vector<std::pair<const char*, std::uint64_t>> open;  // open zones: name, begin ns
  };

  /// A device track: its thread_info and open zones.
  struct device_state {
    thread_info info;
    bool announced = false;
    std::vector<std::pair<const char*, std::uint64_t>> open;
  };

  /// Reads every device source's completed marks into the sinks, one track per source track.
  void drain_devices(std::span<trace_sink* const> sinks, bool wait) {
    for (detail::device_source* src : detail::device_sources().list()) {
      marks_.clear();
      src->collect(marks_, wait);
      for (const device_mark& m : marks_) {
        auto [it, fresh] = devices_.try_emplace({src, m.track});
        device_state& st = it->second;
        if (fresh) {
          st.info.serial = (std::uint64_t{1} << 62) + devices_.size();
          st.info.tid = (std::uint64_t{1} << 30) + devices_.size();
          st.info.pid = detail::os_process_id();
          st.info.name = src->track_name(m.track);
          st.info.device = true;
        }
        if (!st.announced) {
          st.announced = !sinks.empty();
          for (trace_sink* s : sinks) s->thread(st.info);
        }
        const char* name = m.name;
        event_kind kind = event_kind::begin;
        if (m.begin) {
          st.open.emplace_back(name, m.ns);
        } else {
          if (st.open.empty()) {
            ++unmatched_ends_;
            continue;
          }
          const auto [begin_name, begin_ns] = st.open.back();
          st.open.pop_back();
          name = begin_name;
          kind = event_kind::end;
          device_stats_[std::string_view(begin_name)].add(m.ns >= begin_ns ? m.ns - begin_ns : 0);
        }
        for (trace_sink* s : sinks) s->event(st.info, kind, name, shifted(m.ns), 0);
      }
    }
  }

  /// A time with the offset added (0 where the offset would make it negative).
  [[nodiscard]] std::uint64_t shifted(std::uint64_t ns) const noexcept {
    if (offset_ns_ < 0) {
      const auto back = static_cast<std::uint64_t>(-(offset_ns_ + 1)) + 1;  // no overflow at min
      return ns >= back ? ns - back : 0;
    }
    return ns + static_cast<std::uint64_t>(offset_ns_);
  }

  void process(state& st, const event& e, std::span<trace_sink* const> sinks) {
    const std::uint64_t ns = cal_->to_ns(e.ticks);
    const char* name = e.name;
    if (e.kind == event_kind::begin) {
      st.open.emplace_back(name, ns);
    } else if (e.kind == event_kind::end) {
      if (st.open.empty()) {
        ++unmatched_ends_;  // its begin was dropped (or read by an earlier collector)
        return;
      }
      const auto [begin_name, begin_ns] = st.open.back();
      st.open.pop_back();
      name = begin_name;
      stats_for(begin_name).add(ns >= begin_ns ? ns - begin_ns : 0);
    }
    const std::uint64_t at = shifted(ns);
    for (trace_sink* s : sinks) s->event(st.info, e.kind, name, at, e.arg);
  }

  /// A zone name's statistics: found by pointer first (names are static), then by text.
  duration_stats& stats_for(const char* name) {
    if (auto it = by_pointer_.find(name); it != by_pointer_.end()) return *it->second;
    duration_stats& s = stats_[std::string_view(name)];
    by_pointer_.emplace(name, &s);
    return s;
  }

  [[nodiscard]] std::uint64_t dropped_total() const noexcept {
    std::uint64_t d = dropped_exited_;
    for (const auto& [serial, st] : threads_) d += st.dropped;
    for (const detail::device_source* src : detail::device_sources().list()) d += src->dropped();
    return d + unmatched_ends_;
  }

  const clock_calibration* cal_;
  std::int64_t offset_ns_ = 0;
  std::uint64_t dropped_base_ = 0;
  std::unordered_map<std::uint64_t, state> threads_;
  std::vector<std::uint64_t> gone_;
  std::uint64_t dropped_exited_ = 0;
  std::uint64_t unmatched_ends_ = 0;
  std::map<std::string_view, duration_stats> stats_;  // node-based: pointers to values stay
  std::unordered_map<const char*, duration_stats*> by_pointer_;
  std::map<std::pair<const detail::device_source*, std::uint64_t>, device_state> devices_;
  std::vector<device_mark> marks_;
  std::map<std::string_view, duration_stats> device_stats_;
};

}  // namespace profile
HONE_NAMESPACE_END
