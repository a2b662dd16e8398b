// hone/compress/detail/int8_gemm_kernels.hpp: the int8 GEMM kernels behind
// hone/compress/quant_linear.hpp (int8_gemm, dynamic_int8_linear), internal. Each computes, for
// rows r < m of `a` (uint8, row stride kp) and 16-output panels [p0, p1) of packed weights
// (quant_linear.hpp's packed_int8_weights layout, given as its bytes and kp):
//   c[r * ldc + 16 p + i] = sum_{k < kp} a[r, k] * W[16 p + i, k]   (int32, exact)
// in the same integers whatever the kernel: scalar, AVX2 (_mm256_madd_epi16 on sign-extended
// 16-bit pairs, never saturating) and AVX-512 VNNI (_mm512_dpbusd_epi32). Also the dynamic layer's
// epilogue (int8_epilogue): y = scale_x * scale_w * (acc - zero_point * sum_k W) + b in double,
// rounded once to float, one output at a time (the reference) and in AVX-512, the same bits. Use
// the public functions of quant_linear.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hone/compress/quant.hpp"
#include "hone/core/config.hpp"
#include "hone/core/detail/no_contract.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__CUDACC__)
#define HONE_QUANT_X86 1
#include <immintrin.h>
#else
#define HONE_QUANT_X86 0
#endif

HONE_NAMESPACE_BEGIN
namespace compress::detail {

/// The dynamic layer's epilogue for the rows of one kernel call (row 0 = the call's first row):
/// y[r * ldy + o] = float((double(rows[r].scale) * wscale[o]) * (acc - rows[r].zero_point *
/// wsum[o]) + bias[o]) for o < n. wscale, wsum and bias hold np doubles (zero past n; bias zero
/// when the layer has none); wsum is exact (|sum| < 2^53), so is the correction and the
/// difference, which equals the int64 difference of the scalar epilogue.
struct int8_epilogue {
  const affine_params* rows = nullptr;
  const double* wscale = nullptr;
  const double* wsum = nullptr;
  const double* bias = nullptr;
  float* y = nullptr;
  std::size_t ldy = 0;
  std::size_t n = 0;
};

/// One output of the epilogue, the reference the vector form reproduces bit for bit: the product
/// is kept from being fused with the bias add (HONE_DETAIL_OPAQUE_FP), whatever -ffp-contract says.
inline float int8_epilogue_one(const int8_epilogue& e, std::size_t r, std::size_t o,
                               std::int32_t acc) noexcept {
  const double sx = e.rows[r].scale;
  const std::int64_t zp = e.rows[r].zero_point;
  const auto wsum = static_cast<std::int64_t>(e.wsum[o]);
  double v = sx * e.wscale[o] * static_cast<double>(static_cast<std::int64_t>(acc) - zp * wsum);
  HONE_DETAIL_OPAQUE_FP(v);
  return static_cast<float>(v + e.bias[o]);
}

/// The scalar kernel (the oracle the others match).
inline void int8_gemm_scalar(const std::uint8_t* a, std::size_t m, const std::int8_t* w,
                             std::size_t kp, std::size_t p0, std::size_t p1, std::int32_t* c,
                             std::size_t ldc) {
  const std::size_t groups = kp / 4;
  for (std::size_t r = 0; r < m; ++r) {
    const std::uint8_t* x = a + r * kp;
    for (std::size_t p = p0; p < p1; ++p) {
      const std::int8_t* panel = w + p * 16 * kp;
      std::int32_t acc[16] = {};
      for (std::size_t g = 0; g < groups; ++g) {
        for (std::size_t i = 0; i < 16; ++i) {
          for (std::size_t j = 0; j < 4; ++j) {
            acc[i] += static_cast<std::int32_t>(x[4 * g + j]) *
                      static_cast<std::int32_t>(panel[g * 64 + i * 4 + j]);
          }
        }
      }
      std::memcpy(c + r * ldc + 16 * p, acc, sizeof acc);
    }
  }
}

#if HONE_QUANT_X86
/// AVX2: per group of 4 k, the 64 panel bytes are sign-extended to 16-bit in four 16-byte pieces
/// (4 rows x 4 k each) and multiplied with the 4 activations zero-extended to 16-bit by
/// _mm256_madd_epi16, which adds adjacent products into int32: |u8 * s8| <= 32640, so a pair fits
/// and nothing saturates. Each output ends as two partial sums, added at the end.
__attribute__((target("avx2"))) inline void int8_gemm_avx2(const std::uint8_t* a, std::size_t m,
                                                           const std::int8_t* w, std::size_t kp,
                                                           std::size_t p0, std::size_t p1,
                                                           std::int32_t* c, std::size_t ldc) {
  const std::size_t groups = kp / 4;
  for (std::size_t p = p0; p < p1; ++p) {
    const std::int8_t* panel = w + p * 16 * kp;
    for (std::size_t r = 0; r < m; r += 2) {
      const bool two = r + 1 < m;
      const std::uint8_t* x0 = a + r * kp;
      const std::uint8_t* x1 = two ? x0 + kp : x0;
      // named accumulators, not arrays: at -O2 gcc 12 keeps arrays of them in memory (a load and
      // a store per multiply-add)
      __m256i s00 = _mm256_setzero_si256(), s01 = s00, s02 = s00, s03 = s00;
      __m256i s10 = s00, s11 = s00, s12 = s00, s13 = s00;
      for (std::size_t g = 0; g < groups; ++g) {
        std::uint32_t b0, b1;
        std::memcpy(&b0, x0 + 4 * g, 4);
        std::memcpy(&b1, x1 + 4 * g, 4);
        // (x0, x1, x2, x3) as 16-bit, repeated over the register
        const __m256i v0 = _mm256_cvtepu8_epi16(_mm_set1_epi32(static_cast<int>(b0)));
        const __m256i v1 = _mm256_cvtepu8_epi16(_mm_set1_epi32(static_cast<int>(b1)));
        const std::int8_t* wg = panel + g * 64;
#define HONE_AVX2_Q(q)                                                                        \
  {                                                                                           \
    const __m256i wq =                                                                        \
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wg + 16 * q))); \
    s0##q = _mm256_add_epi32(s0##q, _mm256_madd_epi16(wq, v0));                               \
    s1##q = _mm256_add_epi32(s1##q, _mm256_madd_epi16(wq, v1));                               \
  }
        HONE_AVX2_Q(0) HONE_AVX2_Q(1) HONE_AVX2_Q(2) HONE_AVX2_Q(3)
#undef HONE_AVX2_Q
      }
      const __m256i acc0[4] = {s00, s01, s02, s03}, acc1[4] = {s10, s11, s12, s13};
      // acc[q] lanes: (row 4q + t, half h) at lane 2t + h
      for (int q = 0; q < 4; ++q) {
        alignas(32) std::int32_t t0[8], t1[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(t0), acc0[q]);
        _mm256_store_si256(reinterpret_cast<__m256i*>(t1), acc1[q]);
        for (int t = 0; t < 4; ++t) {
          c[r * ldc + 16 * p + 4 * q + t] = t0[2 * t] + t0[2 * t + 1];
          if (two) c[(r + 1) * ldc + 16 * p + 4 * q + t] = t1[2 * t] + t1[2 * t + 1];
        }
      }
    }
  }
}

