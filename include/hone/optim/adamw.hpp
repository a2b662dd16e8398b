// hone/optim/adamw.hpp: AdamW (decoupled weight decay, Loshchilov & Hutter), PyTorch semantics.
//
// Per element, with g = grad * grad_scale, t = step, lr = the group's learning rate:
//   p  = p * (1 - lr * weight_decay)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   v̂  = amsgrad ? (v_max = max(v_max, v)) : v
//   p  = p - lr / (1 - beta1^t) * m / (sqrt(v̂) / sqrt(1 - beta2^t) + eps)
// as torch.optim.AdamW (and its fused CUDA kernel). Defaults are PyTorch's.
//
// State: "exp_avg", "exp_avg_sq" (and "max_exp_avg_sq" with amsgrad), fp32 arenas with the master
// weights' layout. The gradient type is a template parameter of step (float, hone::bfloat16 or
// hone::half); the master weights are fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hone/core/arena.hpp"
#include "hone/core/bfloat16.hpp"
#include "hone/core/config.hpp"
#include "hone/core/detail/separate_compilation.hpp"
#include "hone/core/error.hpp"
#include "hone/core/half.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/core/roles.hpp"
#include "hone/core/space.hpp"
#include "hone/optim/detail/simd.hpp"
#include "hone/optim/optimizer.hpp"

HONE_NAMESPACE_BEGIN

template <class Space>
class adamw_state;

/// AdamW hyperparameters (PyTorch defaults).
struct adamw {
  using role = roles::optimizer;
  template <class Space = host_space>
  using state = adamw_state<Space>;

  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
  bool amsgrad = false;
};

namespace detail {
HONE_DETAIL_DECL void check_adam_hyperparameters(float beta1, float beta2, float eps,
                                                 float weight_decay, const char* who);
#if HONE_DETAIL_DEFINITIONS
HONE_DETAIL_DECL void check_adam_hyperparameters(float beta1, float beta2, float eps,
                                                 float weight_decay, const char* who) {
  HONE_REQUIRE(beta1 >= 0.0f && beta1 < 1.0f,
               std::string(who) + ": beta1 must be in [0, 1), got " + std::to_string(beta1));
  HONE_REQUIRE(beta2 >= 0.0f && beta2 < 1.0f,
               std::string(who) + ": beta2 must be in [0, 1), got " + std::to_string(beta2));
  HONE_REQUIRE(finite_nonnegative(eps),
               std::string(who) + ": eps must be finite and >= 0, got " + std::to_string(eps));
  HONE_REQUIRE(finite_nonnegative(weight_decay),
               std::string(who) + ": weight_decay must be finite and >= 0, got " +
                   std::to_string(weight_decay));
}
#endif
}  // namespace detail

/// The per-step constants of an AdamW update, computed once on the host.
struct adamw_coefficients {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float decay;         // 1 - lr * weight_decay
  float step_size;     // lr / (1 - beta1^t)
  float inv_bc2_sqrt;  // 1 / sqrt(1 - beta2^t)
  float grad_scale;

  /// The constants for hyperparameters (beta1, beta2, eps) at step `args`, group lr and decay.
  static adamw_coefficients make(float beta1, float beta2, float eps,
                                 const optimizer_step_args& args, float lr, float weight_decay) {
    const float b1 = detail::step_momentum(args, beta1);
    const double bc1 = detail::bias_correction(b1, args.step);
    const double bc2 = detail::bias_correction(beta2, args.step);
    return {b1,
            1.0f - b1,
            beta2,
            1.0f - beta2,
            eps,
            1.0f - lr * weight_decay,
            static_cast<float>(static_cast<double>(lr) / bc1),
            static_cast<float>(1.0 / std::sqrt(bc2)),
            args.grad_scale};
  }

  /// The update of one element (T = float) or one vector of elements (T = detail::vfloat).
  /// `g` is the raw gradient; the optimizer's grad_scale is applied here.
  template <class T>
  HONE_HOST_DEVICE_FORCEINLINE void update(T& p, const T& g, T& m, T& v) const {
    const T gs = g * T(grad_scale);
    p = p * T(decay);
    m = T(beta1) * m + T(one_minus_beta1) * gs;
    v = T(beta2) * v + T(one_minus_beta2) * gs * gs;
    const T denom = detail::optim_sqrt(v) * T(inv_bc2_sqrt) + T(eps);
    p = p - T(step_size) * m / denom;
  }
  template <class T>
  HONE_HOST_DEVICE_FORCEINLINE void update_amsgrad(T& p, const T& g, T& m, T& v, T& v_max) const {
    const T gs = g * T(grad_scale);
    p = p * T(decay);
    m = T(beta1) * m + T(one_minus_beta1) * gs;
    v = T(beta2) * v + T(one_minus_beta2) * gs * gs;
    v_max = detail::optim_max(v_max, v);
    const T denom = detail::optim_sqrt(v_max) * T(inv_bc2_sqrt) + T(eps);
    p = p - T(step_size) * m / denom;
  }
};

