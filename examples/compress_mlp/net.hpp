// examples/compress_mlp/net.hpp: the trained MLP as an inference network, and the layer engines
// that run each compressed variant of it.
//
// train_mlp's model (train_mlp/mlp.hpp) keeps its weights as y = x W + b with W [in x out], the
// layout its training loops want. hone's compression routes take PyTorch's nn.Linear layout
// (y = x W^T + b, W [out, in]), so the trained parameters are copied once into a dense_mlp of
// linear_layers in that layout (from_trained) and back (to_trained) when a variant is fine-tuned.
// dense_mlp also implements hone's structured-pruning hook (hone/compress/structured.hpp).
//
// An engine_net is a stack of layer engines with ReLU between them; each engine runs one linear
// layer in one representation: fp32 (train_mlp's own forward kernel), 2:4 sparse
// (hone::compress::sparse24_matmul), or static or dynamic int8 (a layer of the quantized model
// hone::compress::post_training_quantize returns).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <hone/compress/ptq.hpp>
#include <hone/compress/quant.hpp>
#include <hone/compress/quant_linear.hpp>
#include <hone/compress/sparse24.hpp>
#include <hone/compress/structured.hpp>
#include <hone/core/error.hpp>
#include <hone/core/model.hpp>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "train_mlp/mlp.hpp"

#if COMPRESS_MLP_OPENBLAS
#include <cblas.h>  // OpenBLAS (CMakeLists.txt finds it): the fp32 reference row through sgemm
#endif

namespace compress_mlp {

namespace hc = hone::compress;

/// One linear layer in PyTorch's layout: y = x W^T + b, W [out, in] row-major, b [out].
struct linear_layer {
  std::size_t in = 0, out = 0;
  std::vector<float> w;
  std::vector<float> b;
};

/// Linear layers with a ReLU after every layer but the last. Copyable (a variant starts as a
/// copy of the trained model). Implements the neuron_prunable hook: layer l's neurons are the
/// outputs of linear layer l (rows of its W and entries of its b) read by the columns of linear
/// layer l + 1.
struct dense_mlp {
  std::vector<linear_layer> layers;

  [[nodiscard]] std::size_t parameter_count() const {
    std::size_t n = 0;
    for (const linear_layer& l : layers) n += l.w.size() + l.b.size();
    return n;
  }
  /// Widths: inputs, then each layer's outputs.
  [[nodiscard]] std::vector<std::size_t> widths() const {
    std::vector<std::size_t> w{layers.front().in};
    for (const linear_layer& l : layers) w.push_back(l.out);
    return w;
  }

