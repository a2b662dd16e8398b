// bench/support/gpu_host.hpp: the no-device skip shared by every GPU benchmark program, the .cu
// ones (through support/device.cuh) and the host C++ ones on the CUDA runtime (bench_data_gpu,
// bench_profile_gpu). Host code only: includable from .cpp and .cu files.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <hone/core/cuda/error.hpp>

namespace hone_bench {

/// True when a CUDA device is present, after naming device 0 in the output's context
/// ("hone_gpu"); otherwise prints "<program>: no CUDA device found; skipping the GPU benchmarks"
/// and returns false (the program then exits 0).
inline bool device_present(const char* program) {
  if (hone::cuda_device_count() == 0) {
    std::printf("%s: no CUDA device found; skipping the GPU benchmarks\n", program);
    return false;
  }
  cudaDeviceProp prop{};
  HONE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  benchmark::AddCustomContext("hone_gpu", prop.name);
  return true;
}

}  // namespace hone_bench
