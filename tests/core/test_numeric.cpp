// tests/core/test_numeric.cpp: hone::bfloat16 and hone::half, checked exhaustively.
//
// Method. Every one of the 2^32 float bit patterns is converted with hone's constructors and the
// result is compared with an independent reference that works on values, not bits: it takes the
// float as a double, finds the two neighbouring values of the 16-bit format (multiples of the
// format's spacing in that binade, computed from the format's precision and minimum exponent),
// picks the nearer one in exact double arithmetic, breaks ties toward the even significand, and
// applies the overflow rule stated as a threshold (half: |x| >= 65520; bfloat16:
// |x| >= (2 - 2^-8) * 2^127). hone's result is decoded with hone::to_float and must equal the
// reference value bit for bit as a double (so the sign of zero counts). That comparison pins down
// the 16-bit pattern too, because the decode test below checks hone::to_float against a second
// independent decoder (sign * significand * 2^exponent with std::ldexp) for all 2^16 patterns,
// and distinct non-NaN patterns decode to distinct doubles. NaN inputs must give a quiet NaN of
// the same sign holding the upper payload bits.
//
// The 2^32 sweep runs over blocks of 2^16 consecutive patterns (one sign and one float exponent
// per block, so the spacing is computed once per block) with tbb::parallel_reduce. It costs about
// 10 s of CPU time per format in a Release build (split over the cores), about 30 s per format
// under ASan + UBSan at -O1, so it stays exhaustive in every configuration.
#define BOOST_TEST_MODULE hone_numeric
#include <boost/test/unit_test.hpp>

#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>

#include "hone/core/numeric.hpp"

namespace {

using hone::bfloat16;
using hone::half;

// ---- compile-time properties ----------------------------------------------------------------
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2);
static_assert(sizeof(half) == 2 && alignof(half) == 2);
static_assert(std::is_trivially_copyable_v<bfloat16> && std::is_trivially_copyable_v<half>);
static_assert(std::is_standard_layout_v<bfloat16> && std::is_standard_layout_v<half>);
static_assert(std::is_trivially_default_constructible_v<bfloat16>);
static_assert(std::is_trivially_default_constructible_v<half>);
static_assert(!std::is_convertible_v<float, bfloat16> && !std::is_convertible_v<float, half>,
              "construction from float is explicit");
static_assert(!std::is_convertible_v<bfloat16, float> && !std::is_convertible_v<half, float>,
              "conversion to float is explicit");
// The conversions are constexpr.
static_assert(bfloat16(1.0f).bits() == 0x3f80);
static_assert(half(1.0f).bits() == 0x3c00);
static_assert(hone::to_float(bfloat16::from_bits(0xc040)) == -3.0f);
static_assert(hone::to_float(half::from_bits(0x0001)) == 0x1p-24f);
static_assert(std::numeric_limits<half>::max().bits() == 0x7bff);
static_assert(std::numeric_limits<bfloat16>::is_specialized);
static_assert(bfloat16{}.bits() == 0 && half{}.bits() == 0, "value-initialization gives +0");

// ---- the independent reference ----------------------------------------------------------------

/// A binary floating-point format described by its parameters only.
struct format {
  const char* name;
  int precision;       // significant bits, the hidden one included
  int exponent_bits;   // width of the exponent field
  int emin;            // exponent of the smallest normal value
  double max_finite;   // (2 - 2^(1 - precision)) * 2^emax
  double overflow_at;  // (2 - 2^-precision) * 2^emax: from here on, round to infinity
};

constexpr format bf16_format{"bfloat16", 8, 8, -126, 0x1.fep127, 0x1.ffp127};
constexpr format half_format{"half", 11, 5, -14, 65504.0, 65520.0};

std::uint32_t float_bits(float f) {
  return std::bit_cast<std::uint32_t>(f);
}
std::uint64_t double_bits(double d) {
  return std::bit_cast<std::uint64_t>(d);
}

/// The spacing of `fmt`'s values among magnitudes in [2^k, 2^(k+1)); below the normal range the
/// spacing is that of the smallest normal binade (the subnormals).
double spacing(const format& fmt, int k) {
  return std::ldexp(1.0, std::max(k, fmt.emin) - (fmt.precision - 1));
}

