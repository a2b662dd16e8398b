// hone/core/cuda/multi_tensor_apply.cuh: the CUDA backend of hone::for_each over tensor_lists.
// apex / PyTorch multi_tensor_apply style: tensors are cut into chunks, each CUDA block processes
// one chunk of one tensor, and the tensor list metadata travels in the kernel arguments (no
// device allocation, no host sync). The element functor is the same HONE_HOST_DEVICE functor the
// oneTBB backend runs, so the CPU result is the reference the GPU tests compare against.
// Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cuda/std/tuple>
#include <type_traits>
#include <utility>

#include "hone/core/config.hpp"
#include "hone/core/cuda/error.hpp"
#include "hone/core/multi_tensor.hpp"

HONE_NAMESPACE_BEGIN

/// Where GPU work runs: a CUDA stream (the legacy default stream when null).
struct cuda_exec {
  cudaStream_t stream = nullptr;
};

/// Launch shape of the multi-tensor kernel. apex's values (block 512, chunk 65536, ILP 4). Chunks
/// whose lists all start on a 4-element boundary move 4 elements per vector load and store
/// (PyTorch's aligned path); the others take apex's strided scalar loop.
struct multi_tensor_tuning {
  int block = 512;
  int chunk = 65536;
};

namespace detail {
inline constexpr int multi_tensor_ilp = 4;
inline constexpr int multi_tensor_max_blocks = 320;
/// Kernel arguments are limited to 4 KiB: the tensor table gets what the block table and a small
/// functor leave (apex uses 110/64/48/36/30 tensors for depths 1-5).
inline constexpr int multi_tensor_arg_budget = 4096 - 256;
template <int Depth>
inline constexpr int multi_tensor_max_tensors = [] {
  constexpr int block_table = multi_tensor_max_blocks * (1 + 4);
  const int n = (multi_tensor_arg_budget - block_table) / (8 * (Depth + 1));
  return n < 110 ? n : 110;
}();

template <int Depth, int MaxTensors>
struct multi_tensor_meta {
  void* ptr[Depth][MaxTensors];
  std::int64_t size[MaxTensors];
  int chunk[multi_tensor_max_blocks];
  unsigned char tensor[multi_tensor_max_blocks];
};

template <class T>
struct ilp_regs {
  T v[multi_tensor_ilp];
};

template <class T>
__device__ __forceinline__ void store_if_output(T* p, const std::remove_const_t<T>& v) {
  if constexpr (!std::is_const_v<T>) *p = v;
}

/// ILP consecutive elements moved as one aligned vector (float: 16 bytes, bf16/fp16: 8 bytes).
template <class T>
struct alignas(sizeof(T) * multi_tensor_ilp) ilp_vector {
  T v[multi_tensor_ilp];
};
/// Element types whose ILP-vector is a power-of-two size of at most 32 bytes.
template <class T>
inline constexpr bool ilp_vectorizable =
    sizeof(T) <= 8 && (sizeof(T) & (sizeof(T) - 1)) == 0 && std::is_trivially_copyable_v<T>;
template <class T>
__device__ __forceinline__ bool ilp_aligned(const T* p) {
  return reinterpret_cast<std::uintptr_t>(p) % (sizeof(T) * multi_tensor_ilp) == 0;
}
/// The ILP elements at p as one vector load, and their store (outputs only).
template <class T>
__device__ __forceinline__ ilp_vector<std::remove_const_t<T>> load_vector(T* p) {
  return *reinterpret_cast<const ilp_vector<std::remove_const_t<T>>*>(p);
}
template <class T>
__device__ __forceinline__ void store_vector_if_output(
    T* p, const ilp_vector<std::remove_const_t<T>>& v) {
  if constexpr (!std::is_const_v<T>) *reinterpret_cast<ilp_vector<T>*>(p) = v;
}

template <class Op, class... Ts, std::size_t... K>
__device__ __forceinline__ void process_chunk(const Op& op, std::int64_t len,
                                              std::index_sequence<K...>, Ts* __restrict__... p) {
  if constexpr ((ilp_vectorizable<std::remove_const_t<Ts>> && ...)) {
    // PyTorch's aligned path: when every list's chunk starts on an ILP-vector boundary and the
    // chunk is whole vectors, each thread loads and stores ILP consecutive elements with one
    // vector instruction per list (the strided loop below issues ILP scalar ones). The functor
    // sees the same elements either way: the results are the same bits.
    if (len % multi_tensor_ilp == 0 && (ilp_aligned(p) && ...)) {
      using ::cuda::std::get;
      const std::int64_t step = static_cast<std::int64_t>(blockDim.x) * multi_tensor_ilp;
      for (std::int64_t i = static_cast<std::int64_t>(threadIdx.x) * multi_tensor_ilp; i < len;
           i += step) {
        ::cuda::std::tuple<ilp_vector<std::remove_const_t<Ts>>...> r(load_vector(p + i)...);
#pragma unroll
        for (int j = 0; j < multi_tensor_ilp; ++j) op(get<K>(r).v[j]...);
        (store_vector_if_output(p + i, get<K>(r)), ...);
      }
      return;
    }
  }
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * multi_tensor_ilp;
  for (std::int64_t base = 0; base < len; base += stride) {
    ::cuda::std::tuple<ilp_regs<std::remove_const_t<Ts>>...> r;
#pragma unroll
    for (int j = 0; j < multi_tensor_ilp; ++j) {
      const std::int64_t i = base + threadIdx.x + static_cast<std::int64_t>(j) * blockDim.x;
      if (i < len) ((::cuda::std::get<K>(r).v[j] = p[i]), ...);
    }
#pragma unroll
    for (int j = 0; j < multi_tensor_ilp; ++j) {
      const std::int64_t i = base + threadIdx.x + static_cast<std::int64_t>(j) * blockDim.x;
      if (i < len) op(::cuda::std::get<K>(r).v[j]...);
    }
#pragma unroll
    for (int j = 0; j < multi_tensor_ilp; ++j) {
      const std::int64_t i = base + threadIdx.x + static_cast<std::int64_t>(j) * blockDim.x;
      if (i < len) (store_if_output(p + i, ::cuda::std::get<K>(r).v[j]), ...);
    }
  }
}

template <class... Ts>
struct type_list {
  static constexpr int size = static_cast<int>(sizeof...(Ts));
};

template <class Op, int MaxTensors, class... Ts, std::size_t... K>
__device__ __forceinline__ void run_block(const multi_tensor_meta<sizeof...(Ts), MaxTensors>& meta,
                                          const Op& op, int chunk, type_list<Ts...>,
                                          std::index_sequence<K...> seq) {
  const int t = meta.tensor[blockIdx.x];
  const std::int64_t begin = static_cast<std::int64_t>(meta.chunk[blockIdx.x]) * chunk;
  const std::int64_t rest = meta.size[t] - begin;
  const std::int64_t len = rest < chunk ? rest : chunk;
  process_chunk<Op, Ts...>(op, len, seq, (static_cast<Ts*>(meta.ptr[K][t]) + begin)...);
}

// A __global__ template may have one parameter pack only, last: the element types travel as a
// type_list and are unpacked in run_block.
template <class Op, int MaxTensors, class List>
__global__ void multi_tensor_kernel(multi_tensor_meta<List::size, MaxTensors> meta, Op op,
                                    int chunk) {
  run_block<Op, MaxTensors>(meta, op, chunk, List{}, std::make_index_sequence<List::size>{});
}
}  // namespace detail

