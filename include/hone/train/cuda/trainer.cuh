// hone/train/cuda/trainer.cuh: the CUDA backend of hone::trainer, for a model whose parameters
// live in CUDA device memory (its parameters() views are hone::device_span, e.g.
// hone::parameter<T, hone::cuda_space>). Include only from .cu files; the model is then trained
// with the same hone::trainer (and the same step skeleton, hone/train/trainer.hpp) as on the host:
// this header supplies detail::cuda_backend, which the trainer picks from the model's space.
//
// One step, all on the model's stream (model.cuda_stream() when the model has it, else the legacy
// default stream):
//  1. found_inf is zeroed; the scaler's state stays on the device from step to step (it is
//     uploaded only when the host's changed: a restore or a user's load_state);
//  2. for each micro-batch: the model's forward_backward writes working gradients; the fused
//     unscale pass (hone/precision/cuda/unscale.cuh, the host's functor) accumulates them into
//     the fp32 master gradients and leaves the sum of squares, found_inf and the L2 clipping
//     coefficient in device memory;
//  3. a gradient reduction policy, when the trainer has one, reduces the master gradients on the
//     stream; their sum of squares, found_inf and clipping coefficient are then recomputed;
//  4. the loss scale is updated on the device (hone/precision/cuda/loss_scale.cuh);
//  5. clipping by value or by a non-L2 norm runs on the device (hone/optim/cuda/clipping.cuh);
//  6. the optimizer (hone/optim/cuda/*.cuh) and the cast back to the working weights run with
//     found_inf and the device clipping coefficient: a step with inf/NaN gradients is skipped
//     inside the kernels, with no host synchronization between the check and the update;
//  7. one copy of the step's results to pinned host memory and one stream synchronization (the
//     step's only one) fill the step_report (the schedule and the bias correction need the
//     applied-step count).
// A skipped step leaves master weights, moments, working weights, the step counter and the
// schedule bit-identical, as on the host.
//
// Role offload (hone::offload::optimizer_to_host): steps 1-5 run on the device as above; the
// step's found_inf and clipping coefficient are read back (the same one synchronization), and
// the update runs through hone::offload::engine with hone::offload::cuda_transport: the fp32
// master gradients stream to pinned host memory in buckets on a side stream, the host's fused
// optimizer updates the host master weights and state bucket by bucket, and the working weights
// stream back (immediately, or one step delayed as ZeRO-Offload). No optimizer state and no fp32
// master weights stay on the device. Master weights and optimizer state are then host memory, so
// the host checkpoint functions (hone/checkpoint/trainer_checkpoint.hpp) save and restore such a
// trainer.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/cuda/error.hpp"
#include "hone/core/cuda/multi_tensor_apply.cuh"
#include "hone/core/cuda/space.hpp"
#include "hone/core/device_span.hpp"
#include "hone/offload/cuda/transport.cuh"
#include "hone/optim/cuda/adamw.cuh"
#include "hone/optim/cuda/adamw_8bit.cuh"
#include "hone/optim/cuda/clipping.cuh"
#include "hone/optim/cuda/sgd.cuh"
#include "hone/precision/cuda/loss_scale.cuh"
#include "hone/precision/cuda/unscale.cuh"
#include "hone/precision/unscale.hpp"
#include "hone/train/trainer.hpp"

HONE_NAMESPACE_BEGIN
namespace detail {

/// What one device step leaves for the host to read (one copy per step).
struct device_step_scratch {
  double sum_sq;
  float norm;
  float clip_coefficient;
  int found_inf;
};

/// working = W(master), skipped when *found_inf != 0 (the update was skipped in-kernel too).
template <class W>
struct guarded_cast_to_working {
  const int* found_inf;
  __device__ __forceinline__ void operator()(W& working, const float& master) const {
    if (*found_inf != 0) return;
    working = static_cast<W>(master);
  }
};

template <class M>
cudaStream_t model_stream(M& m) {
  if constexpr (requires { m.cuda_stream(); }) {
    return static_cast<cudaStream_t>(m.cuda_stream());
  } else {
    return nullptr;
  }
}

/// hone::trainer's backend for CUDA models (see the file comment).
template <class Types>
class cuda_backend : public backend_types<Types, cuda_space, offload::cuda_transport> {
  using base = backend_types<Types, cuda_space, offload::cuda_transport>;
  using clipping_type = typename Types::clipping_type;

