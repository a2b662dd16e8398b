// hone/dist/data_parallel.hpp: hone::data_parallel<Comm>, the trainer's gradient reduction role
// for data-parallel training (PyTorch DDP's gradient averaging) over any hone::dist::communicator.
//
//   hone::dist::mpi_environment env(argc, argv);
//   hone::dist::mpi_comm comm;                                  // outlives the trainer
//   hone::trainer t(model, hone::fp16_mixed<>{}, hone::adamw{},
//                   hone::clip_grad_norm{.max_norm = 1.0f},
//                   hone::data_parallel(comm));                 // default: 25 MiB, average
//   hone::dist::broadcast_weights(t, comm);                     // rank 0's weights everywhere
//   t.step(std::span<const batch>(this_ranks_micro_batches));
//
// After the last micro-batch of a step the trainer hands the fp32 master gradients (one flat
// arena) to reduce(). The arena is cut into buckets: slices of the arena itself (no fusion copy),
// planned from its END (backward produces the last layers' gradients first, as DDP's buckets),
// the first one small (1 MiB), the others 25 MiB (DDP's first bucket and bucket_cap_mb). Every
// bucket is reduced by a reduce_scatter (rank r sums block r of the bucket over the ranks, into a
// shard buffer) and an all_gather (every rank receives every block, back into the arena slice):
// each element is summed once, by the rank that owns its block, and copied to the others, so all
// ranks hold bit-identical gradients whatever algorithm the communicator uses. With `average`
// (the default, like DDP) the owner divides its block by the number of ranks before the gather.
// The trainer then recomputes the norm and the inf/NaN check from the reduced gradients: loss
// scaling skips and global-norm clipping decide alike on every rank.
//
// Order: all reduce_scatters are started in bucket order, then bucket by bucket the scatter is
// waited, averaged and its gather started, then the gathers are waited in order. The collectives
// of different buckets overlap each other (later buckets' scatters progress while earlier ones
// are waited and gathered).
//
// Overlap with backward (options .overlap_with_backward, on by default): when the model's
// forward_backward takes a hone::gradient_ready and calls it as each parameter's gradients become
// final (PyTorch DDP's autograd hooks), the trainer accumulates that parameter into the master
// gradients at once and reports its arena range (range_ready); a bucket whose elements are all
// final starts its reduce_scatter during the last micro-batch's backward, in plan order, and each
// report also tests the newest started collective, which is what makes Open MPI progress them (it
// progresses non-blocking collectives only inside MPI calls, ompi issue #9759). reduce() then
// starts the remaining scatters and, in plan order, averages each bucket and starts its gather
// (not earlier: every rank must start the same collectives in the same order, and when a test
// finds a scatter complete differs between ranks). The same sums in the same order: the bits are
// those of the reduction after backward. fp32 wire, without uneven_inputs. See docs/dist.md,
// "Overlap with backward".
//
// Failure is never a hang: a wait that fails or times out (the communicator's timeout, e.g.
// hone::dist::mpi_comm's) is rethrown as hone::dist_error naming the step (the number of this
// reduction), the bucket, the collective and the communicator's own message (operation, rank).
// The reduction then stays pending: finish_pending() waits for it again (a late rank may arrive),
// or the job is ended (mpi_comm::abort()).
//
// Uneven inputs (options .uneven_inputs, PyTorch DDP's Join): ranks may run out of batches at
// different steps. Each step then begins with one all_reduce of {samples, still active}; a rank
// with no batch left calls hone::dist::join(trainer), which answers those exchanges with
// {0, 0} and takes part in the step's reduction with zero gradients until every rank has joined,
// then gives every rank the trainer state of a rank that trained to the end. `average` divides by
// the ranks still active, so each step's gradient is the mean over the batches that exist.
//
// Wire compression (options .wire = wire_format::bf16 or fp16, DDP's bf16/fp16 compress hooks):
// the buckets travel as 16-bit copies (rounded to nearest even), summed in fp32 two values at a
// time and rounded back, averaged by their owner, gathered and widened into the arena: half the
// bytes, still bit-identical on every rank.
// See docs/dist.md, "Data parallel", "Uneven inputs" and "Wire compression".
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/arena.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/roles.hpp"
#include "hone/dist/communicator.hpp"
#include "hone/dist/detail/dp_state.hpp"
#include "hone/dist/wire_format.hpp"
#include "hone/precision/unscale.hpp"

HONE_NAMESPACE_BEGIN