#define HONE_DETAIL_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

/// The epilogue of 16 accumulators of one row (outputs o0 .. o0 + 15 to y_row[o0 ..]) in double, 8
/// lanes at a time: the operations of int8_epilogue_one in the same order; sx and zp: the row's
/// scale and zero point broadcast. (The masked forms with a full mask stand in for the plain
/// intrinsics, whose undefined pass-through trips gcc 12's -Wmaybe-uninitialized.) Outputs at or
/// past e.n are not written.
HONE_DETAIL_VNNI_TARGET inline void int8_epilogue16(const int8_epilogue& e, __m512d sx, __m512d zp,
                                                    float* y_row, std::size_t o0,
                                                    __m512i acc) noexcept {
  __m256d half[2];
  for (int h = 0; h < 2; ++h) {
    const std::size_t o = o0 + 8 * static_cast<std::size_t>(h);
    const __m256i a8 = h == 0 ? _mm512_maskz_extracti64x4_epi64(0xf, acc, 0)
                              : _mm512_maskz_extracti64x4_epi64(0xf, acc, 1);
    const __m512d ad = _mm512_maskz_cvtepi32_pd(0xff, a8);
    __m512d corr = _mm512_mul_pd(zp, _mm512_loadu_pd(e.wsum + o));  // exact: < 2^53
    HONE_DETAIL_OPAQUE_FP(corr);
    const __m512d diff = _mm512_sub_pd(ad, corr);  // exact: the int64 difference
    __m512d v = _mm512_mul_pd(_mm512_mul_pd(sx, _mm512_loadu_pd(e.wscale + o)), diff);
    HONE_DETAIL_OPAQUE_FP(v);
    half[h] = _mm256_castps_pd(
        _mm512_maskz_cvtpd_ps(0xff, _mm512_add_pd(v, _mm512_loadu_pd(e.bias + o))));
  }
  // (half[0], half[1]) in one register: half[0] broadcast, then half[1] into the upper lanes
  const __m512 out = _mm512_castpd_ps(
      _mm512_mask_broadcast_f64x4(_mm512_maskz_broadcast_f64x4(0xff, half[0]), 0xf0, half[1]));
  if (o0 + 16 <= e.n) {
    _mm512_storeu_ps(y_row + o0, out);
  } else {
    _mm512_mask_storeu_ps(y_row + o0, static_cast<__mmask16>((1u << (e.n - o0)) - 1u), out);
  }
}

