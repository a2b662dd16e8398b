// hone/compress/qat_activations.hpp: fake quantization of activations for quantization-aware
// training, what PyTorch's torch.ao.quantization.FakeQuantize does for an activation, as an object
// the user's own forward and backward call (hone's models are the user's C++ code over float
// spans), and the conversion of a trained layer to ptq.hpp's static int8 linear layer with the
// activation scale and zero point learned in training. docs/quant.md.
//
//   namespace hc = hone::compress;
//   hc::activation_fake_quant fq;            // quint8 0..255 affine, moving-average min-max 0.01
//   // training step, in the user's forward (h: the hidden activations [rows, hidden]):
//   fq.forward(h);                           // observe, update scale / zero point, fake-quantize
//   ...                                      // the next layer runs on the fake-quantized h
//   // in the user's backward (gh: the gradient of the loss with respect to fq's output):
//   fq.backward(gh);                         // straight-through: zero where h was clipped
//   // late in training, freeze the range (torch's disable_observer):
//   fq.disable_observer();
//   // after training: the next layer as a static int8 layer reading the learned parameters
//   hc::ptq_linear l2 = hc::convert_to_static_int8("fc2", w2, hidden_out, hidden, b2, fq);
//
// Semantics (torch 2.x, per tensor, each step one call of forward):
//  - observer: moving-average min-max (quant.hpp's moving_average_minmax_observer: the first batch
//    sets [lo, hi], each later one moves them by the averaging constant towards its own min and
//    max, in float, as MovingAverageMinMaxObserver) or the running min-max (minmax_observer).
//  - qparams, recomputed after each observed batch as torch's _calculate_qparams: lo' = min(lo, 0),
//    hi' = max(hi, 0) (the range includes zero); affine: scale = max((hi' - lo') / (quant_max -
//    quant_min), eps), zero_point = clamp(quant_min - round_half_even(lo' / scale), quant_min,
//    quant_max); symmetric: scale = max(max(-lo', hi') / ((quant_max - quant_min) / 2), eps),
//    zero_point 0; eps = FLT_EPSILON (torch.finfo(torch.float32).eps), all in float. Before the
//    first observed batch: scale 1, zero point 0 (torch's initial buffers).
//  - fake quantization (fake_quantize_per_tensor_affine's CPU kernel): inv = 1 / scale (float),
//    q = zero_point + round_half_even(x * inv), y = (clamp(q, quant_min, quant_max) - zero_point)
//    * scale; the gradient mask is quant_min <= q <= quant_max.
//  - backward: grad_x = grad_y where the mask is set, 0 where it is not (torch's backward of
//    fake_quantize_per_tensor_affine: the straight-through estimator, clipped).
//  - observer_enabled / fake_quant_enabled (torch's enable_observer / enable_fake_quant): with the
//    observer off the scale and zero point stay as they are (frozen); with fake quantization off
//    forward copies x and the mask passes everything.
//
// The mask: forward keeps the mask of its last call, bit-packed (one bit per value), and backward
// reads it, so backward must follow the forward of the same batch (one activation_fake_quant per
// place in the model, one forward before each backward); it is not recomputed from x, whose
// quantization parameters may have moved since.
//
// State (for checkpoints, qat_checkpoint.hpp): state() reads everything a quantizer has learned,
// restore() sets it, so that a resumed run continues bit for bit as the uninterrupted one: the
// observer's range and whether it has seen a batch, the scale and zero point, the observations
// count and the two switches (the options travel with it and must match). The mask of the last
// forward is not state: restore() forgets it, and backward must follow a forward as always.
//
// Options: quint8 affine 0..255 (the default, torch's default activation fake-quant), symmetric
// qint8 -128..127 (zero point 0, scale = max|x| / 127.5, torch's per_tensor_symmetric qint8), or
// any quant_min < quant_max in [-32768, 65535] (affine; symmetric needs quant_min < 0 < quant_max).
// torch's quint8 symmetric (zero point 128) is not offered: use the affine scheme or qint8.
//
// Errors (hone::config_error sentences; a refused forward or restore leaves the quantizer
// unchanged): an empty, mismatched or partly overlapping span, a NaN or infinity in x (naming the
// index), backward before any forward or with another size than the last forward, a range too wide
// for a finite float scale, bad options, a conversion from a quantizer that observed nothing or
// whose range does not span 256 codes, a restored state that is not one a quantizer with these
// options can be in.
//
// Bit-for-bit agreement with torch: the observer's `lo + c * (min - lo)` is kept from fusing into
// a multiply-add (quant.hpp, HONE_DETAIL_OPAQUE_FP), whatever the target and -ffp-contract; the
// fake quantization itself has no multiply-add to fuse.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "hone/compress/ptq.hpp"
#include "hone/compress/quant.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

