// hone/serve/cuda/kv_cache.cuh: the paged KV cache of hone/serve/kv_cache.hpp with its K and V
// blocks in device memory (docs/serve.md, "Paged KV cache", "On the GPU"). Include only from .cu
// files.
//
// A kv_cache<T, hone::cuda_space> (alias device_kv_cache<T>) keeps its bookkeeping on the host
// (block tables, reference counts, prefix table, eviction, pins: the same code as the host cache)
// and its K and V blocks in one cudaMalloc allocation, [block][head][token][dim] for K and then for
// V. The functions below move the data; each takes the stream it queues its work on, and has a
// synchronous form without a stream (it runs on the default stream and waits for it):
//
//   append(cache, seq, tokens, k, v, stream)            K and V in device memory (device_span of
//                                                       float, bfloat16 or half), converted to T
//   append_from_host(cache, seq, tokens, k, v, stream)  K and V as host floats (converted on the
//                                                       host as the host pool does; waits)
//   read(cache, seq, first, count, k, v, stream)        tokens [first, first + count) into device
//                                                       memory (float, bfloat16 or half)
//   read_to_host(cache, seq, first, count, k, v, stream)  the same into host floats (waits)
//   kv_block_tables::upload(cache, seqs, stream)         the block tables of a batch of sequences
//                                                       as a flat int32 table in device memory, and
//                                                       a kv_paged_view a kernel reads K and V with
//   decode_attention(view, q, out, scale, stream)        a reference paged decode attention
//
// K and V of a token are heads * head_dim values, head-major, and several tokens are token-major,
// as for the host cache. A copy on write (the first append into a partial block another sequence
// also holds) is a device-to-device copy queued before the writes. Appends are all or nothing with
// respect to out_of_blocks_error and size errors (checked before anything is queued).
//
// Ordering: the bookkeeping changes at once on the host, the data moves when the stream gets to
// it. A block freed by free_sequence or evicted may be handed to the next append at once, so queue
// every data operation of one cache (and every kernel reading it) on one stream, or order the
// streams yourself.
//
// T is float, hone::bfloat16, hone::half or std::int8_t. int8 blocks keep their scales (one float
// per block, K or V, head) in device memory too, and an append quantizes on the device exactly as
// the host pool does (kv_block_pool::write_token: a scale raised at least twofold, the tokens
// already in the block requantized; the same IEEE float operations, so the same bytes and scales
// as a host cache given the same values, unless the .cu is built with --use_fast_math, which
// changes the division). The sources and destinations of K and V in device memory are float,
// bfloat16 or half (kv_device_element).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "hone/core/bfloat16.hpp"
#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/cuda/error.hpp"
#include "hone/core/cuda/space.hpp"
#include "hone/core/device_span.hpp"
#include "hone/core/error.hpp"
#include "hone/core/half.hpp"
#include "hone/serve/kv_cache.hpp"

