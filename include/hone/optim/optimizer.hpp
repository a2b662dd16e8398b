// hone/optim/optimizer.hpp: what every optimizer policy shares: the per-step arguments, the state
// type alias, the optimizer_policy concept and the resolution of parameter groups.
//
// An optimizer policy is an aggregate of hyperparameters (`hone::adamw{.weight_decay = 0.1f}`)
// naming its role (`using role = hone::roles::optimizer;`) and its state type
// (`template <class Space> using state = ...;`). The state is built from the policy and the
// arena_layout of the fp32 master weights; its arenas use that same layout, so the state of slot i
// sits at slot i's offsets. One step is one fused pass per parameter group over
// (master, grad, state...) tensor lists:
//
//   hone::adamw opt{.weight_decay = 0.1f};
//   hone::optimizer_state_t<hone::adamw> state(opt, layout);
//   state.step(opt, {.step = t, .lr = lr, .grad_scale = unscale * clip}, master, grad, groups);
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "hone/core/arena.hpp"
#include "hone/core/config.hpp"
#include "hone/core/detail/separate_compilation.hpp"
#include "hone/core/error.hpp"
#include "hone/core/roles.hpp"
#include "hone/core/space.hpp"
#include "hone/optim/param_group.hpp"

HONE_NAMESPACE_BEGIN

/// The arguments of one optimizer step.
struct optimizer_step_args {
  /// 1-based count of applied updates, this one included (bias correction; SGD's first step).
  /// A skipped step (non-finite gradients) must not advance it.
  std::uint64_t step = 1;
  /// Learning rate of this step (from the schedule); each group multiplies it by its lr_scale.
  float lr = 0.0f;
  /// Multiplies every gradient before use: loss-scale unscaling times the clipping coefficient,
  /// folded into the update pass instead of separate passes over the gradients.
  float grad_scale = 1.0f;
  /// Schedule-driven momentum (SGD) / beta1 (Adam family), e.g. OneCycle's cycling; when unset
  /// the policy's value is used.
  std::optional<float> momentum = std::nullopt;
};

/// Where an element-wise optimizer's step (adamw, sgd: their for_each_group) finds the
/// gradients of slot s: `pointers[s]`, one pointer per slot of the state's layout, each to that
/// slot's `count` gradients. The other form is a `const G*` arena laid out like the state (slot s
/// at its offset). hone::trainer's direct route (hone/train/host_backend.hpp) passes the model's
/// own gradient tensors this way, wherever they live.
template <class G>
struct slot_gradients {
  const G* const* pointers;
};

namespace detail {
template <class Grad>
struct gradient_source;
template <class G>
struct gradient_source<G*> {
  using element = std::remove_const_t<G>;
  static const element* slot(G* base, std::size_t /*s*/, std::size_t offset) {
    return base + offset;
  }
  static bool present(G* base) { return base != nullptr; }
};
template <class G>
struct gradient_source<slot_gradients<G>> {
  using element = G;
  static const G* slot(slot_gradients<G> g, std::size_t s, std::size_t /*offset*/) {
    return g.pointers[s];
  }
  static bool present(slot_gradients<G> g) { return g.pointers != nullptr; }
};
/// The gradient element type of a gradient source (`const G*` or slot_gradients<G>).
template <class Grad>
using gradient_element_t = typename gradient_source<Grad>::element;
}  // namespace detail

/// The state type of optimizer policy P in memory space Space.
template <class P, class Space = host_space>
using optimizer_state_t = typename P::template state<Space>;

/// An optimizer policy: plays roles::optimizer and has a state built from (policy, layout).
template <class P>
concept optimizer_policy = plays_role_v<P, roles::optimizer> && requires {
  typename P::template state<host_space>;
} && std::constructible_from < optimizer_state_t<P>,
const P&, const arena_layout& > ;

