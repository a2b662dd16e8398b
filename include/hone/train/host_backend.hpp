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
// The direct route, for a step of one micro-batch whose gradients stay local (no gradient
// reduction, no offload role), with AdamW or SGD and no clipping or L2 clipping: the unscale pass
// only reads the model's gradients (their sum of squares, the same bits as above), and the
// optimizer reads them again with the loss scale's inverse folded into its gradient scale
// (hone::slot_gradients: the model's own tensors) and writes the model's working weights in the
// same pass. No fp32 master gradients are written: fp16/bf16 30 bytes per parameter instead of
// 40, fp32 32 instead of 36 (docs/train.md). master_gradients() computes them when asked.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/core/parallel.hpp"
#include "hone/core/space.hpp"
#include "hone/offload/transport.hpp"
#include "hone/optim/clipping.hpp"
#include "hone/optim/optimizer.hpp"
#include "hone/optim/sgd.hpp"
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

/// An optimizer's element functor that also writes the working copy of the updated master
/// weight: the lists are (working, master, grad, state...), the wrapped functor sees (master,
/// grad, state...). What apex's fused Adam does with its fp16 output.
template <class F, class W>
struct with_working_copy {
  F f;
  template <class... Rest>
  HONE_HOST_DEVICE_FORCEINLINE void operator()(W& working, float& master, Rest&... rest) const {
    f(master, rest...);
    working = static_cast<W>(master);
  }
  /// The vector form: the register is stored as W, rounded as static_cast<W> rounds.
  template <class V, class... Rest>
  HONE_HOST_DEVICE_FORCEINLINE void apply(V& working, V& master, Rest&... rest) const {
    f.apply(master, rest...);
    working = master;
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

  /// Nothing to refuse for a host model (hone::zero clips by any norm: sharded_norm).
  template <class Parts>
  void check(const Parts& /*p*/) const {}

  template <class Parts>
  void begin_step(Parts& p, std::size_t micro_batches) {
    sum_sq_ = 0.0;
    scatters_ = 0;
    direct_ = allow_direct_ && micro_batches == 1 && direct_route(p);
  }

  /// A step without micro-batches (a rank that joined, hone::zero with uneven_inputs): zero<1>'s
  /// master gradients become zeros before they are reduced (zero<2>'s reduce-scatters of zeros
  /// are added by reduce_gradients).
  template <class Parts>
  void zero_gradients(Parts& p) {
    if constexpr (Types::zero_stage == 1) {
      const std::span<float> g = p.master_grad.all();
      std::fill(g.begin(), g.end(), 0.0f);
    }
  }

  template <class Parts>
  void accumulate(Parts& p, float factor, bool accumulate) {
    if constexpr (Types::zero_stage == 2) {
      // Each micro-batch's unscaled gradients are reduce-scattered into this rank's shard.
      ++scatters_;
      p.reduction.scatter(
          p.size(), std::span<float>(p.master_grad_data(), p.master_grad.all().size()),
          [&](std::size_t start, std::span<float> dst) {
            unscale_range(p.layout, p.model_grads, start, dst, factor);
          },
          accumulate);
    } else {
      accumulate_local(p, factor, accumulate);
    }
  }

  template <class Parts>
  void accumulate_local(Parts& p, float factor, bool accumulate) {
    if (direct_) {
      sum_sq_ = unscaled_sum_of_squares(p.grads, factor);
      factor_ = factor;
      master_grads_pending_ = true;
      return;
    }
    master_grads_pending_ = false;
    sum_sq_ = unscale_accumulate_into(p.grads, factor, accumulate);
  }

  /// Overlap with backward: one parameter's gradients (slot `slot` of the layout) unscaled and
  /// accumulated into the master gradients as accumulate() would (the same element operations).
  template <class Parts>
  void accumulate_slot(Parts& p, std::size_t slot, float factor, bool accumulate) {
    master_grads_pending_ = false;
    tensor_lists<float, const working_type> one;
    one.add(p.grads.numel(slot), p.grads.template pointer<0>(slot),
            p.grads.template pointer<1>(slot));
    (void)unscale_accumulate_into(one, factor, accumulate);
  }

  /// After a direct-route step: the master gradients from the model's (trainer::master_gradients).
  template <class Parts>
  void materialize_master_gradients(const Parts& p) const {
    if (!master_grads_pending_) return;
    (void)unscale_accumulate_into(p.grads, factor_, false);
    master_grads_pending_ = false;
  }

  /// Whether the last step took the direct route.
  [[nodiscard]] bool direct() const noexcept { return direct_; }
  /// Allows (the default) or forbids the direct route; forbidden, every step writes the master
  /// gradients (4 + 4 bytes per parameter more).
  void set_direct_route(bool allowed) noexcept { allow_direct_ = allowed; }

  /// The gradient reduction role, then the sum of squares of the reduced gradients.
  template <class Parts>
  void reduce_gradients(Parts& p) {
    if constexpr (Types::sharded) {
      // hone::zero: this rank's shard of the reduced gradients, and the global sum of squares.
      float* g = p.master_grad_data();
      if constexpr (Types::zero_stage == 1) p.reduction.reduce(std::span<float>(g, p.size()));
      if constexpr (Types::zero_stage == 2) {
        // uneven_inputs: as many reduce-scatters as the rank with the most micro-batches, this
        // rank's missing ones with zeros (a joined rank: all of them)
        for (std::size_t k = scatters_; k < p.reduction.micro_batches(); ++k) {
          p.reduction.scatter(
              p.size(), std::span<float>(g, p.master_grad.all().size()),
              [](std::size_t, std::span<float> dst) { std::fill(dst.begin(), dst.end(), 0.0f); },
              /*accumulate=*/k > 0);
        }
      }
      const std::span<const float> mine = shard_gradients(p);
      const double local = mine.empty()
                               ? 0.0
                               : hone::transform_reduce(mine.size(), 0.0, square_in_double{},
                                                        hone::plus{}, mine.data());
      sum_sq_ = p.reduction.global_sum(local);
    } else {
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
    if constexpr (Types::sharded) {
      // hone::zero: this rank's shard of the master weights with its shard of the state, then
      // every rank's shard all-gathered into the full master weights.
      // With sharded master weights (p.master is the shard) the shards are gathered straight
      // into the model's working weights; after the weight constraint when there is one (the
      // trainer gathers then, so the constraint's changes to the shard travel in the same
      // gather).
      const auto sh = p.reduction.shard(p.size());
      if (p.state.layout().size() > 0) {
        const float* g = p.master_grad_data() + (Types::zero_stage == 1 ? sh.offset : 0);
        p.state.step(p.optimizer, args, p.master + (p.master_sharded ? 0 : sh.offset), g,
                     p.state_groups);
      }
      if (!(Types::constrained && p.master_sharded)) publish_weights(p);
      return;
    }
    if constexpr (direct_capable) {
      if (direct_) {
        optimizer_step_args a = args;
        a.grad_scale = factor_ * args.grad_scale;
        direct_step(p, a);
        return;
      }
    }
    p.state.step(p.optimizer, args, p.master, p.master_grad_data(), p.groups);
    if (!p.zero_copy) hone::for_each(p.weights_out, cast_to_working<working_type>{});
  }

  /// Nothing runs asynchronously on the host.
  void synchronize() noexcept {}

  /// The master weights cast into the model's working weights; with hone::zero every rank's
  /// shard all-gathered first (collective): into the full master weights, or with sharded master
  /// weights straight into the working weights, window by window.
  template <class Parts>
  void publish_weights(Parts& p) {
    if constexpr (Types::sharded) {
      if (p.master_sharded) {
        p.reduction.gather_into(
            p.size(), std::span<const float>(p.master, p.own_master.all().size()),
            [&](std::size_t start, std::span<const float> v) { cast_range(p, start, v); });
        return;
      }
      p.reduction.gather(std::span<float>(p.master, p.size()));
    }
    if (!p.zero_copy) hone::for_each(p.weights_out, cast_to_working<working_type>{});
  }

  /// The model's working weights of arena elements [start, start + v.size()) <- v (the padding
  /// between tensors skipped).
  template <class Parts>
  static void cast_range(Parts& p, std::size_t start, std::span<const float> v) {
    tensor_lists<working_type, const float> pieces;
    for_pieces(p.layout, start, v.size(), [&](std::size_t slot, std::size_t a, std::size_t n) {
      pieces.add(n, p.model_values[slot] + (a - p.layout[slot].offset), v.data() + (a - start));
    });
    if (!pieces.empty()) hone::for_each(pieces, cast_to_working<working_type>{});
  }

 private:
  using load_master_functor = hone::load_master<working_type>;
  using optimizer_type = typename Types::optimizer_type;
  using clipping_type = typename Types::clipping_type;

  /// What the direct route needs of the policies (the norm type of clip_grad_norm is checked per
  /// step): an element-wise optimizer, L2 clipping or none, local gradients, no offload role.
  static constexpr bool elementwise_optimizer = Types::elementwise_optimizer;
  static constexpr bool norm_or_no_clipping =
      std::is_same_v<clipping_type, no_clipping> || std::is_same_v<clipping_type, clip_grad_norm>;
  static constexpr bool direct_capable =
      !Types::reduces && !Types::offloaded && elementwise_optimizer && norm_or_no_clipping;

  template <class Parts>
  static bool direct_route(const Parts& p) noexcept {
    if constexpr (!direct_capable) {
      (void)p;
      return false;
    } else {
      if constexpr (std::is_same_v<clipping_type, clip_grad_norm>) {
        if (p.clipping.norm_type != 2.0f) return false;  // needs the master gradients
      }
      return true;
    }
  }

  /// The optimizer's pass on the model's gradients (per-slot pointers, p.model_grads); with
  /// working weights that are not the master weights, a working-weights column goes first in the
  /// lists and is written from the updated master weights in the same pass (each row's slot
  /// found from its master pointer's offset).
  template <class Parts>
  void direct_step(Parts& p, const optimizer_step_args& a) {
    const slot_gradients<working_type> grads{p.model_grads.data()};
    if (p.zero_copy) {
      p.state.for_each_group(
          p.optimizer, a, p.master, grads, p.groups,
          [](const auto& lists, const auto& op) { detail::simd_for_each(lists, op); });
      return;
    }
    const float* const master = p.master;
    p.state.for_each_group(
        p.optimizer, a, p.master, grads, p.groups, [&](const auto& lists, const auto& op) {
          using op_type = std::remove_cvref_t<decltype(op)>;
          auto out = with_working_column<working_type>(lists);
          for (std::size_t t = 0; t < lists.size(); ++t) {
            const auto offset = static_cast<std::size_t>(lists.template pointer<0>(t) - master);
            add_row(out, lists, t, p.weights_out.template pointer<0>(slot_at(p.layout, offset)),
                    std::make_index_sequence<std::remove_cvref_t<decltype(lists)>::depth>{});
          }
          detail::simd_for_each(out, with_working_copy<op_type, working_type>{op});
        });
  }
  /// The slot that starts at `offset` (the slots are in increasing offset order).
  static std::size_t slot_at(const arena_layout& layout, std::size_t offset) {
    const auto& slots = layout.slots();
    const auto it = std::lower_bound(
        slots.begin(), slots.end(), offset,
        [](const arena_layout::slot& sl, std::size_t off) { return sl.offset < off; });
    return static_cast<std::size_t>(it - slots.begin());
  }
  template <class W, class... Ts>
  static tensor_lists<W, Ts...> with_working_column(const tensor_lists<Ts...>& /*lists*/) {
    return {};
  }
  template <class W, class... Ts, std::size_t... K>
  static void add_row(tensor_lists<W, Ts...>& out, const tensor_lists<Ts...>& lists, std::size_t t,
                      W* working, std::index_sequence<K...>) {
    out.add(lists.numel(t), working, lists.template pointer<K>(t)...);
  }

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
      if constexpr (Types::sharded) return p.clipping.finish(sharded_norm(p)).coefficient;
      return p.clipping.clip(std::as_const(p.master_grad)).coefficient;
    } else {
      (void)l2_norm;
      return p.clipping.clip(p.master_grad).coefficient;
    }
  }