/// The finite non-NaN `x` rounded to `fmt` (to nearest, ties to even), as a double, or
/// +-infinity; `ulp` is spacing(fmt, k) for the binade of x and `inv_ulp` its inverse (both
/// powers of two).
double reference_round(double x, double ulp, double inv_ulp, const format& fmt) {
  const double a = std::fabs(x);
  double r = 0.0;
  if (a >= fmt.overflow_at) {
    r = std::numeric_limits<double>::infinity();
  } else {
    // Neighbours: lower = n * ulp <= a < (n + 1) * ulp = upper. a * inv_ulp = a / ulp is exact
    // (a power of two) and below 2^precision, so n is its floor; both differences are exact too
    // (every value involved is a multiple of the float's spacing and spans at most 26 bits).
    const auto n = static_cast<std::int64_t>(a * inv_ulp);
    const double lower = static_cast<double>(n) * ulp;
    const double upper = static_cast<double>(n + 1) * ulp;
    const double below = a - lower;
    const double above = upper - a;
    if (below < above) {
      r = lower;
    } else if (above < below) {
      r = upper;
    } else {
      r = (n % 2 == 0) ? lower : upper;  // tie: the even significand
    }
  }
  return std::copysign(r, x);
}

/// Independent decode of a 16-bit pattern of `fmt`: sign * significand * 2^exponent.
double reference_decode(std::uint16_t bits, const format& fmt) {
  const int mantissa_bits = fmt.precision - 1;
  const int max_field = (1 << fmt.exponent_bits) - 1;
  const int bias = 1 - fmt.emin;
  const bool negative = (bits >> 15) != 0;
  const int e = (bits >> mantissa_bits) & max_field;
  const int m = bits & ((1 << mantissa_bits) - 1);
  double v = 0.0;
  if (e == max_field) {
    v = (m == 0) ? std::numeric_limits<double>::infinity()
                 : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), fmt.emin - mantissa_bits);
  } else {
    v = std::ldexp(static_cast<double>(m + (1 << mantissa_bits)), e - bias - mantissa_bits);
  }
  return negative ? -v : v;
}

/// The NaN a conversion from the float NaN with bits `u` must produce: same sign, exponent all
/// ones, quiet bit set, the upper payload bits that fit.
std::uint16_t expected_nan(std::uint32_t u, const format& fmt) {
  const int mantissa_bits = fmt.precision - 1;
  const std::uint32_t sign = (u >> 31) << 15;
  const std::uint32_t exponent = ((1u << fmt.exponent_bits) - 1u) << mantissa_bits;
  const std::uint32_t quiet = 1u << (mantissa_bits - 1);
  const std::uint32_t payload = (u & 0x007fffffu) >> (23 - mantissa_bits);
  return static_cast<std::uint16_t>(sign | exponent | quiet | payload);
}

// ---- the sweep ----------------------------------------------------------------------------------

/// Count of failures and the first few failing inputs (in increasing bit order).
struct failures {
  std::uint64_t count = 0;
  std::array<std::uint32_t, 8> first{};
  std::size_t stored = 0;

  void add(std::uint32_t input) {
    ++count;
    if (stored < first.size()) first[stored++] = input;
  }
  static failures join(failures left, const failures& right) {
    left.count += right.count;
    for (std::size_t i = 0; i < right.stored && left.stored < left.first.size(); ++i) {
      left.first[left.stored++] = right.first[i];
    }
    return left;
  }
};

