// hone/precision/unscale.hpp: the one fused pass per micro-batch that unscales the working
// gradients, accumulates them into the fp32 master gradients and, in the same pass, sums the
// squares of the result (PyTorch's _amp_foreach_non_finite_check_and_unscale_, the accumulation
// and the first half of clip_grad_norm_, in one read of the gradients and one write of the master
// gradients).
//
// The sum doubles as the overflow check: squares of floats cannot overflow a double (and
// n * FLT_MAX^2 < DBL_MAX for any n that fits in memory), so the sum is non-finite exactly when
// some gradient was inf or NaN.
#pragma once

#include <array>
#include <cstddef>
#include <type_traits>

#include "hone/core/bfloat16.hpp"
#include "hone/core/config.hpp"
#include "hone/core/detail/no_contract.hpp"
#include "hone/core/detail/separate_compilation.hpp"
#include "hone/core/half.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/core/parallel.hpp"

HONE_NAMESPACE_BEGIN

/// master = factor * g (first micro-batch) or master += factor * g (the others); returns the
/// square of the new master value in double. `factor` = micro-batch weight / loss scale.
template <class G, bool Accumulate>
struct unscale_accumulate {
  float factor;
  HONE_HOST_DEVICE double operator()(float& master, const G& g) const {
#if defined(__CUDA_ARCH__)
    // One rounding per operation, as on the host: no fused multiply-add contraction, so the
    // device's master gradients are the host's bit for bit.
    const float x = __fmul_rn(factor, static_cast<float>(g));
    if constexpr (Accumulate) {
      master = __fadd_rn(master, x);
    } else {
      master = x;
    }
#else
    const float x = factor * static_cast<float>(g);
    if constexpr (Accumulate) {
      master += x;
    } else {
      master = x;
    }
#endif
    const auto m = static_cast<double>(master);
    return m * m;
  }
};

