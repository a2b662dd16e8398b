// hone/serve/kv_block_pool.hpp: the storage of the paged KV cache (docs/serve.md, "Paged KV
// cache"): a pool of fixed-size blocks, each holding the keys and the values of `block_tokens`
// tokens for `heads` heads of `head_dim` elements, and a free list of block ids.
//
// The element type is a parameter: float, hone::bfloat16, hone::half, or std::int8_t with one
// float scale per block, per head, for K and for V (symmetric quantization, see write_token).
// The memory (elements, and int8 scales) comes from a hone memory space (hone/core/space.hpp):
// host memory, or device memory with hone::cuda_space (hone/serve/cuda/kv_cache.cuh moves the
// data there); the bookkeeping (free list) is host memory, and the element accessors that read or
// write through the CPU require a host-accessible space.
//
// Layout of one block, for K and for V separately: [head][token][dim], so the tokens of one head
// (what one attention head reads) are contiguous, and a per-head int8 scale covers one range.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "hone/core/bfloat16.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/half.hpp"
#include "hone/core/space.hpp"

HONE_NAMESPACE_BEGIN
namespace serve {

/// The element types a KV block may hold: float, hone::bfloat16, hone::half, std::int8_t (the
/// latter with a per-block, per-head scale). kv_block_pool and kv_cache state it as a sentence
/// (static_assert) for any other type.
template <class T>
concept kv_element = std::same_as<T, float> || std::same_as<T, bfloat16> || std::same_as<T, half> ||
    std::same_as<T, std::int8_t>;

/// The shape of one block: `block_tokens` tokens x `heads` heads x `head_dim` elements, for K and
/// for V each.
struct kv_block_shape {
  std::size_t block_tokens = 16;
  std::size_t heads = 1;
  std::size_t head_dim = 64;

  /// Elements of K (or of V) in one block.
  [[nodiscard]] constexpr std::size_t elements() const noexcept {
    return block_tokens * heads * head_dim;
  }
  /// Elements of K (or of V) of one token.
  [[nodiscard]] constexpr std::size_t token_elements() const noexcept { return heads * head_dim; }
  friend constexpr bool operator==(const kv_block_shape&, const kv_block_shape&) = default;
};

/// Thrown when an operation needs more blocks than the pool can give (free blocks plus cached
/// blocks that may be evicted). Recoverable: the cache is unchanged by the refused operation, and
/// the caller may preempt a sequence (free it, or fork and free) and retry, or refuse the request.
class out_of_blocks_error : public error {
 public:
  out_of_blocks_error(const std::string& what, std::size_t needed, std::size_t available)
      : error(what), needed_(needed), available_(available) {}
  /// Blocks the refused operation needed.
  [[nodiscard]] std::size_t needed() const noexcept { return needed_; }
  /// Blocks that could be had when it was refused (free plus evictable).
  [[nodiscard]] std::size_t available() const noexcept { return available_; }

 private:
  std::size_t needed_;
  std::size_t available_;
};

/// Block ids are indices into the pool, in [0, num_blocks).
using kv_block_id = std::uint32_t;

namespace detail {
template <class T>
[[nodiscard]] inline T kv_from_float(float x) noexcept {
  if constexpr (std::same_as<T, float>) {
    return x;
  } else {
    return T(x);
  }
}
template <class T>
[[nodiscard]] inline float kv_to_float(T x) noexcept {
  if constexpr (std::same_as<T, float>) {
    return x;
  } else {
    return static_cast<float>(x);
  }
}
}  // namespace detail

/// A fixed number of blocks in one allocation of `Space` memory, and a LIFO free list of their
/// ids (the block freed last is handed out first: its memory is most likely still in cache).
/// Not thread-safe: one thread (the scheduler) drives it, as the cache above it.
template <class T, class Space = host_space>
class kv_block_pool {
  static_assert(kv_element<T>,
                "hone::serve: the KV element type must be float, hone::bfloat16, hone::half or "
                "std::int8_t (int8 is stored with one float scale per block and head); convert "
                "the model's K and V to one of these.");
  static_assert(memory_space<Space>,
                "hone::serve: the KV pool's Space must be a hone memory space (hone::host_space, "
                "or a type with a complete hone::space_traits specialization).");

 public:
  using element_type = T;
  using space_type = Space;
  static constexpr bool quantized = std::same_as<T, std::int8_t>;
  /// int8 in host memory: the scales can be read through the CPU (scale()).
  static constexpr bool host_scales = quantized && space_traits<Space>::host_accessible;