/// Which observer picks an activation fake quantizer's range.
enum class fake_quant_observer : unsigned char {
  moving_average_minmax,  ///< torch's MovingAverageMinMaxObserver (the default)
  minmax,                 ///< torch's MinMaxObserver: the running min and max
};

/// How the scale and zero point come from the range.
enum class fake_quant_scheme : unsigned char {
  affine,     ///< torch.per_tensor_affine: the whole [min(lo, 0), max(hi, 0)] onto the codes
  symmetric,  ///< torch.per_tensor_symmetric: [-max|x|, max|x|], zero point 0
};

/// The options of activation_fake_quant (the defaults: torch's default activation fake-quant,
/// FakeQuantize(MovingAverageMinMaxObserver, quant_min=0, quant_max=255, dtype=torch.quint8,
/// qscheme=torch.per_tensor_affine)).
struct activation_fake_quant_options {
  fake_quant_observer observer = fake_quant_observer::moving_average_minmax;
  float averaging_constant = 0.01f;  ///< moving_average_minmax only; in (0, 1]
  fake_quant_scheme scheme = fake_quant_scheme::affine;
  std::int32_t quant_min = 0;    ///< the smallest code
  std::int32_t quant_max = 255;  ///< the largest code
};

/// quint8, 0..255, per-tensor affine, moving average (the default options).
[[nodiscard]] inline activation_fake_quant_options quint8_affine_activations(
    fake_quant_observer observer = fake_quant_observer::moving_average_minmax) {
  return {.observer = observer};
}

/// qint8, -128..127, per-tensor symmetric (zero point 0, scale = max|x| / 127.5).
[[nodiscard]] inline activation_fake_quant_options qint8_symmetric_activations(
    fake_quant_observer observer = fake_quant_observer::moving_average_minmax) {
  return {.observer = observer,
          .scheme = fake_quant_scheme::symmetric,
          .quant_min = -128,
          .quant_max = 127};
}

namespace detail {

inline void check_fake_quant_options(const activation_fake_quant_options& o) {
  constexpr const char* who = "hone::compress::activation_fake_quant";
  HONE_REQUIRE(o.quant_min < o.quant_max && o.quant_min >= -32768 && o.quant_max <= 65535,
               std::string(who) + ": quant_min = " + std::to_string(o.quant_min) +
                   " and quant_max = " + std::to_string(o.quant_max) +
                   "; they must satisfy -32768 <= quant_min < quant_max <= 65535 (e.g. 0 and 255 "
                   "for quint8, -128 and 127 for qint8).");
  HONE_REQUIRE(o.scheme != fake_quant_scheme::symmetric || (o.quant_min < 0 && o.quant_max > 0),
               std::string(who) +
                   ": the symmetric scheme has zero point 0 and needs a signed "
                   "code range (quant_min < 0 < quant_max), but the range is [" +
                   std::to_string(o.quant_min) + ", " + std::to_string(o.quant_max) +
                   "]; use -128 and 127, or the affine scheme for an unsigned range.");
  HONE_REQUIRE(o.observer == fake_quant_observer::minmax ||
                   (o.averaging_constant > 0.0f && o.averaging_constant <= 1.0f),
               std::string(who) + ": the averaging constant is " +
                   std::to_string(o.averaging_constant) +
                   "; it must lie in (0, 1] (torch's "
                   "default is 0.01).");
}

}  // namespace detail

