// hone/train/trainer.hpp: hone::trainer<Model, Policies...>, the composed training step.
//
//   hone::trainer t(model, hone::bf16_mixed{}, hone::accumulate::steps<4>{}, hone::adamw{},
//                   hone::clip_grad_norm{.max_norm = 1.0f}, hone::one_cycle{...});
//   hone::step_report r = t.step(std::span<const Batch>(micro_batches));
//
// Policies are picked by role, in any order; missing roles get defaults (fp32, accumulate::none,
// adamw, no clipping, constant_lr{1e-3}, no checkpoint, no offload, local gradients, no step
// observer, no early stopping); two policies of one role, or a type that is not a policy, stop
// compilation with a sentence. Every call on the hot path is resolved at compile time (no virtual
// calls).
//
// One step skeleton, written once here, over a backend chosen by the space of the model's
// parameter views (detail::trainer_backend_for): hone/train/host_backend.hpp for host memory,
// hone/train/cuda/trainer.cuh (included from a .cu file) for hone::device_span views.
//  1. the checkpoint role's before_step;
//  2. for each micro-batch: the model's forward_backward(batch, loss_scale) writes working
//     gradients; the backend unscales them (times the micro-batch's accumulation weight) and
//     accumulates them into the fp32 master gradients, with their sum of squares and inf/NaN
//     check in the same pass;
//  3. the gradient reduction role, when it is not hone::local_gradients (data parallel), then the
//     norm and check of the reduced gradients;
//  4. the backend's finish: the loss scaler decides (on overflow the step is skipped, and master
//     weights, optimizer moments, the step counter and the schedule position stay exactly as
//     they were) and the clipping coefficient is folded into the update's gradient scale;
//  5. the update: through the offload engine with the offload role, else the backend's fused
//     optimizer pass per parameter group and the cast back into the working weights. With fp32
//     weights laid out like the trainer's arena (the model binds its tensors to one contiguous
//     block: see bind_parameters), the master weights ARE the model's weights: no copies;
//  6. the checkpoint role's after_step.
// A step observer policy (role step_observer) is told when each phase begins and ends.
//
// Role offload: with hone::offload::optimizer_to_host, step 5 runs through hone::offload::engine
// (the backend's transport: host or CUDA): the fp32 master gradients stream to the engine in
// buckets, master weights and optimizer state live in the engine's host memory, the updated
// working weights stream back, immediately or one step delayed (docs/offload.md). Steps 1-4 are
// unchanged, so immediate mode is bit-identical to the trainer without the role.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/device_span.hpp"
#include "hone/core/error.hpp"
#include "hone/core/model.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/core/space.hpp"
#include "hone/offload/optimizer_to_host.hpp"
#include "hone/optim/optimizer.hpp"
#include "hone/precision/unscale.hpp"
#include "hone/train/detail/trainer_parts.hpp"
#include "hone/train/early_stopping.hpp"
#include "hone/train/host_backend.hpp"
#include "hone/train/policies.hpp"

HONE_NAMESPACE_BEGIN

/// The composed trainer (see the file comment).
template <class Model, class... Policies>
class trainer : public detail::trainer_types<Model, Policies...> {
  using types = detail::trainer_types<Model, Policies...>;

 public:
  using typename types::accumulation_type;
  using typename types::checkpoint_type;
  using typename types::clipping_type;
  using typename types::early_stopping_type;
  using typename types::observer_type;
  using typename types::offload_type;
  using typename types::optimizer_type;
  using typename types::param_range;
  using typename types::precision_type;
  using typename types::reduction_type;
  using typename types::scaler_type;
  using typename types::schedule_type;
  using typename types::working_type;
  /// The memory space of the model's parameters (host_space or cuda_space).
  using space_type = detail::model_space_t<Model>;
  /// The backend: detail::host_backend or detail::cuda_backend.
  using backend_type = typename detail::trainer_backend_for<space_type, types>::type;
  static constexpr bool offloaded = types::offloaded;
  /// Whether the early-stopping role monitors a metric (hone::early_stopping_policy).
  static constexpr bool stops_early = types::stops_early;

