// hone/profile/phase_timer.hpp: hone::profile::phase_timer, a step observer (role
// step_observer of hone::trainer) that times each phase of each step: it records every phase as a
// zone inside a "step" zone (so a trace shows the trainer's phases step by step, while recording
// is enabled), keeps the last step's time per phase, and keeps count, total, mean, p50/p95/p99 and
// max per phase and for whole steps over every step since construction (or reset()).
//
//   hone::trainer t(model, hone::adamw{...}, hone::profile::phase_timer{});
//   for (...) t.step(batch);
//   t.observer().print_summary(std::cout);
//   double fb_ms = t.observer().last_step_ns(hone::step_phase::forward_backward) / 1e6;
//
// A step is the span from its first phase (the checkpoint role's before_step) to the end of its
// last (after_step); a step that throws ends with the phase that threw (its times are kept, and
// steps_failed() counts it). Phases that run several times in a step (forward_backward and
// unscale, once per micro-batch) add up in last_step_ns and count once per run in the statistics.
// Its zones go through hone::profile::begin_zone/end_zone, so they follow the run-time switch
// (hone::profile::set_enabled) but not HONE_PROFILE_DISABLED, which removes the macros only. The
// timer costs two stamps per phase (hone/profile/clock.hpp), about 30 ns per phase on the
// machine measured, and makes no allocation after construction.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <ostream>
#include <string>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/roles.hpp"
#include "hone/profile/clock.hpp"
#include "hone/profile/stats.hpp"
#include "hone/profile/zone.hpp"
#include "hone/train/policies.hpp"

HONE_NAMESPACE_BEGIN
namespace profile {

class phase_timer {
 public:
  using role = roles::step_observer;
  static constexpr std::size_t phase_count = 6;  // the enumerators of hone::step_phase

  void phase_begin(step_phase p) noexcept {
    const std::uint64_t now = detail::ticks();
    if (!in_step_) {
      in_step_ = true;
      seen_other_ = false;
      step_begin_ = now;
      current_.fill(0);
      step_zone_ = begin_zone("step");
    }
    if (p != step_phase::checkpoint) seen_other_ = true;
    const auto i = static_cast<std::size_t>(p);
    begin_[i] = now;
    uncaught_[i] = std::uncaught_exceptions();
    zone_open_[i] = begin_zone(to_string(p));
  }

  void phase_end(step_phase p) noexcept {
    const auto i = static_cast<std::size_t>(p);
    end_zone(to_string(p), zone_open_[i]);
    const std::uint64_t now = detail::ticks();
    const std::uint64_t d = now - begin_[i];
    current_[i] += d;
    stats_[i].add(d);
    const bool threw = std::uncaught_exceptions() > uncaught_[i];
    // The after_step checkpoint (a checkpoint phase after the step's other phases) ends the step.
    if (threw || (p == step_phase::checkpoint && seen_other_)) {
      end_zone("step", step_zone_);
      in_step_ = false;
      last_ = current_;
      last_total_ = now - step_begin_;
      step_stats_.add(last_total_);
      if (threw) ++failed_;
    }
  }

  /// Time of phase p in the last finished step, in nanoseconds (summed over its runs).
  [[nodiscard]] double last_step_ns(step_phase p) const {
    return cal().duration_ns(static_cast<double>(last_[static_cast<std::size_t>(p)]));
  }
  /// Time of the whole last finished step, in nanoseconds.
  [[nodiscard]] double last_step_ns() const {
    return cal().duration_ns(static_cast<double>(last_total_));
  }
  /// Steps finished (including those that threw) and steps that threw.
  [[nodiscard]] std::uint64_t steps() const noexcept { return step_stats_.count(); }
  [[nodiscard]] std::uint64_t steps_failed() const noexcept { return failed_; }

  /// Statistics of phase p's runs, in nanoseconds.
  [[nodiscard]] summary_row stats(step_phase p) const {
    return make_row(to_string(p), stats_[static_cast<std::size_t>(p)], cal().ns_per_tick());
  }
  /// One row per phase that ran (in step order), then "step" for whole steps.
  [[nodiscard]] std::vector<summary_row> summary() const {
    static constexpr step_phase order[] = {step_phase::checkpoint, step_phase::forward_backward,
                                           step_phase::unscale,    step_phase::reduce,
                                           step_phase::check,      step_phase::optimizer};
    std::vector<summary_row> rows;
    for (const step_phase p : order) {
      if (stats_[static_cast<std::size_t>(p)].count() > 0) rows.push_back(stats(p));
    }
    rows.push_back(make_row("step", step_stats_, cal().ns_per_tick()));
    return rows;
  }
  /// Prints summary() as a table (hone::profile::print_summary).
  void print_summary(std::ostream& os) const { profile::print_summary(os, summary()); }

  /// Forgets every statistic (a warm-up excluded, say); a step in progress is not affected.
  void reset() {
    for (auto& s : stats_) s = duration_stats{};
    step_stats_ = duration_stats{};
    failed_ = 0;
  }

 private:
  static const clock_calibration& cal() { return clock_calibration::get(); }

  std::array<duration_stats, phase_count> stats_{};
  duration_stats step_stats_{};
  std::array<std::uint64_t, phase_count> begin_{};
  std::array<int, phase_count> uncaught_{};
  std::array<bool, phase_count> zone_open_{};
  std::array<std::uint64_t, phase_count> current_{};
  std::array<std::uint64_t, phase_count> last_{};
  std::uint64_t last_total_ = 0;
  std::uint64_t step_begin_ = 0;
  std::uint64_t failed_ = 0;
  bool in_step_ = false;
  bool seen_other_ = false;
  bool step_zone_ = false;
};

}  // namespace profile
HONE_NAMESPACE_END
