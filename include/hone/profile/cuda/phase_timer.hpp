// hone/profile/cuda/phase_timer.hpp: hone::profile::cuda_phase_timer, the step observer of a
// trainer whose model runs on CUDA: hone::profile::phase_timer's host times (what the trainer
// copies into each step_report), plus each phase's device time on the model's stream.
//
//   hone::trainer t(model, hone::adamw{...}, hone::profile::cuda_phase_timer(model.cuda_stream()));
//   for (...) t.step(batch);
//   t.observer().synchronize();                      // the last steps' device times
//   t.observer().print_summary(std::cout);           // host rows, then "<phase> (device)" rows
//   double opt = t.observer().device_last_step_ns(hone::step_phase::optimizer);
//
// Around each phase it records a pair of CUDA events on the stream (its own recycled events: none
// created once as many steps as are in flight have been seen) and never synchronizes the stream:
// a step's device times are read (cudaEventQuery, then cudaEventElapsedTime) once its last event
// has completed, which the timer looks at when a step begins. With the CUDA trainer, which waits
// for its stream once per step (in `check`), the device times of step n are known when step n + 1
// begins (device_steps() counts the steps timed); synchronize() waits for the rest. If 16 steps
// are pending (a stream 16 steps behind the host), the oldest is waited for: the memory is bounded.
// A phase's device time is the sum over its runs (forward_backward and unscale run once per
// micro-batch) of the time from its begin event to its end event; a step's, from its first begin to
// its last end. Event times have a resolution of about 0.5 us.
//
// While recording is on (hone::profile::set_enabled, a trace), it also records device zones
// (hone/profile/cuda/zone.hpp): a "step" zone holding the phases on the stream's GPU track.
// The stream must be the model's (hone::trainer::exec().stream); work a phase runs on other
// streams is timed only as far as the stream waits for it. Host header: needs the CUDA runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/cuda/error.hpp"
#include "hone/core/error.hpp"
#include "hone/core/roles.hpp"
#include "hone/profile/cuda/zone.hpp"
#include "hone/profile/phase_timer.hpp"
#include "hone/profile/stats.hpp"
#include "hone/train/policies.hpp"

HONE_NAMESPACE_BEGIN
namespace profile {

class cuda_phase_timer {
 public:
  using role = roles::step_observer;
  static constexpr std::size_t phase_count = phase_timer::phase_count;
  static constexpr std::size_t max_pending_steps = 16;

  /// Times the phases' device work on `stream` (the model's: hone::trainer::exec().stream).
  explicit cuda_phase_timer(cudaStream_t stream) : stream_(stream) { open_.fill(no_run); }
  /// A copy times the same stream and starts with no state (hone::trainer copies its policies
  /// before the first step); the events stay with the original.
  cuda_phase_timer(const cuda_phase_timer& o) : cuda_phase_timer(o.stream_) {}
  ~cuda_phase_timer() {
    for (const step_record& s : pending_) {
      for (const run& r : s.runs) {
        if (r.begin != nullptr) (void)cudaEventDestroy(r.begin);
        if (r.end != nullptr) (void)cudaEventDestroy(r.end);
      }
    }
    for (const auto& r : current_.runs) {
      if (r.begin != nullptr) (void)cudaEventDestroy(r.begin);
      if (r.end != nullptr) (void)cudaEventDestroy(r.end);
    }
    for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
  }
  cuda_phase_timer& operator=(const cuda_phase_timer&) = delete;
  cuda_phase_timer(cuda_phase_timer&& o) noexcept
      : stream_(o.stream_),
        host_(std::move(o.host_)),
        free_(std::move(o.free_)),
        pending_(std::move(o.pending_)),
        current_(std::move(o.current_)),
        open_(o.open_),
        zones_(o.zones_),
        step_zone_(o.step_zone_),
        steps_at_begin_(o.steps_at_begin_),
        device_last_(o.device_last_),
        device_last_total_(o.device_last_total_),
        device_stats_(o.device_stats_),
        device_step_stats_(o.device_step_stats_),
        created_(o.created_),
        error_(std::move(o.error_)) {
    o.free_.clear();
    o.pending_.clear();
    o.current_ = {};
    o.open_.fill(no_run);
  }
  cuda_phase_timer& operator=(cuda_phase_timer&&) = delete;

