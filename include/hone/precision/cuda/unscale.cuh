// hone/precision/cuda/unscale.cuh: the fused unscale pass on the GPU. Include only from .cu files.
//
// The same HONE_HOST_DEVICE functor as the host pass (hone/precision/unscale.hpp,
// unscale_accumulate) runs over (fp32 master gradients, working gradients) tensor lists with the
// chunk table of the CUDA multi-tensor apply (hone/core/cuda/multi_tensor_apply.cuh): each CUDA
// block unscales one chunk of one tensor, accumulates into the master gradients and sums the
// squares of the new master values in double; a second one-block kernel adds the per-block
// partials in a fixed order. Everything stays on the device:
//  - *sum_sq: the sum of squares of the master gradients after the pass (the host pass's return
//    value), so the L2 clipping norm costs no extra pass;
//  - *found_inf: set to 1 when that sum is non-finite, i.e. when some gradient was inf or NaN
//    (never cleared here: zero it at the start of a step, as PyTorch's GradScaler does);
//  - optionally *norm = sqrt(sum_sq) as float and *clip_coefficient = min(1, max_norm /
//    (norm + 1e-6)) (1 when non-finite): PyTorch's clip_grad_norm_ coefficient, which the CUDA
//    optimizer steps take as device_grad_scale.
// The optimizer kernels read found_inf and skip in-kernel: no host synchronization between the
// check and the update. The reduction is deterministic: fixed chunking, the block sums of
// cub::BlockReduce in the fixed order of hone/core/cuda/block_reduce.cuh, no atomics.
// The master gradients are the host pass's bit for bit (the functor rounds every operation on the
// device, no FMA contraction); the sum differs from the host's only by summation order.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/cuda/block_reduce.cuh"
#include "hone/core/cuda/error.hpp"
#include "hone/core/cuda/multi_tensor_apply.cuh"
#include "hone/core/cuda/space.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/precision/unscale.hpp"

HONE_NAMESPACE_BEGIN

/// Scratch memory of the device unscale pass: one double per chunk of the lists (grown on demand;
/// one workspace per stream that runs passes concurrently).
class unscale_workspace {
 public:
  unscale_workspace() = default;
  /// Room for `parts` partial sums (reallocates only when it grows).
  double* partials(std::size_t parts) {
    if (parts > partials_.size()) partials_ = buffer<double, cuda_space>(parts);
    return partials_.data();
  }

 private:
  buffer<double, cuda_space> partials_;
};

/// Optional outputs of the device unscale pass (device pointers; null ones are not written).
struct unscale_outputs {
  double* sum_sq = nullptr;
  int* found_inf = nullptr;
  float* norm = nullptr;
  float* clip_coefficient = nullptr;  // written when max_norm > 0
  float max_norm = 0.0f;
};

