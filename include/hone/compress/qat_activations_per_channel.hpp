// hone/compress/qat_activations_per_channel.hpp: per-channel fake quantization of activations for
// quantization-aware training, what PyTorch's torch.ao.quantization.FakeQuantize does with a
// per-channel observer (MovingAveragePerChannelMinMaxObserver or PerChannelMinMaxObserver,
// qscheme per_channel_affine or per_channel_symmetric): one scale and zero point per channel of
// the activation, learned by the observer, and torch.fake_quantize_per_channel_affine in forward.
// The per-tensor quantizer is qat_activations.hpp's activation_fake_quant; this one takes the same
// options. docs/quant.md.
//
//   namespace hc = hone::compress;
//   hc::activation_fake_quant_per_channel fq(64);   // 64 channels; quint8 affine, moving average
//   fq.forward(h);             // h: [rows, 64] row-major (torch's Linear output with ch_axis=1)
//   fq.forward(a, y, 14 * 14); // a: NCHW [batch, 64, 14, 14] (torch's conv output, ch_axis=1)
//   fq.backward(gh);           // straight-through: zero where the last forward clipped
//   fq.disable_observer();     // torch's disable_observer: the per-channel ranges freeze
//
// The layout: an activation is row-major [outer, channels, inner]; inner = 1 (the default) is a
// [rows, channels] matrix, inner = H * W an NCHW tensor; outer is x.size() / (channels * inner).
// Channel c of value i is (i / inner) % channels.
//
// Semantics (torch 2.x; each step one call of forward; the per-tensor formulas of
// qat_activations.hpp applied to each channel):
//  - observer, per channel c: the min and max of the batch's values of channel c; the first batch
//    sets [lo_c, hi_c], each later one moves them by the averaging constant towards the batch's
//    (lo + c * (min - lo) in float, as MovingAveragePerChannelMinMaxObserver) or keeps the running
//    min and max (PerChannelMinMaxObserver).
//  - qparams per channel, recomputed after each observed batch as torch's _calculate_qparams
//    (fake_quant_qparams of channel c's range: the range widened to include 0; affine or
//    symmetric; scale at least FLT_EPSILON).
//  - before the first observed batch the quantizer holds torch's fresh buffers: scale [1] = {1},
//    zero point [1] = {0}, no range (min_val / max_val of shape [0]). torch's forward refuses such
//    a quantizer with fake quantization on and the observer off for more than one channel (the
//    scale has 1 element for N channels), and so does hone (a sentence); for one channel both use
//    scale 1, zero point 0.
//  - fake quantization (torch.fake_quantize_per_channel_affine's CPU kernel), per value of
//    channel c: inv = 1 / scale_c (float), q = zero_point_c + round_half_even(x * inv) (float),
//    y = (clamp(q, quant_min, quant_max) - zero_point_c) * scale_c; the mask is
//    quant_min <= q <= quant_max. One divergence, for absurd values only: when |q| >= 2^63 torch's
//    kernel converts q to int64 out of range (undefined behaviour in C++; on x86-64 it gives
//    INT64_MIN, so torch returns quant_min's value for a huge positive x), where hone clamps to
//    quant_max; the mask is 0 on both sides.
//  - backward: grad_x = grad_y where the mask is set, 0 elsewhere (torch's autograd of
//    fake_quantize_per_channel_affine).
//  - observer_enabled / fake_quant_enabled as torch's switches (with fake quantization off,
//    forward copies x and the mask passes everything).
//
// State (checkpoints: qat_checkpoint.hpp, torch's FakeQuantize.state_dict() layout): state()
// reads the per-channel ranges, scales, zero points, the observations count and the switches;
// restore() sets them, so that a resumed run continues bit for bit. The mask is not state.
//
// Errors (hone::config_error sentences; a refused forward or restore leaves the quantizer
// unchanged): zero channels, bad options, an empty, mismatched or partly overlapping span, inner 0,
// a size that is not a whole number of [channels, inner] blocks, a NaN or infinity (naming the
// index and its channel), fake quantization before any per-channel scale (above), a channel's
// range too wide for a finite float scale (naming the channel), backward before any forward or
// with another size, a restored state that is not one this quantizer can be in.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "hone/compress/qat_activations.hpp"
#include "hone/compress/quant.hpp"
#include "hone/compress/quant_linear.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

