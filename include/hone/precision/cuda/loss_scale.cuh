// hone/precision/cuda/loss_scale.cuh: the loss-scale update on the GPU (PyTorch's
// _amp_update_scale_ kernel, with hone's hysteresis and bounds). Include only from .cu files.
//
// device_loss_scaler keeps a scaler's state (hone::loss_scale_state plus an error flag) in device
// memory and updates it with one single-thread kernel that reads the found_inf flag of the unscale
// pass (hone/precision/cuda/unscale.cuh): the scale of the next step is ready on the device
// without a host synchronization. The update is dynamic_loss_scaler::update / static_loss_scaler
// ::update (hone/precision/loss_scale.hpp) line for line. The host one throws when an overflow
// arrives with the scale already at min_scale; the device one cannot throw, so it leaves the state
// unchanged but the skip count, raises an error flag, and read_state() throws the host's error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/cuda/error.hpp"
#include "hone/core/cuda/multi_tensor_apply.cuh"
#include "hone/core/cuda/space.hpp"
#include "hone/core/error.hpp"
#include "hone/precision/loss_scale.hpp"

HONE_NAMESPACE_BEGIN

/// A scaler's state as kept in device memory.
struct device_scale_state {
  loss_scale_state state;
  int collapsed = 0;  // 1: an overflow arrived with the scale at min_scale (the host throws)
};

namespace detail {

__device__ inline void update_scale_device(device_scale_state& s, bool found_inf,
                                           const dynamic_loss_scale& cfg) {
  loss_scale_state& st = s.state;
  if (found_inf) {
    ++st.skipped_steps;
    st.growth_tracker = 0;
    if (--st.hysteresis_tracker > 0) return;
    st.hysteresis_tracker = cfg.hysteresis;
    if (st.scale <= cfg.min_scale) {
      s.collapsed = 1;
      return;
    }
    const float next = st.scale * cfg.backoff_factor;
    st.scale = next < cfg.min_scale ? cfg.min_scale : next;
    return;
  }
  st.hysteresis_tracker = cfg.hysteresis;
  if (++st.growth_tracker == cfg.growth_interval) {
    st.growth_tracker = 0;
    const float next = st.scale * cfg.growth_factor;
    if (isfinite(next)) st.scale = next < cfg.max_scale ? next : cfg.max_scale;
  }
}

// The kernels are templates so that several .cu files of one program can include this header (a
// plain __global__ function would be defined once per file and fail to link).
template <class Config>
__global__ void update_dynamic_scale_kernel(device_scale_state* s, const int* found_inf,
                                            Config cfg) {
  if (s->collapsed != 0) return;  // the error is reported; nothing moves any more
  update_scale_device(*s, *found_inf != 0, cfg);
}

template <class Config>
__global__ void update_static_scale_kernel(device_scale_state* s, const int* found_inf) {
  if (*found_inf != 0) ++s->state.skipped_steps;
}

}  // namespace detail

/// The state of a dynamic_loss_scaler or static_loss_scaler in device memory.
class device_loss_scaler {
 public:
  device_loss_scaler() : state_(1), staging_(1) {}

  /// Device pointer to the state (scale: &state()->state.scale).
  [[nodiscard]] device_scale_state* state() noexcept { return state_.data(); }
  /// Device pointer to the current scale (what the unscale factor and the model may read).
  [[nodiscard]] const float* scale() noexcept { return &state_.data()->state.scale; }

  /// Copies a host state to the device, stream-ordered on `exec.stream` (the host state is staged
  /// in pinned memory; the call waits for a previous upload to have left it).
  void load(cuda_exec exec, const loss_scale_state& s) {
    HONE_CUDA_CHECK(cudaStreamSynchronize(exec.stream));
    staging_.data()->state = s;
    staging_.data()->collapsed = 0;
    HONE_CUDA_CHECK(cudaMemcpyAsync(state_.data(), staging_.data(), sizeof(device_scale_state),
                                    cudaMemcpyHostToDevice, exec.stream));
  }

  /// Records the outcome of a step on the device: reads *found_inf (device int), moves the scale.
  void update(cuda_exec exec, const int* found_inf, const dynamic_loss_scale& cfg) {
    detail::update_dynamic_scale_kernel<dynamic_loss_scale>
        <<<1, 1, 0, exec.stream>>>(state_.data(), found_inf, cfg);
    check_last_launch("hone::device_loss_scaler::update: update_dynamic_scale_kernel launch");
  }
  void update(cuda_exec exec, const int* found_inf, const static_loss_scale& /*cfg*/) {
    detail::update_static_scale_kernel<static_loss_scale>
        <<<1, 1, 0, exec.stream>>>(state_.data(), found_inf);
    check_last_launch("hone::device_loss_scaler::update: update_static_scale_kernel launch");
  }

  /// Waits for `exec.stream` and returns the state; throws hone::error (the host scaler's) when
  /// the scale collapsed below its minimum.
  loss_scale_state read_state(cuda_exec exec, float min_scale = 0.0f) {
    HONE_CUDA_CHECK(cudaMemcpyAsync(staging_.data(), state_.data(), sizeof(device_scale_state),
                                    cudaMemcpyDeviceToHost, exec.stream));
    HONE_CUDA_CHECK(cudaStreamSynchronize(exec.stream));
    const device_scale_state s = *staging_.data();
    if (s.collapsed != 0) {
      throw error(
          "hone::device_loss_scaler: gradients overflow with the loss scale already at its "
          "minimum (" +
          std::to_string(min_scale) +
          "). The model produces inf/NaN gradients independently of the scale: check the data "
          "and the loss for NaN, lower the learning rate, or use bf16.");
    }
    return s.state;
  }

 private:
  buffer<device_scale_state, cuda_space> state_;
  buffer<device_scale_state, pinned_host_space> staging_;
};

HONE_NAMESPACE_END