/// The options of hone::data_parallel.
struct data_parallel_options {
  /// Bytes of fp32 gradients per bucket (PyTorch DDP's bucket_cap_mb = 25). Rounded down to a
  /// whole number of floats per rank (at least one float per rank). Must be at least 4.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// Bytes of the first bucket, the last gradients of the arena (DDP's first bucket: 1 MiB),
  /// rounded like bucket_bytes. Must be at least 4.
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  /// Divide the summed gradients by the number of ranks (DDP's mean), so that N ranks each
  /// averaging their own batch give the gradient of the mean over the N batches.
  bool average = true;
  /// Weight each rank by its share of the step's samples instead (with hone::accumulate::by_count):
  /// ranks whose batches hold different numbers of samples (the last batch of an epoch, packed
  /// sequences of different token counts) then give the gradient of the mean over every sample
  /// of every rank, where DDP's mean of per-rank means weights a small batch's samples more. At
  /// the start of each step the ranks all-reduce their sample counts (one collective of one
  /// double); each rank's micro-batch weights become count / global count, and the reduction
  /// sums (`average` is then ignored). The reported loss stays this rank's own mean.
  bool weight_by_count = false;
  /// Ranks may run out of batches at different steps (uneven inputs; PyTorch DDP's Join). A rank
  /// with no batch left calls hone::dist::join(trainer): until every rank has joined it takes part
  /// in the other ranks' steps with zero gradients and a sample count of 0, then every rank takes
  /// the trainer state of a rank that trained to the end. Each step then begins with one more
  /// all_reduce of two doubles, {samples, still active} (merged with weight_by_count's count
  /// exchange), and `average` divides by the number of ranks still active, so the gradient is the
  /// mean over the ranks that had a batch, as one process accumulating their batches computes.
  /// Every rank must set it alike.
  bool uneven_inputs = false;
  /// The gradients' element type on the wire (PyTorch DDP's bf16/fp16 compress hooks). With bf16
  /// or fp16 each bucket is rounded (to nearest even) into a 16-bit buffer, the reduce_scatter
  /// sums 16-bit values (each sum of two in fp32, rounded back), the owner of a block averages it
  /// in fp32 and rounds back, the all_gather moves 16-bit blocks, and every rank widens them into
  /// the fp32 arena: half the bytes on the wire, every rank bit-identical. An fp16 gradient beyond
  /// 65504 becomes inf, which the trainer's inf/NaN check sees (the step is skipped). The
  /// communicator must run reduce_scatter and all_gather on hone::bfloat16 / hone::half
  /// (local_comm and mpi_comm do). Every rank must set it alike.
  wire_format wire = wire_format::fp32;
  /// Start a bucket's reduction during the last micro-batch's backward, as soon as the model
  /// reports all of its gradients final (a model whose forward_backward takes a
  /// hone::gradient_ready; PyTorch DDP's autograd hooks), instead of after backward. The
  /// arithmetic is the same: the bits do not change. Used with the fp32 wire and without
  /// uneven_inputs; otherwise, and for models that report nothing, the reduction runs after
  /// backward. Every rank must set it alike.
  bool overlap_with_backward = true;
};

namespace dist {

namespace detail {
[[nodiscard]] inline std::size_t bucket_elements(std::size_t bytes, std::size_t ranks) {
  const std::size_t floats = bytes / sizeof(float);
  return std::max(ranks, floats / ranks * ranks);
}
}  // namespace detail

/// The bucket plan of an arena of `elements` floats over `ranks` ranks, in reduction order:
/// bucket 0 holds the arena's last min(first, elements) elements, each next bucket the `bucket`
/// elements before those, the last bucket what is left at the start of the arena. `first` and
/// `bucket` are options.first_bucket_bytes and options.bucket_bytes in floats, rounded down to a
/// multiple of `ranks` (at least `ranks`), so every bucket except the last is a multiple of the
/// number of ranks. The buckets cover [0, elements) exactly once.
[[nodiscard]] inline std::vector<bucket> plan_buckets(std::size_t elements, int ranks,
                                                      const data_parallel_options& options) {
  HONE_REQUIRE(ranks >= 1, "hone::dist::plan_buckets: the number of ranks is " +
                               std::to_string(ranks) + "; it must be at least 1");
  HONE_REQUIRE(options.bucket_bytes >= sizeof(float) && options.first_bucket_bytes >= sizeof(float),
               "hone::data_parallel: bucket_bytes is " + std::to_string(options.bucket_bytes) +
                   " and first_bucket_bytes " + std::to_string(options.first_bucket_bytes) +
                   "; a bucket must hold at least one float (4 bytes). Leave them at their "
                   "defaults (25 MiB and 1 MiB, as PyTorch DDP) or give positive sizes in bytes");
  const auto n = static_cast<std::size_t>(ranks);
  const std::size_t first = detail::bucket_elements(options.first_bucket_bytes, n);
  const std::size_t rest = detail::bucket_elements(options.bucket_bytes, n);
  std::vector<bucket> plan;
  std::size_t end = elements;
  while (end > 0) {
    const std::size_t count = std::min(plan.empty() ? first : rest, end);
    plan.push_back({end - count, count});
    end -= count;
  }
  return plan;
}

}  // namespace dist

