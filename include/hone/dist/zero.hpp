// hone/dist/zero.hpp: hone::zero<1>(comm) and hone::zero<2>(comm), the trainer's gradient
// reduction role for ZeRO data parallelism (DeepSpeed's ZeRO stages 1 and 2) over any
// hone::dist::communicator: every rank keeps the optimizer state of one shard of the parameters
// only, updates that shard, and the updated weights are all-gathered.
//
//   hone::dist::mpi_comm comm;                                    // outlives the trainer
//   hone::trainer t(model, hone::adamw{}, hone::clip_grad_norm{.max_norm = 1.0f},
//                   hone::zero<2>(comm));                         // or zero<1>
//   hone::dist::broadcast_weights(t, comm);                       // rank 0's weights everywhere
//   t.step(std::span<const batch>(this_ranks_micro_batches));
//
// The shards. The trainer's flat fp32 arena of N elements (the layout of the model's parameters)
// is cut into `size()` contiguous shards of S = ceil(N / size()) elements, rounded up to a
// multiple of 16 floats (64 bytes, the arena's alignment); rank r owns [r S, min(N, (r + 1) S)).
// A tensor may straddle two shards: each rank's optimizer state is laid out over its piece of it
// (shard_layout), so element-wise optimizers (hone::adamw, hone::sgd) compute exactly what one
// process computes for those elements. Parameter groups follow the pieces (shard_groups).
//
// One step (the trainer's skeleton, hone/train/trainer.hpp, with the host backend's hooks):
//  - zero<1>: the micro-batches accumulate into the full fp32 master gradient arena as without
//    the role; after the last one, reduce() reduce-scatters it in windows so that each rank's
//    shard of the arena holds the sum (and with `average`, the mean) over the ranks. One
//    reduction per step, whatever the accumulation.
//  - zero<2>: the trainer keeps an fp32 master gradient arena of the shard only; after every
//    micro-batch, scatter() reduce-scatters that micro-batch's unscaled gradients (read from the
//    model's gradient tensors into a staging bucket) and accumulates this rank's block into the
//    shard. One reduction per micro-batch (DeepSpeed's stage 2 does the same), 4/d bytes per
//    parameter of master gradients.
//  - The gradient norm: each rank sums the squares of its shard in double; the sums are
//    all-gathered and added in rank order (global_sum), so every rank holds the same bits: the
//    loss scaler's inf/NaN decision and global-norm clipping (hone::clip_grad_norm, L2) agree on
//    every rank. clip_grad_norm of another order takes one more all_gather of a double per
//    applied step (combine_over_ranks): each shard's largest |g| (infinity) or sum of |g|^p.
//  - The update: the optimizer steps this rank's shard of the master weights with its shard of
//    the state; then gather() all-gathers the updated shards in windows into every rank's full
//    master weights when they are the model's own fp32 weights (bound zero-copy). Otherwise
//    (mixed precision, or fp32 tensors in separate buffers) each rank holds only its shard of the
//    master weights (zero_options::shard_master_weights, the default) and gather_into() casts the
//    gathered windows straight into the model's working weights.
//
// The windows. A collective moves one window per rank: the reduce-scatter of window k sends
// elements [r S + k B, r S + (k + 1) B) of every shard r (staged into one contiguous bucket of
// size() B floats) and receives this rank's block; the all-gather is the reverse. B is
// options.bucket_bytes / 4 / size() (at least 1 float), so the staging bucket holds about
// bucket_bytes (DDP's 25 MiB by default): memory per rank is that bucket plus the shards
// (staging_bytes()).
//
// Memory per parameter with fp32 AdamW and fp32 weights bound zero-copy (the model's weights are
// the master weights): weights 4 + master gradients 4 + moments 8 = 16 bytes without sharding
// (hone::data_parallel); zero<1> 4 + 4 + 8/d; zero<2> 4 + 4/d + 8/d, plus the staging bucket. The
// model's own gradient tensors come on top in every mode (the model owns them). Mixed precision
// (16-bit working weights, 2 bytes, the model's): zero<1> 2 + 4 + (4 + 8)/d, zero<2> 2 + 16/d
// with the master weights sharded.
//
// The 16-bit wire (options.wire = wire_format::bf16 or fp16): each rank block of a window is
// rounded into a 16-bit staging window, reduce-scattered as 16-bit values, averaged by its owner
// in fp32 and rounded back, then widened into the fp32 shard: the bits of hone::data_parallel on
// the same wire, half the gradients' bytes. The weights' all-gather stays fp32.
//
// Limits: host models (a CUDA trainer refuses the role at compile time); element-wise optimizers
// (hone::adamw, hone::sgd); no offload role. Uneven inputs (options.uneven_inputs): a rank with no
// batch left calls hone::dist::join, which runs the other ranks' steps without micro-batches (it
// owns a shard to update); options.weight_by_count weights the ranks by their samples. Failure is
// never a hang: a collective that fails or times out throws hone::dist_error naming the stage, the
// step, the window, the collective and the communicator's own message; the job must then end
// (e.g. mpi_comm::abort()): the collectives are not resumed. Checkpoints: hone::checkpoint::capture
// of a ZeRO trainer is collective (every rank calls it; the state's shards are all-gathered into
// whole tensors and one rank writes them), and restore keeps this rank's shard of the whole
// tensors: a checkpoint resumes on any number of ranks. With sharded master weights capture also
// gathers them (collective for any content). The roles that read or change whole master weights
// work over the shards with the bits of whole ones: the step gathers the shards after the weight
// constraint (magnitude pruning ranks gathered weights; fake-quant training agrees on channel
// ranges through all_reduce_max), and early stopping keeps each rank's shard of the best weights.
// hone::checkpoint::save_sharded (hone/checkpoint/sharded.hpp) instead has every rank write its
// own shard under one MANIFEST. See docs/dist.md, "ZeRO".
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/arena.hpp"
#include "hone/core/bfloat16.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/half.hpp"
#include "hone/core/roles.hpp"
#include "hone/core/space.hpp"
#include "hone/dist/communicator.hpp"
#include "hone/dist/wire_format.hpp"
#include "hone/optim/param_group.hpp"
#include "hone/precision/unscale.hpp"

