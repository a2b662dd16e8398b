// hone/optim/quantization.hpp: block-wise dynamic 8-bit quantization (Dettmers et al., "8-bit
// Optimizers via Block-wise Quantization", 2022; bitsandbytes), used by hone::adamw_8bit.
//
// A tensor is cut into blocks of `block` elements; each block stores its absolute maximum as a
// float and each element as the 8-bit code of the nearest entry of a 256-entry map, applied to
// x / absmax. The dynamic map (bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7,
// total_bits=8)) spends its codes on a dynamic exponent: decade 10^-k (k = 6..0) gets a linear
// grid of 2^(6-k) values (signed) or 2^(7-k) values (unsigned) between 0.1 and 1 times 10^-k, plus
// 0 and 1. The signed map covers [-0.993, 1], the unsigned map [0, 1]; the largest gap is 0.014
// (signed) and 0.007 (unsigned) near 1, and relative precision is about the same in every decade
// down to 1e-6, which is what an optimizer moment spanning many orders of magnitude needs.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/detail/float_bits.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN

/// A sorted 256-entry code book: code c stands for values[c] * absmax.
struct quantization_map {
  std::array<float, 256> values{};
};

/// bitsandbytes' create_dynamic_map(signed, max_exponent_bits = 7, total_bits = 8), computed in
/// float the way torch's CPU scalar kernels compute it (linspace, midpoints, decade scale); entries
/// agree with bitsandbytes' table to float rounding.
inline quantization_map make_dynamic_map(bool is_signed) {
  constexpr int max_exponent_bits = 7;
  constexpr float decade[max_exponent_bits] = {1e-6f, 1e-5f, 1e-4f, 1e-3f, 1e-2f, 1e-1f, 1.0f};
  std::array<float, 256> data{};
  std::size_t n = 0;
  for (int i = 0; i < max_exponent_bits; ++i) {
    const int items = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
    // torch.linspace(0.1, 1, items) in float: the first half counts up from the start, the second
    // half down from the end.
    const float start = 0.1f;
    const float end = 1.0f;
    const float step = (end - start) / static_cast<float>(items - 1);
    auto boundary = [&](int idx) {
      return idx < items / 2 ? start + step * static_cast<float>(idx)
                             : end - step * static_cast<float>(items - idx - 1);
    };
    for (int j = 0; j + 1 < items; ++j) {
      const float mean = (boundary(j) + boundary(j + 1)) / 2.0f;
      data[n++] = decade[i] * mean;
      if (is_signed) data[n++] = -decade[i] * mean;
    }
  }
  data[n++] = 0.0f;
  data[n++] = 1.0f;
  // n == 256 for both maps (signed: 2 * 127 + 2; unsigned: 254 + 2).
  std::sort(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(n));
  return quantization_map{data};
}

/// The signed (is_signed = true) or unsigned dynamic map, computed once.
inline const quantization_map& dynamic_map(bool is_signed) {
  static const quantization_map signed_map = make_dynamic_map(true);
  static const quantization_map unsigned_map = make_dynamic_map(false);
  return is_signed ? signed_map : unsigned_map;
}

/// The code of the entry of the sorted 256-entry `map` nearest to `x` (ties to the lower code;
/// below the first entry: 0; above the last: 255; NaN: 0). Eight branch-free probes.
HONE_HOST_DEVICE std::uint8_t quantize_nearest(const float* map, float x) noexcept {
  int lo = 0;  // becomes the number of entries < x (capped at 255)
  for (int half = 128; half > 0; half >>= 1) lo = map[lo + half - 1] < x ? lo + half : lo;
  if (lo == 0) return 0;
  return static_cast<std::uint8_t>(x - map[lo - 1] <= map[lo] - x ? lo - 1 : lo);
}

/// The code `c` (map's nearest entry to the normalized value) moved by one toward the sign of
/// `value` when the entry has the wrong sign (see quantize_keep_sign).
HONE_HOST_DEVICE std::uint8_t keep_sign(const float* map, int c, float value) noexcept {
  const float q = map[c];
  if (value < 0.0f && q >= 0.0f && c > 0) {
    --c;
  } else if (value > 0.0f && q < 0.0f && c < 255) {
    ++c;
  }
  return static_cast<std::uint8_t>(c);
}

