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
// are waited and gathered); they do not overlap backward (the trainer calls reduce() after the
// last micro-batch; Open MPI progresses non-blocking collectives only inside MPI calls, ompi
// issue #9759, so a collective started during backward would mostly run at its wait anyway).
//
// Failure is never a hang: a wait that fails or times out (the communicator's timeout, e.g.
// hone::dist::mpi_comm's) is rethrown as hone::dist_error naming the step (the number of this
// reduction), the bucket, the collective and the communicator's own message (operation, rank).
// The reduction then stays pending: finish_pending() waits for it again (a late rank may arrive),
// or the job is ended (mpi_comm::abort()). See docs/dist.md, "Data parallel".
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/roles.hpp"
#include "hone/dist/communicator.hpp"

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
};

namespace dist {

/// One bucket of the gradient arena: the elements [offset, offset + count).
struct bucket {
  std::size_t offset = 0;
  std::size_t count = 0;
  bool operator==(const bucket&) const = default;
};

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

namespace detail {

/// What one reduction has in flight, and the plan it runs. Copying it gives a fresh state (no
/// plan, no requests, no count), so that the policy object stays copyable (the trainer copies
/// its policies) while its requests are move-only.
template <class ScatterRequest, class GatherRequest>
struct dp_state {
  /// One reduce_scatter + all_gather: a slice of the arena, or the padded tail of the last bucket.
  struct piece {
    std::size_t bucket = 0;        // index in the plan
    bool padded = false;           // the padded tail (`pad`), else arena elements:
    std::size_t offset = 0;        //   [offset, offset + count), reduced in place
    std::size_t count = 0;         // a multiple of the number of ranks
    std::size_t shard_offset = 0;  // this rank's block: count / ranks floats of `shards`
  };

  dp_state() = default;
  dp_state(const dp_state& /*other*/) {}
  dp_state& operator=(const dp_state& /*other*/) { return *this = dp_state(); }
  dp_state(dp_state&&) noexcept = default;
  dp_state& operator=(dp_state&&) noexcept = default;
  ~dp_state() = default;