/// Everything an activation_fake_quant has learned (state() / restore(); qat_checkpoint.hpp saves
/// it in torch's FakeQuantize layout). Not state: the mask of the last forward.
struct activation_fake_quant_state {
  activation_fake_quant_options options{};  ///< must match the restored quantizer's options
  bool seen = false;        ///< whether the observer has seen a batch (torch: min_val != +inf)
  quant_range range{};      ///< the observer's [lo, hi] when seen (ignored when not)
  affine_params qparams{};  ///< the scale and zero point forward uses (scale 1, zero point 0 new)
  std::uint64_t observations = 0;  ///< batches observed: > 0 exactly when seen
  bool observer_enabled = true;    ///< torch's observer_enabled
  bool fake_quant_enabled = true;  ///< torch's fake_quant_enabled
};

namespace detail {

/// A float in an error sentence (nine significant digits: it reads back as the same float).
inline std::string fq_number(float v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", static_cast<double>(v));
  return b;
}

inline std::string fake_quant_options_string(const activation_fake_quant_options& o) {
  std::string s = o.observer == fake_quant_observer::minmax ? "min-max observer"
                                                            : "moving-average min-max observer";
  if (o.observer == fake_quant_observer::moving_average_minmax) {
    s += " (averaging constant " + fq_number(o.averaging_constant) + ")";
  }
  s += o.scheme == fake_quant_scheme::symmetric ? ", symmetric" : ", affine";
  return s + ", codes [" + std::to_string(o.quant_min) + ", " + std::to_string(o.quant_max) + "]";
}

/// Whether two option sets quantize alike (the averaging constant counts for the moving average
/// only, bit for bit).
inline bool same_fake_quant_options(const activation_fake_quant_options& a,
                                    const activation_fake_quant_options& b) {
  return a.observer == b.observer && a.scheme == b.scheme && a.quant_min == b.quant_min &&
         a.quant_max == b.quant_max &&
         (a.observer == fake_quant_observer::minmax ||
          std::bit_cast<std::uint32_t>(a.averaging_constant) ==
              std::bit_cast<std::uint32_t>(b.averaging_constant));
}

/// What is wrong with restoring state `s` into a quantizer with options `o` (empty: nothing): a
/// sentence, without the caller's name.
inline std::string fake_quant_state_problem(const activation_fake_quant_state& s,
                                            const activation_fake_quant_options& o) {
  if (!same_fake_quant_options(s.options, o)) {
    return "the state was saved by a quantizer with " + fake_quant_options_string(s.options) +
           ", but this one has " + fake_quant_options_string(o) +
           "; construct the quantizer with the options it was trained with.";
  }
  if (!std::isfinite(s.qparams.scale) || !(s.qparams.scale > 0.0f)) {
    return "the scale is " + fq_number(s.qparams.scale) +
           "; a quantizer's scale is finite and positive (the checkpoint is damaged or not a "
           "quantizer's).";
  }
  if (s.qparams.zero_point < o.quant_min || s.qparams.zero_point > o.quant_max) {
    return "the zero point " + std::to_string(s.qparams.zero_point) + " lies outside the codes [" +
           std::to_string(o.quant_min) + ", " + std::to_string(o.quant_max) +
           "]; restore into a quantizer with the code range it was trained with.";
  }
  if (o.scheme == fake_quant_scheme::symmetric && s.qparams.zero_point != 0) {
    return "the zero point is " + std::to_string(s.qparams.zero_point) +
           ", but the symmetric scheme's is 0; restore into a quantizer with the scheme it was "
           "trained with.";
  }
  if (s.seen &&
      !(std::isfinite(s.range.lo) && std::isfinite(s.range.hi) && s.range.lo <= s.range.hi)) {
    return "the observer's range [" + fq_number(s.range.lo) + ", " + fq_number(s.range.hi) +
           "] is not finite with lo <= hi, as the range of an observer that has seen a batch is.";
  }
  if (s.seen != (s.observations > 0)) {
    return s.seen ? "the observer has seen a batch but the observations count is 0; the count is "
                    "at least 1 once a batch was observed."
                  : "the observations count is " + std::to_string(s.observations) +
                        " but the observer has seen no batch; the count is 0 until a batch is "
                        "observed.";
  }
  return {};
}

}  // namespace detail

