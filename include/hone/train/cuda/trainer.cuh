// hone/train/cuda/trainer.cuh: hone::trainer for a model whose parameters live in CUDA device
// memory (its parameters() views are hone::device_span, e.g. hone::parameter<T, hone::cuda_space>).
// Include only from .cu files; the model is then trained with the same hone::trainer as on the
// host (this header specializes detail::trainer_impl<hone::cuda_space, ...>).
//
// One step, all on the model's stream (model.cuda_stream() when the model has it, else the legacy
// default stream):
//  1. the scaler's state is staged on the device and found_inf is zeroed;
//  2. for each micro-batch: the model's forward_backward writes working gradients; the fused
//     unscale pass (hone/precision/cuda/unscale.cuh, the host's functor) accumulates them into
//     the fp32 master gradients and leaves the sum of squares, found_inf and the L2 clipping
//     coefficient in device memory;
//  3. the loss scale is updated on the device (hone/precision/cuda/loss_scale.cuh);
//  4. clipping by value or by a non-L2 norm runs on the device (hone/optim/cuda/clipping.cuh);
//  5. the optimizer (hone/optim/cuda/*.cuh) and the cast back to the working weights run with
//     found_inf and the device clipping coefficient: a step with inf/NaN gradients is skipped
//     inside the kernels, with no host synchronization between the check and the update;
//  6. one copy of the step's results to pinned host memory and one stream synchronization fill
//     the step_report (the schedule and the bias correction need the applied-step count).
// A skipped step leaves master weights, moments, working weights, the step counter and the
// schedule bit-identical, as on the host.
//
// Role offload (hone::offload::optimizer_to_host): steps 1-4 run on the device as above; the
// step's found_inf and clipping coefficient are read back (the same one synchronization), and
// step 5 runs through hone::offload::engine with hone::offload::cuda_transport: the fp32 master
// gradients stream to pinned host memory in buckets on a side stream, the host's fused optimizer
// updates the host master weights and state bucket by bucket, and the working weights stream
// back (immediately, or one step delayed as ZeRO-Offload). No optimizer state and no fp32 master
// weights stay on the device. Master weights and optimizer state are then host memory, so the
// host checkpoint functions (hone/checkpoint/trainer_checkpoint.hpp) save and restore such a
// trainer.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/arena.hpp"
#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/cuda/error.hpp"
#include "hone/core/cuda/multi_tensor_apply.cuh"
#include "hone/core/cuda/space.hpp"
#include "hone/core/device_span.hpp"
#include "hone/offload/cuda/transport.cuh"
#include "hone/offload/optimizer_to_host.hpp"
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

/// The CUDA trainer (see the file comment).
template <class Model, class... Policies>
class trainer_impl<cuda_space, Model, Policies...> : public trainer_types<Model, Policies...> {
  using types = trainer_types<Model, Policies...>;

 public:
  using typename types::accumulation_type;
  using typename types::checkpoint_type;
  using typename types::clipping_type;
  using typename types::offload_type;
  using typename types::optimizer_type;
  using typename types::precision_type;
  using typename types::scaler_type;
  using typename types::schedule_type;
  using typename types::working_type;
  using space_type = cuda_space;
  static constexpr bool offloaded = types::offloaded;
  /// The optimizer state: device arenas, or the offload engine's host arenas.
  using state_type =
      optimizer_state_t<optimizer_type, std::conditional_t<offloaded, host_space, cuda_space>>;
  /// The offload engine (CUDA transport on the model's stream), or a placeholder.
  using offload_engine_type = std::conditional_t<
      types::offload_ok,
      offload::engine<optimizer_type, float, working_type, offload::cuda_transport>, absent_member>;

  explicit trainer_impl(Model& model, Policies... policies)
      : model_(&model),
        policies_(std::move(policies)...),
        precision_(policy_object<precision_type>(policies_)),
        accumulation_(policy_object<accumulation_type>(policies_)),
        optimizer_(policy_object<optimizer_type>(policies_)),
        clipping_(policy_object<clipping_type>(policies_)),
        schedule_(policy_object<schedule_type>(policies_)),
        scaler_(precision_.scaler),
        layout_(types::make_layout(model)),
        state_(optimizer_, layout_),
        scratch_(1),
        readback_(1),
        exec_{model_stream(model)},
        engine_(make_engine()),
        checkpoint_(policy_object<checkpoint_type>(policies_)) {
    schedule_.validate();
    if constexpr (requires { clipping_.check(); }) clipping_.check();
    if constexpr (std::is_same_v<clipping_type, clip_grad_norm>) {
      require(clipping_.norm_type == 2.0f || clipping_.norm_type == 1.0f ||
                  std::isinf(clipping_.norm_type),
              "hone::trainer (CUDA): clip_grad_norm::norm_type must be 2, 1 or infinity on the "
              "GPU; got " +
                  std::to_string(clipping_.norm_type));
    }
    bind();
  }

