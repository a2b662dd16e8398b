// hone/profile/trace.hpp: a trace being written. It switches recording on, drains every thread's
// buffer on a background thread every `flush_interval` (and on flush()), appends the events to a
// Perfetto protobuf trace and/or a Chrome JSON trace, and on close() drains the rest, switches
// recording off and finishes the files. Memory stays bounded while it streams: the buffers hold
// at most hone::profile::buffer_limit() bytes, the writers at most about 1 MiB each.
//
//   hone::profile::trace tr({.perfetto = "run.pftrace", .chrome_json = "run.json"});
//   ... training ...
//   tr.close();
//   hone::profile::print_summary(std::cout, tr.summary());
#pragma once

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/profile/chrome_json.hpp"
#include "hone/profile/collector.hpp"
#include "hone/profile/perfetto.hpp"
#include "hone/profile/stats.hpp"
#include "hone/profile/zone.hpp"

HONE_NAMESPACE_BEGIN
namespace profile {

struct trace_options {
  std::filesystem::path perfetto{};     ///< a Perfetto protobuf trace (.pftrace); empty: none
  std::filesystem::path chrome_json{};  ///< a Chrome trace-event JSON file (.json); empty: none
  /// How often a background thread drains the buffers into the files; zero: no thread, only
  /// flush() and close() do.
  std::chrono::milliseconds flush_interval{50};
  /// Runs that background thread at the lowest scheduling class, Linux's SCHED_IDLE: it then gets
  /// a core only when no other thread of the machine wants one, so its wake-ups never preempt the
  /// training threads (the trainer step's cost of a 1 ms drain about halves on a 2-core machine,
  /// docs/profile.md). On a machine whose cores are busy all the time it may fall behind: events
  /// past the buffer limit are then dropped and counted (dropped_events()); flush() and close()
  /// drain on the caller's thread as always. Needs Linux and a background thread
  /// (flush_interval > 0); refused otherwise.
  bool idle_collector = false;
  bool enable = true;          ///< switch recording on when the trace starts, off when it ends
  bool keep_earlier = false;   ///< also write the events recorded before the trace started
  std::string process_name{};  ///< names the process in the Perfetto trace
  /// This process's rank in a multi-process run (-1: none). With a rank, the files can be merged
  /// with the other ranks' (hone/profile/merge.hpp): the Perfetto trace uses packet sequence
  /// rank + 1 and track ids that include the rank, the process track is named "rank N" unless
  /// process_name says otherwise, and the Chrome JSON file uses the rank as its pid.
  int rank = -1;
  /// Added to every time written (see collector::set_time_offset_ns): this rank's offset to rank
  /// 0's clock, from hone::dist::estimate_clock_offset_ns (hone/dist/clock.hpp).
  std::int64_t clock_offset_ns = 0;
};

#if defined(__linux__)
namespace detail {
/// Puts `thread` in Linux's SCHED_IDLE class (trace_options::idle_collector); 0 or the error
/// number pthread_setschedparam returns.
inline int set_idle_class(pthread_t thread) noexcept {
  sched_param param{};
  param.sched_priority = 0;
  return pthread_setschedparam(thread, SCHED_IDLE, &param);
}
}  // namespace detail
#endif

class trace {
 public:
  explicit trace(trace_options opt) : opt_(std::move(opt)) {
    HONE_REQUIRE(!opt_.idle_collector || opt_.flush_interval.count() > 0,
                 "hone::profile::trace: idle_collector asks for a background drain thread at "
                 "SCHED_IDLE, but flush_interval is 0 (no background thread); give a positive "
                 "flush_interval or leave idle_collector false");
#if !defined(__linux__)
    HONE_REQUIRE(!opt_.idle_collector,
                 "hone::profile::trace: idle_collector uses Linux's SCHED_IDLE scheduling class, "
                 "which this platform does not have; leave idle_collector false");
#endif
    HONE_REQUIRE(opt_.rank >= -1, "hone::profile::trace: rank " + std::to_string(opt_.rank) +
                                      " is negative; give the process's rank (0, 1, ...) or -1 "
                                      "for a single-process trace");
    if (!opt_.keep_earlier) collector_.discard();
    collector_.set_time_offset_ns(opt_.clock_offset_ns);
    if (!opt_.perfetto.empty()) {
      std::string name = opt_.process_name;
      if (name.empty() && opt_.rank >= 0) name = "rank " + std::to_string(opt_.rank);
      perfetto_.emplace(opt_.perfetto, std::move(name), static_cast<std::uint32_t>(opt_.rank + 1));
      sinks_.push_back(&*perfetto_);
    }
    if (!opt_.chrome_json.empty()) {
      json_.emplace(opt_.chrome_json, opt_.rank);
      sinks_.push_back(&*json_);
    }
    if (opt_.enable) set_enabled(true);
    if (opt_.flush_interval.count() > 0) {
      worker_ = std::thread([this] { run(); });
      if (opt_.idle_collector) make_worker_idle();
    }
  }