/// The epilogue of rows [r0, r1) of c (row stride ldc), row by row, 16 outputs at a time.
HONE_DETAIL_VNNI_TARGET inline void int8_epilogue_rows_avx512(const int8_epilogue& e,
                                                              std::size_t r0, std::size_t r1,
                                                              const std::int32_t* c,
                                                              std::size_t ldc) noexcept {
  for (std::size_t r = r0; r < r1; ++r) {
    const __m512d sx = _mm512_set1_pd(static_cast<double>(e.rows[r].scale));
    const __m512d zp = _mm512_set1_pd(static_cast<double>(e.rows[r].zero_point));
    float* y = e.y + r * e.ldy;
    for (std::size_t o0 = 0; o0 < e.n; o0 += 16) {
      int8_epilogue16(e, sx, zp, y, o0, _mm512_loadu_si512(c + r * ldc + o0));
    }
  }
}

/// AVX-512 VNNI tile: MR <= 8 rows of a x NP <= 2 panels (MR * NP zmm accumulators) over all of
/// k (kp bytes a row). One zmm holds a group (4 k x 16 outputs) of a panel; _mm512_dpbusd_epi32
/// multiplies it with a row's 4 activations broadcast (u8 x s8, four products summed into each
/// int32 lane, exact, not saturating): each weight load serves MR rows and each broadcast NP
/// panels. On the 2-core Zen VM of docs/benchmarks.md the 8 x 2 tile runs at 97-99% of the
/// measured dpbusd peak (two a cycle, ~520 G multiply-adds/s), so there is nothing left for a
/// bigger tile, and k is not blocked: slices of 512 to 2048 k summed through c measured 4-19%
/// slower at k = 4096 (the tile's 8 rows of a stay in L1, its two panels stream from L2), and the
/// epilogue applied to the tile in registers no faster than the separate pass. The accumulators
/// are named variables (c<row>_<panel>; the unused ones are discarded), not an array: with an
/// array gcc 12, depending on the surrounding code, copies every accumulator twice per group
/// (half the speed).
template <int MR, int NP>
HONE_DETAIL_VNNI_TARGET inline void int8_vnni_tile(const std::uint8_t* a, std::size_t kp,
                                                   const std::int8_t* w, std::int32_t* c,
                                                   std::size_t ldc) {
  static_assert(MR >= 1 && MR <= 8 && NP >= 1 && NP <= 2,
                "int8_vnni_tile takes 1 to 8 rows and 1 or 2 panels.");
  const std::size_t groups = kp / 4, ps = 16 * kp;
#define HONE_VNNI_ROW(r)                                                     \
  do {                                                                       \
    if constexpr (MR > r) {                                                  \
      std::int32_t b;                                                        \
      std::memcpy(&b, a + std::size_t{r} * kp + 4 * g, 4);                   \
      const __m512i x = _mm512_set1_epi32(b);                                \
      c##r##_0 = _mm512_dpbusd_epi32(c##r##_0, x, w0);                       \
      if constexpr (NP > 1) c##r##_1 = _mm512_dpbusd_epi32(c##r##_1, x, w1); \
    }                                                                        \
  } while (false)
#define HONE_VNNI_ONE(r, p, v)                                                \
  do {                                                                        \
    if constexpr (MR > r && NP > p)                                           \
      _mm512_storeu_si512(c + std::size_t{r} * ldc + 16 * std::size_t{p}, v); \
  } while (false)
  const __m512i z = _mm512_setzero_si512();
  __m512i c0_0 = z, c0_1 = z, c1_0 = z, c1_1 = z, c2_0 = z, c2_1 = z, c3_0 = z, c3_1 = z;
  __m512i c4_0 = z, c4_1 = z, c5_0 = z, c5_1 = z, c6_0 = z, c6_1 = z, c7_0 = z, c7_1 = z;
  for (std::size_t g = 0; g < groups; ++g) {
    const __m512i w0 = _mm512_loadu_si512(w + g * 64);
    const __m512i w1 = NP > 1 ? _mm512_loadu_si512(w + ps + g * 64) : w0;
    HONE_VNNI_ROW(0);
    HONE_VNNI_ROW(1);
    HONE_VNNI_ROW(2);
    HONE_VNNI_ROW(3);
    HONE_VNNI_ROW(4);
    HONE_VNNI_ROW(5);
    HONE_VNNI_ROW(6);
    HONE_VNNI_ROW(7);
  }
  HONE_VNNI_ONE(0, 0, c0_0);
  HONE_VNNI_ONE(0, 1, c0_1);
  HONE_VNNI_ONE(1, 0, c1_0);
  HONE_VNNI_ONE(1, 1, c1_1);
  HONE_VNNI_ONE(2, 0, c2_0);
  HONE_VNNI_ONE(2, 1, c2_1);
  HONE_VNNI_ONE(3, 0, c3_0);
  HONE_VNNI_ONE(3, 1, c3_1);
  HONE_VNNI_ONE(4, 0, c4_0);
  HONE_VNNI_ONE(4, 1, c4_1);
  HONE_VNNI_ONE(5, 0, c5_0);
  HONE_VNNI_ONE(5, 1, c5_1);
  HONE_VNNI_ONE(6, 0, c6_0);
  HONE_VNNI_ONE(6, 1, c6_1);
  HONE_VNNI_ONE(7, 0, c7_0);
  HONE_VNNI_ONE(7, 1, c7_1);
#undef HONE_VNNI_ONE
#undef HONE_VNNI_ROW
}