  trainer_impl(const trainer_impl&) = delete;
  trainer_impl& operator=(const trainer_impl&) = delete;

  void set_param_groups(std::vector<param_group> groups) { groups_ = std::move(groups); }

  /// One optimizer step over the micro-batches of one accumulated batch.
  template <class Batch>
  step_report step(std::span<const Batch> micro_batches) {
    static_assert(check_trainable<Model, Batch>());
    static_assert(accumulation_policy<accumulation_type, Batch>,
                  "hone::trainer: the accumulation policy cannot weight this batch type.");
    checkpoint_.before_step(self());
    const std::vector<float> weights = accumulation_.template weights<Batch>(micro_batches);
    step_report r;
    r.loss_scale = scaler_.scale();
    r.lr = static_cast<float>(schedule_.lr(step_));
    const float inv_scale = 1.0f / r.loss_scale;
    device_step_scratch* s = scratch_.data();
    dscaler_.load(exec_, scaler_.state());
    HONE_CUDA_CHECK(cudaMemsetAsync(&s->found_inf, 0, sizeof(int), exec_.stream));
    unscale_outputs out{&s->sum_sq, &s->found_inf, &s->norm, nullptr, 0.0f};
    const bool l2_clip = l2_clipping();
    if constexpr (std::is_same_v<clipping_type, clip_grad_norm>) {
      if (l2_clip) {
        out.clip_coefficient = &s->clip_coefficient;
        out.max_norm = clipping_.max_norm;
      }
    }
    double loss = 0.0;
    for (std::size_t i = 0; i < micro_batches.size(); ++i) {
      const float l = static_cast<float>(
          model_traits<Model>::forward_backward(*model_, micro_batches[i], r.loss_scale));
      loss += static_cast<double>(weights[i]) * static_cast<double>(l);
      unscale_accumulate_into(exec_, grads_, weights[i] * inv_scale, i > 0, unscale_ws_, out);
    }
    r.loss = static_cast<float>(loss);
    dscaler_.update(exec_, &s->found_inf, precision_.scaler);
    const float* coefficient = clip_on_device(l2_clip);
    optimizer_step_args args{.step = step_ + 1, .lr = r.lr, .grad_scale = 1.0f, .momentum = {}};
    if constexpr (momentum_schedule_policy<schedule_type>) {
      if (const auto m = schedule_.momentum(step_)) args.momentum = static_cast<float>(*m);
    }
    if constexpr (!offloaded) {
      hone::step(exec_, state_, optimizer_, args, master_, master_grad_.all().data(), groups_,
                 &s->found_inf, coefficient);
      if (!zero_copy_) {
        hone::for_each(exec_, weights_out_, guarded_cast_to_working<working_type>{&s->found_inf});
      }
    }
    HONE_CUDA_CHECK(cudaMemcpyAsync(readback_.data(), s, sizeof(device_step_scratch),
                                    cudaMemcpyDeviceToHost, exec_.stream));
    scaler_.load_state(dscaler_.read_state(exec_, min_scale()));  // synchronizes the stream
    const device_step_scratch h = *readback_.data();
    r.grad_norm = std::sqrt(h.sum_sq);
    r.skipped = h.found_inf != 0;
    if constexpr (offloaded) {
      if (!r.skipped) {
        // The host optimizer, with the device's clipping coefficient folded into the gradient
        // scale (as the device kernels fold it). Immediate: the new working weights are on the
        // model's stream when this returns; delayed: the previous update is published and this
        // one runs on the engine's thread.
        if (coefficient != nullptr) args.grad_scale = h.clip_coefficient;
        engine_.step(args, master_grad_.all().data(), device_params_, groups_);
        copy_work_to_model();
      } else if (engine_.pending()) {
        engine_.flush(device_params_);  // nothing new to overlap with
        copy_work_to_model();
      }
    }
    if (!r.skipped) ++step_;
    r.step = step_;
    checkpoint_.after_step(self(), r);
    return r;
  }
  template <class Batch>
  step_report step(const Batch& batch) {
    return step(std::span<const Batch>(&batch, 1));
  }

