// hone/compress/ptq.hpp: post-training quantization of a whole trained model (PyTorch's
// torch.ao.quantization prepare / calibrate / convert in one call). hone walks the model's linear
// layers through a hook, runs calibration batches through the model with an observer on every
// layer's input, quantizes every layer's weights, and returns a quantized_model whose layers the
// user's inference code calls in place of the fp32 ones. docs/quant.md.
//
// The hook: a model lists its linear layers (PyTorch's nn.Linear layout, y = x W^T + b) and has a
// forward pass that reports each layer's input:
//
//   struct mlp {
//     std::vector<hone::compress::quantizable_layer> quantizable_layers() const;
//       // {name, weight [out, in] fp32, bias [out] (or empty), out_features, in_features}, in the
//       // order the forward pass runs them; names are unique (they name the checkpoint tensors)
//     void calibration_forward(std::span<const float> x, std::size_t rows,
//                              const hone::compress::layer_input_hook& hook);
//       // the fp32 forward pass on x [rows, model inputs] that calls hook(l, input, rows) with the
//       // input [rows, in_features] of layer l (its index in quantizable_layers()) before
//       // running it
//   };
//   static_assert(hone::compress::check_ptq_model<mlp>());
//
//   hc::quantized_model q =
//       hc::post_training_quantize(net, batches, {.observer = hc::ptq_observer::mse});
//   q.layer(l).forward(x, m, y);  // in the user's inference code, in place of layer l
//   hc::save_quantized_model(q, "model.safetensors");
//
// Modes (ptq_options::mode):
//  - static_int8: weights symmetric int8 (quantize_weights, per channel or per tensor); one uint8
//    scale and zero point per layer for its input activations, affine_uint8 of the range the
//    layer's observer (minmax, moving-average min-max, percentile or MSE; per layer) saw over the
//    calibration batches. forward quantizes x with those parameters (values outside the range
//    saturate at 0 or 255), multiplies with int8_gemm (int32, exact) and applies
//    dynamic_int8_linear's epilogue: y = s_x s_w[o] (acc - zp sum_k Wq[o, k]) + b[o] in double,
//    rounded once to float.
//  - dynamic_int8: no calibration; each layer is a dynamic_int8_linear (activation ranges per row
//    at run time).
// Layers named by ptq_options::keep_fp32 stay fp32 (their forward is a double-accumulated loop, a
// reference rather than a fast kernel: a model that keeps big layers in fp32 runs those itself).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "hone/checkpoint/tensor_file.hpp"
#include "hone/checkpoint/tensor_writer.hpp"
#include "hone/compress/quant.hpp"
#include "hone/compress/quant_checkpoint.hpp"
#include "hone/compress/quant_linear.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

/// One linear layer as the model shows it: y = x W^T + b.
struct quantizable_layer {
  std::string name;               ///< unique; names the layer's tensors in a checkpoint
  std::span<const float> weight;  ///< [out_features, in_features] row-major
  std::span<const float> bias{};  ///< [out_features], or empty
  std::size_t out_features = 0;
  std::size_t in_features = 0;
};

/// What calibration_forward calls with the input [rows, in_features] of layer `layer`.
using layer_input_hook =
    std::function<void(std::size_t layer, std::span<const float> input, std::size_t rows)>;

/// The post-training quantization hook (see the top of this file).
template <class M>
concept ptq_model = requires(M& m, const M& cm, std::span<const float> x, std::size_t rows,
                             const layer_input_hook& hook) {
  { cm.quantizable_layers() } -> std::convertible_to<std::vector<quantizable_layer>>;
  m.calibration_forward(x, rows, hook);
};

/// static_assert(check_ptq_model<M>()): says which member of the hook M lacks.
template <class M>
consteval bool check_ptq_model() {
  static_assert(
      requires(const M& m) {
        { m.quantizable_layers() } -> std::convertible_to<std::vector<quantizable_layer>>;
      },
      "hone::compress: the model has no const member function quantizable_layers() returning a "
      "std::vector<hone::compress::quantizable_layer> (its linear layers: name, weight [out, in], "
      "bias, out_features, in_features; see hone/compress/ptq.hpp).");
  static_assert(
      requires(M & m, std::span<const float> x, std::size_t rows, const layer_input_hook& hook) {
        m.calibration_forward(x, rows, hook);
      },
      "hone::compress: the model has no member function calibration_forward(std::span<const "
      "float> x, std::size_t rows, const hone::compress::layer_input_hook& hook) that runs the "
      "fp32 forward pass and calls hook(layer, input, rows) before each linear layer.");
  return ptq_model<M>;
}

