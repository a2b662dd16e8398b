// hone/core/cuda/block_reduce.cuh: the block-wide reductions of hone's CUDA kernels, built on
// cub::BlockReduce (CCCL, shipped with the CUDA toolkit). Include only from .cu files.
//
// Every hone kernel that reduces over a block (the gradient norms of clipping, the sum of squares
// of the unscale pass, the absmax of the 8-bit AdamW blocks) goes through block_reduce below, so
// they share one algorithm and one set of rules:
//  - every thread of the block calls the collective, with one value each (a 1-D block of exactly
//    `Threads` threads);
//  - reduce() and sum() return the result in thread 0 only; all_reduce() returns it in every
//  thread;
//  - the storage is declared `__shared__` by the kernel, and a __syncthreads() separates two uses
//    of the same storage.
//
// Determinism: CUB's block reductions combine the values in an order fixed by the block size and
// the algorithm (never by timing), so for a fixed launch shape the result has the same bits on
// every run; hone's kernels fix both. The order is not the host's, so a device sum of floating
// point values equals the host's only up to rounding; a max (without NaN) is exact in any order.
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace detail {

/// The algorithm of every hone block reduction, chosen explicitly so that the combining order
/// (and so the bits of a floating-point sum) cannot change with CUB's default:
/// BLOCK_REDUCE_WARP_REDUCTIONS reduces each warp with shuffles, then thread 0 folds the warp
/// totals in warp order. It keeps operand order (lower thread first), so a non-commutative
/// operator such as a NaN-propagating max is well defined; it needs one value per warp of shared
/// memory instead of one per thread (raking), a single __syncthreads(), and has the lower latency
/// of the two, which matters here because each reduction ends a block's work or sits on the path
/// of the next quantization block.
inline constexpr cub::BlockReduceAlgorithm block_reduce_algorithm =
    cub::BLOCK_REDUCE_WARP_REDUCTIONS;

/// One value per thread of a block of `Threads` threads, reduced with cub::BlockReduce in the fixed
/// order of block_reduce_algorithm (see the file comment for the calling rules).
template <class T, int Threads>
class block_reduce {
  static_assert(Threads >= 32 && Threads <= 1024 && Threads % 32 == 0,
                "hone::detail::block_reduce: Threads must be a multiple of 32 between 32 and 1024; "
                "launch the kernel with whole warps");
  using cub_type = cub::BlockReduce<T, Threads, block_reduce_algorithm>;

 public:
  /// Shared memory of one reduction: declare it `__shared__` in the kernel.
  struct storage {
    typename cub_type::TempStorage cub;
    T result;  // the broadcast slot of all_reduce
  };

  __device__ __forceinline__ explicit block_reduce(storage& s) : storage_(s) {}

  /// `op` over the block (operands in thread order); the result is valid in thread 0 only.
  template <class Op>
  __device__ __forceinline__ T reduce(T x, Op op) {
    return cub_type(storage_.cub).Reduce(x, op);
  }

  /// The sum over the block; the result is valid in thread 0 only.
  __device__ __forceinline__ T sum(T x) { return cub_type(storage_.cub).Sum(x); }

  /// `op` over the block, returned to every thread (thread 0 broadcasts through the storage; one
  /// more __syncthreads() than reduce()).
  template <class Op>
  __device__ __forceinline__ T all_reduce(T x, Op op) {
    const T r = reduce(x, op);
    if (threadIdx.x == 0) storage_.result = r;
    __syncthreads();
    return storage_.result;
  }

 private:
  storage& storage_;
};

}  // namespace detail
HONE_NAMESPACE_END