namespace detail {
/// Elements per block of the host accumulate loop: its products wait in a stack buffer (1 KiB).
inline constexpr std::size_t unscale_block = 256;

#if defined(HONE_DETAIL_HAS_AVX2) && defined(HONE_ISA_DISPATCH)
/// fp16 -> float for n elements with F16C, bit for bit to_float (core/detail/simd.hpp's
/// half8_to_float): what the AVX2 and AVX-512 unscale loops widen a block with.
HONE_DETAIL_TARGET_AVX2_NOFMA inline void widen_half_f16c(const half* p, std::size_t n,
                                                          float* out) noexcept {
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(out + j, half8_to_float(p + j));
  for (; j < n; ++j) out[j] = to_float(p[j]);
}
#endif

/// master[i] (+)= factor * g[i] over [begin, end) (Accumulate: added to the master gradient, else
/// stored), each product rounded before the add, and the sum of squares of the new master values
/// (reduce_lanes partial sums, as reduce_range: the bits of transform_reduce with
/// unscale_accumulate<G, false> for the first micro-batch).
///
/// g++ fuses `master + factor * g` into one FMA under FMA flags (-march=native) even when the
/// product is a separate statement, which changes the master gradients' bits against builds
/// without FMA and against the device (__fmul_rn then __fadd_rn). An empty asm on each product
/// would stop that but also the vectorizer (an fp16 accumulate ran 8x slower), so a block's
/// products are computed by one vector loop into a buffer that the compiler must assume an empty
/// asm statement rewrote, and added by a second vector loop. With Widen, a block of fp16 gradients
/// is first widened by widen_half_f16c (one instruction per 8; the integer conversion otherwise).
/// Without Store the master gradients are neither read nor written (master may be null): the sum
/// of squares alone, the bits of the storing pass's (the trainer's direct route).
template <class G, bool Accumulate, bool Widen = false, bool Store = true>
HONE_FORCEINLINE double unscale_add_loop(float factor, float* HONE_RESTRICT master,
                                         const G* HONE_RESTRICT g, std::size_t begin,
                                         std::size_t end) {
  std::array<double, reduce_lanes> acc{};
  alignas(64) float x[unscale_block];
  for (std::size_t i = begin; i < end; i += unscale_block) {
    const std::size_t len = end - i < unscale_block ? end - i : unscale_block;
    if constexpr (Widen) {
      widen_half_f16c(g + i, len, x);
      for (std::size_t k = 0; k < len; ++k) x[k] = factor * x[k];
    } else {
      for (std::size_t k = 0; k < len; ++k) x[k] = factor * static_cast<float>(g[i + k]);
    }
    HONE_DETAIL_OPAQUE_MEMORY(x);
    std::size_t k = 0;
    for (; k + reduce_lanes <= len; k += reduce_lanes) {
      HONE_PRAGMA_UNROLL_LANES
      for (std::size_t l = 0; l < reduce_lanes; ++l) {
        const float m = Accumulate ? master[i + k + l] + x[k + l] : x[k + l];
        if constexpr (Store) master[i + k + l] = m;
        acc[l] += static_cast<double>(m) * static_cast<double>(m);
      }
    }
    for (std::size_t l = 0; k < len; ++k, ++l) {
      const float m = Accumulate ? master[i + k] + x[k] : x[k];
      if constexpr (Store) master[i + k] = m;
      acc[l] += static_cast<double>(m) * static_cast<double>(m);
    }
  }
  double r = acc[0];
  for (std::size_t l = 1; l < reduce_lanes; ++l) r += acc[l];
  return r;
}
template <class G, bool Accumulate, bool Store = true>
HONE_VECTORIZE_FUNCTION double unscale_add_range_base(float factor, float* HONE_RESTRICT master,
                                                      const G* HONE_RESTRICT g, std::size_t begin,
                                                      std::size_t end) {
  return unscale_add_loop<G, Accumulate, false, Store>(factor, master, g, begin, end);
}
#if defined(HONE_DETAIL_HAS_AVX2) && defined(HONE_ISA_DISPATCH)
// The same loop for AVX2 (no FMA: the bits of the SSE2 loop), chosen at run time (core/isa.hpp);
// fp16 gradients widened with F16C.
template <class G, bool Accumulate, bool Store = true>
HONE_VECTORIZE_FUNCTION HONE_DETAIL_TARGET_AVX2_NOFMA HONE_DETAIL_FLATTEN double
unscale_add_range_avx2(float factor, float* HONE_RESTRICT master, const G* HONE_RESTRICT g,
                       std::size_t begin, std::size_t end) {
  return unscale_add_loop<G, Accumulate, std::is_same_v<G, half>, Store>(factor, master, g, begin,
                                                                         end);
}
#endif
#if defined(HONE_DETAIL_HAS_AVX512) && defined(HONE_ISA_DISPATCH)
// And for AVX-512: this loop may use the FMA AVX-512 brings, because no product in it can fuse
// (the products pass through HONE_DETAIL_OPAQUE_MEMORY; a square of a float is exact in double, so
// a fused square-and-add rounds as the separate ones do).
template <class G, bool Accumulate, bool Store = true>
HONE_VECTORIZE_FUNCTION HONE_DETAIL_TARGET_AVX512 HONE_DETAIL_FLATTEN double
unscale_add_range_avx512(float factor, float* HONE_RESTRICT master, const G* HONE_RESTRICT g,
                         std::size_t begin, std::size_t end) {
  return unscale_add_loop<G, Accumulate, std::is_same_v<G, half>, Store>(factor, master, g, begin,
                                                                         end);
}
#endif
#if defined(HONE_DETAIL_HAS_AVX2) && defined(HONE_ISA_DISPATCH)
/// 8 gradients widened to float for a product (F16C for fp16, a 16-bit shift for bf16): exact,
/// except that F16C quiets a signalling NaN, which the product that follows would do anyway (so
/// the product's bits are those of to_float's value times the factor; no half8_to_float fix).
template <class G>
HONE_DETAIL_TARGET_AVX2_NOFMA inline __m256 widen8(const G* p) noexcept {
  if constexpr (std::is_same_v<G, float>) {
    return _mm256_loadu_ps(p);
  } else if constexpr (std::is_same_v<G, half>) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    static_assert(std::is_same_v<G, bfloat16>);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  }
}
/// The sum of squares of unscale_add_loop<G, false, ..., false> in registers: no buffer (with
/// nothing stored there is no add for a product to fuse into; a square of a float is exact in
/// double, so a fused square-and-add rounds as the separate ones do). Lane l of the 16 holds the
/// elements at begin + l (mod 16), the tail's first element lane 0, as that loop's: the same bits.
/// Two 8-lane vectors of doubles on AVX-512; four 4-lane ones on AVX2. Taken for fp16 gradients
/// (1.5-1.7x the buffered loop's speed on both targets, 64 Mi elements, 2 threads); for fp32 and
/// bf16 the buffered loop was as fast or faster, so they keep it.
/// The register loops' end: the tail's squares into lanes 0.., then the lanes summed in order.
template <class G>
inline double finish_sum_squares(double* acc, float factor, const G* g, std::size_t i,
                                 std::size_t end) noexcept {
  for (std::size_t l = 0; i < end; ++i, ++l) {
    const auto m = static_cast<double>(factor * static_cast<float>(g[i]));
    acc[l] += m * m;
  }
  double r = acc[0];
  for (std::size_t l = 1; l < reduce_lanes; ++l) r += acc[l];
  return r;
}
template <class G>
HONE_DETAIL_TARGET_AVX2_NOFMA HONE_DETAIL_FLATTEN inline double sum_squares_avx2(
    float factor, const G* HONE_RESTRICT g, std::size_t begin, std::size_t end) {
  static_assert(reduce_lanes == 16);
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  const __m256 f = _mm256_set1_ps(factor);
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m256 x0 = _mm256_mul_ps(f, widen8(g + i));
    const __m256 x1 = _mm256_mul_ps(f, widen8(g + i + 8));
    const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x0));
    const __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1));
    const __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(x1));
    const __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1));
    a0 = _mm256_add_pd(a0, _mm256_mul_pd(d0, d0));
    a1 = _mm256_add_pd(a1, _mm256_mul_pd(d1, d1));
    a2 = _mm256_add_pd(a2, _mm256_mul_pd(d2, d2));
    a3 = _mm256_add_pd(a3, _mm256_mul_pd(d3, d3));
  }
  alignas(32) double acc[reduce_lanes];
  _mm256_store_pd(acc, a0);
  _mm256_store_pd(acc + 4, a1);
  _mm256_store_pd(acc + 8, a2);
  _mm256_store_pd(acc + 12, a3);
  return finish_sum_squares(acc, factor, g, i, end);
}
#endif
#if defined(HONE_DETAIL_HAS_AVX512) && defined(HONE_ISA_DISPATCH)
template <class G>
HONE_DETAIL_TARGET_AVX512 HONE_DETAIL_FLATTEN inline double sum_squares_avx512(
    float factor, const G* HONE_RESTRICT g, std::size_t begin, std::size_t end) {
  static_assert(reduce_lanes == 16);
  __m512d a0 = _mm512_setzero_pd(), a1 = a0;
  const __m256 f = _mm256_set1_ps(factor);
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    // (The maskz form with an all-ones mask: GCC 12 warns about the unmasked intrinsic's
    // undefined pass-through operand under -Wmaybe-uninitialized.)
    const __m512d lo = _mm512_maskz_cvtps_pd(0xFF, _mm256_mul_ps(f, widen8(g + i)));
    const __m512d hi = _mm512_maskz_cvtps_pd(0xFF, _mm256_mul_ps(f, widen8(g + i + 8)));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  alignas(64) double acc[reduce_lanes];
  _mm512_store_pd(acc, a0);
  _mm512_store_pd(acc + 8, a1);
  return finish_sum_squares(acc, factor, g, i, end);
}
#endif