/// How a layer runs after post_training_quantize.
enum class ptq_mode : unsigned char { fp32, static_int8, dynamic_int8 };

[[nodiscard]] inline const char* ptq_mode_name(ptq_mode m) noexcept {
  switch (m) {
    case ptq_mode::fp32:
      return "fp32";
    case ptq_mode::static_int8:
      return "static_int8";
    case ptq_mode::dynamic_int8:
      return "dynamic_int8";
  }
  return "?";
}

/// Which observer picks a layer's activation range (quant.hpp's observers).
enum class ptq_observer : unsigned char { minmax, moving_average_minmax, percentile, mse };

struct ptq_options {
  /// static_int8 or dynamic_int8 (fp32 is refused: keep_fp32 names the layers that stay fp32).
  ptq_mode mode = ptq_mode::static_int8;
  quant_granularity granularity = quant_granularity::per_channel;      ///< of the weights
  ptq_observer observer = ptq_observer::minmax;                        ///< every layer's, unless:
  std::function<ptq_observer(std::string_view layer)> observer_for{};  ///< per layer, if set
  float averaging_constant = 0.01f;                         ///< moving_average_minmax_observer
  double percentile = 0.999;                                ///< percentile_observer
  std::size_t mse_candidates = 256;                         ///< mse_observer
  std::function<bool(std::string_view layer)> keep_fp32{};  ///< layers left in fp32, if set
};

/// One layer of a quantized model: fp32, static int8 or dynamic int8 (see the top of this file).
class ptq_linear {
 public:
  /// An fp32 layer (copies weight [out, in] and bias).
  static ptq_linear fp32(std::string name, std::span<const float> weight, std::size_t out,
                         std::size_t in, std::span<const float> bias = {}) {
    ptq_linear l(std::move(name), ptq_mode::fp32, out, in, bias);
    HONE_REQUIRE(weight.size() == out * in, l.who("fp32") + ": the weight holds " +
                                                std::to_string(weight.size()) + " values, but [" +
                                                std::to_string(out) + ", " + std::to_string(in) +
                                                "] needs " + std::to_string(out * in) + ".");
    l.w32_.assign(weight.begin(), weight.end());
    return l;
  }
  /// A static int8 layer: the weights' codes and the activation parameters (scale > 0, zero point
  /// in [0, 255]); `range` is the calibrated range they came from (kept for inspection).
  static ptq_linear static_int8(std::string name, quantized_weights q, std::span<const float> bias,
                                affine_params activation, quant_range range = {}) {
    const std::size_t out = q.rows, in = q.cols;
    ptq_linear l(std::move(name), ptq_mode::static_int8, out, in, bias);
    HONE_REQUIRE(std::isfinite(activation.scale) && activation.scale > 0.0f &&
                     activation.zero_point >= 0 && activation.zero_point <= 255,
                 l.who("static_int8") + ": the activation scale is " +
                     std::to_string(activation.scale) + " and the zero point " +
                     std::to_string(activation.zero_point) +
                     "; the scale must be finite and positive and the zero point in [0, 255].");
    HONE_REQUIRE(in <= 66000, l.who("static_int8") + ": in_features = " + std::to_string(in) +
                                  " is above 66000, where int32 accumulators of u8 x s8 products "
                                  "may overflow; keep the layer in fp32 or split it.");
    l.act_ = activation;
    l.range_ = range;
    l.q_ = std::move(q);
    l.packed_ = packed_int8_weights::pack(l.q_.values, out, in);
    l.wsum_.assign(out, 0);
    for (std::size_t o = 0; o < out; ++o) {
      for (std::size_t c = 0; c < in; ++c) l.wsum_[o] += l.q_.values[o * in + c];
    }
    return l;
  }
  /// A dynamic int8 layer (dynamic_int8_linear on q).
  static ptq_linear dynamic_int8(std::string name, quantized_weights q,
                                 std::span<const float> bias) {
    const std::size_t out = q.rows, in = q.cols;
    ptq_linear l(std::move(name), ptq_mode::dynamic_int8, out, in, bias);
    l.dyn_.emplace(q, bias);
    l.q_ = std::move(q);
    return l;
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] ptq_mode mode() const noexcept { return mode_; }
  [[nodiscard]] std::size_t in_features() const noexcept { return in_; }
  [[nodiscard]] std::size_t out_features() const noexcept { return out_; }
  /// The int8 weights (empty for an fp32 layer).
  [[nodiscard]] const quantized_weights& weights() const noexcept { return q_; }
  /// The fp32 weight [out, in] (empty for an int8 layer).
  [[nodiscard]] std::span<const float> fp32_weight() const noexcept { return w32_; }
  [[nodiscard]] std::span<const float> bias() const noexcept { return bias_; }
  /// Static int8: the activation scale and zero point, and the calibrated range they came from.
  [[nodiscard]] affine_params activation() const noexcept { return act_; }
  [[nodiscard]] quant_range activation_range() const noexcept { return range_; }
  /// Bytes of what the layer stores to run (weights, scales, bias, activation parameters).
  [[nodiscard]] std::size_t bytes() const noexcept {
    const std::size_t b = bias_.size() * sizeof(float);
    if (mode_ == ptq_mode::fp32) return w32_.size() * sizeof(float) + b;
    return q_.values.size() + q_.scales.size() * sizeof(float) + b +
           (mode_ == ptq_mode::static_int8 ? sizeof(float) + 1 : 0);
  }

