// hone/core/detail/simd.hpp: the vector register types of the host backend, one per target
// (core/isa.hpp), and the loop that runs an element functor's vector form over arrays with the
// target chosen at run time.
//
// An element functor may offer, besides its `operator()(T0&, T1&, ...)`, a vector form
// `template <class V> void apply(V&...) const` written with + - * / and `V(x)` (broadcast) on a
// value type V: float, or `detail::vfloat_t<T>`, a register of floats of target T. hone::for_each
// (core/parallel.hpp, core/multi_tensor.hpp) calls that form on whole registers whenever a functor
// offers it and every array holds float, bfloat16 or half (widened on load, rounded on store): the
// loop then needs no auto-vectorizer (g++ 12 at -O2 vectorizes nothing with its very-cheap cost
// model, and never a loop whose std::sqrt may set errno), so the user's flags do not decide whether
// it runs at vector speed. Every element takes the vector path, the last partial vector through a
// zero-padded copy, so an element gets the same bits wherever it sits (vector body, tail, a
// one-element range).
//
// Targets: on x86-64 the loop is compiled for SSE2 (128-bit), AVX2 + F16C (256-bit) and AVX-512
// F/BW/DQ/VL (512-bit) in every optimized GCC or Clang build, each as one function with that
// target attribute into which the functor's vector form is flattened (so a generic -O2 build runs
// AVX-512 code on an AVX-512 CPU), and each call takes the target of hone::active_isa(). The
// register types' operations carry their target attribute and are never called outside such a
// function (not always_inline: the functor's template body may be instantiated first for the
// default target, where the call stays a call until flattening inlines it). Without run-time
// choice (see core/isa.hpp) the loop uses the best target the flags allow: NEON on AArch64.
// AVX-512 uses the masked forms of sqrt, max and the widening loads, which avoid g++ 12's spurious
// -Wmaybe-uninitialized in the unmasked ones (PR 105593).
//
// Products never fuse with a following add (HONE_DETAIL_OPAQUE_FP, core/detail/no_contract.hpp),
// so with FMA hardware or without, the vector form gives the bits of the same math done one
// IEEE operation at a time, on every target.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "hone/core/bfloat16.hpp"
#include "hone/core/config.hpp"
#include "hone/core/detail/no_contract.hpp"
#include "hone/core/half.hpp"
#include "hone/core/isa.hpp"

#if defined(HONE_ISA_X86)
#include <immintrin.h>
#elif defined(HONE_ISA_NEON)
#include <arm_neon.h>
#endif

// The target attributes of the x86 register types (empty where the compiler has none: MSVC).
#if defined(HONE_ISA_X86) && defined(__GNUC__)
#define HONE_DETAIL_TARGET_AVX2 __attribute__((target("avx,avx2,fma,f16c")))
// The element loops' AVX2 target: no FMA, so the auto-vectorizer cannot fuse a product into an add.
#define HONE_DETAIL_TARGET_AVX2_NOFMA __attribute__((target("avx,avx2,f16c")))
#define HONE_DETAIL_TARGET_AVX512 \
  __attribute__((target("avx,avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")))
#define HONE_DETAIL_FLATTEN __attribute__((flatten))
#else
#define HONE_DETAIL_TARGET_AVX2
#define HONE_DETAIL_TARGET_AVX2_NOFMA
#define HONE_DETAIL_TARGET_AVX512
#define HONE_DETAIL_FLATTEN
#endif

// The compiled-in target without run-time choice (bench/xsimd.cpp names it).
#if defined(HONE_ISA_X86)
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__) && !defined(HONE_NO_AVX512) && !defined(HONE_OPTIM_NO_AVX512)
#define HONE_SIMD_AVX512 1
#elif defined(__AVX2__) && defined(__F16C__)
#define HONE_SIMD_AVX2 1
#else
#define HONE_SIMD_SSE2 1
#endif
#elif defined(HONE_ISA_NEON)
#define HONE_SIMD_NEON 1
#endif