template <class G, bool Accumulate, bool Store = true>
double unscale_add_range(float factor, float* master, const G* g, std::size_t begin,
                         std::size_t end) {
#if defined(HONE_DETAIL_HAS_AVX2) && defined(HONE_ISA_DISPATCH)
  const isa t = active_isa();
#if defined(HONE_DETAIL_HAS_AVX512)
  if (t == isa::avx512) {
    if constexpr (!Store && std::is_same_v<G, half>) {
      return sum_squares_avx512(factor, g, begin, end);
    }
    return unscale_add_range_avx512<G, Accumulate, Store>(factor, master, g, begin, end);
  }
#endif
  if (t == isa::avx2 || t == isa::avx512) {
    if constexpr (!Store && std::is_same_v<G, half>) {
      return sum_squares_avx2(factor, g, begin, end);
    }
    return unscale_add_range_avx2<G, Accumulate, Store>(factor, master, g, begin, end);
  }
#endif
  return unscale_add_range_base<G, Accumulate, Store>(factor, master, g, begin, end);
}
}  // namespace detail

namespace detail {
/// The sum over the lists' chunks (make_chunks with `tuning.grain`) of range(pointers, begin,
/// end), reduced deterministically: the skeleton both passes below share, so that they cut and
/// add alike.
template <class G, class Range>
double reduce_unscale_chunks(const tensor_lists<float, const G>& lists, host_tuning tuning,
                             const Range& range) {
  if (lists.empty()) return 0.0;
  const auto chunks = make_chunks(lists, tuning.grain);
  return parallel_reduce_ranges(
      chunks.size(), 1, 0.0,
      [&](std::size_t begin, std::size_t end, double acc) {
        for (std::size_t c = begin; c != end; ++c) {
          const auto& ch = chunks[c];
          acc += range(lists.template pointer<0>(ch.tensor), lists.template pointer<1>(ch.tensor),
                       ch.begin, ch.end);
        }
        return acc;
      },
      plus{});
}
}  // namespace detail

