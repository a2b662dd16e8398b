// hone/train/early_stopping.hpp: stop training when a monitored metric stops improving, and keep
// a copy of the weights that gave its best value.
//
//   hone::early_stopping stop({.mode = hone::monitor_mode::min, .patience = 5, .min_delta = 1e-4});
//   hone::best_weights_keeper best;
//   best.track(std::span(master_weights));            // float, bfloat16, ... host arrays
//   for (std::uint64_t step = 0;; ++step) {
//     train_one_epoch();
//     if (stop.update(validation_loss(), step, best)) break;   // snapshots on each new best
//   }
//   best.restore();                                    // back to the best weights
//
// Semantics are PyTorch Lightning's EarlyStopping (callbacks/early_stopping.py):
//   - improvement: metric + min_delta < best in min mode, metric - min_delta > best in max mode
//     (that is, metric < best - min_delta: a change of exactly min_delta is not an improvement);
//     best starts at +inf (min) or -inf (max), so the first finite metric always improves;
//   - an improvement sets best and resets the wait count; anything else increments it, and
//     training should stop once wait_count >= patience (patience = 0: at the first check without
//     improvement);
//   - check_finite (default true, as Lightning): a NaN or infinite metric stops at once and is not
//     recorded. With check_finite = false a NaN metric counts as no improvement (every
//     comparison with NaN is false), +inf likewise, and -inf (min mode) is a new best;
//   - stopping_threshold: stop once the metric is better than it (strictly);
//     divergence_threshold: stop once the metric is worse than it (strictly).
// Resuming: state() returns everything update() has accumulated (best value and step, wait
// count, checks, the stop decision) and restore() puts it back into an early_stopping with the
// same options, so a resumed run stops at the same check as one that never stopped;
// best_weights_keeper's snapshot_bytes() / restore_snapshot() do the same for the best weights.
// hone/checkpoint/trainer_checkpoint.hpp saves both in a checkpoint (state.json and
// best.safetensors).
//
// As a trainer role (hone::early_stopping_policy, role early_stopping), the trainer owns the
// monitor and a keeper of its fp32 master weights: trainer::observe_metric(metric) checks at the
// trainer's step, trainer::restore_best_weights() puts the best weights back into the model, and
// hone::checkpoint::capture / restore save and restore both with the trainer's own state.
//
// One deliberate difference: Lightning checks the two thresholds before the improvement and so
// does not record a metric that crossed the stopping threshold as the best; hone records the
// improvement first (the metric that reached the target is the best one, and the weights kept by
// best_weights_keeper are its weights), then checks the thresholds and the patience.
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/train/policies.hpp"

HONE_NAMESPACE_BEGIN

namespace detail {
template <class T>
inline constexpr bool keeper_is_span_v = false;
template <class T, std::size_t N>
inline constexpr bool keeper_is_span_v<std::span<T, N>> = true;

/// Shortest text that reads back as `v` ("0.25", "1e-05", "nan").
inline std::string early_stopping_number(double v) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof(text), v);
  return std::string(text, result.ptr);
}
}  // namespace detail

/// Keeps a copy of a set of host arrays (master weights, optimizer state, ...) and copies it back.
///
/// track() registers arrays of any trivially copyable element type (float, hone::bfloat16,
/// hone::half, double, ...); snapshot() copies all of them into one owned buffer; restore()
/// copies that buffer back, bit for bit. The tracked memory must outlive the keeper and keep its
/// address (a std::vector that reallocates invalidates its span: track it again).
class best_weights_keeper {
 public:
  best_weights_keeper() = default;

  /// Registers `values` (host memory). Any earlier snapshot is discarded, since it does not
  /// cover the new array.
  template <class T, std::size_t N>
  best_weights_keeper& track(std::span<T, N> values) {
    static_assert(!std::is_const_v<T>,
                  "hone::best_weights_keeper::track: the array is const, so restore() could not "
                  "write it back. Pass a span of mutable elements.");
    static_assert(std::is_trivially_copyable_v<T>,
                  "hone::best_weights_keeper::track: the element type must be trivially copyable "
                  "(float, hone::bfloat16, hone::half, double, ...): snapshots copy bytes.");
    if (values.size_bytes() > 0) {
      arrays_.push_back({reinterpret_cast<std::byte*>(values.data()), values.size_bytes()});
      bytes_ += values.size_bytes();
    }
    discard();
    return *this;
  }