/// The scale and zero point of a per-tensor range, as torch's _calculate_qparams (see the top of
/// this file); config_error when the range is too wide for a finite float scale.
[[nodiscard]] inline affine_params fake_quant_qparams(quant_range r,
                                                      const activation_fake_quant_options& o) {
  detail::check_fake_quant_options(o);
  HONE_REQUIRE(std::isfinite(r.lo) && std::isfinite(r.hi) && r.lo <= r.hi,
               "hone::compress::fake_quant_qparams: the range [" + std::to_string(r.lo) + ", " +
                   std::to_string(r.hi) + "] is not a finite range with lo <= hi.");
  const float lo = std::min(r.lo, 0.0f), hi = std::max(r.hi, 0.0f);
  constexpr float eps = std::numeric_limits<float>::epsilon();
  const auto qmin = static_cast<float>(o.quant_min), qmax = static_cast<float>(o.quant_max);
  float scale = 0.0f;
  std::int32_t zero_point = 0;
  if (o.scheme == fake_quant_scheme::symmetric) {
    scale = std::max(std::max(-lo, hi) / ((qmax - qmin) / 2.0f), eps);
  } else {
    scale = std::max((hi - lo) / (qmax - qmin), eps);
  }
  HONE_REQUIRE(std::isfinite(scale),
               "hone::compress::fake_quant_qparams: the range [" + std::to_string(r.lo) + ", " +
                   std::to_string(r.hi) +
                   "] is too wide for a finite float scale; the activations are out of hand "
                   "(check the model for overflow).");
  if (o.scheme == fake_quant_scheme::affine) {
    const float zp = qmin - std::nearbyint(lo / scale);
    zero_point = static_cast<std::int32_t>(std::clamp(zp, qmin, qmax));
  }
  return {scale, zero_point};
}

namespace detail {

/// The checks both activation quantizers' forward make on x and y: not empty, the same size,
/// the same array or disjoint.
inline void check_fake_quant_spans(std::span<const float> x, std::span<float> y, const char* who) {
  HONE_REQUIRE(!x.empty(), std::string(who) +
                               ": the input is empty; an empty batch has no range to observe "
                               "and nothing to quantize (skip the call).");
  HONE_REQUIRE(y.size() == x.size(), std::string(who) + ": the input holds " +
                                         std::to_string(x.size()) + " values but the output " +
                                         std::to_string(y.size()) + "; they must be equal.");
  const float* xb = x.data();
  const float* yb = y.data();
  const std::less<const float*> before;
  HONE_REQUIRE(xb == yb || !before(xb, yb + y.size()) || !before(yb, xb + x.size()),
               std::string(who) +
                   ": the output overlaps the input without being the same array; pass the "
                   "input itself (in place) or a separate buffer.");
}

/// The straight-through backward of both activation quantizers: grad_x = grad_y where bit i of
/// `mask` (the last forward's, `size` values) is set, 0 elsewhere; grad_x may be grad_y.
inline void fake_quant_backward(std::span<const std::uint64_t> mask, std::size_t size,
                                std::span<const float> grad_y, std::span<float> grad_x,
                                const char* who) {
  HONE_REQUIRE(size > 0, std::string(who) +
                             ": no forward has run, so there is no mask; call forward on the "
                             "batch first.");
  HONE_REQUIRE(grad_y.size() == size && grad_x.size() == size,
               std::string(who) + ": the gradients hold " + std::to_string(grad_y.size()) +
                   " (output) and " + std::to_string(grad_x.size()) +
                   " (input) values, but the last forward had " + std::to_string(size) +
                   "; backward must follow the forward of the same batch.");
  const float* gy = grad_y.data();
  const float* gx = grad_x.data();
  const std::less<const float*> before;
  HONE_REQUIRE(gy == gx || !before(gy, gx + size) || !before(gx, gy + size),
               std::string(who) +
                   ": the input gradient overlaps the output gradient without being the same "
                   "array; pass the same array (in place) or a separate buffer.");
  for (std::size_t i = 0; i < size; ++i) {
    grad_x[i] = ((mask[i / 64] >> (i % 64)) & 1u) != 0 ? grad_y[i] : 0.0f;
  }
}

/// What the two activation quantizers (activation_fake_quant, activation_fake_quant_per_channel)
/// share: their options, torch's two switches, the observations count, the last forward's mask
/// (which values' gradients pass) and the fake quantization of a range of values.
class fake_quant_base {
 public:
  // ---- switches (torch's enable_observer / disable_observer / enable_fake_quant / ...) ----
  void enable_observer(bool enabled = true) noexcept { observer_on_ = enabled; }
  void disable_observer() noexcept { observer_on_ = false; }
  void enable_fake_quant(bool enabled = true) noexcept { fake_quant_on_ = enabled; }
  void disable_fake_quant() noexcept { fake_quant_on_ = false; }
  [[nodiscard]] bool observer_enabled() const noexcept { return observer_on_; }
  [[nodiscard]] bool fake_quant_enabled() const noexcept { return fake_quant_on_; }