/// quantize_nearest for a signed map, keeping the sign of `value` (the unnormalized number) as
/// bitsandbytes' 8-bit optimizers do: a negative value never becomes 0 or a positive entry, a
/// positive value never a negative entry (it may become 0). The signed map's zero is +0, so a
/// small negative first moment would otherwise round to +0; exact zeros (also -0) stay zero.
HONE_HOST_DEVICE std::uint8_t quantize_keep_sign(const float* map, float x, float value) noexcept {
  return keep_sign(map, quantize_nearest(map, x), value);
}

/// A direct index into a sorted 256-entry map that gives quantize_nearest's code with one table
/// load, one map load and one threshold load, instead of eight dependent probes (host only).
///
/// The float bit patterns are cut into 2^17 buckets by their top 17 bits (sign, exponent and the
/// 8 leading mantissa bits): each bucket is an interval of values, and `base[k]` is the number of
/// map entries below bucket k (capped at 255). When no bucket holds more than one entry -- true
/// for the dynamic maps, whose closest entries are 0.007 apart near 1 while a bucket there is
/// 0.002 wide, and whose decades shrink with the buckets -- the number of entries below x is
/// base + (map[base] < x), and the nearest code follows from a per-gap threshold that reproduces
/// quantize_nearest's own float comparison, so the result is the same bit for bit
/// (test_optim_quantization checks every 512th float, each bucket's ends and each entry's
/// neighbours). A map that fails the one-entry check reports usable() == false and callers keep the
/// binary search.
class quantization_index {
 public:
  static constexpr int key_shift = 15;  // 32 - 17 bits
  static constexpr std::size_t buckets = std::size_t{1} << (32 - key_shift);

  explicit quantization_index(const quantization_map& map) : map_(map), base_(buckets, 0) {
    const float* m = map_.values.data();
    usable_ = true;
    for (std::size_t k = 0; k < buckets; ++k) {
      const auto first = static_cast<std::uint32_t>(k << key_shift);
      const std::uint32_t last = first | ((std::uint32_t{1} << key_shift) - 1u);
      if (((first >> 23) & 0xffu) == 0xffu) {  // infinities and NaN: decided at lookup
        base_[k] = (first >> 31) != 0u ? 0 : 255;
        continue;
      }
      // The bucket's lowest and highest values (negative buckets run the other way).
      const bool negative = (first >> 31) != 0u;
      const float lo = detail::bits_to_float(negative ? last : first);
      const float hi = detail::bits_to_float(negative ? first : last);
      // Entries below lo, and entries in [lo, hi] (the map is sorted).
      const auto below = std::lower_bound(m, m + 256, lo) - m;
      const auto inside = std::upper_bound(m, m + 256, hi) - m - below;
      if (inside > 1) usable_ = false;
      base_[k] = static_cast<std::uint8_t>(std::min<std::ptrdiff_t>(below, 255));
    }
    // The rounding threshold of each gap (m[j-1], m[j]]: quantize_nearest returns j - 1 exactly
    // when x - m[j-1] <= m[j] - x in float arithmetic. Both sides are monotone in x (rounding is
    // monotone), so the set of such x is the floats of the gap up to one threshold, found here by
    // bisection over the gap's floats in value order; the lookup then compares x with it.
    for (int j = 1; j < 256; ++j) {
      const float a = m[j - 1];
      const float b = m[j];
      auto rounds_down = [&](float x) { return x - a <= b - x; };
      std::uint32_t lo_key = ordered_key(a);  // rounds_down(a) holds
      std::uint32_t hi_key = ordered_key(b);  // rounds_down(b) fails unless a == b
      if (!(a < b)) {
        usable_ = false;  // not strictly sorted: keep the binary search
        continue;
      }
      while (hi_key - lo_key > 1) {
        const std::uint32_t mid = lo_key + (hi_key - lo_key) / 2;
        (rounds_down(from_ordered_key(mid)) ? lo_key : hi_key) = mid;
      }
      threshold_[j] = from_ordered_key(lo_key);
    }
  }

