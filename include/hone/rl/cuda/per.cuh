// hone/rl/cuda/per.cuh: prioritized replay with the priorities on the GPU.
//
// hone::device_prioritized_sampler<Arity> keeps the sum tree (float leaves, double sums, float
// min tree, the same layout as hone::sum_tree<Arity>), the generation tags (the key of the item in
// each slot) and the running maximum in device memory, and never rebuilds it:
//   insert(keys)          new items at the running max
//   update(keys, raw)     p = (raw + epsilon)^alpha for the keys still current (a key whose slot
//                         was rewritten since it was sampled is ignored)
//   sample(uniforms)      stratified descent, one thread per sample, O(B log N) work; writes the
//                         keys and the importance weights (p / p_min)^-beta
// A batch of B writes (insert or update) runs on as many blocks as B needs, in O(B log N) work:
//   1. one thread per entry decides whether it applies (and with which priority) and emits the
//      pair (slot, position in the batch); skipped entries get the slot `capacity`, which sorts
//      last; each block reduces its largest new priority with cub::BlockReduce;
//   2. cub::DeviceRadixSort sorts the pairs by slot (over the bit width of `capacity` only). The
//      sort is stable, so the entries for one slot stay in batch order and the last of each run
//      is the last write of the batch: only it writes the leaf (and, for inserts, the tag), as the
//      CPU tree's set_batch does ("a slot written twice in one batch keeps its last value");
//   3. the touched entries of each level, bottom up, one launch per level: the sorted slots give
//      sorted entries, so the first thread of each run of equal entries recomputes that entry
//      from its children (each entry once, no atomics, no race);
//   4. one block recomputes the total and the smallest priority, and folds the blocks' maxima
//      into the running maximum (an update's maximum counts every applied entry, overwritten or
//      not, as on the CPU).
// No call synchronizes with the host. Every sum is recomputed from its children by the very
// functions the CPU tree runs (hone/rl/sum_tree.hpp), never adjusted by a delta, so the GPU tree
// and the CPU tree given the same operations hold the same bits and, fed the same uniforms, pick
// the same items (tests/rl/test_rl_gpu.cu). That needs IEEE single precision in the device code
// (no --use_fast_math, -ftz=true, -prec-div=false or -prec-sqrt=false; see
// hone/core/cuda/math_mode.cuh). Invalid raw priorities (negative, NaN, infinite) cannot throw on
// the device: they are ignored like stale keys. Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <limits>
#include <string>
#include <vector>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/cuda/block_reduce.cuh"
#include "hone/core/cuda/error.hpp"
#include "hone/core/error.hpp"
#include "hone/rl/prioritized_sampler.hpp"
#include "hone/rl/sum_tree.hpp"

HONE_NAMESPACE_BEGIN