/// Runs `op(a[i], b[i], ...)` over every element of every tensor of the lists, which must point
/// to device memory, on `exec.stream`. Asynchronous: returns after enqueueing the launches.
/// Throws hone::cuda_error when a launch fails.
template <class Op, class... Ts>
void for_each(cuda_exec exec, const tensor_lists<Ts...>& lists, const Op& op,
              multi_tensor_tuning tuning = {}) {
  static_assert(std::is_trivially_copyable_v<Op>,
                "hone::for_each(cuda_exec, ...): the functor is passed to the kernel by value, so "
                "it must be trivially copyable (hold numbers and pointers, not containers).");
  static_assert(std::is_invocable_v<const Op&, std::remove_const_t<Ts>&...>,
                "hone::for_each(cuda_exec, ...): the functor cannot be called with one element "
                "reference per list; its operator() must be const, HONE_HOST_DEVICE, and take "
                "(T0&, T1&, ...) in list order.");
  constexpr int depth = static_cast<int>(sizeof...(Ts));
  constexpr int max_tensors = detail::multi_tensor_max_tensors<depth>;
  using meta_t = detail::multi_tensor_meta<depth, max_tensors>;
  static_assert(sizeof(meta_t) + sizeof(Op) + 16 <= 4096,
                "hone::for_each(cuda_exec, ...): the functor is too large for the kernel's 4 KiB "
                "argument space; keep it under 256 bytes.");
  HONE_REQUIRE(tuning.block > 0 && tuning.block <= 1024 && tuning.chunk > 0,
               "hone::for_each(cuda_exec, ...): block must be in [1, 1024] and chunk positive");
  if (lists.empty()) return;

  constexpr auto seq = std::index_sequence_for<Ts...>{};
  meta_t meta{};
  int slot = 0;
  int blocks = 0;
  auto set_slot = [&]<std::size_t... K>(int s, std::size_t t, std::index_sequence<K...>) {
    ((meta.ptr[K][s] = const_cast<void*>(static_cast<const void*>(lists.template pointer<K>(t)))),
     ...);
    meta.size[s] = static_cast<std::int64_t>(lists.numel(t));
  };
  auto launch = [&] {
    detail::multi_tensor_kernel<Op, max_tensors, detail::type_list<Ts...>>
        <<<blocks, tuning.block, 0, exec.stream>>>(meta, op, tuning.chunk);
    check_last_launch("hone::for_each(cuda_exec): multi_tensor_kernel launch");
    blocks = 0;
  };
  const std::size_t chunk = static_cast<std::size_t>(tuning.chunk);
  for (std::size_t t = 0; t < lists.size(); ++t) {
    set_slot(slot, t, seq);
    const std::size_t chunks = (lists.numel(t) + chunk - 1) / chunk;
    for (std::size_t c = 0; c < chunks; ++c) {
      meta.tensor[blocks] = static_cast<unsigned char>(slot);
      meta.chunk[blocks] = static_cast<int>(c);
      ++blocks;
      const bool last_chunk = c + 1 == chunks;
      const bool tensors_full = last_chunk && slot + 1 == max_tensors;
      const bool blocks_full = blocks == detail::multi_tensor_max_blocks;
      const bool everything = last_chunk && t + 1 == lists.size();
      if (tensors_full || blocks_full || everything) {
        launch();
        if (last_chunk) {
          slot = -1;  // the next tensor starts the table afresh
        } else {
          set_slot(0, t, seq);  // this tensor continues in the next launch
          slot = 0;
        }
      }
    }
    ++slot;
  }
}

HONE_NAMESPACE_END
