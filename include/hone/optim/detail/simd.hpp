// hone/optim/detail/simd.hpp: the element side of the optimizer updates (the scalar helpers their
// math is written with) and their host loop.
//
// The update math is written once as a template over its value type: float (detail::sfloat on
// the element path, whose products are never fused), or the host backend's register type
// detail::vfloat (core/detail/simd.hpp). Each update functor offers both forms, `operator()` on
// elements and `apply` on values, and hone::for_each takes the vector form on the host: the
// vector sqrt (sqrtps) is an intrinsic that cannot set errno, so the loop needs no
// auto-vectorizer and the user's flags do not decide whether a step runs at vector speed. The
// element form is the CUDA kernels' functor and the reference of the tests.
#pragma once

#include <cmath>
#include <cstddef>
#include <type_traits>

#include "hone/core/bfloat16.hpp"
#include "hone/core/config.hpp"
#include "hone/core/detail/no_contract.hpp"
#include "hone/core/detail/simd.hpp"
#include "hone/core/half.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/core/parallel.hpp"

// Whether the optimizer loop runs on SIMD registers (the host backend's HONE_SIMD).
#define HONE_OPTIM_SIMD HONE_SIMD

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

/// The host backend of the optimizer updates: hone::for_each over the tensor lists, which takes
/// the functor's vector form. The static_assert keeps an update functor from quietly losing it.
template <class Op, class... Ts>
void simd_for_each(const tensor_lists<Ts...>& lists, const Op& op, host_tuning tuning = {}) {
  static_assert(std::is_invocable_v<const Op&, Ts&...>,
                "hone optimizer functor: operator() must take one element reference per list");
  static_assert(!HONE_SIMD || simd_functor<Op, Ts...>,
                "hone optimizer functor: apply(...) must take one vector register per list (a "
                "template over the value type) and the lists must hold float (inputs may be "
                "bfloat16 or half), so that the step runs on SIMD registers");
  hone::for_each(lists, op, tuning);
}

}  // namespace detail
HONE_NAMESPACE_END
