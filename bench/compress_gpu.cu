// bench/compress_gpu.cu (bench_compress_gpu): the compress module's GPU benchmarks. Without a CUDA
// device it prints a skip message and exits 0.
//
// int8_linear_cuda_m<M>_k<K>: y [M, K] = x [M, K] W^T with W [K, K] (a square layer, no bias),
// for M in {1, 32, 256} and K in {1024, 4096}:
//   hone         hone::compress::cuda_int8_linear::forward from fp32 x to fp32 y, everything
//                included: the per-row quantization of x, the cuBLASLt int8 GEMM, the epilogue;
//   cublas_sgemm cublasSgemm on the same fp32 x and W (default math mode: no TF32);
//   cublas_fp16  cublasGemmEx with fp16 x, W and y and fp32 accumulation (CUBLAS_COMPUTE_32F),
//                the inputs already in fp16 (their conversion is not timed).
// Timed with CUDA events around each iteration (manual time); bytes_per_iter counts the weights
// each implementation reads (1, 4 or 2 bytes a value), the term that dominates for small M.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <hone/compress/cuda/quant_linear.cuh>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "support/device.cuh"
#include "support/harness.hpp"

namespace {

namespace hc = hone::compress;

void cublas_check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(call) + " failed: " + cublasGetStatusString(status));
  }
}
#define BENCH_CUBLAS_CHECK(call) cublas_check((call), #call)

cublasHandle_t blas() {
  static cublasHandle_t h = [] {
    cublasHandle_t handle = nullptr;
    BENCH_CUBLAS_CHECK(cublasCreate(&handle));
    return handle;
  }();
  return h;
}

/// The tensors of one shape: fp32 and fp16 copies of x, W and y, and the int8 layer.
struct linear_data {
  std::size_t m, k;
  hone::buffer<float, hone::cuda_space> x, w, y;
  hone::buffer<__half, hone::cuda_space> xh, wh, yh;
  std::unique_ptr<hc::cuda_int8_linear> layer;

  linear_data(std::size_t rows, std::size_t features)
      : m(rows), k(features), x(m * k), w(k * k), y(m * k), xh(m * k), wh(k * k), yh(m * k) {
    std::vector<float> hw(k * k), hx(m * k);
    std::uint32_t s = 12345;
    const auto next = [&s] {
      s = s * 1664525u + 1013904223u;
      return static_cast<float>(s >> 8) * (1.0f / 16777216.0f) - 0.5f;  // [-0.5, 0.5)
    };
    for (float& v : hw) v = next() * 0.1f;
    for (float& v : hx) v = next() * 4.0f;
    std::vector<__half> hwh(hw.size()), hxh(hx.size());
    for (std::size_t i = 0; i < hw.size(); ++i) hwh[i] = __float2half(hw[i]);
    for (std::size_t i = 0; i < hx.size(); ++i) hxh[i] = __float2half(hx[i]);
    HONE_CUDA_CHECK(cudaMemcpy(w.data(), hw.data(), w.size_bytes(), cudaMemcpyHostToDevice));
    HONE_CUDA_CHECK(cudaMemcpy(x.data(), hx.data(), x.size_bytes(), cudaMemcpyHostToDevice));
    HONE_CUDA_CHECK(cudaMemcpy(wh.data(), hwh.data(), wh.size_bytes(), cudaMemcpyHostToDevice));
    HONE_CUDA_CHECK(cudaMemcpy(xh.data(), hxh.data(), xh.size_bytes(), cudaMemcpyHostToDevice));
    layer = std::make_unique<hc::cuda_int8_linear>(hw, k, k);
    layer->reserve(m);
    HONE_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

linear_data& data(std::size_t m, std::size_t k) {
  static std::map<std::pair<std::size_t, std::size_t>, std::unique_ptr<linear_data>> all;
  auto& d = all[{m, k}];
  if (!d) d = std::make_unique<linear_data>(m, k);
  return *d;
}

void int8_linear_hone(benchmark::State& state, std::size_t m, std::size_t k) {
  auto& d = data(m, k);
  hone_bench::time_on_device(
      state, [&](cudaStream_t s) { d.layer->forward(d.x.data(), m, d.y.data(), s); });
  hone_bench::report_bytes(state, k * k);
}

// Row-major y [m, k] = x [m, k] W^T with W [k, k] row-major, in cuBLAS's column-major terms:
// y^T (k x m) = op_T(W stored k x k) * x^T (k x m).
void int8_linear_sgemm(benchmark::State& state, std::size_t m, std::size_t k) {
  auto& d = data(m, k);
  const float one = 1.0f, zero = 0.0f;
  const int n = static_cast<int>(k), rows = static_cast<int>(m);
  hone_bench::time_on_device(state, [&](cudaStream_t s) {
    BENCH_CUBLAS_CHECK(cublasSetStream(blas(), s));
    BENCH_CUBLAS_CHECK(cublasSgemm(blas(), CUBLAS_OP_T, CUBLAS_OP_N, n, rows, n, &one, d.w.data(),
                                   n, d.x.data(), n, &zero, d.y.data(), n));
  });
  hone_bench::report_bytes(state, k * k * 4);
}

void int8_linear_fp16(benchmark::State& state, std::size_t m, std::size_t k) {
  auto& d = data(m, k);
  const float one = 1.0f, zero = 0.0f;
  const int n = static_cast<int>(k), rows = static_cast<int>(m);
  hone_bench::time_on_device(state, [&](cudaStream_t s) {
    BENCH_CUBLAS_CHECK(cublasSetStream(blas(), s));
    BENCH_CUBLAS_CHECK(cublasGemmEx(blas(), CUBLAS_OP_T, CUBLAS_OP_N, n, rows, n, &one, d.wh.data(),
                                    CUDA_R_16F, n, d.xh.data(), CUDA_R_16F, n, &zero, d.yh.data(),
                                    CUDA_R_16F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  hone_bench::report_bytes(state, k * k * 2);
}

bool register_benchmarks() {
  if (!hone_bench::device_present("bench_compress_gpu")) return false;
  using hone_bench::add_gpu;
  for (const std::size_t k : {std::size_t{1024}, std::size_t{4096}}) {
    for (const std::size_t m : {std::size_t{1}, std::size_t{32}, std::size_t{256}}) {
      const std::string w = "int8_linear_cuda_m" + std::to_string(m) + "_k" + std::to_string(k);
      add_gpu(w, "hone", [m, k](benchmark::State& s) { int8_linear_hone(s, m, k); });
      add_gpu(w, "cublas_sgemm", [m, k](benchmark::State& s) { int8_linear_sgemm(s, m, k); });
      add_gpu(w, "cublas_fp16", [m, k](benchmark::State& s) { int8_linear_fp16(s, m, k); });
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
