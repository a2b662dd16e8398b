// hone/optim/detail/simd.hpp: the few SIMD operations the optimizer updates need, and the host
// loop that runs an optimizer functor over tensor lists with them.
//
// Why not the generic hone::for_each loop: an AdamW update needs sqrt, and with g++'s default
// -fmath-errno a call to std::sqrt / __builtin_sqrtf may set errno, so g++ 12 refuses to vectorize
// the loop ("control flow in loop"); at -O2, g++ 12's very-cheap cost model vectorizes none of
// these loops at all. The user's flags must not decide whether the optimizer step runs at vector
// speed, so the update math is written once as a template over its value type (float, or the vector
// type below) and this loop calls it on whole vectors: the vector sqrt (sqrtps) is an intrinsic
// that cannot set errno, and the loop needs no auto-vectorizer. The same template instantiated for
// float is the element functor of the scalar tail and of the CUDA kernels.
//
// Vector width: 512-bit AVX-512F when the translation unit is compiled with it (the update is
// memory-bound only once it leaves the cache: with 1 Mi parameters in L3, 512-bit vectors took
// AdamW from 56% to 82% of its streaming limit on a 2-core Zen 5, bench_optim; the masked forms of
// sqrt, max and the bf16 widening avoid g++ 12's spurious -Wmaybe-uninitialized in the unmasked
// ones, PR 105593; HONE_OPTIM_NO_AVX512 keeps 256 bits), 256-bit AVX when compiled with AVX,
// 128-bit SSE2 on any other x86-64, 128-bit NEON on AArch64. Elsewhere, under a CUDA compiler, or
// with HONE_OPTIM_NO_SIMD defined, the loop is the generic hone::for_each.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "hone/core/bfloat16.hpp"
#include "hone/core/config.hpp"
#include "hone/core/detail/no_contract.hpp"
#include "hone/core/half.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/core/parallel.hpp"

#if !HONE_CUDA_COMPILER && !defined(HONE_OPTIM_NO_SIMD)
#if defined(__AVX512F__) && !defined(HONE_OPTIM_NO_AVX512)
#include <immintrin.h>
#define HONE_OPTIM_SIMD_AVX512 1
#elif defined(__AVX__)
#include <immintrin.h>
#define HONE_OPTIM_SIMD_AVX 1
#elif defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define HONE_OPTIM_SIMD_SSE2 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define HONE_OPTIM_SIMD_NEON 1
#endif
#endif

#if defined(HONE_OPTIM_SIMD_AVX512) || defined(HONE_OPTIM_SIMD_AVX) || \
    defined(HONE_OPTIM_SIMD_SSE2) || defined(HONE_OPTIM_SIMD_NEON)
#define HONE_OPTIM_SIMD 1
#else
#define HONE_OPTIM_SIMD 0
#endif