HONE_NAMESPACE_BEGIN

/// The options of hone::zero.
struct zero_options {
  /// Bytes of the staging bucket of one collective (PyTorch DDP's bucket_cap_mb = 25): each
  /// window moves bucket_bytes / 4 / size() floats per rank (at least one). Must be at least 4.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// Divide the summed gradients by the number of ranks (DDP's mean).
  bool average = true;
  /// Shard the fp32 master weights too, when they are the trainer's own copy (mixed precision,
  /// or fp32 tensors that are not one arena): each rank keeps 4/d bytes per parameter of them
  /// instead of 4 (DeepSpeed's stages 1 and 2 do the same), and the updated shards are
  /// all-gathered straight into the model's working weights. trainer::master_weights() is then
  /// this rank's shard, and publishing them is collective. Magnitude pruning, fake-quant
  /// training and early stopping's keep_best_weights work over the shards (docs/dist.md,
  /// "Sharded master weights"). Set false to keep the whole fp32 copy on every rank. Without
  /// effect when the model's fp32 weights are the master weights (bound zero-copy).
  bool shard_master_weights = true;
  /// Ranks may run out of batches at different steps (uneven inputs; PyTorch's Join, which
  /// ZeroRedundancyOptimizer supports). Every step then begins with an exchange of each rank's
  /// {has a batch, micro-batches, samples} (one all_gather of three doubles); a rank with no batch
  /// left calls hone::dist::join(trainer), which takes part in the other ranks' steps with zero
  /// gradients and keeps updating its shard (each rank owns one) until every rank has joined.
  /// `average` divides by the ranks that had a batch; zero<2> runs as many reduce-scatters on
  /// every rank as the rank with the most micro-batches has (the others add zeros). Set it on
  /// every rank.
  bool uneven_inputs = false;
  /// Weight each rank's gradients by its share of the step's samples (its micro-batches' counts
  /// over every rank's, carried by the step's exchange; hone::accumulate::by_count needed), as
  /// data_parallel_options::weight_by_count: with batches of different sizes the update is the
  /// mean over every sample of the step, not the mean of the ranks' means (`average` then does not
  /// divide). With uneven_inputs a joined rank counts 0.
  bool weight_by_count = false;
  /// The gradients' element type in the reduce-scatters (data_parallel_options::wire's
  /// formats): with bf16 or fp16 each window is rounded (to nearest even) into 16-bit values,
  /// reduce-scattered as such (sums in fp32, rounded back after each), averaged by the block's
  /// owner (fp32 division rounded back) and widened into the fp32 shard: half the bytes of the
  /// gradients' collectives, the same bits as hone::data_parallel with that wire. An fp16 sum
  /// beyond 65504 is inf on every rank (the step is skipped). The updated weights' all-gather
  /// stays fp32. Needs a communicator with reduce_scatter on that type; set it on every rank.
  wire_format wire = wire_format::fp32;
};