/// The trainer's gradient reduction role for data parallelism over a communicator (see the file
/// comment). Holds the communicator by reference, like a DDP process group: the communicator
/// must outlive the policy and the trainer, and the program keeps using it (a broadcast of the
/// initial weights, its own collectives, abort()). Copying the policy copies the reference and
/// the options, not the progress (plan, requests, count): the trainer copies it before its first
/// step. Host models (reduce(std::span<float>)).
template <class Comm>
class data_parallel {
  static_assert(dist::check_communicator<Comm>());

  using scatter_request = decltype(std::declval<Comm&>().reduce_scatter(
      std::declval<std::span<const float>>(), std::declval<std::span<float>>(),
      dist::reduce_op::sum));
  using gather_request = decltype(std::declval<Comm&>().all_gather(
      std::declval<std::span<const float>>(), std::declval<std::span<float>>()));
  using flag_request = decltype(std::declval<Comm&>().all_reduce(std::declval<std::span<double>>(),
                                                                 dist::reduce_op::sum));
  using bf16_lane = dist::detail::wire_lane<Comm, bfloat16>;
  using fp16_lane = dist::detail::wire_lane<Comm, half>;
  using state_type =
      dist::detail::dp_state<scatter_request, gather_request, flag_request, bf16_lane, fp16_lane>;

 public:
  using role = roles::gradient_reduction;
  using communicator_type = Comm;

  /// Reduces over `comm`, which must outlive this policy (and the trainer that holds it).
  explicit data_parallel(Comm& comm, data_parallel_options options = {})
      : comm_(&comm), options_(options) {
    (void)dist::plan_buckets(0, 1, options_);  // checks the options
    HONE_REQUIRE(comm.size() >= 1 && comm.rank() >= 0 && comm.rank() < comm.size(),
                 "hone::data_parallel: the communicator says rank " + std::to_string(comm.rank()) +
                     " of " + std::to_string(comm.size()) +
                     " ranks; a rank must be in [0, size()) and size() at least 1");
    HONE_REQUIRE((options_.wire != wire_format::bf16 || dist::detail::carries<Comm, bfloat16>),
                 "hone::data_parallel: options.wire is bf16 but this communicator has no "
                 "reduce_scatter and all_gather on std::span<hone::bfloat16>. Add them (sums in "
                 "fp32, rounded back) or leave options.wire at fp32");
    HONE_REQUIRE((options_.wire != wire_format::fp16 || dist::detail::carries<Comm, half>),
                 "hone::data_parallel: options.wire is fp16 but this communicator has no "
                 "reduce_scatter and all_gather on std::span<hone::half>. Add them (sums in "
                 "fp32, rounded back) or leave options.wire at fp32");
  }

  /// With options().weight_by_count: all-reduces this rank's sample count for the step and returns
  /// its share of the total (local / global), by which the trainer scales this rank's micro-batch
  /// weights. Every rank calls it once per step, before reduce(). dist_error when the collective
  /// fails; config_error when no rank holds a sample.
  [[nodiscard]] double count_share(double local_count) {
    HONE_REQUIRE(std::isfinite(local_count) && local_count >= 0.0,
                 "hone::data_parallel: this rank's sample count is " + std::to_string(local_count) +
                     "; it must be finite and >= 0");
    double total = local_count;
    if (options_.uneven_inputs) {
      refuse_if_pending(s_.reductions + 1);
      exchange_flags(s_.reductions + 1, local_count, 1.0, state_type::after_flags::nothing);
      s_.flags_known = true;
      total = s_.flags[0];
    } else {
      try {
        comm_->all_reduce(std::span<double>(&total, 1), dist::reduce_op::sum).wait();
      } catch (const std::exception& e) {
        throw dist_error("hone::data_parallel: step " + std::to_string(s_.reductions + 1) +
                         ": the all_reduce of the sample counts failed: " + e.what());
      }
    }
    HONE_REQUIRE(total > 0.0, "hone::data_parallel: no rank holds a sample in step " +
                                  std::to_string(s_.reductions + 1) +
                                  " (the global sample count is 0)");
    return local_count / total;
  }