 private:
  using parts_type = detail::trainer_parts<types, space_type, Policies...>;

 public:
  /// The optimizer state: in the model's space, or with the offload role the engine's host arenas.
  using state_type = typename parts_type::state_type;
  /// The offload engine (the backend's transport), or a placeholder without the offload role.
  using offload_engine_type = std::conditional_t<
      types::offload_ok,
      offload::engine<optimizer_type, float, working_type, typename backend_type::transport_type>,
      detail::absent_member>;
  /// The early-stopping role's engine (monitor and best weights), or a placeholder without it.
  using early_stopper_type =
      std::conditional_t<stops_early, early_stopping_engine, detail::absent_member>;

  explicit trainer(Model& model, Policies... policies)
      : backend_(model),
        p_(model, std::move(policies)...),
        engine_(make_engine()),
        checkpoint_(detail::policy_object<checkpoint_type>(p_.policies)),
        stopper_(detail::policy_object<early_stopping_type>(p_.policies)) {
    p_.schedule.validate();
    if constexpr (requires { p_.clipping.check(); }) p_.clipping.check();
    backend_.check(p_);
    bind();
    if constexpr (stops_early) stopper_.bind(*this);
    if constexpr (requires { p_.constraint.attach(*this); }) p_.constraint.attach(*this);
  }

  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  /// Sets parameter groups (each with its own lr scale and weight decay), e.g.
  /// `t.set_param_groups(hone::make_param_groups(t.layout(), {{hone::is_no_decay_name, 1, 0}}))`.
  void set_param_groups(std::vector<param_group> groups) {
    // hone::zero: the optimizer state covers this rank's shard; so do the groups it steps.
    if constexpr (types::sharded) p_.state_groups = p_.reduction.shard_groups(p_.layout, groups);
    p_.groups = std::move(groups);
  }

  /// One optimizer step over the micro-batches of one accumulated batch.
  template <class Batch>
  step_report step(std::span<const Batch> micro_batches) {
    static_assert(check_trainable<Model, Batch>());
    static_assert(accumulation_policy<accumulation_type, Batch>,
                  "hone::trainer: the accumulation policy cannot weight this batch type.");
    static_assert(
        !types::constrained ||
            requires(typename types::constraint_type & c, trainer & t) { c.after_update(t); },
        "hone::trainer: the weight constraint policy must have a member function "
        "template <class Trainer> void after_update(Trainer& t), which the trainer "
        "calls after every applied update.");
    observe(step_phase::checkpoint, [&] { checkpoint_.before_step(*this); });
    const std::vector<float> weights = p_.accumulation.template weights<Batch>(micro_batches);
    // The gradients' weights: the accumulation's, or (a reduction weighting ranks by their sample
    // counts) each micro-batch's count over the count of every rank's batches.
    std::vector<float> grad_weights = weights;
    bool by_counts = false;
    double local = 0.0;  // this rank's samples, when the ranks are weighted by them
    if constexpr (requires { p_.reduction.count_share(1.0); }) {
      by_counts = p_.reduction.options().weight_by_count;
      if (by_counts) {
        if constexpr (std::is_same_v<accumulation_type, accumulate::by_count>) {
          for (const Batch& b : micro_batches) {
            local += static_cast<double>(batch_traits<Batch>::count(b));
          }
        } else {
          throw config_error(
              "hone::trainer: weight_by_count (of data_parallel_options or zero_options) weights "
              "the ranks by their sample counts, which needs hone::accumulate::by_count as the "
              "accumulation policy (it counts the samples of each micro-batch); add "
              "hone::accumulate::by_count{} to the trainer's policies or leave weight_by_count "
              "off");
        }
      }
    }
    if constexpr (types::sharded) {
      // hone::zero: the exchange that begins a step on every rank (a joined rank's in join_step)
      // when the ranks' micro-batch or sample counts must be known (uneven_inputs,
      // weight_by_count)
      observe(step_phase::reduce,
              [&] { (void)p_.reduction.begin_step(micro_batches.size(), local); });
    }
    if constexpr (requires { p_.reduction.count_share(1.0); }) {
      if (by_counts) {
        const double share =
            observe(step_phase::reduce, [&] { return p_.reduction.count_share(local); });
        for (float& w : grad_weights) w = static_cast<float>(static_cast<double>(w) * share);
      }
    }
    step_report r;
    optimizer_step_args args = begin_report(r);
    const float inv_scale = 1.0f / r.loss_scale;
    backend_.begin_step(p_, micro_batches.size());
    double loss = 0.0;
    for (std::size_t i = 0; i < micro_batches.size(); ++i) {
      if constexpr (overlaps<Batch>) {
        // The last micro-batch of a model that reports gradient readiness: the reduction starts
        // during its backward (data_parallel_options::overlap_with_backward).
        if (i + 1 == micro_batches.size() &&
            p_.reduction.begin_overlap(std::span<float>(p_.master_grad_data(), p_.size()),
                                       p_.layout)) {
          const float l = forward_backward_overlapped(micro_batches[i], r.loss_scale,
                                                      grad_weights[i] * inv_scale, i > 0);
          loss += static_cast<double>(weights[i]) * static_cast<double>(l);
          continue;
        }
      }
      const float l = observe(step_phase::forward_backward, [&] {
        return static_cast<float>(
            model_traits<Model>::forward_backward(*p_.model, micro_batches[i], r.loss_scale));
      });
      loss += static_cast<double>(weights[i]) * static_cast<double>(l);
      observe(step_phase::unscale,
              [&] { backend_.accumulate(p_, grad_weights[i] * inv_scale, /*accumulate=*/i > 0); });
    }
    r.loss = static_cast<float>(loss);
    return finish_step(r, args);
  }
  template <class Batch>
  step_report step(const Batch& batch) {
    return step(std::span<const Batch>(&batch, 1));
  }