  /// y [m, out_features] = x [m, in_features] W^T + b (overwrites y). x must be finite. Reuses
  /// internal scratch: one call at a time per layer object (copies are independent).
  void forward(std::span<const float> x, std::size_t m, std::span<float> y,
               int8_kernel kernel = int8_kernel::automatic) {
    const std::string w = who("forward");
    HONE_REQUIRE(x.size() == m * in_ && y.size() == m * out_,
                 w + ": x holds " + std::to_string(x.size()) + " values and y " +
                     std::to_string(y.size()) + "; with m = " + std::to_string(m) +
                     " rows they need m * in_features = " + std::to_string(m * in_) +
                     " and m * out_features = " + std::to_string(m * out_) + ".");
    switch (mode_) {
      case ptq_mode::dynamic_int8:
        dyn_->forward(x, m, y, kernel);
        return;
      case ptq_mode::fp32:
        if (!detail::all_finite(x)) detail::require_finite(x, in_, w.c_str());
        forward_fp32(x, m, y);
        return;
      case ptq_mode::static_int8:
        if (!detail::all_finite(x)) detail::require_finite(x, in_, w.c_str());
        forward_static(x, m, y, detail::resolve_kernel(kernel, w.c_str()));
        return;
    }
  }

  /// Static int8: the uint8 codes of the last forward's x ([m, kp], kp = in_features padded to a
  /// multiple of 4 with the zero point) and its int32 accumulators ([m, out padded to 16]);
  /// dynamic: those of the dynamic layer. Empty for fp32 layers. For tests and inspection.
  [[nodiscard]] std::span<const std::uint8_t> last_activations() const noexcept {
    return dyn_ ? dyn_->last_activations() : std::span<const std::uint8_t>(a_);
  }
  [[nodiscard]] std::span<const std::int32_t> last_accumulators() const noexcept {
    return dyn_ ? dyn_->last_accumulators() : std::span<const std::int32_t>(acc_);
  }

 private:
  ptq_linear(std::string name, ptq_mode mode, std::size_t out, std::size_t in,
             std::span<const float> bias)
      : name_(std::move(name)), mode_(mode), out_(out), in_(in) {
    HONE_REQUIRE(out > 0 && in > 0, who("ptq_linear") + ": the weight is [" + std::to_string(out) +
                                        ", " + std::to_string(in) +
                                        "]; a linear layer needs at least one input and one "
                                        "output feature.");
    HONE_REQUIRE(bias.empty() || bias.size() == out,
                 who("ptq_linear") + ": the bias holds " + std::to_string(bias.size()) +
                     " values; it must be empty or hold out_features = " + std::to_string(out) +
                     ".");
    bias_.assign(bias.begin(), bias.end());
  }

  [[nodiscard]] std::string who(const char* what) const {
    return "hone::compress::ptq_linear::" + std::string(what) + " (layer '" + name_ + "')";
  }