  /// Overlap with backward (options().overlap_with_backward): the trainer calls it before the
  /// last micro-batch of a step whose model reports gradient readiness, with the master gradient
  /// arena and its layout. Returns false when the options rule overlap out (then reduce() does
  /// the whole reduction). After true, range_ready() reports arena ranges whose gradients are
  /// final, and reduce() (after backward) completes the step's reduction.
  [[nodiscard]] bool begin_overlap(std::span<float> master_gradients, const arena_layout& layout) {
    if (!options_.overlap_with_backward || options_.wire != wire_format::fp32 ||
        options_.uneven_inputs) {
      return false;
    }
    refuse_if_pending(s_.reductions + 1);
    prepare(master_gradients.size());
    ++s_.reductions;
    s_.grads = master_gradients;
    s_.pending = s_.overlapping = true;
    s_.averaged = s_.gathered_started = s_.gathered = s_.early_starts = 0;
    s_.scatters.clear();
    s_.gathers.clear();
    s_.waiting.assign(s_.pieces.size(), 0);
    for (const auto& sl : layout.slots()) count_overlaps(sl.offset, sl.count, true);
    start_ready();  // a piece of padding only is ready at once
    return true;
  }

  /// Overlap: arena elements [offset, offset + count) hold their final gradients for this step.
  /// Starts, in plan order, the reduce_scatter of every bucket whose elements are all final, and
  /// drives the collectives already started (test(): MPI progresses them inside its calls). Throws
  /// dist_error naming the step and bucket when a collective fails (the reduction stays pending).
  void range_ready(std::size_t offset, std::size_t count) {
    HONE_REQUIRE(s_.overlapping,
                 "hone::data_parallel: range_ready() without begin_overlap() for this step");
    HONE_REQUIRE(offset + count <= s_.elements,
                 "hone::data_parallel: range_ready(" + std::to_string(offset) + ", " +
                     std::to_string(count) + ") runs past the arena of " +
                     std::to_string(s_.elements) + " floats");
    count_overlaps(offset, count, false);
    start_ready();
    advance();
  }

  /// Pieces (buckets, and the last bucket's padded tail) of the last reduction whose
  /// reduce_scatter started during backward (overlap), before reduce() was called.
  [[nodiscard]] std::size_t early_starts() const noexcept { return s_.early_starts; }

  /// Sums (and with options().average, averages) `master_gradients` over the ranks, in place.
  /// Every rank must call it with an arena of the same size, once per step. Throws dist_error
  /// naming the step and bucket when a collective fails or times out (the reduction then stays
  /// pending: finish_pending()), and config_error when the arena size changes between calls.
  void reduce(std::span<float> master_gradients) {
    if (s_.overlapping) {  // begun during backward: start the rest, then wait for everything
      s_.overlapping = false;
      HONE_REQUIRE(
          master_gradients.data() == s_.grads.data() && master_gradients.size() == s_.grads.size(),
          "hone::data_parallel: reduce() was given another arena than begin_overlap()");
      s_.early_starts = s_.scatters.size();
      if (s_.tail > 0 && s_.scatters.size() < s_.pieces.size()) fill_pad();
      drive();
      return;
    }
    refuse_if_pending(s_.reductions);
    ++s_.reductions;
    if (options_.uneven_inputs) {
      s_.last_active = s_.reductions;
      s_.grads = master_gradients;
      if (!s_.flags_known) {
        exchange_flags(s_.reductions, 0.0, 1.0, state_type::after_flags::reduce);
      }
      s_.flags_known = false;
    }
    start(master_gradients);
  }

  /// One step of a rank that has joined (data_parallel_options::uneven_inputs; called by
  /// hone::dist::join, which most programs use instead): exchanges {0 samples, not active} with
  /// the other ranks and, when some rank is still active, takes part in that step's reduction
  /// with `gradient_arena` set to zeros (its contents are overwritten with the reduced gradients,
  /// which this rank does not apply). Returns false, after the exchange only, once every rank has
  /// joined. Throws dist_error naming the step when a collective fails or times out (the step
  /// stays pending: finish_pending()), config_error without uneven_inputs.
  [[nodiscard]] bool join_step(std::span<float> gradient_arena) {
    HONE_REQUIRE(options_.uneven_inputs,
                 "hone::data_parallel: a rank joined (it ran out of batches) but "
                 "data_parallel_options::uneven_inputs is off, so the other ranks do not "
                 "exchange the still-active flags it answers and would wait for it. Set "
                 ".uneven_inputs = true in the options of every rank");
    refuse_if_pending(s_.reductions);
    ++s_.reductions;
    s_.grads = gradient_arena;
    exchange_flags(s_.reductions, 0.0, 0.0, state_type::after_flags::shadow);
    return shadow();
  }

