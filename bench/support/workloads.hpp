// bench/support/workloads.hpp: the tensor-size mixes the benchmarks share. The C++ programs are the
// single source of truth: `bench_core --hone_print_sizes=<workload>` prints a mix, one size per
// line, and the peer scripts (bench/peers/*.py) read that output so they run the same tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hone_bench {

/// A deterministic mix of tensor sizes resembling a model's parameters, summing to exactly
/// `total` elements: a few large tensors (an embedding of 16 Mi, then 8, 4 and 4 Mi), then
/// "layers" until the budget is spent, each with two matrices of 64 Ki to 1 Mi elements (dims
/// drawn from 256..1024), four vectors of 256..1024 (biases, norm weights) and now and then a tiny
/// tensor of 1..64 elements (scalars, gates); the last tensor takes what is left. For 64 Mi: 300
/// tensors (4 of 4-16 Mi, 94 of 64 Ki-1 Mi, 202 under 64 Ki of which 170 under 1 Ki).
/// The draws use a fixed 64-bit LCG, so every platform (and the Python peers) gets the same list.
inline std::vector<std::size_t> model_like_sizes(std::size_t total) {
  std::vector<std::size_t> sizes;
  std::size_t left = total;
  auto push = [&](std::size_t n) {
    if (n > left) n = left;
    if (n == 0) return;
    sizes.push_back(n);
    left -= n;
  };
  const std::size_t mi = std::size_t{1} << 20;
  for (std::size_t big : {16 * mi, 8 * mi, 4 * mi, 4 * mi}) {
    if (big * 2 <= left) push(big);
  }
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  auto draw = [&](std::uint64_t bound) {  // uniform-ish in [0, bound)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % bound;
  };
  const std::size_t dims[] = {256, 384, 512, 640, 768, 1024};
  while (left > 0) {
    const std::size_t d = dims[draw(6)];
    const std::size_t h = dims[draw(6)];
    push(d);                               // norm weight
    push(d);                               // norm bias
    push(d * h);                           // matrix in
    push(h);                               // its bias
    push(h * d);                           // matrix out
    push(d);                               // its bias
    if (draw(4) == 0) push(1 + draw(64));  // a tiny tensor
  }
  return sizes;
}

/// 64 Mi floats in a model-like mix: the multi_tensor_* workloads.
inline constexpr std::size_t multi_tensor_total = std::size_t{64} << 20;

/// The optimizer workloads of bench_optim (bench/optim.cpp) and bench_optim_gpu: model-like mixes
/// of 1 Mi (5 tensors), 16 Mi (50 tensors: 8 and 4 Mi, then layers) and 64 Mi parameters (the
/// 300 tensors of multi_tensor_total). Their names end in _1M, _16M, _64M.
inline constexpr std::size_t optim_1M = std::size_t{1} << 20;
inline constexpr std::size_t optim_16M = std::size_t{16} << 20;
inline constexpr std::size_t optim_64M = std::size_t{64} << 20;

}  // namespace hone_bench