template <class T>
failures check_block(std::uint32_t block, const format& fmt) {
  failures f;
  const std::uint32_t begin = block << 16;
  const std::uint32_t exponent_field = (begin >> 23) & 0xffu;
  if (exponent_field == 0xffu) {
    // Infinities and NaNs.
    for (std::uint32_t i = 0; i < 0x10000u; ++i) {
      const std::uint32_t u = begin | i;
      const float x = std::bit_cast<float>(u);
      const T got(x);
      const bool ok = std::isnan(x) ? got.bits() == expected_nan(u, fmt) && hone::is_nan(got) &&
                                          std::isnan(hone::to_float(got))
                                    : double_bits(static_cast<double>(hone::to_float(got))) ==
                                          double_bits(static_cast<double>(x));
      if (!ok) f.add(u);
    }
    return f;
  }
  // All 2^16 patterns share the sign and the binade [2^k, 2^(k+1)) (float subnormals: below
  // 2^-126, which is at or below either format's smallest normal).
  const int k = exponent_field == 0 ? -127 : static_cast<int>(exponent_field) - 127;
  const double ulp = spacing(fmt, k);
  const double inv_ulp = 1.0 / ulp;
  const auto differs = [&](std::uint32_t u) {
    const float x = std::bit_cast<float>(u);
    const double expected = reference_round(static_cast<double>(x), ulp, inv_ulp, fmt);
    const double got = static_cast<double>(hone::to_float(T(x)));
    return double_bits(got) != double_bits(expected);
  };
  // Count first (a tight loop), then look for the failing inputs only in a block that has some.
  std::uint32_t bad = 0;
  for (std::uint32_t i = 0; i < 0x10000u; ++i) bad += differs(begin | i) ? 1u : 0u;
  for (std::uint32_t i = 0; bad != 0 && i < 0x10000u; ++i) {
    if (differs(begin | i)) f.add(begin | i);
  }
  return f;
}

template <class T>
std::string describe(std::uint32_t u, const format& fmt) {
  const float x = std::bit_cast<float>(u);
  const T got(x);
  char line[200];
  if (std::isnan(x)) {
    std::snprintf(line, sizeof line, "float NaN 0x%08x -> %s 0x%04x, expected the NaN 0x%04x", u,
                  fmt.name, got.bits(), expected_nan(u, fmt));
    return line;
  }
  const int k = ((u >> 23) & 0xffu) == 0 ? -127 : static_cast<int>((u >> 23) & 0xffu) - 127;
  const double ulp = spacing(fmt, k);
  const double expected = reference_round(static_cast<double>(x), ulp, 1.0 / ulp, fmt);
  std::snprintf(line, sizeof line, "float 0x%08x (%a) -> %s 0x%04x (%a), expected %a", u,
                static_cast<double>(x), fmt.name, got.bits(),
                static_cast<double>(hone::to_float(got)), expected);
  return line;
}

template <class T>
void sweep_all_floats(const format& fmt) {
  const auto start = std::chrono::steady_clock::now();
  const failures result = tbb::parallel_reduce(
      tbb::blocked_range<std::uint32_t>(0, 0x10000u, 16), failures{},
      [&](const tbb::blocked_range<std::uint32_t>& r, failures acc) {
        for (std::uint32_t b = r.begin(); b != r.end(); ++b) {
          acc = failures::join(acc, check_block<T>(b, fmt));
        }
        return acc;
      },
      [](const failures& a, const failures& b) { return failures::join(a, b); });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("float -> %s: all 2^32 inputs in %.2f s, %llu mismatches\n", fmt.name, seconds,
              static_cast<unsigned long long>(result.count));
  for (std::size_t i = 0; i < result.stored; ++i) {
    BOOST_ERROR(describe<T>(result.first[i], fmt));
  }
  BOOST_TEST(result.count == 0u);
}

template <class T>
void check_all_values(const format& fmt) {
  std::uint64_t mismatches = 0;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const T x = T::from_bits(bits);
    const float f = hone::to_float(x);
    const double expected = reference_decode(bits, fmt);
    // The member conversion and the free function agree (bits: NaN != NaN).
    bool ok = float_bits(static_cast<float>(x)) == float_bits(f);
    if (std::isnan(expected)) {
      // Exact means the payload moves over unchanged (and a signalling NaN stays signalling).
      const int shift = 23 - (fmt.precision - 1);
      const std::uint32_t sign = static_cast<std::uint32_t>(bits >> 15) << 31;
      const std::uint32_t payload = (bits & ((1u << (fmt.precision - 1)) - 1u)) << shift;
      ok = ok && std::isnan(f) && float_bits(f) == (sign | 0x7f800000u | payload) &&
           hone::is_nan(x) && !hone::is_finite(x) && !hone::is_inf(x);
      // Back to the 16-bit type: the same NaN, made quiet.
      const auto quiet = static_cast<std::uint16_t>(1u << (fmt.precision - 2));
      ok = ok && T(f).bits() == (bits | quiet);
    } else {
      ok = ok && double_bits(static_cast<double>(f)) == double_bits(expected) &&
           T(f).bits() == bits &&  // round trip
           hone::is_finite(x) == std::isfinite(expected) &&
           hone::is_inf(x) == std::isinf(expected) && !hone::is_nan(x);
    }
    if (!ok) {
      if (++mismatches <= 8) {
        BOOST_ERROR(fmt.name << " 0x" << std::hex << b << " decodes to float 0x" << float_bits(f)
                             << " (" << std::hexfloat << f << "), round trip 0x" << T(f).bits()
                             << "; expected " << expected);
      }
    }
  }
  BOOST_TEST(mismatches == 0u);
}