  /// How many batches the observer has seen.
  [[nodiscard]] std::uint64_t observations() const noexcept { return observations_; }
  [[nodiscard]] const activation_fake_quant_options& options() const noexcept { return o_; }

  // ---- the last forward's mask ----
  /// The number of values of the last forward (0 before any).
  [[nodiscard]] std::size_t mask_size() const noexcept { return size_; }
  /// Whether value i of the last forward was inside [quant_min, quant_max] (its gradient passes).
  [[nodiscard]] bool passes(std::size_t i) const noexcept {
    return ((mask_[i / 64] >> (i % 64)) & 1u) != 0;
  }
  /// The mask bits: bit i % 64 of word i / 64 is value i; the bits past mask_size() are 0.
  [[nodiscard]] std::span<const std::uint64_t> mask_words() const noexcept { return mask_; }
  /// How many values of the last forward were clipped (their gradient is 0).
  [[nodiscard]] std::size_t clipped() const noexcept { return clipped_; }

 protected:
  explicit fake_quant_base(activation_fake_quant_options o) : o_(o) {
    check_fake_quant_options(o_);
  }

  /// A restored quantizer has no last forward (backward needs a new one).
  void forget_mask() noexcept {
    mask_.clear();
    size_ = 0;
    clipped_ = 0;
  }

  /// Starts the mask of a forward of n values (nothing passes yet).
  void start_mask(std::size_t n) {
    mask_.assign((n + 63) / 64, 0);
    size_ = n;
    clipped_ = 0;
  }

  /// Fake quantization off: y = x, and every value's gradient passes.
  void pass_through(std::span<const float> x, std::span<float> y) noexcept {
    if (x.data() != y.data()) std::copy(x.begin(), x.end(), y.begin());
    std::fill(mask_.begin(), mask_.end(), ~std::uint64_t{0});
    if (size_ % 64 != 0) mask_.back() = (std::uint64_t{1} << (size_ % 64)) - 1;  // none past n
  }

  /// y[i] = fake_quantize(x[i]) for i in [begin, end) with `scale` and `zero_point`, setting the
  /// values' mask bits and counting the clipped ones: inv = 1 / scale (float), q = zero_point +
  /// round_half_even(x * inv), y = (clamp(q, quant_min, quant_max) - zero_point) * scale, the bit
  /// set when quant_min <= q <= quant_max (torch's CPU kernels, per tensor and per channel).
  void quantize_range(std::span<const float> x, std::span<float> y, std::size_t begin,
                      std::size_t end, float scale, std::int32_t zero_point) noexcept {
    const float inv = 1.0f / scale;
    const auto zp = static_cast<float>(zero_point);
    const auto qmin = static_cast<float>(o_.quant_min), qmax = static_cast<float>(o_.quant_max);
    for (std::size_t i = begin; i < end;) {
      const std::size_t first = i, stop = std::min(end, (i / 64 + 1) * 64);
      std::uint64_t bits = 0;
      for (; i < stop; ++i) {
        const float q = zp + std::nearbyint(x[i] * inv);
        const bool inside = qmin <= q && q <= qmax;
        bits |= static_cast<std::uint64_t>(inside) << (i % 64);
        y[i] = (std::clamp(q, qmin, qmax) - zp) * scale;
      }
      mask_[first / 64] |= bits;
      clipped_ += (stop - first) - static_cast<std::size_t>(std::popcount(bits));
    }
  }