/// Everything an activation_fake_quant_per_channel has learned, in torch's shapes (state() /
/// restore(); qat_checkpoint.hpp saves it as FakeQuantize.state_dict()). Not state: the mask.
struct activation_fake_quant_per_channel_state {
  activation_fake_quant_options options{};  ///< must match the restored quantizer's options
  std::size_t channels = 0;                 ///< must match the restored quantizer's channels
  std::vector<float> min_val, max_val;  ///< the observer's ranges: [channels], empty before a batch
  std::vector<float> scale{1.0f};       ///< [channels]; torch's fresh buffer [1] = {1} before
  std::vector<std::int32_t> zero_point{0};  ///< [channels]; [1] = {0} before a batch
  std::uint64_t observations = 0;           ///< batches observed: > 0 exactly when min_val is set
  bool observer_enabled = true;
  bool fake_quant_enabled = true;
  /// Whether the observer has seen a batch (torch: min_val.numel() > 0).
  [[nodiscard]] bool seen() const noexcept { return !min_val.empty(); }
};

namespace detail {

/// What is wrong with restoring `s` into a per-channel quantizer of `channels` channels with
/// options `o` (empty: nothing): a sentence, without the caller's name.
inline std::string fake_quant_per_channel_state_problem(
    const activation_fake_quant_per_channel_state& s, const activation_fake_quant_options& o,
    std::size_t channels) {
  if (!same_fake_quant_options(s.options, o)) {
    return "the state was saved by a quantizer with " + fake_quant_options_string(s.options) +
           ", but this one has " + fake_quant_options_string(o) +
           "; construct the quantizer with the options it was trained with.";
  }
  const std::string n = std::to_string(channels);
  if (s.channels != channels) {
    return "the state has " + std::to_string(s.channels) + " channels, but this quantizer has " +
           n + "; construct it with the channel count it was trained with.";
  }
  if (s.min_val.size() != s.max_val.size() ||
      (!s.min_val.empty() && s.min_val.size() != channels)) {
    return "the observer's min_val has " + std::to_string(s.min_val.size()) +
           " values and max_val " + std::to_string(s.max_val.size()) +
           "; both have 0 (no batch observed) or one per channel (" + n + ").";
  }
  if (s.scale.size() != s.zero_point.size() ||
      (s.scale.size() != channels && (s.seen() || s.scale.size() != 1))) {
    return "the scale has " + std::to_string(s.scale.size()) + " values and the zero point " +
           std::to_string(s.zero_point.size()) + "; both have one per channel (" + n +
           "), or 1 (torch's fresh buffers) before the first observed batch.";
  }
  for (std::size_t c = 0; c < s.scale.size(); ++c) {
    activation_fake_quant_state one;
    one.options = o;
    one.qparams = {s.scale[c], s.zero_point[c]};
    if (s.seen()) {
      one.seen = true;
      one.range = {s.min_val[c], s.max_val[c]};
      one.observations = 1;
    }
    const std::string p = fake_quant_state_problem(one, o);
    if (!p.empty()) return "channel " + std::to_string(c) + ": " + p;
  }
  if (s.seen() != (s.observations > 0)) {
    return s.seen() ? "the observer has seen a batch but the observations count is 0; the count "
                      "is at least 1 once a batch was observed."
                    : "the observations count is " + std::to_string(s.observations) +
                          " but the observer has seen no batch; the count is 0 until a batch is "
                          "observed.";
  }
  return {};
}

/// "index i (row r, channel c)" or "index i (outer o, channel c, position p)".
inline std::string fq_channel_index(std::size_t i, std::size_t channels, std::size_t inner) {
  const std::size_t c = (i / inner) % channels, o = i / inner / channels;
  if (inner == 1) {
    return std::to_string(i) + " (row " + std::to_string(o) + ", channel " + std::to_string(c) +
           ")";
  }
  return std::to_string(i) + " (outer " + std::to_string(o) + ", channel " + std::to_string(c) +
         ", position " + std::to_string(i % inner) + ")";
}

}  // namespace detail

/// Per-channel fake quantization of activations with a per-channel observer, the switches and the
/// straight-through backward (see the top of this file). One forward at a time per object.
class activation_fake_quant_per_channel : public detail::fake_quant_base {
 public:
  explicit activation_fake_quant_per_channel(std::size_t channels,
                                             activation_fake_quant_options o = {})
      : fake_quant_base(o), channels_(channels) {
    HONE_REQUIRE(channels_ > 0,
                 "hone::compress::activation_fake_quant_per_channel: the channel count is 0; "
                 "give the size of the activation's channel axis (e.g. a Linear layer's "
                 "out_features).");
  }

  /// In place: x ([outer, channels, inner]) becomes its fake-quantized value.
  void forward(std::span<float> x, std::size_t inner = 1) {
    forward(std::span<const float>(x), x, inner);
  }