/// Element functor of AdamW over lists (master, grad, exp_avg, exp_avg_sq); G is the gradient type.
template <class G = float>
struct adamw_functor {
  adamw_coefficients c;

  template <class T>
  HONE_HOST_DEVICE_FORCEINLINE void apply(T& p, const T& g, T& m, T& v) const {
    c.update(p, g, m, v);
  }
  /// One element (the scalar and CUDA paths): the same math on detail::sfloat, whose products
  /// are never fused, so the bits match the vector path's.
  HONE_HOST_DEVICE void operator()(float& p, const G& g, float& m, float& v) const {
    detail::sfloat sp(p), sm(m), sv(v);
    c.update(sp, detail::sfloat(detail::grad_to_float(g)), sm, sv);
    p = sp.v;
    m = sm.v;
    v = sv.v;
  }
  /// Multiplies the gradient scale (the CUDA path folds a device-side clip coefficient in).
  HONE_HOST_DEVICE void scale_grads(float s) { c.grad_scale *= s; }
};

/// Element functor of AMSGrad AdamW over (master, grad, exp_avg, exp_avg_sq, max_exp_avg_sq).
template <class G = float>
struct adamw_amsgrad_functor {
  adamw_coefficients c;

  template <class T>
  HONE_HOST_DEVICE_FORCEINLINE void apply(T& p, const T& g, T& m, T& v, T& v_max) const {
    c.update_amsgrad(p, g, m, v, v_max);
  }
  HONE_HOST_DEVICE void operator()(float& p, const G& g, float& m, float& v, float& v_max) const {
    detail::sfloat sp(p), sm(m), sv(v), sx(v_max);
    c.update_amsgrad(sp, detail::sfloat(detail::grad_to_float(g)), sm, sv, sx);
    p = sp.v;
    m = sm.v;
    v = sv.v;
    v_max = sx.v;
  }
  HONE_HOST_DEVICE void scale_grads(float s) { c.grad_scale *= s; }
};

/// AdamW state: first and second moments (and the running maximum of the second with amsgrad),
/// fp32 arenas laid out like the master weights.
template <class Space = host_space>
class adamw_state {
 public:
  using space_type = Space;

  adamw_state(const adamw& policy, const arena_layout& layout)
      : layout_(validated(policy, layout)),
        amsgrad_(policy.amsgrad),
        exp_avg_(layout),
        exp_avg_sq_(layout),
        max_exp_avg_sq_(policy.amsgrad ? arena<float, Space>(layout) : arena<float, Space>()) {}

