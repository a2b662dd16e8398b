// hone/core/detail/float_bits.hpp: bit-level helpers shared by the 16-bit floating-point types.
//
// The conversions of hone::bfloat16 and hone::half are integer arithmetic on the IEEE-754 bit
// patterns, identical in host and device code. Reading a float's bits needs a bit cast that is
// constexpr and callable from device code: std::bit_cast is constexpr but a host-only function for
// nvcc unless --expt-relaxed-constexpr is given, so hone calls the compiler builtin that
// std::bit_cast is built on (g++ >= 11, clang >= 9 and nvcc's front end all provide it, in host and
// device code, without extra flags).
#pragma once

#include <cstdint>
#include <type_traits>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace detail {

/// std::bit_cast that is constexpr and usable in host and device code.
template <class To, class From>
HONE_HOST_DEVICE constexpr To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From), "hone::detail::bit_cast needs types of the same size");
  static_assert(std::is_trivially_copyable_v<To> && std::is_trivially_copyable_v<From>,
                "hone::detail::bit_cast needs trivially copyable types");
  return __builtin_bit_cast(To, from);
}

/// The IEEE-754 binary32 bit pattern of `f`.
HONE_HOST_DEVICE constexpr std::uint32_t float_to_bits(float f) noexcept {
  return detail::bit_cast<std::uint32_t>(f);
}

/// The float whose IEEE-754 binary32 bit pattern is `u`.
HONE_HOST_DEVICE constexpr float bits_to_float(std::uint32_t u) noexcept {
  return detail::bit_cast<float>(u);
}

// binary32 layout: 1 sign bit, 8 exponent bits (bias 127), 23 stored mantissa bits.
inline constexpr std::uint32_t float_sign_mask = 0x80000000u;
inline constexpr std::uint32_t float_abs_mask = 0x7fffffffu;
inline constexpr std::uint32_t float_exponent_mask = 0x7f800000u;  // also +infinity's bits
inline constexpr std::uint32_t float_mantissa_mask = 0x007fffffu;

/// Whether the binary32 pattern `u` is a NaN (all exponent bits set and a non-zero mantissa).
HONE_HOST_DEVICE constexpr bool float_bits_is_nan(std::uint32_t u) noexcept {
  return (u & float_abs_mask) > float_exponent_mask;
}

/// The comparisons of a 2-byte float type T: those of the exact float values (NaN unordered,
/// -0 == +0). An empty base (CRTP), so T stays 2 bytes, trivially copyable and standard layout.
template <class T>
struct compare_as_float {
  friend HONE_HOST_DEVICE constexpr bool operator==(T a, T b) noexcept {
    return static_cast<float>(a) == static_cast<float>(b);
  }
  friend HONE_HOST_DEVICE constexpr bool operator<(T a, T b) noexcept {
    return static_cast<float>(a) < static_cast<float>(b);
  }
  friend HONE_HOST_DEVICE constexpr bool operator<=(T a, T b) noexcept {
    return static_cast<float>(a) <= static_cast<float>(b);
  }
  friend HONE_HOST_DEVICE constexpr bool operator>(T a, T b) noexcept {
    return static_cast<float>(a) > static_cast<float>(b);
  }
  friend HONE_HOST_DEVICE constexpr bool operator>=(T a, T b) noexcept {
    return static_cast<float>(a) >= static_cast<float>(b);
  }
};

}  // namespace detail
HONE_NAMESPACE_END
