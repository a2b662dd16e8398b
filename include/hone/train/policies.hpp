// hone/train/policies.hpp: what a training step reports, and the default policies of the
// trainer's roles that have no module of their own: checkpoint, offload, gradient reduction, step
// observer and early stopping, and the role tag of early stopping (the other defaults are
// hone::fp32, hone::accumulate::none, hone::adamw, hone::no_clipping and hone::constant_lr, each in
// its module).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "hone/core/config.hpp"
#include "hone/core/roles.hpp"

HONE_NAMESPACE_BEGIN

/// The phases of one step, as a step observer sees them.
enum class step_phase : std::uint8_t {
  checkpoint,        ///< the checkpoint role's before_step / after_step (a save's stall)
  forward_backward,  ///< the model's forward_backward of one micro-batch
  unscale,           ///< unscaling and accumulating one micro-batch's gradients (+ norm, inf)
  reduce,            ///< the gradient reduction role (with the norm recomputed after it)
  check,             ///< the scaler's decision and the clipping coefficient
  optimizer,         ///< the update and the cast back into the working weights
};

/// The name of a phase ("forward_backward", ...).
constexpr const char* to_string(step_phase p) noexcept {
  switch (p) {
    case step_phase::checkpoint:
      return "checkpoint";
    case step_phase::forward_backward:
      return "forward_backward";
    case step_phase::unscale:
      return "unscale";
    case step_phase::reduce:
      return "reduce";
    case step_phase::check:
      return "check";
    case step_phase::optimizer:
      return "optimizer";
  }
  return "unknown";
}

/// The number of step phases.
inline constexpr std::size_t step_phase_count = 6;

/// What one step did.
struct step_report {
  float loss = 0.0f;        // accumulation-weighted loss of the micro-batches
  double grad_norm = 0.0;   // L2 norm of the unscaled, accumulated gradient (inf/NaN if it was)
  float lr = 0.0f;          // learning rate used (or that would have been used, if skipped)
  float loss_scale = 1.0f;  // scale the micro-batches ran with
  bool skipped = false;     // true when an inf/NaN gradient skipped the update
  std::uint64_t step = 0;   // applied updates after this step
  /// Nanoseconds of each phase of this step (indexed by step_phase; a phase that runs once per
  /// micro-batch is summed) and of the whole step, when the step observer keeps them
  /// (hone::profile::phase_timer: its last_step_ns); 0 without such an observer. Filled after
  /// the checkpoint role's after_step, so the report that role receives has them at 0.
  std::array<double, step_phase_count> phase_ns{};
  double step_ns = 0.0;
  /// phase_ns of one phase.
  [[nodiscard]] constexpr double ns(step_phase p) const noexcept {
    return phase_ns[static_cast<std::size_t>(p)];
  }
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

/// Whether checkpoint policy P's checkpoints carry the early-stopping role's state (its counters,
/// best value, stop decision and best weights), so that a resumed run continues them. A
/// checkpoint policy says so with `static constexpr bool carries_early_stopping = true;`, which
/// is true when its engine saves through hone::checkpoint::capture and its checkpoints are
/// restored through hone::checkpoint::restore: both carry that state by themselves
/// (hone::checkpoint::every_n_steps does). no_checkpoint saves nothing, so it loses nothing.
template <class P>
inline constexpr bool checkpoint_carries_early_stopping_v = requires {
  requires static_cast<bool>(P::carries_early_stopping);
};
template <>
inline constexpr bool checkpoint_carries_early_stopping_v<no_checkpoint> = true;

/// Role offload, the default: the optimizer runs where the model's parameters live. The other
/// policy of this role is hone::offload::optimizer_to_host (hone/offload/optimizer_to_host.hpp).
struct no_offload {
  using role = roles::offload;
};

/// Role gradient reduction, the default: the accumulated gradients are this process's own.
///
/// A reduction policy combines the fp32 master gradients of several processes after the last
/// micro-batch and before the inf/NaN check, clipping and the update (a data-parallel all-reduce).
/// It has a member function for the space of the model's parameters:
///   host models:  void reduce(std::span<float> master_gradients);
///   CUDA models:  void reduce(hone::device_span<float> master_gradients, cudaStream_t stream);
/// (stream-ordered on the trainer's stream). The gradients are one flat arena in the layout's
/// order, so a policy reduces slices of it in place, with no fusion copy. After it, the trainer
/// recomputes the norm and the inf/NaN check from the reduced gradients.
struct local_gradients {
  using role = roles::gradient_reduction;
};

/// Role early stopping, the default: no metric is monitored. The other policy of this role is
/// hone::early_stopping_policy (hone/train/early_stopping.hpp).
struct no_early_stopping {
  using role = roles::early_stopping;
};

/// Role weight constraint, the default: the weights stay as the update made them.
///
/// A constraint policy has `template <class Trainer> void after_update(Trainer& t)`; the trainer
/// calls it after every applied update (not after a skipped step), once steps_done() counts that
/// update, inside the optimizer phase. It changes the fp32 master weights (t.master_weights()) and,
/// when they are not the model's own (t.zero_copy() false), publishes them (t.publish_weights()).
/// It may also have `template <class Trainer> void attach(Trainer& t)`, which the trainer calls
/// once when it is built (its memory bound), e.g. to refuse a trainer it cannot serve before any
/// step. hone::compress::magnitude_pruning (hone/compress/prune.hpp) is one.
struct no_weight_constraint {
  using role = roles::weight_constraint;
};

/// Several weight constraints in one role: after every applied update each part's after_update
/// runs, in the order given, each seeing what the previous one left. For example magnitude pruning
/// then quantization-aware training (a sparse model trained at its int8 point):
///
///   hone::trainer t(net, hone::adamw{},
///                   hone::weight_constraints(hone::compress::magnitude_pruning({...}),
///                                            hone::compress::fake_quant_training{}));
///   t.weight_constraint().get<0>().masks();   // or hone::constraint_of<magnitude_pruning>(...)
template <class... Parts>
class weight_constraints {
  static_assert(sizeof...(Parts) >= 1,
                "hone::weight_constraints: give it at least one weight constraint policy.");
  static_assert((std::is_same_v<typename Parts::role, roles::weight_constraint> && ...),
                "hone::weight_constraints: every part must be a weight constraint policy (a type "
                "with `using role = hone::roles::weight_constraint;` and "
                "`template <class Trainer> void after_update(Trainer&)`).");

