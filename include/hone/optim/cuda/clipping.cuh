// hone/optim/cuda/clipping.cuh: gradient norm, non-finite check and clipping on the GPU, with
// every result left in device memory so the optimizer step can consume it without a host
// synchronization (device_grad_scale and found_inf of the CUDA steps). Include only from .cu files.
//
// The reduction is deterministic: the grid size depends only on n, each thread combines a fixed
// strided subset in a fixed order (double accumulation), each block combines its threads with
// cub::BlockReduce (hone/core/cuda/block_reduce.cuh, a fixed order for the fixed block size), and
// a single block combines the per-block partials the same way; no atomics.
//
// Non-finite norms: found_inf (when given) is set to 1 and never cleared (zero it before the step,
// as PyTorch's GradScaler does); the coefficient written is then 1. error_if_nonfinite cannot
// throw from the device without a synchronization: it is ignored here (read found_inf instead).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/cuda/block_reduce.cuh"
#include "hone/core/cuda/error.hpp"
#include "hone/core/cuda/multi_tensor_apply.cuh"
#include "hone/core/cuda/space.hpp"
#include "hone/optim/clipping.hpp"

HONE_NAMESPACE_BEGIN

/// Scratch memory of the device reductions (one per stream that runs them concurrently).
class grad_norm_workspace {
 public:
  static constexpr int max_blocks = 1024;
  grad_norm_workspace() : partials_(max_blocks) {}
  [[nodiscard]] double* partials() noexcept { return partials_.data(); }

 private:
  buffer<double, cuda_space> partials_;
};

namespace detail {

inline constexpr int reduce_threads = 256;
inline constexpr int reduce_items_per_thread = 8;

enum class grad_reduction : int { sum_sq = 0, sum_abs = 1, max_abs = 2 };

template <grad_reduction R>
struct reduce_combine {
  __device__ __forceinline__ double operator()(double a, double b) const {
    if constexpr (R == grad_reduction::max_abs) {
      return (a != a || a > b) ? a : b;  // NaN-propagating max
    } else {
      return a + b;
    }
  }
};

template <grad_reduction R, class G>
__device__ __forceinline__ double reduce_term(const G& g) {
  const double x = grad_to_float(g);
  if constexpr (R == grad_reduction::sum_sq) {
    return x * x;
  } else {
    return x < 0 ? -x : x;
  }
}

using grad_block_reduce = block_reduce<double, reduce_threads>;

template <grad_reduction R, class G>
__global__ void __launch_bounds__(reduce_threads)
    grad_reduce_partial_kernel(const G* grad, std::int64_t n, double* partials) {
  __shared__ grad_block_reduce::storage shared;
  double acc = 0.0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * reduce_threads;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * reduce_threads + threadIdx.x; i < n;
       i += stride) {
    acc = reduce_combine<R>{}(acc, reduce_term<R>(grad[i]));
  }
  const double r = grad_block_reduce(shared).reduce(acc, reduce_combine<R>{});  // thread 0 only
  if (threadIdx.x == 0) partials[blockIdx.x] = r;
}

template <grad_reduction R>
__global__ void __launch_bounds__(reduce_threads)
    grad_reduce_final_kernel(const double* partials, int parts, float grad_scale, float max_norm,
                             double* sum_sq, float* norm, float* coefficient, int* found_inf) {
  __shared__ grad_block_reduce::storage shared;
  double acc = 0.0;
  for (int i = threadIdx.x; i < parts; i += reduce_threads) {
    acc = reduce_combine<R>{}(acc, partials[i]);
  }
  const double total = grad_block_reduce(shared).reduce(acc, reduce_combine<R>{});  // thread 0
  if (threadIdx.x != 0) return;
  const double s = grad_scale;
  const bool finite = isfinite(total);
  if (!finite && found_inf != nullptr) *found_inf = 1;
  if (sum_sq != nullptr) *sum_sq = total * s * s;
  float total_norm;
  if constexpr (R == grad_reduction::sum_sq) {
    total_norm = static_cast<float>(sqrt(total * s * s));
  } else {
    total_norm = static_cast<float>(total * s);
  }
  if (norm != nullptr) *norm = total_norm;
  if (coefficient != nullptr) {
    const float coef = max_norm / (total_norm + 1e-6f);
    *coefficient = (finite && coef < 1.0f) ? coef : 1.0f;
  }
}