  // ---- hone::compress::neuron_prunable: the hidden layers ----
  [[nodiscard]] std::size_t neuron_layer_count() const { return layers.size() - 1; }
  [[nodiscard]] hc::neuron_layer_view neuron_layer(std::size_t l) const {
    const linear_layer& p = layers[l];
    const linear_layer& r = layers[l + 1];
    return {.in = p.w, .neurons = p.out, .in_features = p.in, .out = r.w, .out_features = r.out};
  }
  void keep_neurons(std::size_t l, std::span<const std::size_t> kept) {
    linear_layer& p = layers[l];
    linear_layer& r = layers[l + 1];
    p.w = hc::keep_rows(p.w, p.out, p.in, kept);
    p.b = hc::keep_rows(p.b, p.out, 1, kept);
    r.w = hc::keep_cols(r.w, r.out, r.in, kept);
    p.out = kept.size();
    r.in = kept.size();
  }
};
static_assert(hc::check_neuron_prunable<dense_mlp>());

/// The parameters of a model in train_mlp's layout (weight [in, out] then bias [out], layer by
/// layer, as train_mlp::mlp<float>::parameters() lists them) as a dense_mlp (W transposed).
inline dense_mlp from_trained(const std::vector<hone::parameter<float>>& ps) {
  HONE_REQUIRE(ps.size() % 2 == 0 && !ps.empty(),
               "compress_mlp::from_trained: expected weight and bias pairs, got " +
                   std::to_string(ps.size()) + " parameters");
  dense_mlp net;
  for (std::size_t i = 0; i < ps.size(); i += 2) {
    const auto& w = ps[i];
    const auto& b = ps[i + 1];
    HONE_REQUIRE(w.shape.size() == 2 && b.shape.size() == 1 && b.shape[0] == w.shape[1],
                 "compress_mlp::from_trained: '" + w.name + "' and '" + b.name +
                     "' are not a weight [in, out] and its bias [out]");
    linear_layer l{.in = w.shape[0], .out = w.shape[1], .w = {}, .b = {}};
    l.w.resize(l.in * l.out);
    for (std::size_t i_in = 0; i_in < l.in; ++i_in) {
      for (std::size_t o = 0; o < l.out; ++o) l.w[o * l.in + i_in] = w.value[i_in * l.out + o];
    }
    l.b.assign(b.value.begin(), b.value.end());
    net.layers.push_back(std::move(l));
  }
  return net;
}

/// Writes a dense_mlp into the parameters of a model in train_mlp's layout of the same shapes.
inline void to_trained(const dense_mlp& net, const std::vector<hone::parameter<float>>& ps) {
  HONE_REQUIRE(ps.size() == 2 * net.layers.size(),
               "compress_mlp::to_trained: the model has " + std::to_string(ps.size()) +
                   " parameters, the network " + std::to_string(net.layers.size()) + " layers");
  for (std::size_t l = 0; l < net.layers.size(); ++l) {
    const linear_layer& src = net.layers[l];
    const auto& w = ps[2 * l];
    const auto& b = ps[2 * l + 1];
    HONE_REQUIRE(w.shape.size() == 2 && w.shape[0] == src.in && w.shape[1] == src.out,
                 "compress_mlp::to_trained: '" + w.name + "' does not have the shape [" +
                     std::to_string(src.in) + ", " + std::to_string(src.out) + "]");
    for (std::size_t i_in = 0; i_in < src.in; ++i_in) {
      for (std::size_t o = 0; o < src.out; ++o)
        w.value[i_in * src.out + o] = src.w[o * src.in + i_in];
    }
    std::copy(src.b.begin(), src.b.end(), b.value.begin());
  }
}

// ---- layer engines ----

/// One linear layer of an inference network: y [m, out] = x [m, in] W^T + b.
class layer_engine {
 public:
  layer_engine() = default;
  layer_engine(const layer_engine&) = delete;
  layer_engine& operator=(const layer_engine&) = delete;
  virtual ~layer_engine() = default;
  virtual void forward(std::span<const float> x, std::size_t m, std::span<float> y) = 0;
  [[nodiscard]] virtual std::size_t in() const = 0;
  [[nodiscard]] virtual std::size_t out() const = 0;
  /// Bytes of what the layer stores to run (weights, scales, bias, metadata).
  [[nodiscard]] virtual std::size_t bytes() const = 0;
};

/// fp32, with train_mlp's forward kernel (the one its training and evaluation run) on W^T.
class fp32_linear final : public layer_engine {
 public:
  explicit fp32_linear(const linear_layer& l) : in_(l.in), out_(l.out), wt_(l.in * l.out), b_(l.b) {
    for (std::size_t o = 0; o < out_; ++o) {
      for (std::size_t i = 0; i < in_; ++i) wt_[i * out_ + o] = l.w[o * in_ + i];
    }
  }
  void forward(std::span<const float> x, std::size_t m, std::span<float> y) override {
    train_mlp::kernels::linear_forward(x.data(), wt_.data(), b_.data(), y.data(), m, in_, out_);
  }
  [[nodiscard]] std::size_t in() const override { return in_; }
  [[nodiscard]] std::size_t out() const override { return out_; }
  [[nodiscard]] std::size_t bytes() const override {
    return (wt_.size() + b_.size()) * sizeof(float);
  }

 private:
  std::size_t in_, out_;
  std::vector<float> wt_, b_;
};

#if COMPRESS_MLP_OPENBLAS
/// fp32 through OpenBLAS: y = x W^T + b as one cblas_sgemm (W [out, in] as stored), the bias
/// broadcast first. The tuned fp32 GEMM, for reference beside train_mlp's plain loops.
class blas_linear final : public layer_engine {
 public:
  explicit blas_linear(const linear_layer& l) : in_(l.in), out_(l.out), w_(l.w), b_(l.b) {}
  void forward(std::span<const float> x, std::size_t m, std::span<float> y) override {
    for (std::size_t r = 0; r < m; ++r) std::copy(b_.begin(), b_.end(), y.begin() + r * out_);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                static_cast<int>(out_), static_cast<int>(in_), 1.0f, x.data(),
                static_cast<int>(in_), w_.data(), static_cast<int>(in_), 1.0f, y.data(),
                static_cast<int>(out_));
  }
  [[nodiscard]] std::size_t in() const override { return in_; }
  [[nodiscard]] std::size_t out() const override { return out_; }
  [[nodiscard]] std::size_t bytes() const override {
    return (w_.size() + b_.size()) * sizeof(float);
  }

