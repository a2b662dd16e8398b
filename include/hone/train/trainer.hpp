// hone/train/trainer.hpp: hone::trainer<Model, Policies...>, the composed training step.
//
//   hone::trainer t(model, hone::bf16_mixed{}, hone::accumulate::steps<4>{}, hone::adamw{},
//                   hone::clip_grad_norm{.max_norm = 1.0f}, hone::one_cycle{...});
//   hone::step_report r = t.step(std::span<const Batch>(micro_batches));
//
// Policies are picked by role, in any order; missing roles get defaults (fp32, accumulate::none,
// adamw, no clipping, constant_lr{1e-3}); two policies of one role, or a type that is not a
// policy, stop compilation with a sentence. Every call on the hot path is resolved at compile
// time (no virtual calls).
//
// One step (host memory):
//  1. for each micro-batch: the model's forward_backward(batch, loss_scale) writes working
//     gradients; one fused pass unscales them (times the micro-batch's accumulation weight),
//     accumulates them into the fp32 master gradients and, in the same pass, sums the squares of
//     the result in double. A non-finite sum means an inf/NaN gradient: doubles cannot overflow on
//     squares of floats, so the sum is non-finite exactly when some gradient was.
//  2. the clipping coefficient comes from that sum (no extra pass for L2 clipping);
//  3. the loss scaler decides: on overflow the step is skipped, and master weights, optimizer
//     moments, the step counter and the schedule position stay exactly as they were;
//  4. otherwise one fused optimizer pass per parameter group (the clip coefficient folded into
//     its gradient scale), then the master weights are cast back into the working weights.
// With fp32 weights laid out like the trainer's arena (the model binds its tensors to one
// contiguous block: see bind_parameters), the master weights ARE the model's weights: no copies.
//
// Role offload: with hone::offload::optimizer_to_host, step 4 runs through hone::offload::engine
// (host transport for a host model): the fp32 master gradients stream to the engine in buckets,
// master weights and optimizer state live in the engine's host memory, the updated working
// weights stream back, immediately or one step delayed (docs/offload.md). Steps 1-3 are unchanged,
// so immediate mode is bit-identical to the trainer without the role.
//
// Spaces: the implementation is chosen by the space of the model's parameter views
// (detail::trainer_impl<host_space, ...> below; a model with hone::device_span views needs
// hone/train/cuda/trainer.cuh, included from a .cu file, which specializes it for cuda_space).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/arena.hpp"
#include "hone/core/config.hpp"
#include "hone/core/device_span.hpp"
#include "hone/core/error.hpp"
#include "hone/core/model.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/core/space.hpp"
#include "hone/offload/optimizer_to_host.hpp"
#include "hone/offload/transport.hpp"
#include "hone/optim/adamw.hpp"
#include "hone/optim/clipping.hpp"
#include "hone/optim/optimizer.hpp"
#include "hone/optim/sgd.hpp"
#include "hone/precision/loss_scale.hpp"
#include "hone/precision/policies.hpp"
#include "hone/precision/unscale.hpp"
#include "hone/schedule/constant.hpp"
#include "hone/schedule/schedule.hpp"
#include "hone/train/accumulate.hpp"
#include "hone/core/roles.hpp"

HONE_NAMESPACE_BEGIN

/// What one step did.
struct step_report {
  float loss = 0.0f;        // accumulation-weighted loss of the micro-batches
  double grad_norm = 0.0;   // L2 norm of the unscaled, accumulated gradient (inf/NaN if it was)
  float lr = 0.0f;          // learning rate used (or that would have been used, if skipped)
  float loss_scale = 1.0f;  // scale the micro-batches ran with
  bool skipped = false;     // true when an inf/NaN gradient skipped the update
  std::uint64_t step = 0;   // applied updates after this step
};

/// Role checkpoint, the default: no checkpoints. A checkpoint policy names an `engine` type built
/// from the policy; the trainer calls engine.before_step(trainer) at the start of every step (an
/// async writer's background error surfaces there) and engine.after_step(trainer, report) after
/// it. hone::checkpoint::every_n_steps (hone/checkpoint/policy.hpp) is the ready-made one.
struct no_checkpoint {
  using role = roles::checkpoint;
  struct engine {
    explicit engine(const no_checkpoint& /*policy*/) {}
    template <class Trainer>
    void before_step(Trainer& /*t*/) {}
    template <class Trainer>
    void after_step(Trainer& /*t*/, const step_report& /*r*/) {}
  };
};