  // ---- state, for checkpoints and inspection (device memory) ----
  [[nodiscard]] std::uint64_t steps_done() const noexcept { return step_; }
  [[nodiscard]] const arena_layout& layout() const noexcept { return layout_; }
  /// fp32 master weights: device memory (the model's own with fp32 weights bound zero-copy), or
  /// with the offload role the engine's host copy (after waiting for a pending delayed update).
  [[nodiscard]] auto master_weights() noexcept(!offloaded) {
    if constexpr (offloaded) {
      engine_.wait();
      return std::span<float>(engine_.master().all().data(), layout_.total());
    } else {
      return device_span<float>{master_, layout_.total()};
    }
  }
  [[nodiscard]] device_span<const float> master_gradients() const noexcept {
    return master_grad_.all();
  }
  /// The optimizer state: device arenas, or with the offload role the engine's host arenas
  /// (after waiting for a pending delayed update).
  [[nodiscard]] state_type& optimizer_state() noexcept(!offloaded) {
    if constexpr (offloaded) {
      engine_.wait();
      return engine_.state();
    } else {
      return state_;
    }
  }
  [[nodiscard]] const scaler_type& scaler() const noexcept { return scaler_; }
  [[nodiscard]] scaler_type& scaler() noexcept { return scaler_; }
  [[nodiscard]] const schedule_type& schedule() const noexcept { return schedule_; }
  [[nodiscard]] typename checkpoint_type::engine& checkpointer() noexcept { return checkpoint_; }
  [[nodiscard]] bool zero_copy() const noexcept { return zero_copy_; }
  /// The offload role's engine (its policy, buckets and transport), with the offload role only.
  [[nodiscard]] offload_engine_type& offload_engine() noexcept requires offloaded {
    return engine_;
  }
  /// The stream every kernel of the step runs on.
  [[nodiscard]] cuda_exec exec() const noexcept { return exec_; }
  void set_steps_done(std::uint64_t s) noexcept { step_ = s; }
  /// Copies the model's current weights into the master weights (stream-ordered; with the
  /// offload role through the host, synchronously, dropping a pending delayed update).
  void reload_weights_from_model() {
    if constexpr (offloaded) {
      engine_.wait();
      if (!work_in_.empty()) hone::for_each(exec_, work_in_, copy_element{});
      std::vector<working_type> host(layout_.total());
      HONE_CUDA_CHECK(cudaMemcpyAsync(host.data(), device_params_,
                                      host.size() * sizeof(working_type), cudaMemcpyDeviceToHost,
                                      exec_.stream));
      HONE_CUDA_CHECK(cudaStreamSynchronize(exec_.stream));
      float* m = engine_.master().all().data();
      for (std::size_t i = 0; i < layout_.size(); ++i) {
        const std::size_t off = layout_[i].offset;
        for (std::size_t j = 0; j < layout_[i].count; ++j) {
          m[off + j] = static_cast<float>(host[off + j]);
        }
      }
      engine_.push_params(device_params_);  // the model's weights win over a pending update
      copy_work_to_model();
    } else {
      if (!zero_copy_) hone::for_each(exec_, weights_in_, load_master<working_type>{});
    }
  }
  /// Casts the master weights into the model's working weights (stream-ordered).
  void publish_weights() {
    if constexpr (offloaded) {
      engine_.push_params(device_params_);
      copy_work_to_model();
    } else {
      if (!zero_copy_) hone::for_each(exec_, weights_out_, cast_to_working<working_type>{});
    }
  }
  /// Waits for the step's work on the device; with a delayed offload update, waits for it and
  /// publishes it into the model first (before an evaluation, or at the end of training).
  void flush() {
    if constexpr (offloaded) {
      engine_.flush(device_params_);
      copy_work_to_model();
    }
    HONE_CUDA_CHECK(cudaStreamSynchronize(exec_.stream));
  }

 private:
  trainer<Model, Policies...>& self() noexcept {
    return static_cast<trainer<Model, Policies...>&>(*this);
  }

  [[nodiscard]] float min_scale() const noexcept {
    if constexpr (requires { precision_.scaler.min_scale; }) {
      return precision_.scaler.min_scale;
    } else {
      return 0.0f;
    }
  }

  [[nodiscard]] bool l2_clipping() const noexcept {
    if constexpr (std::is_same_v<clipping_type, clip_grad_norm>) {
      return clipping_.norm_type == 2.0f;
    } else {
      return false;
    }
  }

  /// The device clipping coefficient for the optimizer (null: none).
  const float* clip_on_device(bool l2_clip) {
    device_step_scratch* s = scratch_.data();
    float* master_grad = master_grad_.all().data();
    const std::size_t n = master_grad_.all().size();
    if constexpr (std::is_same_v<clipping_type, clip_grad_norm>) {
      if (!l2_clip) {
        hone::clip(exec_, clipping_, static_cast<const float*>(master_grad), n, 1.0f, norm_ws_,
                   nullptr, &s->clip_coefficient, &s->found_inf);
      }
      return &s->clip_coefficient;
    } else if constexpr (std::is_same_v<clipping_type, clip_grad_value>) {
      hone::clip(exec_, clipping_, master_grad, n, 1.0f, &s->found_inf);
      return nullptr;
    } else {
      (void)l2_clip;
      (void)master_grad;
      (void)n;
      (void)s;
      return nullptr;
    }
  }