namespace dist {
/// This rank's shard of an arena: elements [offset, offset + count); every shard but the last
/// spans `stride` elements (the last may be shorter or empty).
struct shard_range {
  std::size_t offset = 0;
  std::size_t count = 0;
  std::size_t stride = 0;
};

/// The shards of an arena of `elements` floats over `ranks` ranks: the shard of `rank`.
[[nodiscard]] inline shard_range shard_of(std::size_t elements, int rank, int ranks) {
  HONE_REQUIRE(ranks >= 1 && rank >= 0 && rank < ranks,
               "hone::dist::shard_of: rank " + std::to_string(rank) + " of " +
                   std::to_string(ranks) + "; a rank must be in [0, ranks) and ranks >= 1");
  constexpr std::size_t align = host_alignment / sizeof(float);
  const auto d = static_cast<std::size_t>(ranks);
  std::size_t stride = (elements + d - 1) / d;
  stride = (stride + align - 1) / align * align;
  const std::size_t offset = std::min(elements, static_cast<std::size_t>(rank) * stride);
  return {offset, std::min(stride, elements - offset), stride};
}
}  // namespace dist

/// The trainer's gradient reduction role for ZeRO stage `Stage` (1 or 2) over a communicator (see
/// the file comment). Holds the communicator by reference: it must outlive the policy and the
/// trainer. Build it with hone::zero<1>(comm) or hone::zero<2>(comm).
template <int Stage, class Comm>
class zero_redundancy {
  static_assert(Stage == 1 || Stage == 2,
                "hone::zero<Stage>: ZeRO stage 1 (optimizer state sharded) and stage 2 (optimizer "
                "state and gradients sharded) exist; stage 3 (parameters sharded) does not: use "
                "hone::zero<1> or hone::zero<2>.");
  static_assert(dist::check_communicator<Comm>());

 public:
  using role = roles::gradient_reduction;
  using communicator_type = Comm;
  /// The ZeRO stage (the trainer reads it to shard its arenas).
  static constexpr int zero_stage = Stage;