  /// hone::dist::join's step for a rank with no batch left, with hone::zero and
  /// zero_options::uneven_inputs: every rank owns a shard of the optimizer state, so a joined
  /// rank keeps taking part in the other ranks' steps: the exchange that begins a step, the
  /// reduce-scatters with zero gradients, the norm, this rank's shard's update and the gather.
  /// Returns false, after the exchange only, once every rank has joined.
  bool join_step() requires(types::sharded) {
    // The exchange is not a phase: it precedes the step's first phase (the checkpoint role's
    // before_step, which a step observer takes as the start of a step), and the last one begins
    // no step at all.
    if (p_.reduction.begin_step(0, 0.0) == 0) return false;
    observe(step_phase::checkpoint, [&] { checkpoint_.before_step(*this); });
    step_report r;
    optimizer_step_args args = begin_report(r);
    backend_.begin_step(p_, 0);
    backend_.zero_gradients(p_);
    (void)finish_step(r, args);
    return true;
  }

  // ---- state, for checkpoints and inspection ----
  [[nodiscard]] std::uint64_t steps_done() const noexcept { return p_.step; }
  /// The model the trainer was built on.
  [[nodiscard]] Model& model() noexcept { return *p_.model; }
  [[nodiscard]] const arena_layout& layout() const noexcept { return p_.layout; }
  /// fp32 master weights: in the model's space (the model's own weights when they are bound
  /// zero-copy: std::span on the host, hone::device_span on CUDA), or with the offload role the
  /// engine's host copy (after waiting for a pending delayed update).
  /// With hone::zero and sharded master weights (zero_options::shard_master_weights; see
  /// master_weights_sharded()) they are this rank's shard: arena elements [shard offset, + size())
  /// (hone::dist::gather_master_weights gathers the whole).
  [[nodiscard]] auto master_weights() noexcept(!offloaded) {
    if constexpr (offloaded) {
      engine_.wait();
      return std::span<float>(engine_.master().all().data(), p_.size());
    } else if constexpr (std::is_same_v<space_type, host_space>) {
      if (p_.master_sharded) return std::span<float>(p_.master, p_.own_master.all().size());
      return std::span<float>(p_.master, p_.size());
    } else {
      return device_span<float>{p_.master, p_.size()};
    }
  }
  /// fp32 master gradients of the last step (in the model's space): the model's gradients times
  /// the accumulation weight over the loss scale, accumulated. After a step on the host backend's
  /// direct route (docs/train.md) they are computed from the model's gradients on the first call,
  /// which must therefore still hold that step's gradients.
  [[nodiscard]] auto master_gradients() const {
    backend_.materialize_master_gradients(p_);
    return std::as_const(p_.master_grad).all();
  }
  /// The optimizer state (the offload engine's, after waiting for a pending delayed update).
  [[nodiscard]] state_type& optimizer_state() noexcept(!offloaded) {
    if constexpr (offloaded) {
      engine_.wait();
      return engine_.state();
    } else {
      return p_.state;
    }
  }
  [[nodiscard]] const scaler_type& scaler() const noexcept { return p_.scaler; }
  [[nodiscard]] scaler_type& scaler() noexcept { return p_.scaler; }
  [[nodiscard]] const schedule_type& schedule() const noexcept { return p_.schedule; }
  /// The gradient reduction role's policy object (e.g. its communicator).
  [[nodiscard]] reduction_type& gradient_reduction() noexcept { return p_.reduction; }
  /// The step observer role's policy object (e.g. to read its timings).
  [[nodiscard]] observer_type& observer() noexcept { return p_.observer; }
  /// The weight constraint role's policy object (e.g. pruning masks).
  [[nodiscard]] auto& weight_constraint() noexcept { return p_.constraint; }
  /// The checkpoint role's engine (e.g. to wait() for an async save before exiting).
  [[nodiscard]] typename checkpoint_type::engine& checkpointer() noexcept { return checkpoint_; }
  /// Early stopping (with hone::early_stopping_policy): records one check of the monitored metric
  /// at step steps_done() and, on a new best, snapshots the master weights when the policy keeps
  /// them. Returns whether training should stop.
  bool observe_metric(double metric) requires stops_early {
    return stopper_.observe(*this, metric);
  }
  /// The early-stopping monitor (hone::early_stopping): best(), best_step(), wait_count(),
  /// should_stop(), message(), ...
  [[nodiscard]] const auto& early_stopping() const noexcept requires stops_early {
    return stopper_.monitor();
  }
  /// Copies the best check's weights back into the model (keep_best_weights only; collective
  /// with sharded master weights, whose best weights each rank keeps for its shard).
  void restore_best_weights() requires stops_early { stopper_.restore_best(*this); }
  /// The early-stopping role's engine: its monitor and best-weights keeper, which checkpoints
  /// save and restore.
  [[nodiscard]] early_stopper_type& early_stopper() noexcept requires stops_early {
    return stopper_;
  }
  /// The offload role's engine (its policy, buckets and transport), with the offload role only.
  [[nodiscard]] offload_engine_type& offload_engine() noexcept requires offloaded {
    return engine_;
  }
  /// The backend (CUDA: its stream through exec()).
  [[nodiscard]] backend_type& backend() noexcept { return backend_; }
  /// The CUDA stream every kernel of the step runs on (CUDA models only).
  [[nodiscard]] auto exec() const noexcept requires requires(const backend_type& b) { b.exec(); }
  { return backend_.exec(); }
  /// Whether the master weights alias the model's weights (fp32 bound zero-copy, no offload).
  [[nodiscard]] bool zero_copy() const noexcept { return p_.zero_copy; }
  /// Whether each rank holds only its shard of the master weights (hone::zero with
  /// zero_options::shard_master_weights, when they are not the model's own): master_weights() is
  /// the shard and publish_weights() is collective.
  [[nodiscard]] bool master_weights_sharded() const noexcept { return p_.master_sharded; }
  /// The arena element of master_weights()[0]: this rank's shard offset with sharded master
  /// weights, else 0.
  [[nodiscard]] std::size_t master_weights_offset() const noexcept {
    if constexpr (types::sharded) {
      if (p_.master_sharded) return p_.reduction.shard(p_.size()).offset;
    }
    return 0;
  }
  /// Copies the whole fp32 master weights (layout().total() floats, the padding included) into
  /// `whole`: with sharded master weights every rank's shard all-gathered (collective: every rank
  /// calls it), else a copy. Host master weights (a host model, or the offload role).
  void gather_master_weights(std::span<float> whole) {
    const auto mine = master_weights();
    static_assert(std::is_same_v<std::remove_cv_t<decltype(mine)>, std::span<float>>,
                  "hone::trainer::gather_master_weights: the trainer's master weights are not "
                  "host memory (a CUDA model); copy them from the device instead.");
    HONE_REQUIRE(whole.size() == p_.size(),
                 "hone::trainer::gather_master_weights: the output holds " +
                     std::to_string(whole.size()) + " floats, the trainer's arena " +
                     std::to_string(p_.size()) + " (layout().total(), the padding included)");
    if constexpr (types::sharded) {
      if (p_.master_sharded) {
        p_.reduction.gather(std::span<const float>(mine), whole);
        return;
      }
    }
    std::copy(mine.begin(), mine.end(), whole.begin());
  }
  /// Sets the master weights from `whole`, every rank's full fp32 weights in the arena's layout
  /// (layout().total() floats, the same on every rank), and casts them into the model's working
  /// weights. With sharded master weights this rank keeps its shard; not collective either way
  /// (checkpoint::restore's route). Host trainers without the offload role.
  void assign_weights(std::span<const float> whole) requires(
      !offloaded && std::is_same_v<space_type, host_space>) {
    HONE_REQUIRE(whole.size() == p_.size(),
                 "hone::trainer::assign_weights: " + std::to_string(whole.size()) +
                     " floats given, the trainer's arena holds " + std::to_string(p_.size()) +
                     " (layout().total(), the padding between tensors included)");
    const auto mine = master_weights();
    std::size_t lo = 0;
    if constexpr (types::sharded) {
      if (p_.master_sharded) lo = p_.reduction.shard(p_.size()).offset;
    }
    if (mine.data() != whole.data()) {
      std::copy_n(whole.begin() + static_cast<std::ptrdiff_t>(lo), mine.size(), mine.begin());
    }
    if (!p_.zero_copy) backend_.cast_range(p_, 0, whole);
  }
  /// Restores the step counter (a checkpoint's); the schedule continues from there.
  void set_steps_done(std::uint64_t s) noexcept { p_.step = s; }
  /// Copies the model's current weights into the master weights (after the user changed them;
  /// with the offload role through the engine's host copy, dropping a pending delayed update).
  void reload_weights_from_model() {
    if constexpr (offloaded) {
      engine_.wait();
      if (!p_.work_in.empty()) backend_.for_each(p_.work_in, detail::copy_element{});
      backend_.load_master(engine_.master().all().data(), p_.device_params, p_.size());
      engine_.push_params(p_.device_params);  // the model's weights win over a pending update
      copy_work_to_model();
    } else {
      if (!p_.zero_copy) backend_.for_each(p_.weights_in, load_master<working_type>{});
    }
  }
  /// Casts the master weights into the model's working weights (after a restore; stream-ordered
  /// on CUDA). With sharded master weights (master_weights_sharded()) every rank's shard is
  /// all-gathered into the model: collective, every rank calls it.
  void publish_weights() {
    if constexpr (offloaded) {
      engine_.push_params(p_.device_params);
      copy_work_to_model();
    } else {
      if constexpr (types::sharded) {
        if (p_.master_sharded) {
          published_ = true;
          return backend_.publish_weights(p_);
        }
      }
      if (!p_.zero_copy) backend_.for_each(p_.weights_out, cast_to_working<working_type>{});
    }
  }
  /// Casts `values` into the model's working weights in place of the master weights, which stay
  /// as they are: `values` is laid out as master_weights() (this rank's shard with sharded master
  /// weights, every rank's gathered into the model: collective; else the whole arena). The route
  /// of a weight constraint whose model weights are not the master weights (fake quantization).
  /// Host trainers whose working weights are a copy (not bound zero-copy), without the offload
  /// role.
  void publish_weights(std::span<const float> values) requires(
      !offloaded && std::is_same_v<space_type, host_space>) {
    constexpr const char* who = "hone::trainer::publish_weights(values)";
    HONE_REQUIRE(!p_.zero_copy, std::string(who) +
                                    ": the model's fp32 weights are the master weights (bound "
                                    "zero-copy), so there are no separate working weights to "
                                    "write; write the master weights instead.");
    const std::size_t mine = master_weights().size();
    HONE_REQUIRE(values.size() == mine,
                 std::string(who) + ": " + std::to_string(values.size()) +
                     " values given; they are laid out as master_weights(), which holds " +
                     std::to_string(mine) + " floats on this rank.");
    if constexpr (types::sharded) {
      if (p_.master_sharded) {
        published_ = true;
        p_.reduction.gather_into(p_.size(), values,
                                 [&](std::size_t start, std::span<const float> v) {
                                   backend_.cast_range(p_, start, v);
                                 });
        return;
      }
    }
    backend_.cast_range(p_, 0, values);
  }
  /// Waits for the step's work: a delayed offload update is waited for and published into the
  /// model (before an evaluation, or at the end of training), and a CUDA stream is synchronized.
  void flush() {
    if constexpr (offloaded) {
      engine_.flush(p_.device_params);
      copy_work_to_model();
    }
    backend_.synchronize();
  }

