// bench/support/optim_data.hpp: the tables of tensors the optimizer benchmarks share (bench_optim,
// bench/optim.cpp, and bench_optim_gpu, bench/optim_gpu.cu): the model-like mix of each workload
// size, its arena layout, one model per size built on first use, and the limits sized to a
// model's parameters. Host code; the model types (host or device arenas) are the programs' own.
#pragma once

#include <cstddef>
#include <functional>
#include <hone/core/arena.hpp>
#include <string>
#include <vector>

#include "support/workloads.hpp"

namespace hone_bench {

/// The model-like mix of optim_1M, optim_16M or optim_64M parameters (any other total: 64M).
inline const std::vector<std::size_t>& optim_mix(std::size_t total) {
  static const auto m1 = model_like_sizes(optim_1M);
  static const auto m16 = model_like_sizes(optim_16M);
  static const auto m64 = model_like_sizes(optim_64M);
  return total == optim_1M ? m1 : total == optim_16M ? m16 : m64;
}

/// The sizes of a mix for --hone_print_sizes (hone_bench::workload_mix::sizes).
inline std::function<std::vector<std::size_t>()> optim_sizes(std::size_t total) {
  return [total] { return optim_mix(total); };
}

/// An arena layout of fp32 tensors "t0", "t1", ... of the given sizes.
inline hone::arena_layout optim_layout(const std::vector<std::size_t>& sizes) {
  hone::arena_layout layout(sizeof(float));
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::string name = std::to_string(i);  // not "t" + ...: g++ 12's -Wrestrict false positive
    layout.add(name.insert(0, 1, 't'), sizes[i]);
  }
  return layout;
}

/// The Model of optim_1M, optim_16M or optim_64M parameters (any other total: 64M), constructed
/// from its total on first use and kept for all repetitions.
template <class Model>
Model& optim_model(std::size_t total) {
  if (total == optim_1M) {
    static Model d(optim_1M);
    return d;
  }
  if (total == optim_16M) {
    static Model d(optim_16M);
    return d;
  }
  static Model d(optim_64M);
  return d;
}

/// A Limit over as many elements as optim_model<Model>(Total) has parameters (its `params`),
/// constructed on first use.
template <class Limit, class Model, std::size_t Total>
Limit& optim_limit() {
  static Limit limit(optim_model<Model>(Total).params);
  return limit;
}

}  // namespace hone_bench