  void forward_fp32(std::span<const float> x, std::size_t m, std::span<float> y) const {
    for (std::size_t r = 0; r < m; ++r) {
      for (std::size_t o = 0; o < out_; ++o) {
        double s = bias_.empty() ? 0.0 : double{bias_[o]};
        for (std::size_t c = 0; c < in_; ++c) {
          s += static_cast<double>(x[r * in_ + c]) * static_cast<double>(w32_[o * in_ + c]);
        }
        y[r * out_ + o] = static_cast<float>(s);
      }
    }
  }

  void forward_static(std::span<const float> x, std::size_t m, std::span<float> y,
                      int8_kernel kern) {
    const std::size_t kp = packed_.kp, np = packed_.np;
    a_.resize(m * kp);
    acc_.resize(m * np);
    const float inv = 1.0f / act_.scale;
    const auto zp = static_cast<float>(act_.zero_point);
    for (std::size_t r = 0; r < m; ++r) {
      const auto xr = x.subspan(r * in_, in_);
      std::uint8_t* a = a_.data() + r * kp;
#if HONE_QUANT_X86
      if (kern == int8_kernel::avx512_vnni) {
        detail::quantize_codes_avx512(xr, a, inv, zp);
      } else {
        detail::quantize_codes_scalar(xr, a, inv, zp);
      }
#else
      detail::quantize_codes_scalar(xr, a, inv, zp);
#endif
      std::fill(a + in_, a + kp, static_cast<std::uint8_t>(act_.zero_point));  // weights 0 there
    }
    int8_gemm(a_, m, packed_, acc_, kern);
    const double sx = act_.scale;
    const std::int64_t z = act_.zero_point;
    for (std::size_t r = 0; r < m; ++r) {
      const std::int32_t* acc = acc_.data() + r * np;
      for (std::size_t o = 0; o < out_; ++o) {
        const double v = sx * static_cast<double>(q_.scale(o)) *
                         static_cast<double>(static_cast<std::int64_t>(acc[o]) - z * wsum_[o]);
        y[r * out_ + o] = static_cast<float>(v + (bias_.empty() ? 0.0 : double{bias_[o]}));
      }
    }
  }

  std::string name_;
  ptq_mode mode_;
  std::size_t out_, in_;
  std::vector<float> bias_;
  std::vector<float> w32_;  // fp32
  quantized_weights q_;     // int8
  affine_params act_{};     // static
  quant_range range_{};
  packed_int8_weights packed_;
  std::vector<std::int64_t> wsum_;
  std::vector<std::uint8_t> a_;
  std::vector<std::int32_t> acc_;
  std::optional<dynamic_int8_linear> dyn_;  // dynamic
};

/// The quantized layers of a model, in the order of its quantizable_layers().
class quantized_model {
 public:
  quantized_model() = default;
  explicit quantized_model(std::vector<ptq_linear> layers) : layers_(std::move(layers)) {}

  [[nodiscard]] std::size_t size() const noexcept { return layers_.size(); }
  [[nodiscard]] ptq_linear& layer(std::size_t l) { return layers_.at(l); }
  [[nodiscard]] const ptq_linear& layer(std::size_t l) const { return layers_.at(l); }
  /// The index of the layer called `name`; config_error naming it when there is none.
  [[nodiscard]] std::size_t index_of(std::string_view name) const {
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      if (layers_[l].name() == name) return l;
    }
    ::hone::detail::config_failure("hone::compress::quantized_model: no layer is called '" +
                                   std::string(name) + "'.");
  }
  [[nodiscard]] std::span<ptq_linear> layers() noexcept { return layers_; }
  [[nodiscard]] std::span<const ptq_linear> layers() const noexcept { return layers_; }
  /// Bytes of what the layers store to run.
  [[nodiscard]] std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for (const ptq_linear& l : layers_) n += l.bytes();
    return n;
  }

 private:
  std::vector<ptq_linear> layers_;
};

