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

#include "hone/core/config.hpp"
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

/// quantize_nearest for a signed map, keeping the sign of `value` (the unnormalized number) as
/// bitsandbytes' 8-bit optimizers do: a negative value never becomes 0 or a positive entry, a
/// positive value never a negative entry (it may become 0). The signed map's zero is +0, so a
/// small negative first moment would otherwise round to +0; exact zeros (also -0) stay zero.
HONE_HOST_DEVICE std::uint8_t quantize_keep_sign(const float* map, float x, float value) noexcept {
  int c = quantize_nearest(map, x);
  const float q = map[c];
  if (value < 0.0f && q >= 0.0f && c > 0) {
    --c;
  } else if (value > 0.0f && q < 0.0f && c < 255) {
    ++c;
  }
  return static_cast<std::uint8_t>(c);
}

namespace detail {
inline void check_block(std::size_t block, const char* who) {
  require(block >= 64 && block <= 4096 && (block & (block - 1)) == 0,
          std::string(who) + ": the quantization block must be a power of two in [64, 4096], got " +
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
