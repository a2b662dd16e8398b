// hone/rl/variable_batch.hpp: a batch size that grows with the measured gradient noise scale.
//
// McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training": with G the
// true gradient and Sigma the per-sample gradient covariance, the "simple" noise scale
// B_simple = tr(Sigma) / |G|^2 is (near) the critical batch size: below it a bigger batch buys an
// almost proportional speed-up, above it little. B_simple grows as training proceeds (|G| falls),
// so a batch that follows it wastes less compute early and less time late.
//
// Estimators (the paper's appendix A). A batch of B samples has E|G_B|^2 = |G|^2 + tr(Sigma)/B.
//  - Two batch sizes b < B (e.g. per-worker and all-reduced gradients, which data-parallel training
//    has for free): |G|^2 ~ (B |G_B|^2 - b |G_b|^2) / (B - b) and
//    tr(Sigma) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B); both unbiased.
//  - Per-sample gradients g_1..g_B of one batch with mean m: tr(Sigma) ~ sum |g_i - m|^2 / (B - 1),
//    |G|^2 ~ |m|^2 - tr(Sigma) / B.
// Single estimates are very noisy (the |G|^2 one can be negative), so the policy keeps an
// exponential moving average of each and divides the averages, as the paper recommends.
//
// Policy: batch = clamp(scale * B_simple, min_batch, max_batch), rounded up to a multiple of
// `multiple_of`, never more than `max_growth` times the previous size per update, and (unless
// allow_shrink) never smaller than before. Until `warmup` observations have been made the batch
// stays at min_batch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN

/// One estimate of the two moments B_simple is made of.
struct noise_moments {
  double trace_sigma = 0.0;  ///< tr(Sigma): the per-sample gradient variance summed over params
  double grad_sq = 0.0;      ///< |G|^2: the squared norm of the true gradient
};

/// The unbiased two-batch-size estimate from |G_small|^2 (batch b_small) and |G_big|^2 (b_big).
[[nodiscard]] inline noise_moments noise_moments_from_two_batches(double small_sq_norm,
                                                                  std::size_t b_small,
                                                                  double big_sq_norm,
                                                                  std::size_t b_big) {
  HONE_REQUIRE(b_small > 0 && b_big > b_small,
               "hone::noise_moments_from_two_batches: needs 0 < b_small < b_big");
  const double bs = static_cast<double>(b_small);
  const double bb = static_cast<double>(b_big);
  return {(small_sq_norm - big_sq_norm) / (1.0 / bs - 1.0 / bb),
          (bb * big_sq_norm - bs * small_sq_norm) / (bb - bs)};
}

/// The estimate from per-sample gradients: `grads` holds `batch` rows of `dim` floats.
[[nodiscard]] inline noise_moments noise_moments_from_samples(std::span<const float> grads,
                                                              std::size_t batch) {
  HONE_REQUIRE(batch >= 2 && grads.size() % batch == 0,
               "hone::noise_moments_from_samples: needs >= 2 rows of equal length");
  const std::size_t dim = grads.size() / batch;
  double trace = 0.0;
  double mean_sq = 0.0;
  for (std::size_t j = 0; j < dim; ++j) {
    double sum = 0.0;
    for (std::size_t i = 0; i < batch; ++i) sum += grads[i * dim + j];
    const double m = sum / static_cast<double>(batch);
    double var = 0.0;
    for (std::size_t i = 0; i < batch; ++i) {
      const double d = grads[i * dim + j] - m;
      var += d * d;
    }
    trace += var / static_cast<double>(batch - 1);
    mean_sq += m * m;
  }
  return {trace, mean_sq - trace / static_cast<double>(batch)};
}

struct variable_batch_options {
  std::size_t min_batch = 32;
  std::size_t max_batch = 4096;
  /// batch = scale * B_simple before clamping.
  double scale = 1.0;
  /// EMA weight of the past: avg = beta * avg + (1 - beta) * new (bias-corrected).
  double beta = 0.95;
  std::size_t multiple_of = 1;
  /// Largest factor the batch may grow by in one update.
  double max_growth = 2.0;
  bool allow_shrink = false;
  /// Observations before the batch starts to follow the estimate.
  std::size_t warmup = 10;
};