 private:
  /// Whether a step over Batch can overlap the gradient reduction with the last backward: a host
  /// model that reports gradient readiness and a reduction that can begin during backward.
  template <class Batch>
  static constexpr bool overlaps =
      types::reduces && !types::sharded && std::is_same_v<space_type, host_space> &&
      reports_gradient_ready<Model, Batch> &&
      requires(reduction_type & red, std::span<float> g, const arena_layout& l) {
    { red.begin_overlap(g, l) } -> std::same_as<bool>;
    red.range_ready(std::size_t{}, std::size_t{});
  };

  /// What the gradient_ready callback of an overlapped backward works with.
  struct ready_context {
    trainer* self;
    float factor;     // the micro-batch's weight over the loss scale
    bool accumulate;  // add to the master gradients (not the step's first micro-batch)
    std::vector<char> done;
  };

  /// A parameter reported final: accumulated into the master gradients, its range to the
  /// reduction (which starts the buckets it completes).
  void on_gradient_ready(ready_context& c, std::size_t i) {
    HONE_REQUIRE(i < c.done.size(), "hone::trainer: the model reported parameter " +
                                        std::to_string(i) + " ready, but parameters() has " +
                                        std::to_string(c.done.size()) +
                                        "; pass the parameter's position in parameters()");
    HONE_REQUIRE(c.done[i] == 0, "hone::trainer: the model reported parameter " +
                                     std::to_string(i) + " ('" + p_.layout[i].name +
                                     "') ready twice in one backward; report each parameter once, "
                                     "after its gradients are final");
    backend_.accumulate_slot(p_, i, c.factor, c.accumulate);
    c.done[i] = 1;
    p_.reduction.range_ready(p_.layout[i].offset, p_.layout[i].count);
  }