  /// Registers a contiguous range that owns or views mutable elements (std::vector<float>&,
  /// std::array, hone::buffer views, ...). Temporaries that own their elements are refused:
  /// their memory would be gone before restore().
  template <class R>
  requires std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
      (std::is_lvalue_reference_v<R> || std::ranges::borrowed_range<R>)&&(
          !detail::keeper_is_span_v<std::remove_cvref_t<R>>)best_weights_keeper& track(R&& range) {
    return track(std::span<std::remove_reference_t<std::ranges::range_reference_t<R>>>(
        std::ranges::data(range), std::ranges::size(range)));
  }

  /// Copies every tracked array into the keeper (allocating its buffer on first use).
  void snapshot() {
    storage_.resize(bytes_);
    std::size_t offset = 0;
    for (const auto& a : arrays_) {
      std::memcpy(storage_.data() + offset, a.data, a.bytes);
      offset += a.bytes;
    }
    has_snapshot_ = true;
  }

  /// Copies the last snapshot back into the tracked arrays. Throws hone::config_error when there
  /// is none (no snapshot() yet, or track() was called after it).
  void restore() const {
    HONE_REQUIRE(has_snapshot_,
                 "hone::best_weights_keeper::restore: there is no snapshot to restore. Call "
                 "snapshot() (or early_stopping::update(metric, step, keeper), which snapshots on "
                 "each new best) after the last track().");
    std::size_t offset = 0;
    for (const auto& a : arrays_) {
      std::memcpy(a.data, storage_.data() + offset, a.bytes);
      offset += a.bytes;
    }
  }

  /// The bytes of the last snapshot (the tracked arrays back to back, in track() order); empty
  /// when there is none. What a checkpoint saves to restore the best weights after a resume.
  [[nodiscard]] std::span<const std::byte> snapshot_bytes() const noexcept {
    return has_snapshot_ ? std::span<const std::byte>(storage_.data(), bytes_)
                         : std::span<const std::byte>();
  }

  /// Makes `bytes` (a snapshot_bytes() of a keeper tracking arrays of the same sizes) the
  /// snapshot, without touching the tracked arrays; restore() then copies it back. Throws
  /// hone::config_error when the size differs from bytes().
  void restore_snapshot(std::span<const std::byte> bytes) {
    HONE_REQUIRE(bytes.size() == bytes_,
                 "hone::best_weights_keeper::restore_snapshot: the saved snapshot has " +
                     std::to_string(bytes.size()) + " bytes, the tracked arrays " +
                     std::to_string(bytes_) + "; track the same arrays as the run that saved it.");
    storage_.assign(bytes.begin(), bytes.end());
    has_snapshot_ = true;
  }

  /// Forgets the snapshot (the buffer stays allocated).
  void discard() noexcept { has_snapshot_ = false; }

  /// Forgets every tracked array and the snapshot, and frees the buffer.
  void clear() noexcept {
    arrays_.clear();
    storage_.clear();
    storage_.shrink_to_fit();
    bytes_ = 0;
    has_snapshot_ = false;
  }

  [[nodiscard]] bool has_snapshot() const noexcept { return has_snapshot_; }
  /// Number of tracked (non-empty) arrays.
  [[nodiscard]] std::size_t tracked() const noexcept { return arrays_.size(); }
  /// Total size of the tracked arrays, i.e. of a snapshot, in bytes.
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  struct array {
    std::byte* data;
    std::size_t bytes;
  };
  std::vector<array> arrays_;
  std::vector<std::byte> storage_;
  std::size_t bytes_ = 0;
  bool has_snapshot_ = false;
};

/// Whether a smaller (min) or a larger (max) metric is better.
enum class monitor_mode { min, max };

