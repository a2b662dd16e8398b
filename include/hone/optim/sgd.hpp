// hone/optim/sgd.hpp: stochastic gradient descent with momentum, dampening, Nesterov and (L2,
// coupled) weight decay, PyTorch semantics (torch.optim.SGD). Per element, with
// g = grad * grad_scale, mu = momentum, lr = the group's learning rate:
//   d = g + weight_decay * p
//   if mu != 0:  b = (first step) ? d : mu * b + (1 - dampening) * d
//                d = nesterov ? d + mu * b : b
//   p = p - lr * d
// A step whose momentum is 0 (a schedule may set it) leaves the buffer untouched, as PyTorch.
// "First step" is optimizer_step_args::step == 1: PyTorch initializes the momentum buffer with the
// first gradient (no dampening). Defaults are PyTorch's (plain SGD).
//
// State: "momentum_buffer" (fp32, the master layout) when momentum != 0, else nothing.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "hone/core/arena.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/core/roles.hpp"
#include "hone/core/space.hpp"
#include "hone/optim/detail/simd.hpp"
#include "hone/optim/optimizer.hpp"

HONE_NAMESPACE_BEGIN

template <class Space>
class sgd_state;

/// SGD hyperparameters (PyTorch defaults).
struct sgd {
  using role = roles::optimizer;
  template <class Space = host_space>
  using state = sgd_state<Space>;

  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  float weight_decay = 0.0f;
};

namespace detail {
inline void check_sgd(float momentum, float dampening, bool nesterov, float weight_decay) {
  HONE_REQUIRE(finite_nonnegative(momentum),
               "hone::sgd: momentum must be finite and >= 0, got " + std::to_string(momentum));
  HONE_REQUIRE(std::isfinite(dampening),
               "hone::sgd: dampening must be finite, got " + std::to_string(dampening));
  HONE_REQUIRE(
      finite_nonnegative(weight_decay),
      "hone::sgd: weight_decay must be finite and >= 0, got " + std::to_string(weight_decay));
  HONE_REQUIRE(
      !nesterov || (momentum > 0.0f && dampening == 0.0f),
      "hone::sgd: Nesterov momentum requires momentum > 0 and dampening = 0 (as in PyTorch)");
}
}  // namespace detail

/// Element functor of plain SGD (no momentum) over (master, grad).
template <class G = float>
struct sgd_functor {
  float lr;
  float weight_decay;
  float grad_scale;

  template <class T>
  HONE_HOST_DEVICE_FORCEINLINE void apply(T& p, const T& g) const {
    const T d = g * T(grad_scale) + T(weight_decay) * p;
    p = p - T(lr) * d;
  }
  /// One element: the same math on detail::sfloat (products never fused; see simd.hpp).
  HONE_HOST_DEVICE void operator()(float& p, const G& g) const {
    detail::sfloat sp(p);
    apply(sp, detail::sfloat(detail::grad_to_float(g)));
    p = sp.v;
  }
  HONE_HOST_DEVICE void scale_grads(float s) { grad_scale *= s; }
};

/// Element functor of SGD with momentum over (master, grad, momentum_buffer). The first step,
/// Nesterov and dampening are coefficients, so the loop has no branches:
///   b = keep * b + take * d;   d = nesterov_grad * d + nesterov_buf * b
template <class G = float>
struct sgd_momentum_functor {
  float lr;
  float weight_decay;
  float grad_scale;
  float keep;           // 0 on the first step, else momentum
  float take;           // 1 on the first step, else 1 - dampening
  float nesterov_grad;  // 1 with Nesterov, else 0
  float nesterov_buf;   // momentum with Nesterov, else 1

  template <class T>
  HONE_HOST_DEVICE_FORCEINLINE void apply(T& p, const T& g, T& b) const {
    T d = g * T(grad_scale) + T(weight_decay) * p;
    b = T(keep) * b + T(take) * d;
    d = T(nesterov_grad) * d + T(nesterov_buf) * b;
    p = p - T(lr) * d;
  }
  /// One element: the same math on detail::sfloat (products never fused; see simd.hpp).
  HONE_HOST_DEVICE void operator()(float& p, const G& g, float& b) const {
    detail::sfloat sp(p), sb(b);
    apply(sp, detail::sfloat(detail::grad_to_float(g)), sb);
    p = sp.v;
    b = sb.v;
  }
  HONE_HOST_DEVICE void scale_grads(float s) { grad_scale *= s; }
};

/// SGD state: the momentum buffer (only when the policy has momentum != 0).
template <class Space = host_space>
class sgd_state {
 public:
  using space_type = Space;

