// bench/core_gpu.cu (bench_core_gpu): the core module's GPU benchmarks. Without a CUDA device it
// prints a skip message and exits 0.
//
// multi_tensor_axpy_64M_cuda: the CPU workload of bench/core.cpp on the device: y += a * x over
// the same 300 separately allocated tensors (64 Mi floats), one hone::for_each(cuda_exec, ...)
// per iteration, against device_limit<2, 1> over one cudaMalloc of the same bytes. Timed with
// CUDA events around each iteration (manual time).
#include <cuda_runtime.h>

#include <cstddef>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <hone/core/cuda/multi_tensor_apply.cuh>
#include <hone/core/multi_tensor.hpp>
#include <vector>

#include "support/device.cuh"
#include "support/harness.hpp"
#include "support/limit.cuh"
#include "support/workloads.hpp"

namespace {

struct axpy {
  float a;
  HONE_HOST_DEVICE void operator()(float& y, const float& x) const { y += a * x; }
};

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
      hone_bench::device_fill(y.back().data(), n, 0.25f);
      hone_bench::device_fill(x.back().data(), n, 0.5f);
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
  hone_bench::time_on_device(
      state, [&](cudaStream_t s) { hone::for_each(hone::cuda_exec{s}, t.lists, op); });
  hone_bench::report_bytes(state, t.total * 3 * sizeof(float));
}

void multi_tensor_axpy_limit(benchmark::State& state) {
  auto& limit = axpy_limit();
  hone_bench::time_on_device(state, [&](cudaStream_t s) { limit.run(s); });
  hone_bench::report_bytes(state, limit.bytes_per_pass());
}

bool register_benchmarks() {
  if (!hone_bench::device_present("bench_core_gpu")) return false;
  using hone_bench::add_gpu;
  add_gpu("multi_tensor_axpy_64M_cuda", "hone", multi_tensor_axpy_hone);
  add_gpu("multi_tensor_axpy_64M_cuda", "limit", multi_tensor_axpy_limit);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {{"multi_tensor_axpy_64M_cuda", [] { return axpy_sizes(); }}},
                          register_benchmarks);
}