namespace detail {

inline constexpr int unscale_threads = 512;
using unscale_block_reduce = block_reduce<double, unscale_threads>;

template <class Op, int MaxTensors, class G>
__global__ void __launch_bounds__(unscale_threads)
    unscale_partial_kernel(multi_tensor_meta<2, MaxTensors> meta, Op op, int chunk,
                           double* partials) {
  __shared__ unscale_block_reduce::storage shared;
  const int t = meta.tensor[blockIdx.x];
  const std::int64_t begin = static_cast<std::int64_t>(meta.chunk[blockIdx.x]) * chunk;
  const std::int64_t rest = meta.size[t] - begin;
  const std::int64_t len = rest < chunk ? rest : chunk;
  float* master = static_cast<float*>(meta.ptr[0][t]) + begin;
  const G* grad = static_cast<const G*>(meta.ptr[1][t]) + begin;
  double acc = 0.0;
  for (std::int64_t i = threadIdx.x; i < len; i += unscale_threads) {
    float m = master[i];
    acc += op(m, grad[i]);
    master[i] = m;
  }
  const double block_sum = unscale_block_reduce(shared).sum(acc);  // valid in thread 0
  if (threadIdx.x == 0) partials[blockIdx.x] = block_sum;
}

// A template (as every kernel of a header must be) so that several .cu files of one program can
// include this header: a plain __global__ function would be defined once per file.
template <int Threads = unscale_threads>
__global__ void __launch_bounds__(Threads)
    unscale_final_kernel(const double* partials, std::int64_t parts, unscale_outputs out) {
  static_assert(Threads == unscale_threads,
                "hone::detail::unscale_final_kernel: launch it with unscale_threads threads, the "
                "block size of its reduction");
  __shared__ unscale_block_reduce::storage shared;
  double acc = 0.0;
  for (std::int64_t i = threadIdx.x; i < parts; i += unscale_threads) acc += partials[i];
  const double total = unscale_block_reduce(shared).sum(acc);  // valid in thread 0
  if (threadIdx.x != 0) return;
  const bool finite = isfinite(total);
  if (out.sum_sq != nullptr) *out.sum_sq = total;
  if (!finite && out.found_inf != nullptr) *out.found_inf = 1;
  const float norm = static_cast<float>(sqrt(total));
  if (out.norm != nullptr) *out.norm = norm;
  if (out.clip_coefficient != nullptr && out.max_norm > 0.0f) {
    const float coef = out.max_norm / (norm + 1e-6f);  // clip_grad_norm::finish, in float
    *out.clip_coefficient = (finite && coef < 1.0f) ? coef : 1.0f;
  }
}

template <class Op, class G>
void launch_unscale(cuda_exec exec, const tensor_lists<float, const G>& lists, const Op& op,
                    unscale_workspace& ws, const unscale_outputs& out, int chunk) {
  constexpr int max_tensors = multi_tensor_max_tensors<2>;
  using meta_t = multi_tensor_meta<2, max_tensors>;
  const auto per = static_cast<std::size_t>(chunk);
  std::size_t parts = 0;
  for (std::size_t t = 0; t < lists.size(); ++t) parts += (lists.numel(t) + per - 1) / per;
  double* partials = ws.partials(parts == 0 ? 1 : parts);
  std::size_t done = 0;  // partials written by earlier launches
  meta_t meta{};
  int slot = 0;
  int blocks = 0;
  auto set_slot = [&](int s, std::size_t t) {
    meta.ptr[0][s] = static_cast<void*>(lists.template pointer<0>(t));
    meta.ptr[1][s] = const_cast<void*>(static_cast<const void*>(lists.template pointer<1>(t)));
    meta.size[s] = static_cast<std::int64_t>(lists.numel(t));
  };
  auto launch = [&] {
    unscale_partial_kernel<Op, max_tensors, G>
        <<<blocks, unscale_threads, 0, exec.stream>>>(meta, op, chunk, partials + done);
    check_last_launch("hone::unscale_accumulate_into(cuda_exec): unscale_partial_kernel launch");
    done += static_cast<std::size_t>(blocks);
    blocks = 0;
  };
  for (std::size_t t = 0; t < lists.size(); ++t) {
    set_slot(slot, t);
    const std::size_t chunks = (lists.numel(t) + per - 1) / per;
    for (std::size_t c = 0; c < chunks; ++c) {
      meta.tensor[blocks] = static_cast<unsigned char>(slot);
      meta.chunk[blocks] = static_cast<int>(c);
      ++blocks;
      const bool last_chunk = c + 1 == chunks;
      const bool tensors_full = last_chunk && slot + 1 == max_tensors;
      const bool blocks_full = blocks == multi_tensor_max_blocks;
      const bool everything = last_chunk && t + 1 == lists.size();
      if (tensors_full || blocks_full || everything) {
        launch();
        if (last_chunk) {
          slot = -1;
        } else {
          set_slot(0, t);
          slot = 0;
        }
      }
    }
    ++slot;
  }
  if (done == 0) {  // nothing to unscale: the sum is 0
    HONE_CUDA_CHECK(cudaMemsetAsync(partials, 0, sizeof(double), exec.stream));
    done = 1;
  }
  unscale_final_kernel<>
      <<<1, unscale_threads, 0, exec.stream>>>(partials, static_cast<std::int64_t>(done), out);
  check_last_launch("hone::unscale_accumulate_into(cuda_exec): unscale_final_kernel launch");
}

}  // namespace detail

/// The fused unscale pass on `exec.stream` (see the file comment): master = factor * g (or
/// master += factor * g with `accumulate`) over (master gradients, working gradients) lists in
/// device memory, with the sum of squares, the inf/NaN flag and the clipping coefficient left in
/// device memory through `out`. Asynchronous.
template <class G>
void unscale_accumulate_into(cuda_exec exec, const tensor_lists<float, const G>& lists,
                             float factor, bool accumulate, unscale_workspace& ws,
                             const unscale_outputs& out, multi_tensor_tuning tuning = {}) {
  HONE_REQUIRE(tuning.chunk > 0,
               "hone::unscale_accumulate_into(cuda_exec): the chunk size must be positive");
  if (accumulate) {
    detail::launch_unscale(exec, lists, unscale_accumulate<G, true>{factor}, ws, out, tuning.chunk);
  } else {
    detail::launch_unscale(exec, lists, unscale_accumulate<G, false>{factor}, ws, out,
                           tuning.chunk);
  }
}

HONE_NAMESPACE_END
