// bench/core_gpu.cu (bench_core_gpu): the core module's GPU benchmarks. Without a CUDA device it
// prints a skip message and exits 0.
//
// multi_tensor_axpy_64M_cuda: the CPU workload of bench/core.cpp on the device: y += a * x over
// the same 300 separately allocated tensors (64 Mi floats), one hone::for_each(cuda_exec, ...)
// per iteration, against device_limit<2, 1> over one cudaMalloc of the same bytes. Timed with
// CUDA events around each iteration (manual time).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <hone/core/cuda/multi_tensor_apply.cuh>
#include <hone/core/multi_tensor.hpp>
#include <string>
#include <utility>
#include <vector>

#include "support/harness.hpp"
#include "support/limit.cuh"
#include "support/workloads.hpp"

namespace {

struct axpy {
  float a;
  HONE_HOST_DEVICE void operator()(float& y, const float& x) const { y += a * x; }
};

__global__ void fill_kernel(float* p, std::size_t n, float base) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    p[i] = base + static_cast<float>(i % 1024) * (1.0f / 1024.0f);
  }
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

template <class Fn>
void add_gpu(const std::string& workload, const std::string& impl, Fn fn) {
  benchmark::RegisterBenchmark((workload + "/" + impl).c_str(), std::move(fn))
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

const std::vector<std::size_t>& axpy_sizes() {
  static const auto sizes = hone_bench::model_like_sizes(hone_bench::multi_tensor_total);
  return sizes;
}

struct device_tensors {
  std::vector<hone::buffer<float, hone::cuda_space>> y, x;
  hone::tensor_lists<float, const float> lists;
  std::size_t total = 0;

  explicit device_tensors(const std::vector<std::size_t>& sizes) {
    y.reserve(sizes.size());
    x.reserve(sizes.size());
    for (std::size_t n : sizes) {
      y.emplace_back(n);
      x.emplace_back(n);
      fill_kernel<<<256, 256>>>(y.back().data(), n, 0.25f);
      fill_kernel<<<256, 256>>>(x.back().data(), n, 0.5f);
      hone::check_last_launch("fill_kernel");
      lists.add(n, y.back().data(), x.back().data());
      total += n;
    }
    HONE_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

device_tensors& axpy_tensors() {
  static device_tensors t(axpy_sizes());
  return t;
}
hone_bench::device_limit<2, 1>& axpy_limit() {
  static hone_bench::device_limit<2, 1> limit(hone_bench::multi_tensor_total);
  return limit;
}

void multi_tensor_axpy_hone(benchmark::State& state) {
  auto& t = axpy_tensors();
  const axpy op{1e-3f};
  time_on_device(state, [&](cudaStream_t s) { hone::for_each(hone::cuda_exec{s}, t.lists, op); });
  hone_bench::report_bytes(state, t.total * 3 * sizeof(float));
}

void multi_tensor_axpy_limit(benchmark::State& state) {
  auto& limit = axpy_limit();
  time_on_device(state, [&](cudaStream_t s) { limit.run(s); });
  hone_bench::report_bytes(state, limit.bytes_per_pass());
}

bool register_benchmarks() {
  const int devices = hone::cuda_device_count();
  if (devices == 0) {
    std::printf("bench_core_gpu: no CUDA device found; skipping the GPU benchmarks\n");
    return false;
  }
  cudaDeviceProp prop{};
  HONE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  benchmark::AddCustomContext("hone_gpu", prop.name);
  add_gpu("multi_tensor_axpy_64M_cuda", "hone", multi_tensor_axpy_hone);
  add_gpu("multi_tensor_axpy_64M_cuda", "limit", multi_tensor_axpy_limit);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {{"multi_tensor_axpy_64M_cuda", [] { return axpy_sizes(); }}},
                          register_benchmarks);
}
