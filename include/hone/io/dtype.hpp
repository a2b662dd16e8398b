// hone/io/dtype.hpp: the element types of the tensors hone stores (safetensors files, saved and
// memory-mapped replay buffers), their names and sizes, the C++ type of each, and the conversions
// between floating-point types (the export dtype of a checkpoint: fp32 master weights saved as
// bf16, a bf16 file loaded into fp32).
//
// The names are safetensors' own (safetensors/src/tensor.rs, Dtype). Every whole-byte dtype of the
// format is known; the sub-byte ones (F4, F6_E2M3, F6_E3M2) are recognized and refused with a
// sentence, since their byte size depends on the shape's packing.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "hone/core/bfloat16.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/half.hpp"

static_assert(std::endian::native == std::endian::little,
              "hone's tensor files are little-endian (as safetensors requires) and its readers "
              "and writers copy bytes as they are: a big-endian host is not supported");

HONE_NAMESPACE_BEGIN
namespace io {

/// The element type of a stored tensor. Enumerators follow safetensors' Dtype order.
enum class dtype : std::uint8_t {
  boolean,      // BOOL (1 byte, 0 or 1)
  u8,           // U8
  i8,           // I8
  f8_e5m2,      // F8_E5M2
  f8_e4m3,      // F8_E4M3
  f8_e8m0,      // F8_E8M0
  f8_e4m3fnuz,  // F8_E4M3FNUZ
  f8_e5m2fnuz,  // F8_E5M2FNUZ
  i16,          // I16
  u16,          // U16
  f16,          // F16 (IEEE binary16, hone::half)
  bf16,         // BF16 (hone::bfloat16)
  i32,          // I32
  u32,          // U32
  f32,          // F32
  c64,          // C64 (two F32)
  f64,          // F64
  i64,          // I64
  u64,          // U64
};

/// Every dtype, in enumerator order.
inline constexpr std::array<dtype, 19> all_dtypes = {
    dtype::boolean, dtype::u8,          dtype::i8,          dtype::f8_e5m2, dtype::f8_e4m3,
    dtype::f8_e8m0, dtype::f8_e4m3fnuz, dtype::f8_e5m2fnuz, dtype::i16,     dtype::u16,
    dtype::f16,     dtype::bf16,        dtype::i32,         dtype::u32,     dtype::f32,
    dtype::c64,     dtype::f64,         dtype::i64,         dtype::u64};

/// The safetensors name ("F32", "BF16", ...).
[[nodiscard]] constexpr std::string_view dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::boolean:
      return "BOOL";
    case dtype::u8:
      return "U8";
    case dtype::i8:
      return "I8";
    case dtype::f8_e5m2:
      return "F8_E5M2";
    case dtype::f8_e4m3:
      return "F8_E4M3";
    case dtype::f8_e8m0:
      return "F8_E8M0";
    case dtype::f8_e4m3fnuz:
      return "F8_E4M3FNUZ";
    case dtype::f8_e5m2fnuz:
      return "F8_E5M2FNUZ";
    case dtype::i16:
      return "I16";
    case dtype::u16:
      return "U16";
    case dtype::f16:
      return "F16";
    case dtype::bf16:
      return "BF16";
    case dtype::i32:
      return "I32";
    case dtype::u32:
      return "U32";
    case dtype::f32:
      return "F32";
    case dtype::c64:
      return "C64";
    case dtype::f64:
      return "F64";
    case dtype::i64:
      return "I64";
    case dtype::u64:
      return "U64";
  }
  return "?";
}

/// The dtype called `name` (exact, case-sensitive, as safetensors spells it), or nullopt.
[[nodiscard]] constexpr std::optional<dtype> dtype_from_name(std::string_view name) noexcept {
  for (dtype t : all_dtypes) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

/// Whether `name` is one of safetensors' sub-byte dtypes, which hone does not read or write.
[[nodiscard]] constexpr bool is_sub_byte_dtype_name(std::string_view name) noexcept {
  return name == "F4" || name == "F6_E2M3" || name == "F6_E3M2";
}

/// Bytes per element.
[[nodiscard]] constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::boolean:
    case dtype::u8:
    case dtype::i8:
    case dtype::f8_e5m2:
    case dtype::f8_e4m3:
    case dtype::f8_e8m0:
    case dtype::f8_e4m3fnuz:
    case dtype::f8_e5m2fnuz:
      return 1;
    case dtype::i16:
    case dtype::u16:
    case dtype::f16:
    case dtype::bf16:
      return 2;
    case dtype::i32:
    case dtype::u32:
    case dtype::f32:
      return 4;
    case dtype::c64:
    case dtype::f64:
    case dtype::i64:
    case dtype::u64:
      return 8;
  }
  return 1;
}

/// The floating-point dtypes hone converts between: F16, BF16, F32, F64.
[[nodiscard]] constexpr bool is_convertible_float(dtype t) noexcept {
  return t == dtype::f16 || t == dtype::bf16 || t == dtype::f32 || t == dtype::f64;
}

/// Whether convert() can turn `from` into `to`: equal types, or two convertible floats.
[[nodiscard]] constexpr bool can_convert(dtype from, dtype to) noexcept {
  return from == to || (is_convertible_float(from) && is_convertible_float(to));
}