  /// y = fake_quantize(x) per channel (after observing x when the observer is on); x is
  /// [outer, channels, inner] row-major; y may be x itself, but not overlap it otherwise.
  void forward(std::span<const float> x, std::span<float> y, std::size_t inner = 1) {
    constexpr const char* who = "hone::compress::activation_fake_quant_per_channel::forward";
    check_forward(x, y, inner, who);
    const std::size_t n = x.size(), block = channels_ * inner;
    if (observer_on_) observe(x, inner, who);
    start_mask(n);
    if (!fake_quant_on_) {
      pass_through(x, y);
      return;
    }
    for (std::size_t start = 0; start < n; start += block) {
      for (std::size_t c = 0; c < channels_; ++c) {
        const std::size_t first = start + c * inner;
        quantize_range(x, y, first, first + inner, scale_[c], zero_point_[c]);
      }
    }
  }

  /// In place: grad (with respect to the last forward's output) becomes the gradient with respect
  /// to its input: unchanged where the mask is set, 0 where the value was clipped.
  void backward(std::span<float> grad) const { backward(std::span<const float>(grad), grad); }

  /// grad_x = grad_y where the last forward's mask is set, 0 elsewhere; grad_x may be grad_y.
  void backward(std::span<const float> grad_y, std::span<float> grad_x) const {
    detail::fake_quant_backward(mask_, size_, grad_y, grad_x,
                                "hone::compress::activation_fake_quant_per_channel::backward");
  }

  // ---- what was learned ----
  [[nodiscard]] std::size_t channels() const noexcept { return channels_; }
  /// The scales: one per channel once a batch was observed; before, torch's fresh buffer {1}.
  [[nodiscard]] std::span<const float> scales() const noexcept { return scale_; }
  /// The zero points: one per channel once a batch was observed; before, {0}.
  [[nodiscard]] std::span<const std::int32_t> zero_points() const noexcept { return zero_point_; }
  /// Channel c's scale and zero point (scale 1, zero point 0 before the first observed batch).
  [[nodiscard]] affine_params qparams(std::size_t c) const {
    HONE_REQUIRE(c < channels_,
                 "hone::compress::activation_fake_quant_per_channel::qparams: "
                 "channel " +
                     std::to_string(c) + " does not exist; the quantizer has " +
                     std::to_string(channels_) + " channels.");
    return scale_.size() == channels_ ? affine_params{scale_[c], zero_point_[c]}
                                      : affine_params{scale_[0], zero_point_[0]};
  }
  /// Whether the observer has seen a batch.
  [[nodiscard]] bool seen() const noexcept { return !lo_.empty(); }
  /// The observer's per-channel minima and maxima (torch's min_val / max_val): empty before the
  /// first observed batch.
  [[nodiscard]] std::span<const float> min_vals() const noexcept { return lo_; }
  [[nodiscard]] std::span<const float> max_vals() const noexcept { return hi_; }
  /// Channel c's observed range ({0, 0} before the first observed batch).
  [[nodiscard]] quant_range observed_range(std::size_t c) const {
    HONE_REQUIRE(c < channels_,
                 "hone::compress::activation_fake_quant_per_channel::"
                 "observed_range: channel " +
                     std::to_string(c) + " does not exist; the quantizer has " +
                     std::to_string(channels_) + " channels.");
    return seen() ? quant_range{lo_[c], hi_[c]} : quant_range{};
  }

  // ---- the learned state (checkpoints: qat_checkpoint.hpp) ----
  [[nodiscard]] activation_fake_quant_per_channel_state state() const {
    activation_fake_quant_per_channel_state s;
    s.options = o_;
    s.channels = channels_;
    s.min_val = lo_;
    s.max_val = hi_;
    s.scale = scale_;
    s.zero_point = zero_point_;
    s.observations = observations_;
    s.observer_enabled = observer_on_;
    s.fake_quant_enabled = fake_quant_on_;
    return s;
  }

  /// Sets the state that state() read, so that the next forwards continue bit for bit.
  /// config_error (and the quantizer unchanged) for options or a channel count other than this
  /// quantizer's, ranges of another size than 0 or channels (or not finite with lo <= hi), scales
  /// and zero points of another size than channels (or 1 before a batch), a scale that is not
  /// finite and positive, a zero point outside the codes (or not 0 when symmetric), an
  /// observations count that disagrees with the ranges. The mask is forgotten.
  void restore(const activation_fake_quant_per_channel_state& s) {
    const std::string problem = detail::fake_quant_per_channel_state_problem(s, o_, channels_);
    HONE_REQUIRE(problem.empty(),
                 "hone::compress::activation_fake_quant_per_channel::restore: " + problem);
    lo_ = s.min_val;
    hi_ = s.max_val;
    scale_ = s.scale;
    zero_point_ = s.zero_point;
    observations_ = s.observations;
    observer_on_ = s.observer_enabled;
    fake_quant_on_ = s.fake_quant_enabled;
    forget_mask();
  }

