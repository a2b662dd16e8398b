// hone/core/detail/no_contract.hpp: HONE_DETAIL_OPAQUE_FP(x) and HONE_DETAIL_OPAQUE_MEMORY(a),
// which keep products from being fused into a following add.
//
// Compilers may fuse `a * b + c` into one FMA (g++'s default -ffp-contract=fast, even across
// statements; clang's -ffp-contract=on within an expression; nvcc's --fmad=true) once the target
// has FMA (-march=native, -mfma, x86-64-v3, any GPU), and they decide per inlined copy which
// product to fuse. Where hone promises the same bits whatever the build flags or the device (the
// optimizer updates, the unscale-accumulate pass), a product passes through this macro: an empty
// asm statement the optimizer cannot see through (no instruction is emitted; x86 "+v" and AArch64
// "+w" keep the value, scalar or a GCC vector, in its vector register). Device code uses
// __fmul_rn instead, which nvcc never merges into an FMA.
#pragma once

#include "hone/core/config.hpp"

#if !HONE_DEVICE_PASS && defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HONE_DETAIL_OPAQUE_FP(x) __asm__("" : "+v"(x))
#elif !HONE_DEVICE_PASS && defined(__GNUC__) && defined(__aarch64__)
#define HONE_DETAIL_OPAQUE_FP(x) __asm__("" : "+w"(x))
#else
// MSVC does not contract under its default /fp:precise; the device pass uses __fmul_rn.
#define HONE_DETAIL_OPAQUE_FP(x) ((void)0)
#endif

// HONE_DETAIL_OPAQUE_MEMORY(a): the same for every element of an array at once (products stored
// into `a` by one vector loop, read by the next): the compiler must assume the empty asm statement
// rewrote `a`, so it cannot fuse a product into an add of the second loop, and both loops still
// vectorize (an asm statement inside a loop keeps it scalar).
#if !HONE_DEVICE_PASS && defined(__GNUC__)
#define HONE_DETAIL_OPAQUE_MEMORY(a) __asm__("" : "+m"(a))
#else
#define HONE_DETAIL_OPAQUE_MEMORY(a) ((void)0)
#endif
