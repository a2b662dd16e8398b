// tests/support/gpu.hpp: GPU tests call skip_without_gpu() first. With no CUDA device it prints
// why and exits 77, which CTest reports as skipped (SKIP_RETURN_CODE), not failed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace hone::test {
inline void skip_without_gpu() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    std::printf("no CUDA device (%s): skipping\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
    std::fflush(stdout);
    std::exit(77);
  }
}
}  // namespace hone::test
