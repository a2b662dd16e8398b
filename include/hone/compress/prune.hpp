// hone/compress/prune.hpp: unstructured magnitude pruning with masks, and the trainer policy that
// keeps pruned weights at zero while a gradual schedule raises the sparsity.
//
//   hone::trainer<Net, hone::adamw, hone::compress::magnitude_pruning> t(
//       net, hone::adamw{}, hone::compress::magnitude_pruning({
//           .schedule = {.initial = 0.0, .target = 0.9, .begin_step = 1000, .every = 100,
//                        .prunings = 50}}));
//   ...                                           // t.step(batch) as usual
//   t.weight_constraint().masks().sparsity();     // 0.9 after step 6000
//
// Masks: a mask_arena holds one byte per element of the trainer's fp32 arena layout (1 kept, 0
// pruned), at the same offsets, so a mask pass is one flat loop beside the master weights. Which
// tensors may be pruned is a predicate on their names; by default every tensor except biases and
// normalization parameters (hone::is_no_decay_name).
//
// Pruning: magnitude_prune() raises the number of pruned weights of each group (all prunable
// tensors together with prune_scope::global, each on its own with prune_scope::per_tensor) to
// floor(sparsity * group size), pruning the kept weights of smallest magnitude (ties: the lower
// index of the arena first). Pruned weights stay pruned (masks only grow), as in Zhu & Gupta.
//
// Schedule (Zhu & Gupta, "To prune, or not to prune", 2017): with s_i = initial, s_f = target, t0 =
// begin_step, dt = every, n = prunings, pruning happens at steps t0, t0 + dt, ..., t0 + n dt, to
//   s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (n dt))^3,
// and the sparsity stays s_f afterwards (0 before t0).
//
// The policy (role weight_constraint) runs after every applied update: at a pruning step it prunes
// from the updated master weights, then it zeroes the pruned master weights (and publishes them to
// the model's working weights when those are a separate copy, e.g. bf16_mixed), so a pruned weight
// is exactly zero in the model after every step, whatever the optimizer's moments say. Host
// trainers only (the CUDA trainer's master weights are device memory). With hone::zero's sharded
// master weights the same weights are pruned as with whole ones (the pruning steps rank the
// gathered weights; each rank masks its shard). Its masks travel in checkpoints through
// hone/compress/prune_checkpoint.hpp.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
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
#include "hone/optim/param_group.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

/// Over which weights a sparsity level is reached.
enum class prune_scope : std::uint8_t {
  global,      ///< all prunable tensors together: one magnitude threshold for the whole model
  per_tensor,  ///< each prunable tensor reaches the sparsity on its own
};

/// Zhu & Gupta's gradual cubic sparsity schedule (see the top of this file).
struct cubic_sparsity_schedule {
  double initial = 0.0;          ///< s_i, the sparsity of the first pruning step, in [0, 1]
  double target = 0.5;           ///< s_f, the final sparsity, in [initial, 1]
  std::uint64_t begin_step = 0;  ///< t0, the first pruning step
  std::uint64_t every = 1;       ///< dt, steps between two pruning steps (> 0)
  std::uint64_t prunings = 1;    ///< n, pruning steps after t0 until s_f is reached (> 0)

  /// Throws hone::config_error naming the field that cannot work.
  void check() const {
    const std::string f = "hone::compress::cubic_sparsity_schedule: ";
    HONE_REQUIRE(initial >= 0.0 && initial <= 1.0,
                 f + "initial is " + std::to_string(initial) + "; a sparsity lies in [0, 1].");
    HONE_REQUIRE(target >= initial && target <= 1.0,
                 f + "target is " + std::to_string(target) + "; it must lie in [initial (" +
                     std::to_string(initial) + "), 1]: pruning only ever removes weights.");
    HONE_REQUIRE(every > 0, f + "every is 0; prune every 1 step or more.");
    HONE_REQUIRE(prunings > 0, f + "prunings is 0; reach the target in 1 pruning step or more.");
  }

  /// The sparsity the schedule asks for once `step` updates are done.
  [[nodiscard]] double at(std::uint64_t step) const noexcept {
    if (step < begin_step) return 0.0;
    const std::uint64_t k = std::min(prunings, (step - begin_step) / every);
    const double frac = 1.0 - static_cast<double>(k) / static_cast<double>(prunings);
    return target + (initial - target) * frac * frac * frac;
  }
};

/// A name predicate: true for the tensors that may be pruned.
using prunable_predicate = std::function<bool(std::string_view)>;

/// The default predicate: every tensor but biases and normalization parameters.
inline bool prunable_by_default(std::string_view name) {
  return !is_no_decay_name(name);
}

/// One byte per element of an fp32 arena layout (1 kept, 0 pruned) and which slots may be pruned.
class mask_arena {
 public:
  mask_arena() = default;
  /// Every element kept; slot i may be pruned when prunable(layout[i].name).
  mask_arena(const arena_layout& layout, const prunable_predicate& prunable)
      : layout_(layout), keep_(layout.total(), std::uint8_t{1}), prunable_(layout.size(), false) {
    for (std::size_t i = 0; i < layout.size(); ++i) {
      prunable_[i] = prunable(layout[i].name);
      if (prunable_[i]) prunable_count_ += layout[i].count;
    }
  }