/// Why early_stopping said stop.
enum class stop_reason {
  none,                 ///< it has not
  patience,             ///< patience checks in a row without improvement
  non_finite,           ///< the metric was NaN or infinite (check_finite)
  stopping_threshold,   ///< the metric became better than stopping_threshold
  divergence_threshold  ///< the metric became worse than divergence_threshold
};

/// The enumerator's name ("none", "patience", ...).
inline const char* to_string(stop_reason reason) noexcept {
  switch (reason) {
    case stop_reason::none:
      return "none";
    case stop_reason::patience:
      return "patience";
    case stop_reason::non_finite:
      return "non_finite";
    case stop_reason::stopping_threshold:
      return "stopping_threshold";
    case stop_reason::divergence_threshold:
      return "divergence_threshold";
  }
  return "unknown";
}

/// Options of hone::early_stopping; the defaults are Lightning's.
struct early_stopping_options {
  /// min: a lower metric is better (a loss); max: a higher one is (an accuracy).
  monitor_mode mode = monitor_mode::min;
  /// Checks in a row without improvement after which training should stop.
  std::uint64_t patience = 3;
  /// An improvement must beat the best value by more than this; >= 0.
  double min_delta = 0.0;
  /// Stop at once on a NaN or infinite metric (true), or count it as no improvement (false).
  bool check_finite = true;
  /// Stop as soon as the metric is better than this (the target is reached).
  std::optional<double> stopping_threshold = std::nullopt;
  /// Stop as soon as the metric is worse than this (training diverged).
  std::optional<double> divergence_threshold = std::nullopt;
};

/// Everything early_stopping accumulates between checks (see early_stopping::state()).
struct early_stopping_state {
  double best = std::numeric_limits<double>::infinity();  ///< +-inf before the first improvement
  std::optional<std::uint64_t> best_step;
  std::optional<std::uint64_t> stop_step;
  double last = std::numeric_limits<double>::quiet_NaN();
  std::uint64_t wait_count = 0;
  std::uint64_t stop_wait = 0;
  double stop_metric = 0.0;
  std::uint64_t checks = 0;
  bool improved = false;
  stop_reason reason = stop_reason::none;
};

/// The stop_reason named `name` (to_string's text), or nullopt.
inline std::optional<stop_reason> stop_reason_from_string(std::string_view name) noexcept {
  for (const auto r : {stop_reason::none, stop_reason::patience, stop_reason::non_finite,
                       stop_reason::stopping_threshold, stop_reason::divergence_threshold}) {
    if (name == to_string(r)) return r;
  }
  return std::nullopt;
}

/// Monitors one metric, checked by update() once per evaluation (see the file comment).
class early_stopping {
 public:
  /// Throws hone::config_error for a negative or non-finite min_delta or a non-finite threshold.
  explicit early_stopping(early_stopping_options options = {}) : options_(checked(options)) {
    reset();
  }

  /// Records one check of the metric, at step checks() (the number of earlier checks). Returns
  /// true when training should stop: now or at an earlier check (stopping is sticky until
  /// reset(); later checks are still recorded).
  bool update(double metric) { return update(metric, checks_); }

  /// Records one check of the metric at `step` (the caller's epoch or update index, reported by
  /// best_step()). Returns true when training should stop.
  bool update(double metric, std::uint64_t step) {
    ++checks_;
    improved_ = false;
    stop_reason now = stop_reason::none;
    if (options_.check_finite && !std::isfinite(metric)) {
      now = stop_reason::non_finite;
    } else {
      if (is_improvement(metric)) {
        best_ = metric;
        best_step_ = step;
        wait_count_ = 0;
        improved_ = true;
      } else {
        ++wait_count_;
      }
      if (options_.stopping_threshold && better(metric, *options_.stopping_threshold)) {
        now = stop_reason::stopping_threshold;
      } else if (options_.divergence_threshold && better(*options_.divergence_threshold, metric)) {
        now = stop_reason::divergence_threshold;
      } else if (!improved_ && wait_count_ >= options_.patience) {
        now = stop_reason::patience;
      }
    }
    last_ = metric;
    if (reason_ == stop_reason::none && now != stop_reason::none) {
      reason_ = now;
      stop_step_ = step;
      stop_wait_ = wait_count_;
      stop_metric_ = metric;
    }
    return reason_ != stop_reason::none;
  }