/// Every row of a (tiles of 8, then one of the remaining 1..7) against NP panels.
template <int NP>
HONE_DETAIL_VNNI_TARGET inline void int8_vnni_rows(const std::uint8_t* a, std::size_t kp,
                                                   std::size_t m, const std::int8_t* w,
                                                   std::int32_t* c, std::size_t ldc) {
  std::size_t r = 0;
  for (; r + 8 <= m; r += 8) int8_vnni_tile<8, NP>(a + r * kp, kp, w, c + r * ldc, ldc);
  const std::uint8_t* ar = a + r * kp;
  std::int32_t* cr = c + r * ldc;
  switch (m - r) {
    case 7:
      int8_vnni_tile<7, NP>(ar, kp, w, cr, ldc);
      break;
    case 6:
      int8_vnni_tile<6, NP>(ar, kp, w, cr, ldc);
      break;
    case 5:
      int8_vnni_tile<5, NP>(ar, kp, w, cr, ldc);
      break;
    case 4:
      int8_vnni_tile<4, NP>(ar, kp, w, cr, ldc);
      break;
    case 3:
      int8_vnni_tile<3, NP>(ar, kp, w, cr, ldc);
      break;
    case 2:
      int8_vnni_tile<2, NP>(ar, kp, w, cr, ldc);
      break;
    case 1:
      int8_vnni_tile<1, NP>(ar, kp, w, cr, ldc);
      break;
    default:
      break;
  }
}

/// The VNNI kernel: for each pair of panels (then a last single one), every row tile; the pair
/// (32 x kp bytes) is reused from L1/L2 across the row tiles.
HONE_DETAIL_VNNI_TARGET inline void int8_gemm_vnni(const std::uint8_t* a, std::size_t m,
                                                   const std::int8_t* w, std::size_t kp,
                                                   std::size_t p0, std::size_t p1, std::int32_t* c,
                                                   std::size_t ldc) {
  const std::size_t ps = 16 * kp;
  std::size_t p = p0;
  for (; p + 2 <= p1; p += 2) int8_vnni_rows<2>(a, kp, m, w + p * ps, c + 16 * p, ldc);
  if (p < p1) int8_vnni_rows<1>(a, kp, m, w + p * ps, c + 16 * p, ldc);
}
#undef HONE_DETAIL_VNNI_TARGET
#endif

}  // namespace compress::detail
HONE_NAMESPACE_END