#if defined(HONE_ISA_X86) || defined(HONE_ISA_NEON)
#define HONE_SIMD 1
#else
#define HONE_SIMD 0
#endif

// The targets whose register types this translation unit defines: every x86 target when the
// choice is made at run time, else the ones the flags allow.
#if defined(HONE_ISA_X86) && \
    (defined(HONE_ISA_DISPATCH) || defined(HONE_SIMD_AVX2) || defined(HONE_SIMD_AVX512))
#define HONE_DETAIL_HAS_AVX2 1
#endif
#if defined(HONE_ISA_X86) && !defined(HONE_NO_AVX512) && !defined(HONE_OPTIM_NO_AVX512) && \
    (defined(HONE_ISA_DISPATCH) || defined(HONE_SIMD_AVX512))
#define HONE_DETAIL_HAS_AVX512 1
#endif

HONE_NAMESPACE_BEGIN
namespace detail {

// ---- the vector types
// ----------------------------------------------------------------------------

/// A register of floats of target T with the arithmetic a functor's vector form uses.
/// `vfloat_t<T>(x)` broadcasts; load() widens float, bfloat16 and half arrays; store() writes
/// float, and bfloat16 and half rounded to nearest even (hone's conversions, bit for bit).
template <isa T>
struct vfloat_t;

/// fp16 -> float one element at a time into a buffer (exact), for targets without F16C.
template <std::size_t N>
inline void widen_half(const half* p, float* out) noexcept {
  for (std::size_t j = 0; j < N; ++j) out[j] = to_float(p[j]);
}

/// float -> fp16 or bf16 one element at a time (hone's rounding: to nearest, ties to even; NaN
/// kept quiet), for targets without a conversion instruction.
template <std::size_t N, class S>
inline void narrow(const float* in, S* p) noexcept {
  for (std::size_t j = 0; j < N; ++j) p[j] = S(in[j]);
}

#if defined(HONE_ISA_X86)
template <>
struct vfloat_t<isa::sse2> {
  using native = __m128;
  static constexpr std::size_t size = 4;
  native v;

  vfloat_t() = default;
  HONE_FORCEINLINE explicit vfloat_t(native x) noexcept : v(x) {}
  HONE_FORCEINLINE explicit vfloat_t(float x) noexcept : v(_mm_set1_ps(x)) {}
  HONE_FORCEINLINE static vfloat_t load(const float* p) noexcept {
    return vfloat_t(_mm_loadu_ps(p));
  }
  HONE_FORCEINLINE void store(float* p) const noexcept { _mm_storeu_ps(p, v); }
  template <class S>
  HONE_FORCEINLINE void store(S* p) const noexcept {
    alignas(16) float tmp[size];
    store(static_cast<float*>(tmp));
    narrow<size>(tmp, p);
  }
  HONE_FORCEINLINE static vfloat_t load(const bfloat16* p) noexcept {
    // A bfloat16 is the upper half of a float: interleaving zeros below each value widens it.
    const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return vfloat_t(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), raw)));
  }
  HONE_FORCEINLINE static vfloat_t load(const half* p) noexcept {
    alignas(16) float tmp[size];
    widen_half<size>(p, tmp);
    return load(static_cast<const float*>(tmp));
  }
  friend HONE_FORCEINLINE vfloat_t operator+(vfloat_t a, vfloat_t b) noexcept {
    return vfloat_t(_mm_add_ps(a.v, b.v));
  }
  friend HONE_FORCEINLINE vfloat_t operator-(vfloat_t a, vfloat_t b) noexcept {
    return vfloat_t(_mm_sub_ps(a.v, b.v));
  }
  friend HONE_FORCEINLINE vfloat_t operator*(vfloat_t a, vfloat_t b) noexcept {
    __m128 r = _mm_mul_ps(a.v, b.v);
    HONE_DETAIL_OPAQUE_FP(r);  // never fused into an FMA: see "no contraction"
    return vfloat_t(r);
  }
  friend HONE_FORCEINLINE vfloat_t operator/(vfloat_t a, vfloat_t b) noexcept {
    return vfloat_t(_mm_div_ps(a.v, b.v));
  }
};