 private:
  void check_forward(std::span<const float> x, std::span<float> y, std::size_t inner,
                     const char* who) const {
    detail::check_fake_quant_spans(x, y, who);
    HONE_REQUIRE(inner > 0, std::string(who) +
                                ": inner is 0; it is the number of values per channel and row "
                                "(1 for a [rows, channels] activation, H * W for NCHW).");
    HONE_REQUIRE(
        x.size() % inner == 0 && (x.size() / inner) % channels_ == 0,
        std::string(who) + ": the input holds " + std::to_string(x.size()) +
            " values, which is not a whole number of [channels = " + std::to_string(channels_) +
            ", inner = " + std::to_string(inner) + "] blocks; the activation must be [outer, " +
            std::to_string(channels_) + ", inner] (check the channel count and inner).");
    if (!detail::all_finite(x)) [[unlikely]] {
      for (std::size_t i = 0; i < x.size(); ++i) {
        HONE_REQUIRE(std::isfinite(x[i]),
                     std::string(who) + ": the value at index " +
                         detail::fq_channel_index(i, channels_, inner) + " is " +
                         (std::isnan(x[i]) ? "NaN" : "infinite") +
                         "; fake quantization needs finite activations (check the model for "
                         "overflow).");
      }
    }
    HONE_REQUIRE(!fake_quant_on_ || observer_on_ || scale_.size() == channels_,
                 std::string(who) +
                     ": the quantizer has observed no batch, so it has no per-channel scales "
                     "(torch's FakeQuantize refuses this too: its fresh scale has 1 value for " +
                     std::to_string(channels_) +
                     " channels); enable the observer for the first batch, or disable fake "
                     "quantization until it has observed one.");
  }

  /// Updates the per-channel ranges and qparams from batch x (all or nothing).
  void observe(std::span<const float> x, std::size_t inner, const char* who) {
    std::vector<float> mn(channels_, 0.0f), mx(channels_, 0.0f);
    const std::size_t block = channels_ * inner;
    for (std::size_t c = 0; c < channels_; ++c) mn[c] = mx[c] = x[c * inner];
    for (std::size_t start = 0; start < x.size(); start += block) {
      for (std::size_t c = 0; c < channels_; ++c) {
        float lo = mn[c], hi = mx[c];  // the first of equal values stays (torch's aminmax)
        for (std::size_t i = start + c * inner; i < start + (c + 1) * inner; ++i) {
          lo = std::min(lo, x[i]);
          hi = std::max(hi, x[i]);
        }
        mn[c] = lo;
        mx[c] = hi;
      }
    }
    if (seen()) {
      for (std::size_t c = 0; c < channels_; ++c) {
        if (o_.observer == fake_quant_observer::minmax) {
          mn[c] = std::min(lo_[c], mn[c]);
          mx[c] = std::max(hi_[c], mx[c]);
        } else {
          mn[c] = detail::moving_average_step(lo_[c], mn[c], o_.averaging_constant);
          mx[c] = detail::moving_average_step(hi_[c], mx[c], o_.averaging_constant);
        }
      }
    }
    std::vector<float> scale(channels_);
    std::vector<std::int32_t> zp(channels_);
    for (std::size_t c = 0; c < channels_; ++c) {
      try {
        const affine_params p = fake_quant_qparams({mn[c], mx[c]}, o_);
        scale[c] = p.scale;
        zp[c] = p.zero_point;
      } catch (const config_error& e) {
        throw config_error(std::string(who) + ": channel " + std::to_string(c) + ": " + e.what());
      }
    }
    lo_ = std::move(mn);
    hi_ = std::move(mx);
    scale_ = std::move(scale);
    zero_point_ = std::move(zp);
    ++observations_;
  }

  std::size_t channels_;
  std::vector<float> lo_, hi_;               // empty until the first observed batch
  std::vector<float> scale_{1.0f};           // torch's fresh buffers: [1] = {1}
  std::vector<std::int32_t> zero_point_{0};  // [1] = {0}
};

}  // namespace compress
HONE_NAMESPACE_END