  offload_engine_type make_engine() {
    if constexpr (types::offload_ok) {
      return offload_engine_type(policy_object<offload_type>(policies_), optimizer_, layout_,
                                 offload::cuda_transport(exec_.stream));
    } else {
      return offload_engine_type();
    }
  }

  /// Offload with a model whose tensors are not one arena: the flat working weights the engine
  /// publishes into the model's tensors (on the model's stream, after the engine's uploads).
  void copy_work_to_model() {
    if (!work_out_.empty()) hone::for_each(exec_, work_out_, copy_element{});
  }

  void bind() {
    std::vector<std::pair<working_type*, working_type*>> views;  // (value, grad), device pointers
    for (auto& p : model_traits<Model>::parameters(*model_)) {
      views.emplace_back(p.value.data(), p.grad.data());
    }
    master_grad_ = arena<float, cuda_space>(layout_);
    bool laid_out = true;  // the working weights are one arena with the layout's offsets
    for (std::size_t i = 0; laid_out && i < views.size(); ++i) {
      laid_out = reinterpret_cast<std::uintptr_t>(views[i].first) ==
                 reinterpret_cast<std::uintptr_t>(views[0].first) +
                     layout_[i].offset * sizeof(working_type);
    }
    if constexpr (offloaded) {
      // The master weights live on the host (the engine's); the engine publishes working weights
      // into one device arena: the model's own when it is laid out, else a staging arena that
      // copy_work_to_model spreads over the model's tensors.
      if (laid_out) {
        device_params_ = views[0].first;
      } else {
        work_ = arena<working_type, cuda_space>(layout_);
        device_params_ = work_.all().data();
      }
      for (std::size_t i = 0; i < views.size(); ++i) {
        const auto n = layout_[i].count;
        grads_.add(n, master_grad_.all().data() + layout_[i].offset, views[i].second);
        if (!laid_out) {
          work_in_.add(n, device_params_ + layout_[i].offset, views[i].first);
          work_out_.add(n, views[i].first, device_params_ + layout_[i].offset);
        }
      }
      reload_weights_from_model();
      return;
    }
    const bool contiguous = laid_out && std::is_same_v<working_type, float>;
    if (contiguous) {
      master_ = reinterpret_cast<float*>(views[0].first);
      zero_copy_ = true;
    } else {
      own_master_ = arena<float, cuda_space>(layout_);
      master_ = own_master_.all().data();
    }
    for (std::size_t i = 0; i < views.size(); ++i) {
      const auto n = layout_[i].count;
      float* m = master_ + layout_[i].offset;
      grads_.add(n, master_grad_.all().data() + layout_[i].offset, views[i].second);
      if (!zero_copy_) {
        weights_in_.add(n, m, views[i].first);
        weights_out_.add(n, views[i].first, m);
      }
    }
    reload_weights_from_model();
  }

  Model* model_;
  std::tuple<Policies...> policies_;
  precision_type precision_;
  accumulation_type accumulation_;
  optimizer_type optimizer_;
  clipping_type clipping_;
  schedule_type schedule_;
  scaler_type scaler_;
  arena_layout layout_;
  arena<float, cuda_space> own_master_;
  arena<float, cuda_space> master_grad_;
  float* master_ = nullptr;
  bool zero_copy_ = false;
  using local_state_type =
      std::conditional_t<offloaded, absent_member, optimizer_state_t<optimizer_type, cuda_space>>;
  [[no_unique_address]] local_state_type state_;
  buffer<device_step_scratch, cuda_space> scratch_;
  buffer<device_step_scratch, pinned_host_space> readback_;
  device_loss_scaler dscaler_;
  unscale_workspace unscale_ws_;
  grad_norm_workspace norm_ws_;
  cuda_exec exec_;
  tensor_lists<float, const working_type> grads_;
  tensor_lists<float, const working_type> weights_in_;
  tensor_lists<working_type, const float> weights_out_;
  arena<working_type, cuda_space> work_;   // offload: flat working weights (unless the model's are)
  working_type* device_params_ = nullptr;  // offload: the working weights the engine publishes to
  tensor_lists<working_type, const working_type> work_in_;   // offload: model -> work_
  tensor_lists<working_type, const working_type> work_out_;  // offload: work_ -> model
  std::vector<param_group> groups_;
  std::uint64_t step_ = 0;
  offload_engine_type engine_;  // initialized from a prvalue (so not [[no_unique_address]])
  typename checkpoint_type::engine checkpoint_;
};

}  // namespace detail
HONE_NAMESPACE_END