template <class Model, class... Policies>
class trainer;

/// Role offload, the default: the optimizer runs where the model's parameters live. The other
/// policy of this role is hone::offload::optimizer_to_host (hone/offload/optimizer_to_host.hpp).
struct no_offload {
  using role = roles::offload;
};

namespace detail {
/// The policy used for a role the user left out.
template <class T>
T default_policy() {
  if constexpr (std::is_same_v<T, constant_lr>) {
    return constant_lr{.base_lr = 1e-3};  // PyTorch's AdamW default learning rate
  } else {
    return T{};
  }
}
/// The object of type T in the tuple, or the default policy T.
template <class T, class... Policies>
T policy_object(const std::tuple<Policies...>& ps) {
  if constexpr ((std::is_same_v<T, Policies> || ...)) {
    return std::get<T>(ps);
  } else {
    return default_policy<T>();
  }
}

template <class View>
inline constexpr bool is_device_view_v = false;
template <class T>
inline constexpr bool is_device_view_v<device_span<T>> = true;

/// The memory space of a model's parameters: hone::cuda_space when its parameter views are
/// hone::device_span (hone::parameter<T, hone::cuda_space>), hone::host_space otherwise.
template <class Model>
using model_space_t = std::conditional_t<
    is_device_view_v<std::remove_cvref_t<
        decltype(std::declval<std::ranges::range_value_t<parameter_range_t<Model>>&>().value)>>,
    cuda_space, host_space>;

/// dst = src, element-wise (working weights into the model's own tensors).
struct copy_element {
  template <class T>
  HONE_HOST_DEVICE void operator()(T& dst, const T& src) const {
    dst = src;
  }
};

/// Placeholder member for a piece a configuration does not have (no offload engine, or no local
/// optimizer state because the offload engine owns it).
struct absent_member {
  template <class... A>
  explicit absent_member(A&&... /*unused*/) {}
};

/// The role types of a trainer and every compile-time check on them, shared by the host and the
/// CUDA trainers.
template <class Model, class... Policies>
struct trainer_types {
  static_assert(check_model<Model>());
  static_assert(check_policies_have_roles<Policies...>());

  using precision_type = pick_for<composers::trainer, roles::precision, fp32, Policies...>;
  using accumulation_type = pick_for<composers::trainer, roles::accumulation, accumulate::none, Policies...>;
  using optimizer_type = pick_for<composers::trainer, roles::optimizer, adamw, Policies...>;
  using clipping_type = pick_for<composers::trainer, roles::clipping, no_clipping, Policies...>;
  using schedule_type = pick_for<composers::trainer, roles::schedule, constant_lr, Policies...>;
  using checkpoint_type = pick_for<composers::trainer, roles::checkpoint, no_checkpoint, Policies...>;
  using offload_type = pick_for<composers::trainer, roles::offload, no_offload, Policies...>;

  static_assert(precision_policy<precision_type>,
                "hone::trainer: the precision policy must be hone::fp32, hone::bf16_mixed or "
                "hone::fp16_mixed<Scaler> (or provide working_type, scaler_config and scaler).");
  static_assert(optimizer_policy<optimizer_type>,
                "hone::trainer: the optimizer policy must name its state type (template <class "
                "Space> using state = ...) constructible from (policy, arena_layout), like "
                "hone::adamw and hone::sgd.");
  static_assert(check_schedule<schedule_type>());
  static_assert(std::is_same_v<clipping_type, no_clipping> ||
                    std::is_same_v<clipping_type, clip_grad_norm> ||
                    std::is_same_v<clipping_type, clip_grad_value>,
                "hone::trainer: the clipping policy must be hone::no_clipping, "
                "hone::clip_grad_norm or hone::clip_grad_value.");

  /// Whether the optimizer step runs through hone::offload::engine (role offload).
  static constexpr bool offloaded = !std::is_same_v<offload_type, no_offload>;
  static_assert(!offloaded || std::is_same_v<offload_type, offload::optimizer_to_host>,
                "hone::trainer: the offload policy must be hone::offload::optimizer_to_host "
                "(or leave the offload role out to run the optimizer where the model lives).");
  static_assert(!offloaded || std::is_same_v<optimizer_type, adamw> ||
                    std::is_same_v<optimizer_type, sgd>,
                "hone::trainer: the offload role (hone::offload::optimizer_to_host) needs an "
                "element-wise optimizer: use hone::adamw or hone::sgd. Block-quantized states "
                "such as hone::adamw_8bit cannot be cut into buckets.");
  /// The offload configuration is valid (the engine type may be named).
  static constexpr bool offload_ok =
      offloaded && std::is_same_v<offload_type, offload::optimizer_to_host> &&
      (std::is_same_v<optimizer_type, adamw> || std::is_same_v<optimizer_type, sgd>);

