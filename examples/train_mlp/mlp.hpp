// examples/train_mlp/mlp.hpp: the user's model, a multi-layer perceptron written by hand.
//
//   inputs -> fc1 -> ReLU -> fc2 -> ReLU -> fc3 -> softmax cross-entropy
//
// hone never sees the forward pass: it sees parameters() (name, shape, value and gradient views)
// and forward_backward(batch, loss_scale) (returns the mean loss, writes the gradients of
// loss * loss_scale). The model is a template on its working type T (float, hone::bfloat16 or
// hone::half): values and gradients live in two hone arenas of T laid out by one
// hone::arena_layout, so with T = float the trainer updates them in place (zero copy), and with
// 16-bit T the trainer keeps fp32 master weights and casts them back into these arenas after
// each update.
//
// Compute is float: each micro-batch converts the working weights to a float arena once (for
// T = float the arena itself is used), runs forward and backward in float (matrix products as
// cache-friendly loops below, element-wise steps with xtensor over hone::xtensor::adapt views of
// the same memory: arena slots and scratch buffers, no copy), and rounds the scaled gradients to T
// at the end. With fp16 a scaled gradient beyond 65504 becomes inf, which the trainer detects and
// skips.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <hone/core/arena.hpp>
#include <hone/core/config.hpp>
#include <hone/core/model.hpp>
#include <hone/xtensor/adapt.hpp>
#include <span>
#include <string>
#include <type_traits>
#include <vector>
#include <xtensor/xmath.hpp>
#include <xtensor/xoperation.hpp>
#include <xtensor/xreducer.hpp>

#include "dataset.hpp"
#include "mlp_common.hpp"

namespace train_mlp {

namespace kernels {
// Matrices are row-major. The innermost loops run over contiguous memory and vectorize at -O2.

/// out[m x n] = a[m x k] * w[k x n] + bias[n]
inline void linear_forward(const float* HONE_RESTRICT a, const float* HONE_RESTRICT w,
                           const float* HONE_RESTRICT bias, float* HONE_RESTRICT out, std::size_t m,
                           std::size_t k, std::size_t n) {
  for (std::size_t i = 0; i < m; ++i) {
    float* HONE_RESTRICT o = out + i * n;
    for (std::size_t j = 0; j < n; ++j) o[j] = bias[j];
    for (std::size_t p = 0; p < k; ++p) {
      const float av = a[i * k + p];
      if (av == 0.0f) continue;  // ReLU outputs are often 0
      const float* HONE_RESTRICT wr = w + p * n;
      for (std::size_t j = 0; j < n; ++j) o[j] += av * wr[j];
    }
  }
}

/// g[k x n] = a^T * d, with a[m x k] and d[m x n] (the weight gradient).
inline void matmul_at_b(const float* HONE_RESTRICT a, const float* HONE_RESTRICT d,
                        float* HONE_RESTRICT g, std::size_t m, std::size_t k, std::size_t n) {
  std::fill(g, g + k * n, 0.0f);
  for (std::size_t i = 0; i < m; ++i) {
    const float* HONE_RESTRICT dr = d + i * n;
    for (std::size_t p = 0; p < k; ++p) {
      const float av = a[i * k + p];
      if (av == 0.0f) continue;
      float* HONE_RESTRICT gr = g + p * n;
      for (std::size_t j = 0; j < n; ++j) gr[j] += av * dr[j];
    }
  }
}

/// e[m x k] = d[m x n] * w^T, with w[k x n] (the input gradient); wt: scratch of n * k floats.
inline void matmul_a_bt(const float* HONE_RESTRICT d, const float* HONE_RESTRICT w,
                        float* HONE_RESTRICT e, float* HONE_RESTRICT wt, std::size_t m,
                        std::size_t k, std::size_t n) {
  for (std::size_t p = 0; p < k; ++p) {
    for (std::size_t j = 0; j < n; ++j) wt[j * k + p] = w[p * n + j];
  }
  for (std::size_t i = 0; i < m; ++i) {
    float* HONE_RESTRICT er = e + i * k;
    std::fill(er, er + k, 0.0f);
    for (std::size_t j = 0; j < n; ++j) {
      const float dv = d[i * n + j];
      if (dv == 0.0f) continue;
      const float* HONE_RESTRICT wr = wt + j * k;
      for (std::size_t p = 0; p < k; ++p) er[p] += dv * wr[p];
    }
  }
}
}  // namespace kernels

template <class T>
class mlp {
  static constexpr std::size_t layers = mlp_layers;

