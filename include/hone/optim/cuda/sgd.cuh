// hone/optim/cuda/sgd.cuh: SGD on the GPU: the functors of hone/optim/sgd.hpp run by the CUDA
// multi-tensor apply. Include only from .cu files.
#pragma once

#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/cuda/multi_tensor_apply.cuh"
#include "hone/core/cuda/space.hpp"
#include "hone/optim/cuda/common.cuh"
#include "hone/optim/sgd.hpp"

HONE_NAMESPACE_BEGIN

/// One SGD step on `exec.stream` (arguments as the AdamW overload in hone/optim/cuda/adamw.cuh).
template <class G>
void step(cuda_exec exec, sgd_state<cuda_space>& state, const sgd& policy,
          const optimizer_step_args& args, float* master, const G* grad,
          const std::vector<param_group>& groups = {}, const int* found_inf = nullptr,
          const float* device_grad_scale = nullptr, multi_tensor_tuning tuning = {}) {
  state.for_each_group(policy, args, master, grad, groups, [&](const auto& lists, const auto& op) {
    detail::launch_guarded(exec, lists, op, found_inf, device_grad_scale, tuning);
  });
}

HONE_NAMESPACE_END
