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
//                             dense dot product per row, as the matvec the 2:4 kernel then runs). Peer:
//                             torch_distill.py runs F.linear(X, W) with the dense pruned W (a BLAS
//                             GEMM). X, W normal(0, 1), fixed seeds; sizes: M, K, N.

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <hone/compress/distill.hpp>
#include <hone/compress/sparse24.hpp>
#include <random>
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
    // The dense twin: X^T once, then one axpy per weight (four per group), rows over oneTBB.
    auto run = [&] {
      if (c.m == 1) {  // the dense matrix-vector product, as sparse24_matmul does for one input
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, c.n, 16),
                          [&](const tbb::blocked_range<std::size_t>& rr) {
                            for (std::size_t r = rr.begin(); r != rr.end(); ++r) {
                              const float* wr = d.w.data() + r * c.k;
                              float acc = 0.0f;
                              for (std::size_t j = 0; j < c.k; j += 2) {
                                acc += wr[j] * d.x[j] + wr[j + 1] * d.x[j + 1];
                              }
                              y[r] = acc;
                            }
                          });
        return;
      }
      std::vector<float> xt(c.k * c.m);
      for (std::size_t j = 0; j < c.k; ++j) {
        for (std::size_t i = 0; i < c.m; ++i) xt[j * c.m + i] = d.x[i * c.k + j];
      }
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, c.n, 4),
                        [&](const tbb::blocked_range<std::size_t>& rr) {
                          std::vector<float> acc(c.m);
                          for (std::size_t r = rr.begin(); r != rr.end(); ++r) {
                            std::fill(acc.begin(), acc.end(), 0.0f);
                            const float* wr = d.w.data() + r * c.k;
                            for (std::size_t j = 0; j < c.k; j += 2) {
                              hone::compress::detail::sparse24_axpy2(
                                  acc.data(), wr[j], xt.data() + j * c.m, wr[j + 1],
                                  xt.data() + (j + 1) * c.m, c.m);
                            }
                            for (std::size_t i = 0; i < c.m; ++i) y[i * c.n + r] = acc[i];
                          }
                        });
    };
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

bool register_benchmarks() {
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
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, mixes(), register_benchmarks);
}