namespace detail {

using ptq_any_observer = std::variant<minmax_observer, moving_average_minmax_observer,
                                      percentile_observer, mse_observer>;

inline ptq_any_observer make_ptq_observer(ptq_observer k, const ptq_options& o) {
  switch (k) {
    case ptq_observer::minmax:
      return minmax_observer{};
    case ptq_observer::moving_average_minmax:
      return moving_average_minmax_observer(o.averaging_constant);
    case ptq_observer::percentile:
      return percentile_observer(o.percentile);
    case ptq_observer::mse:
      return mse_observer(o.mse_candidates);
  }
  return minmax_observer{};
}

inline void check_ptq_layers(const std::vector<quantizable_layer>& ls) {
  constexpr const char* who = "hone::compress::post_training_quantize";
  HONE_REQUIRE(!ls.empty(), std::string(who) +
                                ": the model's quantizable_layers() is empty; list "
                                "its linear layers there.");
  std::set<std::string, std::less<>> names;
  for (std::size_t l = 0; l < ls.size(); ++l) {
    const quantizable_layer& q = ls[l];
    const std::string at =
        std::string(who) + ": layer " + std::to_string(l) + " ('" + q.name + "')";
    HONE_REQUIRE(!q.name.empty(), at + " has an empty name; every layer needs a unique name (it "
                                       "names the layer's checkpoint tensors).");
    HONE_REQUIRE(names.insert(q.name).second,
                 at + " has the same name as an earlier layer; layer names must be unique.");
    HONE_REQUIRE(q.out_features > 0 && q.in_features > 0,
                 at + " is [" + std::to_string(q.out_features) + ", " +
                     std::to_string(q.in_features) +
                     "]; a linear layer needs at least one input "
                     "and one output feature.");
    HONE_REQUIRE(q.weight.size() == q.out_features * q.in_features,
                 at + ": the weight holds " + std::to_string(q.weight.size()) +
                     " values, but out_features * in_features = " +
                     std::to_string(q.out_features * q.in_features) + ".");
    HONE_REQUIRE(q.bias.empty() || q.bias.size() == q.out_features,
                 at + ": the bias holds " + std::to_string(q.bias.size()) +
                     " values; it must be empty or hold out_features = " +
                     std::to_string(q.out_features) + ".");
  }
}

}  // namespace detail