  /// The last micro-batch with the reduction overlapping its backward: the model reports each
  /// parameter's gradients final through a hone::gradient_ready; those it did not report are
  /// accumulated after it returns. Returns the loss.
  template <class Batch>
  float forward_backward_overlapped(const Batch& batch, float loss_scale, float factor,
                                    bool accumulate) {
    ready_context c{this, factor, accumulate, std::vector<char>(p_.layout.size(), 0)};
    const gradient_ready ready(
        [](void* ctx, std::size_t i) {
          auto& rc = *static_cast<ready_context*>(ctx);
          rc.self->on_gradient_ready(rc, i);
        },
        &c);
    const float l = observe(step_phase::forward_backward, [&] {
      return static_cast<float>(
          model_traits<Model>::forward_backward(*p_.model, batch, loss_scale, ready));
    });
    observe(step_phase::unscale, [&] {
      for (std::size_t s = 0; s < c.done.size(); ++s) {
        if (c.done[s] == 0) backend_.accumulate_slot(p_, s, factor, accumulate);
      }
    });
    return l;
  }

  /// Runs f as phase `ph`, telling the step observer (nothing at all without one).
  template <class F>
  decltype(auto) observe(step_phase ph, F&& f) {
    if constexpr (types::observed) {
      struct phase_guard {
        observer_type& o;
        step_phase ph;
        ~phase_guard() { o.phase_end(ph); }
      };
      p_.observer.phase_begin(ph);
      const phase_guard guard{p_.observer, ph};
      return std::forward<F>(f)();
    } else {
      (void)ph;
      return std::forward<F>(f)();
    }
  }