template <grad_reduction R, class G>
void launch_grad_reduction(cuda_exec exec, const G* grad, std::size_t n, float grad_scale,
                           float max_norm, grad_norm_workspace& ws, double* sum_sq, float* norm,
                           float* coefficient, int* found_inf) {
  const std::size_t per_block =
      static_cast<std::size_t>(reduce_threads) * static_cast<std::size_t>(reduce_items_per_thread);
  std::size_t blocks = (n + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  if (blocks > static_cast<std::size_t>(grad_norm_workspace::max_blocks)) {
    blocks = grad_norm_workspace::max_blocks;
  }
  grad_reduce_partial_kernel<R, G><<<static_cast<int>(blocks), reduce_threads, 0, exec.stream>>>(
      grad, static_cast<std::int64_t>(n), ws.partials());
  check_last_launch("hone: grad_reduce_partial_kernel launch");
  grad_reduce_final_kernel<R>
      <<<1, reduce_threads, 0, exec.stream>>>(ws.partials(), static_cast<int>(blocks), grad_scale,
                                              max_norm, sum_sq, norm, coefficient, found_inf);
  check_last_launch("hone: grad_reduce_final_kernel launch");
}

}  // namespace detail

/// The fused gradient check on the device: *sum_sq = sum of (grad * grad_scale)^2 (double
/// accumulation), and *found_inf = 1 when a gradient is inf or NaN (left unchanged otherwise).
/// Either output may be null. Asynchronous.
template <class G>
void grad_norm_and_check(cuda_exec exec, const G* grad, std::size_t n, float grad_scale,
                         grad_norm_workspace& ws, double* sum_sq, int* found_inf) {
  detail::check_grad_scale(grad_scale, "hone::grad_norm_and_check(cuda_exec)");
  detail::launch_grad_reduction<detail::grad_reduction::sum_sq>(
      exec, grad, n, grad_scale, 1.0f, ws, sum_sq, nullptr, nullptr, found_inf);
}

/// clip_grad_norm on the device (norm types 2, 1 and infinity): writes the total norm of
/// grad * grad_scale to *norm and min(1, max_norm / (norm + 1e-6)) to *coefficient (1 when the
/// norm is non-finite; then *found_inf = 1). Pass `coefficient` as the step's device_grad_scale.
/// Outputs may be null. Asynchronous; reads the gradients only.
template <class G>
void clip(cuda_exec exec, const clip_grad_norm& policy, const G* grad, std::size_t n,
          float grad_scale, grad_norm_workspace& ws, float* norm, float* coefficient,
          int* found_inf = nullptr) {
  policy.check();
  detail::check_grad_scale(grad_scale, "hone::clip(cuda_exec, clip_grad_norm)");
  if (std::isinf(policy.norm_type)) {
    detail::launch_grad_reduction<detail::grad_reduction::max_abs>(
        exec, grad, n, grad_scale, policy.max_norm, ws, nullptr, norm, coefficient, found_inf);
  } else if (policy.norm_type == 2.0f) {
    detail::launch_grad_reduction<detail::grad_reduction::sum_sq>(
        exec, grad, n, grad_scale, policy.max_norm, ws, nullptr, norm, coefficient, found_inf);
  } else if (policy.norm_type == 1.0f) {
    detail::launch_grad_reduction<detail::grad_reduction::sum_abs>(
        exec, grad, n, grad_scale, policy.max_norm, ws, nullptr, norm, coefficient, found_inf);
  } else {
    throw config_error("hone::clip(cuda_exec, clip_grad_norm): norm_type " +
                       std::to_string(policy.norm_type) +
                       " is not supported on the GPU; use 2, 1 or infinity (the host supports any "
                       "p > 0)");
  }
}

/// clip_grad_value on the device: clamps grad in place to [-clip_value, clip_value] / grad_scale
/// and sets *found_inf = 1 (when given) if a gradient is inf or NaN. Asynchronous.
template <class G>
void clip(cuda_exec exec, const clip_grad_value& policy, G* grad, std::size_t n, float grad_scale,
          int* found_inf = nullptr, multi_tensor_tuning tuning = {}) {
  tensor_lists<G> lists;
  lists.add(n, grad);
  hone::for_each(exec, lists, policy.functor<G>(grad_scale, found_inf), tuning);
}

HONE_NAMESPACE_END