namespace detail {

/// The scalars the kernels share: the total and the smallest positive priority (for sampling)
/// and the running maximum (for inserts).
struct per_device_scalars {
  double total;
  float min;
  float max_priority;
};

template <std::size_t Arity>
struct per_device_view {
  sum_tree_layout layout;
  float* leaves;
  double* sums;
  float* mins;
  std::uint64_t* tags;
  per_device_scalars* scalars;
};

inline constexpr std::uint64_t per_empty_tag = ~std::uint64_t{0};
/// Threads per block of the write kernels (one thread per batch entry).
inline constexpr int per_write_threads = 256;

enum class per_write_mode : int { insert, update };

/// std::max(a, b) on the device: a unless a < b (a NaN running maximum stays NaN, as on the CPU).
struct per_max {
  HONE_HOST_DEVICE float operator()(float a, float b) const { return a < b ? b : a; }
};

// Entry e of level l from its children (the CPU tree's recompute, on the device).
template <std::size_t Arity>
HONE_HOST_DEVICE void per_recompute(const per_device_view<Arity>& v, std::size_t l, std::size_t e) {
  double* s = v.sums + v.layout.offset[l];
  float* m = v.mins + v.layout.offset[l];
  if (l + 1 == v.layout.depth) {
    const float* c = v.leaves + e * Arity;
    s[e] = node_sum_scalar<Arity>(c);
    m[e] = node_min_scalar<Arity, true>(c);
  } else {
    const std::size_t child = v.layout.offset[l + 1] + e * Arity;
    s[e] = node_sum_scalar<Arity>(v.sums + child);
    m[e] = node_min_scalar<Arity, false>(v.mins + child);
  }
}

template <std::size_t Arity>
HONE_HOST_DEVICE void per_recompute_top(const per_device_view<Arity>& v) {
  v.scalars->total = node_sum_scalar<Arity>(v.sums);
  v.scalars->min = node_min_scalar<Arity, false>(v.mins);
}

// The entry of level l above leaf `slot`: slot / Arity^(depth - l).
template <std::size_t Arity>
HONE_HOST_DEVICE std::uint64_t per_entry(const per_device_view<Arity>& v, std::uint64_t slot,
                                         std::size_t l) {
  std::uint64_t e = slot / Arity;
  for (std::size_t up = v.layout.depth - 1; up > l; --up) e /= Arity;
  return e;
}

// The work of one thread of each step of a write batch (the kernels below run them on the device;
// tests/rl/test_rl_per_steps.cu runs them on the host, in the same order, to check the algorithm
// where no GPU is present).

/// Step 1 for entry i < n: whether it applies and with which priority (`value[i]`), and its sort
/// pair (the slot, or `capacity` when skipped; i). Returns the priority an update applies (-inf
/// when none: inserts, skipped entries).
template <std::size_t Arity>
HONE_HOST_DEVICE float per_decide(const per_device_view<Arity>& v, const std::uint64_t* keys,
                                  const float* raw, std::size_t i, per_write_mode mode,
                                  double epsilon, double alpha, std::uint64_t* sort_slots,
                                  std::uint32_t* positions, float* value) {
  const std::uint64_t cap = v.layout.capacity;
  const std::uint64_t key = keys[i];
  const std::uint64_t s = key % cap;
  bool ok = key != per_empty_tag;
  float p = v.scalars->max_priority;  // an insert enters at the running max
  float applied = -std::numeric_limits<float>::infinity();
  if (mode == per_write_mode::update) {
    const float r = raw[i];
    ok = ok && v.tags[s] == key && r >= 0.0f &&  // NaN fails both comparisons
         r <= std::numeric_limits<float>::max();
    if (ok) {
      p = per_priority(r, epsilon, alpha);
      applied = p;
    }
  }
  sort_slots[i] = ok ? s : cap;
  positions[i] = static_cast<std::uint32_t>(i);
  value[i] = p;
  return applied;
}

/// Step 2 for sorted pair j < n: the last pair of each run of one slot (the batch's last write of
/// that slot) writes the leaf, and an insert's tag.
template <std::size_t Arity>
HONE_HOST_DEVICE void per_scatter(const per_device_view<Arity>& v,
                                  const std::uint64_t* sorted_slots,
                                  const std::uint32_t* sorted_positions, const float* value,
                                  const std::uint64_t* keys, std::size_t n, per_write_mode mode,
                                  std::size_t j) {
  const std::uint64_t s = sorted_slots[j];
  if (s == v.layout.capacity) return;                 // skipped entries sort last
  if (j + 1 < n && sorted_slots[j + 1] == s) return;  // a later entry of the batch writes it
  const std::uint32_t i = sorted_positions[j];
  v.leaves[s] = value[i];
  if (mode == per_write_mode::insert) v.tags[s] = keys[i];
}

/// Step 3 for level l and sorted pair j < n: the first pair of each run of one entry of level l
/// recomputes that entry (so each touched entry once, by one thread).
template <std::size_t Arity>
HONE_HOST_DEVICE void per_level(const per_device_view<Arity>& v, const std::uint64_t* sorted_slots,
                                std::size_t l, std::size_t j) {
  const std::uint64_t s = sorted_slots[j];
  if (s == v.layout.capacity) return;
  const std::uint64_t e = per_entry(v, s, l);
  // sorted_slots[j - 1] is a real slot: the skipped ones sort after every real one.
  if (j > 0 && per_entry(v, sorted_slots[j - 1], l) == e) return;
  per_recompute(v, l, static_cast<std::size_t>(e));
}

/// Step 4, once: the top, and the running maximum folded with the batch's largest update `m`.
template <std::size_t Arity>
HONE_HOST_DEVICE void per_finish(const per_device_view<Arity>& v, float m, per_write_mode mode) {
  per_recompute_top(v);
  if (mode == per_write_mode::update) {
    v.scalars->max_priority = per_max{}(v.scalars->max_priority, m);
  }
}

// Step 1 on the device, one thread per entry; each block's largest applied priority (-inf when
// none) goes to block_max[blockIdx.x]. Launched with per_write_threads threads per block.
template <std::size_t Arity>
__global__ void __launch_bounds__(per_write_threads)
    per_decide_kernel(per_device_view<Arity> v, const std::uint64_t* keys, const float* raw,
                      std::size_t n, per_write_mode mode, double epsilon, double alpha,
                      std::uint64_t* sort_slots, std::uint32_t* positions, float* value,
                      float* block_max) {
  using reduce = block_reduce<float, per_write_threads>;
  __shared__ typename reduce::storage storage;
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  float applied = -std::numeric_limits<float>::infinity();
  if (i < n) {
    applied = per_decide(v, keys, raw, i, mode, epsilon, alpha, sort_slots, positions, value);
  }
  const float m = reduce(storage).reduce(applied, per_max{});  // every thread takes part
  if (threadIdx.x == 0) block_max[blockIdx.x] = m;
}

// Step 2 on the device, one thread per sorted pair.
template <std::size_t Arity>
__global__ void __launch_bounds__(per_write_threads)
    per_scatter_kernel(per_device_view<Arity> v, const std::uint64_t* sorted_slots,
                       const std::uint32_t* sorted_positions, const float* value,
                       const std::uint64_t* keys, std::size_t n, per_write_mode mode) {
  const std::size_t j = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (j < n) per_scatter(v, sorted_slots, sorted_positions, value, keys, n, mode, j);
}

// Step 3 on the device: one launch per level l (bottom up), one thread per sorted pair.
template <std::size_t Arity>
__global__ void __launch_bounds__(per_write_threads)
    per_level_kernel(per_device_view<Arity> v, const std::uint64_t* sorted_slots, std::size_t n,
                     std::size_t l) {
  const std::size_t j = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (j < n) per_level(v, sorted_slots, l, j);
}

// Step 4 on the device, one block of per_write_threads: the blocks' maxima reduced, then
// per_finish.
template <std::size_t Arity>
__global__ void __launch_bounds__(per_write_threads)
    per_finish_kernel(per_device_view<Arity> v, const float* block_max, std::size_t blocks,
                      per_write_mode mode) {
  using reduce = block_reduce<float, per_write_threads>;
  __shared__ typename reduce::storage storage;
  float m = -std::numeric_limits<float>::infinity();
  for (std::size_t b = threadIdx.x; b < blocks; b += blockDim.x) m = per_max{}(m, block_max[b]);
  m = reduce(storage).reduce(m, per_max{});
  if (threadIdx.x == 0) per_finish(v, m, mode);
}

// One thread per sample: the CPU sampler's stratified target and descent.
template <std::size_t Arity>
__global__ void per_sample_kernel(per_device_view<Arity> v, const double* uniforms, std::size_t n,
                                  float neg_beta, std::uint64_t* keys, std::size_t* slots,
                                  float* weights) {
  const std::size_t s = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (s >= n) return;
  const double total = v.scalars->total;
  if (!(total > 0.0)) {  // nothing can be sampled: an invalid key and weight 0
    keys[s] = per_empty_tag;
    if (slots != nullptr) slots[s] = ~std::size_t{0};
    weights[s] = 0.0f;
    return;
  }
  double u = stratified_target(s, uniforms[s], total, n);
  std::size_t node = 0;
  for (std::size_t l = 0; l < v.layout.depth; ++l) {
    node = node * Arity + find_child_scalar<Arity>(v.sums + v.layout.offset[l] + node * Arity, u);
  }
  const std::size_t leaf = node * Arity + find_child_scalar<Arity>(v.leaves + node * Arity, u);
  keys[s] = v.tags[leaf];
  if (slots != nullptr) slots[s] = leaf;
  weights[s] = per_weight(v.leaves[leaf], 1.0f / v.scalars->min, neg_beta);
}

// Full rebuild of one level (assign): one thread per entry.
template <std::size_t Arity>
__global__ void per_rebuild_level_kernel(per_device_view<Arity> v, std::size_t l) {
  const std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (e < v.layout.used[l]) per_recompute(v, l, e);
}
template <std::size_t Arity>
__global__ void per_rebuild_top_kernel(per_device_view<Arity> v) {
  per_recompute_top(v);
}

}  // namespace detail

