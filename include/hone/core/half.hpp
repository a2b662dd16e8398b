// hone/core/half.hpp: hone::half, the IEEE-754 binary16 floating-point type.
//
// Layout: 1 sign bit, 5 exponent bits (bias 15), 10 stored mantissa bits; largest finite value
// 65504, smallest normal 2^-14, smallest subnormal 2^-24. Bit-compatible with CUDA's __half, so
// arrays of either can be reinterpreted, yet usable in host code that never includes a CUDA header.
//
// Guarantees (checked exhaustively over all 2^32 floats and all 2^16 values by
// tests/core/test_numeric.cpp):
//  - half(float) rounds to nearest, ties to even, into the normals and the subnormals; magnitudes
//    >= 65520 (65504 plus half a unit in the last place) become infinity; magnitudes <= 2^-25
//    become a zero of the same sign (2^-25 itself is a tie and goes to the even 0).
//  - A NaN stays a NaN of the same sign, made quiet: the upper 10 payload bits are kept and the
//    quiet bit (0x0200) is set. (CUDA's __float2half_rn returns the canonical NaN 0x7fff instead.)
//  - float(half) is exact; it preserves NaN payloads and signalling-ness.
// The conversions are integer arithmetic on the bit patterns and give the same bits in host and
// device code; they are constexpr.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "hone/core/config.hpp"
#include "hone/core/detail/float_bits.hpp"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

HONE_NAMESPACE_BEGIN

namespace detail {

/// Round-to-nearest-even conversion of a float to the binary16 bit pattern.
HONE_HOST_DEVICE constexpr std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t u = detail::float_to_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & detail::float_abs_mask;
  if (a > detail::float_exponent_mask) {
    // NaN: keep the sign and the upper 10 payload bits, set the quiet bit (0x0200).
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu));
  }
  if (a >= 0x477ff000u) {
    // >= 65520 = 65504 + half an ulp (the tie rounds to the even "65536"): infinity; also infinity
    // itself.
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (a >= 0x38800000u) {
    // >= 2^-14: a normal half. Rebias the exponent (127 -> 15) and drop the lower 13 mantissa bits
    // rounding to nearest even (the same carry trick as bfloat16's; a carry out of the mantissa
    // moves to the next binade, and 65504's binade cannot overflow below the threshold above).
    const std::uint32_t r = a - 0x38000000u;
    return static_cast<std::uint16_t>(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
  }
  // Below 2^-14: a subnormal half or zero. With e the float's biased exponent and m its 24-bit
  // significand, the value in units of 2^-24 (the smallest subnormal) is m * 2^(e - 126).
  const std::uint32_t e = a >> 23;
  if (e < 102u) {
    // < 2^-25, half of the smallest subnormal (m < 2^24 and a shift of at least 25): zero. This
    // covers the float subnormals and zeros too.
    return static_cast<std::uint16_t>(sign);
  }
  const std::uint32_t m = (a & detail::float_mantissa_mask) | 0x00800000u;
  const std::uint32_t shift = 126u - e;  // 14..24
  std::uint32_t q = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1u);
  if (rest > halfway || (rest == halfway && (q & 1u) != 0u)) {
    ++q;  // may become 0x400, the smallest normal: the right bits
  }
  return static_cast<std::uint16_t>(sign | q);
}

/// Exact conversion of a binary16 bit pattern to float. Branch-free (integer masks), so loops
/// converting arrays of halves vectorize (the fp16 unscale pass of hone/precision/unscale.hpp).
HONE_HOST_DEVICE constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  const std::uint32_t m = h & 0x03ffu;
  // Normal: rebias the exponent. Infinity or NaN: the payload moves to the top of float's
  // mantissa (quiet bit included). Zero or subnormal: m * 2^-24, exact in float (m < 2^10 and
  // the product is a normal float, so no flush-to-zero mode can touch it).
  const std::uint32_t normal = ((e + 112u) << 23) | (m << 13);
  const std::uint32_t special = detail::float_exponent_mask | (m << 13);
  const std::uint32_t small = detail::float_to_bits(static_cast<float>(m) * 0x1p-24f);
  // Masks, not ?: -- g++ 12 turns the selects into branches in loops it does not unroll.
  const std::uint32_t is_special = 0u - static_cast<std::uint32_t>(e == 0x1fu);
  const std::uint32_t is_small = 0u - static_cast<std::uint32_t>(e == 0u);
  const std::uint32_t magnitude =
      (special & is_special) | (small & is_small) | (normal & ~(is_special | is_small));
  return detail::bits_to_float(sign | magnitude);
}

}  // namespace detail