 public:
  using value_type = T;

  /// inputs -> hidden -> hidden -> classes, random weights from `seed`, zero biases.
  mlp(std::size_t inputs, std::size_t hidden, std::size_t classes, std::uint64_t seed)
      : sizes_{inputs, hidden, hidden, classes}, layout_(mlp_layout(sizes_, sizeof(T))) {
    values_ = hone::arena<T>(layout_);
    grads_ = hone::arena<T>(layout_);
    const auto init = initial_weights(sizes_, seed);  // mlp_common.hpp; the CUDA model's too
    for (std::size_t l = 0; l < layers; ++l) {
      const auto w = values_.view(2 * l);
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = T(init[l][i]);
    }
    if constexpr (!std::is_same_v<T, float>) {
      weights_f32_ = hone::arena<float>(mlp_layout(sizes_, sizeof(float)));
      grads_f32_ = hone::arena<float>(mlp_layout(sizes_, sizeof(float)));
    }
  }

  // The model cannot move: parameters() hands out views of its arenas.
  mlp(const mlp&) = delete;
  mlp& operator=(const mlp&) = delete;

  /// fc1.weight [inputs x hidden], fc1.bias [hidden], ... (y = x W + b).
  std::vector<hone::parameter<T>> parameters() {
    return mlp_parameters<T, hone::host_space>(layout_, sizes_, values_, grads_);
  }

  /// Mean cross-entropy over the batch; writes d(loss * loss_scale)/d(parameter) in T.
  float forward_backward(const batch& b, float loss_scale) {
    const std::size_t n = b.count();
    const std::size_t k = sizes_[layers];
    const hone::arena<float>& w = float_weights();
    hone::arena<float>& g = float_grads();
    const double loss = forward(w, b, n);

    // d(loss * scale)/d(logits) = (softmax - onehot) * scale / n
    auto d = matrix(delta_[layers - 1], n, k);
    const float s = loss_scale / static_cast<float>(n);
    d = matrix(probs_, n, k) * s;
    for (std::size_t i = 0; i < n; ++i) d(i, static_cast<std::size_t>(b.y[i])) -= s;

    for (std::size_t l = layers; l-- > 0;) {
      const std::size_t in = sizes_[l], out = sizes_[l + 1];
      const float* input = l == 0 ? b.x.data() : post_[l - 1].data();
      auto dl = matrix(delta_[l], n, out);
      kernels::matmul_at_b(input, delta_[l].data(), g.view(2 * l).data(), n, in, out);
      hone::xtensor::adapt(g, 2 * l + 1) = xt::sum(dl, {0});  // the bias gradient's arena slot
      if (l > 0) {
        kernels::matmul_a_bt(delta_[l].data(), w.view(2 * l).data(), delta_[l - 1].data(),
                             transposed_.data(), n, in, out);
        auto z = matrix(pre_[l - 1], n, in);
        auto dprev = matrix(delta_[l - 1], n, in);
        dprev = xt::where(z > 0.0f, dprev, 0.0f);  // ReLU'
      }
    }
    store_grads();
    return static_cast<float>(loss);
  }

  /// Loss and accuracy on a whole split (forward only, in chunks).
  evaluation evaluate(const split& data, std::size_t features) {
    const hone::arena<float>& w = float_weights();
    const std::size_t k = sizes_[layers];
    constexpr std::size_t chunk = 512;
    double loss_sum = 0.0;
    std::size_t correct = 0;
    for (std::size_t start = 0; start < data.size(); start += chunk) {
      const std::size_t n = std::min(chunk, data.size() - start);
      const batch b{std::span<const float>(data.x).subspan(start * features, n * features),
                    std::span<const std::int32_t>(data.y).subspan(start, n)};
      loss_sum += forward(w, b, n) * static_cast<double>(n);
      const auto logits = matrix(pre_[layers - 1], n, k);
      for (std::size_t i = 0; i < n; ++i) {
        std::size_t best = 0;
        for (std::size_t c = 1; c < k; ++c) best = logits(i, c) > logits(i, best) ? c : best;
        correct += best == static_cast<std::size_t>(b.y[i]) ? 1 : 0;
      }
    }
    const auto total = static_cast<double>(data.size());
    return {loss_sum / total, static_cast<double>(correct) / total};
  }