namespace detail {
template <class T>
struct always_false : std::false_type {};

template <class T>
consteval dtype dtype_of_impl() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    return dtype::boolean;
  } else if constexpr (std::is_same_v<U, float>) {
    return dtype::f32;
  } else if constexpr (std::is_same_v<U, double>) {
    return dtype::f64;
  } else if constexpr (std::is_same_v<U, bfloat16>) {
    return dtype::bf16;
  } else if constexpr (std::is_same_v<U, half>) {
    return dtype::f16;
  } else if constexpr (std::is_same_v<U, std::byte>) {
    return dtype::u8;
  } else if constexpr (std::is_integral_v<U> && sizeof(U) == 1) {
    return std::is_signed_v<U> ? dtype::i8 : dtype::u8;
  } else if constexpr (std::is_integral_v<U> && sizeof(U) == 2) {
    return std::is_signed_v<U> ? dtype::i16 : dtype::u16;
  } else if constexpr (std::is_integral_v<U> && sizeof(U) == 4) {
    return std::is_signed_v<U> ? dtype::i32 : dtype::u32;
  } else if constexpr (std::is_integral_v<U> && sizeof(U) == 8) {
    return std::is_signed_v<U> ? dtype::i64 : dtype::u64;
  } else {
    static_assert(always_false<T>::value,
                  "hone::io::dtype_of<T>: T has no safetensors dtype. Use bool, a fixed-width "
                  "integer, float, double, hone::half or hone::bfloat16, or pass the bytes with "
                  "an explicit hone::io::dtype.");
    return dtype::u8;
  }
}

template <class T>
T load(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
void store(std::byte* p, T v) noexcept {
  std::memcpy(p, &v, sizeof(T));
}

template <class To, class From>
To convert_one(From x) noexcept {
  if constexpr (std::is_same_v<From, To>) {
    return x;
  } else if constexpr (std::is_same_v<From, double>) {
    // F64 to a narrower float goes through float (rounding twice; exact for F64 values that came
    // from float, which is what a checkpoint holds).
    if constexpr (std::is_same_v<To, float>) {
      return static_cast<float>(x);
    } else {
      return To(static_cast<float>(x));
    }
  } else {
    const float f = static_cast<float>(x);
    if constexpr (std::is_same_v<To, float>) {
      return f;
    } else if constexpr (std::is_same_v<To, double>) {
      return static_cast<double>(f);
    } else {
      return To(f);  // round to nearest even; NaN stays NaN
    }
  }
}

template <class From, class To>
void convert_loop(const std::byte* src, std::byte* dst, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    store<To>(dst + i * sizeof(To), convert_one<To>(load<From>(src + i * sizeof(From))));
  }
}

template <class From>
void convert_from(const std::byte* src, std::byte* dst, std::size_t n, dtype to) noexcept {
  switch (to) {
    case dtype::f16:
      convert_loop<From, half>(src, dst, n);
      break;
    case dtype::bf16:
      convert_loop<From, bfloat16>(src, dst, n);
      break;
    case dtype::f32:
      convert_loop<From, float>(src, dst, n);
      break;
    case dtype::f64:
      convert_loop<From, double>(src, dst, n);
      break;
    default:
      break;
  }
}
}  // namespace detail

/// The dtype of C++ type T (float -> F32, hone::bfloat16 -> BF16, std::int64_t -> I64, ...).
template <class T>
inline constexpr dtype dtype_of = detail::dtype_of_impl<T>();

/// Converts the elements of `src` (of dtype `from`) into `dst` (of dtype `to`): a copy for equal
/// types, otherwise float conversion rounding to nearest even (F32 -> BF16 is hone::bfloat16's
/// conversion). config_error if the types cannot be converted or the sizes do not describe the same
/// number of elements. Unaligned buffers are fine.
inline void convert(std::span<const std::byte> src, dtype from, std::span<std::byte> dst,
                    dtype to) {
  HONE_REQUIRE(can_convert(from, to),
               "hone::io::convert: cannot convert " + std::string(dtype_name(from)) + " to " +
                   std::string(dtype_name(to)) + " (only between F16, BF16, F32 and F64)");
  const std::size_t n = src.size() / dtype_size(from);
  HONE_REQUIRE(src.size() % dtype_size(from) == 0 && dst.size() == n * dtype_size(to),
               "hone::io::convert: " + std::to_string(src.size()) + " bytes of " +
                   std::string(dtype_name(from)) + " do not convert into " +
                   std::to_string(dst.size()) + " bytes of " + std::string(dtype_name(to)));
  if (from == to) {
    if (n != 0) std::memcpy(dst.data(), src.data(), src.size());
    return;
  }
  switch (from) {
    case dtype::f16:
      detail::convert_from<half>(src.data(), dst.data(), n, to);
      break;
    case dtype::bf16:
      detail::convert_from<bfloat16>(src.data(), dst.data(), n, to);
      break;
    case dtype::f32:
      detail::convert_from<float>(src.data(), dst.data(), n, to);
      break;
    case dtype::f64:
      detail::convert_from<double>(src.data(), dst.data(), n, to);
      break;
    default:
      break;
  }
}

}  // namespace io
HONE_NAMESPACE_END