/// IEEE-754 binary16: 11 significant bits, finite range +-65504.
///
/// Trivially copyable, standard layout, 2 bytes, bits identical to __half. Default construction
/// leaves the value uninitialized (like float); value-initialization gives +0.
class half : public detail::compare_as_float<half> {
 public:
  half() = default;

  /// Rounds `f` to the nearest half, ties to even (see the file comment for NaN and overflow).
  HONE_HOST_DEVICE explicit constexpr half(float f) noexcept
      : bits_(detail::float_to_half_bits(f)) {}

  /// The half with the bit pattern `bits`.
  [[nodiscard]] HONE_HOST_DEVICE static constexpr half from_bits(std::uint16_t bits) noexcept {
    half r{};
    r.bits_ = bits;
    return r;
  }

  /// The bit pattern.
  [[nodiscard]] HONE_HOST_DEVICE constexpr std::uint16_t bits() const noexcept { return bits_; }

  /// The exact float value.
  HONE_HOST_DEVICE explicit constexpr operator float() const noexcept {
    return detail::half_bits_to_float(bits_);
  }

#if defined(__CUDACC__)
  /// Same bits as CUDA's type (available in CUDA translation units only).
  HONE_HOST_DEVICE explicit half(const __half& v) noexcept : bits_(static_cast<__half_raw>(v).x) {}
  HONE_HOST_DEVICE explicit operator __half() const noexcept {
    __half_raw raw;
    raw.x = bits_;
    return __half(raw);
  }
#endif

 private:
  std::uint16_t bits_;
};

static_assert(sizeof(half) == 2 && alignof(half) == 2,
              "hone::half must have the size and alignment of __half");
static_assert(std::is_trivially_copyable_v<half> && std::is_standard_layout_v<half>,
              "hone::half must be trivially copyable and standard layout");

/// The exact float value of `x`.
HONE_HOST_DEVICE constexpr float to_float(half x) noexcept {
  return detail::half_bits_to_float(x.bits());
}

/// Whether `x` is neither infinite nor NaN.
HONE_HOST_DEVICE constexpr bool is_finite(half x) noexcept {
  return (x.bits() & 0x7c00u) != 0x7c00u;
}
/// Whether `x` is +infinity or -infinity.
HONE_HOST_DEVICE constexpr bool is_inf(half x) noexcept {
  return (x.bits() & 0x7fffu) == 0x7c00u;
}
/// Whether `x` is a NaN (quiet or signalling).
HONE_HOST_DEVICE constexpr bool is_nan(half x) noexcept {
  return (x.bits() & 0x7fffu) > 0x7c00u;
}

HONE_NAMESPACE_END

namespace std {
/// numeric_limits for hone::half (IEEE-754 binary16).
template <>
struct numeric_limits<hone::half> {
 private:
  using T = hone::half;

 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr bool is_iec559 = true;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 11;
  static constexpr int digits10 = 3;
  static constexpr int max_digits10 = 5;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -13;
  static constexpr int min_exponent10 = -4;
  static constexpr int max_exponent = 16;
  static constexpr int max_exponent10 = 4;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  /// Smallest positive normal value, 2^-14.
  HONE_HOST_DEVICE static constexpr T min() noexcept { return T::from_bits(0x0400); }
  /// Largest finite value, 65504.
  HONE_HOST_DEVICE static constexpr T max() noexcept { return T::from_bits(0x7bff); }
  HONE_HOST_DEVICE static constexpr T lowest() noexcept { return T::from_bits(0xfbff); }
  /// 2^-10: the distance from 1 to the next value.
  HONE_HOST_DEVICE static constexpr T epsilon() noexcept { return T::from_bits(0x1400); }
  HONE_HOST_DEVICE static constexpr T round_error() noexcept { return T::from_bits(0x3800); }
  HONE_HOST_DEVICE static constexpr T infinity() noexcept { return T::from_bits(0x7c00); }
  HONE_HOST_DEVICE static constexpr T quiet_NaN() noexcept { return T::from_bits(0x7e00); }
  HONE_HOST_DEVICE static constexpr T signaling_NaN() noexcept { return T::from_bits(0x7d00); }
  /// Smallest positive subnormal value, 2^-24.
  HONE_HOST_DEVICE static constexpr T denorm_min() noexcept { return T::from_bits(0x0001); }
};
}  // namespace std
