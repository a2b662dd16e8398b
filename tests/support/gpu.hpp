// tests/support/gpu.hpp: GPU tests call skip_without_gpu() first. With no CUDA device (no driver
// installed, or a driver that sees no device) it prints why and exits 77, which CTest reports as
// skipped (SKIP_RETURN_CODE). Any other CUDA error (a driver too old for this runtime, a device
// that cannot be initialized or is unavailable) is a failure: it prints the error and exits 1, so
// a broken GPU machine is never reported as "skipped".
#pragma once

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace hone::test {
/// Whether the CUDA driver library can be loaded at all (it is absent on machines without a
/// GPU driver, where the runtime reports cudaErrorInsufficientDriver).
inline bool cuda_driver_installed() {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h == nullptr) return false;
  dlclose(h);
  return true;
}

/// How a GPU test starts, from the status of cudaGetDeviceCount: 0 run, 77 skip, 1 fail.
constexpr int gpu_test_disposition(cudaError_t status, int count, bool driver_installed) {
  if (status == cudaSuccess) return count > 0 ? 0 : 77;
  if (status == cudaErrorNoDevice) return 77;
  if (status == cudaErrorInsufficientDriver && !driver_installed) return 77;
  return 1;
}

// The rules, checked wherever a GPU test compiles.
static_assert(gpu_test_disposition(cudaSuccess, 1, true) == 0);
static_assert(gpu_test_disposition(cudaSuccess, 0, true) == 77);
static_assert(gpu_test_disposition(cudaErrorNoDevice, 0, true) == 77);
static_assert(gpu_test_disposition(cudaErrorInsufficientDriver, 0, false) == 77);
static_assert(gpu_test_disposition(cudaErrorInsufficientDriver, 0, true) == 1);
static_assert(gpu_test_disposition(cudaErrorInitializationError, 0, true) == 1);
static_assert(gpu_test_disposition(cudaErrorDevicesUnavailable, 0, true) == 1);

inline void skip_without_gpu() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  const bool driver = cuda_driver_installed();
  const int d = gpu_test_disposition(status, count, driver);
  if (d == 0) return;
  const char* why = status != cudaSuccess ? cudaGetErrorString(status) : "0 devices";
  if (d == 77) {
    std::printf("no CUDA device (%s%s): skipping\n", why,
                driver ? "" : "; no CUDA driver installed");
  } else {
    std::printf("CUDA error before any test ran: %s (%s, error %d); failing instead of skipping\n",
                why, cudaGetErrorName(status), static_cast<int>(status));
  }
  std::fflush(stdout);
  std::exit(d);
}
}  // namespace hone::test
