// hone/rl/cuda/per.cuh: prioritized replay with the priorities on the GPU.
//
// hone::device_prioritized_sampler<Arity> keeps the sum tree (float leaves, double sums, float
// min tree, the same layout as hone::sum_tree<Arity>), the generation tags (the key of the item in
// each slot) and the running maximum in device memory, and never rebuilds it:
//   insert(keys)          new items at the running max: one block, O(B log N) work
//   update(keys, raw)     p = (raw + epsilon)^alpha for the keys still current (a key whose slot
//                         was rewritten since it was sampled is ignored), last occurrence wins:
//                         one block, the B paths recomputed level by level (__syncthreads between
//                         levels), O(B log N) work
//   sample(uniforms)      stratified descent, one thread per sample, O(B log N) work; writes the
//                         keys and the importance weights (p / p_min)^-beta
// No call synchronizes with the host. The reductions and the in-node search are the very
// functions the CPU tree runs (hone/rl/sum_tree.hpp), so the GPU tree and the CPU tree given the
// same operations hold the same bits and, fed the same uniforms, pick the same items
// (tests/rl/test_rl_gpu.cu). Invalid raw priorities (negative, NaN, infinite) cannot throw on the
// device: they are ignored like stale keys. Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
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
inline constexpr int per_update_threads = 1024;

// Entry e of level l from its children (the CPU tree's recompute, on the device).
template <std::size_t Arity>
__device__ inline void per_recompute(const per_device_view<Arity>& v, std::size_t l,
                                     std::size_t e) {
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
__device__ inline void per_recompute_top(const per_device_view<Arity>& v) {
  v.scalars->total = node_sum_scalar<Arity>(v.sums);
  v.scalars->min = node_min_scalar<Arity, false>(v.mins);
}

// Leaves: the slots (or ~0 to skip) and values of one batch, already decided by each thread.
// Recomputes the touched paths level by level; one block, __syncthreads between levels.
template <std::size_t Arity>
__device__ inline void per_recompute_paths(const per_device_view<Arity>& v, const std::size_t* slot,
                                           std::size_t n) {
  for (std::size_t l = v.layout.depth; l-- > 0;) {
    // The level's entry of item i: slot / Arity^(depth - l).
    for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) {
      if (slot[i] == ~std::size_t{0}) continue;
      std::size_t e = slot[i] / Arity;
      for (std::size_t up = v.layout.depth - 1; up > l; --up) e /= Arity;
      per_recompute(v, l, e);  // several threads may write one entry: the same value
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) per_recompute_top(v);
}

// One block. mode 0: insert (keys name new items; they enter at the running max); mode 1: update
// (keys whose tag matches get (raw + epsilon)^alpha). `slot` is scratch of n entries.
template <std::size_t Arity>
__global__ void per_write_kernel(per_device_view<Arity> v, const std::uint64_t* keys,
                                 const float* raw, std::size_t n, int mode, double epsilon,
                                 double alpha, std::size_t* slot, float* value) {
  __shared__ float block_max[per_update_threads];
  const std::size_t cap = v.layout.capacity;
  const float start_max = v.scalars->max_priority;
  float local_max = 0.0f;
  // 1. Which items apply, and with which value.
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) {
    const std::uint64_t key = keys[i];
    const auto s = static_cast<std::size_t>(key % cap);
    bool ok = key != per_empty_tag;
    float p = start_max;
    if (mode == 1) {
      const float r = raw[i];
      ok = ok && v.tags[s] == key && r >= 0.0f &&  // NaN fails both comparisons
           r <= std::numeric_limits<float>::max();
      if (ok) {
        p = per_priority(r, epsilon, alpha);
        local_max = p > local_max ? p : local_max;
      }
    }
    slot[i] = ok ? s : ~std::size_t{0};
    value[i] = p;
  }
  block_max[threadIdx.x] = local_max;
  __syncthreads();
  // 2. A slot written twice in one batch keeps its last value (as the CPU tree does).
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) {
    const std::size_t s = slot[i];
    if (s == ~std::size_t{0}) continue;
    bool last = true;
    for (std::size_t j = i + 1; j < n && last; ++j) last = slot[j] != s;
    if (last) {
      v.leaves[s] = value[i];
      if (mode == 0) v.tags[s] = keys[i];
    }
  }
  for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w && block_max[threadIdx.x + w] > block_max[threadIdx.x]) {
      block_max[threadIdx.x] = block_max[threadIdx.x + w];
    }
    __syncthreads();
  }
  __syncthreads();
  // 3. Paths, level by level.
  per_recompute_paths(v, slot, n);
  if (threadIdx.x == 0 && block_max[0] > start_max) v.scalars->max_priority = block_max[0];
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
/// k % capacity). Not thread-safe; calls on one stream are ordered.
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
    write(keys, nullptr, n, 0, stream);
  }
  /// Priorities (raw values, e.g. |TD error|; device arrays of n) for the keys still current.
  void update(const std::uint64_t* keys, const float* raw, std::size_t n,
              cudaStream_t stream = nullptr) {
    write(keys, raw, n, 1, stream);
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

  void write(const std::uint64_t* keys, const float* raw, std::size_t n, int mode,
             cudaStream_t stream) {
    if (n == 0) return;
    if (scratch_slots_.size() < n) {
      scratch_slots_ = buffer<std::size_t, cuda_space>(n);
      scratch_values_ = buffer<float, cuda_space>(n);
    }
    const int threads =
        static_cast<int>(std::min<std::size_t>(detail::per_update_threads, (n + 31) / 32 * 32));
    int block = 32;
    while (block < threads) block *= 2;  // the max reduction wants a power of two
    detail::per_write_kernel<Arity>
        <<<1, block, 0, stream>>>(view(), keys, raw, n, mode, config_.epsilon, config_.alpha,
                                  scratch_slots_.data(), scratch_values_.data());
    check_last_launch(mode == 0 ? "hone::device_prioritized_sampler::insert (per_write_kernel)"
                                : "hone::device_prioritized_sampler::update (per_write_kernel)");
  }

  config_type config_;
  detail::sum_tree_layout layout_;
  buffer<float, cuda_space> leaves_;
  buffer<double, cuda_space> sums_;
  buffer<float, cuda_space> mins_;
  buffer<std::uint64_t, cuda_space> tags_;
  buffer<detail::per_device_scalars, cuda_space> scalars_;
  buffer<std::size_t, cuda_space> scratch_slots_;
  buffer<float, cuda_space> scratch_values_;
  std::uint64_t steps_ = 0;
};

HONE_NAMESPACE_END