  /// As update(metric, step), and snapshots `keeper` when the metric is a new best.
  bool update(double metric, std::uint64_t step, best_weights_keeper& keeper) {
    const bool stop = update(metric, step);
    if (improved_) keeper.snapshot();
    return stop;
  }

  /// True once a check has said stop (until reset()).
  [[nodiscard]] bool should_stop() const noexcept { return reason_ != stop_reason::none; }
  /// Why it stopped (stop_reason::none while it has not).
  [[nodiscard]] stop_reason reason() const noexcept { return reason_; }
  /// Whether the last check was a new best.
  [[nodiscard]] bool improved() const noexcept { return improved_; }
  /// The best metric so far: +inf (min mode) or -inf (max mode) before the first improvement.
  [[nodiscard]] double best() const noexcept { return best_; }
  /// The step of the best metric, or std::nullopt before the first improvement.
  [[nodiscard]] std::optional<std::uint64_t> best_step() const noexcept { return best_step_; }
  /// The step of the check that said stop, or std::nullopt while it has not.
  [[nodiscard]] std::optional<std::uint64_t> stop_step() const noexcept { return stop_step_; }
  /// The metric of the last check (NaN before the first).
  [[nodiscard]] double last() const noexcept { return last_; }
  /// Checks in a row without improvement.
  [[nodiscard]] std::uint64_t wait_count() const noexcept { return wait_count_; }
  /// Number of update() calls since construction or reset().
  [[nodiscard]] std::uint64_t checks() const noexcept { return checks_; }
  [[nodiscard]] const early_stopping_options& options() const noexcept { return options_; }

  /// A sentence saying where things stand, for logs.
  [[nodiscard]] std::string message() const {
    const std::string best_text = best_step_ ? detail::early_stopping_number(best_) + " at step " +
                                                   std::to_string(*best_step_)
                                             : "none yet";
    switch (reason_) {
      case stop_reason::none:
        return "early stopping: continuing; best " + best_text + ", " +
               std::to_string(wait_count_) + " of " + std::to_string(options_.patience) +
               " checks without improvement.";
      case stop_reason::patience:
        return "early stopping: the metric did not improve for " + std::to_string(stop_wait_) +
               (stop_wait_ == 1 ? " check" : " checks") + " (patience " +
               std::to_string(options_.patience) + "); best " + best_text + ".";
      case stop_reason::non_finite:
        return "early stopping: the metric became " + detail::early_stopping_number(stop_metric_) +
               " at step " + std::to_string(*stop_step_) + "; best " + best_text + ".";
      case stop_reason::stopping_threshold:
        return "early stopping: the metric reached the stopping threshold " +
               detail::early_stopping_number(*options_.stopping_threshold) + "; best " + best_text +
               ".";
      case stop_reason::divergence_threshold:
        return "early stopping: the metric crossed the divergence threshold " +
               detail::early_stopping_number(*options_.divergence_threshold) + "; best " +
               best_text + ".";
    }
    return {};
  }

  /// Everything update() has accumulated, for a checkpoint.
  [[nodiscard]] early_stopping_state state() const noexcept {
    return {best_,      best_step_,   stop_step_, last_,     wait_count_,
            stop_wait_, stop_metric_, checks_,    improved_, reason_};
  }

