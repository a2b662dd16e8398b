// hone/core/bfloat16.hpp: hone::bfloat16, the 16-bit "brain" floating-point type.
//
// Layout: 1 sign bit, 8 exponent bits (bias 127, as in float), 7 stored mantissa bits: the upper
// half of a float. Bit-compatible with CUDA's __nv_bfloat16, so arrays of either can be
// reinterpreted (same size, same alignment, same bits for every value), yet usable in host code
// that never includes a CUDA header.
//
// Guarantees (checked exhaustively over all 2^32 floats and all 2^16 values by
// tests/core/test_numeric.cpp):
//  - bfloat16(float) rounds to nearest, ties to even; float subnormals round correctly into the
//    bfloat16 subnormals; magnitudes >= (2 - 2^-8) * 2^127 become infinity.
//  - A NaN stays a NaN of the same sign, made quiet: the upper 7 payload bits are kept and the
//    quiet bit (0x0040) is set. (CUDA's __float2bfloat16_rn returns the canonical NaN 0x7fff
//    instead.)
//  - float(bfloat16) is exact; it preserves NaN payloads and signalling-ness.
// The conversions are integer arithmetic on the bit patterns and give the same bits in host and
// device code; they are constexpr.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "hone/core/config.hpp"
#include "hone/core/detail/float_bits.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

HONE_NAMESPACE_BEGIN

namespace detail {

/// Round-to-nearest-even conversion of a float to the bfloat16 bit pattern.
HONE_HOST_DEVICE constexpr std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const std::uint32_t u = detail::float_to_bits(f);
  if (detail::float_bits_is_nan(u)) {
    // Keep the sign and the upper payload bits; the quiet bit makes sure it is still a NaN when
    // the payload was only in the dropped lower bits.
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  }
  // Drop the lower 16 bits, rounding to nearest even: adding 0x7fff carries into the kept part
  // exactly when the dropped part is above one half, and adding the kept part's lowest bit as well
  // turns an exact half into a carry only when that bit is odd. A carry out of the mantissa moves
  // to the next binade, which is right, including the largest finite value rounding up to infinity;
  // subnormals need no special case because bfloat16 has float's exponent range. Infinity's bits
  // are unchanged (its lower 16 bits are zero and its kept part is even); no sum overflows because
  // NaNs were handled above.
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

/// Exact conversion of a bfloat16 bit pattern to float.
HONE_HOST_DEVICE constexpr float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return detail::bits_to_float(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace detail

/// 16-bit floating point with float's exponent range and 8 significant bits.
///
/// Trivially copyable, standard layout, 2 bytes, bits identical to __nv_bfloat16. Default
/// construction leaves the value uninitialized (like float); value-initialization gives +0.
class bfloat16 : public detail::compare_as_float<bfloat16> {
 public:
  bfloat16() = default;

  /// Rounds `f` to the nearest bfloat16, ties to even (see the file comment for NaN and overflow).
  HONE_HOST_DEVICE explicit constexpr bfloat16(float f) noexcept
      : bits_(detail::float_to_bfloat16_bits(f)) {}

  /// The bfloat16 with the bit pattern `bits`.
  [[nodiscard]] HONE_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t bits) noexcept {
    bfloat16 r{};
    r.bits_ = bits;
    return r;
  }

  /// The bit pattern.
  [[nodiscard]] HONE_HOST_DEVICE constexpr std::uint16_t bits() const noexcept { return bits_; }

  /// The exact float value.
  HONE_HOST_DEVICE explicit constexpr operator float() const noexcept {
    return detail::bfloat16_bits_to_float(bits_);
  }

#if defined(__CUDACC__)
  /// Same bits as CUDA's type (available in CUDA translation units only).
  HONE_HOST_DEVICE explicit bfloat16(const __nv_bfloat16& v) noexcept
      : bits_(static_cast<__nv_bfloat16_raw>(v).x) {}
  HONE_HOST_DEVICE explicit operator __nv_bfloat16() const noexcept {
    __nv_bfloat16_raw raw;
    raw.x = bits_;
    return __nv_bfloat16(raw);
  }
#endif

 private:
  std::uint16_t bits_;
};

static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2,
              "hone::bfloat16 must have the size and alignment of __nv_bfloat16");
static_assert(std::is_trivially_copyable_v<bfloat16> && std::is_standard_layout_v<bfloat16>,
              "hone::bfloat16 must be trivially copyable and standard layout");

/// The exact float value of `x`.
HONE_HOST_DEVICE constexpr float to_float(bfloat16 x) noexcept {
  return detail::bfloat16_bits_to_float(x.bits());
}

/// Whether `x` is neither infinite nor NaN.
HONE_HOST_DEVICE constexpr bool is_finite(bfloat16 x) noexcept {
  return (x.bits() & 0x7f80u) != 0x7f80u;
}
/// Whether `x` is +infinity or -infinity.
HONE_HOST_DEVICE constexpr bool is_inf(bfloat16 x) noexcept {
  return (x.bits() & 0x7fffu) == 0x7f80u;
}
/// Whether `x` is a NaN (quiet or signalling).
HONE_HOST_DEVICE constexpr bool is_nan(bfloat16 x) noexcept {
  return (x.bits() & 0x7fffu) > 0x7f80u;
}

HONE_NAMESPACE_END

/// numeric_limits for hone::bfloat16 (the values of __nv_bfloat16's format).
namespace std {
template <>
struct numeric_limits<hone::bfloat16> {
 private:
  using T = hone::bfloat16;

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
  static constexpr bool is_iec559 = false;  // not an IEEE-754 interchange format
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 8;
  static constexpr int digits10 = 2;
  static constexpr int max_digits10 = 4;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -125;
  static constexpr int min_exponent10 = -37;
  static constexpr int max_exponent = 128;
  static constexpr int max_exponent10 = 38;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  /// Smallest positive normal value, 2^-126.
  HONE_HOST_DEVICE static constexpr T min() noexcept { return T::from_bits(0x0080); }
  /// Largest finite value, (2 - 2^-7) * 2^127 (about 3.39e38).
  HONE_HOST_DEVICE static constexpr T max() noexcept { return T::from_bits(0x7f7f); }
  HONE_HOST_DEVICE static constexpr T lowest() noexcept { return T::from_bits(0xff7f); }
  /// 2^-7: the distance from 1 to the next value.
  HONE_HOST_DEVICE static constexpr T epsilon() noexcept { return T::from_bits(0x3c00); }
  HONE_HOST_DEVICE static constexpr T round_error() noexcept { return T::from_bits(0x3f00); }
  HONE_HOST_DEVICE static constexpr T infinity() noexcept { return T::from_bits(0x7f80); }
  HONE_HOST_DEVICE static constexpr T quiet_NaN() noexcept { return T::from_bits(0x7fc0); }
  HONE_HOST_DEVICE static constexpr T signaling_NaN() noexcept { return T::from_bits(0x7fa0); }
  /// Smallest positive subnormal value, 2^-133.
  HONE_HOST_DEVICE static constexpr T denorm_min() noexcept { return T::from_bits(0x0001); }
};
}  // namespace std