/// Prioritized replay sampler with its sum tree in device memory (see the top of this file). The
/// caller owns the keys (a replay storage's sequence numbers: the item with key k lives in slot
/// k % capacity). Not thread-safe; calls on one stream are ordered. The tree and the scratch of the
/// write batches are shared by all calls, so calls on different streams must be ordered by the
/// caller (an event), as writes to any shared device array would be.
template <std::size_t Arity = 16>
class device_prioritized_sampler {
 public:
  using config_type = prioritized<Arity>;

  device_prioritized_sampler(std::size_t capacity, const config_type& config = {})
      : config_(config),
        layout_(detail::sum_tree_layout::make(Arity, capacity)),
        leaves_(layout_.leaves),
        sums_(layout_.entries),
        mins_(layout_.entries),
        tags_(capacity),
        scalars_(1) {
    prioritized_sampler<Arity> check(1, config);  // validates the configuration, throws
    (void)check;
    HONE_CUDA_CHECK(cudaMemset(leaves_.data(), 0, leaves_.size_bytes()));
    HONE_CUDA_CHECK(cudaMemset(sums_.data(), 0, sums_.size_bytes()));
    HONE_CUDA_CHECK(cudaMemset(tags_.data(), 0xFF, tags_.size_bytes()));
    const std::vector<float> inf(layout_.entries, std::numeric_limits<float>::infinity());
    HONE_CUDA_CHECK(
        cudaMemcpy(mins_.data(), inf.data(), mins_.size_bytes(), cudaMemcpyHostToDevice));
    const detail::per_device_scalars s{0.0, std::numeric_limits<float>::infinity(),
                                       static_cast<float>(config.initial_priority)};
    HONE_CUDA_CHECK(cudaMemcpy(scalars_.data(), &s, sizeof(s), cudaMemcpyHostToDevice));
    // The set-up ran on the default stream; calls may come on a non-blocking stream, which is not
    // ordered after it.
    HONE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }

  [[nodiscard]] std::size_t capacity() const noexcept { return layout_.capacity; }
  [[nodiscard]] const detail::sum_tree_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] const config_type& config() const noexcept { return config_; }

  /// New items (device array of n keys; slot = key % capacity) at the running maximum priority.
  void insert(const std::uint64_t* keys, std::size_t n, cudaStream_t stream = nullptr) {
    write(keys, nullptr, n, detail::per_write_mode::insert, stream);
  }
  /// Priorities (raw values, e.g. |TD error|; device arrays of n) for the keys still current.
  void update(const std::uint64_t* keys, const float* raw, std::size_t n,
              cudaStream_t stream = nullptr) {
    write(keys, raw, n, detail::per_write_mode::update, stream);
  }

  /// n stratified samples from n uniforms in [0, 1) (device array): the keys, optionally the
  /// slots, and the importance weights. One sample call: beta advances one step.
  void sample(const double* uniforms, std::size_t n, std::uint64_t* keys, float* weights,
              std::size_t* slots = nullptr, cudaStream_t stream = nullptr) {
    if (n == 0) return;
    const auto neg_beta = static_cast<float>(-beta());
    constexpr int threads = 256;
    const auto blocks = static_cast<unsigned>((n + threads - 1) / threads);
    detail::per_sample_kernel<Arity>
        <<<blocks, threads, 0, stream>>>(view(), uniforms, n, neg_beta, keys, slots, weights);
    check_last_launch("hone::device_prioritized_sampler::sample (per_sample_kernel)");
    ++steps_;
  }

  /// Replaces every priority and tag (device arrays of capacity() entries) and rebuilds the tree
  /// level by level: loading a saved buffer, not a per-step operation.
  void assign(const float* priorities, const std::uint64_t* tags, float max_priority,
              cudaStream_t stream = nullptr) {
    HONE_CUDA_CHECK(cudaMemsetAsync(leaves_.data(), 0, leaves_.size_bytes(), stream));
    HONE_CUDA_CHECK(cudaMemcpyAsync(leaves_.data(), priorities, capacity() * sizeof(float),
                                    cudaMemcpyDeviceToDevice, stream));
    HONE_CUDA_CHECK(cudaMemcpyAsync(tags_.data(), tags, capacity() * sizeof(std::uint64_t),
                                    cudaMemcpyDeviceToDevice, stream));
    for (std::size_t l = layout_.depth; l-- > 0;) {
      constexpr int threads = 256;
      const auto blocks = static_cast<unsigned>((layout_.used[l] + threads - 1) / threads);
      detail::per_rebuild_level_kernel<Arity><<<blocks, threads, 0, stream>>>(view(), l);
      check_last_launch("hone::device_prioritized_sampler::assign (per_rebuild_level_kernel)");
    }
    detail::per_rebuild_top_kernel<Arity><<<1, 1, 0, stream>>>(view());
    check_last_launch("hone::device_prioritized_sampler::assign (per_rebuild_top_kernel)");
    HONE_CUDA_CHECK(cudaMemcpyAsync(&scalars_.data()->max_priority, &max_priority, sizeof(float),
                                    cudaMemcpyHostToDevice, stream));
    HONE_CUDA_CHECK(cudaStreamSynchronize(stream));  // max_priority lives on this stack frame
  }

  /// The current importance-weight exponent (host-side schedule, as the CPU sampler's).
  [[nodiscard]] double beta() const noexcept {
    const double t =
        config_.beta_steps == 0
            ? 1.0
            : std::min(1.0, static_cast<double>(steps_) / static_cast<double>(config_.beta_steps));
    return config_.beta + (config_.beta_final - config_.beta) * t;
  }
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  void set_steps(std::uint64_t s) noexcept { steps_ = s; }

  // Device arrays (for tests and for saving).
  [[nodiscard]] const float* leaves() const noexcept { return leaves_.data(); }
  [[nodiscard]] const double* sums() const noexcept { return sums_.data(); }
  [[nodiscard]] const float* mins() const noexcept { return mins_.data(); }
  [[nodiscard]] const std::uint64_t* tags() const noexcept { return tags_.data(); }
  /// Copies total, min and running max to the host (synchronizes the stream).
  [[nodiscard]] detail::per_device_scalars scalars(cudaStream_t stream = nullptr) const {
    detail::per_device_scalars s{};
    HONE_CUDA_CHECK(
        cudaMemcpyAsync(&s, scalars_.data(), sizeof(s), cudaMemcpyDeviceToHost, stream));
    HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return s;
  }

 private:
  detail::per_device_view<Arity> view() {
    return {layout_, leaves_.data(), sums_.data(), mins_.data(), tags_.data(), scalars_.data()};
  }

  void write(const std::uint64_t* keys, const float* raw, std::size_t n,
             detail::per_write_mode mode, cudaStream_t stream) {
    if (n == 0) return;
    const char* what = mode == detail::per_write_mode::insert
                           ? "hone::device_prioritized_sampler::insert"
                           : "hone::device_prioritized_sampler::update";
    if (n > std::numeric_limits<std::uint32_t>::max()) {
      throw config_error(std::string(what) + ": a batch of " + std::to_string(n) +
                         " entries is more than 2^32 - 1; split it into smaller batches");
    }
    constexpr int threads = detail::per_write_threads;
    const std::size_t blocks = (n + threads - 1) / threads;
    // Slots run from 0 to capacity (the skip mark): only those bits are sorted.
    const int end_bit = static_cast<int>(std::bit_width(static_cast<std::uint64_t>(capacity())));
    std::size_t temp_bytes = 0;
    cub::DoubleBuffer<std::uint64_t> slots(nullptr, nullptr);
    cub::DoubleBuffer<std::uint32_t> positions(nullptr, nullptr);
    HONE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, slots, positions, n, 0,
                                                    end_bit, stream));
    reserve_scratch(n, blocks, temp_bytes);
    slots = cub::DoubleBuffer<std::uint64_t>(scratch_slots_[0].data(), scratch_slots_[1].data());
    positions = cub::DoubleBuffer<std::uint32_t>(scratch_positions_[0].data(),
                                                 scratch_positions_[1].data());
    const auto grid = static_cast<unsigned>(blocks);
    const auto v = view();
    detail::per_decide_kernel<Arity><<<grid, threads, 0, stream>>>(
        v, keys, raw, n, mode, config_.epsilon, config_.alpha, slots.Current(), positions.Current(),
        scratch_values_.data(), scratch_block_max_.data());
    check_last_launch(what);
    // The sort updates the selectors on the host; the sorted pairs are in Current().
    HONE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch_sort_.data(), temp_bytes, slots,
                                                    positions, n, 0, end_bit, stream));
    detail::per_scatter_kernel<Arity><<<grid, threads, 0, stream>>>(
        v, slots.Current(), positions.Current(), scratch_values_.data(), keys, n, mode);
    check_last_launch(what);
    for (std::size_t l = layout_.depth; l-- > 0;) {
      detail::per_level_kernel<Arity><<<grid, threads, 0, stream>>>(v, slots.Current(), n, l);
      check_last_launch(what);
    }
    detail::per_finish_kernel<Arity>
        <<<1, threads, 0, stream>>>(v, scratch_block_max_.data(), blocks, mode);
    check_last_launch(what);
  }

  // Grows the scratch of a write batch (never shrinks it). cudaFree waits for the device, so
  // scratch still in use by an earlier call on any stream is not freed under it.
  void reserve_scratch(std::size_t n, std::size_t blocks, std::size_t temp_bytes) {
    if (scratch_values_.size() < n) {
      for (auto& b : scratch_slots_) b = buffer<std::uint64_t, cuda_space>();
      for (auto& b : scratch_positions_) b = buffer<std::uint32_t, cuda_space>();
      scratch_values_ = buffer<float, cuda_space>();
      for (auto& b : scratch_slots_) b = buffer<std::uint64_t, cuda_space>(n);
      for (auto& b : scratch_positions_) b = buffer<std::uint32_t, cuda_space>(n);
      scratch_values_ = buffer<float, cuda_space>(n);
    }
    if (scratch_block_max_.size() < blocks) {
      scratch_block_max_ = buffer<float, cuda_space>();
      scratch_block_max_ = buffer<float, cuda_space>(blocks);
    }
    if (scratch_sort_.size() < temp_bytes) {
      scratch_sort_ = buffer<unsigned char, cuda_space>();
      scratch_sort_ = buffer<unsigned char, cuda_space>(temp_bytes);
    }
  }

  config_type config_;
  detail::sum_tree_layout layout_;
  buffer<float, cuda_space> leaves_;
  buffer<double, cuda_space> sums_;
  buffer<float, cuda_space> mins_;
  buffer<std::uint64_t, cuda_space> tags_;
  buffer<detail::per_device_scalars, cuda_space> scalars_;
  // Scratch of the write batches: the sort's two key and value buffers, the priorities, the
  // blocks' maxima and cub's temporary storage.
  buffer<std::uint64_t, cuda_space> scratch_slots_[2];
  buffer<std::uint32_t, cuda_space> scratch_positions_[2];
  buffer<float, cuda_space> scratch_values_;
  buffer<float, cuda_space> scratch_block_max_;
  buffer<unsigned char, cuda_space> scratch_sort_;
  std::uint64_t steps_ = 0;
};

HONE_NAMESPACE_END