HONE_NAMESPACE_BEGIN
namespace detail {

// ---- scalar helpers (host and device)
// ------------------------------------------------------------

/// The float value of a gradient element of any of the supported types.
HONE_HOST_DEVICE constexpr float grad_to_float(float g) noexcept {
  return g;
}
HONE_HOST_DEVICE constexpr float grad_to_float(bfloat16 g) noexcept {
  return to_float(g);
}
HONE_HOST_DEVICE constexpr float grad_to_float(half g) noexcept {
  return to_float(g);
}

/// Correctly rounded square root (IEEE sqrt on both host and device).
HONE_HOST_DEVICE float optim_sqrt(float x) noexcept {
#if HONE_DEVICE_PASS
  return ::sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

/// `a > b ? a : b`: the semantics of x86 maxps (the second operand when either is NaN), so the
/// scalar and vector paths agree bit for bit.
HONE_HOST_DEVICE constexpr float optim_max(float a, float b) noexcept {
  return a > b ? a : b;
}

// ---- no contraction
// ------------------------------------------------------------------------------
//
// The update functors are written as separate multiplies and adds, and every element must get the
// same bits wherever it sits (vector body, zero-padded tail, a one-element offload bucket, a
// CUDA thread). Compilers may fuse `a * b + c` into one FMA (g++'s default -ffp-contract=fast,
// clang's -ffp-contract=on, nvcc's --fmad=true) once the target has FMA (-march=native, -mfma,
// x86-64-v3, any GPU), and they decide per inlined copy which product to fuse: with
// -O2 -march=native, the vector body and the tail of one loop fused different products and the
// offload engine's one-element buckets drifted from the plain step by an ulp (test_offload).
// So no product of the update math may be fused: on the host it passes through an empty asm
// statement the optimizer cannot see through (no instruction is emitted), on the device it is
// __fmul_rn, which nvcc never merges into an FMA (HONE_DETAIL_OPAQUE_FP,
// core/detail/no_contract.hpp). The results are then the same with and without FMA hardware, on
// the CPU and on the GPU (IEEE sqrt and division on both).

/// A float whose products are never fused with a following add (see above): the value type of
/// the element (scalar) path of the update functors.
struct sfloat {
  float v;
  HONE_HOST_DEVICE explicit sfloat(float x) noexcept : v(x) {}
  friend HONE_HOST_DEVICE sfloat operator+(sfloat a, sfloat b) noexcept {
    return sfloat(a.v + b.v);
  }
  friend HONE_HOST_DEVICE sfloat operator-(sfloat a, sfloat b) noexcept {
    return sfloat(a.v - b.v);
  }
  friend HONE_HOST_DEVICE sfloat operator*(sfloat a, sfloat b) noexcept {
#if HONE_DEVICE_PASS
    return sfloat(__fmul_rn(a.v, b.v));
#else
    float r = a.v * b.v;
    HONE_DETAIL_OPAQUE_FP(r);
    return sfloat(r);
#endif
  }
  friend HONE_HOST_DEVICE sfloat operator/(sfloat a, sfloat b) noexcept {
    return sfloat(a.v / b.v);
  }
};
HONE_HOST_DEVICE sfloat optim_sqrt(sfloat x) noexcept {
  return sfloat(optim_sqrt(x.v));
}
HONE_HOST_DEVICE sfloat optim_max(sfloat a, sfloat b) noexcept {
  return sfloat(optim_max(a.v, b.v));
}

// ---- the vector type
// -----------------------------------------------------------------------------

#if HONE_OPTIM_SIMD
/// A register of floats with the arithmetic the update functors use. `vfloat(x)` broadcasts.
struct vfloat {
#if defined(HONE_OPTIM_SIMD_AVX512)
  using native = __m512;
  static constexpr std::size_t size = 16;
#elif defined(HONE_OPTIM_SIMD_AVX)
  using native = __m256;
  static constexpr std::size_t size = 8;
#elif defined(HONE_OPTIM_SIMD_SSE2)
  using native = __m128;
  static constexpr std::size_t size = 4;
#else
  using native = float32x4_t;
  static constexpr std::size_t size = 4;
#endif
  native v;

  vfloat() = default;
  HONE_FORCEINLINE explicit vfloat(native x) noexcept : v(x) {}
#if defined(HONE_OPTIM_SIMD_AVX512)
  HONE_FORCEINLINE explicit vfloat(float x) noexcept : v(_mm512_set1_ps(x)) {}
  HONE_FORCEINLINE static vfloat load(const float* p) noexcept {
    return vfloat(_mm512_loadu_ps(p));
  }
  HONE_FORCEINLINE void store(float* p) const noexcept {
    _mm512_storeu_ps(p, v);
  }
  HONE_FORCEINLINE static vfloat load(const bfloat16* p) noexcept {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const auto all = static_cast<__mmask16>(0xFFFF);  // maskz forms: see optim_sqrt
    return vfloat(_mm512_castsi512_ps(
        _mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, raw), 16)));
  }
  friend HONE_FORCEINLINE vfloat operator+(vfloat a, vfloat b) noexcept {
    return vfloat(_mm512_add_ps(a.v, b.v));
  }
  friend HONE_FORCEINLINE vfloat operator-(vfloat a, vfloat b) noexcept {
    return vfloat(_mm512_sub_ps(a.v, b.v));
  }
  friend HONE_FORCEINLINE vfloat operator*(vfloat a, vfloat b) noexcept {
    __m512 r = _mm512_mul_ps(a.v, b.v);
    HONE_DETAIL_OPAQUE_FP(r);  // never fused into an FMA: see "no contraction"
    return vfloat(r);
  }
  friend HONE_FORCEINLINE vfloat operator/(vfloat a, vfloat b) noexcept {
    return vfloat(_mm512_div_ps(a.v, b.v));
  }
#elif defined(HONE_OPTIM_SIMD_AVX)
  HONE_FORCEINLINE explicit vfloat(float x) noexcept : v(_mm256_set1_ps(x)) {}
  HONE_FORCEINLINE static vfloat load(const float* p) noexcept {
    return vfloat(_mm256_loadu_ps(p));
  }
  HONE_FORCEINLINE void store(float* p) const noexcept {
    _mm256_storeu_ps(p, v);
  }
  HONE_FORCEINLINE static vfloat load(const bfloat16* p) noexcept {
    // A bfloat16 is the upper half of a float: interleaving zeros below each 16-bit value widens
    // it exactly (SSE2 integer ops, so plain AVX without AVX2 works too).
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i zero = _mm_setzero_si128();
    const __m128 lo = _mm_castsi128_ps(_mm_unpacklo_epi16(zero, raw));
    const __m128 hi = _mm_castsi128_ps(_mm_unpackhi_epi16(zero, raw));
    return vfloat(_mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1));
  }
  friend HONE_FORCEINLINE vfloat operator+(vfloat a, vfloat b) noexcept {
    return vfloat(_mm256_add_ps(a.v, b.v));
  }
  friend HONE_FORCEINLINE vfloat operator-(vfloat a, vfloat b) noexcept {
    return vfloat(_mm256_sub_ps(a.v, b.v));
  }
  friend HONE_FORCEINLINE vfloat operator*(vfloat a, vfloat b) noexcept {
    __m256 r = _mm256_mul_ps(a.v, b.v);
    HONE_DETAIL_OPAQUE_FP(r);
    return vfloat(r);
  }
  friend HONE_FORCEINLINE vfloat operator/(vfloat a, vfloat b) noexcept {
    return vfloat(_mm256_div_ps(a.v, b.v));
  }