/// Runs unscale_accumulate over (master grads, working grads) lists on the host and returns the
/// sum of squares of the master gradients afterwards (non-finite when any gradient was). Every
/// product and sum is rounded on its own, whatever the compiler flags: the master gradients are
/// the same bits as the device's (cuda/unscale.cuh). Deterministic for a given grain.
template <class G>
double unscale_accumulate_into(const tensor_lists<float, const G>& lists, float factor,
                               bool accumulate, host_tuning tuning = {}) {
  return detail::reduce_unscale_chunks(
      lists, tuning, [&](float* master, const G* g, std::size_t begin, std::size_t end) {
        return accumulate ? detail::unscale_add_range<G, true>(factor, master, g, begin, end)
                          : detail::unscale_add_range<G, false>(factor, master, g, begin, end);
      });
}

/// The sum of squares unscale_accumulate_into(lists, factor, false) would return, bit for bit (the
/// same chunks of the same lists), without writing the master gradients (column 0 is not touched):
/// one read of the working gradients. The trainer's direct route (hone/train/host_backend.hpp)
/// checks and measures the gradients with it and hands them to the optimizer unconverted.
template <class G>
double unscaled_sum_of_squares(const tensor_lists<float, const G>& lists, float factor,
                               host_tuning tuning = {}) {
  return detail::reduce_unscale_chunks(
      lists, tuning, [&](float* /*master*/, const G* g, std::size_t begin, std::size_t end) {
        return detail::unscale_add_range<G, false, false>(factor, nullptr, g, begin, end);
      });
}

/// working = W(master): the cast back to the working precision after an update.
template <class W>
struct cast_to_working {
  HONE_HOST_DEVICE void operator()(W& working, const float& master) const {
    working = static_cast<W>(master);
  }
  /// The vector form: the register is stored as W, rounded as static_cast<W> rounds (hone's
  /// conversions; F16C and integer rounding on AVX2 and AVX-512).
  template <class V>
  HONE_HOST_DEVICE_FORCEINLINE void apply(V& working, const V& master) const {
    working = master;
  }
};

/// master = float(working): loading the master copy from the model's weights.
template <class W>
struct load_master {
  HONE_HOST_DEVICE void operator()(float& master, const W& working) const {
    master = static_cast<float>(working);
  }
  /// The vector form: W widened exactly on load.
  template <class V>
  HONE_HOST_DEVICE_FORCEINLINE void apply(V& master, const V& working) const {
    master = working;
  }
};

#if HONE_DETAIL_EXTERN_TEMPLATES
// Separate compilation (core/detail/separate_compilation.hpp): the unscale passes and the casts
// between master and working weights of the three working types are compiled once, in
// hone::compiled (src/precision.cpp).
#define HONE_DETAIL_PRECISION_EXTERN(W)                                                         \
  extern template double unscale_accumulate_into<W>(const tensor_lists<float, const W>&, float, \
                                                    bool, host_tuning);                         \
  extern template double unscaled_sum_of_squares<W>(const tensor_lists<float, const W>&, float, \
                                                    host_tuning);                               \
  extern template void for_each<cast_to_working<W>, W, const float>(                            \
      const tensor_lists<W, const float>&, const cast_to_working<W>&, host_tuning);             \
  extern template void for_each<load_master<W>, float, const W>(                                \
      const tensor_lists<float, const W>&, const load_master<W>&, host_tuning);
HONE_DETAIL_PRECISION_EXTERN(float)
HONE_DETAIL_PRECISION_EXTERN(bfloat16)
HONE_DETAIL_PRECISION_EXTERN(half)
#undef HONE_DETAIL_PRECISION_EXTERN
#endif

HONE_NAMESPACE_END