  kv_block_pool(kv_block_shape shape, std::size_t num_blocks) : shape_(shape), blocks_(num_blocks) {
    if (shape.block_tokens == 0 || shape.heads == 0 || shape.head_dim == 0) {
      throw config_error(
          "hone::serve::kv_block_pool: the block shape has a zero extent (block_tokens " +
          std::to_string(shape.block_tokens) + ", heads " + std::to_string(shape.heads) +
          ", head_dim " + std::to_string(shape.head_dim) + "); give each at least 1");
    }
    if (num_blocks == 0 || num_blocks > std::numeric_limits<kv_block_id>::max()) {
      throw config_error("hone::serve::kv_block_pool: num_blocks is " + std::to_string(num_blocks) +
                         "; give between 1 and " +
                         std::to_string(std::numeric_limits<kv_block_id>::max()) + " blocks");
    }
    const std::size_t per = shape.elements();
    if (per > std::numeric_limits<std::size_t>::max() / sizeof(T) / 2 / num_blocks) {
      throw config_error(
          "hone::serve::kv_block_pool: " + std::to_string(num_blocks) + " blocks of " +
          std::to_string(per) +
          " elements each cannot be addressed; reduce num_blocks or the block shape");
    }
    bytes_ = 2 * num_blocks * per * sizeof(T);
    data_ = static_cast<T*>(space_traits<Space>::allocate(bytes_));
    if constexpr (quantized) {
      try {
        scales_ = static_cast<float*>(space_traits<Space>::allocate(scale_bytes()));
      } catch (...) {
        space_traits<Space>::deallocate(data_, bytes_);
        throw;
      }
      if constexpr (space_traits<Space>::host_accessible) {
        std::fill_n(scales_, 2 * num_blocks * shape.heads, 0.0f);
      }
    }
    free_.reserve(num_blocks);
    for (std::size_t i = num_blocks; i-- > 0;) free_.push_back(static_cast<kv_block_id>(i));
  }
  kv_block_pool(const kv_block_pool&) = delete;
  kv_block_pool& operator=(const kv_block_pool&) = delete;
  ~kv_block_pool() {
    space_traits<Space>::deallocate(data_, bytes_);
    if constexpr (quantized) space_traits<Space>::deallocate(scales_, scale_bytes());
  }

  [[nodiscard]] const kv_block_shape& shape() const noexcept { return shape_; }
  [[nodiscard]] std::size_t num_blocks() const noexcept { return blocks_; }
  [[nodiscard]] std::size_t free_blocks() const noexcept { return free_.size(); }
  /// Bytes of K and V storage (the int8 scales not included).
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

  /// Takes a free block; throws out_of_blocks_error when none is free (the pool is unchanged).
  /// A quantized block in host memory starts with zero scales (its contents are otherwise
  /// unspecified); in device memory, the first write (slot 0) resets them.
  [[nodiscard]] kv_block_id allocate() {
    if (free_.empty()) {
      throw out_of_blocks_error("hone::serve::kv_block_pool: all " + std::to_string(blocks_) +
                                    " blocks are in use; release a block first, or make the "
                                    "pool larger",
                                1, 0);
    }
    const kv_block_id id = free_.back();
    free_.pop_back();
    if constexpr (quantized && space_traits<Space>::host_accessible) {
      std::fill_n(scales_ + scale_index(id, 0, 0), 2 * shape_.heads, 0.0f);
    }
    return id;
  }
  /// Returns a block to the free list. The caller (kv_cache) guarantees it is allocated.
  void release(kv_block_id id) noexcept { free_.push_back(id); }

  /// The K (or V) elements of block `id`, [head][token][dim]. The pointer is in `Space` memory.
  [[nodiscard]] T* k_data(kv_block_id id) noexcept {
    return data_ + std::size_t(id) * shape_.elements();
  }
  [[nodiscard]] T* v_data(kv_block_id id) noexcept {
    return data_ + (blocks_ + std::size_t(id)) * shape_.elements();
  }
  [[nodiscard]] const T* k_data(kv_block_id id) const noexcept {
    return data_ + std::size_t(id) * shape_.elements();
  }
  [[nodiscard]] const T* v_data(kv_block_id id) const noexcept {
    return data_ + (blocks_ + std::size_t(id)) * shape_.elements();
  }
  /// int8 only: the dequantization scale of K (`which` 0) or V (1) of `head` in block `id`.
  [[nodiscard]] float scale(kv_block_id id, int which,
                            std::size_t head) const noexcept requires host_scales {
    return scales_[scale_index(id, which, head)];
  }
  /// int8 only: every scale, [block][K or V][head] (2 * heads floats per block), in `Space`
  /// memory.
  [[nodiscard]] float* scales() noexcept requires quantized { return scales_; }
  [[nodiscard]] const float* scales() const noexcept requires quantized { return scales_; }