  explicit zero_redundancy(Comm& comm, zero_options options = {})
      : comm_(&comm), options_(options) {
    HONE_REQUIRE(options_.bucket_bytes >= sizeof(float),
                 "hone::zero: options.bucket_bytes is " + std::to_string(options_.bucket_bytes) +
                     "; the staging bucket must hold at least one float (4 bytes). Leave it at "
                     "its default (25 MiB, as PyTorch DDP) or give a positive size in bytes");
    HONE_REQUIRE(comm.size() >= 1 && comm.rank() >= 0 && comm.rank() < comm.size(),
                 "hone::zero: the communicator says rank " + std::to_string(comm.rank()) + " of " +
                     std::to_string(comm.size()) +
                     " ranks; a rank must be in [0, size()) and size() at least 1");
    HONE_REQUIRE((options_.wire != wire_format::bf16 || dist::detail::carries<Comm, bfloat16>),
                 "hone::zero: options.wire is bf16 but this communicator has no reduce_scatter "
                 "and all_gather on std::span<hone::bfloat16>. Add them (sums in fp32, rounded "
                 "back) or leave options.wire at fp32");
    HONE_REQUIRE((options_.wire != wire_format::fp16 || dist::detail::carries<Comm, half>),
                 "hone::zero: options.wire is fp16 but this communicator has no reduce_scatter "
                 "and all_gather on std::span<hone::half>. Add them (sums in fp32, rounded back) "
                 "or leave options.wire at fp32");
  }

  [[nodiscard]] Comm& communicator() noexcept { return *comm_; }
  [[nodiscard]] const zero_options& options() const noexcept { return options_; }

  /// This rank's shard of an arena of `elements` floats.
  [[nodiscard]] dist::shard_range shard(std::size_t elements) const {
    return dist::shard_of(elements, comm_->rank(), comm_->size());
  }

  /// The layout of this rank's shard of `full` (offsets relative to the shard's first element):
  /// the pieces of the slots that overlap the shard, named as their slots. The optimizer state of
  /// a ZeRO trainer is laid out over it.
  [[nodiscard]] arena_layout shard_layout(const arena_layout& full) const {
    return build_shard(full).layout;
  }

  /// The parameter groups of `full` (slot indices into `full`) as groups of shard_layout(full).
  [[nodiscard]] std::vector<param_group> shard_groups(
      const arena_layout& full, const std::vector<param_group>& groups) const {
    const shard_map m = build_shard(full);
    std::vector<param_group> out;
    out.reserve(groups.size());
    for (const param_group& g : groups) {
      param_group s{{}, g.lr_scale, g.weight_decay};
      for (std::size_t i = 0; i < m.source.size(); ++i) {
        if (std::find(g.slots.begin(), g.slots.end(), m.source[i]) != g.slots.end()) {
          s.slots.push_back(i);
        }
      }
      out.push_back(std::move(s));
    }
    return out;
  }

