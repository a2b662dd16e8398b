// tests/dist/wire_oracle.hpp: the oracle of the 16-bit wire of hone::data_parallel
// (data_parallel_options::wire) and hone::zero (zero_options::wire), shared by the thread-rank
// tests (test_data_parallel_wire, test_zero_wire) and the MPI test (test_mpi_data_parallel).
//
// wire_gradients(n, elements, rank) is rank `rank`'s fp32 gradient arena; wire_candidates<T>
// computes, element by element and independently of hone::data_parallel, what the reduction must
// give: each rank's value rounded to T, the sum of the N rounded values taken two at a time in
// fp32 and rounded back to T after each sum, the average (fp32 division, rounded to T), widened to
// float. The left fold in rank order ((g0 + g1) + g2) + ... is candidate 0 (thread_comm's order);
// the other rotations of the rank order follow (mpi_comm's reduce_scatter starts block b's fold at
// rank b + 1). overflow_trainer builds the trainer of the fp16 overflow
// check: loss scale 1, so a gradient of 40000 reaches the reduction as 40000. fp32_only_comm is a
// communicator without 16-bit collectives (refused by a 16-bit wire).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <hone/core/bfloat16.hpp>
#include <hone/core/half.hpp>
#include <hone/dist/data_parallel.hpp>
#include <hone/dist/local_comm.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/precision/policies.hpp>
#include <hone/train/accumulate.hpp>
#include <hone/train/trainer.hpp>
#include <span>
#include <type_traits>
#include <vector>

#include "dp_model.hpp"

/// Rank `rank`'s gradients: values of mixed magnitudes (1e-3 .. 30) and signs, most of them not
/// representable in 16 bits (so the rounding matters), different on every rank.
inline std::vector<float> wire_gradients(std::size_t elements, int rank) {
  std::vector<float> g(elements);
  std::uint32_t state = 0x9e3779b9u * static_cast<std::uint32_t>(rank + 1) + 12345u;
  for (std::size_t i = 0; i < elements; ++i) {
    state = state * 1664525u + 1013904223u;
    const float u = static_cast<float>(state >> 8) / 16777216.0f;  // [0, 1)
    const float mag = std::ldexp(1.0f + u, static_cast<int>((state >> 3) % 15u) - 10);
    g[i] = (state & 1u) ? -mag : mag;
  }
  return g;
}

/// The orders of N ranks' values the oracle accepts: the n rotations of the rank order,
/// g_{s+1}, g_{s+2}, ..., g_s (ranks mod n), each a left fold. s = n - 1 is the left fold in rank
/// order (thread_comm's); mpi_comm's reduce_scatter folds block b from s = b (docs/dist.md,
/// "reduce_scatter's algorithm"). For 3 ranks these are ((g0 + g1) + g2), ((g1 + g2) + g0) =
/// g0 + (g1 + g2) and ((g2 + g0) + g1).
inline std::vector<std::vector<int>> wire_orders(int ranks) {
  std::vector<std::vector<int>> orders;
  for (int s = ranks - 1; s >= 0; --s) {
    std::vector<int> order;
    for (int k = 1; k <= ranks; ++k) order.push_back((s + k) % ranks);
    orders.push_back(order);
  }
  return orders;
}

/// The averaged, widened result of element `i` for each accepted order (see the file comment).
template <class T>
std::vector<float> wire_candidates(const std::vector<std::vector<float>>& grads, std::size_t i,
                                   bool average = true) {
  const int n = static_cast<int>(grads.size());
  const auto w = [&](int r) {
    return static_cast<float>(T(grads[static_cast<std::size_t>(r)][i]));
  };
  const auto add = [](float a, float b) { return static_cast<float>(T(a + b)); };
  std::vector<float> out;
  for (const auto& order : wire_orders(n)) {
    float acc = w(order[0]);
    for (std::size_t k = 1; k < order.size(); ++k) acc = add(acc, w(order[k]));
    if (average && n > 1) acc = static_cast<float>(T(acc / static_cast<float>(n)));
    out.push_back(acc);
  }
  return out;
}

inline bool same_float_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

/// mlp<half> with fp16 loss scaling starting at 1 (no growth within the test; min_scale below 1 so
/// that a back-off is a skipped step, not an error), AdamW and accumulation by count, reduced by
/// data_parallel over `comm` with the given wire.
template <class Comm>
auto overflow_trainer(mlp<hone::half>& m, Comm& comm, hone::wire_format wire) {
  const hone::fp16_mixed<> fp16{
      .scaler = {.init_scale = 1.0f, .growth_interval = 1000, .min_scale = 1.0f / 64}};
  return hone::trainer(m, fp16, hone::adamw{}, hone::accumulate::by_count{},
                       hone::data_parallel(comm, {.wire = wire}));
}

/// A communicator with float and double collectives only (no 16-bit types).
struct fp32_only_comm {
  hone::dist::local_comm local;
  using request = hone::dist::local_comm::request;
  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
  template <class T>
  requires(std::is_same_v<T, float> || std::is_same_v<T, double>) request
      all_reduce(std::span<T> d, hone::dist::reduce_op op) {
    return local.all_reduce(d, op);
  }
  template <class T>
  requires(std::is_same_v<T, float> || std::is_same_v<T, double>) request
      reduce_scatter(std::span<const T> in, std::span<T> out, hone::dist::reduce_op op) {
    return local.reduce_scatter(in, out, op);
  }
  template <class T>
  requires(std::is_same_v<T, float> || std::is_same_v<T, double>) request
      all_gather(std::span<const T> in, std::span<T> out) {
    return local.all_gather(in, out);
  }
  template <class T>
  requires(std::is_same_v<T, float> || std::is_same_v<T, double>) request
      broadcast(std::span<T> d, int root) {
    return local.broadcast(d, root);
  }
  request barrier() { return {}; }
};