  offload_engine_type make_engine() {
    if constexpr (types::offload_ok) {
      return offload_engine_type(detail::policy_object<offload_type>(p_.policies), p_.optimizer,
                                 p_.layout, backend_.transport());
    } else {
      return offload_engine_type();
    }
  }

  /// Fills the trainer's memory from the model's parameter views: the master gradient arena, the
  /// master weights (the model's own fp32 weights when they are one arena of the layout; else an
  /// arena, or the offload engine's host copy), and the tensor lists between them.
  void bind() {
    // (value, grad) of each parameter, held without the element type: every trainer shares this
    // vector's code (and detail::views_laid_out) whatever its precision.
    std::vector<std::array<const void*, 2>> views;
    for (auto& p : model_traits<Model>::parameters(*p_.model)) {
      views.push_back({p.value.data(), p.grad.data()});
    }
    const auto value = [&](std::size_t i) {
      return static_cast<working_type*>(const_cast<void*>(views[i][0]));
    };
    const auto grad = [&](std::size_t i) { return static_cast<const working_type*>(views[i][1]); };
    const arena_layout& layout = p_.layout;
    // hone::zero<2>: the master gradients of this rank's shard only
    p_.master_grad =
        arena<float, space_type>(types::zero_stage == 2 ? p_.optimizer_layout() : layout);
    // the working weights are one arena with the layout's offsets
    const bool laid_out = detail::views_laid_out(views, layout, sizeof(working_type));
    if constexpr (offloaded) {
      // The master weights are the engine's (host); the engine publishes working weights into one
      // arena in the model's space: the model's own when it is laid out, else a staging arena that
      // copy_work_to_model spreads over the model's tensors.
      p_.master = engine_.master().all().data();
      if (laid_out) {
        p_.device_params = value(0);
      } else {
        p_.work = arena<working_type, space_type>(layout);
        p_.device_params = p_.work.all().data();
      }
    } else if (laid_out && std::is_same_v<working_type, float>) {
      p_.master = reinterpret_cast<float*>(value(0));
      p_.zero_copy = true;
    } else {
      // hone::zero with shard_master_weights: this rank's shard of the master weights only
      if constexpr (types::sharded) {
        p_.master_sharded = p_.reduction.options().shard_master_weights;
      }
      p_.own_master = arena<float, space_type>(p_.master_sharded ? p_.optimizer_layout() : layout);
      p_.master = p_.own_master.all().data();
    }
    // sharded master weights: arena elements [lo, hi) are this rank's (own_master's first at lo)
    std::size_t lo = 0, hi = layout.total();
    if constexpr (types::sharded) {
      if (p_.master_sharded) {
        lo = p_.reduction.shard(layout.total()).offset;
        hi = lo + p_.own_master.all().size();
      }
    }
    for (std::size_t i = 0; i < views.size(); ++i) {
      const std::size_t n = layout[i].count;
      const std::size_t off = layout[i].offset;
      p_.model_grads.push_back(grad(i));
      p_.model_values.push_back(value(i));
      if constexpr (types::zero_stage != 2) p_.grads.add(n, p_.master_grad_data() + off, grad(i));
      if constexpr (offloaded) {
        if (!laid_out) {
          p_.work_in.add(n, p_.device_params + off, value(i));
          p_.work_out.add(n, value(i), p_.device_params + off);
        }
      } else if (p_.master_sharded) {  // the tensor's piece in this rank's shard, if any
        const std::size_t a = std::max(lo, off), b = std::min(hi, off + n);
        if (a < b) p_.weights_in.add(b - a, p_.master + (a - lo), value(i) + (a - off));
      } else if (!p_.zero_copy) {
        p_.weights_in.add(n, p_.master + off, value(i));
        p_.weights_out.add(n, value(i), p_.master + off);
      }
    }
    reload_weights_from_model();
  }

