// hone/optim/cuda/common.cuh: what the CUDA optimizer steps share. Include only from .cu files.
//
// The CUDA steps run the same element functors as the host steps, through the CUDA multi-tensor
// apply, wrapped in skip_on_found_inf:
//  - found_inf (device int, may be null): when *found_inf != 0 the functor returns without
//    changing anything, so a step with inf/NaN gradients is skipped inside the kernel, with no
//    host synchronization between the gradient check and the update;
//  - device_grad_scale (device float, may be null): multiplies optimizer_step_args::grad_scale,
//    so a clipping coefficient computed on the device (hone/optim/cuda/clipping.cuh) folds into
//    the update without a host round trip.
#pragma once

#include <cuda_runtime.h>

#include "hone/core/config.hpp"
#include "hone/core/cuda/multi_tensor_apply.cuh"

HONE_NAMESPACE_BEGIN
namespace detail {

/// Wraps an optimizer functor for the CUDA multi-tensor apply (see the file comment).
template <class Op>
struct skip_on_found_inf {
  Op op;
  const int* found_inf;
  const float* device_grad_scale;

  template <class... A>
  __device__ __forceinline__ void operator()(A&... a) const {
    if (found_inf != nullptr && *found_inf != 0) return;
    if (device_grad_scale != nullptr) {
      Op scaled = op;
      scaled.scale_grads(*device_grad_scale);
      scaled(a...);
    } else {
      op(a...);
    }
  }
};

/// Runs `op` over `lists` on the device with the skip and scale of skip_on_found_inf.
template <class Op, class... Ts>
void launch_guarded(cuda_exec exec, const tensor_lists<Ts...>& lists, const Op& op,
                    const int* found_inf, const float* device_grad_scale,
                    multi_tensor_tuning tuning) {
  hone::for_each(exec, lists, skip_on_found_inf<Op>{op, found_inf, device_grad_scale}, tuning);
}

}  // namespace detail
HONE_NAMESPACE_END