 public:
  using typename base::transport_type;
  using typename base::working_type;

  template <class Model>
  explicit cuda_backend(Model& model) : scratch_(1), readback_(1), exec_{model_stream(model)} {}

  /// The offload engine's transport, on the model's stream.
  [[nodiscard]] transport_type transport() const { return transport_type(exec_.stream); }
  /// The stream every kernel of the step runs on.
  [[nodiscard]] cuda_exec exec() const noexcept { return exec_; }

  /// Element-wise pass over tensor lists of device pointers (one multi-tensor kernel).
  template <class... Ts, class F>
  void for_each(const tensor_lists<Ts...>& lists, const F& f) {
    hone::for_each(exec_, lists, f);
  }

  /// master[i] = float(working[i]): the offload engine's host master weights from the device's
  /// flat working weights (synchronously).
  void load_master(float* master, const working_type* working, std::size_t n) {
    std::vector<working_type> host(n);
    HONE_CUDA_CHECK(cudaMemcpyAsync(host.data(), working, n * sizeof(working_type),
                                    cudaMemcpyDeviceToHost, exec_.stream));
    HONE_CUDA_CHECK(cudaStreamSynchronize(exec_.stream));
    for (std::size_t i = 0; i < n; ++i) master[i] = static_cast<float>(host[i]);
  }

  template <class Parts>
  void check(const Parts& p) const {
    if constexpr (std::is_same_v<clipping_type, clip_grad_norm>) {
      HONE_REQUIRE(
          p.clipping.norm_type == 2.0f || p.clipping.norm_type == 1.0f ||
              std::isinf(p.clipping.norm_type),
          "hone::trainer (CUDA): clip_grad_norm::norm_type must be 2, 1 or infinity on the "
          "GPU; got " +
              std::to_string(p.clipping.norm_type));
    } else {
      (void)p;
    }
  }

  /// Nothing to compute: the CUDA backend always writes the master gradients.
  template <class Parts>
  void materialize_master_gradients(const Parts& /*p*/) const noexcept {}

  template <class Parts>
  void begin_step(Parts& p, std::size_t /*micro_batches*/) {
    device_step_scratch* s = scratch_.data();
    // The device keeps the scaler's state from step to step; it is uploaded (which waits for the
    // stream) only when the host's differs from what the last step read back: after a restore, a
    // user's load_state, or an error. So a step synchronizes once, at its end.
    if (!device_scaler_ || !(*device_scaler_ == p.scaler.state())) {
      device_scaler_.reset();
      dscaler_.load(exec_, p.scaler.state());
      device_scaler_ = p.scaler.state();
    }
    HONE_CUDA_CHECK(cudaMemsetAsync(&s->found_inf, 0, sizeof(int), exec_.stream));
    out_ = unscale_outputs{&s->sum_sq, &s->found_inf, &s->norm, nullptr, 0.0f};
    if constexpr (std::is_same_v<clipping_type, clip_grad_norm>) {
      if (l2_clipping(p)) {
        out_.clip_coefficient = &s->clip_coefficient;
        out_.max_norm = p.clipping.max_norm;
      }
    }
  }

  template <class Parts>
  void accumulate(Parts& p, float factor, bool accumulate) {
    unscale_accumulate_into(exec_, p.grads, factor, accumulate, unscale_ws_, out_);
  }

  /// The gradient reduction role on the stream, then the sum of squares, found_inf and the L2
  /// clipping coefficient of the reduced gradients.
  template <class Parts>
  void reduce_gradients(Parts& p) {
    using reduction = typename Types::reduction_type;
    static_assert(
        requires(reduction & r, device_span<float> g, cudaStream_t st) { r.reduce(g, st); },
        "hone::trainer (CUDA): the gradient reduction policy has no member function "
        "reduce(hone::device_span<float> master_gradients, cudaStream_t stream) for a CUDA "
        "model.");
    device_step_scratch* s = scratch_.data();
    float* g = p.master_grad_data();
    p.reduction.reduce(device_span<float>{g, p.size()}, exec_.stream);
    grad_norm_and_check(exec_, static_cast<const float*>(g), p.size(), 1.0f, norm_ws_, &s->sum_sq,
                        &s->found_inf);
    if constexpr (std::is_same_v<clipping_type, clip_grad_norm>) {
      if (l2_clipping(p)) {
        hone::clip(exec_, p.clipping, static_cast<const float*>(g), p.size(), 1.0f, norm_ws_,
                   &s->norm, &s->clip_coefficient, &s->found_inf);
      }
    }
  }

