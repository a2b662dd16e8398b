// hone/core/detail/simd.hpp: the vector register type of the host backend and the loop that
// runs an element functor's vector form over arrays with it.
//
// An element functor may offer, besides its `operator()(T0&, T1&, ...)`, a vector form
// `template <class V> void apply(V&...) const` written with + - * / and `V(x)` (broadcast) on a
// value type V: float, or `detail::vfloat`, a register of floats. hone::for_each
// (core/parallel.hpp, core/multi_tensor.hpp) calls that form on whole registers whenever a functor
// offers it and every array holds float (inputs may also be bfloat16 or half, widened on load): the
// loop then needs no auto-vectorizer (g++ 12 at -O2 vectorizes nothing with its very-cheap cost
// model, and never a loop whose std::sqrt may set errno), so the user's flags do not decide whether
// it runs at vector speed. Every element takes the vector path, the last partial vector through a
// zero-padded copy, so an element gets the same bits wherever it sits (vector body, tail, a
// one-element range).
//
// Width: 512-bit AVX-512F when the translation unit is compiled with it (the masked forms of
// sqrt, max and the bf16 widening avoid g++ 12's spurious -Wmaybe-uninitialized in the unmasked
// ones, PR 105593; HONE_NO_AVX512 or HONE_OPTIM_NO_AVX512 keeps 256 bits), 256-bit AVX when
// compiled with AVX, 128-bit SSE2 on any other x86-64, 128-bit NEON on AArch64. Elsewhere, under
// a CUDA compiler, or with HONE_NO_SIMD or HONE_OPTIM_NO_SIMD defined, there is no vector type
// (HONE_SIMD is 0) and every functor runs element by element.
//
// Products never fuse with a following add (HONE_DETAIL_OPAQUE_FP, core/detail/no_contract.hpp),
// so with FMA hardware or without, the vector form gives the bits of the same math done one
// IEEE operation at a time.
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

#if !HONE_CUDA_COMPILER && !defined(HONE_NO_SIMD) && !defined(HONE_OPTIM_NO_SIMD)
#if defined(__AVX512F__) && !defined(HONE_NO_AVX512) && !defined(HONE_OPTIM_NO_AVX512)
#include <immintrin.h>
#define HONE_SIMD_AVX512 1
#elif defined(__AVX__)
#include <immintrin.h>
#define HONE_SIMD_AVX 1
#elif defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define HONE_SIMD_SSE2 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define HONE_SIMD_NEON 1
#endif
#endif

#if defined(HONE_SIMD_AVX512) || defined(HONE_SIMD_AVX) || defined(HONE_SIMD_SSE2) || \
    defined(HONE_SIMD_NEON)
#define HONE_SIMD 1
#else
#define HONE_SIMD 0
#endif

HONE_NAMESPACE_BEGIN
namespace detail {

// ---- the vector type
// -----------------------------------------------------------------------------

#if HONE_SIMD
/// A register of floats with the arithmetic a functor's vector form uses. `vfloat(x)` broadcasts.
struct vfloat {
#if defined(HONE_SIMD_AVX512)
  using native = __m512;
  static constexpr std::size_t size = 16;
#elif defined(HONE_SIMD_AVX)
  using native = __m256;
  static constexpr std::size_t size = 8;
#elif defined(HONE_SIMD_SSE2)
  using native = __m128;
  static constexpr std::size_t size = 4;
#else
  using native = float32x4_t;
  static constexpr std::size_t size = 4;
#endif
  native v;