HONE_FORCEINLINE vfloat_t<isa::sse2> optim_sqrt(vfloat_t<isa::sse2> a) noexcept {
  return vfloat_t<isa::sse2>(_mm_sqrt_ps(a.v));
}
HONE_FORCEINLINE vfloat_t<isa::sse2> optim_max(vfloat_t<isa::sse2> a,
                                               vfloat_t<isa::sse2> b) noexcept {
  return vfloat_t<isa::sse2>(_mm_max_ps(a.v, b.v));
}
#endif

#if defined(HONE_DETAIL_HAS_AVX2)
/// Eight fp16 values widened with F16C, bit for bit to_float: the instruction makes a signalling
/// NaN quiet where to_float keeps it, so the quiet bit is cleared again for those lanes. (The AVX2
/// register's load and the unscale pass's block widening, precision/unscale.hpp; no FMA in the
/// target, so it inlines into either.)
HONE_DETAIL_TARGET_AVX2_NOFMA inline __m256 half8_to_float(const half* p) noexcept {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i w = _mm256_cvtepu16_epi32(raw);
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x7fff)), _mm256_set1_epi32(0x7c00));
  const __m256i quiet =
      _mm256_cmpeq_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x200)), _mm256_set1_epi32(0x200));
  const __m256i fix =
      _mm256_and_si256(_mm256_andnot_si256(quiet, nan), _mm256_set1_epi32(0x400000));
  return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(_mm256_cvtph_ps(raw)), fix));
}

template <>
struct vfloat_t<isa::avx2> {
  using native = __m256;
  static constexpr std::size_t size = 8;
  native v;

  vfloat_t() = default;
  // Not trivially copyable on purpose: a register then crosses a call that was not inlined (a
  // user's vector form compiled for the default target calling this target's operations) by
  // address, never in a register the two sides would disagree on (the AVX ABI).
  vfloat_t(const vfloat_t& o) noexcept : v(o.v) {}
  vfloat_t& operator=(const vfloat_t&) noexcept = default;
  HONE_DETAIL_TARGET_AVX2 inline explicit vfloat_t(native x) noexcept : v(x) {}
  HONE_DETAIL_TARGET_AVX2 inline explicit vfloat_t(float x) noexcept : v(_mm256_set1_ps(x)) {}
  HONE_DETAIL_TARGET_AVX2 inline static vfloat_t load(const float* p) noexcept {
    return vfloat_t(_mm256_loadu_ps(p));
  }
  HONE_DETAIL_TARGET_AVX2 inline void store(float* p) const noexcept { _mm256_storeu_ps(p, v); }
  HONE_DETAIL_TARGET_AVX2 inline void store(half* p) const noexcept {
    // F16C, rounding to nearest even: hone's half(float), NaNs included (kept quiet, upper
    // payload bits kept).
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  HONE_DETAIL_TARGET_AVX2 inline void store(bfloat16* p) const noexcept {
    // hone's bfloat16(float): u + 0x7fff + ((u >> 16) & 1), the upper half; a NaN keeps its upper
    // bits with the quiet bit set.
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
    // 32 -> 16 bits (every value < 2^16, so the saturating pack is exact), lanes in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  HONE_DETAIL_TARGET_AVX2 inline static vfloat_t load(const bfloat16* p) noexcept {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return vfloat_t(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16)));
  }
  HONE_DETAIL_TARGET_AVX2 inline static vfloat_t load(const half* p) noexcept {
    return vfloat_t(half8_to_float(p));
  }
  friend HONE_DETAIL_TARGET_AVX2 inline vfloat_t operator+(vfloat_t a, vfloat_t b) noexcept {
    return vfloat_t(_mm256_add_ps(a.v, b.v));
  }
  friend HONE_DETAIL_TARGET_AVX2 inline vfloat_t operator-(vfloat_t a, vfloat_t b) noexcept {
    return vfloat_t(_mm256_sub_ps(a.v, b.v));
  }
  friend HONE_DETAIL_TARGET_AVX2 inline vfloat_t operator*(vfloat_t a, vfloat_t b) noexcept {
    __m256 r = _mm256_mul_ps(a.v, b.v);
    HONE_DETAIL_OPAQUE_FP(r);
    return vfloat_t(r);
  }
  friend HONE_DETAIL_TARGET_AVX2 inline vfloat_t operator/(vfloat_t a, vfloat_t b) noexcept {
    return vfloat_t(_mm256_div_ps(a.v, b.v));
  }
};

HONE_DETAIL_TARGET_AVX2 inline vfloat_t<isa::avx2> optim_sqrt(vfloat_t<isa::avx2> a) noexcept {
  return vfloat_t<isa::avx2>(_mm256_sqrt_ps(a.v));
}
HONE_DETAIL_TARGET_AVX2 inline vfloat_t<isa::avx2> optim_max(vfloat_t<isa::avx2> a,
                                                             vfloat_t<isa::avx2> b) noexcept {
  return vfloat_t<isa::avx2>(_mm256_max_ps(a.v, b.v));
}
#endif

#if defined(HONE_DETAIL_HAS_AVX512)
template <>
struct vfloat_t<isa::avx512> {
  using native = __m512;
  static constexpr std::size_t size = 16;
  static constexpr auto all = static_cast<__mmask16>(0xFFFF);  // maskz forms: PR 105593
  native v;