  [[nodiscard]] bool empty() const noexcept { return keep_.empty(); }
  [[nodiscard]] const arena_layout& layout() const noexcept { return layout_; }
  /// The whole mask, at the layout's offsets (padding elements are 1).
  [[nodiscard]] std::span<std::uint8_t> all() noexcept { return keep_; }
  [[nodiscard]] std::span<const std::uint8_t> all() const noexcept { return keep_; }
  /// The mask of slot i.
  [[nodiscard]] std::span<const std::uint8_t> tensor(std::size_t i) const {
    const auto& s = layout_[i];
    return std::span<const std::uint8_t>(keep_).subspan(s.offset, s.count);
  }
  [[nodiscard]] std::span<std::uint8_t> tensor(std::size_t i) {
    const auto& s = layout_[i];
    return std::span<std::uint8_t>(keep_).subspan(s.offset, s.count);
  }
  [[nodiscard]] bool prunable(std::size_t i) const { return prunable_.at(i); }
  /// Elements in prunable slots.
  [[nodiscard]] std::size_t prunable_count() const noexcept { return prunable_count_; }
  /// Pruned elements (a count over the prunable slots; other slots are never pruned).
  [[nodiscard]] std::size_t pruned() const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      if (!prunable_[i]) continue;
      for (const std::uint8_t k : tensor(i)) n += k == 0 ? 1 : 0;
    }
    return n;
  }
  /// pruned() / prunable_count() (0 without prunable elements).
  [[nodiscard]] double sparsity() const {
    return prunable_count_ == 0
               ? 0.0
               : static_cast<double>(pruned()) / static_cast<double>(prunable_count_);
  }
  /// Sets every pruned element of `weights` (laid out as the layout, padding included) to +0.0.
  void apply(std::span<float> weights) const {
    HONE_REQUIRE(weights.size() == keep_.size(),
                 "hone::compress::mask_arena::apply: the weights hold " +
                     std::to_string(weights.size()) + " elements but the mask covers " +
                     std::to_string(keep_.size()) +
                     "; pass the trainer's master weights (the arena the mask was built on).");
    apply(weights, 0);
  }
  /// The same for the arena elements [offset, offset + weights.size()) only, held by `weights`
  /// (a hone::zero rank's shard of the master weights: trainer::master_weights() at
  /// trainer::master_weights_offset()).
  void apply(std::span<float> weights, std::size_t offset) const {
    HONE_REQUIRE(offset <= keep_.size() && weights.size() <= keep_.size() - offset,
                 "hone::compress::mask_arena::apply: elements [" + std::to_string(offset) + ", " +
                     std::to_string(offset + weights.size()) +
                     ") lie outside the mask's arena of " + std::to_string(keep_.size()) +
                     "; pass the trainer's master weights and master_weights_offset().");
    const std::uint8_t* k = keep_.data() + offset;
    float* w = weights.data();
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, weights.size(), std::size_t{1} << 16),
                      [k, w](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t j = r.begin(); j != r.end(); ++j) {
                          w[j] = k[j] != 0 ? w[j] : 0.0f;
                        }
                      });
  }

 private:
  arena_layout layout_{sizeof(float)};
  std::vector<std::uint8_t> keep_;
  std::vector<bool> prunable_;
  std::size_t prunable_count_ = 0;
};

namespace detail {
/// Prunes, among the elements `idx` of the flat arena (one group), the kept ones of smallest
/// magnitude until floor(sparsity * idx.size()) are pruned.
inline void prune_group(std::span<const float> w, std::span<std::uint8_t> keep,
                        const std::vector<std::size_t>& idx, double sparsity) {
  const auto want =
      static_cast<std::size_t>(std::floor(sparsity * static_cast<double>(idx.size())));
  std::vector<std::pair<float, std::size_t>> kept;
  kept.reserve(idx.size());
  std::size_t already = 0;
  for (const std::size_t j : idx) {
    if (keep[j] == 0) {
      ++already;
    } else {
      kept.emplace_back(std::fabs(w[j]), j);
    }
  }
  if (want <= already) return;
  const std::size_t more = want - already;
  // (magnitude, index) pairs are distinct, so the `more` smallest are one set whatever the order.
  std::nth_element(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(more - 1), kept.end());
  for (std::size_t m = 0; m < more; ++m) keep[kept[m].second] = 0;
}
}  // namespace detail