  /// After every rank has joined (join_step returned false on every rank): the rank whose trainer
  /// state the others take, the lowest-numbered of those that had a batch in the last step in
  /// which any rank had one (rank 0 when no rank had any). One all_reduce (max) of one double.
  /// Throws dist_error when the collective fails or times out (it then stays pending:
  /// finish_pending() completes it; no state has been exchanged).
  [[nodiscard]] int last_joiner() {
    refuse_if_pending(s_.reductions);
    const auto n = static_cast<std::uint64_t>(comm_->size());
    const auto mine = static_cast<std::uint64_t>(comm_->size() - 1 - comm_->rank());
    s_.flags = {static_cast<double>(s_.last_active * n + mine), 0.0};
    s_.then = state_type::after_flags::pick;
    s_.flag_req.reset();
    try {
      s_.flag_req.emplace(
          comm_->all_reduce(std::span<double>(s_.flags.data(), 1), dist::reduce_op::max));
    } catch (const dist_error& e) {
      throw dist_error(flags_where(s_.reductions) + ": " + e.what());
    }
    s_.flags_pending = true;
    wait_flags(s_.reductions);
    return static_cast<int>(n - 1 - static_cast<std::uint64_t>(s_.flags[0]) % n);
  }

  /// Steps this rank has taken part in after joining (zero gradients), over its whole life.
  [[nodiscard]] std::uint64_t shadowed_steps() const noexcept { return s_.shadowed; }
  /// With uneven_inputs: the number of ranks that had a batch in the last step (after reduce()
  /// or join_step()); the divisor of `average`.
  [[nodiscard]] std::size_t active_ranks() const noexcept { return s_.active; }

 private:
  /// Starts the bucket reduction of `master_gradients` and drives it to the end.
  void start(std::span<float> master_gradients) {
    prepare(master_gradients.size());
    s_.grads = master_gradients;
    s_.pending = true;
    s_.early_starts = 0;
    s_.averaged = s_.gathered_started = s_.gathered = 0;
    s_.scatters.clear();
    s_.gathers.clear();
    s_.bf16.scatters.clear();
    s_.bf16.gathers.clear();
    s_.fp16.scatters.clear();
    s_.fp16.gathers.clear();
    if (options_.wire == wire_format::bf16) {
      round_into(s_.bf16);
    } else if (options_.wire == wire_format::fp16) {
      round_into(s_.fp16);
    } else if (s_.tail > 0) {
      fill_pad();
    }
    drive();
  }

  /// The fp32 arena's first `tail` elements into the padded tail's buffer.
  void fill_pad() {
    std::copy_n(s_.grads.data(), s_.tail, s_.pad.data());
    std::fill(s_.pad.begin() + static_cast<std::ptrdiff_t>(s_.tail), s_.pad.end(), 0.0f);
  }

  /// Overlap: adds (`add`) or removes the elements of [offset, offset + count) that each piece
  /// covers to or from the piece's count of elements not final yet.
  void count_overlaps(std::size_t offset, std::size_t count, bool add) {
    for (std::size_t k = 0; k < s_.pieces.size(); ++k) {
      const auto& p = s_.pieces[k];
      const std::size_t b = p.padded ? 0 : p.offset;
      const std::size_t e = p.padded ? s_.tail : p.offset + p.count;
      const std::size_t lo = std::max(b, offset), hi = std::min(e, offset + count);
      if (lo >= hi) continue;
      if (add) {
        s_.waiting[k] += hi - lo;
      } else {
        HONE_REQUIRE(s_.waiting[k] >= hi - lo,
                     "hone::data_parallel: arena elements [" + std::to_string(lo) + ", " +
                         std::to_string(hi) +
                         ") were reported final twice in one step (a parameter reported ready "
                         "twice, or two parameters sharing elements)");
        s_.waiting[k] -= hi - lo;
      }
    }
  }

  /// Overlap: starts the reduce_scatter of every next piece (in plan order) that is all final.
  void start_ready() {
    const std::size_t n = ranks();
    while (s_.scatters.size() < s_.pieces.size() && s_.waiting[s_.scatters.size()] == 0) {
      const std::size_t k = s_.scatters.size();
      const auto& p = s_.pieces[k];
      if (p.padded) fill_pad();
      const float* in = p.padded ? s_.pad.data() : s_.grads.data() + p.offset;
      guarded(k, "reduce_scatter (start)", [&] {
        s_.scatters.push_back(
            comm_->reduce_scatter(std::span<const float>(in, p.count),
                                  std::span<float>(s_.shards.data() + p.shard_offset, p.count / n),
                                  dist::reduce_op::sum));
      });
    }
  }

  /// Overlap: tests the newest started reduce_scatter, which makes MPI progress every collective
  /// in flight. The gathers start in reduce(), in plan order: a gather started as soon as a test
  /// found its scatter complete would start at different points of the sequence on different
  /// ranks, and every rank must start the same collectives in the same order.
  void advance() {
    if (s_.scatters.empty()) return;
    guarded(s_.scatters.size() - 1, "reduce_scatter (test)",
            [&] { (void)s_.scatters.back().test(); });
  }