  /// hone::zero: this rank's shard of the reduced master gradients (zero<1>: its range of the
  /// whole arena; zero<2>: the shard arena, whose padding is zeros).
  template <class Parts>
  static std::span<const float> shard_gradients(Parts& p) {
    const float* g = p.master_grad_data();
    if constexpr (Types::zero_stage == 1) {
      const auto sh = p.reduction.shard(p.size());
      return {g + sh.offset, sh.count};
    } else {
      return {g, p.master_grad.all().size()};
    }
  }

  /// hone::zero with clip_grad_norm of an order other than 2: the global norm of the sharded
  /// gradients, as one process computes it over the whole arena. Each rank reduces its shard
  /// (clip_grad_norm::norm_partial: the largest |g|, or the sum of |g|^p in double) and one
  /// all_gather of a double per rank combines them (maximum, or sum in rank order): the same bits
  /// on every rank, so every rank clips alike. Collective: every rank calls it in the same
  /// applied steps.
  template <class Parts>
  static float sharded_norm(Parts& p) {
    const std::span<const float> mine = shard_gradients(p);
    const bool maximum = p.clipping.norm_combines_by_max();
    const double total = p.reduction.combine_over_ranks(
        p.clipping.norm_partial(mine.data(), mine.size()), maximum,
        maximum ? "the all_gather of the gradients' largest magnitudes (clip_grad_norm of order "
                  "infinity)"
                : "the all_gather of the gradients' sums of |g|^p (clip_grad_norm of order p)");
    return static_cast<float>(p.clipping.norm_from_partial(total));
  }