/// Post-training quantization of `model` (see the top of this file). `batches`: a range of
/// calibration batches, each a contiguous range of float holding whole rows of the first layer's
/// in_features values (the model's inputs); ignored (may be empty) in dynamic_int8 mode. Runs
/// model.calibration_forward on each batch in order, feeding every quantized layer's observer the
/// input the hook reports (observer.observe once per report), then quantizes every layer not kept
/// in fp32. config_error sentences: a bad layer list, no batches in static mode, a batch of the
/// wrong width, a reported input of the wrong size or holding NaN / infinity, a layer the forward
/// pass never reported.
template <class M, class Batches>
requires ptq_model<M>
[[nodiscard]] quantized_model post_training_quantize(M& model, Batches&& batches,
                                                     const ptq_options& options = {}) {
  constexpr const char* who = "hone::compress::post_training_quantize";
  HONE_REQUIRE(options.mode != ptq_mode::fp32,
               std::string(who) +
                   ": the mode is fp32; choose static_int8 or dynamic_int8 (name "
                   "the layers that stay fp32 with keep_fp32).");
  const std::vector<quantizable_layer> ls = model.quantizable_layers();
  detail::check_ptq_layers(ls);
  std::vector<bool> keep(ls.size(), false);
  for (std::size_t l = 0; l < ls.size(); ++l)
    keep[l] = options.keep_fp32 && options.keep_fp32(ls[l].name);

  std::vector<quant_range> ranges(ls.size());
  if (options.mode == ptq_mode::static_int8) {
    std::vector<detail::ptq_any_observer> obs;
    obs.reserve(ls.size());
    for (const quantizable_layer& q : ls) {
      obs.push_back(detail::make_ptq_observer(
          options.observer_for ? options.observer_for(q.name) : options.observer, options));
    }
    std::vector<std::size_t> seen(ls.size(), 0);
    std::size_t b = 0;
    const std::size_t width = ls[0].in_features;
    const layer_input_hook hook = [&](std::size_t l, std::span<const float> x, std::size_t rows) {
      const std::string at = std::string(who) + ": calibration batch " + std::to_string(b);
      HONE_REQUIRE(l < ls.size(), at + ": the model's calibration_forward reported layer " +
                                      std::to_string(l) + ", but quantizable_layers() lists " +
                                      std::to_string(ls.size()) + " layers.");
      const quantizable_layer& q = ls[l];
      HONE_REQUIRE(x.size() == rows * q.in_features,
                   at + ": the input reported for layer " + std::to_string(l) + " ('" + q.name +
                       "') holds " + std::to_string(x.size()) +
                       " values, not rows * in_features = " + std::to_string(rows) + " * " +
                       std::to_string(q.in_features) + ".");
      if (keep[l]) return;
      if (!detail::all_finite(x)) {
        std::size_t i = 0;
        while (std::isfinite(x[i])) ++i;
        ::hone::detail::config_failure(
            at + ": the input of layer " + std::to_string(l) + " ('" + q.name + "') is " +
            (std::isnan(x[i]) ? "NaN" : "infinite") + " at index " +
            detail::quant_index(i, q.in_features) +
            "; the fp32 model must produce finite activations on the calibration data (check the "
            "batch and the weights).");
      }
      std::visit([&](auto& o) { o.observe(x); }, obs[l]);
      ++seen[l];
    };
    for (const auto& batch : batches) {
      const std::span<const float> x(batch);
      HONE_REQUIRE(!x.empty() && x.size() % width == 0,
                   std::string(who) + ": calibration batch " + std::to_string(b) + " holds " +
                       std::to_string(x.size()) +
                       " values, not a whole, non-zero number of rows of the first layer's "
                       "in_features = " +
                       std::to_string(width) + " ('" + ls[0].name + "').");
      model.calibration_forward(x, x.size() / width, hook);
      ++b;
    }
    HONE_REQUIRE(b > 0, std::string(who) +
                            ": static int8 needs calibration batches, and none were given; pass "
                            "batches of the model's inputs, or choose ptq_mode::dynamic_int8, "
                            "which needs none.");
    for (std::size_t l = 0; l < ls.size(); ++l) {
      HONE_REQUIRE(keep[l] || seen[l] > 0,
                   std::string(who) +
                       ": the model's calibration_forward never reported the input "
                       "of layer " +
                       std::to_string(l) + " ('" + ls[l].name +
                       "'); call the hook with each layer's input before running the layer.");
      if (!keep[l]) ranges[l] = std::visit([](const auto& o) { return o.range(); }, obs[l]);
    }
  }

  std::vector<ptq_linear> out;
  out.reserve(ls.size());
  for (std::size_t l = 0; l < ls.size(); ++l) {
    const quantizable_layer& q = ls[l];
    if (keep[l]) {
      out.push_back(ptq_linear::fp32(q.name, q.weight, q.out_features, q.in_features, q.bias));
      continue;
    }
    quantized_weights w =
        quantize_weights(q.weight, q.out_features, q.in_features, options.granularity);
    if (options.mode == ptq_mode::static_int8) {
      out.push_back(ptq_linear::static_int8(q.name, std::move(w), q.bias, affine_uint8(ranges[l]),
                                            ranges[l]));
    } else {
      out.push_back(ptq_linear::dynamic_int8(q.name, std::move(w), q.bias));
    }
  }
  return quantized_model(std::move(out));
}

// ---- checkpoints ----
//
// A quantized model in a tensor file: for each layer N (its name), int8 layers: N.qweight and
// N.scale (add_quantized), fp32 layers: N.weight F32 [out, in]; N.bias F32 [out] when the layer has
// a bias. Metadata: "hone.ptq.layers" = the layer count; for layer i, "hone.ptq.i.name",
// "hone.ptq.i.mode" (fp32, static_int8, dynamic_int8) and, static, "hone.ptq.i.activation" =
// "<scale> <zero point> <range lo> <range hi>" (floats as C hexadecimal, exact).

namespace detail {
inline std::string ptq_hex(float v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", static_cast<double>(v));
  return buf;
}
}  // namespace detail

/// Adds q's tensors and metadata to the writer. The writer borrows q's storage: q must stay alive
/// and unchanged until the file is written.
inline void add_quantized_model(checkpoint::tensor_writer& w, const quantized_model& q) {
  w.set_metadata("hone.ptq.layers", std::to_string(q.size()));
  for (std::size_t i = 0; i < q.size(); ++i) {
    const ptq_linear& l = q.layer(i);
    const std::string key = "hone.ptq." + std::to_string(i) + ".";
    w.set_metadata(key + "name", l.name());
    w.set_metadata(key + "mode", ptq_mode_name(l.mode()));
    if (l.mode() == ptq_mode::fp32) {
      w.add(l.name() + ".weight", checkpoint::shape_type{l.out_features(), l.in_features()},
            l.fp32_weight());
    } else {
      add_quantized(w, l.name(), l.weights());
    }
    if (!l.bias().empty()) {
      w.add(l.name() + ".bias", checkpoint::shape_type{l.out_features()}, l.bias());
    }
    if (l.mode() == ptq_mode::static_int8) {
      w.set_metadata(key + "activation", detail::ptq_hex(l.activation().scale) + " " +
                                             std::to_string(l.activation().zero_point) + " " +
                                             detail::ptq_hex(l.activation_range().lo) + " " +
                                             detail::ptq_hex(l.activation_range().hi));
    }
  }
}

