// hone/core/config.hpp: version, ABI namespace and the host/device macros every header uses.
//
// One macro decides where a function may run: HONE_HOST_DEVICE expands to
// `__host__ __device__ inline` under nvcc (or clang in CUDA mode) and to plain `inline`
// otherwise, so element-wise functors written once serve as CPU code, CUDA code and the CPU
// reference that GPU tests compare against (the CuTe / CCCL convention).
#pragma once

#define HONE_VERSION_MAJOR 0
#define HONE_VERSION_MINOR 1
#define HONE_VERSION_PATCH 0
#define HONE_VERSION (HONE_VERSION_MAJOR * 10000 + HONE_VERSION_MINOR * 100 + HONE_VERSION_PATCH)

// Inline ABI namespace keyed on the version: objects built against two different hone versions
// cannot be linked together silently (their mangled names differ).
#define HONE_ABI_CONCAT_(a, b, c) v##a##_##b##_##c
#define HONE_ABI_CONCAT(a, b, c) HONE_ABI_CONCAT_(a, b, c)
#define HONE_ABI_NAMESPACE \
  HONE_ABI_CONCAT(HONE_VERSION_MAJOR, HONE_VERSION_MINOR, HONE_VERSION_PATCH)
#define HONE_NAMESPACE_BEGIN \
  namespace hone {           \
  inline namespace HONE_ABI_NAMESPACE {
#define HONE_NAMESPACE_END \
  }                        \
  }

#if defined(__CUDACC__) || defined(__CUDA__)
#define HONE_CUDA_COMPILER 1
#define HONE_HOST_DEVICE __host__ __device__ inline
#define HONE_DEVICE __device__ inline
#define HONE_FORCEINLINE __forceinline__
#define HONE_HOST_DEVICE_FORCEINLINE __host__ __device__ __forceinline__
#else
#define HONE_CUDA_COMPILER 0
#define HONE_HOST_DEVICE inline
#define HONE_DEVICE inline
#if defined(__GNUC__) || defined(__clang__)
#define HONE_FORCEINLINE inline __attribute__((always_inline))
#else
#define HONE_FORCEINLINE inline
#endif
// A vector form's math (an update functor's apply and what it calls): always inlined, so that it
// is compiled for the target of the loop that runs it (core/detail/simd.hpp).
#define HONE_HOST_DEVICE_FORCEINLINE HONE_FORCEINLINE
#endif

// True while compiling the device pass of a CUDA translation unit.
#if defined(__CUDA_ARCH__)
#define HONE_DEVICE_PASS 1
#else
#define HONE_DEVICE_PASS 0
#endif

// Restrict qualifier understood by g++, clang and nvcc: lets the inner loops of the backends
// vectorize without runtime alias checks.
#define HONE_RESTRICT __restrict__

// Whether the CUDA runtime is part of this build: set by the hone::cuda CMake target (which
// defines HONE_WITH_CUDA) or implied by compiling with nvcc. Host headers never require it;
// headers under core/cuda and <module>/cuda do, and buffer<T, cuda_space> is only usable then.
#if defined(HONE_WITH_CUDA) || defined(__CUDACC__)
#define HONE_HAS_CUDA_RUNTIME 1
#else
#define HONE_HAS_CUDA_RUNTIME 0
#endif

HONE_NAMESPACE_BEGIN
struct version_info {
  int major, minor, patch;
};
inline constexpr version_info version{HONE_VERSION_MAJOR, HONE_VERSION_MINOR, HONE_VERSION_PATCH};
HONE_NAMESPACE_END