  /// With options().average: this rank's reduced block divided by the ranks that had a batch.
  template <class T>
  void average_block(T* shard, std::size_t block) const {
    // The divisor: every rank, or with uneven_inputs the ranks that had a batch this step.
    const std::size_t divisor = options_.uneven_inputs ? s_.active : ranks();
    if (options_.average && !options_.weight_by_count && divisor > 1) {
      const auto ranks_f = static_cast<float>(divisor);
      // 16 bits: the division in fp32, rounded back to the wire type (through hone's vector
      // loop: the same bits as T(float(x) / ranks_f)).
      tensor_lists<T> l;
      l.add(block, shard);
      hone::for_each(l, dist::detail::divide_in_float{ranks_f});
    }
  }

  /// The arena rounded (to nearest even) into a 16-bit lane; its tail into the lane's pad.
  template <class Lane>
  void round_into(Lane& lane) {
    using T = typename Lane::value_type;
    const std::span<const float> g = s_.grads;
    // T(x) for every element, through hone's vector casts (F16C for half)
    if (g.size() > s_.tail) {
      tensor_lists<T, const float> l;
      l.add(g.size() - s_.tail, lane.data.data() + s_.tail, g.data() + s_.tail);
      hone::for_each(l, cast_to_working<T>{});
    }
    std::fill(lane.pad.begin(), lane.pad.end(), T(0.0f));
    for (std::size_t i = 0; i < s_.tail; ++i) lane.pad[i] = T(g[i]);
  }

  /// The exchange of {samples, still active} that begins a step with uneven_inputs: all-reduces
  /// {count, active} (sums) and keeps the request in the state, so that a wait that fails leaves
  /// it pending for finish_pending(), and `then` says what follows it there.
  void exchange_flags(std::uint64_t step, double count, double active,
                      typename state_type::after_flags then) {
    s_.flags = {count, active};
    s_.then = then;
    s_.flag_req.reset();
    try {
      s_.flag_req.emplace(comm_->all_reduce(std::span<double>(s_.flags), dist::reduce_op::sum));
    } catch (const dist_error& e) {
      throw dist_error(flags_where(step) + ": " + e.what());
    }
    s_.flags_pending = true;
    wait_flags(step);
  }

  void wait_flags(std::uint64_t step) {
    try {
      s_.flag_req->wait();
    } catch (const dist_error& e) {
      throw dist_error(flags_where(step) + ": " + e.what() +
                       " [the exchange is still pending: finish_pending() waits for it again, "
                       "else end the job]");
    }
    s_.flag_req.reset();
    s_.flags_pending = false;
    if (s_.then != state_type::after_flags::pick) s_.active = static_cast<std::size_t>(s_.flags[1]);
  }

  [[nodiscard]] std::string flags_where(std::uint64_t step) const {
    if (s_.then == state_type::after_flags::pick) {
      return "hone::data_parallel: after step " + std::to_string(step) + " on rank " +
             std::to_string(comm_->rank()) + " of " + std::to_string(comm_->size()) +
             ", the all_reduce (max) that picks the rank whose trainer state every rank takes "
             "after the join";
    }
    return "hone::data_parallel: step " + std::to_string(step) + " on rank " +
           std::to_string(comm_->rank()) + " of " + std::to_string(comm_->size()) +
           (s_.then == state_type::after_flags::shadow
                ? " (joined: this rank has no batch left and takes part with zero gradients)"
                : "") +
           ", the all_reduce of the sample counts and still-active flags";
  }

  /// A joined rank's part after the exchange: nothing once every rank has joined, else the
  /// step's reduction of zeros.
  bool shadow() {
    if (s_.active == 0) return false;
    ++s_.shadowed;
    HONE_REQUIRE(!options_.weight_by_count || s_.flags[0] > 0.0,
                 "hone::data_parallel: no rank holds a sample in step " +
                     std::to_string(s_.reductions) + " (the global sample count is 0)");
    std::fill(s_.grads.begin(), s_.grads.end(), 0.0f);
    start(s_.grads);
    return true;
  }

  void refuse_if_pending(std::uint64_t step) const {
    if (s_.flags_pending) {
      throw dist_error(flags_where(step) +
                       " failed and is still pending; a new step cannot start. Call "
                       "finish_pending() (it waits for the late ranks again) first, or end the "
                       "job (e.g. mpi_comm::abort())");
    }
    if (s_.pending) {
      throw dist_error(where(s_.pieces.empty() ? 0 : s_.averaged) +
                       ": reduce() was called again while that reduction, which failed, is still "
                       "pending. Call finish_pending() (it waits for the late ranks again) before "
                       "the next step, or end the job (e.g. mpi_comm::abort())");
    }
  }