/// Writes q to `path` (plain safetensors, or compressed per `options`).
inline io::file_digest save_quantized_model(const quantized_model& q,
                                            const std::filesystem::path& path,
                                            const checkpoint::write_options& options = {}) {
  checkpoint::tensor_writer w;
  add_quantized_model(w, q);
  return checkpoint::write_tensors(w, path, options);
}

/// Reads the quantized model add_quantized_model stored; checkpoint_error naming the file and what
/// is missing or malformed.
[[nodiscard]] inline quantized_model read_quantized_model(const checkpoint::tensor_file& f) {
  const auto bad = [&](const std::string& what) {
    throw checkpoint_error("hone: '" + f.context() + "': quantized model: " + what);
  };
  const auto& md = f.metadata();
  const auto get = [&](const std::string& key) -> const std::string& {
    const auto it = md.find(key);
    if (it == md.end())
      bad("the metadata has no \"" + key + "\" (not written by add_quantized_model?).");
    return it->second;
  };
  const std::string& count_text = get("hone.ptq.layers");
  char* end = nullptr;
  const unsigned long long count = std::strtoull(count_text.c_str(), &end, 10);
  if (count_text.empty() || *end != '\0')
    bad("\"hone.ptq.layers\" is '" + count_text + "', not a count.");
  std::vector<ptq_linear> layers;
  for (std::size_t i = 0; i < count; ++i) {
    const std::string key = "hone.ptq." + std::to_string(i) + ".";
    const std::string& name = get(key + "name");
    const std::string& mode = get(key + "mode");
    std::vector<float> bias;
    if (f.find(name + ".bias") != nullptr) bias = f.read_as<float>(name + ".bias");
    if (mode == "fp32") {
      const checkpoint::tensor_info& t = f.at(name + ".weight");
      if (t.type != io::dtype::f32 || t.shape.size() != 2) {
        bad("layer '" + name + "': the weight must be a 2-D F32 tensor.");
      }
      const std::vector<float> w = f.read_as<float>(name + ".weight");
      layers.push_back(ptq_linear::fp32(name, w, static_cast<std::size_t>(t.shape[0]),
                                        static_cast<std::size_t>(t.shape[1]), bias));
    } else if (mode == "dynamic_int8") {
      layers.push_back(ptq_linear::dynamic_int8(name, read_quantized(f, name), bias));
    } else if (mode == "static_int8") {
      const std::string& a = get(key + "activation");
      const char* p = a.c_str();
      char* e = nullptr;
      const float scale = std::strtof(p, &e);
      const long zp = e != p ? std::strtol(p = e, &e, 10) : 0;
      const float lo = e != p ? std::strtof(p = e, &e) : 0.0f;
      const float hi = e != p ? std::strtof(p = e, &e) : 0.0f;
      if (e == p || *e != '\0') {
        bad("layer '" + name + "': the activation parameters '" + a +
            "' are not '<scale> <zero point> <lo> <hi>'.");
      }
      if (!(scale > 0.0f) || !std::isfinite(scale) || zp < 0 || zp > 255) {
        bad("layer '" + name + "': the activation scale " + std::to_string(scale) +
            " and zero point " + std::to_string(zp) +
            " are invalid (the scale must be finite and positive, the zero point in [0, 255]).");
      }
      layers.push_back(ptq_linear::static_int8(name, read_quantized(f, name), bias,
                                               {scale, static_cast<std::int32_t>(zp)}, {lo, hi}));
    } else {
      bad("layer '" + name + "' has mode '" + mode +
          "'; it must be fp32, static_int8 or "
          "dynamic_int8.");
    }
  }
  return quantized_model(std::move(layers));
}

/// Opens `path` and reads the quantized model in it.
[[nodiscard]] inline quantized_model load_quantized_model(const std::filesystem::path& path) {
  return read_quantized_model(checkpoint::tensor_file::open(path));
}

}  // namespace compress
HONE_NAMESPACE_END