  /// Offload with a model whose tensors are not one arena: the engine's flat working weights
  /// into the model's tensors.
  void copy_work_to_model() {
    if (!p_.work_out.empty()) backend_.for_each(p_.work_out, detail::copy_element{});
  }

  /// The step's loss scale and learning rate into its report, and the optimizer's arguments
  /// (step, lr, the scheduled momentum); grad_scale is set by the check.
  optimizer_step_args begin_report(step_report& r) const {
    r.loss_scale = p_.scaler.scale();
    r.lr = static_cast<float>(p_.schedule.lr(p_.step));
    optimizer_step_args args{.step = p_.step + 1, .lr = r.lr, .grad_scale = 1.0f, .momentum = {}};
    if constexpr (momentum_schedule_policy<schedule_type>) {
      if (const auto m = p_.schedule.momentum(p_.step)) args.momentum = static_cast<float>(*m);
    }
    return args;
  }

  /// The part of a step after the micro-batches (a joined rank's join_step too): the gradient
  /// reduction, the check, the update, the weight constraint and the checkpoint.
  step_report finish_step(step_report& r, optimizer_step_args& args) {
    if constexpr (types::reduces) {
      observe(step_phase::reduce, [&] { backend_.reduce_gradients(p_); });
    }
    const detail::step_check c =
        observe(step_phase::check, [&] { return backend_.finish(p_, args); });
    r.grad_norm = c.grad_norm;
    r.skipped = c.skipped;
    observe(step_phase::optimizer, [&] {
      if (!r.skipped) {
        if constexpr (offloaded) {
          // Immediate: the updated weights are in the model when this returns. Delayed: the
          // previous update is published and this one runs on the engine's thread.
          engine_.step(args, p_.master_grad_data(), p_.device_params, p_.groups);
          copy_work_to_model();
        } else {
          backend_.apply_update(p_, args);
        }
        ++p_.step;
        if constexpr (types::constrained) constrain();
      } else if constexpr (offloaded) {
        // Nothing new to overlap with: a pending delayed update is published now.
        if (engine_.pending()) {
          engine_.flush(p_.device_params);
          copy_work_to_model();
        }
      }
    });
    r.step = p_.step;
    observe(step_phase::checkpoint, [&] { checkpoint_.after_step(*this, r); });
    if constexpr (requires(const observer_type& o) {
                    { o.last_step_ns(step_phase::optimizer) } -> std::convertible_to<double>;
                    { o.last_step_ns() } -> std::convertible_to<double>;
                  }) {
      // The observer closed the step with the after_step checkpoint phase: its times are this
      // step's.
      for (std::size_t i = 0; i < step_phase_count; ++i) {
        r.phase_ns[i] = p_.observer.last_step_ns(static_cast<step_phase>(i));
      }
      r.step_ns = p_.observer.last_step_ns();
    }
    return r;
  }

  /// The weight constraint after an applied update. With sharded master weights the backend's
  /// update left the gather into the model to this point: the constraint runs on the updated
  /// shard, then the shards are gathered once (unless the constraint published them itself).
  void constrain() {
    if constexpr (types::sharded) {
      if (p_.master_sharded) {
        published_ = false;
        p_.constraint.after_update(*this);
        if (!published_) backend_.publish_weights(p_);
        return;
      }
    }
    p_.constraint.after_update(*this);
  }

  backend_type backend_;
  parts_type p_;
  offload_engine_type engine_;  // initialized from a prvalue (so not [[no_unique_address]])
  typename checkpoint_type::engine checkpoint_;
  [[no_unique_address]] early_stopper_type stopper_;
  bool published_ = false;  // sharded master weights: published during the weight constraint
};

template <class Model, class... Policies>
trainer(Model&, Policies...) -> trainer<Model, Policies...>;

HONE_NAMESPACE_END