  /// zero<1>: after the step's last micro-batch, reduces the full master gradient arena so that
  /// this rank's shard of it, [shard(n).offset, + count), holds the sum (with `average` the mean)
  /// over the ranks. The other elements keep this rank's own gradients.
  void reduce(std::span<float> master_gradients) requires(Stage == 1) {
    const dist::shard_range sh = shard(master_gradients.size());
    const std::span<const float> all = master_gradients;
    scatter_windows(
        all.size(), master_gradients.subspan(sh.offset, sh.count),
        [&](std::size_t start, std::span<float> dst) {
          std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(start), dst.size(), dst.begin());
        },
        /*accumulate=*/false, "the reduce_scatter of the master gradients");
  }

  /// zero<2>: reduce-scatters one micro-batch's gradients of an arena of `elements` floats into
  /// this rank's shard (`shard_gradients`, the trainer's shard arena): fill(start, dst) writes
  /// this rank's gradients of arena elements [start, start + dst.size()) into dst (zeros in the
  /// padding). With `accumulate` the reduced values are added to the shard, else they replace it.
  template <class Fill>
  void scatter(std::size_t elements, std::span<float> shard_gradients, const Fill& fill,
               bool accumulate) requires(Stage == 2) {
    scatter_windows(elements, shard_gradients, fill, accumulate,
                    "the reduce_scatter of a micro-batch's gradients");
  }

  /// Begins a step of `micro_batches` micro-batches holding `samples` samples on this rank (0: a
  /// rank that has joined). With options().uneven_inputs or weight_by_count every rank's {has a
  /// batch, micro-batches, samples} is all-gathered (one collective of three doubles): the number
  /// of ranks with a batch is returned (0: every rank has joined) and divides the gradients with
  /// `average`, micro_batches() becomes the largest count and count_share() reads the samples'
  /// sum (in rank order: the same bits on every rank). Without either, returns size() and
  /// micro_batches() is this rank's count.
  std::size_t begin_step(std::size_t micro_batches, double samples = 0.0) {
    active_ = static_cast<std::size_t>(comm_->size());
    micro_ = micro_batches;
    if (!options_.uneven_inputs && !options_.weight_by_count) return active_;
    HONE_REQUIRE(std::isfinite(samples) && samples >= 0.0,
                 "hone::zero: this rank's sample count is " + std::to_string(samples) +
                     "; it must be finite and >= 0");
    const std::array<double, 3> mine{micro_batches > 0 ? 1.0 : 0.0,
                                     static_cast<double>(micro_batches), samples};
    flags_.assign(3 * static_cast<std::size_t>(comm_->size()), 0.0);
    run(micro_batches > 0
            ? "the all_gather of the still-active flags, micro-batch and sample counts"
            : "the all_gather of the still-active flags, micro-batch and sample counts (joined: "
              "this rank has no batch left and takes part with zero gradients)",
        steps_ + 1, 0, [&] {
          return comm_->all_gather(std::span<const double>(mine), std::span<double>(flags_));
        });
    active_ = 0;
    micro_ = 0;
    samples_ = 0.0;
    for (std::size_t r = 0; r < flags_.size(); r += 3) {
      active_ += flags_[r] > 0.0 ? 1 : 0;
      micro_ = std::max(micro_, static_cast<std::size_t>(flags_[r + 1]));
      samples_ += flags_[r + 2];
    }
    return active_;
  }

  /// With options().weight_by_count: this rank's share of the step's samples, local_count over
  /// the sum that begin_step exchanged (the trainer scales this rank's micro-batch weights by
  /// it). config_error when no rank holds a sample.
  [[nodiscard]] double count_share(double local_count) const {
    HONE_REQUIRE(samples_ > 0.0, "hone::zero: no rank holds a sample in step " +
                                     std::to_string(steps_ + 1) +
                                     " (the global sample count is 0)");
    return local_count / samples_;
  }
  /// The micro-batches of the step begun last (the most of any rank with uneven_inputs).
  [[nodiscard]] std::size_t micro_batches() const noexcept { return micro_; }

  /// The sum of every rank's `local` (one all_gather of one double), added in rank order: the
  /// same bits on every rank. The trainer calls it once per step, after the gradients are
  /// reduced: it counts the steps (the step number in error messages).
  [[nodiscard]] double global_sum(double local) {
    const double s =
        combine(local, false, "the all_gather of the gradients' sums of squares", steps_ + 1);
    ++steps_;
    return s;
  }

  /// Every rank's `local` combined (one all_gather of one double): their sum, added in rank order,
  /// or with `maximum` their largest (NaN when any is NaN); the same bits on every rank. For what
  /// a step needs besides global_sum, after it (the clipping norm of an order other than 2);
  /// `what` names the collective in a failure's message.
  [[nodiscard]] double combine_over_ranks(double local, bool maximum, const char* what) {
    return combine(local, maximum, what, steps_);
  }

  /// The element-wise maximum over the ranks of `values` (in place, one all_reduce; a maximum
  /// has the same bits in any order). For the weight constraints that agree on values each rank
  /// computes from its shard of the master weights (fake quantization's channel ranges); `what`
  /// names the collective in a failure's message.
  void all_reduce_max(std::span<float> values, const char* what) {
    run(what, steps_, 0, [&] { return comm_->all_reduce(values, dist::reduce_op::max); });
  }

  /// All-gathers the ranks' shards of `master` (every rank's full fp32 master weights), in
  /// windows, after this rank updated its own shard.
  void gather(std::span<float> master) {
    const dist::shard_range sh = shard(master.size());
    gather(std::span<const float>(master).subspan(sh.offset, sh.count), master);
  }

  /// All-gathers every rank's shard (this rank's is `mine`) into `whole`, every rank's whole
  /// arena: the consolidated tensors of a checkpoint, or gather_master_weights.
  void gather(std::span<const float> mine, std::span<float> whole) {
    gather_into(whole.size(), mine, [&](std::size_t start, std::span<const float> values) {
      std::copy(values.begin(), values.end(), whole.begin() + static_cast<std::ptrdiff_t>(start));
    });
  }

  /// All-gathers every rank's shard of an arena of `elements` floats, in windows, handing each
  /// received block to out(start, values): values are arena elements [start, start +
  /// values.size()), every rank's (this rank's own too). `mine` is this rank's shard (at most
  /// shard(elements).count floats; elements past its end travel as zeros). The trainer's route
  /// for sharded master weights: out casts the blocks into the model's working weights.
  template <class Out>
  void gather_into(std::size_t elements, std::span<const float> mine, const Out& out) {
    const dist::shard_range sh = shard(elements);
    HONE_REQUIRE(mine.size() <= sh.count,
                 "hone::zero: internal error: a shard of " + std::to_string(mine.size()) +
                     " elements to gather, the shard holds " + std::to_string(sh.count));
    const auto d = static_cast<std::size_t>(comm_->size());
    const std::size_t b = window(d);
    prepare(d, b);
    std::size_t k = 0;
    for (std::size_t o = 0; o < sh.stride; o += b, ++k) {
      const std::size_t w = std::min(b, sh.stride - o);
      const std::size_t n = o < mine.size() ? std::min(w, mine.size() - o) : 0;
      std::copy_n(mine.begin() + static_cast<std::ptrdiff_t>(o), n, recv_.begin());
      std::fill(recv_.begin() + static_cast<std::ptrdiff_t>(n),
                recv_.begin() + static_cast<std::ptrdiff_t>(w), 0.0f);
      run("the all_gather of the updated master weights", steps_, k + 1, [&] {
        return comm_->all_gather(std::span<const float>(recv_.data(), w),
                                 std::span<float>(staging_.data(), d * w));
      });
      for (std::size_t r = 0; r < d; ++r) {
        const std::size_t start = r * sh.stride + o;
        if (start >= elements) break;
        const std::size_t count = std::min(w, elements - start);
        out(start, std::span<const float>(staging_.data() + r * w, count));
      }
    }
  }

  /// Bytes of the staging bucket and receive window (0 before the first collective).
  [[nodiscard]] std::size_t staging_bytes() const noexcept {
    return (staging_.capacity() + recv_.capacity()) * sizeof(float) +
           (bf16_.staging.capacity() + bf16_.recv.capacity() + fp16_.staging.capacity() +
            fp16_.recv.capacity()) *
               2;
  }
  /// Steps reduced so far (global_sum calls).
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }

 private:
  struct shard_map {
    arena_layout layout{sizeof(float)};
    std::vector<std::size_t> source;  // the slot of `full` each shard slot is a piece of
  };

  [[nodiscard]] shard_map build_shard(const arena_layout& full) const {
    const dist::shard_range sh = shard(full.total());
    const std::size_t lo = sh.offset, hi = sh.offset + sh.count;
    shard_map m;
    for (std::size_t s = 0; s < full.size(); ++s) {
      const auto& sl = full[s];
      const std::size_t a = std::max(lo, sl.offset), b = std::min(hi, sl.offset + sl.count);
      if (a >= b) continue;
      // Shard boundaries and slot offsets are multiples of the alignment, so a shard never begins
      // in the padding before a slot, and the pieces fall at their arena offsets.
      const std::size_t at = m.layout.add(sl.name, b - a);
      m.source.push_back(s);
      HONE_REQUIRE(m.layout[at].offset == a - lo,
                   "hone::zero: internal error: the shard layout of '" + sl.name +
                       "' does not line up with the arena (shard offset " + std::to_string(lo) +
                       ")");
    }
    return m;
  }

  [[nodiscard]] std::size_t window(std::size_t d) const noexcept {
    return std::max<std::size_t>(1, options_.bucket_bytes / sizeof(float) / d);
  }

  void prepare(std::size_t d, std::size_t b) {
    staging_.resize(d * b);
    recv_.resize(b);
  }

  /// The 16-bit staging window and receive block of one wire type.
  template <class T>
  struct lane {
    std::vector<T> staging;  // size() windows, one per rank
    std::vector<T> recv;     // one window
  };

  /// The reduce-scatters of an arena of `elements` floats into `dst` (this rank's shard), window
  /// by window, on the wire of options().wire.
  template <class Fill>
  void scatter_windows(std::size_t elements, std::span<float> dst, const Fill& fill,
                       bool accumulate, const char* what) {
    if (options_.wire == wire_format::bf16) {
      if constexpr (dist::detail::carries<Comm, bfloat16>) {
        scatter_windows_as(bf16_.staging, bf16_.recv, elements, dst, fill, accumulate, what);
        return;
      }
    } else if (options_.wire == wire_format::fp16) {
      if constexpr (dist::detail::carries<Comm, half>) {
        scatter_windows_as(fp16_.staging, fp16_.recv, elements, dst, fill, accumulate, what);
        return;
      }
    }
    scatter_windows_as(staging_, recv_, elements, dst, fill, accumulate, what);
  }

  /// The divisor of `average` (every rank, or with uneven_inputs the ranks that had a batch),
  /// and whether the reduced values are divided at all.
  [[nodiscard]] float divisor() const noexcept {
    const auto d = static_cast<std::size_t>(comm_->size());
    return static_cast<float>(options_.uneven_inputs && active_ > 0 ? active_ : d);
  }
  [[nodiscard]] bool divides() const noexcept {
    return options_.average && !options_.weight_by_count;
  }

  /// The reduce-scatters of scatter_windows with T on the wire (float, hone::bfloat16 or
  /// hone::half), through `staging` (size() windows) and `recv` (one). On a 16-bit wire each rank
  /// block is filled in fp32 through recv_ and rounded into the staging window, and the reduced
  /// block's average is rounded back to T before it is widened (as hone::data_parallel's wire).
  template <class T, class Fill>
  void scatter_windows_as(std::vector<T>& staging, std::vector<T>& recv, std::size_t elements,
                          std::span<float> dst, const Fill& fill, bool accumulate,
                          const char* what) {
    constexpr bool fp32 = std::is_same_v<T, float>;
    const dist::shard_range sh = shard(elements);
    const auto d = static_cast<std::size_t>(comm_->size());
    const std::size_t b = window(d);
    staging.resize(d * b);
    recv.resize(b);
    if constexpr (!fp32) recv_.resize(b);
    const float ranks = divisor();
    const bool divide = divides();
    std::size_t k = 0;
    for (std::size_t o = 0; o < sh.stride; o += b, ++k) {
      const std::size_t w = std::min(b, sh.stride - o);
      for (std::size_t r = 0; r < d; ++r) {
        const std::size_t start = r * sh.stride + o;
        const std::size_t n = start < elements ? std::min(w, elements - start) : 0;
        T* block = staging.data() + r * w;
        if constexpr (fp32) {
          if (n > 0) fill(start, std::span<float>(block, n));
        } else if (n > 0) {
          fill(start, std::span<float>(recv_.data(), n));
          // rounded as T(x) rounds, through hone's vector casts (F16C for half)
          tensor_lists<T, const float> round;
          round.add(n, block, recv_.data());
          hone::for_each(round, cast_to_working<T>{});
        }
        std::fill(block + n, block + w, T(0.0f));
      }
      run(what, steps_ + 1, k + 1, [&] {
        return comm_->reduce_scatter(std::span<const T>(staging.data(), d * w),
                                     std::span<T>(recv.data(), w), dist::reduce_op::sum);
      });
      const std::size_t n = o < dst.size() ? std::min(w, dst.size() - o) : 0;
      float* out = dst.data() + o;
      if constexpr (fp32) {
        for (std::size_t j = 0; j < n; ++j) {
          // x / 1 is x: dividing by one rank changes no bit
          const float v = divide ? recv[j] / ranks : recv[j];
          out[j] = accumulate ? out[j] + v : v;
        }
      } else if (n > 0) {
        // v = float(T(float(sum) / ranks)), through hone's vector loop (F16C for half)
        if (divide) {
          tensor_lists<T> l;
          l.add(n, recv.data());
          hone::for_each(l, dist::detail::divide_in_float{ranks});
        }
        tensor_lists<float, const T> widen;
        widen.add(n, recv_.data(), recv.data());
        hone::for_each(widen, load_master<T>{});
        for (std::size_t j = 0; j < n; ++j) out[j] = accumulate ? out[j] + recv_[j] : recv_[j];
      }
    }
  }

  double combine(double local, bool maximum, const char* what, std::uint64_t step) {
    sums_.assign(static_cast<std::size_t>(comm_->size()), 0.0);
    run(what, step, 0, [&] {
      return comm_->all_gather(std::span<const double>(&local, 1), std::span<double>(sums_));
    });
    double s = maximum ? sums_[0] : 0.0;
    for (const double v : sums_) {
      if (!maximum) {
        s += v;
      } else if (!std::isnan(s) && (std::isnan(v) || v > s)) {
        s = v;  // a NaN on any rank stays
      }
    }
    return s;
  }

  /// Starts and waits one collective; a failure becomes a dist_error naming where it happened.
  template <class Start>
  void run(const char* what, std::uint64_t step, std::size_t window_no, const Start& start) {
    try {
      start().wait();
    } catch (const std::exception& e) {
      std::string where = "hone::zero<" + std::to_string(Stage) + ">: step " +
                          std::to_string(step) + " on rank " + std::to_string(comm_->rank()) +
                          " of " + std::to_string(comm_->size());
      if (window_no > 0) where += ", window " + std::to_string(window_no);
      throw dist_error(where + ", " + what + ": " + e.what() +
                       " [the collectives of this step are not resumed: end the job, e.g. "
                       "mpi_comm::abort()]");
    }
  }

  Comm* comm_;
  zero_options options_;
  std::vector<float> staging_;  // size() windows, one per rank
  std::vector<float> recv_;     // one window
  lane<bfloat16> bf16_;         // the 16-bit wires' windows (options.wire)
  lane<half> fp16_;
  std::vector<double> sums_;
  std::vector<double> flags_;  // every rank's {has a batch, micro-batches, samples}
  std::uint64_t steps_ = 0;
  std::size_t active_ = 0, micro_ = 0;  // the step's ranks with a batch, most micro-batches
  double samples_ = 0.0;                // the step's samples over every rank (weight_by_count)
};

/// hone::zero<1>(comm) or hone::zero<2>(comm): the ZeRO gradient reduction role (see the file
/// comment).
template <int Stage, class Comm>
[[nodiscard]] zero_redundancy<Stage, Comm> zero(Comm& comm, zero_options options = {}) {
  return zero_redundancy<Stage, Comm>(comm, options);
}

namespace dist {
/// Every rank's whole fp32 master weights of the host trainer `t`, in its arena layout
/// (t.layout().total() floats): a copy of t.master_weights(), or, when a hone::zero trainer shards
/// them (zero_options::shard_master_weights, t.master_weights_sharded()), the ranks' shards
/// all-gathered: collective then, every rank calls it. For inspection and export; it holds 4 bytes
/// per parameter while it lives.
template <class Trainer>
[[nodiscard]] std::vector<float> gather_master_weights(Trainer& t) {
  std::vector<float> whole(t.layout().total(), 0.0f);
  t.gather_master_weights(std::span<float>(whole));  // trainer::gather_master_weights
  return whole;
}
}  // namespace dist

HONE_NAMESPACE_END
