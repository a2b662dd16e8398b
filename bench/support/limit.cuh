// bench/support/limit.cuh: the GPU twin of bench/support/limit.hpp. The same streaming pass
// (every read array loaded once, every written array stored once, one bitwise OR per loaded
// word, values unchanged) over one contiguous cudaMalloc, with 16-byte loads and stores and a
// grid-stride loop sized to fill the device; and device_read_limit, a pass that only reads.
// Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>

#include "support/limit.hpp"

namespace hone_bench {
namespace detail {

template <class V, std::size_t RO, std::size_t RW, std::size_t WO>
struct device_arrays {
  const V* ro[RO ? RO : 1];
  V* rw[RW ? RW : 1];
  V* wo[WO ? WO : 1];
};

__device__ __forceinline__ uint4 bit_or(uint4 a, uint4 b) {
  return make_uint4(a.x | b.x, a.y | b.y, a.z | b.z, a.w | b.w);
}
__device__ __forceinline__ std::uint32_t bit_or(std::uint32_t a, std::uint32_t b) {
  return a | b;
}

template <class V, std::size_t RO, std::size_t RW, std::size_t WO>
__device__ __forceinline__ void stream_element(const device_arrays<V, RO, RW, WO>& a, V mask,
                                               std::size_t i) {
  V r = mask;
  if constexpr (RO > 0) {
#pragma unroll
    for (std::size_t k = 0; k < RO; ++k) r = bit_or(r, a.ro[k][i]);
  }
  V all = r;
  if constexpr (RW > 0) {
#pragma unroll
    for (std::size_t k = 0; k < RW; ++k) {
      const V v = a.rw[k][i];
      all = bit_or(all, v);
      a.rw[k][i] = bit_or(v, r);
    }
  }
  if constexpr (WO > 0) {
#pragma unroll
    for (std::size_t k = 0; k < WO; ++k) a.wo[k][i] = all;
  }
}

// 16-byte vectors over the bulk, 4-byte words over the tail (n4 = vectors, n = words).
template <std::size_t RO, std::size_t RW, std::size_t WO>
__global__ void stream_kernel(device_arrays<uint4, RO, RW, WO> v,
                              device_arrays<std::uint32_t, RO, RW, WO> w, std::uint32_t mask,
                              std::size_t n4, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint4 m4 = make_uint4(mask, mask, mask, mask);
  for (std::size_t i = first; i < n4; i += stride) stream_element(v, m4, i);
  for (std::size_t i = n4 * 4 + first; i < n; i += stride) stream_element(w, mask, i);
}
// A read-only pass: each thread ORs its grid-stride 16-byte vectors, each block writes one word
// (gridDim words in all: nothing next to the n4 vectors read).
template <unsigned Block>
__global__ void read_kernel(const uint4* v, std::size_t n4, std::uint32_t* out) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::uint32_t acc = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += stride) {
    const uint4 x = v[i];
    acc |= x.x | x.y | x.z | x.w;
  }
  __shared__ std::uint32_t shared[Block];
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned s = Block / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] |= shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = shared[0];
}

/// The current device's streaming multiprocessors.
inline int sm_count() {
  int device = 0;
  int sms = 1;
  HONE_CUDA_CHECK(cudaGetDevice(&device));
  HONE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

/// Blocks of a grid-stride pass over n4 vectors: enough to cover them (at least one), at most
/// 4 resident blocks per SM.
inline unsigned grid_for(std::size_t n4, unsigned block, int sms) {
  const std::size_t want = (n4 + block - 1) / block;
  const std::size_t cap = static_cast<std::size_t>(sms) * 4;
  return static_cast<unsigned>(want < cap ? (want > 0 ? want : 1) : cap);
}
}  // namespace detail

/// The GPU limit: RO arrays only read, RW read and written in place, WO only written, each `n`
/// 4-byte words (float) long, all in one cudaMalloc. Asynchronous on the stream given to run().
template <std::size_t ReadOnly, std::size_t ReadWrite, std::size_t WriteOnly = 0>
class device_stream_limit {
 public:
  static constexpr std::size_t arrays = ReadOnly + ReadWrite + WriteOnly;
  static constexpr std::size_t reads = ReadOnly + ReadWrite;
  static constexpr std::size_t writes = ReadWrite + WriteOnly;

