// hone/train/detail/trainer_parts.hpp: the pieces of hone::trainer that its one step skeleton
// (hone/train/trainer.hpp) and its backends (hone/train/host_backend.hpp,
// hone/train/cuda/trainer.cuh) share: the role types and their compile-time checks, the memory
// of a trainer in the space of its model (arenas, tensor lists, optimizer state), and the
// backend selector. Internal: users include hone/train/trainer.hpp.
#pragma once

#include <array>
#include <cstdint>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
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
#include "hone/core/roles.hpp"
#include "hone/core/space.hpp"
#include "hone/offload/optimizer_to_host.hpp"
#include "hone/optim/adamw.hpp"
#include "hone/optim/clipping.hpp"
#include "hone/optim/optimizer.hpp"
#include "hone/optim/param_group.hpp"
#include "hone/optim/sgd.hpp"
#include "hone/precision/loss_scale.hpp"
#include "hone/precision/policies.hpp"
#include "hone/schedule/constant.hpp"
#include "hone/schedule/schedule.hpp"
#include "hone/train/accumulate.hpp"
#include "hone/train/early_stopping.hpp"
#include "hone/train/policies.hpp"

HONE_NAMESPACE_BEGIN
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

/// The role types of a trainer and every compile-time check on them.
/// One of the model's parameters into the trainer's layout, after its checks (out of line: one
/// copy for every trainer).
inline void add_trainer_parameter(arena_layout& layout, std::string_view name, std::size_t values,
                                  std::size_t grads) {
  HONE_REQUIRE(values == grads, "hone::trainer: parameter '" + std::string(name) + "' has " +
                                    std::to_string(values) + " values but " +
                                    std::to_string(grads) + " gradients; they must match");
  HONE_REQUIRE(values > 0, "hone::trainer: parameter '" + std::string(name) +
                               "' is empty; leave it out of parameters()");
  layout.add(std::string(name), values);
}

/// Whether the model's tensors (the value pointers, views[i][0]) are one arena laid out like
/// `layout` (elements of `element_size` bytes at the layout's offsets); the trainer then binds the
/// model's weights zero-copy (out of line of the trainer: one copy for every precision).
inline bool views_laid_out(const std::vector<std::array<const void*, 2>>& views,
                           const arena_layout& layout, std::size_t element_size) {
  for (std::size_t i = 0; i < views.size(); ++i) {
    if (reinterpret_cast<std::uintptr_t>(views[i][0]) !=
        reinterpret_cast<std::uintptr_t>(views[0][0]) + layout[i].offset * element_size) {
      return false;
    }
  }
  return true;
}

template <class Model, class... Policies>
struct trainer_types {
  static_assert(check_model<Model>());
  static_assert(check_policies_have_roles<Policies...>());

  template <class Role, class Default>
  using pick_role = pick_for<composers::trainer, Role, Default, Policies...>;

  using model_type = Model;
  using precision_type = pick_role<roles::precision, fp32>;
  using accumulation_type = pick_role<roles::accumulation, accumulate::none>;
  using optimizer_type = pick_role<roles::optimizer, adamw>;
  using clipping_type = pick_role<roles::clipping, no_clipping>;
  using schedule_type = pick_role<roles::schedule, constant_lr>;
  using checkpoint_type = pick_role<roles::checkpoint, no_checkpoint>;
  using offload_type = pick_role<roles::offload, no_offload>;
  using reduction_type = pick_role<roles::gradient_reduction, local_gradients>;
  using observer_type = pick_role<roles::step_observer, no_step_observer>;
  using early_stopping_type = pick_role<roles::early_stopping, no_early_stopping>;
  using constraint_type = pick_role<roles::weight_constraint, no_weight_constraint>;

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

  /// Whether the optimizer updates each element from that element alone (hone::adamw, hone::sgd),
  /// so that its step may be cut anywhere: into the offload engine's buckets, or ZeRO's shards.
  static constexpr bool elementwise_optimizer =
      std::is_same_v<optimizer_type, adamw> || std::is_same_v<optimizer_type, sgd>;
  /// Whether the optimizer step runs through hone::offload::engine (role offload).
  static constexpr bool offloaded = !std::is_same_v<offload_type, no_offload>;
  static_assert(!offloaded || std::is_same_v<offload_type, offload::optimizer_to_host>,
                "hone::trainer: the offload policy must be hone::offload::optimizer_to_host "
                "(or leave the offload role out to run the optimizer where the model lives).");
  static_assert(!offloaded || elementwise_optimizer,
                "hone::trainer: the offload role (hone::offload::optimizer_to_host) needs an "
                "element-wise optimizer: use hone::adamw or hone::sgd. Block-quantized states "
                "such as hone::adamw_8bit cannot be cut into buckets.");
  /// The offload configuration is valid (the engine type may be named).
  static constexpr bool offload_ok = offloaded &&
                                     std::is_same_v<offload_type, offload::optimizer_to_host> &&
                                     elementwise_optimizer;