  /// Copies the first `tokens` tokens of block `from` (K, V and scales) into block `to`.
  void copy_tokens(kv_block_id from, kv_block_id to,
                   std::size_t tokens) requires space_traits<Space>::host_accessible {
    const std::size_t n = tokens * shape_.head_dim;
    for (int which = 0; which < 2; ++which) {
      const T* src = which == 0 ? k_data(from) : v_data(from);
      T* dst = which == 0 ? k_data(to) : v_data(to);
      for (std::size_t h = 0; h < shape_.heads; ++h) {
        const std::size_t off = h * shape_.block_tokens * shape_.head_dim;
        if (n != 0) std::memcpy(dst + off, src + off, n * sizeof(T));
      }
    }
    if constexpr (quantized) {
      std::copy_n(scales_ + scale_index(from, 0, 0), 2 * shape_.heads,
                  scales_ + scale_index(to, 0, 0));
    }
  }

  /// Writes the K and V of one token (`heads * head_dim` floats each, head-major) at `slot` of
  /// block `id`, converting to T. `filled` is the number of tokens already in the block (slots
  /// [0, filled)); for int8 they may be requantized (below).
  ///
  /// int8: the scale s of a head is its largest |x| / 127 when the first non-zero value arrives;
  /// a later value beyond 127 s raises the scale to max(|x| / 127, 2 s) and requantizes the
  /// tokens already there (round(q * s_old / s_new)). Raising it at least twofold bounds the
  /// accumulated rounding: every value read back is within s_final of what was written
  /// (s_final <= 2 max|x| / 127 over that head of that block).
  void write_token(kv_block_id id, std::size_t slot, std::size_t filled, std::span<const float> k,
                   std::span<const float> v) requires space_traits<Space>::host_accessible {
    write_one(id, 0, slot, filled, k);
    write_one(id, 1, slot, filled, v);
  }

  /// Reads the K and V of the token at `slot` of block `id` as floats (dequantized for int8).
  void read_token(kv_block_id id, std::size_t slot, std::span<float> k,
                  std::span<float> v) const requires space_traits<Space>::host_accessible {
    read_one(id, 0, slot, k);
    read_one(id, 1, slot, v);
  }

 private:
  [[nodiscard]] std::size_t scale_bytes() const noexcept {
    return 2 * blocks_ * shape_.heads * sizeof(float);
  }
  [[nodiscard]] std::size_t scale_index(kv_block_id id, int which,
                                        std::size_t head) const noexcept {
    return (std::size_t(id) * 2 + std::size_t(which)) * shape_.heads + head;
  }

  void write_one(kv_block_id id, int which, std::size_t slot, std::size_t filled,
                 std::span<const float> x) {
    T* base = which == 0 ? k_data(id) : v_data(id);
    const std::size_t d = shape_.head_dim;
    for (std::size_t h = 0; h < shape_.heads; ++h) {
      T* head = base + h * shape_.block_tokens * d;
      const float* src = x.data() + h * d;
      if constexpr (quantized) {
        float& s = scales_[scale_index(id, which, h)];
        float amax = 0.0f;
        for (std::size_t j = 0; j < d; ++j) amax = std::max(amax, std::fabs(src[j]));
        if (amax > 127.0f * s) {
          const float ns = std::max(amax / 127.0f, 2.0f * s);
          if (s != 0.0f) {
            const float ratio = s / ns;
            for (std::size_t t = 0; t < filled; ++t) {
              if (t == slot) continue;
              T* row = head + t * d;
              for (std::size_t j = 0; j < d; ++j) {
                row[j] = static_cast<T>(std::lround(float(row[j]) * ratio));
              }
            }
          }
          s = ns;
        }
        T* row = head + slot * d;
        for (std::size_t j = 0; j < d; ++j) {
          const float q = s == 0.0f ? 0.0f : std::nearbyint(src[j] / s);
          row[j] = static_cast<T>(std::clamp(q, -127.0f, 127.0f));
        }
      } else {
        T* row = head + slot * d;
        for (std::size_t j = 0; j < d; ++j) row[j] = detail::kv_from_float<T>(src[j]);
      }
    }
  }

  void read_one(kv_block_id id, int which, std::size_t slot, std::span<float> x) const {
    const T* base = which == 0 ? k_data(id) : v_data(id);
    const std::size_t d = shape_.head_dim;
    for (std::size_t h = 0; h < shape_.heads; ++h) {
      const T* row = base + (h * shape_.block_tokens + slot) * d;
      float* dst = x.data() + h * d;
      if constexpr (quantized) {
        const float s = scales_[scale_index(id, which, h)];
        for (std::size_t j = 0; j < d; ++j) dst[j] = float(row[j]) * s;
      } else {
        for (std::size_t j = 0; j < d; ++j) dst[j] = detail::kv_to_float(row[j]);
      }
    }
  }

  kv_block_shape shape_;
  std::size_t blocks_;
  std::size_t bytes_ = 0;
  T* data_ = nullptr;
  float* scales_ = nullptr;        // int8 only: [block][K or V][head], in Space memory
  std::vector<kv_block_id> free_;  // LIFO
};

}  // namespace serve
HONE_NAMESPACE_END