float f32(std::uint32_t u) {
  return std::bit_cast<float>(u);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(numeric)

BOOST_AUTO_TEST_CASE(bfloat16_from_every_float) {
  sweep_all_floats<bfloat16>(bf16_format);
}

BOOST_AUTO_TEST_CASE(half_from_every_float) {
  sweep_all_floats<half>(half_format);
}

BOOST_AUTO_TEST_CASE(bfloat16_every_value_to_float) {
  check_all_values<bfloat16>(bf16_format);
}

BOOST_AUTO_TEST_CASE(half_every_value_to_float) {
  check_all_values<half>(half_format);
}

BOOST_AUTO_TEST_CASE(bfloat16_known_values) {
  BOOST_TEST(bfloat16(1.0f).bits() == 0x3f80);
  BOOST_TEST(bfloat16(-2.0f).bits() == 0xc000);
  BOOST_TEST(bfloat16(0.0f).bits() == 0x0000);
  BOOST_TEST(bfloat16(-0.0f).bits() == 0x8000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even 1.0.
  BOOST_TEST(bfloat16(1.00390625f).bits() == 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 0x3f81 and 0x3f82: ties to the even 0x3f82.
  BOOST_TEST(bfloat16(1.01171875f).bits() == 0x3f82);
  // Just above the tie rounds up.
  BOOST_TEST(bfloat16(std::nextafter(1.00390625f, 2.0f)).bits() == 0x3f81);
  // Overflow: (2 - 2^-8) * 2^127 goes to infinity, the float just below it to the largest finite.
  BOOST_TEST(bfloat16(0x1.ffp127f).bits() == 0x7f80);
  BOOST_TEST(bfloat16(std::nextafter(0x1.ffp127f, 0.0f)).bits() == 0x7f7f);
  BOOST_TEST(bfloat16(std::numeric_limits<float>::max()).bits() == 0x7f80);
  BOOST_TEST(bfloat16(-std::numeric_limits<float>::max()).bits() == 0xff80);
  BOOST_TEST(bfloat16(std::numeric_limits<float>::infinity()).bits() == 0x7f80);
  // Float subnormals: 2^-134 is half of bfloat16's smallest subnormal (tie to 0); 3 * 2^-134 ties
  // to the even 2 * 2^-133; the smallest float subnormal goes to zero with its sign.
  BOOST_TEST(bfloat16(f32(0x00008000u)).bits() == 0x0000);
  BOOST_TEST(bfloat16(f32(0x00018000u)).bits() == 0x0002);
  BOOST_TEST(bfloat16(f32(0x00008001u)).bits() == 0x0001);
  BOOST_TEST(bfloat16(f32(0x80000001u)).bits() == 0x8000);
  // The largest float subnormal rounds up to the smallest normal.
  BOOST_TEST(bfloat16(f32(0x007fffffu)).bits() == 0x0080);
  BOOST_TEST(hone::to_float(bfloat16::from_bits(0x0001)) == 0x1p-133f);
}

BOOST_AUTO_TEST_CASE(half_known_values) {
  BOOST_TEST(half(1.0f).bits() == 0x3c00);
  BOOST_TEST(half(-2.0f).bits() == 0xc000);
  BOOST_TEST(half(0.5f).bits() == 0x3800);
  BOOST_TEST(half(-0.0f).bits() == 0x8000);
  BOOST_TEST(half(65504.0f).bits() == 0x7bff);
  BOOST_TEST(hone::to_float(half::from_bits(0x7bff)) == 65504.0f);
  BOOST_TEST(half(std::nextafter(65520.0f, 0.0f)).bits() == 0x7bff);
  BOOST_TEST(half(65520.0f).bits() == 0x7c00);
  BOOST_TEST(half(-65520.0f).bits() == 0xfc00);
  BOOST_TEST(half(1.0e6f).bits() == 0x7c00);
  BOOST_TEST(half(-std::numeric_limits<float>::infinity()).bits() == 0xfc00);
  // Subnormals: 2^-24 is the smallest; 2^-25 ties to the even 0; just above it rounds to 2^-24;
  // 3 * 2^-25 ties to the even 2 * 2^-24.
  BOOST_TEST(half(0x1p-24f).bits() == 0x0001);
  BOOST_TEST(half(0x1p-25f).bits() == 0x0000);
  BOOST_TEST(half(-0x1p-25f).bits() == 0x8000);
  BOOST_TEST(half(std::nextafter(0x1p-25f, 1.0f)).bits() == 0x0001);
  BOOST_TEST(half(0x3p-25f).bits() == 0x0002);
  BOOST_TEST(half(0x1p-14f).bits() == 0x0400);
  BOOST_TEST(half(0x1.ff8p-15f).bits() == 0x03ff);
  BOOST_TEST(half(0x1.ffcp-15f).bits() == 0x0400);  // rounds up into the normals
  BOOST_TEST(half(std::numeric_limits<float>::denorm_min()).bits() == 0x0000);
  // 1 + 2^-11 ties to 1; 1 + 3 * 2^-11 ties to 1 + 2^-9.
  BOOST_TEST(half(1.00048828125f).bits() == 0x3c00);
  BOOST_TEST(half(1.00146484375f).bits() == 0x3c02);
}

BOOST_AUTO_TEST_CASE(nan_stays_nan_and_becomes_quiet) {
  // Signalling NaNs with the payload only in bits that are dropped: still NaN, quiet bit set.
  BOOST_TEST(bfloat16(f32(0x7f800001u)).bits() == 0x7fc0);
  BOOST_TEST(half(f32(0x7f800001u)).bits() == 0x7e00);
  // Sign and upper payload kept.
  BOOST_TEST(bfloat16(f32(0xffa00000u)).bits() == 0xffe0);
  BOOST_TEST(half(f32(0xffa00000u)).bits() == 0xff00);
  BOOST_TEST(half(f32(0x7fc02000u)).bits() == 0x7e01);
  BOOST_TEST(bfloat16(std::numeric_limits<float>::quiet_NaN()).bits() == 0x7fc0);
  BOOST_TEST(half(std::numeric_limits<float>::quiet_NaN()).bits() == 0x7e00);
  BOOST_TEST(hone::is_nan(bfloat16(std::numeric_limits<float>::signaling_NaN())));
  BOOST_TEST(hone::is_nan(half(std::numeric_limits<float>::signaling_NaN())));
  // Back to float: exact, the payload is not touched.
  BOOST_TEST(float_bits(hone::to_float(bfloat16::from_bits(0x7f81))) == 0x7f810000u);
  BOOST_TEST(float_bits(hone::to_float(half::from_bits(0xfd01))) == 0xffa02000u);
}

BOOST_AUTO_TEST_CASE(comparisons_and_classification) {
  const auto nan_b = std::numeric_limits<bfloat16>::quiet_NaN();
  const auto nan_h = std::numeric_limits<half>::quiet_NaN();
  BOOST_TEST((bfloat16(1.0f) < bfloat16(2.0f)));
  BOOST_TEST((bfloat16(2.0f) >= bfloat16(2.0f)));
  BOOST_TEST((bfloat16(-0.0f) == bfloat16(0.0f)));
  BOOST_TEST((half(-0.0f) == half(0.0f)));
  BOOST_TEST((half(3.0f) > half(-3.0f)));
  BOOST_TEST((half(3.0f) != half(-3.0f)));
  BOOST_TEST((half(1.0f) <= half(1.0f)));
  BOOST_TEST(!(nan_b == nan_b));
  BOOST_TEST((nan_b != nan_b));
  BOOST_TEST(!(nan_h < nan_h));
  BOOST_TEST(!(nan_h >= nan_h));
  BOOST_TEST(!hone::is_finite(nan_b));
  BOOST_TEST(!hone::is_finite(std::numeric_limits<half>::infinity()));
  BOOST_TEST(hone::is_inf(bfloat16::from_bits(0xff80)));
  BOOST_TEST(hone::is_inf(half(-1.0e6f)));
  BOOST_TEST(!hone::is_inf(nan_h));
  BOOST_TEST(!hone::is_nan(std::numeric_limits<half>::infinity()));
  BOOST_TEST(hone::is_finite(std::numeric_limits<half>::max()));
  BOOST_TEST(hone::is_finite(std::numeric_limits<bfloat16>::denorm_min()));
}

BOOST_AUTO_TEST_CASE(numeric_limits_values) {
  using LB = std::numeric_limits<bfloat16>;
  using LH = std::numeric_limits<half>;
  BOOST_TEST(hone::to_float(LH::max()) == 65504.0f);
  BOOST_TEST(hone::to_float(LH::lowest()) == -65504.0f);
  BOOST_TEST(hone::to_float(LH::min()) == 0x1p-14f);
  BOOST_TEST(hone::to_float(LH::denorm_min()) == 0x1p-24f);
  BOOST_TEST(hone::to_float(LH::epsilon()) == 0x1p-10f);
  BOOST_TEST(hone::to_float(LH::round_error()) == 0.5f);
  BOOST_TEST(hone::to_float(LB::max()) == 0x1.fep127f);
  BOOST_TEST(hone::to_float(LB::lowest()) == -0x1.fep127f);
  BOOST_TEST(hone::to_float(LB::min()) == 0x1p-126f);
  BOOST_TEST(hone::to_float(LB::denorm_min()) == 0x1p-133f);
  BOOST_TEST(hone::to_float(LB::epsilon()) == 0x1p-7f);
  BOOST_TEST(hone::to_float(LB::round_error()) == 0.5f);
  // epsilon is the distance from 1 to the next value.
  BOOST_TEST(hone::to_float(bfloat16::from_bits(0x3f81)) - 1.0f == hone::to_float(LB::epsilon()));
  BOOST_TEST(hone::to_float(half::from_bits(0x3c01)) - 1.0f == hone::to_float(LH::epsilon()));
  // Limits agree with the values next to them.
  BOOST_TEST(hone::to_float(half::from_bits(static_cast<std::uint16_t>(LH::max().bits() + 1))) ==
             std::numeric_limits<float>::infinity());
  BOOST_TEST(hone::to_float(bfloat16::from_bits(static_cast<std::uint16_t>(
                 LB::max().bits() + 1))) == std::numeric_limits<float>::infinity());
  BOOST_TEST(std::isinf(hone::to_float(LB::infinity())));
  BOOST_TEST(std::isinf(hone::to_float(LH::infinity())));
  BOOST_TEST(hone::to_float(LB::infinity()) > 0.0f);
  BOOST_TEST(hone::to_float(LH::infinity()) > 0.0f);
  // quiet_NaN is quiet (top mantissa bit set), signaling_NaN is a NaN without it.
  BOOST_TEST(hone::is_nan(LB::quiet_NaN()));
  BOOST_TEST((LB::quiet_NaN().bits() & 0x0040u) != 0u);
  BOOST_TEST(hone::is_nan(LB::signaling_NaN()));
  BOOST_TEST((LB::signaling_NaN().bits() & 0x0040u) == 0u);
  BOOST_TEST(hone::is_nan(LH::quiet_NaN()));
  BOOST_TEST((LH::quiet_NaN().bits() & 0x0200u) != 0u);
  BOOST_TEST(hone::is_nan(LH::signaling_NaN()));
  BOOST_TEST((LH::signaling_NaN().bits() & 0x0200u) == 0u);
  // Digits and exponents match float's conventions (float: digits 24, min_exponent -125).
  BOOST_TEST(LB::digits == 8);
  BOOST_TEST(LH::digits == 11);
  BOOST_TEST(LB::min_exponent == std::numeric_limits<float>::min_exponent);
  BOOST_TEST(LB::max_exponent == std::numeric_limits<float>::max_exponent);
  BOOST_TEST(LH::min_exponent == -13);
  BOOST_TEST(LH::max_exponent == 16);
  BOOST_TEST(std::ldexp(1.0f, LH::min_exponent - 1) == hone::to_float(LH::min()));
  BOOST_TEST(std::ldexp(1.0f, LB::min_exponent - 1) == hone::to_float(LB::min()));
  BOOST_TEST(LB::has_denorm == std::denorm_present);
  BOOST_TEST(LH::is_iec559);
}

BOOST_AUTO_TEST_SUITE_END()