  [[nodiscard]] const hone::arena_layout& layout() const noexcept { return layout_; }

 private:
  // A rows x cols xtensor view of the first rows * cols floats of a scratch buffer (no copy).
  static auto matrix(std::vector<float>& v, std::size_t rows, std::size_t cols) {
    return hone::xtensor::adapt(std::span<float>(v).first(rows * cols), {rows, cols});
  }

  // The working weights as a float arena: the arena itself for T = float, else converted once.
  const hone::arena<float>& float_weights() {
    if constexpr (std::is_same_v<T, float>) {
      return values_;
    } else {
      for (std::size_t slot = 0; slot < layout_.size(); ++slot) {
        const auto from = values_.view(slot);
        const auto to = weights_f32_.view(slot);
        for (std::size_t i = 0; i < from.size(); ++i) to[i] = static_cast<float>(from[i]);
      }
      return weights_f32_;
    }
  }
  hone::arena<float>& float_grads() {
    if constexpr (std::is_same_v<T, float>) {
      return grads_;
    } else {
      return grads_f32_;
    }
  }
  // Rounds the float gradients into the working gradient arena (nothing to do for float).
  void store_grads() {
    if constexpr (!std::is_same_v<T, float>) {
      for (std::size_t slot = 0; slot < layout_.size(); ++slot) {
        const auto from = grads_f32_.view(slot);
        const auto to = grads_.view(slot);
        for (std::size_t i = 0; i < from.size(); ++i) to[i] = static_cast<T>(from[i]);
      }
    }
  }

  // Forward pass over n samples; leaves pre-activations, ReLU outputs, logits (pre_[2]) and
  // softmax probabilities in the scratch buffers. Returns the mean cross-entropy.
  double forward(const hone::arena<float>& w, const batch& b, std::size_t n) {
    reserve(n);
    for (std::size_t l = 0; l < layers; ++l) {
      const std::size_t in = sizes_[l], out = sizes_[l + 1];
      const float* input = l == 0 ? b.x.data() : post_[l - 1].data();
      kernels::linear_forward(input, w.view(2 * l).data(), w.view(2 * l + 1).data(), pre_[l].data(),
                              n, in, out);
      if (l + 1 < layers) matrix(post_[l], n, out) = xt::maximum(matrix(pre_[l], n, out), 0.0f);
    }
    // Softmax and cross-entropy, stable: loss_i = max_i + log(sum_j exp(z_ij - max_i)) - z_i,y_i.
    const std::size_t k = sizes_[layers];
    const auto z = matrix(pre_[layers - 1], n, k);
    auto p = matrix(probs_, n, k);
    const auto zmax = xt::eval(xt::amax(z, {1}, xt::keep_dims));
    p = xt::exp(z - zmax);
    const auto sum = xt::eval(xt::sum(p, {1}, xt::keep_dims));
    p /= sum;
    double loss = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      loss += static_cast<double>(zmax(i, 0)) + std::log(static_cast<double>(sum(i, 0))) -
              static_cast<double>(z(i, static_cast<std::size_t>(b.y[i])));
    }
    return loss / static_cast<double>(n);
  }

  void reserve(std::size_t n) {
    for (std::size_t l = 0; l < layers; ++l) {
      const std::size_t need = n * sizes_[l + 1];
      if (pre_[l].size() < need) pre_[l].resize(need);
      if (delta_[l].size() < need) delta_[l].resize(need);
      if (l + 1 < layers && post_[l].size() < need) post_[l].resize(need);
    }
    if (probs_.size() < n * sizes_[layers]) probs_.resize(n * sizes_[layers]);
    std::size_t widest = 0;
    for (std::size_t l = 0; l < layers; ++l) widest = std::max(widest, sizes_[l] * sizes_[l + 1]);
    if (transposed_.size() < widest) transposed_.resize(widest);
  }

  layer_sizes sizes_;
  hone::arena_layout layout_;
  hone::arena<T> values_, grads_;
  hone::arena<float> weights_f32_, grads_f32_;  // float copies (16-bit T only)
  // Scratch, per layer: pre-activations, ReLU outputs (hidden layers), gradients w.r.t. the
  // pre-activations; softmax probabilities; a transposed weight matrix.
  std::array<std::vector<float>, layers> pre_, post_, delta_;
  std::vector<float> probs_, transposed_;
};

}  // namespace train_mlp