  /// `n` is rounded up to a multiple of 4 words inside the allocation so every array starts on a
  /// 16-byte boundary; only `n` words per array are streamed.
  explicit device_stream_limit(std::size_t n) : n_(n), storage_(((n + 3) / 4 * 4) * arrays) {
    const std::size_t stride = (n + 3) / 4 * 4;
    std::uint32_t* base = storage_.data();
    for (std::size_t k = 0; k < arrays; ++k) {
      std::uint32_t* p = base + k * stride;
      if (k < ReadOnly) {
        words_.ro[k] = p;
        vecs_.ro[k] = reinterpret_cast<const uint4*>(p);
      } else if (k < ReadOnly + ReadWrite) {
        words_.rw[k - ReadOnly] = p;
        vecs_.rw[k - ReadOnly] = reinterpret_cast<uint4*>(p);
      } else {
        words_.wo[k - reads] = p;
        vecs_.wo[k - reads] = reinterpret_cast<uint4*>(p);
      }
    }
    HONE_CUDA_CHECK(cudaMemset(base, 0x11, storage_.size_bytes()));
    sms_ = detail::sm_count();
    run(nullptr);
    HONE_CUDA_CHECK(cudaDeviceSynchronize());
  }

  void run(cudaStream_t stream) {
    constexpr unsigned block = 512;
    const std::size_t n4 = n_ / 4;
    const unsigned grid = detail::grid_for(n4, block, sms_);
    detail::stream_kernel<ReadOnly, ReadWrite, WriteOnly>
        <<<grid, block, 0, stream>>>(vecs_, words_, mask_, n4, n_);
    hone::check_last_launch("hone_bench::device_stream_limit::run");
  }

  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] std::size_t bytes_per_pass() const noexcept { return n_ * 4 * (reads + writes); }

 private:
  std::size_t n_;
  hone::buffer<std::uint32_t, hone::cuda_space> storage_;
  detail::device_arrays<uint4, ReadOnly, ReadWrite, WriteOnly> vecs_{};
  detail::device_arrays<std::uint32_t, ReadOnly, ReadWrite, WriteOnly> words_{};
  int sms_ = 1;
  std::uint32_t mask_ = 0;  // a kernel argument: unknown to the compiler, 0 at run time
};

/// The GPU limit of a pass that only reads `n` 4-byte words (n rounded down to a multiple of 4),
/// e.g. the gradient-norm pass of an optimizer step. Asynchronous on the stream given to run().
class device_read_limit {
 public:
  explicit device_read_limit(std::size_t n)
      : n_(n / 4 * 4), words_(n_), out_(max_grid), sms_(detail::sm_count()) {
    HONE_CUDA_CHECK(cudaMemset(words_.data(), 0x11, words_.size_bytes()));
    run(nullptr);
    HONE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void run(cudaStream_t stream) {
    unsigned grid = detail::grid_for(n_ / 4, block, sms_);
    if (grid > max_grid) grid = max_grid;
    detail::read_kernel<block><<<grid, block, 0, stream>>>(
        reinterpret_cast<const uint4*>(words_.data()), n_ / 4, out_.data());
    hone::check_last_launch("hone_bench::device_read_limit::run");
  }
  [[nodiscard]] std::size_t bytes_per_pass() const noexcept { return n_ * 4; }

 private:
  static constexpr unsigned block = 512;
  static constexpr unsigned max_grid = 4096;
  std::size_t n_;
  hone::buffer<std::uint32_t, hone::cuda_space> words_;
  hone::buffer<std::uint32_t, hone::cuda_space> out_;
  int sms_ = 1;
};

/// The GPU limit of an in-place update reading `Reads` float arrays and writing `Writes` of them.
template <std::size_t Reads, std::size_t Writes>
requires(Writes <= Reads) using device_limit = device_stream_limit<Reads - Writes, Writes, 0>;

}  // namespace hone_bench
