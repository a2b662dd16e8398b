// hone/core/detail/separate_compilation.hpp: the switches of hone's separate-compilation mode.
//
// hone is header-only by default: every translation unit that uses the trainer compiles (and
// optimizes) the optimizer kernels, the unscale and norm reductions, parameter-group resolution,
// the schedules' checks and the oneTBB task bodies again. The opt-in CMake target hone::compiled
// (find_package(hone COMPONENTS compiled), docs/install.md) is a static library that holds them
// once and defines HONE_SEPARATE_COMPILATION for its users, the way {fmt}'s compiled library,
// spdlog's SPDLOG_COMPILED_LIB and Asio's ASIO_SEPARATE_COMPILATION do. Under the macro:
//  - the heavy non-template functions are declared in the headers and defined in the library
//    (HONE_DETAIL_DEFINITIONS is 0 in a user's file);
//  - the model-independent template specializations (the AdamW step over float, bfloat16 and half
//    gradients, the unscale passes, the casts between master and working weights, the gradient
//    norms) are declared `extern template` (HONE_DETAIL_EXTERN_TEMPLATES is 1) and instantiated
//    once in the library;
//  - core/parallel.hpp does not include oneTBB: the library runs the parallel passes.
// The same code runs in both modes, so results are bit-identical; only where it is compiled
// differs. Every translation unit of a program must agree on the macro (hone::compiled defines it
// publicly): a function defined inline in one file and out of line in the library is an ODR
// violation.
#pragma once

#if defined(HONE_SEPARATE_COMPILATION)
// HONE_COMPILED_LIBRARY: defined by the one source of hone::compiled that holds the out-of-line
// definitions (src/functions.cpp); the library's other sources hold the explicit instantiations,
// which may follow the headers' `extern template` declarations.
#if defined(HONE_COMPILED_LIBRARY)
#define HONE_DETAIL_DEFINITIONS 1
#else
#define HONE_DETAIL_DEFINITIONS 0
#endif
#define HONE_DETAIL_EXTERN_TEMPLATES 1
// Out-of-line definitions (in the library only).
#define HONE_DETAIL_DECL
#else
#define HONE_DETAIL_DEFINITIONS 1
#define HONE_DETAIL_EXTERN_TEMPLATES 0
// Header-only: the definitions are inline in the headers.
#define HONE_DETAIL_DECL inline
#endif