#elif defined(HONE_OPTIM_SIMD_SSE2)
  HONE_FORCEINLINE explicit vfloat(float x) noexcept : v(_mm_set1_ps(x)) {}
  HONE_FORCEINLINE static vfloat load(const float* p) noexcept {
    return vfloat(_mm_loadu_ps(p));
  }
  HONE_FORCEINLINE void store(float* p) const noexcept {
    _mm_storeu_ps(p, v);
  }
  HONE_FORCEINLINE static vfloat load(const bfloat16* p) noexcept {
    const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return vfloat(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), raw)));
  }
  friend HONE_FORCEINLINE vfloat operator+(vfloat a, vfloat b) noexcept {
    return vfloat(_mm_add_ps(a.v, b.v));
  }
  friend HONE_FORCEINLINE vfloat operator-(vfloat a, vfloat b) noexcept {
    return vfloat(_mm_sub_ps(a.v, b.v));
  }
  friend HONE_FORCEINLINE vfloat operator*(vfloat a, vfloat b) noexcept {
    __m128 r = _mm_mul_ps(a.v, b.v);
    HONE_DETAIL_OPAQUE_FP(r);
    return vfloat(r);
  }
  friend HONE_FORCEINLINE vfloat operator/(vfloat a, vfloat b) noexcept {
    return vfloat(_mm_div_ps(a.v, b.v));
  }
