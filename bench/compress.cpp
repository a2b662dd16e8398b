// bench/compress.cpp (bench_compress): the compress module's benchmarks.
//
//   distill_loss_b256_c32000  hone::compress::distill_loss, loss and student gradient (forward +
//   distill_loss_b32_c1000    backward), T = 2, alpha = 0.5, labels, on [batch, classes] fp32
//                             logits (student and teacher uniform in [-8, 8], fixed seeds); the
//                             gradient buffer is kept between iterations. Peer:
//                             bench/peers/torch_distill.py, the same expression composed in
//                             PyTorch (kl_div of the two log_softmax at T, log_target=True,
//                             batchmean, times T^2, blended with cross_entropy, then backward()),
//                             on the same shapes (--hone_print_sizes=<workload>: batch, classes).
// Time per call in ms; no limit row (the loss is compute-bound: three exponentials per logit).
//
//   sparse24_linear_m<M>_k<K>_n<N>  a linear layer's forward pass Y[M, N] = X[M, K] W^T with W 2:4
//                             sparse: hone::compress::sparse24_matmul on the packed matrix (impl
//                             hone). Variant hone_dense: the same loop structure on the dense
//                             pruned matrix (four axpys per group instead of two; for M = 1 the
//                             dense dot product per row, as the matvec the 2:4 kernel then runs).
//                             Peer: torch_distill.py runs F.linear(X, W) with the dense pruned W (a
//                             BLAS GEMM). X, W normal(0, 1), fixed seeds; sizes: M, K, N.
//
//   structured50_mlp_m64_d2048  two linear layers d -> d -> d (no bias, no activation) on M = 64
//                             inputs, after hone::compress::prune_neurons(net, 0.5) removed half
//                             the hidden neurons (W1 [1024, 2048], W2 [2048, 1024]; impl hone),
//                             against the unpruned layers (hone_dense), both through dense_linear
//                             below (the loops of the 2:4 kernel on dense rows). Peer: torch
//                             F.linear twice on the pruned shapes. Sizes: M, d.

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <hone/compress/distill.hpp>
#include <hone/compress/sparse24.hpp>
#include <hone/compress/structured.hpp>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/harness.hpp"

namespace {

struct distill_case {
  std::size_t batch;
  std::size_t classes;
  std::string name() const {
    return "distill_loss_b" + std::to_string(batch) + "_c" + std::to_string(classes);
  }
};

const std::vector<distill_case>& distill_cases() {
  static const std::vector<distill_case> cases{{256, 32000}, {32, 1000}};
  return cases;
}

void distill(benchmark::State& state, distill_case c) {
  const std::size_t n = c.batch * c.classes;
  std::vector<float> s(n), t(n), g(n);
  std::vector<std::int32_t> labels(c.batch);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (auto& x : s) x = u(rng);
  for (auto& x : t) x = u(rng);
  std::uniform_int_distribution<std::int32_t> cls(0, static_cast<std::int32_t>(c.classes) - 1);
  for (auto& y : labels) y = cls(rng);
  const hone::compress::distill_options o{2.0f, 0.5f};
  double loss = hone::compress::distill_loss({c.batch, c.classes}, s, t, labels, g, o).loss;
  for (auto _ : state) {
    loss = hone::compress::distill_loss({c.batch, c.classes}, s, t, labels, g, o).loss;
    benchmark::DoNotOptimize(loss);
    benchmark::ClobberMemory();
  }
  hone_bench::report_threads(state);
}

struct linear_case {
  std::size_t m, k, n;
  std::string name() const {
    return "sparse24_linear_m" + std::to_string(m) + "_k" + std::to_string(k) + "_n" +
           std::to_string(n);
  }
};

const std::vector<linear_case>& linear_cases() {
  static const std::vector<linear_case> cases{{64, 4096, 4096}, {1, 4096, 4096}};
  return cases;
}

struct linear_data {
  std::vector<float> x, w;
  hone::compress::sparse24_matrix w24;
  explicit linear_data(const linear_case& c) : x(c.m * c.k), w(c.n * c.k) {
    std::mt19937 rng(2);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : x) v = d(rng);
    for (auto& v : w) v = d(rng);
    w24 = hone::compress::sparse24_matrix::prune(w, c.n, c.k);
    w = w24.to_dense();
  }
};