  [[nodiscard]] const arena_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] bool amsgrad() const noexcept { return amsgrad_; }

  [[nodiscard]] arena<float, Space>& exp_avg() noexcept { return exp_avg_; }
  [[nodiscard]] const arena<float, Space>& exp_avg() const noexcept { return exp_avg_; }
  [[nodiscard]] arena<float, Space>& exp_avg_sq() noexcept { return exp_avg_sq_; }
  [[nodiscard]] const arena<float, Space>& exp_avg_sq() const noexcept { return exp_avg_sq_; }
  /// Running maximum of exp_avg_sq; throws config_error unless the state was built with amsgrad.
  [[nodiscard]] arena<float, Space>& max_exp_avg_sq() {
    require_amsgrad();
    return max_exp_avg_sq_;
  }
  [[nodiscard]] const arena<float, Space>& max_exp_avg_sq() const {
    require_amsgrad();
    return max_exp_avg_sq_;
  }

  /// Calls f(name, arena) for every state arena ("exp_avg", "exp_avg_sq"[, "max_exp_avg_sq"]):
  /// what a checkpoint writes and reads.
  template <class F>
  void for_each_tensor(F&& f) {
    f(std::string_view("exp_avg"), exp_avg_);
    f(std::string_view("exp_avg_sq"), exp_avg_sq_);
    if (amsgrad_) f(std::string_view("max_exp_avg_sq"), max_exp_avg_sq_);
  }
  template <class F>
  void for_each_tensor(F&& f) const {
    f(std::string_view("exp_avg"), exp_avg_);
    f(std::string_view("exp_avg_sq"), exp_avg_sq_);
    if (amsgrad_) f(std::string_view("max_exp_avg_sq"), max_exp_avg_sq_);
  }

  /// Bytes of optimizer state held.
  [[nodiscard]] std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for_each_tensor([&](std::string_view, const auto& a) { n += a.all().size_bytes(); });
    return n;
  }

  /// One AdamW step on the host: master (fp32) and grad (G = float, bfloat16 or half) are the
  /// bases of arenas laid out like this state. One fused pass per parameter group.
  template <class G>
  void step(
      const adamw& policy, const optimizer_step_args& args, float* master, const G* grad,
      const std::vector<param_group>& groups = {}) requires(space_traits<Space>::host_accessible);

  /// The backend-independent part of a step: validates, resolves the groups, and calls
  /// run(lists, functor) once per group (the host loop or a CUDA launch). `grad` is a `const G*`
  /// arena laid out like the state or a hone::slot_gradients<G>.
  template <class Grad, class Run>
  void for_each_group(const adamw& policy, const optimizer_step_args& args, float* master,
                      Grad grad, const std::vector<param_group>& groups, Run&& run) {
    using source = detail::gradient_source<Grad>;
    using G = detail::gradient_element_t<Grad>;
    detail::check_step_args(args, "hone::adamw");
    detail::check_adam_hyperparameters(detail::step_momentum(args, policy.beta1), policy.beta2,
                                       policy.eps, policy.weight_decay, "hone::adamw");
    HONE_REQUIRE(
        policy.amsgrad == amsgrad_,
        "hone::adamw: the policy's amsgrad differs from the one this state was built with; "
        "build the state from the same policy");
    HONE_REQUIRE(master != nullptr && source::present(grad),
                 "hone::adamw::step: master and grad must point to arenas laid out like the state");
    float* m = exp_avg_.all().data();
    float* v = exp_avg_sq_.all().data();
    float* vmax = amsgrad_ ? max_exp_avg_sq_.all().data() : nullptr;
    for (const auto& grp :
         detail::resolve_groups(layout_, groups, args.lr, policy.weight_decay, "hone::adamw")) {
      const auto c = adamw_coefficients::make(policy.beta1, policy.beta2, policy.eps, args, grp.lr,
                                              grp.weight_decay);
      if (amsgrad_) {
        tensor_lists<float, const G, float, float, float> lists;
        for (std::size_t s : grp.slots) {
          const auto& sl = layout_[s];
          lists.add(sl.count, master + sl.offset, source::slot(grad, s, sl.offset), m + sl.offset,
                    v + sl.offset, vmax + sl.offset);
        }
        run(lists, adamw_amsgrad_functor<G>{c});
      } else {
        tensor_lists<float, const G, float, float> lists;
        for (std::size_t s : grp.slots) {
          const auto& sl = layout_[s];
          lists.add(sl.count, master + sl.offset, source::slot(grad, s, sl.offset), m + sl.offset,
                    v + sl.offset);
        }
        run(lists, adamw_functor<G>{c});
      }
    }
  }

 private:
  static const arena_layout& validated(const adamw& policy, const arena_layout& layout) {
    detail::check_adam_hyperparameters(policy.beta1, policy.beta2, policy.eps, policy.weight_decay,
                                       "hone::adamw");
    return layout;
  }
  void require_amsgrad() const {
    HONE_REQUIRE(
        amsgrad_,
        "hone::adamw: max_exp_avg_sq exists only with amsgrad = true; build the state from "
        "a policy with amsgrad enabled");
  }

  arena_layout layout_;
  bool amsgrad_;
  arena<float, Space> exp_avg_;
  arena<float, Space> exp_avg_sq_;
  arena<float, Space> max_exp_avg_sq_;
};

// Defined out of the class (a member template defined in the class would be inline, which an
// `extern template` declaration does not keep from being compiled in every file).
template <class Space>
template <class G>
void adamw_state<Space>::step(
    const adamw& policy, const optimizer_step_args& args, float* master, const G* grad,
    const std::vector<param_group>& groups) requires(space_traits<Space>::host_accessible) {
  for_each_group(policy, args, master, grad, groups,
                 [](const auto& lists, const auto& op) { detail::simd_for_each(lists, op); });
}

#if HONE_DETAIL_EXTERN_TEMPLATES
// Separate compilation (core/detail/separate_compilation.hpp): the host steps are compiled once,
// in hone::compiled (src/optim.cpp).
extern template void adamw_state<host_space>::step<float>(const adamw&, const optimizer_step_args&,
                                                          float*, const float*,
                                                          const std::vector<param_group>&);
extern template void adamw_state<host_space>::step<bfloat16>(const adamw&,
                                                             const optimizer_step_args&, float*,
                                                             const bfloat16*,
                                                             const std::vector<param_group>&);
extern template void adamw_state<host_space>::step<half>(const adamw&, const optimizer_step_args&,
                                                         float*, const half*,
                                                         const std::vector<param_group>&);
#endif

HONE_NAMESPACE_END