  /// Throws hone::cuda_error when an event cannot be recorded (or one of an earlier phase_end
  /// could not: phase_end does not throw).
  void phase_begin(step_phase p) {
    rethrow();
    const auto i = static_cast<std::size_t>(p);
    if (current_.runs.empty()) {
      resolve(false);  // a step begins: read the finished ones
      if (pending_.size() >= max_pending_steps) resolve_front(true);
      if (enabled()) step_zone_ = detail::cuda_event_pool::get().begin(stream_, "step");
    }
    run r{p, take(), take()};
    const cudaError_t st = cudaEventRecord(r.begin, stream_);
    if (st != cudaSuccess) {
      free_.push_back(r.begin);
      free_.push_back(r.end);
      ::hone::detail::cuda_check(st, "cudaEventRecord (hone::profile::cuda_phase_timer)");
    }
    open_[i] = current_.runs.size();
    current_.runs.push_back(r);
    zones_[i] = enabled() ? detail::cuda_event_pool::get().begin(stream_, to_string(p))
                          : detail::cuda_event_pool::ticket{};
    host_.phase_begin(p);
  }

  void phase_end(step_phase p) noexcept {
    const auto i = static_cast<std::size_t>(p);
    host_.phase_end(p);
    if (zones_[i].t != nullptr) detail::cuda_event_pool::get().end(zones_[i]);
    zones_[i] = {};
    if (open_[i] < current_.runs.size()) {
      const cudaError_t st = cudaEventRecord(current_.runs[open_[i]].end, stream_);
      if (st != cudaSuccess && error_.empty()) {
        error_ = std::string("cudaEventRecord (hone::profile::cuda_phase_timer, phase ") +
                 to_string(p) + ") failed: " + cudaGetErrorString(st);
      }
      if (st != cudaSuccess) current_.runs[open_[i]].failed = true;
    }
    open_[i] = no_run;
    if (host_.steps() != steps_at_begin_) {  // the host timer closed the step
      steps_at_begin_ = host_.steps();
      if (step_zone_.t != nullptr) detail::cuda_event_pool::get().end(step_zone_);
      step_zone_ = {};
      pending_.push_back(std::move(current_));
      current_ = {};
    }
  }

  // ---- host times (hone::profile::phase_timer's; the trainer's step_report gets these) ----
  [[nodiscard]] double last_step_ns(step_phase p) const { return host_.last_step_ns(p); }
  [[nodiscard]] double last_step_ns() const { return host_.last_step_ns(); }
  [[nodiscard]] std::uint64_t steps() const noexcept { return host_.steps(); }
  [[nodiscard]] std::uint64_t steps_failed() const noexcept { return host_.steps_failed(); }
  [[nodiscard]] summary_row stats(step_phase p) const { return host_.stats(p); }
  [[nodiscard]] const phase_timer& host() const noexcept { return host_; }

  // ---- device times ----
  /// Device time of phase p in the last step whose device work is known (summed over its runs).
  [[nodiscard]] double device_last_step_ns(step_phase p) const {
    return device_last_[static_cast<std::size_t>(p)];
  }
  /// Device time of that whole step, first begin to last end.
  [[nodiscard]] double device_last_step_ns() const { return device_last_total_; }
  /// Steps whose device times are known (the last of them is device_last_step_ns's).
  [[nodiscard]] std::uint64_t device_steps() const noexcept { return device_step_stats_.count(); }
  /// Statistics of phase p's device times, per run, in nanoseconds.
  [[nodiscard]] summary_row device_stats(step_phase p) const {
    return make_row(std::string(to_string(p)) + " (device)",
                    device_stats_[static_cast<std::size_t>(p)], 1.0);
  }
  /// CUDA events this timer created (reused from step to step).
  [[nodiscard]] std::size_t events_created() const noexcept { return created_; }

  /// Waits for the device work of every finished step and reads its times.
  void synchronize() {
    rethrow();
    resolve(true);
  }

