// tests/support/linear_model.hpp: the small model the trainer and checkpoint tests train (host
// and, through the GPU tests' device twins, CUDA): y = w . x + b with mean squared error, weights
// and gradients in working type T, and a fault-injection hook.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

#include <hone/core/model.hpp>

struct batch {
  std::vector<float> x;  // rows * dim
  std::vector<float> y;  // rows
  std::size_t count() const { return y.size(); }
};

/// `rows` samples of y = 0.3 + sum_c 0.5 * (c % 3) * x_c with x ~ N(0, 1), reproducible by seed.
inline batch make_batch(std::size_t rows, std::size_t dim, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0, 1);
  batch b{std::vector<float>(rows * dim), std::vector<float>(rows)};
  for (auto& v : b.x) v = n(rng);
  for (std::size_t r = 0; r < rows; ++r) {
    float y = 0.3f;
    for (std::size_t c = 0; c < dim; ++c) y += 0.5f * static_cast<float>(c % 3) * b.x[r * dim + c];
    b.y[r] = y;
  }
  return b;
}

/// Linear regression with mean squared error; weights and gradients in separate vectors.
template <class T>
struct linear {
  std::size_t dim;
  std::vector<T> w, gw, b, gb;
  float nan_in_grad = 0;  // when non-zero, this value is written into gw[1] (fault injection)
  explicit linear(std::size_t d) : dim(d), w(d), gw(d), b(1), gb(1) {
    for (std::size_t i = 0; i < d; ++i) w[i] = T(0.1f * static_cast<float>(i % 5) - 0.2f);
    b[0] = T(0.05f);
  }
  std::vector<hone::parameter<T>> parameters() {
    return {{"w", {dim}, w, gw}, {"bias", {1}, b, gb}};
  }
  float forward_backward(const batch& bt, float scale) {
    std::vector<float> g(dim, 0.0f);
    float gbias = 0, loss = 0;
    const std::size_t rows = bt.y.size();
    for (std::size_t r = 0; r < rows; ++r) {
      float pred = static_cast<float>(b[0]);
      for (std::size_t c = 0; c < dim; ++c) pred += static_cast<float>(w[c]) * bt.x[r * dim + c];
      const float e = pred - bt.y[r];
      loss += e * e / static_cast<float>(rows);
      for (std::size_t c = 0; c < dim; ++c)
        g[c] += 2 * e * bt.x[r * dim + c] / static_cast<float>(rows);
      gbias += 2 * e / static_cast<float>(rows);
    }
    for (std::size_t c = 0; c < dim; ++c) gw[c] = T(g[c] * scale);
    gb[0] = T(gbias * scale);
    if (nan_in_grad != 0) gw[1] = T(nan_in_grad);
    return loss;
  }
};