  using working_type = typename precision_type::working_type;
  using scaler_type = typename scaler_for<typename precision_type::scaler_config>::type;
  using param_range = parameter_range_t<Model>;
  using model_element = std::remove_cv_t<std::remove_pointer_t<
      decltype(std::declval<std::ranges::range_value_t<param_range>&>().value.data())>>;
  static_assert(std::is_same_v<model_element, working_type>,
                "hone::trainer: the model's parameter views hold a different element type than "
                "the precision policy's working type (float for hone::fp32, hone::bfloat16 for "
                "hone::bf16_mixed, hone::half for hone::fp16_mixed). Make them agree.");

  /// Builds the fp32 arena layout of the model's parameters, checking each one.
  static arena_layout make_layout(Model& model) {
    arena_layout layout(sizeof(float));
    for (auto& p : model_traits<Model>::parameters(model)) {
      require(p.value.size() == p.grad.size(), "hone::trainer: parameter '" + std::string(p.name) +
                                                   "' has " + std::to_string(p.value.size()) +
                                                   " values but " + std::to_string(p.grad.size()) +
                                                   " gradients; they must match");
      require(!p.value.empty(), "hone::trainer: parameter '" + std::string(p.name) +
                                    "' is empty; leave it out of parameters()");
      layout.add(std::string(p.name), p.value.size());
    }
    require(layout.size() > 0,
            "hone::trainer: the model's parameters() is empty: nothing to train");
    return layout;
  }
};

/// The trainer's implementation for the memory space of the model's parameters. The host one is
/// below; the CUDA one is in hone/train/cuda/trainer.cuh (CUDA code lives in .cuh headers that
/// only .cu files include, so this header stays plain C++).
template <class Space, class Model, class... Policies>
class trainer_impl {
  static_assert(sizeof(Space) == 0,
                "hone::trainer: this model's parameters live in CUDA device memory "
                "(hone::device_span views): include hone/train/cuda/trainer.cuh from a .cu file "
                "to train a CUDA model.");
};

/// The host trainer (see the file comment).
template <class Model, class... Policies>
class trainer_impl<host_space, Model, Policies...> : public trainer_types<Model, Policies...> {
  using types = trainer_types<Model, Policies...>;

 public:
  using typename types::accumulation_type;
  using typename types::checkpoint_type;
  using typename types::clipping_type;
  using typename types::offload_type;
  using typename types::optimizer_type;
  using typename types::param_range;
  using typename types::precision_type;
  using typename types::scaler_type;
  using typename types::schedule_type;
  using typename types::working_type;
  using space_type = host_space;
  using state_type = optimizer_state_t<optimizer_type, host_space>;
  static constexpr bool offloaded = types::offloaded;
  /// The offload engine (host transport: the model's memory is the "device"), or a placeholder.
  using offload_engine_type = std::conditional_t<
      types::offload_ok,
      offload::engine<optimizer_type, float, working_type, offload::host_transport>, absent_member>;

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
        engine_(policy_object<offload_type>(policies_), optimizer_, layout_,
                offload::host_transport(/*log=*/false)),
        checkpoint_(policy_object<checkpoint_type>(policies_)) {
    schedule_.validate();
    if constexpr (requires { clipping_.check(); }) clipping_.check();
    bind();
  }

  trainer_impl(const trainer_impl&) = delete;
  trainer_impl& operator=(const trainer_impl&) = delete;