#else
  HONE_FORCEINLINE explicit vfloat(float x) noexcept : v(vdupq_n_f32(x)) {}
  HONE_FORCEINLINE static vfloat load(const float* p) noexcept {
    return vfloat(vld1q_f32(p));
  }
  HONE_FORCEINLINE void store(float* p) const noexcept {
    vst1q_f32(p, v);
  }
  HONE_FORCEINLINE static vfloat load(const bfloat16* p) noexcept {
    const uint16x4_t raw = vld1_u16(reinterpret_cast<const std::uint16_t*>(p));
    return vfloat(vreinterpretq_f32_u32(vshll_n_u16(raw, 16)));
  }
  friend HONE_FORCEINLINE vfloat operator+(vfloat a, vfloat b) noexcept {
    return vfloat(vaddq_f32(a.v, b.v));
  }
  friend HONE_FORCEINLINE vfloat operator-(vfloat a, vfloat b) noexcept {
    return vfloat(vsubq_f32(a.v, b.v));
  }
  friend HONE_FORCEINLINE vfloat operator*(vfloat a, vfloat b) noexcept {
    float32x4_t r = vmulq_f32(a.v, b.v);
    HONE_DETAIL_OPAQUE_FP(r);
    return vfloat(r);
  }
  friend HONE_FORCEINLINE vfloat operator/(vfloat a, vfloat b) noexcept {
    return vfloat(vdivq_f32(a.v, b.v));
  }
#endif
  /// Conversion of a vector's worth of fp16 values (exact; scalar conversion, then one load).
  HONE_FORCEINLINE static vfloat load(const half* p) noexcept {
    alignas(64) float tmp[size];
    for (std::size_t j = 0; j < size; ++j) tmp[j] = to_float(p[j]);
    return load(static_cast<const float*>(tmp));
  }
};

HONE_FORCEINLINE vfloat optim_sqrt(vfloat a) noexcept {
#if defined(HONE_OPTIM_SIMD_AVX512)
  // The masked form: _mm512_sqrt_ps's undefined pass-through draws a spurious g++ 12 warning
  // (PR 105593).
  return vfloat(_mm512_maskz_sqrt_ps(static_cast<__mmask16>(0xFFFF), a.v));
#elif defined(HONE_OPTIM_SIMD_AVX)
  return vfloat(_mm256_sqrt_ps(a.v));
#elif defined(HONE_OPTIM_SIMD_SSE2)
  return vfloat(_mm_sqrt_ps(a.v));
#else
  return vfloat(vsqrtq_f32(a.v));
#endif
}
HONE_FORCEINLINE vfloat optim_max(vfloat a, vfloat b) noexcept {
#if defined(HONE_OPTIM_SIMD_AVX512)
  return vfloat(_mm512_maskz_max_ps(static_cast<__mmask16>(0xFFFF), a.v, b.v));
#elif defined(HONE_OPTIM_SIMD_AVX)
  return vfloat(_mm256_max_ps(a.v, b.v));
#elif defined(HONE_OPTIM_SIMD_SSE2)
  return vfloat(_mm_max_ps(a.v, b.v));
#else
  // vmaxq_f32 propagates NaN; keep the maxps rule of the scalar helper instead.
  return vfloat(vbslq_f32(vcgtq_f32(a.v, b.v), a.v, b.v));
#endif
}

template <class T>
HONE_FORCEINLINE void store_if_output(T* p, const vfloat& v) noexcept {
  if constexpr (!std::is_const_v<T>) {
    static_assert(std::is_same_v<T, float>, "hone: optimizer outputs must be float arrays");
    v.store(p);
  }
}
#endif  // HONE_OPTIM_SIMD

// ---- the host loop
// ----------------------------------------------------------------------------------

#if HONE_OPTIM_SIMD
/// A vector's worth of elements of type T (zeros beyond the tail), for the last partial vector.
template <class T>
struct tail_buffer {
  alignas(64) T v[vfloat::size]{};
};