HONE_NAMESPACE_BEGIN
namespace serve {

/// The paged KV cache with its blocks in device memory.
template <class T>
using device_kv_cache = kv_cache<T, cuda_space>;

/// The element types of K and V in device memory that the CUDA functions read, write and store:
/// float, hone::bfloat16, hone::half.
template <class T>
concept kv_device_element =
    std::same_as<T, float> || std::same_as<T, bfloat16> || std::same_as<T, half>;

namespace detail {

inline constexpr int kv_threads = 256;
inline constexpr int kv_small_threads = 128;  // the quantizing and attention kernels

/// The maximum (`is_max`) or the sum of x over a block of kv_small_threads threads, returned to
/// every thread. `scratch` is shared memory of one float per warp.
__device__ inline float kv_block_all_reduce(float x, bool is_max, float* scratch) {
  for (int o = 16; o > 0; o /= 2) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read from the previous reduction
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kv_small_threads / 32; ++w) {
    r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  }
  return r;
}

template <class D, class S>
HONE_HOST_DEVICE D kv_convert(S x) noexcept {
  if constexpr (std::same_as<D, S>) {
    return x;
  } else if constexpr (std::same_as<D, float>) {
    return static_cast<float>(x);
  } else if constexpr (std::same_as<S, float>) {
    return D(x);
  } else {
    return D(static_cast<float>(x));
  }
}

/// Copies `count` tokens between a block (slots [slot, slot + count) of each head, [head][token]
/// [dim]) and a token-major array ([token][head][dim]): into the block when `ToBlock`, out of it
/// otherwise (int8 blocks: out of it only, dequantized with the block's `scales`, [K or V][head]).
/// blockIdx.y picks K (0) or V (1).
template <class B, class A, bool ToBlock>
__global__ void kv_move_kernel(B* k_block, B* v_block, A* k_flat, A* v_flat, const float* scales,
                               std::size_t count, std::size_t slot, std::size_t heads,
                               std::size_t dim, std::size_t block_tokens) {
  B* block = blockIdx.y == 0 ? k_block : v_block;
  A* flat = blockIdx.y == 0 ? k_flat : v_flat;
  const std::size_t n = count * heads * dim;
  for (std::size_t e = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t t = e / (heads * dim), h = (e / dim) % heads, j = e % dim;
    const std::size_t b = (h * block_tokens + slot + t) * dim + j;
    if constexpr (ToBlock) {
      block[b] = kv_convert<std::remove_const_t<B>>(flat[e]);
    } else if constexpr (std::same_as<std::remove_const_t<B>, std::int8_t>) {
      flat[e] =
          kv_convert<std::remove_const_t<A>>(float(block[b]) * scales[blockIdx.y * heads + h]);
    } else {
      flat[e] = kv_convert<std::remove_const_t<A>>(block[b]);
    }
  }
}

template <class B, class A, bool ToBlock>
void kv_launch_move(B* k_block, B* v_block, A* k_flat, A* v_flat, const float* scales,
                    std::size_t count, std::size_t slot, const kv_block_shape& s,
                    cudaStream_t stream) {
  const std::size_t n = count * s.heads * s.head_dim;
  const std::size_t grid = std::min<std::size_t>((n + kv_threads - 1) / kv_threads, 4096);
  kv_move_kernel<B, A, ToBlock><<<dim3(static_cast<unsigned>(grid), 2), kv_threads, 0, stream>>>(
      k_block, v_block, k_flat, v_flat, scales, count, slot, s.heads, s.head_dim, s.block_tokens);
  check_last_launch(ToBlock ? "hone::serve: the KV append kernel"
                            : "hone::serve: the KV read kernel");
}

/// Writes `count` tokens into slots [slot, slot + count) of an int8 block, quantizing as
/// kv_block_pool::write_token does on the host (same operations, same order, IEEE division), one
/// block of threads per (head, K or V) going through the tokens in order. `scales` are the block's
/// [K or V][head]; a write at slot 0 starts from a zero scale (a newly taken block).
template <class S>
__global__ void __launch_bounds__(kv_small_threads)
    kv_quantize_kernel(std::int8_t* k_block, std::int8_t* v_block, float* scales, const S* k_flat,
                       const S* v_flat, std::size_t count, std::size_t slot, std::size_t heads,
                       std::size_t dim, std::size_t block_tokens) {
  __shared__ float scratch[kv_small_threads / 32];
  const std::size_t h = blockIdx.x;
  std::int8_t* head = (blockIdx.y == 0 ? k_block : v_block) + h * block_tokens * dim;
  const S* flat = blockIdx.y == 0 ? k_flat : v_flat;
  float* sp = scales + blockIdx.y * heads + h;
  float s = slot == 0 ? 0.0f : *sp;
  for (std::size_t t = 0; t < count; ++t) {
    const S* src = flat + (t * heads + h) * dim;
    float amax = 0.0f;
    for (std::size_t j = threadIdx.x; j < dim; j += blockDim.x) {
      amax = fmaxf(amax, fabsf(static_cast<float>(src[j])));
    }
    amax = kv_block_all_reduce(amax, true, scratch);  // also orders the previous token's writes
    const std::size_t filled = slot + t;
    if (amax > 127.0f * s) {
      const float ns = fmaxf(amax / 127.0f, 2.0f * s);
      if (s != 0.0f) {
        const float ratio = s / ns;
        for (std::size_t e = threadIdx.x; e < filled * dim; e += blockDim.x) {
          head[e] = static_cast<std::int8_t>(lroundf(float(head[e]) * ratio));
        }
      }
      s = ns;
    }
    std::int8_t* row = head + filled * dim;
    for (std::size_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const float q = s == 0.0f ? 0.0f : rintf(static_cast<float>(src[j]) / s);
      row[j] = static_cast<std::int8_t>(fminf(fmaxf(q, -127.0f), 127.0f));
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *sp = s;
}

template <class S>
void kv_launch_quantize(kv_block_pool<std::int8_t, cuda_space>& pool, kv_block_id b, const S* k,
                        const S* v, std::size_t count, std::size_t slot, cudaStream_t stream) {
  const kv_block_shape& s = pool.shape();
  kv_quantize_kernel<S><<<dim3(static_cast<unsigned>(s.heads), 2), kv_small_threads, 0, stream>>>(
      pool.k_data(b), pool.v_data(b), pool.scales() + std::size_t(b) * 2 * s.heads, k, v, count,
      slot, s.heads, s.head_dim, s.block_tokens);
  check_last_launch("hone::serve: the int8 KV append kernel");
}

/// The scales of block `b` of an int8 pool ([K or V][head]), or null for another element type.
template <class T>
const float* kv_block_scales(const kv_block_pool<T, cuda_space>& pool, kv_block_id b) noexcept {
  if constexpr (std::same_as<T, std::int8_t>) {
    return pool.scales() + std::size_t(b) * 2 * pool.shape().heads;
  } else {
    (void)pool;
    (void)b;
    return nullptr;
  }
}

/// Queues the copy of the first `tokens` tokens of block `from` (K and V) into block `to`.
template <class T>
void kv_copy_blocks(kv_block_pool<T, cuda_space>& pool, kv_block_id from, kv_block_id to,
                    std::size_t tokens, cudaStream_t stream) {
  if (tokens == 0) return;
  const kv_block_shape& s = pool.shape();
  const std::size_t pitch = s.block_tokens * s.head_dim * sizeof(T);
  const std::size_t width = tokens * s.head_dim * sizeof(T);
  HONE_CUDA_CHECK(cudaMemcpy2DAsync(pool.k_data(to), pitch, pool.k_data(from), pitch, width,
                                    s.heads, cudaMemcpyDeviceToDevice, stream));
  HONE_CUDA_CHECK(cudaMemcpy2DAsync(pool.v_data(to), pitch, pool.v_data(from), pitch, width,
                                    s.heads, cudaMemcpyDeviceToDevice, stream));
  if constexpr (std::same_as<T, std::int8_t>) {
    HONE_CUDA_CHECK(cudaMemcpyAsync(pool.scales() + std::size_t(to) * 2 * s.heads,
                                    pool.scales() + std::size_t(from) * 2 * s.heads,
                                    2 * s.heads * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  }
}

// append_with's data movement from device memory: one kernel per run of tokens in one block.
template <class T, class S>
struct kv_device_io {
  kv_block_pool<T, cuda_space>& pool;
  const S* k;
  const S* v;
  cudaStream_t stream;
  void copy(kv_block_id from, kv_block_id to, std::size_t n) {
    kv_copy_blocks(pool, from, to, n, stream);
  }
  void write(std::size_t first, std::size_t count, kv_block_id b, std::size_t slot) {
    const std::size_t off = first * pool.shape().token_elements();
    if constexpr (std::same_as<T, std::int8_t>) {
      kv_launch_quantize(pool, b, k + off, v + off, count, slot, stream);
    } else {
      kv_launch_move<T, const S, true>(pool.k_data(b), pool.v_data(b), k + off, v + off, nullptr,
                                       count, slot, pool.shape(), stream);
    }
  }
};

/// Device memory from cudaMallocAsync, freed with cudaFreeAsync on the same stream.
class kv_stream_scratch {
 public:
  kv_stream_scratch(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
    HONE_CUDA_CHECK(cudaMallocAsync(&p_, bytes, stream));
  }
  ~kv_stream_scratch() { (void)cudaFreeAsync(p_, stream_); }
  kv_stream_scratch(const kv_stream_scratch&) = delete;
  kv_stream_scratch& operator=(const kv_stream_scratch&) = delete;
  [[nodiscard]] float* data() const noexcept { return static_cast<float*>(p_); }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_;
};

// append_with's data movement from host floats: converted to T on the host as the host pool
// does, reordered to [head][token][dim] and copied with one 2-D copy per run for K and for V.
// (append_from_host waits for the stream before the staging and the caller's spans go.) int8:
// the floats go to stream-ordered scratch memory and are quantized there (the tokens already in
// the block live on the device and may need requantizing).
template <class T>
struct kv_host_io {
  kv_block_pool<T, cuda_space>& pool;
  std::span<const float> k, v;
  cudaStream_t stream;
  std::vector<T> stage;
  void copy(kv_block_id from, kv_block_id to, std::size_t n) {
    kv_copy_blocks(pool, from, to, n, stream);
  }
  void write(std::size_t first, std::size_t count, kv_block_id b, std::size_t slot) {
    const std::size_t te = pool.shape().token_elements();
    if constexpr (std::same_as<T, std::int8_t>) {
      const kv_stream_scratch scratch(2 * count * te * sizeof(float), stream);
      HONE_CUDA_CHECK(cudaMemcpyAsync(scratch.data(), k.data() + first * te,
                                      count * te * sizeof(float), cudaMemcpyHostToDevice, stream));
      HONE_CUDA_CHECK(cudaMemcpyAsync(scratch.data() + count * te, v.data() + first * te,
                                      count * te * sizeof(float), cudaMemcpyHostToDevice, stream));
      kv_launch_quantize<float>(pool, b, scratch.data(), scratch.data() + count * te, count, slot,
                                stream);
    } else {
      write_converted(first, count, b, slot);
    }
  }
  // Each run has its own part of `stage` (sized for the whole append by the caller), so no
  // copy's source is overwritten before the caller waits for the stream.
  void write_converted(std::size_t first, std::size_t count, kv_block_id b, std::size_t slot) {
    const kv_block_shape& s = pool.shape();
    const std::size_t d = s.head_dim, te = s.token_elements();
    for (int which = 0; which < 2; ++which) {
      const float* src = (which == 0 ? k : v).data() + first * te;
      T* part = stage.data() + (2 * first + std::size_t(which) * count) * te;
      for (std::size_t t = 0; t < count; ++t) {
        for (std::size_t h = 0; h < s.heads; ++h) {
          for (std::size_t j = 0; j < d; ++j) {
            part[(h * count + t) * d + j] = kv_from_float<T>(src[t * te + h * d + j]);
          }
        }
      }
      T* dst = (which == 0 ? pool.k_data(b) : pool.v_data(b)) + slot * d;
      HONE_CUDA_CHECK(cudaMemcpy2DAsync(dst, s.block_tokens * d * sizeof(T), part,
                                        count * d * sizeof(T), count * d * sizeof(T), s.heads,
                                        cudaMemcpyHostToDevice, stream));
    }
  }
};

/// Calls f(first_token_of_run, count, block, slot) for each run of [first, first + count) of
/// `seq` that lies in one block, after checking the sequence and the range.
template <class T, class F>
void kv_for_runs(const kv_cache<T, cuda_space>& c, kv_seq_id seq, std::size_t first,
                 std::size_t count, const char* op, F&& f) {
  if (!c.contains(seq)) {
    throw config_error(std::string("hone::serve::") + op + ": sequence " + std::to_string(seq) +
                       " does not exist (never made by add_sequence or fork, or already freed)");
  }
  const std::size_t len = c.length(seq);
  if (first > len || count > len - first) {
    throw config_error(std::string("hone::serve::") + op + ": tokens [" + std::to_string(first) +
                       ", " + std::to_string(first + count) + ") are not all in sequence " +
                       std::to_string(seq) + " (" + std::to_string(len) +
                       " tokens); read within [0, length)");
  }
  const auto table = c.block_table(seq);
  const std::size_t bt = c.shape().block_tokens;
  for (std::size_t i = 0; i < count;) {
    const std::size_t pos = first + i, slot = pos % bt;
    const std::size_t n = std::min(count - i, bt - slot);
    f(i, n, table[pos / bt], slot);
    i += n;
  }
}

template <class S>
void kv_check_device_span(device_span<S> x, const char* op, const char* name) {
  if (x.data() == nullptr && x.size() != 0) {
    throw config_error(std::string("hone::serve::") + op + ": " + name + " has " +
                       std::to_string(x.size()) +
                       " elements and a null data pointer; pass device memory");
  }
}

}  // namespace detail

/// Appends tokens with their K and V from device memory (tokens.size() * heads * head_dim values
/// each, token-major, then head-major; float, bfloat16 or half, converted to T as the host does:
/// round to nearest even), queued on `stream`. `tokens` is host memory (the cache keeps the token
/// ids on the host for prefix sharing). All or nothing: out_of_blocks_error (or a size error)
/// queues nothing and changes nothing.
template <class T, class S>
void append(kv_cache<T, cuda_space>& cache, kv_seq_id seq, std::span<const kv_token> tokens,
            device_span<S> k, device_span<S> v, cudaStream_t stream) {
  using source = std::remove_const_t<S>;
  static_assert(kv_device_element<source>,
                "hone::serve::append: K and V in device memory must be float, hone::bfloat16 or "
                "hone::half; convert them first.");
  detail::check_kv_sizes(cache.shape(), "append", "values", tokens.size(), k.size(), v.size());
  detail::kv_check_device_span(k, "append", "k");
  detail::kv_check_device_span(v, "append", "v");
  cache.append_with(seq, tokens,
                    detail::kv_device_io<T, source>{cache.pool(), k.data(), v.data(), stream});
}

/// append(..., stream) on the default stream, waiting for it.
template <class T, class S>
void append(kv_cache<T, cuda_space>& cache, kv_seq_id seq, std::span<const kv_token> tokens,
            device_span<S> k, device_span<S> v) {
  append(cache, seq, tokens, k, v, cudaStream_t{});
  HONE_CUDA_CHECK(cudaStreamSynchronize(cudaStream_t{}));
}

/// Appends tokens with their K and V as host floats (the host cache's append), converted to T on
/// the host and copied to the blocks on `stream` (int8: quantized there). The copies read
/// pageable host memory, so it waits for `stream` before returning (a path for prompts and tests;
/// a model on the GPU appends from device memory).
template <class T>
void append_from_host(kv_cache<T, cuda_space>& cache, kv_seq_id seq,
                      std::span<const kv_token> tokens, std::span<const float> k,
                      std::span<const float> v, cudaStream_t stream) {
  detail::check_kv_sizes(cache.shape(), "append_from_host", "floats", tokens.size(), k.size(),
                         v.size());
  detail::kv_host_io<T> io{cache.pool(), k, v, stream, {}};
  if constexpr (!std::same_as<T, std::int8_t>) io.stage.resize(2 * k.size());
  cache.append_with(seq, tokens, io);
  HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

/// append_from_host(..., stream) on the default stream.
template <class T>
void append_from_host(kv_cache<T, cuda_space>& cache, kv_seq_id seq,
                      std::span<const kv_token> tokens, std::span<const float> k,
                      std::span<const float> v) {
  append_from_host(cache, seq, tokens, k, v, cudaStream_t{});
}

/// Queues a copy of the K and V of tokens [first, first + count) of `seq` into device memory
/// (count * heads * head_dim values each, token-major, then head-major), converted to D.
template <class T, class D>
void read(const kv_cache<T, cuda_space>& cache, kv_seq_id seq, std::size_t first, std::size_t count,
          device_span<D> k, device_span<D> v, cudaStream_t stream) {
  static_assert(kv_device_element<D> && !std::is_const_v<D>,
                "hone::serve::read: the destination must be writable device memory of float, "
                "hone::bfloat16 or hone::half.");
  const std::size_t te = cache.shape().token_elements();
  detail::kv_for_runs(cache, seq, first, count, "read", [](auto&&...) {});
  detail::check_kv_sizes(cache.shape(), "read", "values", count, k.size(), v.size());
  detail::kv_check_device_span(k, "read", "k");
  detail::kv_check_device_span(v, "read", "v");
  const auto& pool = cache.pool();
  detail::kv_for_runs(cache, seq, first, count, "read",
                      [&](std::size_t i, std::size_t n, kv_block_id b, std::size_t slot) {
                        detail::kv_launch_move<const T, D, false>(
                            pool.k_data(b), pool.v_data(b), k.data() + i * te, v.data() + i * te,
                            detail::kv_block_scales(pool, b), n, slot, cache.shape(), stream);
                      });
}

/// read(..., stream) on the default stream, waiting for it.
template <class T, class D>
void read(const kv_cache<T, cuda_space>& cache, kv_seq_id seq, std::size_t first, std::size_t count,
          device_span<D> k, device_span<D> v) {
  read(cache, seq, first, count, k, v, cudaStream_t{});
  HONE_CUDA_CHECK(cudaStreamSynchronize(cudaStream_t{}));
}

/// Copies the K and V of tokens [first, first + count) of `seq` to host floats (count * heads *
/// head_dim each, token-major, then head-major) after the work already queued on `stream`; waits
/// for `stream`.
template <class T>
void read_to_host(const kv_cache<T, cuda_space>& cache, kv_seq_id seq, std::size_t first,
                  std::size_t count, std::span<float> k, std::span<float> v, cudaStream_t stream) {
  const kv_block_shape& s = cache.shape();
  const std::size_t te = s.token_elements(), d = s.head_dim;
  detail::kv_for_runs(cache, seq, first, count, "read_to_host", [](auto&&...) {});
  detail::check_kv_sizes(s, "read_to_host", "floats", count, k.size(), v.size());
  std::vector<T> stage(2 * count * te);  // per run: K [head][token][dim], then V
  std::vector<float> scales;             // int8, per run: the block's [K or V][head]
  if constexpr (std::same_as<T, std::int8_t>) scales.resize(2 * s.heads * count);
  const auto& pool = cache.pool();
  detail::kv_for_runs(cache, seq, first, count, "read_to_host",
                      [&](std::size_t i, std::size_t n, kv_block_id b, std::size_t slot) {
                        for (int which = 0; which < 2; ++which) {
                          const T* src = (which == 0 ? pool.k_data(b) : pool.v_data(b)) + slot * d;
                          T* dst = stage.data() + 2 * i * te + std::size_t(which) * n * te;
                          HONE_CUDA_CHECK(cudaMemcpy2DAsync(
                              dst, n * d * sizeof(T), src, s.block_tokens * d * sizeof(T),
                              n * d * sizeof(T), s.heads, cudaMemcpyDeviceToHost, stream));
                        }
                        if constexpr (std::same_as<T, std::int8_t>) {
                          HONE_CUDA_CHECK(cudaMemcpyAsync(
                              scales.data() + 2 * s.heads * i, detail::kv_block_scales(pool, b),
                              2 * s.heads * sizeof(float), cudaMemcpyDeviceToHost, stream));
                        }
                      });
  HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
  detail::kv_for_runs(cache, seq, first, count, "read_to_host",
                      [&](std::size_t i, std::size_t n, kv_block_id, std::size_t) {
                        for (int which = 0; which < 2; ++which) {
                          const T* src = stage.data() + 2 * i * te + std::size_t(which) * n * te;
                          float* out = (which == 0 ? k : v).data() + i * te;
                          for (std::size_t t = 0; t < n; ++t) {
                            for (std::size_t h = 0; h < s.heads; ++h) {
                              for (std::size_t j = 0; j < d; ++j) {
                                const T x = src[(h * n + t) * d + j];
                                if constexpr (std::same_as<T, std::int8_t>) {
                                  out[t * te + h * d + j] =
                                      float(x) * scales[2 * s.heads * i + which * s.heads + h];
                                } else {
                                  out[t * te + h * d + j] = detail::kv_to_float(x);
                                }
                              }
                            }
                          }
                        }
                      });
}

/// read_to_host(..., stream) on the default stream.
template <class T>
void read_to_host(const kv_cache<T, cuda_space>& cache, kv_seq_id seq, std::size_t first,
                  std::size_t count, std::span<float> k, std::span<float> v) {
  read_to_host(cache, seq, first, count, k, v, cudaStream_t{});
}

/// What a kernel needs to read K and V through the block tables of a batch of sequences (made by
/// kv_block_tables::upload; every pointer is device memory, the view is passed by value). Row
/// (i, pos, head) is the head_dim values of head `head` of the token at `pos` of the batch's
/// sequence i, for pos < lengths[i]. Valid until the tables are uploaded again or the cache
/// changes the blocks of these sequences.
template <class T>
struct kv_paged_view {
  const T* k = nullptr;                        // block b of K starts at k + b * block_elements
  const T* v = nullptr;                        // and of V at v + b * block_elements
  const float* scales = nullptr;               // int8 only: [block][K or V][head]
  const std::int32_t* block_tables = nullptr;  // [sequences][max_blocks], -1 past the end
  const std::int32_t* lengths = nullptr;       // [sequences], tokens of each sequence
  std::uint32_t sequences = 0;
  std::uint32_t max_blocks = 0;  // the row length of block_tables
  std::uint32_t max_length = 0;  // the longest sequence's tokens (host-side convenience)
  std::uint32_t block_tokens = 0, heads = 0, head_dim = 0;

  /// The block holding the token at `pos` of the batch's sequence i.
  [[nodiscard]] HONE_HOST_DEVICE std::int32_t block(std::uint32_t i,
                                                    std::uint32_t pos) const noexcept {
    return block_tables[std::size_t(i) * max_blocks + pos / block_tokens];
  }
  /// Offset of row (i, pos, head) from k (or v).
  [[nodiscard]] HONE_HOST_DEVICE std::size_t offset(std::uint32_t i, std::uint32_t pos,
                                                    std::uint32_t head) const noexcept {
    return ((std::size_t(block(i, pos)) * heads + head) * block_tokens + pos % block_tokens) *
           head_dim;
  }
  /// int8: the scales of K and V of row (i, pos, head) (value = q * scale); 1 otherwise.
  [[nodiscard]] HONE_HOST_DEVICE float k_scale(std::uint32_t i, std::uint32_t pos,
                                               std::uint32_t head) const noexcept {
    if constexpr (std::same_as<T, std::int8_t>) {
      return scales[(std::size_t(block(i, pos)) * 2) * heads + head];
    } else {
      return 1.0f;
    }
  }
  [[nodiscard]] HONE_HOST_DEVICE float v_scale(std::uint32_t i, std::uint32_t pos,
                                               std::uint32_t head) const noexcept {
    if constexpr (std::same_as<T, std::int8_t>) {
      return scales[(std::size_t(block(i, pos)) * 2 + 1) * heads + head];
    } else {
      return 1.0f;
    }
  }
  [[nodiscard]] HONE_HOST_DEVICE const T* k_row(std::uint32_t i, std::uint32_t pos,
                                                std::uint32_t head) const noexcept {
    return k + offset(i, pos, head);
  }
  [[nodiscard]] HONE_HOST_DEVICE const T* v_row(std::uint32_t i, std::uint32_t pos,
                                                std::uint32_t head) const noexcept {
    return v + offset(i, pos, head);
  }
};

/// The block tables of a batch of sequences in device memory, for paged-attention kernels. One
/// per stream; upload() each step (the tables change as sequences grow), reusing its memory.
class kv_block_tables {
 public:
  kv_block_tables() = default;
  kv_block_tables(const kv_block_tables&) = delete;
  kv_block_tables& operator=(const kv_block_tables&) = delete;
  ~kv_block_tables() {
    if (copied_ != nullptr) {
      (void)cudaEventSynchronize(copied_);
      (void)cudaEventDestroy(copied_);
    }
  }

  /// Copies the block tables and lengths of `seqs` (in this order) to device memory on `stream`
  /// (from page-locked staging; asynchronous) and returns the view of them. The next upload waits
  /// for this one's copy before refilling the staging, and reuses the device memory in stream
  /// order (when it must grow, it first waits for `stream`, where the kernels reading the old
  /// tables run).
  template <class T>
  [[nodiscard]] kv_paged_view<T> upload(const kv_cache<T, cuda_space>& cache,
                                        std::span<const kv_seq_id> seqs, cudaStream_t stream) {
    if (seqs.empty()) {
      throw config_error(
          "hone::serve::kv_block_tables::upload: no sequences; pass at least one sequence id");
    }
    if (seqs.size() > std::numeric_limits<std::int32_t>::max()) {
      throw config_error("hone::serve::kv_block_tables::upload: " + std::to_string(seqs.size()) +
                         " sequences do not fit an int32 table; upload fewer at once");
    }
    std::size_t max_blocks = 1, max_length = 0;
    for (const kv_seq_id s : seqs) {
      max_blocks = std::max(max_blocks, cache.block_table(s).size());
      max_length = std::max(max_length, cache.length(s));
    }
    const std::size_t n = seqs.size(), need = n * max_blocks + n;
    if (copied_ == nullptr) {
      HONE_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
    } else {
      HONE_CUDA_CHECK(cudaEventSynchronize(copied_));  // the last copy has read the staging
    }
    if (host_.size() < need) host_ = buffer<std::int32_t, pinned_host_space>(need);
    if (device_.size() < need) {
      HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
      device_ = buffer<std::int32_t, cuda_space>(need);
    }
    std::int32_t* h = host_.data();
    std::fill_n(h, need, std::int32_t{-1});
    for (std::size_t i = 0; i < n; ++i) {
      const auto t = cache.block_table(seqs[i]);
      for (std::size_t j = 0; j < t.size(); ++j) h[i * max_blocks + j] = std::int32_t(t[j]);
      h[n * max_blocks + i] = static_cast<std::int32_t>(cache.length(seqs[i]));
    }
    HONE_CUDA_CHECK(cudaMemcpyAsync(device_.data(), h, need * sizeof(std::int32_t),
                                    cudaMemcpyHostToDevice, stream));
    HONE_CUDA_CHECK(cudaEventRecord(copied_, stream));
    const kv_block_shape& s = cache.shape();
    kv_paged_view<T> view;
    view.k = cache.pool().k_data(0);
    view.v = cache.pool().v_data(0);
    if constexpr (std::same_as<T, std::int8_t>) view.scales = cache.pool().scales();
    view.block_tables = device_.data();
    view.lengths = device_.data() + n * max_blocks;
    view.sequences = static_cast<std::uint32_t>(n);
    view.max_blocks = static_cast<std::uint32_t>(max_blocks);
    view.max_length = static_cast<std::uint32_t>(max_length);
    view.block_tokens = static_cast<std::uint32_t>(s.block_tokens);
    view.heads = static_cast<std::uint32_t>(s.heads);
    view.head_dim = static_cast<std::uint32_t>(s.head_dim);
    return view;
  }

 private:
  buffer<std::int32_t, pinned_host_space> host_;
  buffer<std::int32_t, cuda_space> device_;
  cudaEvent_t copied_ = nullptr;
};

namespace detail {
// One block per (sequence, head): scores into shared memory, the softmax, then P V.
template <class T>
__global__ void __launch_bounds__(kv_small_threads)
    kv_decode_attention_kernel(kv_paged_view<T> view, const float* q, float* out, float scale) {
  extern __shared__ float scores[];  // max_length scores, then one float per warp
  float* scratch = scores + view.max_length;
  const std::uint32_t i = blockIdx.x, head = blockIdx.y, d = view.head_dim;
  const std::uint32_t len = static_cast<std::uint32_t>(view.lengths[i]);
  const float* qi = q + (std::size_t(i) * view.heads + head) * d;
  float* oi = out + (std::size_t(i) * view.heads + head) * d;
  float m = -INFINITY;
  for (std::uint32_t t = threadIdx.x; t < len; t += blockDim.x) {
    const T* kr = view.k_row(i, t, head);
    const float ks = view.k_scale(i, t, head);
    float acc = 0.0f;
    for (std::uint32_t j = 0; j < d; ++j) acc += qi[j] * (static_cast<float>(kr[j]) * ks);
    scores[t] = acc * scale;
    m = fmaxf(m, scores[t]);
  }
  m = kv_block_all_reduce(m, true, scratch);
  float l = 0.0f;
  for (std::uint32_t t = threadIdx.x; t < len; t += blockDim.x) {
    scores[t] = expf(scores[t] - m);
    l += scores[t];
  }
  l = kv_block_all_reduce(l, false, scratch);  // its __syncthreads() publishes the scores
  for (std::uint32_t j = threadIdx.x; j < d; j += blockDim.x) {
    float acc = 0.0f;
    for (std::uint32_t t = 0; t < len; ++t) {
      acc += scores[t] * (static_cast<float>(view.v_row(i, t, head)[j]) * view.v_scale(i, t, head));
    }
    oi[j] = len == 0 ? 0.0f : acc / l;
  }
}
}  // namespace detail

/// A reference paged decode attention: for each sequence i of the view and each head, one query
/// q[i][head][:] (float, device memory, sequences * heads * head_dim) attends over the sequence's
/// tokens through its block table: out[i][head][:] = softmax(scale * K q) V (0 for an empty
/// sequence), queued on `stream`. One block of 128 threads per (sequence, head), the scores in
/// shared memory (so at most about 12000 tokens per sequence); a correct, simple kernel to check
/// a fast one against, and to show how a kernel reads through the view.
template <class T>
void decode_attention(const kv_paged_view<T>& view, device_span<const float> q,
                      device_span<float> out, float scale, cudaStream_t stream) {
  const std::size_t n = std::size_t(view.sequences) * view.heads * view.head_dim;
  if (view.block_tables == nullptr || view.sequences == 0) {
    throw config_error(
        "hone::serve::decode_attention: the view is empty; make it with kv_block_tables::upload");
  }
  if (q.size() != n || out.size() != n || q.data() == nullptr || out.data() == nullptr) {
    const std::string want = std::to_string(n);
    throw config_error("hone::serve::decode_attention: q and out must hold sequences x heads x " +
                       std::string("head_dim = ") + want + " floats of device memory each, got " +
                       std::to_string(q.size()) + " and " + std::to_string(out.size()));
  }
  const std::size_t shared =
      (std::size_t(view.max_length) + detail::kv_small_threads / 32) * sizeof(float);
  if (shared > 48 * 1024) {
    const std::string most = std::to_string(48 * 1024 / 4 - detail::kv_small_threads / 32);
    throw config_error("hone::serve::decode_attention: the longest sequence has " +
                       std::to_string(view.max_length) + " tokens; this reference kernel keeps " +
                       "the scores in 48 KiB of shared memory (at most " + most + " tokens)");
  }
  detail::kv_decode_attention_kernel<T>
      <<<dim3(view.sequences, view.heads), detail::kv_small_threads, shared, stream>>>(
          view, q.data(), out.data(), scale);
  check_last_launch("hone::serve::decode_attention");
}

}  // namespace serve
HONE_NAMESPACE_END
