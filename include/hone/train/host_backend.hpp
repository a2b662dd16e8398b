// hone/train/host_backend.hpp: the host backend of hone::trainer (a model whose parameters are
// host memory). The step skeleton is hone/train/trainer.hpp; this file supplies what is
// host-specific:
//  - each micro-batch's gradients are unscaled (times the accumulation weight) and accumulated
//    into the fp32 master gradients in one fused pass that also sums the squares of the result in
//    double. A non-finite sum means an inf/NaN gradient: doubles cannot overflow on squares of
//    floats, so the sum is non-finite exactly when some gradient was;
//  - the clipping coefficient comes from that sum (no extra pass for L2 clipping);
//  - the loss scaler decides on the host; an applied step runs one fused optimizer pass per
//    parameter group (the clip coefficient folded into its gradient scale), then casts the master
//    weights into the working weights (nothing to cast when the model's fp32 weights ARE the
//    master weights).
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include "hone/core/config.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/core/parallel.hpp"
#include "hone/core/space.hpp"
#include "hone/offload/transport.hpp"
#include "hone/optim/clipping.hpp"
#include "hone/optim/optimizer.hpp"
#include "hone/precision/unscale.hpp"
#include "hone/train/detail/trainer_parts.hpp"

HONE_NAMESPACE_BEGIN
namespace detail {

/// What the scaler's decision and the clipping leave for the skeleton.
struct step_check {
  double grad_norm = 0.0;  // L2 norm of the (reduced) master gradients
  bool skipped = false;    // an inf/NaN gradient: no update
};

/// Squares summed in double (the norm check after a gradient reduction).
struct square_in_double {
  HONE_HOST_DEVICE double operator()(const float& g) const {
    return static_cast<double>(g) * static_cast<double>(g);
  }
};

/// hone::trainer's backend for host models (see the file comment).
template <class Types>
class host_backend : public backend_types<Types, host_space, offload::host_transport> {
  using base = backend_types<Types, host_space, offload::host_transport>;

 public:
  using typename base::transport_type;
  using typename base::working_type;

  template <class Model>
  explicit host_backend(Model& /*model*/) {}

  /// The offload engine's transport: the model's memory is the engine's "device".
  [[nodiscard]] static transport_type transport() { return transport_type(/*log=*/false); }

  /// Element-wise pass over tensor lists (oneTBB).
  template <class... Ts, class F>
  void for_each(const tensor_lists<Ts...>& lists, const F& f) {
    hone::for_each(lists, f);
  }

  /// master[i] = float(working[i]) for the offload engine's host master weights.
  void load_master(float* master, const working_type* working, std::size_t n) {
    tensor_lists<float, const working_type> l;
    l.add(n, master, working);
    hone::for_each(l, load_master_functor{});
  }

  template <class Parts>
  void check(const Parts& /*p*/) const noexcept {}

  template <class Parts>
  void begin_step(Parts& /*p*/) noexcept {
    sum_sq_ = 0.0;
  }

  template <class Parts>
  void accumulate(Parts& p, float factor, bool accumulate) {
    sum_sq_ = unscale_accumulate_into(p.grads, factor, accumulate);
  }

  /// The gradient reduction role, then the sum of squares of the reduced gradients.
  template <class Parts>
  void reduce_gradients(Parts& p) {
    using reduction = typename Types::reduction_type;
    static_assert(
        requires(reduction & r, std::span<float> g) { r.reduce(g); },
        "hone::trainer: the gradient reduction policy has no member function "
        "reduce(std::span<float> master_gradients) for a host model.");
    float* g = p.master_grad_data();
    p.reduction.reduce(std::span<float>(g, p.size()));
    sum_sq_ = hone::transform_reduce(p.size(), 0.0, square_in_double{}, hone::plus{},
                                     static_cast<const float*>(g));
  }

  /// The scaler's decision; for an applied step the clipping coefficient goes into
  /// args.grad_scale.
  template <class Parts>
  step_check finish(Parts& p, optimizer_step_args& args) {
    step_check c;
    c.grad_norm = std::sqrt(sum_sq_);
    const bool found_inf = !std::isfinite(sum_sq_);
    c.skipped = !p.scaler.update(found_inf);
    if (!c.skipped) args.grad_scale = clip_coefficient(p, c.grad_norm);
    return c;
  }

  /// The update of an applied step (without the offload role): one fused pass per parameter
  /// group, then the working weights.
  template <class Parts>
  void apply_update(Parts& p, const optimizer_step_args& args) {
    p.state.step(p.optimizer, args, p.master, p.master_grad_data(), p.groups);
    if (!p.zero_copy) hone::for_each(p.weights_out, cast_to_working<working_type>{});
  }

  /// Nothing runs asynchronously on the host.
  void synchronize() noexcept {}

 private:
  using load_master_functor = hone::load_master<working_type>;

  /// The clipping coefficient folded into the optimizer's gradient scale. L2 clipping reuses the
  /// norm of the unscale pass; other norms and clipping by value take one pass of their own.
  template <class Parts>
  static float clip_coefficient(Parts& p, double l2_norm) {
    using clipping = typename Types::clipping_type;
    if constexpr (std::is_same_v<clipping, no_clipping>) {
      (void)l2_norm;
      (void)p;
      return 1.0f;
    } else if constexpr (std::is_same_v<clipping, clip_grad_norm>) {
      if (p.clipping.norm_type == 2.0f)
        return p.clipping.finish(static_cast<float>(l2_norm)).coefficient;
      return p.clipping.clip(std::as_const(p.master_grad)).coefficient;
    } else {
      (void)l2_norm;
      return p.clipping.clip(p.master_grad).coefficient;
    }
  }

  double sum_sq_ = 0.0;
};

template <class Types>
struct trainer_backend_for<host_space, Types> {
  using type = host_backend<Types>;
};

}  // namespace detail
HONE_NAMESPACE_END