template <class T>
HONE_FORCEINLINE void store_tail(T* p, const vfloat& r, std::size_t n) noexcept {
  if constexpr (!std::is_const_v<T>) {
    static_assert(std::is_same_v<T, float>, "hone: optimizer outputs must be float arrays");
    alignas(64) float tmp[vfloat::size];
    r.store(tmp);
    for (std::size_t j = 0; j < n; ++j) p[j] = tmp[j];
  }
}
#endif

/// Runs the update functor `op` over [begin, end) of the arrays in `ptrs` through
/// `op.apply(vfloat&...)`, one vector at a time; the last partial vector goes through a
/// zero-padded copy, so every element takes the vector path (and gets the same bits wherever it
/// sits). Without SIMD support: element by element through `op(T&...)`.
template <class Op, class Tuple, std::size_t... K>
HONE_FORCEINLINE void simd_apply_range(const Op& op_in, std::size_t begin, std::size_t end,
                                       const Tuple& ptrs_in, std::index_sequence<K...>) {
  static_assert(std::is_trivially_copyable_v<Op>,
                "hone: an optimizer update functor must be trivially copyable (its coefficients "
                "are copied into registers for the loop)");
  // Local copies: the float stores of the loop may alias the functor's float coefficients and
  // the pointer tuple as far as the compiler knows (both reached through references), which
  // made it reload and re-broadcast every coefficient in every iteration (~30% of the in-cache
  // rate; bench_optim adamw_fp32_1M).
  const Op op = op_in;
  const Tuple ptrs = ptrs_in;
  std::size_t i = begin;
#if HONE_OPTIM_SIMD
  constexpr std::size_t width = vfloat::size;
  for (; i + width <= end; i += width) {
    vfloat r[sizeof...(K)] = {vfloat::load(std::get<K>(ptrs) + i)...};
    op.apply(r[K]...);
    (store_if_output(std::get<K>(ptrs) + i, r[K]), ...);
  }
  if (i < end) {
    const std::size_t rest = end - i;
    std::tuple<
        tail_buffer<std::remove_cv_t<std::remove_pointer_t<std::tuple_element_t<K, Tuple>>>>...>
        tmp;
    ((std::copy_n(std::get<K>(ptrs) + i, rest, std::get<K>(tmp).v)), ...);
    vfloat r[sizeof...(K)] = {vfloat::load(std::get<K>(tmp).v)...};
    op.apply(r[K]...);
    (store_tail(std::get<K>(ptrs) + i, r[K], rest), ...);
  }
#else
  for (; i < end; ++i) op(std::get<K>(ptrs)[i]...);
#endif
}

/// The host backend of the optimizer updates: the tensors of `lists` cut into chunks of
/// tuning.grain elements spread over oneTBB workers (the task table of hone::for_each), each chunk
/// swept by simd_apply_range. `op` must provide `template <class T> apply(T&...)` (the math, for
/// float and vfloat) and `operator()(element&...)` (one element of each list).
template <class Op, class... Ts>
void simd_for_each(const tensor_lists<Ts...>& lists, const Op& op, host_tuning tuning = {}) {
  static_assert(std::is_invocable_v<const Op&, Ts&...>,
                "hone optimizer functor: operator() must take one element reference per list");
  if (lists.empty()) return;
  const auto chunks = detail::make_chunks(lists, tuning.grain);
  constexpr auto seq = std::index_sequence_for<Ts...>{};
  if (chunks.size() == 1) {
    simd_apply_range(op, chunks[0].begin, chunks[0].end, lists.at(0), seq);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunks.size(), 1),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t c = r.begin(); c != r.end(); ++c) {
                        const auto& ch = chunks[c];
                        simd_apply_range(op, ch.begin, ch.end, lists.at(ch.tensor), seq);
                      }
                    });
}

}  // namespace detail
HONE_NAMESPACE_END
