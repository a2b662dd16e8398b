// hone/core/cuda/space.hpp: allocation in device memory (space_traits<cuda_space>) and the
// page-locked backend of pinned_host_space, through the CUDA runtime. Included by
// hone/core/space.hpp when the CUDA runtime is part of the translation unit (nvcc, or the
// hone::cuda target).
#pragma once

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "hone/core/cuda/error.hpp"
#include "hone/core/space.hpp"

HONE_NAMESPACE_BEGIN
namespace detail {
inline void throw_cuda_alloc(cudaError_t status, std::size_t bytes, const char* what) {
  (void)cudaGetLastError();
  throw allocation_error(std::string("hone: ") + what + " of " + std::to_string(bytes) +
                             " bytes failed: " + cudaGetErrorString(status) +
                             "; reduce the size or free memory first",
                         bytes);
}
}  // namespace detail

template <>
struct space_traits<cuda_space> {
  static constexpr bool host_accessible = false;
  static constexpr const char* name = "cuda";
  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    if (cudaError_t s = cudaMalloc(&p, bytes); s != cudaSuccess) {
      detail::throw_cuda_alloc(s, bytes, "cudaMalloc");
    }
    return p;
  }
  static void deallocate(void* p, std::size_t /*bytes*/) noexcept {
    if (p != nullptr) (void)cudaFree(p);
  }
  /// Zeroes new device memory and waits for it: cudaMemset runs on the default stream and
  /// returns before it finishes, and a kernel the user then launches on a non-blocking stream
  /// would not be ordered after it.
  static void zero(void* p, std::size_t bytes) {
    if (bytes == 0) return;
    HONE_CUDA_CHECK(cudaMemset(p, 0, bytes));
    HONE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
};

namespace detail {
inline void* cuda_pinned_allocate(std::size_t bytes) {
  void* p = nullptr;
  if (cudaError_t s = cudaHostAlloc(&p, bytes, cudaHostAllocDefault); s != cudaSuccess) {
    throw_cuda_alloc(s, bytes, "cudaHostAlloc");
  }
  return p;  // page aligned
}
inline void cuda_pinned_deallocate(void* p) noexcept {
  (void)cudaFreeHost(p);
}
/// pinned_host_space's backend on the CUDA runtime.
inline constexpr pinned_host_backend cuda_pinned_backend{
    &cuda_pinned_allocate, &cuda_pinned_deallocate, true, "cudaHostAlloc"};
/// Installs cuda_pinned_backend during the static initialization of every translation unit that
/// includes this header, so pinned_host_space allocations made anywhere in the program (host-only
/// files included) are page-locked from then on.
inline const bool cuda_pinned_backend_installed = install_pinned_host_backend(cuda_pinned_backend);
}  // namespace detail
HONE_NAMESPACE_END