 public:
  using role = roles::weight_constraint;

  explicit weight_constraints(Parts... parts) : parts_(std::move(parts)...) {}

  template <class Trainer>
  void after_update(Trainer& t) {
    std::apply([&](auto&... part) { (part.after_update(t), ...); }, parts_);
  }
  /// Each part's attach (those that have one), in order, when the trainer is built.
  template <class Trainer>
  void attach(Trainer& t) {
    std::apply(
        [&](auto&... part) {
          (
              [&] {
                if constexpr (requires { part.attach(t); }) part.attach(t);
              }(),
              ...);
        },
        parts_);
  }

  /// The I-th part, or the part of type P.
  template <std::size_t I>
  [[nodiscard]] auto& get() noexcept {
    return std::get<I>(parts_);
  }
  template <class P>
  [[nodiscard]] P& get() noexcept {
    return std::get<P>(parts_);
  }

 private:
  std::tuple<Parts...> parts_;
};

namespace detail {
template <class P, class C>
struct holds_constraint : std::is_same<P, C> {};
template <class P, class... Parts>
struct holds_constraint<P, weight_constraints<Parts...>>
    : std::bool_constant<(std::is_same_v<P, Parts> || ...)> {};
}  // namespace detail

/// The constraint policy of type P in a trainer's weight constraint role: the role's policy
/// itself, or its part of that type when the role holds hone::weight_constraints.
template <class P, class C>
[[nodiscard]] P& constraint_of(C& role_policy) noexcept {
  static_assert(detail::holds_constraint<P, C>::value,
                "hone::constraint_of: the trainer's weight constraint role holds no policy of this "
                "type; pass it to the trainer (alone or inside hone::weight_constraints).");
  if constexpr (std::is_same_v<P, C>) {
    return role_policy;
  } else {
    return role_policy.template get<P>();
  }
}

/// Role step observer, the default: nobody is told, and the calls compile to nothing.
///
/// An observer policy has `void phase_begin(hone::step_phase)` and
/// `void phase_end(hone::step_phase)`; the trainer calls them around each phase of each step, in
/// order, on the thread that calls step() (phase_end also when the phase throws). With a CUDA
/// model the phases are host-side: the device work of a phase is enqueued, not finished, when
/// phase_end is called (except `check`, which waits for the step's one copy back).
struct no_step_observer {
  using role = roles::step_observer;
};

HONE_NAMESPACE_END