 public:
  /// Completes a reduction that threw (a collective timed out: a late rank may still arrive), so
  /// that its requests are released without ending the job. The gradients are then reduced, but
  /// the trainer step that threw applied nothing. With uneven_inputs, a failed exchange of the
  /// still-active flags is completed too, followed by the reduction it began (reduce() or
  /// join_step(); after a join_step, call hone::dist::join again to go on). Does nothing when
  /// nothing is pending.
  void finish_pending() {
    if (s_.flags_pending) {
      wait_flags(s_.reductions);
      if (s_.then == state_type::after_flags::reduce) {
        s_.flags_known = false;
        start(s_.grads);
      } else if (s_.then == state_type::after_flags::shadow) {
        (void)shadow();
      }
      return;
    }
    if (s_.pending) {
      if (s_.overlapping) {  // a backward that threw: complete what began, the rest with it
        s_.overlapping = false;
        if (s_.tail > 0 && s_.scatters.size() < s_.pieces.size()) fill_pad();
      }
      drive();
    }
  }

  /// Whether a reduction (or, with uneven_inputs, an exchange of the still-active flags) that
  /// threw is still pending.
  [[nodiscard]] bool pending() const noexcept { return s_.pending || s_.flags_pending; }
  /// The number of reduce() calls so far (one per trainer step, skipped steps included): the
  /// "step" that error messages name.
  [[nodiscard]] std::uint64_t reductions() const noexcept { return s_.reductions; }
  /// The bucket plan of the arena this policy reduces, in reduction order (empty before the
  /// first reduce()); plan_for(n) gives the plan of an arena of n floats.
  [[nodiscard]] const std::vector<dist::bucket>& buckets() const noexcept { return s_.plan; }
  [[nodiscard]] std::vector<dist::bucket> plan_for(std::size_t elements) const {
    return dist::plan_buckets(elements, comm_->size(), options_);
  }
  [[nodiscard]] const data_parallel_options& options() const noexcept { return options_; }
  [[nodiscard]] Comm& communicator() const noexcept { return *comm_; }

 private:
  [[nodiscard]] std::size_t ranks() const noexcept {
    return static_cast<std::size_t>(comm_->size());
  }
  /// Makes the plan, the pieces and the shard buffers on the first call; checks the size later.
  void prepare(std::size_t elements) {
    if (s_.planned) {
      HONE_REQUIRE(elements == s_.elements,
                   "hone::data_parallel: the gradient arena holds " + std::to_string(elements) +
                       " floats but held " + std::to_string(s_.elements) +
                       " at the first step; one policy reduces one trainer's arena, whose size "
                       "does not change");
      return;
    }
    const std::size_t n = ranks();
    s_.plan = dist::plan_buckets(elements, comm_->size(), options_);
    s_.elements = elements;
    s_.pieces.clear();
    std::size_t shard = 0;
    for (std::size_t b = 0; b < s_.plan.size(); ++b) {
      const auto& bk = s_.plan[b];
      // Only the last bucket (at the start of the arena) can hold a count that is not a multiple
      // of the ranks; its first count % ranks elements go through the padded tail.
      const std::size_t tail = bk.count % n;
      const std::size_t body = bk.count - tail;
      if (body > 0) {
        s_.pieces.push_back({b, false, bk.offset + tail, body, shard});
        shard += body / n;
      }
      if (tail > 0) {
        s_.tail = tail;
        s_.pieces.push_back({b, true, 0, n, shard});
        shard += 1;
      }
    }
    const std::size_t pad = s_.tail > 0 ? n : 0;
    if (options_.wire == wire_format::bf16) {
      size_lane(s_.bf16, elements, pad, shard);
    } else if (options_.wire == wire_format::fp16) {
      size_lane(s_.fp16, elements, pad, shard);
    } else {
      s_.shards.assign(shard, 0.0f);
      s_.pad.assign(pad, 0.0f);
    }
    s_.planned = true;
  }

  /// Sizes a 16-bit lane for an arena of `elements` floats, `pad` padded-tail slots and
  /// `shards` reduced elements of this rank.
  template <class Lane>
  static void size_lane(Lane& lane, std::size_t elements, std::size_t pad, std::size_t shards) {
    using T = typename Lane::value_type;
    lane.data.assign(elements, T(0.0f));
    lane.pad.assign(pad, T(0.0f));
    lane.shards.assign(shards, T(0.0f));
  }

  /// Runs the rest of the reduction in flight on the wire of options().wire.
  void drive() {
    if (options_.wire == wire_format::bf16) {
      if constexpr (dist::detail::carries<Comm, bfloat16>) {
        auto& l = s_.bf16;
        drive_on(l.data.data(), l.pad, l.shards, l.scatters, l.gathers);
      }
    } else if (options_.wire == wire_format::fp16) {
      if constexpr (dist::detail::carries<Comm, half>) {
        auto& l = s_.fp16;
        drive_on(l.data.data(), l.pad, l.shards, l.scatters, l.gathers);
      }
    } else {
      drive_on(s_.grads.data(), s_.pad, s_.shards, s_.scatters, s_.gathers);
    }
  }