  /// Whether a gradient reduction policy combines the gradients of several processes.
  static constexpr bool reduces = !std::is_same_v<reduction_type, local_gradients>;
  /// The ZeRO stage of the gradient reduction policy (hone::zero<1> or <2>), 0 without sharding:
  /// the optimizer state (and with stage 2 the master gradients) cover this rank's shard only.
  static constexpr int zero_stage = [] {
    if constexpr (requires { reduction_type::zero_stage; }) {
      return static_cast<int>(reduction_type::zero_stage);
    } else {
      return 0;
    }
  }();
  static constexpr bool sharded = zero_stage > 0;
  static_assert(!sharded || !offloaded,
                "hone::trainer: hone::zero shards the optimizer state over the ranks, and the "
                "offload role (hone::offload::optimizer_to_host) moves it to host memory; the two "
                "do not combine yet. Use one of them.");
  static_assert(!sharded || elementwise_optimizer,
                "hone::trainer: hone::zero needs an element-wise optimizer (hone::adamw or "
                "hone::sgd): a shard cuts tensors, and block-quantized states such as "
                "hone::adamw_8bit would not compute what one process computes.");
  /// Whether a step observer is told about the phases of each step.
  static constexpr bool observed = !std::is_same_v<observer_type, no_step_observer>;
  static_assert(
      !observed ||
          requires(observer_type & o) {
            o.phase_begin(step_phase::check);
            o.phase_end(step_phase::check);
          },
      "hone::trainer: the step observer policy must have member functions "
      "phase_begin(hone::step_phase) and phase_end(hone::step_phase).");

  /// Whether a weight constraint runs after every applied update.
  static constexpr bool constrained = !std::is_same_v<constraint_type, no_weight_constraint>;

  /// Whether an early-stopping policy monitors a metric (its state travels in checkpoints).
  static constexpr bool stops_early = !std::is_same_v<early_stopping_type, no_early_stopping>;
  static_assert(!stops_early || std::is_same_v<early_stopping_type, early_stopping_policy>,
                "hone::trainer: the early-stopping policy must be hone::early_stopping_policy (or "
                "leave the early-stopping role out).");
  static_assert(!stops_early || checkpoint_carries_early_stopping_v<checkpoint_type>,
                "hone::trainer: the checkpoint policy does not carry the early-stopping role's "
                "state, so a resumed run would lose its counters and best weights. Save with "
                "hone::checkpoint::capture and restore with hone::checkpoint::restore (both carry "
                "it) and declare `static constexpr bool carries_early_stopping = true;` in the "
                "checkpoint policy, or use hone::checkpoint::every_n_steps.");

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
      add_trainer_parameter(layout, p.name, p.value.size(), p.grad.size());
    }
    HONE_REQUIRE(layout.size() > 0,
                 "hone::trainer: the model's parameters() is empty: nothing to train");
    return layout;
  }
};

/// Everything a trainer holds, in the memory space `Space` of its model: the policies, the step
/// counter and the parameter groups, the fp32 master weights and gradients, the optimizer state,
/// and the element-wise tensor lists between the model's tensors and the trainer's arenas. The
/// skeleton fills it once (bind) and hands it to its backend's hooks.
template <class Types, class Space, class... Policies>
struct trainer_parts {
  using model_type = typename Types::model_type;
  using working_type = typename Types::working_type;
  using optimizer_type = typename Types::optimizer_type;
  static constexpr bool offloaded = Types::offloaded;
  /// The optimizer state: in the model's space, or the offload engine's host arenas.
  using state_type =
      optimizer_state_t<optimizer_type, std::conditional_t<offloaded, host_space, Space>>;
  using local_state_type = std::conditional_t<offloaded, absent_member, state_type>;