  vfloat_t() = default;
  // Not trivially copyable on purpose: a register then crosses a call that was not inlined (a
  // user's vector form compiled for the default target calling this target's operations) by
  // address, never in a register the two sides would disagree on (the AVX ABI).
  vfloat_t(const vfloat_t& o) noexcept : v(o.v) {}
  vfloat_t& operator=(const vfloat_t&) noexcept = default;
  HONE_DETAIL_TARGET_AVX512 inline explicit vfloat_t(native x) noexcept : v(x) {}
  HONE_DETAIL_TARGET_AVX512 inline explicit vfloat_t(float x) noexcept : v(_mm512_set1_ps(x)) {}
  HONE_DETAIL_TARGET_AVX512 inline static vfloat_t load(const float* p) noexcept {
    return vfloat_t(_mm512_loadu_ps(p));
  }
  HONE_DETAIL_TARGET_AVX512 inline void store(float* p) const noexcept { _mm512_storeu_ps(p, v); }
  HONE_DETAIL_TARGET_AVX512 inline void store(half* p) const noexcept {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_maskz_cvtps_ph(all, v, _MM_FROUND_TO_NEAREST_INT));
  }
  HONE_DETAIL_TARGET_AVX512 inline void store(bfloat16* p) const noexcept {
    // As the AVX2 form (vcvtneps2bf16 flushes subnormals, hone's conversion does not).
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd =
        _mm512_maskz_and_epi32(all, _mm512_maskz_srli_epi32(all, u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_maskz_srli_epi32(
        all,
        _mm512_maskz_add_epi32(all, _mm512_maskz_add_epi32(all, u, _mm512_set1_epi32(0x7fff)), odd),
        16);
    const __m512i quiet =
        _mm512_maskz_or_epi32(all, _mm512_maskz_srli_epi32(all, u, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i r = _mm512_mask_blend_epi32(nan, rounded, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_maskz_cvtepi32_epi16(all, r));
  }
  HONE_DETAIL_TARGET_AVX512 inline static vfloat_t load(const bfloat16* p) noexcept {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return vfloat_t(_mm512_castsi512_ps(
        _mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, raw), 16)));
  }
  HONE_DETAIL_TARGET_AVX512 inline static vfloat_t load(const half* p) noexcept {
    // As the AVX2 form: exact, signalling NaNs kept signalling.
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m512i w = _mm512_maskz_cvtepu16_epi32(all, raw);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(
        _mm512_maskz_and_epi32(all, w, _mm512_set1_epi32(0x7fff)), _mm512_set1_epi32(0x7c00));
    const __mmask16 quiet = _mm512_test_epi32_mask(w, _mm512_set1_epi32(0x200));
    const __m512i f = _mm512_castps_si512(_mm512_maskz_cvtph_ps(all, raw));
    return vfloat_t(_mm512_castsi512_ps(_mm512_mask_xor_epi32(
        f, static_cast<__mmask16>(nan & ~quiet), f, _mm512_set1_epi32(0x400000))));
  }
  friend HONE_DETAIL_TARGET_AVX512 inline vfloat_t operator+(vfloat_t a, vfloat_t b) noexcept {
    return vfloat_t(_mm512_add_ps(a.v, b.v));
  }
  friend HONE_DETAIL_TARGET_AVX512 inline vfloat_t operator-(vfloat_t a, vfloat_t b) noexcept {
    return vfloat_t(_mm512_sub_ps(a.v, b.v));
  }
  friend HONE_DETAIL_TARGET_AVX512 inline vfloat_t operator*(vfloat_t a, vfloat_t b) noexcept {
    __m512 r = _mm512_mul_ps(a.v, b.v);
    HONE_DETAIL_OPAQUE_FP(r);
    return vfloat_t(r);
  }
  friend HONE_DETAIL_TARGET_AVX512 inline vfloat_t operator/(vfloat_t a, vfloat_t b) noexcept {
    return vfloat_t(_mm512_div_ps(a.v, b.v));
  }
};

HONE_DETAIL_TARGET_AVX512 inline vfloat_t<isa::avx512> optim_sqrt(
    vfloat_t<isa::avx512> a) noexcept {
  return vfloat_t<isa::avx512>(_mm512_maskz_sqrt_ps(vfloat_t<isa::avx512>::all, a.v));
}
HONE_DETAIL_TARGET_AVX512 inline vfloat_t<isa::avx512> optim_max(vfloat_t<isa::avx512> a,
                                                                 vfloat_t<isa::avx512> b) noexcept {
  return vfloat_t<isa::avx512>(_mm512_maskz_max_ps(vfloat_t<isa::avx512>::all, a.v, b.v));
}
#endif

#if defined(HONE_ISA_NEON)
template <>
struct vfloat_t<isa::neon> {
  using native = float32x4_t;
  static constexpr std::size_t size = 4;
  native v;

  vfloat_t() = default;
  HONE_FORCEINLINE explicit vfloat_t(native x) noexcept : v(x) {}
  HONE_FORCEINLINE explicit vfloat_t(float x) noexcept : v(vdupq_n_f32(x)) {}
  HONE_FORCEINLINE static vfloat_t load(const float* p) noexcept { return vfloat_t(vld1q_f32(p)); }
  HONE_FORCEINLINE void store(float* p) const noexcept { vst1q_f32(p, v); }
  template <class S>
  HONE_FORCEINLINE void store(S* p) const noexcept {
    alignas(16) float tmp[size];
    store(static_cast<float*>(tmp));
    narrow<size>(tmp, p);
  }
  HONE_FORCEINLINE static vfloat_t load(const bfloat16* p) noexcept {
    const uint16x4_t raw = vld1_u16(reinterpret_cast<const std::uint16_t*>(p));
    return vfloat_t(vreinterpretq_f32_u32(vshll_n_u16(raw, 16)));
  }
  HONE_FORCEINLINE static vfloat_t load(const half* p) noexcept {
    alignas(16) float tmp[size];
    widen_half<size>(p, tmp);
    return load(static_cast<const float*>(tmp));
  }
  friend HONE_FORCEINLINE vfloat_t operator+(vfloat_t a, vfloat_t b) noexcept {
    return vfloat_t(vaddq_f32(a.v, b.v));
  }
  friend HONE_FORCEINLINE vfloat_t operator-(vfloat_t a, vfloat_t b) noexcept {
    return vfloat_t(vsubq_f32(a.v, b.v));
  }
  friend HONE_FORCEINLINE vfloat_t operator*(vfloat_t a, vfloat_t b) noexcept {
    float32x4_t r = vmulq_f32(a.v, b.v);
    HONE_DETAIL_OPAQUE_FP(r);
    return vfloat_t(r);
  }
  friend HONE_FORCEINLINE vfloat_t operator/(vfloat_t a, vfloat_t b) noexcept {
    return vfloat_t(vdivq_f32(a.v, b.v));
  }
};

HONE_FORCEINLINE vfloat_t<isa::neon> optim_sqrt(vfloat_t<isa::neon> a) noexcept {
  return vfloat_t<isa::neon>(vsqrtq_f32(a.v));
}
HONE_FORCEINLINE vfloat_t<isa::neon> optim_max(vfloat_t<isa::neon> a,
                                               vfloat_t<isa::neon> b) noexcept {
  // vmaxq_f32 propagates NaN; keep the maxps rule of the scalar helper instead.
  return vfloat_t<isa::neon>(vbslq_f32(vcgtq_f32(a.v, b.v), a.v, b.v));
}
#endif

#if HONE_SIMD
/// The register type of the target the compiler flags allow (the one the simd_functor concept
/// checks a functor's vector form with; the loop instantiates it for every target).
using vfloat = vfloat_t<compiled_isa()>;
#endif

// ---- the host loop
// ----------------------------------------------------------------------------------

#if HONE_SIMD
template <class V, class T>
HONE_FORCEINLINE void store_if_output(T* p, const V& v) noexcept {
  if constexpr (!std::is_const_v<T>) v.store(p);
}

/// A vector's worth (of the widest target) of elements of type T (zeros beyond the tail), for the
/// last partial vector.
template <class T>
struct tail_buffer {
  alignas(64) T v[16]{};
};

template <class V, class T>
HONE_FORCEINLINE void store_tail(T* p, const V& r, std::size_t n) noexcept {
  if constexpr (!std::is_const_v<T>) {
    alignas(64) T tmp[16];
    r.store(static_cast<T*>(tmp));
    for (std::size_t j = 0; j < n; ++j) p[j] = tmp[j];
  }
}

/// The loop over [begin, end) on registers V (see simd_apply_range).
template <class V, class Op, class Tuple, std::size_t... K>
HONE_FORCEINLINE void vector_range(const Op& op, std::size_t begin, std::size_t end,
                                   const Tuple& ptrs, std::index_sequence<K...>) {
  constexpr std::size_t width = V::size;
  std::size_t i = begin;
  for (; i + width <= end; i += width) {
    V r[sizeof...(K)] = {V::load(std::get<K>(ptrs) + i)...};
    op.apply(r[K]...);
    (store_if_output(std::get<K>(ptrs) + i, r[K]), ...);
  }
  if (i < end) {
    const std::size_t rest = end - i;
    std::tuple<
        tail_buffer<std::remove_cv_t<std::remove_pointer_t<std::tuple_element_t<K, Tuple>>>>...>
        tmp;
    ((std::copy_n(std::get<K>(ptrs) + i, rest, std::get<K>(tmp).v)), ...);
    V r[sizeof...(K)] = {V::load(std::get<K>(tmp).v)...};
    op.apply(r[K]...);
    (store_tail(std::get<K>(ptrs) + i, r[K], rest), ...);
  }
}

/// vector_range compiled for one target: the functor's vector form and the register operations
/// are flattened into this one function, which carries the target's attribute.
template <isa T>
struct target_loop;

// One specialization per target; only the attribute differs (an attribute cannot depend on a
// template argument).
#define HONE_DETAIL_TARGET_LOOP(T, ATTR)                                                       \
  template <>                                                                                  \
  struct target_loop<isa::T> {                                                                 \
    template <class Op, class Tuple, std::size_t... K>                                         \
    ATTR HONE_DETAIL_FLATTEN static void run(const Op& op, std::size_t begin, std::size_t end, \
                                             const Tuple& ptrs, std::index_sequence<K...> k) { \
      vector_range<vfloat_t<isa::T>>(op, begin, end, ptrs, k);                                 \
    }                                                                                          \
  };
#if defined(HONE_ISA_X86)
HONE_DETAIL_TARGET_LOOP(sse2, )
#endif
#if defined(HONE_DETAIL_HAS_AVX2)
HONE_DETAIL_TARGET_LOOP(avx2, HONE_DETAIL_TARGET_AVX2)
#endif
#if defined(HONE_DETAIL_HAS_AVX512)
HONE_DETAIL_TARGET_LOOP(avx512, HONE_DETAIL_TARGET_AVX512)
#endif
#if defined(HONE_ISA_NEON)
HONE_DETAIL_TARGET_LOOP(neon, )
#endif
#undef HONE_DETAIL_TARGET_LOOP
#endif  // HONE_SIMD

/// Runs the functor `op` over [begin, end) of the arrays in `ptrs` through its vector form
/// `op.apply(V&...)` on the registers of hone::active_isa(), one register at a time; the last
/// partial register goes through a zero-padded copy, so every element takes the vector path (and
/// gets the same bits wherever it sits). With isa::scalar, or without SIMD support: element by
/// element through `op(T&...)`, which gives the same bits.
template <class Op, class Tuple, std::size_t... K>
HONE_FORCEINLINE void simd_apply_range(const Op& op_in, std::size_t begin, std::size_t end,
                                       const Tuple& ptrs_in, std::index_sequence<K...> k) {
  static_assert(std::is_trivially_copyable_v<Op>,
                "hone: a functor with a vector form (apply) must be trivially copyable: its "
                "coefficients are copied into registers for the loop; hold its data by value or "
                "through pointers");
  // Local copies: the float stores of the loop may alias the functor's float coefficients and
  // the pointer tuple as far as the compiler knows (both reached through references), which
  // made it reload and re-broadcast every coefficient in every iteration (~30% of the in-cache
  // rate of an AdamW step).
  const Op op = op_in;
  const Tuple ptrs = ptrs_in;
#if HONE_SIMD
  switch (active_isa()) {
    case isa::scalar:
      break;
#if defined(HONE_DETAIL_HAS_AVX512)
    case isa::avx512:
      target_loop<isa::avx512>::run(op, begin, end, ptrs, k);
      return;
#endif
#if defined(HONE_DETAIL_HAS_AVX2)
    case isa::avx2:
      target_loop<isa::avx2>::run(op, begin, end, ptrs, k);
      return;
#endif
    default:
      // The compiled target (a translation unit built without run-time choice, or a target
      // chosen by a unit that has it: the best this one has).
      target_loop<compiled_isa()>::run(op, begin, end, ptrs, k);
      return;
  }
#else
  (void)k;
#endif
  for (std::size_t i = begin; i < end; ++i) op(std::get<K>(ptrs)[i]...);
}

#if HONE_SIMD
/// Whether T is an element type the vector form can load and store: float, bfloat16 and half
/// (widened exactly on load, rounded to nearest even on store, as hone's conversions).
template <class T>
inline constexpr bool simd_element = std::is_same_v<std::remove_const_t<T>, float> ||
                                     std::is_same_v<std::remove_const_t<T>, bfloat16> ||
                                     std::is_same_v<std::remove_const_t<T>, half>;

template <class T>
using simd_register_for = vfloat;

/// A functor whose vector form hone::for_each calls over arrays of Ts...: every array holds a
/// loadable element type and `op.apply(vfloat&...)` (one register per array) is well-formed.
template <class Op, class... Ts>
concept simd_functor = (simd_element<Ts> && ...) &&
                       requires(const Op& op, simd_register_for<Ts>&... r) {
  op.apply(r...);
};
#else
template <class Op, class... Ts>
concept simd_functor = false;
#endif

}  // namespace detail
HONE_NAMESPACE_END
