// examples/train_mlp/mlp_common.hpp: what the CPU model (mlp.hpp) and the CUDA model
// (mlp_cuda.cuh) share, so that both train the same network from the same start:
//
//   inputs -> fc1 -> ReLU -> fc2 -> ReLU -> fc3 -> softmax cross-entropy
//
// the micro-batch type, the evaluation result, the parameter layout (names and order: fc1.weight,
// fc1.bias, ..., fc3.bias; weights row-major [in x out], y = x W + b) and the initial weights drawn
// from the seed. Plain C++ (no xtensor, no CUDA): the CUDA translation unit includes it too.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <hone/core/arena.hpp>
#include <hone/core/model.hpp>
#include <span>
#include <string>
#include <vector>

#include "dataset.hpp"

namespace train_mlp {

/// A micro-batch: `count()` samples of `features` floats (row-major) and their labels. It views
/// memory owned by the training loop.
struct batch {
  std::span<const float> x;
  std::span<const std::int32_t> y;
  [[nodiscard]] std::size_t count() const noexcept { return y.size(); }
};

/// Mean cross-entropy and accuracy (in [0, 1]) of the model on some samples.
struct evaluation {
  double loss = 0.0;
  double accuracy = 0.0;
};

/// Number of linear layers.
inline constexpr std::size_t mlp_layers = 3;
/// Widths: inputs, hidden, hidden, classes.
using layer_sizes = std::array<std::size_t, mlp_layers + 1>;

/// The parameters' layout for elements of `element_size` bytes: fc1.weight [sizes[0] x sizes[1]],
/// fc1.bias [sizes[1]], ..., fc3.bias [sizes[3]].
inline hone::arena_layout mlp_layout(const layer_sizes& sizes, std::size_t element_size) {
  hone::arena_layout layout(element_size);
  for (std::size_t l = 0; l < mlp_layers; ++l) {
    const std::string name = "fc" + std::to_string(l + 1);
    layout.add(name + ".weight", sizes[l] * sizes[l + 1]);
    layout.add(name + ".bias", sizes[l + 1]);
  }
  return layout;
}

/// The trainer's view of an MLP's parameters, in layout order (fc<l>.weight [sizes[l] x
/// sizes[l + 1]], fc<l>.bias [sizes[l + 1]]), over its value and gradient arenas: host or device
/// memory (Space), T the element type.
template <class T, class Space, class Arena>
std::vector<hone::parameter<T, Space>> mlp_parameters(const hone::arena_layout& layout,
                                                      const layer_sizes& sizes, Arena& values,
                                                      Arena& grads) {
  std::vector<hone::parameter<T, Space>> ps;
  for (std::size_t l = 0; l < mlp_layers; ++l) {
    ps.push_back(
        {layout[2 * l].name, {sizes[l], sizes[l + 1]}, values.view(2 * l), grads.view(2 * l)});
    ps.push_back(
        {layout[2 * l + 1].name, {sizes[l + 1]}, values.view(2 * l + 1), grads.view(2 * l + 1)});
  }
  return ps;
}

/// The initial weights of fc1, fc2, fc3 (row-major [in x out]), drawn in that order from one
/// random_source(seed): He-uniform before a ReLU, the output layer as PyTorch's nn.Linear
/// (U(-1/sqrt(fan_in), 1/sqrt(fan_in))), so that the first logits are small and the first loss is
/// close to log(classes). Biases start at zero.
inline std::array<std::vector<float>, mlp_layers> initial_weights(const layer_sizes& sizes,
                                                                  std::uint64_t seed) {
  std::array<std::vector<float>, mlp_layers> w;
  random_source rng(seed);
  for (std::size_t l = 0; l < mlp_layers; ++l) {
    const double fan_in = static_cast<double>(sizes[l]);
    const double bound = l + 1 < mlp_layers ? std::sqrt(6.0 / fan_in) : std::sqrt(1.0 / fan_in);
    w[l].resize(sizes[l] * sizes[l + 1]);
    for (float& v : w[l]) v = static_cast<float>(bound * (2.0 * rng.uniform() - 1.0));
  }
  return w;
}

}  // namespace train_mlp