  trainer_parts(model_type& m, Policies... ps)
      : model(&m),
        policies(std::move(ps)...),
        precision(policy_object<typename Types::precision_type>(policies)),
        accumulation(policy_object<typename Types::accumulation_type>(policies)),
        optimizer(policy_object<optimizer_type>(policies)),
        clipping(policy_object<typename Types::clipping_type>(policies)),
        schedule(policy_object<typename Types::schedule_type>(policies)),
        reduction(policy_object<typename Types::reduction_type>(policies)),
        observer(policy_object<typename Types::observer_type>(policies)),
        constraint(policy_object<typename Types::constraint_type>(policies)),
        scaler(precision.scaler),
        layout(Types::make_layout(m)),
        state(optimizer, optimizer_layout()) {
    static_assert(!Types::sharded || std::is_same_v<Space, host_space>,
                  "hone::trainer: hone::zero runs on host models only so far; for a CUDA model "
                  "use hone::nccl_data_parallel (hone/dist/nccl/data_parallel.hpp).");
  }

  /// The layout of the optimizer state: the parameters', or with hone::zero this rank's shard.
  [[nodiscard]] arena_layout optimizer_layout() const {
    if constexpr (Types::sharded) {
      return reduction.shard_layout(layout);
    } else {
      return layout;
    }
  }

  model_type* model;
  std::tuple<Policies...> policies;
  typename Types::precision_type precision;
  typename Types::accumulation_type accumulation;
  optimizer_type optimizer;
  typename Types::clipping_type clipping;
  typename Types::schedule_type schedule;
  [[no_unique_address]] typename Types::reduction_type reduction;
  [[no_unique_address]] typename Types::observer_type observer;
  [[no_unique_address]] typename Types::constraint_type constraint;
  typename Types::scaler_type scaler;
  arena_layout layout;
  arena<float, Space> own_master;  // the master weights, unless the model's or the engine's
  // the fp32 master gradients (one flat arena); mutable: after a direct-route step (host
  // backend) they are computed from the model's gradients when first asked for
  mutable arena<float, Space> master_grad;
  float* master = nullptr;  // the fp32 master weights (in Space; host with offload)
  bool zero_copy = false;   // master IS the model's fp32 weights (bound arena views)
  // hone::zero with zero_options::shard_master_weights: own_master holds this rank's shard only
  // (laid out as optimizer_layout()), and master points at its first element
  bool master_sharded = false;
  [[no_unique_address]] local_state_type state;
  arena<working_type, Space> work;        // offload: flat working weights (unless the model's)
  working_type* device_params = nullptr;  // offload: the working weights the engine publishes
  tensor_lists<float, const working_type> grads;            // master_grad <- model's gradients
  std::vector<const working_type*> model_grads;             // the model's gradients, per slot
  std::vector<working_type*> model_values;                  // the model's weights, per slot
  tensor_lists<float, const working_type> weights_in;       // master <- model's weights
  tensor_lists<working_type, const float> weights_out;      // model's weights <- master
  tensor_lists<working_type, const working_type> work_in;   // offload: work <- model's weights
  tensor_lists<working_type, const working_type> work_out;  // offload: model's weights <- work
  std::vector<param_group> groups;
  std::vector<param_group> state_groups;  // hone::zero: `groups` over this rank's shard
  std::uint64_t step = 0;                 // applied updates

  [[nodiscard]] float* master_grad_data() const noexcept { return master_grad.all().data(); }
  [[nodiscard]] std::size_t size() const noexcept { return layout.total(); }
};

/// The types every backend names: its space, the trainer's working type and the offload
/// engine's transport for that space.
template <class Types, class Space, class Transport>
struct backend_types {
  using space_type = Space;
  using working_type = typename Types::working_type;
  using transport_type = Transport;
};

/// Selects the backend of a trainer whose model lives in `Space` (member `type`): what differs
/// between the host and CUDA (binding the step's scratch, unscale/accumulate, the reduction hook,
/// the scaler's decision and clipping, the update, loading master weights, synchronizing).
/// hone::trainer's skeleton is written once over it. host_space: hone/train/host_backend.hpp;
/// cuda_space: hone/train/cuda/trainer.cuh (CUDA code lives in .cuh headers that only .cu files
/// include).
template <class Space, class Types>
struct trainer_backend_for {
  static_assert(sizeof(Space) == 0,
                "hone::trainer: this model's parameters live in CUDA device memory "
                "(hone::device_span views): include hone/train/cuda/trainer.cuh from a .cu file "
                "to train a CUDA model.");
};

}  // namespace detail
HONE_NAMESPACE_END