  activation_fake_quant_options o_;
  bool observer_on_ = true, fake_quant_on_ = true;
  std::uint64_t observations_ = 0;
  std::vector<std::uint64_t> mask_;
  std::size_t size_ = 0, clipped_ = 0;
};

}  // namespace detail

/// Fake quantization of activations with an observer, the switches and the straight-through
/// backward (see the top of this file). One forward at a time per object; copies are independent.
class activation_fake_quant : public detail::fake_quant_base {
 public:
  explicit activation_fake_quant(activation_fake_quant_options o = {}) : fake_quant_base(o) {
    if (o_.observer == fake_quant_observer::minmax) {
      obs_.emplace<minmax_observer>();
    } else {
      obs_.emplace<moving_average_minmax_observer>(o_.averaging_constant);
    }
  }

  /// In place: x becomes its fake-quantized value (after observing x when the observer is on).
  void forward(std::span<float> x) { forward(std::span<const float>(x), x); }

  /// y = fake_quantize(x) (after observing x when the observer is on); y may be x itself, but not
  /// overlap it otherwise.
  void forward(std::span<const float> x, std::span<float> y) {
    constexpr const char* who = "hone::compress::activation_fake_quant::forward";
    detail::check_fake_quant_spans(x, y, who);
    if (!detail::all_finite(x)) detail::require_finite(x, 0, who);
    if (observer_on_) {
      const auto saved = obs_;  // a refused batch leaves the quantizer as it was
      std::visit([&](auto& o) { o.observe(x); }, obs_);
      const quant_range r = std::visit([](const auto& o) { return o.range(); }, obs_);
      try {
        qp_ = fake_quant_qparams(r, o_);
      } catch (...) {
        obs_ = saved;
        throw;
      }
      ++observations_;
    }
    start_mask(x.size());
    if (!fake_quant_on_) {
      pass_through(x, y);
      return;
    }
    quantize_range(x, y, 0, x.size(), qp_.scale, qp_.zero_point);
  }

  /// In place: grad (the gradient with respect to the last forward's output) becomes the gradient
  /// with respect to its input: unchanged where the mask is set, 0 where the value was clipped.
  void backward(std::span<float> grad) const { backward(std::span<const float>(grad), grad); }

  /// grad_x = grad_y where the last forward's mask is set, 0 elsewhere; grad_x may be grad_y.
  void backward(std::span<const float> grad_y, std::span<float> grad_x) const {
    detail::fake_quant_backward(mask_, size_, grad_y, grad_x,
                                "hone::compress::activation_fake_quant::backward");
  }

  // ---- what was learned ----
  /// The current scale and zero point (scale 1, zero point 0 before the first observed batch).
  [[nodiscard]] affine_params qparams() const noexcept { return qp_; }
  [[nodiscard]] float scale() const noexcept { return qp_.scale; }
  [[nodiscard]] std::int32_t zero_point() const noexcept { return qp_.zero_point; }
  /// The observer's range ({0, 0} before the first observed batch).
  [[nodiscard]] quant_range observed_range() const {
    return std::visit([](const auto& o) { return o.range(); }, obs_);
  }

  // ---- the learned state (checkpoints: qat_checkpoint.hpp) ----
  /// Everything the quantizer has learned: options, the observer's range and whether it has seen
  /// a batch, the scale and zero point, the observations count, the switches.
  [[nodiscard]] activation_fake_quant_state state() const {
    activation_fake_quant_state s;
    s.options = o_;
    s.seen = std::visit([](const auto& o) { return o.seen(); }, obs_);
    s.range = observed_range();
    s.qparams = qp_;
    s.observations = observations_;
    s.observer_enabled = observer_on_;
    s.fake_quant_enabled = fake_quant_on_;
    return s;
  }