  sgd_state(const sgd& policy, const arena_layout& layout)
      : layout_(validated(policy, layout)),
        has_momentum_(policy.momentum != 0.0f),
        momentum_buffer_(has_momentum_ ? arena<float, Space>(layout) : arena<float, Space>()) {}

  [[nodiscard]] const arena_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] bool has_momentum() const noexcept { return has_momentum_; }
  /// The momentum buffer; throws config_error when the policy had no momentum.
  [[nodiscard]] arena<float, Space>& momentum_buffer() {
    require_momentum();
    return momentum_buffer_;
  }
  [[nodiscard]] const arena<float, Space>& momentum_buffer() const {
    require_momentum();
    return momentum_buffer_;
  }

  /// Calls f(name, arena) for every state arena ("momentum_buffer" when there is momentum).
  template <class F>
  void for_each_tensor(F&& f) {
    if (has_momentum_) f(std::string_view("momentum_buffer"), momentum_buffer_);
  }
  template <class F>
  void for_each_tensor(F&& f) const {
    if (has_momentum_) f(std::string_view("momentum_buffer"), momentum_buffer_);
  }
  [[nodiscard]] std::size_t bytes() const noexcept {
    return has_momentum_ ? momentum_buffer_.all().size_bytes() : 0;
  }

  /// One SGD step on the host (see adamw_state::step for the arguments).
  template <class G>
  void step(
      const sgd& policy, const optimizer_step_args& args, float* master, const G* grad,
      const std::vector<param_group>& groups = {}) requires(space_traits<Space>::host_accessible) {
    for_each_group(policy, args, master, grad, groups,
                   [](const auto& lists, const auto& op) { detail::simd_for_each(lists, op); });
  }

  /// Validates, resolves the groups and calls run(lists, functor) once per group. `grad` is a
  /// `const G*` arena laid out like the state or a hone::slot_gradients<G>.
  template <class Grad, class Run>
  void for_each_group(const sgd& policy, const optimizer_step_args& args, float* master, Grad grad,
                      const std::vector<param_group>& groups, Run&& run) {
    using source = detail::gradient_source<Grad>;
    using G = detail::gradient_element_t<Grad>;
    detail::check_step_args(args, "hone::sgd");
    const float mu = detail::step_momentum(args, policy.momentum);
    detail::check_sgd(mu, policy.dampening, policy.nesterov, policy.weight_decay);
    HONE_REQUIRE(
        mu == 0.0f || has_momentum_,
        "hone::sgd: this step has momentum " + std::to_string(mu) +
            " but the state was built from a policy without momentum (no buffer); build it "
            "from a policy with momentum != 0");
    HONE_REQUIRE(master != nullptr && source::present(grad),
                 "hone::sgd::step: master and grad must point to arenas laid out like the state");
    const bool first = args.step == 1;
    for (const auto& grp :
         detail::resolve_groups(layout_, groups, args.lr, policy.weight_decay, "hone::sgd")) {
      if (has_momentum_ && mu != 0.0f) {
        float* b = momentum_buffer_.all().data();
        tensor_lists<float, const G, float> lists;
        for (std::size_t s : grp.slots) {
          const auto& sl = layout_[s];
          lists.add(sl.count, master + sl.offset, source::slot(grad, s, sl.offset), b + sl.offset);
        }
        const sgd_momentum_functor<G> op{grp.lr,
                                         grp.weight_decay,
                                         args.grad_scale,
                                         first ? 0.0f : mu,
                                         first ? 1.0f : 1.0f - policy.dampening,
                                         policy.nesterov ? 1.0f : 0.0f,
                                         policy.nesterov ? mu : 1.0f};
        run(lists, op);
      } else {
        tensor_lists<float, const G> lists;
        for (std::size_t s : grp.slots) {
          const auto& sl = layout_[s];
          lists.add(sl.count, master + sl.offset, source::slot(grad, s, sl.offset));
        }
        run(lists, sgd_functor<G>{grp.lr, grp.weight_decay, args.grad_scale});
      }
    }
  }

 private:
  static const arena_layout& validated(const sgd& policy, const arena_layout& layout) {
    detail::check_sgd(policy.momentum, policy.dampening, policy.nesterov, policy.weight_decay);
    return layout;
  }
  void require_momentum() const {
    HONE_REQUIRE(
        has_momentum_,
        "hone::sgd: there is no momentum buffer because the policy has momentum 0; build the "
        "state from a policy with momentum != 0");
  }

  arena_layout layout_;
  bool has_momentum_;
  arena<float, Space> momentum_buffer_;
};

HONE_NAMESPACE_END