  /// Sets parameter groups (each with its own lr scale and weight decay), e.g.
  /// `t.set_param_groups(hone::make_param_groups(t.layout(), {{hone::is_no_decay_name, 1, 0}}))`.
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
    double sumsq = 0.0;
    double loss = 0.0;
    for (std::size_t i = 0; i < micro_batches.size(); ++i) {
      const float l = static_cast<float>(
          model_traits<Model>::forward_backward(*model_, micro_batches[i], r.loss_scale));
      loss += static_cast<double>(weights[i]) * static_cast<double>(l);
      sumsq = unscale_accumulate_into(grads_, weights[i] * inv_scale, i > 0);
    }
    r.loss = static_cast<float>(loss);
    r.grad_norm = std::sqrt(sumsq);
    const bool found_inf = !std::isfinite(sumsq);
    const bool apply = scaler_.update(found_inf);
    r.skipped = !apply;
    if (apply) {
      optimizer_step_args args{.step = step_ + 1, .lr = r.lr, .grad_scale = 1.0f, .momentum = {}};
      args.grad_scale = clip_coefficient(r.grad_norm);
      if constexpr (momentum_schedule_policy<schedule_type>) {
        if (const auto m = schedule_.momentum(step_)) args.momentum = static_cast<float>(*m);
      }
      if constexpr (offloaded) {
        // Immediate: the updated weights are in the model when this returns. Delayed: the
        // previous update is published and this one runs on the engine's thread.
        engine_.step(args, master_grad_.all().data(), device_params_, groups_);
        ++step_;
        copy_work_to_model();
      } else {
        state_.step(optimizer_, args, master_, master_grad_.all().data(), groups_);
        ++step_;
        publish_weights();
      }
    } else if constexpr (offloaded) {
      // Nothing new to overlap with: a pending delayed update is published now.
      if (engine_.pending()) {
        engine_.flush(device_params_);
        copy_work_to_model();
      }
    }
    r.step = step_;
    checkpoint_.after_step(self(), r);
    return r;
  }
  template <class Batch>
  step_report step(const Batch& batch) {
    return step(std::span<const Batch>(&batch, 1));
  }

  // ---- state, for checkpoints and inspection ----
  [[nodiscard]] std::uint64_t steps_done() const noexcept { return step_; }
  [[nodiscard]] const arena_layout& layout() const noexcept { return layout_; }
  /// fp32 master weights (the model's own weights when they are bound zero-copy; the offload
  /// engine's host copy with the offload role, after waiting for a pending delayed update).
  [[nodiscard]] std::span<float> master_weights() noexcept(!offloaded) {
    if constexpr (offloaded) engine_.wait();
    return {master_, layout_.total()};
  }
  [[nodiscard]] std::span<const float> master_gradients() const noexcept {
    return master_grad_.all();
  }
  /// The optimizer state (the offload engine's, after waiting for a pending delayed update).
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
  /// The checkpoint role's engine (e.g. to wait() for an async save before exiting).
  [[nodiscard]] typename checkpoint_type::engine& checkpointer() noexcept { return checkpoint_; }
  /// The offload role's engine (its policy, buckets and transport), with the offload role only.
  [[nodiscard]] offload_engine_type& offload_engine() noexcept requires offloaded {
    return engine_;
  }
  /// Whether the master weights alias the model's weights (fp32 bound zero-copy, no offload).
  [[nodiscard]] bool zero_copy() const noexcept { return zero_copy_; }
  /// Restores the step counter (a checkpoint's); the schedule continues from there.
  void set_steps_done(std::uint64_t s) noexcept { step_ = s; }
  /// Copies the model's current weights into the master weights (after the user changed them).
  void reload_weights_from_model() {
    if constexpr (offloaded) {
      engine_.wait();
      for_each(weights_in_, load_master<working_type>{});
      engine_.push_params(device_params_);  // drops a pending update: the model's weights win
      copy_work_to_model();
    } else {
      if (!zero_copy_) for_each(weights_in_, load_master<working_type>{});
    }
  }
  /// Casts the master weights into the model's working weights (after a restore).
  void publish_weights() {
    if constexpr (offloaded) {
      engine_.push_params(device_params_);
      copy_work_to_model();
    } else {
      if (!zero_copy_) for_each(weights_out_, cast_to_working<working_type>{});
    }
  }
  /// Delayed offload: waits for the pending update and publishes it into the model (before an
  /// evaluation, or at the end of training). Otherwise nothing to do.
  void flush() {
    if constexpr (offloaded) {
      engine_.flush(device_params_);
      copy_work_to_model();
    }
  }

 private:
  trainer<Model, Policies...>& self() noexcept {
    return static_cast<trainer<Model, Policies...>&>(*this);
  }