  /// Puts back a state() saved from an early_stopping with the same options: later update()s
  /// behave exactly as they would have in the saved object. Throws hone::config_error when the
  /// state is inconsistent (a stop reason without a stop step or the reverse, a best step with an
  /// infinite best, more waits than checks).
  void restore(const early_stopping_state& s) {
    HONE_REQUIRE(
        (s.reason == stop_reason::none) == !s.stop_step.has_value(),
        "hone::early_stopping::restore: the state has a stop reason without a stop step, or "
        "a stop step without a reason; it was not produced by state().");
    HONE_REQUIRE(s.wait_count <= s.checks && s.stop_wait <= s.checks,
                 "hone::early_stopping::restore: the state counts more checks without improvement "
                 "than checks; it was not produced by state().");
    HONE_REQUIRE(!s.best_step || !std::isinf(s.best) || !options_.check_finite,
                 "hone::early_stopping::restore: the state has a best step but an infinite best "
                 "value; it was not produced by state() with these options.");
    best_ = s.best;
    best_step_ = s.best_step;
    stop_step_ = s.stop_step;
    last_ = s.last;
    wait_count_ = s.wait_count;
    stop_wait_ = s.stop_wait;
    stop_metric_ = s.stop_metric;
    checks_ = s.checks;
    improved_ = s.improved;
    reason_ = s.reason;
  }

  /// Back to the state after construction (same options).
  void reset() noexcept {
    best_ = options_.mode == monitor_mode::min ? std::numeric_limits<double>::infinity()
                                               : -std::numeric_limits<double>::infinity();
    best_step_.reset();
    stop_step_.reset();
    last_ = std::numeric_limits<double>::quiet_NaN();
    wait_count_ = 0;
    stop_wait_ = 0;
    stop_metric_ = 0.0;
    checks_ = 0;
    improved_ = false;
    reason_ = stop_reason::none;
  }

 private:
  // The options' checks, on the caller's copy (out of line: g++ -O1 with sanitizers reads the
  // optional thresholds of a member under construction as maybe-uninitialized).
  [[gnu::noinline]] static early_stopping_options checked(const early_stopping_options& o) {
    HONE_REQUIRE(
        std::isfinite(o.min_delta) && o.min_delta >= 0.0,
        "hone::early_stopping: min_delta must be a finite number >= 0 (how much better than "
        "the best value a metric must be to count as an improvement), got " +
            detail::early_stopping_number(o.min_delta) + ".");
    HONE_REQUIRE(!o.stopping_threshold || std::isfinite(*o.stopping_threshold),
                 "hone::early_stopping: stopping_threshold must be finite (or unset).");
    HONE_REQUIRE(!o.divergence_threshold || std::isfinite(*o.divergence_threshold),
                 "hone::early_stopping: divergence_threshold must be finite (or unset).");
    return o;
  }
  // a is strictly better than b.
  [[nodiscard]] bool better(double a, double b) const noexcept {
    return options_.mode == monitor_mode::min ? a < b : a > b;
  }
  // Lightning: monitor_op(current - min_delta, best) with min_delta negated in min mode.
  [[nodiscard]] bool is_improvement(double metric) const noexcept {
    return options_.mode == monitor_mode::min ? metric + options_.min_delta < best_
                                              : metric - options_.min_delta > best_;
  }

  early_stopping_options options_;
  double best_ = 0.0;
  std::optional<std::uint64_t> best_step_;
  std::optional<std::uint64_t> stop_step_;
  double last_ = 0.0;
  std::uint64_t wait_count_ = 0;
  std::uint64_t stop_wait_ = 0;
  double stop_metric_ = 0.0;
  std::uint64_t checks_ = 0;
  bool improved_ = false;
  stop_reason reason_ = stop_reason::none;
};

class early_stopping_engine;

