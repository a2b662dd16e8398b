// bench/support/device.cuh: what the GPU benchmark programs (bench/*_gpu.cu) share: filling device
// tensors with the values of the CPU benchmarks, timing with CUDA events (Google Benchmark manual
// time), registering "<workload>/<impl>" benchmarks in milliseconds, and the no-device skip.
// Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <hone/core/cuda/error.hpp>
#include <string>
#include <utility>

#include "support/gpu_host.hpp"  // device_present
#include "support/harness.hpp"

namespace hone_bench {
namespace detail {

template <class T>
__global__ void fill_kernel(T* p, std::size_t n, float base) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    p[i] = static_cast<T>(base + static_cast<float>(i % 1024) * (1.0f / 1024.0f));
  }
}

}  // namespace detail

/// Fills device memory p[0, n) with base + (i % 1024) / 1024 (the values of the CPU benchmarks'
/// tensors), asynchronously on the default stream.
inline void device_fill(float* p, std::size_t n, float base) {
  detail::fill_kernel<<<1024, 256>>>(p, n, base);
  hone::check_last_launch("hone_bench::device_fill");
}

/// Times `fn(stream)` with a pair of CUDA events around each iteration; one untimed warm-up.
template <class Fn>
void time_on_device(benchmark::State& state, Fn&& fn) {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  HONE_CUDA_CHECK(cudaEventCreate(&start));
  HONE_CUDA_CHECK(cudaEventCreate(&stop));
  fn(stream);
  HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (auto _ : state) {
    HONE_CUDA_CHECK(cudaEventRecord(start, stream));
    fn(stream);
    HONE_CUDA_CHECK(cudaEventRecord(stop, stream));
    HONE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    HONE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(static_cast<double>(ms) * 1e-3);
  }
  HONE_CUDA_CHECK(cudaEventDestroy(start));
  HONE_CUDA_CHECK(cudaEventDestroy(stop));
  HONE_CUDA_CHECK(cudaStreamDestroy(stream));
}

/// Registers `fn` as "<workload>/<impl>", timed by time_on_device (manual time), in milliseconds.
template <class Fn>
benchmark::internal::Benchmark* add_gpu(const std::string& workload, const std::string& impl,
                                        Fn fn) {
  return benchmark::RegisterBenchmark((workload + "/" + impl).c_str(), std::move(fn))
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

}  // namespace hone_bench