  vfloat() = default;
  HONE_FORCEINLINE explicit vfloat(native x) noexcept : v(x) {}
#if defined(HONE_SIMD_AVX512)
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
#elif defined(HONE_SIMD_AVX)
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
#elif defined(HONE_SIMD_SSE2)
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

// sqrt and max of a register, under the names the optimizer's update math calls for float and
// vfloat alike (the float overloads are in optim/detail/simd.hpp): IEEE sqrt, and maxps's rule
// (the second operand when either is NaN).
HONE_FORCEINLINE vfloat optim_sqrt(vfloat a) noexcept {
#if defined(HONE_SIMD_AVX512)
  // The masked form: _mm512_sqrt_ps's undefined pass-through draws a spurious g++ 12 warning
  // (PR 105593).
  return vfloat(_mm512_maskz_sqrt_ps(static_cast<__mmask16>(0xFFFF), a.v));
#elif defined(HONE_SIMD_AVX)
  return vfloat(_mm256_sqrt_ps(a.v));
#elif defined(HONE_SIMD_SSE2)
  return vfloat(_mm_sqrt_ps(a.v));
#else
  return vfloat(vsqrtq_f32(a.v));
#endif
}
HONE_FORCEINLINE vfloat optim_max(vfloat a, vfloat b) noexcept {
#if defined(HONE_SIMD_AVX512)
  return vfloat(_mm512_maskz_max_ps(static_cast<__mmask16>(0xFFFF), a.v, b.v));
#elif defined(HONE_SIMD_AVX)
  return vfloat(_mm256_max_ps(a.v, b.v));
#elif defined(HONE_SIMD_SSE2)
  return vfloat(_mm_max_ps(a.v, b.v));
#else
  // vmaxq_f32 propagates NaN; keep the maxps rule of the scalar helper instead.
  return vfloat(vbslq_f32(vcgtq_f32(a.v, b.v), a.v, b.v));
#endif
}

template <class T>
HONE_FORCEINLINE void store_if_output(T* p, const vfloat& v) noexcept {
  if constexpr (!std::is_const_v<T>) {
    static_assert(std::is_same_v<T, float>,
                  "hone: a functor's vector form (apply) writes float arrays only; make every "
                  "array it writes float, or give the functor no apply so it runs element by "
                  "element");
    v.store(p);
  }
}
#endif  // HONE_SIMD

// ---- the host loop
// ----------------------------------------------------------------------------------

#if HONE_SIMD
/// A vector's worth of elements of type T (zeros beyond the tail), for the last partial vector.
template <class T>
struct tail_buffer {
  alignas(64) T v[vfloat::size]{};
};

template <class T>
HONE_FORCEINLINE void store_tail(T* p, const vfloat& r, std::size_t n) noexcept {
  if constexpr (!std::is_const_v<T>) {
    static_assert(std::is_same_v<T, float>,
                  "hone: a functor's vector form (apply) writes float arrays only; make every "
                  "array it writes float, or give the functor no apply so it runs element by "
                  "element");
    alignas(64) float tmp[vfloat::size];
    r.store(tmp);
    for (std::size_t j = 0; j < n; ++j) p[j] = tmp[j];
  }
}
#endif

/// Runs the functor `op` over [begin, end) of the arrays in `ptrs` through its vector form
/// `op.apply(vfloat&...)`, one register at a time; the last partial register goes through a
/// zero-padded copy, so every element takes the vector path (and gets the same bits wherever it
/// sits). Without SIMD support: element by element through `op(T&...)`.
template <class Op, class Tuple, std::size_t... K>
HONE_FORCEINLINE void simd_apply_range(const Op& op_in, std::size_t begin, std::size_t end,
                                       const Tuple& ptrs_in, std::index_sequence<K...>) {
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
  std::size_t i = begin;
#if HONE_SIMD
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

#if HONE_SIMD
/// Whether T is an element type the vector form can load (float, bfloat16, half) and, when T is
/// not const, store back (float only).
template <class T>
inline constexpr bool simd_element = std::is_const_v<T>
                                         ? (std::is_same_v<std::remove_const_t<T>, float> ||
                                            std::is_same_v<std::remove_const_t<T>, bfloat16> ||
                                            std::is_same_v<std::remove_const_t<T>, half>)
                                         : std::is_same_v<T, float>;

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