namespace detail {

/// A parameter group with everything resolved: its slots, learning rate and weight decay.
struct resolved_group {
  std::vector<std::size_t> slots;
  float lr;
  float weight_decay;
};

inline bool finite_nonnegative(float x) {
  return std::isfinite(x) && x >= 0.0f;
}

/// Checks the step arguments; `who` names the optimizer in messages.
HONE_DETAIL_DECL void check_step_args(const optimizer_step_args& a, const char* who);

/// Resolves the user's groups against `layout`: each slot index must exist and belong to at most
/// one group; slots in no group form a last, default group (lr_scale 1, `default_decay`).
/// Empty groups are dropped.
HONE_DETAIL_DECL std::vector<resolved_group> resolve_groups(const arena_layout& layout,
                                                            const std::vector<param_group>& groups,
                                                            float lr, float default_decay,
                                                            const char* who);

// The definitions: inline in the header, or in hone::compiled with separate compilation.
#if HONE_DETAIL_DEFINITIONS
HONE_DETAIL_DECL void check_step_args(const optimizer_step_args& a, const char* who) {
  HONE_REQUIRE(a.step >= 1,
               std::string(who) +
                   ": optimizer_step_args::step is the 1-based count of applied updates "
                   "(this one included); it must be at least 1");
  HONE_REQUIRE(finite_nonnegative(a.lr),
               std::string(who) + ": the learning rate must be a finite number >= 0, got " +
                   std::to_string(a.lr));
  HONE_REQUIRE(std::isfinite(a.grad_scale) && a.grad_scale > 0.0f,
               std::string(who) + ": grad_scale must be finite and positive, got " +
                   std::to_string(a.grad_scale) +
                   "; a non-finite clipping norm or loss scale means the step must be skipped");
}

HONE_DETAIL_DECL std::vector<resolved_group> resolve_groups(const arena_layout& layout,
                                                            const std::vector<param_group>& groups,
                                                            float lr, float default_decay,
                                                            const char* who) {
  std::vector<unsigned char> taken(layout.size(), 0);
  std::vector<resolved_group> out;
  out.reserve(groups.size() + 1);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto& grp = groups[g];
    HONE_REQUIRE(finite_nonnegative(grp.lr_scale),
                 std::string(who) + ": param group " + std::to_string(g) + " has lr_scale " +
                     std::to_string(grp.lr_scale) + "; it must be finite and >= 0");
    const float decay = grp.weight_decay.value_or(default_decay);
    HONE_REQUIRE(finite_nonnegative(decay),
                 std::string(who) + ": param group " + std::to_string(g) + " has weight_decay " +
                     std::to_string(decay) + "; it must be finite and >= 0");
    resolved_group r{{}, lr * grp.lr_scale, decay};
    for (std::size_t s : grp.slots) {
      HONE_REQUIRE(s < layout.size(), std::string(who) + ": param group " + std::to_string(g) +
                                          " names slot " + std::to_string(s) +
                                          " but the layout has " + std::to_string(layout.size()) +
                                          " slots");
      HONE_REQUIRE(!taken[s], std::string(who) + ": slot " + std::to_string(s) + " ('" +
                                  layout[s].name +
                                  "') is in two param groups; every slot belongs to at most one");
      taken[s] = 1;
      if (layout[s].count != 0) r.slots.push_back(s);
    }
    if (!r.slots.empty()) out.push_back(std::move(r));
  }
  resolved_group rest{{}, lr, default_decay};
  for (std::size_t s = 0; s < layout.size(); ++s) {
    if (!taken[s] && layout[s].count != 0) rest.slots.push_back(s);
  }
  if (!rest.slots.empty()) out.push_back(std::move(rest));
  return out;
}

#endif

/// Bias correction 1 - beta^step, computed in double (as PyTorch computes it in Python).
inline double bias_correction(float beta, std::uint64_t step) {
  return 1.0 - std::pow(static_cast<double>(beta), static_cast<double>(step));
}

/// The momentum / beta1 of this step: the schedule's when given, else the policy's.
[[gnu::noinline]] inline float step_momentum(const optimizer_step_args& a, float policy_value) {
  return a.momentum.value_or(policy_value);
}

}  // namespace detail
HONE_NAMESPACE_END