  /// phase_timer's rows (host times), then one "<phase> (device)" row per phase that ran and
  /// "step (device)" for the steps resolved so far.
  [[nodiscard]] std::vector<summary_row> summary() const {
    std::vector<summary_row> rows = host_.summary();
    static constexpr step_phase order[] = {step_phase::checkpoint, step_phase::forward_backward,
                                           step_phase::unscale,    step_phase::reduce,
                                           step_phase::check,      step_phase::optimizer};
    for (const step_phase p : order) {
      if (device_stats_[static_cast<std::size_t>(p)].count() > 0) rows.push_back(device_stats(p));
    }
    if (device_step_stats_.count() > 0)
      rows.push_back(make_row("step (device)", device_step_stats_, 1.0));
    return rows;
  }
  void print_summary(std::ostream& os) const { profile::print_summary(os, summary()); }

  /// Forgets every statistic, host and device (a warm-up excluded).
  void reset() {
    host_.reset();
    steps_at_begin_ = host_.steps();
    for (auto& s : device_stats_) s = duration_stats{};
    device_step_stats_ = duration_stats{};
  }

 private:
  static constexpr std::size_t no_run = ~std::size_t{0};

  struct run {
    step_phase phase{};
    cudaEvent_t begin = nullptr;
    cudaEvent_t end = nullptr;
    bool failed = false;
  };
  struct step_record {
    std::vector<run> runs;
  };

  void rethrow() {
    if (!error_.empty()) {
      const std::string e = std::exchange(error_, {});
      throw cuda_error(e, 0);
    }
  }

  cudaEvent_t take() {
    if (free_.empty()) {
      cudaEvent_t e = nullptr;
      HONE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
      ++created_;
      return e;
    }
    const cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }

  /// Reads the finished steps in order; with `wait`, waits for each.
  void resolve(bool wait) {
    while (!pending_.empty() && resolve_front(wait)) {
    }
  }

  /// Reads the oldest pending step if its events completed (with `wait`: after waiting for
  /// them); returns whether it did.
  bool resolve_front(bool wait) {
    step_record& s = pending_.front();
    if (!s.runs.empty()) {
      const cudaEvent_t last = s.runs.back().end;
      if (wait) {
        HONE_CUDA_CHECK(cudaEventSynchronize(last));
      } else {
        const cudaError_t st = cudaEventQuery(last);
        if (st == cudaErrorNotReady) return false;
        ::hone::detail::cuda_check(st, "cudaEventQuery (hone::profile::cuda_phase_timer)");
      }
      std::array<double, phase_count> sums{};
      bool ok = true;
      for (const run& r : s.runs) {
        if (r.failed) {
          ok = false;
          continue;
        }
        float ms = 0.0f;
        HONE_CUDA_CHECK(cudaEventElapsedTime(&ms, r.begin, r.end));
        const double ns = static_cast<double>(ms) * 1e6;
        sums[static_cast<std::size_t>(r.phase)] += ns;
        device_stats_[static_cast<std::size_t>(r.phase)].add(
            static_cast<std::uint64_t>(ns > 0.0 ? ns : 0.0));
      }
      float total_ms = 0.0f;
      if (ok) HONE_CUDA_CHECK(cudaEventElapsedTime(&total_ms, s.runs.front().begin, last));
      if (ok) {
        device_last_ = sums;
        device_last_total_ = static_cast<double>(total_ms) * 1e6;
        device_step_stats_.add(
            static_cast<std::uint64_t>(device_last_total_ > 0.0 ? device_last_total_ : 0.0));
      }
      for (const run& r : s.runs) {
        free_.push_back(r.begin);
        free_.push_back(r.end);
      }
    }
    pending_.pop_front();
    return true;
  }

  cudaStream_t stream_;
  phase_timer host_{};
  std::vector<cudaEvent_t> free_;
  std::deque<step_record> pending_;  // finished steps whose device times are not read yet
  step_record current_;              // the step in progress
  std::array<std::size_t, phase_count> open_{};
  std::array<detail::cuda_event_pool::ticket, phase_count> zones_{};
  detail::cuda_event_pool::ticket step_zone_{};
  std::uint64_t steps_at_begin_ = 0;
  std::array<double, phase_count> device_last_{};
  double device_last_total_ = 0.0;
  std::array<duration_stats, phase_count> device_stats_{};
  duration_stats device_step_stats_{};
  std::size_t created_ = 0;
  std::string error_;
};

}  // namespace profile
HONE_NAMESPACE_END
