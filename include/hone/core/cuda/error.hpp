// hone/core/cuda/error.hpp: CUDA status checking. Every runtime call hone makes goes through
// HONE_CUDA_CHECK, which throws hone::cuda_error naming the call, the CUDA error and the place.
// Host header: needs the CUDA runtime headers (link hone::cuda), compiles with g++ or nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN
namespace detail {
/// Builds the message of a failed CUDA call: "<call> failed: <text> (<name>) at <file>:<line>".
inline std::string cuda_message(cudaError_t status, const char* call, const source_location& loc) {
  return std::string(call) + " failed: " + cudaGetErrorString(status) + " (" +
         cudaGetErrorName(status) + ") at " + where(loc);
}

inline void cuda_check(cudaError_t status, const char* call,
                       source_location loc = source_location::current()) {
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // reset the (non-sticky) error so later checks are not blamed
    throw cuda_error(cuda_message(status, call, loc), static_cast<int>(status));
  }
}
}  // namespace detail

/// Throws hone::cuda_error if the last kernel launch failed (bad configuration, too many
/// resources). `what` names the kernel in the message.
inline void check_last_launch(const char* what, source_location loc = source_location::current()) {
  detail::cuda_check(cudaGetLastError(), what, loc);
}

/// Number of visible CUDA devices; 0 (not an exception) when there is no device or no driver.
inline int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}
HONE_NAMESPACE_END

/// Checks a CUDA runtime call: `HONE_CUDA_CHECK(cudaMemcpy(...));`
#define HONE_CUDA_CHECK(call) \
  ::hone::detail::cuda_check((call), #call, ::hone::source_location::current())