  /// Runs the rest of the reduction in flight over `arena` (the fp32 arena itself, or its 16-bit
  /// copy): every scatter started in order, then scatters waited (and averaged) and gathers
  /// started in order, then gathers waited in order, then a 16-bit arena widened into the fp32
  /// one. Each stage counts what it has done, so that after a throw the same call resumes where
  /// it stopped.
  template <class T, class Scatters, class Gathers>
  void drive_on(T* arena, std::vector<T>& pad, std::vector<T>& shards, Scatters& scatters,
                Gathers& gathers) {
    const std::size_t n = ranks();
    const std::size_t count = s_.pieces.size();
    const auto data = [&](const typename state_type::piece& p) {
      return p.padded ? pad.data() : arena + p.offset;
    };
    for (std::size_t k = scatters.size(); k < count; ++k) {
      const auto& p = s_.pieces[k];
      guarded(k, "reduce_scatter (start)", [&] {
        scatters.push_back(comm_->reduce_scatter(
            std::span<const T>(data(p), p.count),
            std::span<T>(shards.data() + p.shard_offset, p.count / n), dist::reduce_op::sum));
      });
    }
    for (std::size_t k = s_.gathered_started; k < count; ++k) {
      const auto& p = s_.pieces[k];
      T* const shard = shards.data() + p.shard_offset;
      const std::size_t block = p.count / n;
      if (s_.averaged == k) {
        guarded(k, "reduce_scatter", [&] { scatters[k].wait(); });
        average_block(shard, block);
        s_.averaged = k + 1;
      }
      guarded(k, "all_gather (start)", [&] {
        gathers.push_back(
            comm_->all_gather(std::span<const T>(shard, block), std::span<T>(data(p), p.count)));
      });
      s_.gathered_started = k + 1;
    }
    for (std::size_t k = s_.gathered; k < count; ++k) {
      guarded(k, "all_gather", [&] { gathers[k].wait(); });
      s_.gathered = k + 1;
    }
    float* const grads = s_.grads.data();
    if constexpr (std::is_same_v<T, float>) {
      if (s_.tail > 0) std::copy_n(pad.data(), s_.tail, grads);
    } else {
      for (std::size_t i = 0; i < s_.tail; ++i) grads[i] = static_cast<float>(pad[i]);
      if (s_.grads.size() > s_.tail) {  // widened exactly, through hone's vector casts
        tensor_lists<float, const T> l;
        l.add(s_.grads.size() - s_.tail, grads + s_.tail, arena + s_.tail);
        hone::for_each(l, load_master<T>{});
      }
    }
    scatters.clear();
    gathers.clear();
    s_.pending = false;
  }

  /// "hone::data_parallel: step S, bucket b of B (...)" for the piece `k`.
  [[nodiscard]] std::string where(std::size_t k) const {
    std::string s = "hone::data_parallel: step " + std::to_string(s_.reductions);
    if (k < s_.pieces.size()) {
      const auto& p = s_.pieces[k];
      const auto& bk = s_.plan[p.bucket];
      s += ", bucket " + std::to_string(p.bucket) + " of " + std::to_string(s_.plan.size()) +
           " (arena elements [" + std::to_string(bk.offset) + ", " +
           std::to_string(bk.offset + bk.count) + ")" + (p.padded ? ", its padded tail" : "") + ")";
    }
    s += " on rank " + std::to_string(comm_->rank()) + " of " + std::to_string(comm_->size());
    return s;
  }

  /// Runs f; a hone::dist_error or config_error from the communicator is rethrown with the step,
  /// the bucket and the collective in front of the communicator's message.
  template <class F>
  void guarded(std::size_t k, const char* collective, F&& f) {
    try {
      std::forward<F>(f)();
    } catch (const dist_error& e) {
      throw dist_error(where(k) + ", " + collective + ": " + e.what() +
                       " [the reduction is still pending: finish_pending() waits for it again, "
                       "else end the job]");
    } catch (const config_error& e) {
      // The communicator refused this piece's arguments before starting it (e.g. a bucket over
      // MPI's int count): every rank refuses alike. The pieces started before it are released by
      // the next reduce() or the destructor (their requests wait for them).
      s_.pending = false;
      throw config_error(where(k) + ", " + collective + ": " + e.what());
    }
  }

  Comm* comm_;
  data_parallel_options options_;
  state_type s_;
};

template <class Comm>
data_parallel(Comm&) -> data_parallel<Comm>;
template <class Comm>
data_parallel(Comm&, data_parallel_options) -> data_parallel<Comm>;

HONE_NAMESPACE_END

// hone::dist::broadcast_weights and hone::dist::join (uneven inputs), which name data_parallel.
#include "hone/dist/join.hpp"  // IWYU pragma: export
