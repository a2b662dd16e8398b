// bench/quant.cpp (bench_quant): the dynamic int8 linear layer.
//
//   int8_linear_m<M>_k<K>_n<N>  Y[M, N] = X[M, K] W^T + b, fp32 in and out. impl hone:
//                             hone::compress::dynamic_int8_linear::forward (the per-row uint8
//                             quantization of X included; weights quantized and packed once, before
//                             timing; the kernel automatic picks, reported as the counter
//                             "kernel": 0 scalar, 1 avx2, 2 avx512_vnni). impl blas_fp32: the fp32
//                             layer through OpenBLAS cblas_sgemm (X W^T, then the bias), on as many
//                             threads as oneTBB (openblas_set_num_threads), when CMake found
//                             OpenBLAS. Peer: bench/peers/torch_int8_linear.py,
//                             torch.ao.quantization.quantize_dynamic on an nn.Linear of the same
//                             shape (qint8 weights, per-tensor; fbgemm). X, W, b normal(0, 1),
//                             fixed seeds; sizes: M, K, N.
// Time per call in ms; no limit row.

#include <cstddef>
#include <hone/compress/quant_linear.hpp>
#include <random>
#include <string>
#include <vector>

#include "support/harness.hpp"

#ifdef HONE_BENCH_OPENBLAS
#include <cblas.h>
#endif

namespace {

struct linear_case {
  std::size_t m, k, n;
  std::string name() const {
    return "int8_linear_m" + std::to_string(m) + "_k" + std::to_string(k) + "_n" +
           std::to_string(n);
  }
};

const std::vector<linear_case>& cases() {
  static const std::vector<linear_case> c{{1, 1024, 1024}, {32, 1024, 1024}, {256, 1024, 1024},
                                          {1, 4096, 4096}, {32, 4096, 4096}, {256, 4096, 4096}};
  return c;
}

struct data {
  std::vector<float> x, w, b;
  explicit data(const linear_case& c) : x(c.m * c.k), w(c.n * c.k), b(c.n) {
    std::mt19937 rng(7);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : x) v = d(rng);
    for (auto& v : w) v = d(rng);
    for (auto& v : b) v = d(rng);
  }
};

void hone_int8(benchmark::State& state, linear_case c) {
  const data d(c);
  hone::compress::dynamic_int8_linear lin(d.w, c.n, c.k, d.b);
  std::vector<float> y(c.m * c.n);
  lin.forward(d.x, c.m, y);
  for (auto _ : state) {
    lin.forward(d.x, c.m, y);
    benchmark::ClobberMemory();
  }
  state.counters["kernel"] = static_cast<double>(hone::compress::best_int8_kernel()) - 1.0;
  hone_bench::report_threads(state);
}

#ifdef HONE_BENCH_OPENBLAS
void blas_fp32(benchmark::State& state, linear_case c) {
  const data d(c);
  openblas_set_num_threads(static_cast<int>(hone_bench::thread_count()));
  std::vector<float> y(c.m * c.n);
  auto run = [&] {
    for (std::size_t r = 0; r < c.m; ++r)
      std::copy(d.b.begin(), d.b.end(), y.begin() + static_cast<std::ptrdiff_t>(r * c.n));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(c.m),
                static_cast<int>(c.n), static_cast<int>(c.k), 1.0f, d.x.data(),
                static_cast<int>(c.k), d.w.data(), static_cast<int>(c.k), 1.0f, y.data(),
                static_cast<int>(c.n));
  };
  run();
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  hone_bench::report_threads(state);
}
#endif

bool register_benchmarks() {
  for (const linear_case& c : cases()) {
    hone_bench::add(c.name(), "hone", [c](benchmark::State& s) { hone_int8(s, c); });
#ifdef HONE_BENCH_OPENBLAS
    hone_bench::add(c.name(), "blas_fp32", [c](benchmark::State& s) { blas_fp32(s, c); });
#endif
  }
  return true;
}

std::vector<hone_bench::workload_mix> mixes() {
  std::vector<hone_bench::workload_mix> m;
  for (const linear_case& c : cases()) {
    m.push_back({c.name(), [c] { return std::vector<std::size_t>{c.m, c.k, c.n}; }});
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, mixes(), register_benchmarks);
}