  void bind() {
    std::vector<std::pair<working_type*, working_type*>> views;  // (value, grad)
    for (auto& p : model_traits<Model>::parameters(*model_)) {
      views.emplace_back(p.value.data(), p.grad.data());
    }
    master_grad_ = arena<float>(layout_);
    // Working weights already laid out like the arena (the model binds arena views).
    bool contiguous = true;
    for (std::size_t i = 0; contiguous && i < views.size(); ++i) {
      contiguous = reinterpret_cast<std::uintptr_t>(views[i].first) ==
                   reinterpret_cast<std::uintptr_t>(views[0].first) +
                       layout_[i].offset * sizeof(working_type);
    }
    if constexpr (offloaded) {
      master_ = engine_.master().all().data();
      if (contiguous) {
        device_params_ = views[0].first;
      } else {
        work_ = arena<working_type>(layout_);
        device_params_ = work_.all().data();
      }
    } else if (contiguous && std::is_same_v<working_type, float>) {
      master_ = reinterpret_cast<float*>(views[0].first);
      zero_copy_ = true;
    } else {
      own_master_ = arena<float>(layout_);
      master_ = own_master_.all().data();
    }
    for (std::size_t i = 0; i < views.size(); ++i) {
      const auto n = layout_[i].count;
      float* m = master_ + layout_[i].offset;
      grads_.add(n, master_grad_.view(i).data(), views[i].second);
      if (!zero_copy_) weights_in_.add(n, m, views[i].first);
      if constexpr (offloaded) {
        if (!contiguous) work_out_.add(n, views[i].first, device_params_ + layout_[i].offset);
      } else {
        if (!zero_copy_) weights_out_.add(n, views[i].first, m);
      }
    }
    reload_weights_from_model();
  }

  /// Offload with a model whose tensors are not one arena: the engine's flat working weights
  /// into the model's tensors.
  void copy_work_to_model() {
    if (!work_out_.empty()) for_each(work_out_, copy_element{});
  }

  /// The clipping coefficient folded into the optimizer's gradient scale. L2 clipping reuses the
  /// norm of the unscale pass; other norms and clipping by value take one pass of their own.
  float clip_coefficient(double l2_norm) {
    if constexpr (std::is_same_v<clipping_type, no_clipping>) {
      (void)l2_norm;
      return 1.0f;
    } else if constexpr (std::is_same_v<clipping_type, clip_grad_norm>) {
      if (clipping_.norm_type == 2.0f)
        return clipping_.finish(static_cast<float>(l2_norm)).coefficient;
      return clipping_.clip(std::as_const(master_grad_)).coefficient;
    } else {
      (void)l2_norm;
      return clipping_.clip(master_grad_).coefficient;
    }
  }

  using local_state_type = std::conditional_t<offloaded, absent_member, state_type>;

  Model* model_;
  std::tuple<Policies...> policies_;
  precision_type precision_;
  accumulation_type accumulation_;
  optimizer_type optimizer_;
  clipping_type clipping_;
  schedule_type schedule_;
  scaler_type scaler_;
  arena_layout layout_;
  arena<float> own_master_;
  arena<float> master_grad_;
  float* master_ = nullptr;
  bool zero_copy_ = false;
  [[no_unique_address]] local_state_type state_;
  [[no_unique_address]] offload_engine_type engine_;
  arena<working_type> work_;               // offload: flat working weights (unless the model's are)
  working_type* device_params_ = nullptr;  // offload: the working weights the engine publishes to
  tensor_lists<float, const working_type> grads_;
  tensor_lists<float, const working_type> weights_in_;
  tensor_lists<working_type, const float> weights_out_;
  tensor_lists<working_type, const working_type> work_out_;
  std::vector<param_group> groups_;
  std::uint64_t step_ = 0;
  typename checkpoint_type::engine checkpoint_;
};
}  // namespace detail

/// The composed trainer: the implementation for the space of the model's parameters
/// (detail::trainer_impl<host_space, ...> here, <cuda_space, ...> in hone/train/cuda/trainer.cuh).
template <class Model, class... Policies>
class trainer : public detail::trainer_impl<detail::model_space_t<Model>, Model, Policies...> {
  using impl = detail::trainer_impl<detail::model_space_t<Model>, Model, Policies...>;

 public:
  explicit trainer(Model& model, Policies... policies) : impl(model, std::move(policies)...) {}
};

template <class Model, class... Policies>
trainer(Model&, Policies...) -> trainer<Model, Policies...>;

HONE_NAMESPACE_END