  /// Whether lookups are exact for this map (no bucket holds two entries).
  [[nodiscard]] bool usable() const noexcept { return usable_; }
  [[nodiscard]] const float* map() const noexcept { return map_.values.data(); }

  /// quantize_nearest(map(), x), bit for bit (the binary search itself when !usable()).
  [[nodiscard]] std::uint8_t nearest(float x) const noexcept {
    const float* m = map_.values.data();
    if (!usable_) return quantize_nearest(m, x);
    if (x != x) return 0;  // NaN, as the binary search
    const std::uint32_t bits = detail::float_to_bits(x);
    int lo = base_[bits >> key_shift];
    lo += m[lo] < x ? 1 : 0;
    lo = std::min(lo, 255);
    if (lo == 0) return 0;
    // x - m[lo - 1] <= m[lo] - x, precomputed as a threshold (see the constructor).
    return static_cast<std::uint8_t>(x <= threshold_[lo] ? lo - 1 : lo);
  }
  /// quantize_keep_sign(map(), x, value), bit for bit.
  [[nodiscard]] std::uint8_t nearest_keep_sign(float x, float value) const noexcept {
    return keep_sign(map_.values.data(), nearest(x), value);
  }

 private:
  /// Floats in value order as unsigned integers (-0 just below +0).
  static std::uint32_t ordered_key(float f) noexcept {
    const std::uint32_t u = detail::float_to_bits(f);
    return (u >> 31) != 0u ? ~u : u | 0x80000000u;
  }
  static float from_ordered_key(std::uint32_t k) noexcept {
    return detail::bits_to_float((k >> 31) != 0u ? k & 0x7fffffffu : ~k);
  }

  quantization_map map_;
  std::vector<std::uint8_t> base_;
  std::array<float, 256> threshold_{};  // threshold_[j]: the largest x of (m[j-1], m[j]] giving j-1
  bool usable_ = false;
};

/// The index of dynamic_map(is_signed), built once (128 KiB each).
inline const quantization_index& dynamic_map_index(bool is_signed) {
  static const quantization_index signed_index(dynamic_map(true));
  static const quantization_index unsigned_index(dynamic_map(false));
  return is_signed ? signed_index : unsigned_index;
}

namespace detail {
inline void check_block(std::size_t block, const char* who) {
  HONE_REQUIRE(block >= 64 && block <= 4096 && (block & (block - 1)) == 0,
               std::string(who) +
                   ": the quantization block must be a power of two in [64, 4096], got " +
                   std::to_string(block));
}
}  // namespace detail

/// Quantizes x[0, n) block-wise: absmax[b] = max |x| over block b (ceil(n / block) blocks) and
/// codes[i] = the map code nearest to x[i] / absmax[b] (a block of zeros gets absmax 0).
inline void quantize_blockwise(const float* x, std::size_t n, std::size_t block,
                               const quantization_map& map, std::uint8_t* codes, float* absmax) {
  detail::check_block(block, "hone::quantize_blockwise");
  for (std::size_t b = 0; b * block < n; ++b) {
    const std::size_t begin = b * block;
    const std::size_t end = std::min(n, begin + block);
    float amax = 0.0f;
    for (std::size_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
    absmax[b] = amax;
    const float inv = amax > 0.0f ? 1.0f / amax : 0.0f;
    for (std::size_t i = begin; i < end; ++i) {
      codes[i] = quantize_nearest(map.values.data(), x[i] * inv);
    }
  }
}

/// The inverse of quantize_blockwise: out[i] = map[codes[i]] * absmax[i / block].
inline void dequantize_blockwise(const std::uint8_t* codes, const float* absmax, std::size_t n,
                                 std::size_t block, const quantization_map& map, float* out) {
  detail::check_block(block, "hone::dequantize_blockwise");
  for (std::size_t i = 0; i < n; ++i) out[i] = map.values[codes[i]] * absmax[i / block];
}

HONE_NAMESPACE_END