 private:
  std::size_t in_, out_;
  std::vector<float> w_, b_;
};
#endif

/// 2:4 sparse weights (hone::compress::sparse24_matrix, packed) and an fp32 bias.
class sparse24_linear final : public layer_engine {
 public:
  sparse24_linear(hc::sparse24_matrix w, std::span<const float> b)
      : w_(std::move(w)), b_(b.begin(), b.end()) {}
  void forward(std::span<const float> x, std::size_t m, std::span<float> y) override {
    hc::sparse24_matmul(w_, x, m, y);
    const std::size_t n = w_.rows();
    for (std::size_t r = 0; r < m; ++r) {
      for (std::size_t o = 0; o < n; ++o) y[r * n + o] += b_[o];
    }
  }
  [[nodiscard]] std::size_t in() const override { return w_.cols(); }
  [[nodiscard]] std::size_t out() const override { return w_.rows(); }
  [[nodiscard]] std::size_t bytes() const override {
    return w_.bytes() + b_.size() * sizeof(float);
  }
  [[nodiscard]] const hc::sparse24_matrix& matrix() const noexcept { return w_; }

 private:
  hc::sparse24_matrix w_;
  std::vector<float> b_;
};

/// An int8 layer of hone::compress::post_training_quantize's quantized_model: static (weights
/// int8 per row, activations uint8 with the scale and zero point fixed by calibration) or dynamic
/// (hone::compress::dynamic_int8_linear inside).
class ptq_int8 final : public layer_engine {
 public:
  explicit ptq_int8(hc::ptq_linear l) : l_(std::move(l)) {}
  void forward(std::span<const float> x, std::size_t m, std::span<float> y) override {
    l_.forward(x, m, y);
  }
  [[nodiscard]] std::size_t in() const override { return l_.in_features(); }
  [[nodiscard]] std::size_t out() const override { return l_.out_features(); }
  [[nodiscard]] std::size_t bytes() const override { return l_.bytes(); }

 private:
  hc::ptq_linear l_;
};

/// Layer engines with a ReLU after each but the last.
class engine_net {
 public:
  void add(std::unique_ptr<layer_engine> e) { layers_.push_back(std::move(e)); }
  [[nodiscard]] std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& l : layers_) n += l->bytes();
    return n;
  }
  [[nodiscard]] std::size_t classes() const { return layers_.back()->out(); }
  [[nodiscard]] std::size_t size() const { return layers_.size(); }
  [[nodiscard]] layer_engine& layer(std::size_t i) { return *layers_.at(i); }

  /// logits [m, classes] of x [m, inputs]. The input of layer l >= 1 (a ReLU output) stays in
  /// input_of(l) until the next call (for calibration; layer 0's input is x).
  void forward(std::span<const float> x, std::size_t m, std::span<float> logits) {
    acts_.resize(layers_.size());
    std::span<const float> in = x;
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      layer_engine& e = *layers_[l];
      if (l + 1 == layers_.size()) {
        e.forward(in, m, logits.first(m * e.out()));
        break;
      }
      std::vector<float>& a = acts_[l + 1];
      a.resize(m * e.out());
      e.forward(in, m, a);
      for (float& v : a) v = std::max(v, 0.0f);
      in = a;
    }
  }
  [[nodiscard]] std::span<const float> input_of(std::size_t l) const {
    HONE_REQUIRE(l >= 1 && l < acts_.size(),
                 "compress_mlp::engine_net::input_of: layer " + std::to_string(l) +
                     " has no kept input (layer 0 reads x; run forward first)");
    return acts_[l];
  }

 private:
  std::vector<std::unique_ptr<layer_engine>> layers_;
  std::vector<std::vector<float>> acts_;
};

/// The fp32 inference network of a dense_mlp.
inline engine_net fp32_net(const dense_mlp& net) {
  engine_net e;
  for (const linear_layer& l : net.layers) e.add(std::make_unique<fp32_linear>(l));
  return e;
}

}  // namespace compress_mlp