  /// Sets the state that state() read, so that the next forwards continue bit for bit as in the
  /// quantizer it was read from. config_error (and the quantizer unchanged) when the options
  /// differ from this quantizer's, the scale is not finite and positive, the zero point lies
  /// outside [quant_min, quant_max] (or is not 0 for the symmetric scheme), a seen range is not
  /// finite with lo <= hi, or the observations count is 0 for a seen range or not 0 for an unseen
  /// one. The mask of the last forward is not state: it is forgotten (backward needs a forward).
  void restore(const activation_fake_quant_state& s) {
    const std::string problem = detail::fake_quant_state_problem(s, o_);
    HONE_REQUIRE(problem.empty(), "hone::compress::activation_fake_quant::restore: " + problem);
    std::visit([&](auto& o) { o.restore(s.seen, s.range); }, obs_);
    qp_ = s.qparams;
    observations_ = s.observations;
    observer_on_ = s.observer_enabled;
    fake_quant_on_ = s.fake_quant_enabled;
    forget_mask();
  }

 private:
  std::variant<moving_average_minmax_observer, minmax_observer> obs_;
  affine_params qp_{};  // torch's initial buffers: scale 1, zero point 0
};

/// The activation parameters of ptq.hpp's static int8 layer (uint8 codes 0..255) equal to what the
/// fake quantizer `fq` does: its scale, and its zero point shifted by -quant_min (for qint8
/// -128..127: zero point 128). Needs a quantizer that observed at least one batch and whose codes
/// span 256 values (quant_max - quant_min = 255), so that the layer's clamp to [0, 255] is the
/// quantizer's clamp to [quant_min, quant_max].
[[nodiscard]] inline affine_params static_activation_params(const activation_fake_quant& fq) {
  constexpr const char* who = "hone::compress::static_activation_params";
  const activation_fake_quant_options& o = fq.options();
  HONE_REQUIRE(fq.observations() > 0,
               std::string(who) +
                   ": the fake quantizer has observed no batch, so it has learned no scale; "
                   "train (or calibrate) with its observer enabled before converting.");
  HONE_REQUIRE(o.quant_max - o.quant_min == 255,
               std::string(who) + ": the fake quantizer's codes are [" +
                   std::to_string(o.quant_min) + ", " + std::to_string(o.quant_max) +
                   "], but the static int8 layer reads 256 codes (quint8 0..255 or qint8 "
                   "-128..127); train with one of those ranges.");
  return {fq.scale(), fq.zero_point() - o.quant_min};
}

/// The static int8 layer (ptq_linear::static_int8) for a linear layer y = x W^T + b whose input x
/// the fake quantizer `input` quantized in training: the weights' codes `w` (e.g.
/// quantize_weights of the QAT master weights, the codes fake_quant_training trained with), and the
/// activation parameters static_activation_params(input). Its forward gives the float forward on
/// fake-quantized x within float rounding of the sums.
[[nodiscard]] inline ptq_linear convert_to_static_int8(std::string name, quantized_weights w,
                                                       std::span<const float> bias,
                                                       const activation_fake_quant& input) {
  const affine_params a = static_activation_params(input);
  return ptq_linear::static_int8(std::move(name), std::move(w), bias, a, input.observed_range());
}

/// The same from fp32 weights W [out, in] (quantized with quantize_weights at `granularity`).
[[nodiscard]] inline ptq_linear convert_to_static_int8(
    std::string name, std::span<const float> weight, std::size_t out, std::size_t in,
    std::span<const float> bias, const activation_fake_quant& input,
    quant_granularity granularity = quant_granularity::per_channel) {
  const affine_params a = static_activation_params(input);
  return ptq_linear::static_int8(std::move(name), quantize_weights(weight, out, in, granularity),
                                 bias, a, input.observed_range());
}

}  // namespace compress
HONE_NAMESPACE_END