  /// Closes the trace; an error there is printed to stderr (call close() to see it thrown).
  ~trace() {
    try {
      close();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "hone::profile::trace: %s\n", e.what());
    }
  }
  trace(const trace&) = delete;
  trace& operator=(const trace&) = delete;

  /// Drains every thread's buffer into the files now, and the device zones that completed (with
  /// `wait_device`, every device zone recorded so far: their events are waited for). Rethrows an
  /// error of the background thread.
  void flush(bool wait_device = false) {
    const std::lock_guard lock(mu_);
    rethrow();
    collector_.drain(sinks_, wait_device);
  }

  /// Drains the rest, switches recording off (if the trace switched it on) and finishes the
  /// files. Device zones (hone/profile/cuda/zone.hpp) whose events are still pending are waited
  /// for here (their events synchronized), so every device zone recorded before close() is in
  /// the files. Zones still open on some thread stay open in the files (the Perfetto UI shows them
  /// as unfinished). Idempotent.
  void close() {
    {
      const std::lock_guard lock(mu_);
      if (closed_) return;
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    const std::lock_guard lock(mu_);
    closed_ = true;
    if (opt_.enable) set_enabled(false);
    rethrow();
    collector_.drain(sinks_, /*wait_device=*/true);  // device zones recorded so far: waited for
    if (perfetto_) perfetto_->close();
    if (json_) json_->close();
  }

  /// Events lost for want of buffer memory since the trace started (raise the limit with
  /// hone::profile::set_buffer_limit or flush more often).
  [[nodiscard]] std::uint64_t dropped_events() {
    const std::lock_guard lock(mu_);
    return collector_.dropped_events();
  }

  /// Count, total, mean, p50/p95/p99 and max per zone name over the zones written so far.
  [[nodiscard]] std::vector<summary_row> summary() {
    const std::lock_guard lock(mu_);
    return collector_.summary();
  }

 private:
  void drain_locked() {
    collector_.drain(sinks_);
  }
  void rethrow() {
    if (error_) {
      auto e = std::exchange(error_, nullptr);
      std::rethrow_exception(e);
    }
  }
  /// SCHED_IDLE for the background thread (idle_collector); a refusal stops the thread and
  /// throws, so the constructor leaves nothing running.
  void make_worker_idle() {
#if defined(__linux__)
    const int rc = detail::set_idle_class(worker_.native_handle());
    if (rc == 0) return;
    {
      const std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    if (opt_.enable) set_enabled(false);
    throw config_error(
        "hone::profile::trace: idle_collector: the operating system refused the "
        "SCHED_IDLE scheduling class for the drain thread (" +
        std::string(std::strerror(rc)) + "); leave idle_collector false");
#endif
  }

  void run() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, opt_.flush_interval, [this] { return stop_; });
      if (stop_ || error_) continue;
      try {
        drain_locked();
      } catch (...) {
        error_ = std::current_exception();
      }
    }
  }

  trace_options opt_;
  collector collector_;
  std::optional<perfetto_writer> perfetto_;
  std::optional<chrome_json_writer> json_;
  std::vector<trace_sink*> sinks_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool closed_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace profile
HONE_NAMESPACE_END
