// hone/optim/cuda/adamw.cuh: AdamW on the GPU: the functors of hone/optim/adamw.hpp run by the
// CUDA multi-tensor apply, one launch series per parameter group. Include only from .cu files.
#pragma once

#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/cuda/multi_tensor_apply.cuh"
#include "hone/core/cuda/space.hpp"
#include "hone/optim/adamw.hpp"
#include "hone/optim/cuda/common.cuh"

HONE_NAMESPACE_BEGIN

/// One AdamW step on `exec.stream`: master (fp32) and grad (G = float, bfloat16 or half) are
/// device arenas laid out like the state. Asynchronous. With found_inf (device int) set to a
/// non-zero value by the time the kernels run, nothing is written; device_grad_scale (device
/// float), when given, multiplies args.grad_scale (see hone/optim/cuda/common.cuh).
template <class G>
void step(cuda_exec exec, adamw_state<cuda_space>& state, const adamw& policy,
          const optimizer_step_args& args, float* master, const G* grad,
          const std::vector<param_group>& groups = {}, const int* found_inf = nullptr,
          const float* device_grad_scale = nullptr, multi_tensor_tuning tuning = {}) {
  state.for_each_group(policy, args, master, grad, groups, [&](const auto& lists, const auto& op) {
    detail::launch_guarded(exec, lists, op, found_inf, device_grad_scale, tuning);
  });
}

HONE_NAMESPACE_END
