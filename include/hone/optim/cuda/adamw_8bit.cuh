// hone/optim/cuda/adamw_8bit.cuh: 8-bit AdamW on the GPU. Include only from .cu files.
//
// Small slots (fp32 moments) run adamw_functor through the CUDA multi-tensor apply, as
// hone::adamw does. Quantized slots run a block-wise kernel (bitsandbytes'
// kOptimizerStatic8bit2StateBlockwise scheme): each CUDA block takes one quantization block at a
// time, decodes both moments through the maps held in shared memory, applies the AdamW update of
// adamw_coefficients::update (the host's math), reduces the new absmax of both moments over the
// block in one cub::BlockReduce (hone/core/cuda/block_reduce.cuh) and encodes again with
// quantize_keep_sign / quantize_nearest (the host's functions). The maps and the slot
// table travel in the kernel arguments: no device allocation, no host synchronization.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/cuda/block_reduce.cuh"
#include "hone/core/cuda/error.hpp"
#include "hone/core/cuda/multi_tensor_apply.cuh"
#include "hone/core/cuda/space.hpp"
#include "hone/optim/adamw_8bit.hpp"
#include "hone/optim/cuda/common.cuh"
#include "hone/optim/quantization.hpp"

HONE_NAMESPACE_BEGIN
namespace detail {

inline constexpr int adamw8_max_slots = 32;
inline constexpr int adamw8_max_grid = 8192;

/// Quantized slots of one launch; block_begin is the prefix sum of their quantization blocks.
struct adamw8_table {
  std::int64_t offset[adamw8_max_slots];
  std::int64_t count[adamw8_max_slots];
  std::int64_t code_offset[adamw8_max_slots];
  std::int64_t absmax_offset[adamw8_max_slots];
  std::int64_t block_begin[adamw8_max_slots + 1];
  int slots;
};

struct adamw8_maps {
  float signed_map[256];
  float unsigned_map[256];
};

/// The absmax of both moments of one quantization block, reduced together.
struct adamw8_absmax {
  float m;
  float v;
};

/// optim_max per moment: the host's combining function (hone/optim/adamw_8bit.hpp).
struct adamw8_absmax_max {
  __device__ __forceinline__ adamw8_absmax operator()(const adamw8_absmax& a,
                                                      const adamw8_absmax& b) const {
    return {optim_max(a.m, b.m), optim_max(a.v, b.v)};
  }
};

template <class G, int Threads, int PerThread>
__global__ void __launch_bounds__(Threads)
    adamw_8bit_kernel(adamw8_table table, adamw8_maps maps, adamw_functor<G> op, float* master,
                      const G* grad, std::uint8_t* codes_m, std::uint8_t* codes_v, float* absmax_m,
                      float* absmax_v, int block, std::int64_t total_blocks, const int* found_inf,
                      const float* device_grad_scale) {
  __shared__ float smap[256];
  __shared__ float umap[256];
  using absmax_reduce = block_reduce<adamw8_absmax, Threads>;
  __shared__ typename absmax_reduce::storage absmax_storage;
  if (found_inf != nullptr && *found_inf != 0) return;  // the same for every thread
  for (int t = threadIdx.x; t < 256; t += Threads) {
    smap[t] = maps.signed_map[t];
    umap[t] = maps.unsigned_map[t];
  }
  adamw_functor<G> f = op;
  if (device_grad_scale != nullptr) f.scale_grads(*device_grad_scale);
  __syncthreads();

  for (std::int64_t qb = blockIdx.x; qb < total_blocks; qb += gridDim.x) {
    int s = 0;
    while (s + 1 < table.slots && table.block_begin[s + 1] <= qb) ++s;
    const std::int64_t b = qb - table.block_begin[s];
    const std::int64_t base = b * block;
    const std::int64_t rest = table.count[s] - base;
    float* p = master + table.offset[s] + base;
    const G* g = grad + table.offset[s] + base;
    std::uint8_t* cm = codes_m + table.code_offset[s] + base;
    std::uint8_t* cv = codes_v + table.code_offset[s] + base;
    float* am = absmax_m + table.absmax_offset[s] + b;
    float* av = absmax_v + table.absmax_offset[s] + b;
    const float am0 = *am;
    const float av0 = *av;

    float m[PerThread];
    float v[PerThread];
    float local_m = 0.0f;
    float local_v = 0.0f;
#pragma unroll
    for (int e = 0; e < PerThread; ++e) {
      const int j = threadIdx.x + e * Threads;
      m[e] = 0.0f;
      v[e] = 0.0f;
      if (j < rest) {
        m[e] = smap[cm[j]] * am0;
        v[e] = umap[cv[j]] * av0;
        float pj = p[j];
        f(pj, g[j], m[e], v[e]);  // the element path: products never fused
        p[j] = pj;
        local_m = optim_max(local_m, fabsf(m[e]));
        local_v = optim_max(local_v, fabsf(v[e]));
      }
    }
    // Every thread takes part (the loop bounds are the same for the whole block) and gets the
    // result.
    const adamw8_absmax absmax =
        absmax_reduce(absmax_storage).all_reduce({local_m, local_v}, adamw8_absmax_max{});
    const float new_m = absmax.m;
    const float new_v = absmax.v;
    if (threadIdx.x == 0) {
      *am = new_m;
      *av = new_v;
    }
    const float inv_m = new_m > 0.0f ? 1.0f / new_m : 0.0f;
    const float inv_v = new_v > 0.0f ? 1.0f / new_v : 0.0f;
#pragma unroll
    for (int e = 0; e < PerThread; ++e) {
      const int j = threadIdx.x + e * Threads;
      if (j < rest) {
        cm[j] = quantize_keep_sign(smap, m[e] * inv_m, m[e]);
        cv[j] = quantize_nearest(umap, v[e] * inv_v);
      }
    }
    __syncthreads();  // absmax_storage is reused by the next quantization block
  }
}

template <class G, int Threads, int PerThread>
void launch_adamw_8bit(cuda_exec exec, const adamw8_table& table, const adamw8_maps& maps,
                       const adamw_functor<G>& op, float* master, const G* grad,
                       std::uint8_t* codes_m, std::uint8_t* codes_v, float* absmax_m,
                       float* absmax_v, int block, const int* found_inf,
                       const float* device_grad_scale) {
  const std::int64_t total = table.block_begin[table.slots];
  const int grid = static_cast<int>(std::min<std::int64_t>(total, adamw8_max_grid));
  adamw_8bit_kernel<G, Threads, PerThread>
      <<<grid, Threads, 0, exec.stream>>>(table, maps, op, master, grad, codes_m, codes_v, absmax_m,
                                          absmax_v, block, total, found_inf, device_grad_scale);
  check_last_launch("hone::step(cuda_exec, adamw_8bit): adamw_8bit_kernel launch");
}

template <class G>
void launch_adamw_8bit_any(cuda_exec exec, const adamw8_table& table, const adamw8_maps& maps,
                           const adamw_functor<G>& op, float* master, const G* grad,
                           std::uint8_t* codes_m, std::uint8_t* codes_v, float* absmax_m,
                           float* absmax_v, int block, const int* found_inf,
                           const float* device_grad_scale) {
  // Up to 256 threads per quantization block, each holding block / threads elements.
  switch (block) {
    case 64:
      return launch_adamw_8bit<G, 64, 1>(exec, table, maps, op, master, grad, codes_m, codes_v,
                                         absmax_m, absmax_v, block, found_inf, device_grad_scale);
    case 128:
      return launch_adamw_8bit<G, 128, 1>(exec, table, maps, op, master, grad, codes_m, codes_v,
                                          absmax_m, absmax_v, block, found_inf, device_grad_scale);
    case 256:
      return launch_adamw_8bit<G, 256, 1>(exec, table, maps, op, master, grad, codes_m, codes_v,
                                          absmax_m, absmax_v, block, found_inf, device_grad_scale);
    case 512:
      return launch_adamw_8bit<G, 256, 2>(exec, table, maps, op, master, grad, codes_m, codes_v,
                                          absmax_m, absmax_v, block, found_inf, device_grad_scale);
    case 1024:
      return launch_adamw_8bit<G, 256, 4>(exec, table, maps, op, master, grad, codes_m, codes_v,
                                          absmax_m, absmax_v, block, found_inf, device_grad_scale);
    case 2048:
      return launch_adamw_8bit<G, 256, 8>(exec, table, maps, op, master, grad, codes_m, codes_v,
                                          absmax_m, absmax_v, block, found_inf, device_grad_scale);
    default:
      return launch_adamw_8bit<G, 256, 16>(exec, table, maps, op, master, grad, codes_m, codes_v,
                                           absmax_m, absmax_v, block, found_inf, device_grad_scale);
  }
}

}  // namespace detail