/// Tracks the gradient noise scale and turns it into a batch size.
class variable_batch_policy {
 public:
  explicit variable_batch_policy(variable_batch_options options = {})
      : o_(options), batch_(options.min_batch) {
    HONE_REQUIRE(o_.min_batch > 0 && o_.min_batch <= o_.max_batch,
                 "hone::variable_batch_policy: needs 0 < min_batch <= max_batch");
    HONE_REQUIRE(o_.beta >= 0.0 && o_.beta < 1.0,
                 "hone::variable_batch_policy: beta must be in [0, 1)");
    HONE_REQUIRE(o_.multiple_of > 0 && o_.scale > 0.0 && o_.max_growth >= 1.0,
                 "hone::variable_batch_policy: multiple_of > 0, scale > 0 and max_growth >= 1");
    batch_ = round_up(o_.min_batch);
  }

  /// Folds one estimate in and updates the batch size; returns the new batch size.
  std::size_t observe(noise_moments m) {
    ++count_;
    ema_trace_ = o_.beta * ema_trace_ + (1.0 - o_.beta) * m.trace_sigma;
    ema_grad_sq_ = o_.beta * ema_grad_sq_ + (1.0 - o_.beta) * m.grad_sq;
    weight_ = o_.beta * weight_ + (1.0 - o_.beta);
    if (count_ >= o_.warmup) update_batch();
    return batch_;
  }
  /// observe() of the two-batch-size estimate.
  std::size_t observe_two_batches(double small_sq_norm, std::size_t b_small, double big_sq_norm,
                                  std::size_t b_big) {
    return observe(noise_moments_from_two_batches(small_sq_norm, b_small, big_sq_norm, b_big));
  }

  /// The smoothed B_simple = EMA(tr Sigma) / EMA(|G|^2); +infinity when EMA(|G|^2) <= 0 (no
  /// signal left above the noise) and 0 before any observation.
  [[nodiscard]] double noise_scale() const noexcept {
    if (count_ == 0) return 0.0;
    const double g = ema_grad_sq_ / weight_;
    const double t = std::max(0.0, ema_trace_ / weight_);
    if (g <= 0.0) return HUGE_VAL;
    return t / g;
  }
  /// Bias-corrected smoothed moments.
  [[nodiscard]] noise_moments smoothed() const noexcept {
    if (count_ == 0) return {};
    return {ema_trace_ / weight_, ema_grad_sq_ / weight_};
  }
  [[nodiscard]] std::size_t batch_size() const noexcept { return batch_; }
  [[nodiscard]] std::size_t observations() const noexcept { return count_; }
  [[nodiscard]] const variable_batch_options& options() const noexcept { return o_; }

 private:
  [[nodiscard]] std::size_t round_up(std::size_t b) const noexcept {
    const std::size_t m = o_.multiple_of;
    std::size_t r = (b + m - 1) / m * m;
    if (r > o_.max_batch) r = std::max<std::size_t>(m, o_.max_batch / m * m);
    return r;
  }

  void update_batch() {
    const double target_d = std::clamp(o_.scale * noise_scale(), static_cast<double>(o_.min_batch),
                                       static_cast<double>(o_.max_batch));
    double next = std::min(target_d, static_cast<double>(batch_) * o_.max_growth);
    if (!o_.allow_shrink) next = std::max(next, static_cast<double>(batch_));
    batch_ = round_up(static_cast<std::size_t>(std::ceil(next)));
  }

  variable_batch_options o_;
  std::size_t batch_;
  std::size_t count_ = 0;
  double ema_trace_ = 0.0;
  double ema_grad_sq_ = 0.0;
  double weight_ = 0.0;
};

HONE_NAMESPACE_END
