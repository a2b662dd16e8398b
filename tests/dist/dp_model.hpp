// tests/dist/dp_model.hpp: the model the data-parallel tests train: a two-layer perceptron
// (6 inputs, 8 tanh units, 1 output) with mean squared error, written with plain loops, weights
// and gradients in working type T (float or hone::half), computed in float, and a fault-injection
// hook in the batch. 65 parameters in four tensors, so that small buckets cut across tensors.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <hone/core/model.hpp>
#include <random>
#include <vector>

struct mlp_batch {
  std::vector<float> x;  // rows * 6
  std::vector<float> y;  // rows
  float poison = 0;      // when non-zero, written into the gradient of layer1.weight[3]
  [[nodiscard]] std::size_t count() const { return y.size(); }
};

/// `rows` samples of y = sin(x0) + 0.5 x1 x2 - 0.3 x3 with x ~ N(0, 1), reproducible by seed.
inline mlp_batch make_mlp_batch(std::size_t rows, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0, 1);
  mlp_batch b{std::vector<float>(rows * 6), std::vector<float>(rows)};
  for (auto& v : b.x) v = n(rng);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* x = &b.x[r * 6];
    b.y[r] = std::sin(x[0]) + 0.5f * x[1] * x[2] - 0.3f * x[3];
  }
  return b;
}

template <class T>
struct mlp {
  static constexpr std::size_t in = 6, hidden = 8;
  std::vector<T> w1, gw1, b1, gb1, w2, gw2, b2, gb2;

  mlp()
      : w1(hidden * in),
        gw1(hidden * in),
        b1(hidden),
        gb1(hidden),
        w2(hidden),
        gw2(hidden),
        b2(1),
        gb2(1) {
    for (std::size_t i = 0; i < w1.size(); ++i)
      w1[i] = T(0.4f * std::sin(1.7f * static_cast<float>(i) + 0.3f));
    for (std::size_t i = 0; i < hidden; ++i) {
      b1[i] = T(0.05f * static_cast<float>(i % 3) - 0.05f);
      w2[i] = T(0.5f * std::cos(0.9f * static_cast<float>(i)));
    }
    b2[0] = T(0.1f);
  }

  std::vector<hone::parameter<T>> parameters() {
    return {{"layer1.weight", {hidden, in}, w1, gw1},
            {"layer1.bias", {hidden}, b1, gb1},
            {"layer2.weight", {1, hidden}, w2, gw2},
            {"layer2.bias", {1}, b2, gb2}};
  }

  float forward_backward(const mlp_batch& bt, float scale) {
    std::vector<float> g1(hidden * in, 0.0f), gh(hidden, 0.0f), g2(hidden, 0.0f);
    float g2b = 0, loss = 0;
    const std::size_t rows = bt.y.size();
    const auto nrows = static_cast<float>(rows);
    float h[hidden];
    for (std::size_t r = 0; r < rows; ++r) {
      const float* x = &bt.x[r * in];
      float pred = static_cast<float>(b2[0]);
      for (std::size_t j = 0; j < hidden; ++j) {
        float a = static_cast<float>(b1[j]);
        for (std::size_t c = 0; c < in; ++c) a += static_cast<float>(w1[j * in + c]) * x[c];
        h[j] = std::tanh(a);
        pred += static_cast<float>(w2[j]) * h[j];
      }
      const float e = pred - bt.y[r];
      loss += e * e / nrows;
      const float de = 2 * e / nrows;
      g2b += de;
      for (std::size_t j = 0; j < hidden; ++j) {
        g2[j] += de * h[j];
        const float da = de * static_cast<float>(w2[j]) * (1 - h[j] * h[j]);
        gh[j] += da;
        for (std::size_t c = 0; c < in; ++c) g1[j * in + c] += da * x[c];
      }
    }
    for (std::size_t i = 0; i < g1.size(); ++i) gw1[i] = T(g1[i] * scale);
    for (std::size_t j = 0; j < hidden; ++j) {
      gb1[j] = T(gh[j] * scale);
      gw2[j] = T(g2[j] * scale);
    }
    gb2[0] = T(g2b * scale);
    if (bt.poison != 0) gw1[3] = T(bt.poison);
    return loss;
  }
};

/// mlp<T> whose backward reports parameters' gradients final (hone::gradient_ready) after
/// computing them, in the order `order` (positions in parameters(); some may be left out, or
/// repeated to test the refusal), so that a data-parallel trainer overlaps its reduction.
template <class T>
struct mlp_reporting : mlp<T> {
  std::vector<std::size_t> order{3, 2, 1, 0};  // backward order: the last layer first
  using mlp<T>::forward_backward;
  float forward_backward(const mlp_batch& bt, float scale, hone::gradient_ready ready) {
    const float loss = mlp<T>::forward_backward(bt, scale);
    for (std::size_t i : order) ready(i);
    return loss;
  }
};