/// Role early stopping of hone::trainer: the trainer monitors one metric that the caller measures
/// and feeds it (trainer::observe_metric), and keeps the weights of the best check when
/// keep_best_weights is set:
///
///   hone::trainer t(net, hone::adamw{}, hone::checkpoint::every_n_steps{...},
///                   hone::early_stopping_policy{.options = {.patience = 5, .min_delta = 1e-4},
///                                               .keep_best_weights = true});
///   for (;;) {
///     t.step(batch);
///     if (time_to_validate && t.observe_metric(validation_loss())) break;
///   }
///   t.restore_best_weights();
///
/// The counters, the best value and step, the stop decision and the best weights travel in the
/// trainer's checkpoints (hone::checkpoint::capture and restore carry them), so a resumed run
/// stops at the same check as one that never stopped.
struct early_stopping_policy {
  using role = roles::early_stopping;
  using engine = early_stopping_engine;
  early_stopping_options options{};
  /// Keep a host copy of the fp32 master weights of the best check (as much host memory as the
  /// master weights), for trainer::restore_best_weights() and the checkpoints' best.safetensors.
  /// Needs host master weights: a host model, or a CUDA model with the offload role. With
  /// hone::zero's sharded master weights each rank keeps the copy of its shard; every rank must
  /// then observe the same metric (as for any data-parallel stop decision), so that they keep
  /// the same step's weights.
  bool keep_best_weights = false;
};

/// The trainer-side object of early_stopping_policy: the monitor and the keeper of the best
/// weights (tracking the trainer's fp32 master weights when the policy keeps them).
class early_stopping_engine {
 public:
  using monitor_type = early_stopping;

  explicit early_stopping_engine(const early_stopping_policy& p)
      : monitor_(p.options), keep_(p.keep_best_weights) {}

  /// Called once by the trainer after binding its memory: the keeper tracks its master weights.
  /// Throws hone::config_error when the policy keeps best weights but the master weights are
  /// device memory (a CUDA model without the offload role).
  template <class Trainer>
  void bind(Trainer& t) {
    if (!keep_) return;
    if constexpr (std::is_same_v<decltype(t.master_weights()), std::span<float>>) {
      // hone::zero with sharded master weights: this rank's shard (each rank keeps the best
      // weights of its own shard; restore_best gathers them into the model)
      keeper_.track(t.master_weights());
    } else {
      HONE_REQUIRE(
          false,
          "hone::early_stopping_policy: keep_best_weights needs the trainer's master weights "
          "in host memory, but this trainer keeps them on the CUDA device. Set "
          "keep_best_weights = false, or add the offload role "
          "(hone::offload::optimizer_to_host), which keeps them on the host.");
    }
  }

  /// Records one check of `metric` at the trainer's step (its count of applied updates) and, on
  /// a new best, snapshots the master weights when they are kept. Returns whether training should
  /// stop.
  template <class Trainer>
  bool observe(Trainer& t, double metric) {
    if (!keep_) return monitor_.update(metric, t.steps_done());
    (void)t.master_weights();  // waits for a pending delayed (offloaded) update
    return monitor_.update(metric, t.steps_done(), keeper_);
  }

  /// Copies the best weights back into the trainer's master weights and publishes them into the
  /// model (collective with hone::zero's sharded master weights: every rank calls it). Throws
  /// hone::config_error when the weights are not kept, or there is no best yet.
  template <class Trainer>
  void restore_best(Trainer& t) {
    HONE_REQUIRE(keep_,
                 "hone::trainer::restore_best_weights: the early-stopping policy does not keep the "
                 "best weights; set keep_best_weights = true in hone::early_stopping_policy.");
    HONE_REQUIRE(
        keeper_.has_snapshot(),
        "hone::trainer::restore_best_weights: there are no best weights yet; no "
        "observe_metric() has been an improvement since the trainer was built or restored.");
    (void)t.master_weights();  // waits for a pending delayed (offloaded) update
    keeper_.restore();
    t.publish_weights();
  }

  [[nodiscard]] early_stopping& monitor() noexcept { return monitor_; }
  [[nodiscard]] const early_stopping& monitor() const noexcept { return monitor_; }
  /// The keeper of the best weights (empty, tracking nothing, unless keeps_best_weights()).
  [[nodiscard]] best_weights_keeper& keeper() noexcept { return keeper_; }
  [[nodiscard]] const best_weights_keeper& keeper() const noexcept { return keeper_; }
  [[nodiscard]] bool keeps_best_weights() const noexcept { return keep_; }

 private:
  early_stopping monitor_;
  best_weights_keeper keeper_;
  bool keep_;
};

HONE_NAMESPACE_END