  std::vector<bucket> plan;
  std::size_t elements = 0;   // the arena size the plan was made for
  bool planned = false;       // the plan and pieces are made (at the first reduce)
  std::vector<piece> pieces;  // in reduction order
  std::vector<float> shards;  // the reduce_scatter outputs of every piece
  std::vector<float> pad;     // the last bucket's tail (elements % ranks), padded to ranks
  std::size_t tail = 0;       // elements in the tail: [0, tail) of the arena
  std::vector<ScatterRequest> scatters;
  std::vector<GatherRequest> gathers;
  std::uint64_t reductions = 0;  // calls of reduce(), the one in flight included
  std::span<float> grads;        // the arena of the reduction in flight
  bool pending = false;          // a reduction was started and is not complete
  std::size_t averaged = 0;      // pieces whose scatter is waited (and averaged)
  std::size_t gathered_started = 0;
  std::size_t gathered = 0;  // pieces whose gather is waited
};

}  // namespace detail
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
  using state_type = dist::detail::dp_state<scatter_request, gather_request>;

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
    try {
      comm_->all_reduce(std::span<double>(&total, 1), dist::reduce_op::sum).wait();
    } catch (const std::exception& e) {
      throw dist_error("hone::data_parallel: step " + std::to_string(s_.reductions + 1) +
                       ": the all_reduce of the sample counts failed: " + e.what());
    }
    HONE_REQUIRE(total > 0.0, "hone::data_parallel: no rank holds a sample in step " +
                                  std::to_string(s_.reductions + 1) +
                                  " (the global sample count is 0)");
    return local_count / total;
  }

  /// Sums (and with options().average, averages) `master_gradients` over the ranks, in place.
  /// Every rank must call it with an arena of the same size, once per step. Throws dist_error
  /// naming the step and bucket when a collective fails or times out (the reduction then stays
  /// pending: finish_pending()), and config_error when the arena size changes between calls.
  void reduce(std::span<float> master_gradients) {
    if (s_.pending) {
      throw dist_error(where(s_.pieces.empty() ? 0 : s_.averaged) +
                       ": reduce() was called again while that reduction, which failed, is still "
                       "pending. Call finish_pending() (it waits for the late ranks again) before "
                       "the next step, or end the job (e.g. mpi_comm::abort())");
    }
    ++s_.reductions;
    prepare(master_gradients.size());
    s_.grads = master_gradients;
    s_.pending = true;
    s_.averaged = s_.gathered_started = s_.gathered = 0;
    s_.scatters.clear();
    s_.gathers.clear();
    if (s_.tail > 0) {
      std::copy_n(master_gradients.data(), s_.tail, s_.pad.data());
      std::fill(s_.pad.begin() + static_cast<std::ptrdiff_t>(s_.tail), s_.pad.end(), 0.0f);
    }
    drive();
  }

  /// Completes a reduction that threw (a collective timed out: a late rank may still arrive), so
  /// that its requests are released without ending the job. The gradients are then reduced, but
  /// the trainer step that threw applied nothing. Does nothing when no reduction is pending.
  void finish_pending() {
    if (s_.pending) drive();
  }

  /// Whether a reduction that threw is still pending.
  [[nodiscard]] bool pending() const noexcept { return s_.pending; }
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
  /// The floats piece `p` reduces in place: its slice of the arena, or the padded tail.
  [[nodiscard]] float* piece_data(const typename state_type::piece& p) noexcept {
    return p.padded ? s_.pad.data() : s_.grads.data() + p.offset;
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
    s_.shards.assign(shard, 0.0f);
    s_.pad.assign(s_.tail > 0 ? n : 0, 0.0f);
    s_.planned = true;
  }

  /// Runs the rest of the reduction in flight: every scatter started in order, then scatters
  /// waited (and averaged) and gathers started in order, then gathers waited in order. Each stage
  /// counts what it has done, so that after a throw the same call resumes where it stopped.
  void drive() {
    const std::size_t n = ranks();
    const std::size_t count = s_.pieces.size();
    for (std::size_t k = s_.scatters.size(); k < count; ++k) {
      const auto& p = s_.pieces[k];
      guarded(k, "reduce_scatter (start)", [&] {
        s_.scatters.push_back(
            comm_->reduce_scatter(std::span<const float>(piece_data(p), p.count),
                                  std::span<float>(s_.shards.data() + p.shard_offset, p.count / n),
                                  dist::reduce_op::sum));
      });
    }
    for (std::size_t k = s_.gathered_started; k < count; ++k) {
      const auto& p = s_.pieces[k];
      float* const shard = s_.shards.data() + p.shard_offset;
      const std::size_t block = p.count / n;
      if (s_.averaged == k) {
        guarded(k, "reduce_scatter", [&] { s_.scatters[k].wait(); });
        if (options_.average && !options_.weight_by_count && n > 1) {
          const auto ranks_f = static_cast<float>(n);
          for (std::size_t i = 0; i < block; ++i) shard[i] /= ranks_f;
        }
        s_.averaged = k + 1;
      }
      guarded(k, "all_gather (start)", [&] {
        s_.gathers.push_back(comm_->all_gather(std::span<const float>(shard, block),
                                               std::span<float>(piece_data(p), p.count)));
      });
      s_.gathered_started = k + 1;
    }
    for (std::size_t k = s_.gathered; k < count; ++k) {
      guarded(k, "all_gather", [&] { s_.gathers[k].wait(); });
      s_.gathered = k + 1;
    }
    if (s_.tail > 0) std::copy_n(s_.pad.data(), s_.tail, s_.grads.data());
    s_.scatters.clear();
    s_.gathers.clear();
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

namespace dist {

/// Makes every rank's trainer start from the root's weights, as PyTorch DDP broadcasts the
/// parameters at construction: the root's fp32 master weights are broadcast over `comm` and cast
/// into each rank's model (trainer::publish_weights). Call it once after building the trainers,
/// before the first step (and after restoring a checkpoint on the root only). Host trainers.
template <class Trainer, class Comm>
void broadcast_weights(Trainer& trainer, Comm& comm, int root = 0) {
  static_assert(check_communicator<Comm>());
  std::span<float> w = trainer.master_weights();
  comm.broadcast(w, root).wait();
  trainer.publish_weights();
}

}  // namespace dist

template <class Comm>
data_parallel(Comm&) -> data_parallel<Comm>;
template <class Comm>
data_parallel(Comm&, data_parallel_options) -> data_parallel<Comm>;

HONE_NAMESPACE_END
