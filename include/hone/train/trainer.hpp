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
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/arena.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/model.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/optim/adamw.hpp"
#include "hone/optim/clipping.hpp"
#include "hone/optim/optimizer.hpp"
#include "hone/precision/loss_scale.hpp"
#include "hone/precision/policies.hpp"
#include "hone/precision/unscale.hpp"
#include "hone/schedule/constant.hpp"
#include "hone/schedule/schedule.hpp"
#include "hone/train/accumulate.hpp"
#include "hone/train/roles.hpp"

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
}  // namespace detail

template <class Model, class... Policies>
class trainer {
  static_assert(check_model<Model>());
  static_assert(check_policies_have_roles<Policies...>());

 public:
  using precision_type = pick<roles::precision, fp32, Policies...>;
  using accumulation_type = pick<roles::accumulation, accumulate::none, Policies...>;
  using optimizer_type = pick<roles::optimizer, adamw, Policies...>;
  using clipping_type = pick<roles::clipping, no_clipping, Policies...>;
  using schedule_type = pick<roles::schedule, constant_lr, Policies...>;
  using checkpoint_type = pick<roles::checkpoint, no_checkpoint, Policies...>;
  static_assert(
      role_count_v<roles::offload, Policies...> == 0,
      "hone::trainer runs in host memory, so it has no offload role yet: use "
      "hone::offload::engine directly (docs/offload.md) until the device trainer exists.");

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

  using working_type = typename precision_type::working_type;
  using scaler_type = typename scaler_for<typename precision_type::scaler_config>::type;
  using state_type = optimizer_state_t<optimizer_type, host_space>;
  using param_range = parameter_range_t<Model>;
  using model_element = std::remove_cv_t<std::remove_pointer_t<
      decltype(std::declval<std::ranges::range_value_t<param_range>&>().value.data())>>;
  static_assert(std::is_same_v<model_element, working_type>,
                "hone::trainer: the model's parameter views hold a different element type than "
                "the precision policy's working type (float for hone::fp32, hone::bfloat16 for "
                "hone::bf16_mixed, hone::half for hone::fp16_mixed). Make them agree.");

  explicit trainer(Model& model, Policies... policies)
      : model_(&model),
        policies_(std::move(policies)...),
        precision_(detail::policy_object<precision_type>(policies_)),
        accumulation_(detail::policy_object<accumulation_type>(policies_)),
        optimizer_(detail::policy_object<optimizer_type>(policies_)),
        clipping_(detail::policy_object<clipping_type>(policies_)),
        schedule_(detail::policy_object<schedule_type>(policies_)),
        scaler_(precision_.scaler),
        layout_(make_layout(model)),
        state_(optimizer_, layout_),
        checkpoint_(detail::policy_object<checkpoint_type>(policies_)) {
    schedule_.validate();
    if constexpr (requires { clipping_.check(); }) clipping_.check();
    bind();
  }

  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  /// Sets parameter groups (each with its own lr scale and weight decay), e.g.
  /// `t.set_param_groups(hone::make_param_groups(t.layout(), {{hone::is_no_decay_name, 1, 0}}))`.
  void set_param_groups(std::vector<param_group> groups) { groups_ = std::move(groups); }

  /// One optimizer step over the micro-batches of one accumulated batch.
  template <class Batch>
  step_report step(std::span<const Batch> micro_batches) {
    static_assert(check_trainable<Model, Batch>());
    static_assert(accumulation_policy<accumulation_type, Batch>,
                  "hone::trainer: the accumulation policy cannot weight this batch type.");
    checkpoint_.before_step(*this);
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
      sumsq = unscale_pass(weights[i] * inv_scale, i > 0);
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
      state_.step(optimizer_, args, master_, master_grad_.all().data(), groups_);
      ++step_;
      publish_weights();
    }
    r.step = step_;
    checkpoint_.after_step(*this, r);
    return r;
  }
  template <class Batch>
  step_report step(const Batch& batch) {
    return step(std::span<const Batch>(&batch, 1));
  }

  // ---- state, for checkpoints and inspection ----
  [[nodiscard]] std::uint64_t steps_done() const noexcept { return step_; }
  [[nodiscard]] const arena_layout& layout() const noexcept { return layout_; }
  /// fp32 master weights (the model's own weights when they are bound zero-copy).
  [[nodiscard]] std::span<float> master_weights() noexcept { return {master_, layout_.total()}; }
  [[nodiscard]] std::span<const float> master_gradients() const noexcept {
    return master_grad_.all();
  }
  [[nodiscard]] state_type& optimizer_state() noexcept { return state_; }
  [[nodiscard]] const scaler_type& scaler() const noexcept { return scaler_; }
  [[nodiscard]] scaler_type& scaler() noexcept { return scaler_; }
  [[nodiscard]] const schedule_type& schedule() const noexcept { return schedule_; }
  /// The checkpoint role's engine (e.g. to wait() for an async save before exiting).
  [[nodiscard]] typename checkpoint_type::engine& checkpointer() noexcept { return checkpoint_; }
  /// Whether the master weights alias the model's weights (fp32 bound zero-copy).
  [[nodiscard]] bool zero_copy() const noexcept { return own_master_.all().empty(); }
  /// Restores the step counter (a checkpoint's); the schedule continues from there.
  void set_steps_done(std::uint64_t s) noexcept { step_ = s; }
  /// Copies the model's current weights into the master weights (after the user changed them).
  void reload_weights_from_model() {
    if (!zero_copy()) for_each(weights_in_, load_master<working_type>{});
  }
  /// Casts the master weights into the model's working weights (after a restore).
  void publish_weights() {
    if (!zero_copy()) for_each(weights_out_, cast_to_working<working_type>{});
  }

 private:
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

  void bind() {
    std::vector<std::pair<working_type*, working_type*>> views;  // (value, grad)
    for (auto& p : model_traits<Model>::parameters(*model_)) {
      views.emplace_back(p.value.data(), p.grad.data());
    }
    master_grad_ = arena<float>(layout_);
    // fp32 weights already laid out like the arena: use them in place.
    bool contiguous = std::is_same_v<working_type, float>;
    for (std::size_t i = 0; contiguous && i < views.size(); ++i) {
      contiguous = static_cast<const void*>(views[i].first) ==
                   static_cast<const void*>(views[0].first + layout_[i].offset);
    }
    if (contiguous) {
      master_ = reinterpret_cast<float*>(views[0].first);
    } else {
      own_master_ = arena<float>(layout_);
      master_ = own_master_.all().data();
    }
    for (std::size_t i = 0; i < views.size(); ++i) {
      const auto n = layout_[i].count;
      float* m = master_ + layout_[i].offset;
      grads_.add(n, master_grad_.view(i).data(), views[i].second);
      if (!contiguous) {
        weights_in_.add(n, m, views[i].first);
        weights_out_.add(n, views[i].first, m);
      }
    }
    reload_weights_from_model();
  }

  double unscale_pass(float factor, bool accumulate) {
    return unscale_accumulate_into(grads_, factor, accumulate);
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
  state_type state_;
  tensor_lists<float, const working_type> grads_;
  tensor_lists<float, const working_type> weights_in_;
  tensor_lists<working_type, const float> weights_out_;
  std::vector<param_group> groups_;
  std::uint64_t step_ = 0;
  typename checkpoint_type::engine checkpoint_;
};

template <class Model, class... Policies>
trainer(Model&, Policies...) -> trainer<Model, Policies...>;

HONE_NAMESPACE_END