/// Y[m, n] = X[m, k] W^T for a dense W [n, k], with the loops of sparse24_matmul (X^T once, then
/// one axpy per weight, output rows over oneTBB; one input: a dot product per row).
void dense_linear(const float* w, std::size_t n, std::size_t k, const std::vector<float>& x,
                  std::size_t m, std::vector<float>& y) {
  if (m == 1) {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 16),
                      [&](const tbb::blocked_range<std::size_t>& rr) {
                        for (std::size_t r = rr.begin(); r != rr.end(); ++r) {
                          const float* wr = w + r * k;
                          float acc = 0.0f;
                          for (std::size_t j = 0; j < k; j += 2) {
                            acc += wr[j] * x[j] + wr[j + 1] * x[j + 1];
                          }
                          y[r] = acc;
                        }
                      });
    return;
  }
  std::vector<float> xt(k * m);
  for (std::size_t j = 0; j < k; ++j) {
    for (std::size_t i = 0; i < m; ++i) xt[j * m + i] = x[i * k + j];
  }
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 32),
                    [&](const tbb::blocked_range<std::size_t>& rr) {
                      // The cache blocking of sparse24_matmul: 256 columns of X at a time.
                      constexpr std::size_t block = 256;
                      const std::size_t r0 = rr.begin(), rows = rr.end() - rr.begin();
                      std::vector<float> acc(rows * m, 0.0f);
                      for (std::size_t jb = 0; jb < k; jb += block) {
                        const std::size_t je = k - jb < block ? k : jb + block;
                        for (std::size_t r = r0; r != rr.end(); ++r) {
                          const float* wr = w + r * k;
                          float* a = acc.data() + (r - r0) * m;
                          for (std::size_t j = jb; j < je; j += 2) {
                            hone::compress::detail::sparse24_axpy2(
                                a, wr[j], xt.data() + j * m, wr[j + 1], xt.data() + (j + 1) * m, m);
                          }
                        }
                      }
                      for (std::size_t r = r0; r != rr.end(); ++r) {
                        for (std::size_t i = 0; i < m; ++i) y[i * n + r] = acc[(r - r0) * m + i];
                      }
                    });
}

void sparse24(benchmark::State& state, linear_case c, bool dense) {
  const linear_data d(c);
  std::vector<float> y(c.m * c.n);
  if (!dense) {
    hone::compress::sparse24_matmul(d.w24, d.x, c.m, y);
    for (auto _ : state) {
      hone::compress::sparse24_matmul(d.w24, d.x, c.m, y);
      benchmark::ClobberMemory();
    }
  } else {
    auto run = [&] { dense_linear(d.w.data(), c.n, c.k, d.x, c.m, y); };
    run();
    for (auto _ : state) {
      run();
      benchmark::ClobberMemory();
    }
  }
  state.counters["weight_bytes"] =
      static_cast<double>(dense ? d.w.size() * sizeof(float) : d.w24.bytes());
  hone_bench::report_threads(state);
}

/// Two linear layers (d -> d -> d, no bias) as a model with one layer of neurons, for
/// hone::compress::prune_neurons.
struct two_linear {
  std::size_t d, h;
  std::vector<float> w1, w2;  // [h, d], [d, h]
  std::size_t neuron_layer_count() const { return 1; }
  hone::compress::neuron_layer_view neuron_layer(std::size_t) const { return {w1, h, d, w2, d}; }
  void keep_neurons(std::size_t, std::span<const std::size_t> kept) {
    w1 = hone::compress::keep_rows(w1, h, d, kept);
    w2 = hone::compress::keep_cols(w2, d, h, kept);
    h = kept.size();
  }
};

constexpr std::size_t structured_m = 64, structured_d = 2048;

const std::string& structured_name() {
  static const std::string n =
      "structured50_mlp_m" + std::to_string(structured_m) + "_d" + std::to_string(structured_d);
  return n;
}

void structured(benchmark::State& state, bool pruned) {
  const std::size_t d = structured_d, m = structured_m;
  two_linear net{d, d, std::vector<float>(d * d), std::vector<float>(d * d)};
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : net.w1) v = nd(rng);
  for (auto& v : net.w2) v = nd(rng);
  std::vector<float> x(m * d);
  for (auto& v : x) v = nd(rng);
  if (pruned) hone::compress::prune_neurons(net, 0.5);
  std::vector<float> hidden(m * net.h), y(m * d);
  auto run = [&] {
    dense_linear(net.w1.data(), net.h, d, x, m, hidden);
    dense_linear(net.w2.data(), d, net.h, hidden, m, y);
  };
  run();
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  state.counters["hidden"] = static_cast<double>(net.h);
  hone_bench::report_threads(state);
}

bool register_benchmarks() {
  hone_bench::add(structured_name(), "hone", [](benchmark::State& s) { structured(s, true); });
  hone_bench::add(structured_name(), "hone_dense",
                  [](benchmark::State& s) { structured(s, false); });
  for (const linear_case& c : linear_cases()) {
    hone_bench::add(c.name(), "hone", [c](benchmark::State& s) { sparse24(s, c, false); });
    hone_bench::add(c.name(), "hone_dense", [c](benchmark::State& s) { sparse24(s, c, true); });
  }
  for (const distill_case& c : distill_cases()) {
    hone_bench::add(c.name(), "hone", [c](benchmark::State& s) { distill(s, c); });
  }
  return true;
}

std::vector<hone_bench::workload_mix> mixes() {
  std::vector<hone_bench::workload_mix> m;
  for (const distill_case& c : distill_cases()) {
    m.push_back({c.name(), [c] { return std::vector<std::size_t>{c.batch, c.classes}; }});
  }
  for (const linear_case& c : linear_cases()) {
    m.push_back({c.name(), [c] { return std::vector<std::size_t>{c.m, c.k, c.n}; }});
  }
  m.push_back({structured_name(), [] {
                 return std::vector<std::size_t>{structured_m, structured_d};
               }});
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, mixes(), register_benchmarks);
}