/// Prunes the weights of smallest magnitude until each group reaches `sparsity` (see the top of
/// this file); `weights` is laid out as masks.layout() (the trainer's master weights). Throws
/// hone::config_error for a sparsity outside [0, 1], a size mismatch, or a weight that is NaN or
/// infinite in a prunable tensor (named, with its index).
inline void magnitude_prune(std::span<const float> weights, mask_arena& masks, double sparsity,
                            prune_scope scope = prune_scope::global) {
  const std::string f = "hone::compress::magnitude_prune: ";
  HONE_REQUIRE(sparsity >= 0.0 && sparsity <= 1.0,
               f + "the sparsity is " + std::to_string(sparsity) + "; it must lie in [0, 1].");
  HONE_REQUIRE(!masks.empty(), f + "the mask arena is empty; build it on the weights' layout.");
  HONE_REQUIRE(weights.size() == masks.all().size(),
               f + "the weights hold " + std::to_string(weights.size()) +
                   " elements but the masks' layout spans " + std::to_string(masks.all().size()) +
                   "; pass the weights of the arena the masks were built on.");
  const arena_layout& layout = masks.layout();
  for (std::size_t i = 0; i < layout.size(); ++i) {
    if (!masks.prunable(i)) continue;
    const auto& s = layout[i];
    for (std::size_t j = 0; j < s.count; ++j) {
      HONE_REQUIRE(std::isfinite(weights[s.offset + j]),
                   f + "weight " + std::to_string(j) + " of tensor '" + s.name + "' is " +
                       std::to_string(weights[s.offset + j]) +
                       "; magnitudes of NaN or infinite weights cannot be ranked (the training "
                       "diverged before this pruning step).");
    }
  }
  std::vector<std::size_t> idx;
  auto group_of = [&](std::size_t i) {
    const auto& s = layout[i];
    for (std::size_t j = 0; j < s.count; ++j) idx.push_back(s.offset + j);
  };
  if (scope == prune_scope::global) {
    for (std::size_t i = 0; i < layout.size(); ++i) {
      if (masks.prunable(i)) group_of(i);
    }
    detail::prune_group(weights, masks.all(), idx, sparsity);
  } else {
    for (std::size_t i = 0; i < layout.size(); ++i) {
      if (!masks.prunable(i)) continue;
      idx.clear();
      group_of(i);
      detail::prune_group(weights, masks.all(), idx, sparsity);
    }
  }
}

/// The pruning policy's options.
struct magnitude_pruning_options {
  cubic_sparsity_schedule schedule{};
  prune_scope scope = prune_scope::global;
  prunable_predicate prunable = prunable_by_default;
};

/// The trainer policy (role weight_constraint): prunes by magnitude on the schedule's steps and
/// keeps every pruned weight at exactly zero after every update (see the top of this file).
class magnitude_pruning {
 public:
  using role = roles::weight_constraint;

  explicit magnitude_pruning(magnitude_pruning_options o = {}) : o_(std::move(o)) {
    o_.schedule.check();
    HONE_REQUIRE(static_cast<bool>(o_.prunable),
                 "hone::compress::magnitude_pruning: the prunable predicate is empty; pass one, "
                 "or leave the default (every tensor but biases and norms).");
  }

  /// Called by the trainer after every applied update. With sharded master weights (hone::zero,
  /// trainer::master_weights_sharded()) a pruning step ranks the whole master weights, gathered
  /// from every rank (collective; 4 bytes per parameter while it ranks them), so every rank
  /// prunes the same weights; the masks stay whole on every rank and each rank zeroes its shard.
  template <class Trainer>
  void after_update(Trainer& t) {
    auto master = t.master_weights();
    static_assert(std::is_same_v<decltype(master), std::span<float>>,
                  "hone::compress::magnitude_pruning: the trainer's master weights are not in host "
                  "memory (a CUDA model); pruning masks are applied on the host only.");
    if (masks_.empty()) masks_ = mask_arena(t.layout(), o_.prunable);
    const std::uint64_t step = t.steps_done();
    const double s = o_.schedule.at(step);
    if (s > level_) {  // a pruning step (the schedule is constant between them)
      if (t.master_weights_sharded()) {
        std::vector<float> whole(t.layout().total());
        t.gather_master_weights(whole);
        magnitude_prune(whole, masks_, s, o_.scope);
      } else {
        magnitude_prune(master, masks_, s, o_.scope);
      }
      level_ = s;
    }
    masks_.apply(master, t.master_weights_offset());
    if (!t.zero_copy()) t.publish_weights();
  }

  [[nodiscard]] const magnitude_pruning_options& options() const noexcept { return o_; }
  /// The masks (empty until the first update, or a restore, builds them on the trainer's layout).
  [[nodiscard]] const mask_arena& masks() const noexcept { return masks_; }
  [[nodiscard]] mask_arena& masks() noexcept { return masks_; }
  /// The sparsity the masks were last pruned to (the schedule's value at that step).
  [[nodiscard]] double level() const noexcept { return level_; }
  /// Restores the pruning state (prune_checkpoint.hpp).
  void restore(mask_arena masks, double level) {
    masks_ = std::move(masks);
    level_ = level;
  }

 private:
  magnitude_pruning_options o_;
  mask_arena masks_;
  double level_ = 0.0;
};

}  // namespace compress
HONE_NAMESPACE_END