/// One 8-bit AdamW step on `exec.stream` (arguments as the AdamW overload in
/// hone/optim/cuda/adamw.cuh). Asynchronous; skipped inside the kernels when *found_inf != 0.
template <class G>
void step(cuda_exec exec, adamw_8bit_state<cuda_space>& state, const adamw_8bit& policy,
          const optimizer_step_args& args, float* master, const G* grad,
          const std::vector<param_group>& groups = {}, const int* found_inf = nullptr,
          const float* device_grad_scale = nullptr, multi_tensor_tuning tuning = {}) {
  detail::adamw8_maps maps{};
  std::copy(dynamic_map(true).values.begin(), dynamic_map(true).values.end(), maps.signed_map);
  std::copy(dynamic_map(false).values.begin(), dynamic_map(false).values.end(), maps.unsigned_map);
  std::uint8_t* qm = state.exp_avg_codes().all().data();
  std::uint8_t* qv = state.exp_avg_sq_codes().all().data();
  float* am = state.exp_avg_absmax().all().data();
  float* av = state.exp_avg_sq_absmax().all().data();
  const auto block = static_cast<std::int64_t>(state.block());
  state.for_each_group(
      policy, args, master, grad, groups,
      [&](const auto& lists, const auto& op) {
        detail::launch_guarded(exec, lists, op, found_inf, device_grad_scale, tuning);
      },
      [&](const std::vector<quantized_slot>& slots, const adamw_coefficients& c) {
        for (std::size_t first = 0; first < slots.size(); first += detail::adamw8_max_slots) {
          detail::adamw8_table table{};
          const std::size_t last =
              std::min(slots.size(), first + static_cast<std::size_t>(detail::adamw8_max_slots));
          table.slots = static_cast<int>(last - first);
          table.block_begin[0] = 0;
          for (std::size_t k = first; k < last; ++k) {
            const auto i = k - first;
            table.offset[i] = static_cast<std::int64_t>(slots[k].offset);
            table.count[i] = static_cast<std::int64_t>(slots[k].count);
            table.code_offset[i] = static_cast<std::int64_t>(slots[k].code_offset);
            table.absmax_offset[i] = static_cast<std::int64_t>(slots[k].absmax_offset);
            table.block_begin[i + 1] = table.block_begin[i] + (table.count[i] + block - 1) / block;
          }
          detail::launch_adamw_8bit_any<G>(exec, table, maps, adamw_functor<G>{c}, master, grad, qm,
                                           qv, am, av, static_cast<int>(block), found_inf,
                                           device_grad_scale);
        }
      });
}

HONE_NAMESPACE_END