  /// The scaler's decision on the device, clipping, and (without the offload role) the guarded
  /// update and cast; then the one copy back and synchronization. With the offload role the
  /// device clipping coefficient goes into args.grad_scale for the host optimizer.
  template <class Parts>
  step_check finish(Parts& p, optimizer_step_args& args) {
    device_step_scratch* s = scratch_.data();
    dscaler_.update(exec_, &s->found_inf, p.precision.scaler);
    const float* coefficient = clip_on_device(p);
    if constexpr (!Types::offloaded) {
      hone::step(exec_, p.state, p.optimizer, args, p.master, p.master_grad_data(), p.groups,
                 &s->found_inf, coefficient);
      if (!p.zero_copy) {
        hone::for_each(exec_, p.weights_out, guarded_cast_to_working<working_type>{&s->found_inf});
      }
    }
    HONE_CUDA_CHECK(cudaMemcpyAsync(readback_.data(), s, sizeof(device_step_scratch),
                                    cudaMemcpyDeviceToHost, exec_.stream));
    device_scaler_.reset();  // unknown until read back (read_state throws on a collapse)
    p.scaler.load_state(dscaler_.read_state(exec_, min_scale(p)));  // synchronizes the stream
    device_scaler_ = p.scaler.state();
    const device_step_scratch h = *readback_.data();
    step_check c;
    c.grad_norm = std::sqrt(h.sum_sq);
    c.skipped = h.found_inf != 0;
    if constexpr (Types::offloaded) {
      if (coefficient != nullptr) args.grad_scale = h.clip_coefficient;
    }
    return c;
  }

  /// Nothing left to do: the update and the cast ran in finish, guarded by found_inf on the
  /// device (no synchronization between the check and the update).
  template <class Parts>
  void apply_update(Parts& /*p*/, const optimizer_step_args& /*args*/) noexcept {}

  /// Waits for the stream.
  void synchronize() { HONE_CUDA_CHECK(cudaStreamSynchronize(exec_.stream)); }

 private:
  template <class Parts>
  [[nodiscard]] static float min_scale(const Parts& p) noexcept {
    if constexpr (requires { p.precision.scaler.min_scale; }) {
      return p.precision.scaler.min_scale;
    } else {
      return 0.0f;
    }
  }

  template <class Parts>
  [[nodiscard]] static bool l2_clipping(const Parts& p) noexcept {
    if constexpr (std::is_same_v<clipping_type, clip_grad_norm>) {
      return p.clipping.norm_type == 2.0f;
    } else {
      (void)p;
      return false;
    }
  }

  /// The device clipping coefficient for the optimizer (null: none).
  template <class Parts>
  const float* clip_on_device(Parts& p) {
    device_step_scratch* s = scratch_.data();
    float* master_grad = p.master_grad_data();
    const std::size_t n = p.size();
    if constexpr (std::is_same_v<clipping_type, clip_grad_norm>) {
      if (!l2_clipping(p)) {
        hone::clip(exec_, p.clipping, static_cast<const float*>(master_grad), n, 1.0f, norm_ws_,
                   nullptr, &s->clip_coefficient, &s->found_inf);
      }
      return &s->clip_coefficient;
    } else if constexpr (std::is_same_v<clipping_type, clip_grad_value>) {
      hone::clip(exec_, p.clipping, master_grad, n, 1.0f, &s->found_inf);
      return nullptr;
    } else {
      (void)master_grad;
      (void)n;
      (void)s;
      return nullptr;
    }
  }

  buffer<device_step_scratch, cuda_space> scratch_;
  buffer<device_step_scratch, pinned_host_space> readback_;
  device_loss_scaler dscaler_;
  unscale_workspace unscale_ws_;
  grad_norm_workspace norm_ws_;
  cuda_exec exec_;
  unscale_outputs out_{};
  std::optional<loss_scale_state> device_scaler_;  // the device scaler's state, when known
};

template <class Types>
struct trainer_backend_for<cuda_space, Types> {
  using type = cuda_backend<Types>;
};

}  // namespace detail
HONE_NAMESPACE_END