  /// hone::zero<2>: dst[k] = factor * (the model's gradient of arena element start + k), zeros
  /// in the padding between tensors; the tensors' pieces through unscale_accumulate_into (the
  /// same element operation as the local route's unscale).
  static void unscale_range(const arena_layout& layout, const std::vector<const working_type*>& g,
                            std::size_t start, std::span<float> dst, float factor) {
    std::fill(dst.begin(), dst.end(), 0.0f);
    tensor_lists<float, const working_type> pieces;
    for_pieces(layout, start, dst.size(), [&](std::size_t slot, std::size_t a, std::size_t n) {
      pieces.add(n, dst.data() + (a - start), g[slot] + (a - layout[slot].offset));
    });
    if (!pieces.empty()) (void)unscale_accumulate_into(pieces, factor, false);
  }

  /// f(slot, first arena element, count) for each tensor's piece of arena elements [start,
  /// start + n), in order.
  template <class F>
  static void for_pieces(const arena_layout& layout, std::size_t start, std::size_t n, F&& f) {
    const auto& slots = layout.slots();
    const std::size_t end = start + n;
    auto it = std::upper_bound(
        slots.begin(), slots.end(), start,
        [](std::size_t off, const arena_layout::slot& sl) { return off < sl.offset; });
    if (it != slots.begin()) --it;
    for (; it != slots.end() && it->offset < end; ++it) {
      const std::size_t a = std::max(start, it->offset);
      const std::size_t b = std::min(end, it->offset + it->count);
      if (a < b) f(static_cast<std::size_t>(it - slots.begin()), a, b - a);
    }
  }

  double sum_sq_ = 0.0;
  std::size_t scatters_ = 0;  // zero<2>: the micro-batches reduce-scattered this step
  float factor_ = 1.0f;       // the direct route's unscale factor (weight / loss scale)
  bool direct_ = false;
  bool allow_direct_ = true;
  mutable bool master_grads_pending_ = false;
};

template <class Types>
struct trainer_backend_for<host_space, Types> {
  using type = host_backend<Types>;
};

}  // namespace detail
HONE_NAMESPACE_END
