// hone/core/parallel.hpp: the CPU backend. Element-wise math is written once as a functor
// (HONE_HOST_DEVICE, taking one element reference per array); this header runs it over arrays in
// chunks on oneTBB workers. The CUDA backend (core/cuda/multi_tensor_apply.cuh) runs the very same
// functor.
//
// The inner loop of a chunk takes one of two forms, chosen at compile time per functor:
// - the vector form, when the functor offers `template <class V> void apply(V&...) const` and
//   every array holds float, bfloat16 or half: one SIMD register per array per step
//   (detail::simd_apply_range, core/detail/simd.hpp), the way hone's optimizers run;
// - otherwise an element loop written for the auto-vectorizer: the functor and the pointers are
//   copied into locals (restrict-qualified), so no store of the loop can alias them and each
//   iteration is the inlined functor on `p[i]...`.
// Both are compiled for several x86-64 targets and run on the one hone::active_isa() chooses at
// run time (core/isa.hpp): the vector form on SSE2, AVX2 or AVX-512; the element loops and the
// reductions on SSE2 or AVX2 (without FMA, so a product is never fused into an add and the bits
// are those of the SSE2 loop).
//
// Thread count: these functions run in the caller's oneTBB arena, so
// `tbb::task_arena(4).execute([&]{ hone::for_each(...); })` limits them to 4 threads.
#pragma once

#include "hone/core/detail/separate_compilation.hpp"

// With separate compilation (hone::compiled, core/detail/separate_compilation.hpp) a user's file
// does not parse oneTBB: the library runs the passes below.
#if HONE_DETAIL_DEFINITIONS
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/parallel_reduce.h>
#include <oneapi/tbb/partitioner.h>
#endif

#include <array>
#include <cstddef>
#include <new>
#include <tuple>
#include <type_traits>
#include <utility>

#include "hone/core/config.hpp"
#include "hone/core/detail/simd.hpp"

// Tells g++ the arrays of one loop never overlap, so the loop vectorizes without runtime alias
// checks. clang gets the same from the __restrict__ parameters; its explicit loop pragmas are not
// used because clang turns a loop it cannot vectorize (a bf16 cast, say) into a -Wpass-failed
// error under -Werror.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__NVCC__)
#define HONE_PRAGMA_VECTORIZE _Pragma("GCC ivdep")
#else
#define HONE_PRAGMA_VECTORIZE
#endif

// Complete unrolling of a loop over the reduce_lanes partial sums where g++ at -O2 (which unrolls
// only what does not grow the code) left it rolled and the loop around it slow: the fp16 unscale
// pass ran at 0.67x of its -O3 speed (precision/unscale.hpp). clang unrolls it by itself (and
// would warn that the pragma cannot apply after its full unrolling).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__NVCC__)
#define HONE_PRAGMA_UNROLL_LANES _Pragma("GCC unroll 16")
#else
#define HONE_PRAGMA_UNROLL_LANES
#endif

// g++ 12 at -O2 uses the "very cheap" vectorizer cost model, which leaves these loops scalar (a
// 3.5x loss on memory-bound passes); the user's -O level must not decide that, so the two inner
// loops below ask for vectorization themselves. (clang vectorizes them at -O2 already.)
#if defined(__GNUC__) && !defined(__clang__) && !defined(__NVCC__)
#define HONE_VECTORIZE_FUNCTION \
  __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define HONE_VECTORIZE_FUNCTION
#endif

HONE_NAMESPACE_BEGIN

/// Tuning of the oneTBB backend. The grain (elements per task) was chosen with
/// bench/core.cpp (multi_tensor_axpy_64M) on a 2-core AMD EPYC: 64 Ki floats (256 KiB per array)
/// keeps every array of a 4-array update inside L2 while giving 1000+ tasks on 64 M elements.
struct host_tuning {
  std::size_t grain = std::size_t{1} << 16;
};

/// Addition as a reduction functor (host and device): transform_reduce(n, 0.0, op, hone::plus{},
/// ...).
struct plus {
  template <class T>
  HONE_HOST_DEVICE constexpr T operator()(T a, T b) const {
    return a + b;
  }
};

namespace detail {
/// The element loop of a chunk: `op(p[i]...)` for i in [begin, end). The functor is copied into a
/// local when it is trivially copyable (through the caller's reference, a store to an output
/// array could rewrite its coefficients as far as the compiler knows, which forces a reload of
/// each one in every iteration and can keep the loop scalar); the pointers arrive as restrict
/// parameters, so the arrays need no runtime overlap check.
template <class Op, class... Ts>
HONE_FORCEINLINE void element_loop(const Op& op_in, std::size_t begin, std::size_t end,
                                   Ts* HONE_RESTRICT... p) {
  if constexpr (std::is_trivially_copyable_v<Op>) {
    const Op op = op_in;
    HONE_PRAGMA_VECTORIZE
    for (std::size_t i = begin; i < end; ++i) op(p[i]...);
  } else {
    HONE_PRAGMA_VECTORIZE
    for (std::size_t i = begin; i < end; ++i) op_in(p[i]...);
  }
}
template <class Op, class... Ts>
HONE_VECTORIZE_FUNCTION void element_range_base(const Op& op, std::size_t begin, std::size_t end,
                                                Ts* HONE_RESTRICT... p) {
  element_loop(op, begin, end, p...);
}
#if defined(HONE_DETAIL_HAS_AVX2) && defined(HONE_ISA_DISPATCH)
template <class Op, class... Ts>
HONE_VECTORIZE_FUNCTION HONE_DETAIL_TARGET_AVX2_NOFMA HONE_DETAIL_FLATTEN void element_range_avx2(
    const Op& op, std::size_t begin, std::size_t end, Ts* HONE_RESTRICT... p) {
  element_loop(op, begin, end, p...);
}
#endif
template <class Op, class... Ts>
HONE_FORCEINLINE void element_range(const Op& op, std::size_t begin, std::size_t end, Ts*... p) {
#if defined(HONE_DETAIL_HAS_AVX2) && defined(HONE_ISA_DISPATCH)
  const isa t = active_isa();
  if (t == isa::avx2 || t == isa::avx512) return element_range_avx2(op, begin, end, p...);
#endif
  element_range_base(op, begin, end, p...);
}

/// One chunk [begin, end) of arrays `p...`: the functor's vector form where it has one for these
/// element types (simd_functor), else the element loop.
template <class Op, class... Ts>
HONE_FORCEINLINE void apply_range(const Op& op, std::size_t begin, std::size_t end, Ts*... p) {
  if constexpr (simd_functor<Op, Ts...>) {
    simd_apply_range(op, begin, end, std::tuple<Ts*...>(p...), std::index_sequence_for<Ts...>{});
  } else {
    element_range(op, begin, end, p...);
  }
}

/// One parallel pass with its body erased to a function pointer and a context. oneTBB's task
/// types (start_for, start_deterministic_reduce, their partitioners) are then instantiated once
/// per program, not once per functor: in a trainer file they were about a fifth of the generated
/// code. The split of the range and the order of the reduction do not change, so results keep
/// their bits; the cost is one indirect call per task (a task holds tens of thousands of
/// elements).
struct range_body {
  void (*run)(const void* ctx, std::size_t begin, std::size_t end);
  const void* ctx;
};

/// body(begin, end) over the tasks of [0, n) (oneTBB's auto partitioner, at least `grain` each).
/// With separate compilation, defined in the library.
HONE_DETAIL_DECL void parallel_ranges(std::size_t n, std::size_t grain, range_body body);

template <class F>
void parallel_ranges(std::size_t n, std::size_t grain, const F& f) {
  parallel_ranges(n, grain,
                  range_body{[](const void* ctx, std::size_t b, std::size_t e) {
                               (*static_cast<const F*>(ctx))(b, e);
                             },
                             &f});
}

#if !defined(HONE_SEPARATE_COMPILATION)
template <class R>
struct reduce_body {
  R (*leaf)(const void* ctx, std::size_t begin, std::size_t end, R acc);
  R (*join)(const void* ctx, R a, R b);
  const void* leaf_ctx;
  const void* join_ctx;
};

/// oneTBB's deterministic reduction (simple partitioner, tasks of `grain`) over [0, n):
/// acc = leaf(begin, end, acc) per task, partial results combined with join in a fixed tree.
template <class R>
R parallel_reduce_ranges_erased(std::size_t n, std::size_t grain, R init, reduce_body<R> b) {
  return tbb::parallel_deterministic_reduce(
      tbb::blocked_range<std::size_t>(0, n, grain), init,
      [b](const tbb::blocked_range<std::size_t>& r, R acc) {
        return b.leaf(b.leaf_ctx, r.begin(), r.end(), acc);
      },
      [b](R x, R y) { return b.join(b.join_ctx, x, y); }, tbb::simple_partitioner{});
}

template <class R, class Leaf, class Join>
R parallel_reduce_ranges(std::size_t n, std::size_t grain, R init, const Leaf& leaf,
                         const Join& join) {
  return parallel_reduce_ranges_erased<R>(
      n, grain, init,
      reduce_body<R>{
          [](const void* ctx, std::size_t b, std::size_t e, R acc) {
            return (*static_cast<const Leaf*>(ctx))(b, e, acc);
          },
          [](const void* ctx, R x, R y) { return (*static_cast<const Join*>(ctx))(x, y); }, &leaf,
          &join});
}
#else
/// Separate compilation: a reduction whose value type is erased too, so that the library's one
/// oneTBB deterministic reduction serves every result type. The tree (tasks of `grain` over
/// [0, n), simple partitioner) and the order of the leaf and join calls are those of the
/// header-only route above, so the results are the same bits.
struct reduce_ops {
  std::size_t size, align;                     // of the value type
  void (*copy)(void* dst, const void* src);    // construct a copy at dst
  void (*assign)(void* dst, const void* src);  // *dst = *src
  void (*destroy)(void* p) noexcept;           // ~R()
  // *acc = leaf(begin, end, *acc)
  void (*leaf)(const void* ctx, std::size_t begin, std::size_t end, void* acc);
  void (*join)(const void* ctx, void* a, const void* b);  // *a = join(*a, *b)
  const void* leaf_ctx;
  const void* join_ctx;
};
/// *result = the reduction of [0, n) (defined in the library).
void parallel_reduce_any(std::size_t n, std::size_t grain, const void* init, void* result,
                         const reduce_ops& ops);

template <class R, class Leaf, class Join>
R parallel_reduce_ranges(std::size_t n, std::size_t grain, R init, const Leaf& leaf,
                         const Join& join) {
  const reduce_ops ops{
      sizeof(R),
      alignof(R),
      [](void* dst, const void* src) { ::new (dst) R(*static_cast<const R*>(src)); },
      [](void* dst, const void* src) { *static_cast<R*>(dst) = *static_cast<const R*>(src); },
      [](void* p) noexcept { static_cast<R*>(p)->~R(); },
      [](const void* ctx, std::size_t b, std::size_t e, void* acc) {
        R& a = *static_cast<R*>(acc);
        a = (*static_cast<const Leaf*>(ctx))(b, e, a);
      },
      [](const void* ctx, void* a, const void* b) {
        R& x = *static_cast<R*>(a);
        x = (*static_cast<const Join*>(ctx))(x, *static_cast<const R*>(b));
      },
      &leaf,
      &join};
  R result = init;
  parallel_reduce_any(n, grain, &init, &result, ops);
  return result;
}
#endif

/// Number of independent partial sums of a reduction's inner loop: one AVX-512 vector of floats.
/// Fixed, so results do not depend on the machine or the thread count.
inline constexpr std::size_t reduce_lanes = 16;

template <class R, class Op, class Reduce, class... Ts>
HONE_FORCEINLINE R reduce_loop(const Op& op, const Reduce& reduce, R init, std::size_t begin,
                               std::size_t end, Ts* HONE_RESTRICT... p) {
  std::array<R, reduce_lanes> acc;
  acc.fill(init);
  std::size_t i = begin;
  for (; i + reduce_lanes <= end; i += reduce_lanes) {
    // Fixed trip count: compilers unroll it into straight vector code (no pragma: clang would
    // warn that the pragma cannot apply after full unrolling, and HONE_PRAGMA_UNROLL_LANES made
    // g++'s fp16 norm 1.9x slower).
    for (std::size_t l = 0; l < reduce_lanes; ++l) acc[l] = reduce(acc[l], op(p[i + l]...));
  }
  for (std::size_t l = 0; i < end; ++i, ++l) acc[l] = reduce(acc[l], op(p[i]...));
  R r = acc[0];
  for (std::size_t l = 1; l < reduce_lanes; ++l) r = reduce(r, acc[l]);
  return r;
}
template <class R, class Op, class Reduce, class... Ts>
HONE_VECTORIZE_FUNCTION R reduce_range_base(const Op& op, const Reduce& reduce, R init,
                                            std::size_t begin, std::size_t end,
                                            Ts* HONE_RESTRICT... p) {
  return reduce_loop(op, reduce, init, begin, end, p...);
}
#if defined(HONE_DETAIL_HAS_AVX2) && defined(HONE_ISA_DISPATCH)
template <class R, class Op, class Reduce, class... Ts>
HONE_VECTORIZE_FUNCTION HONE_DETAIL_TARGET_AVX2_NOFMA HONE_DETAIL_FLATTEN R
reduce_range_avx2(const Op& op, const Reduce& reduce, R init, std::size_t begin, std::size_t end,
                  Ts* HONE_RESTRICT... p) {
  return reduce_loop(op, reduce, init, begin, end, p...);
}
#endif
/// Runs f(), a call of a loop over integers or bytes, inside a function compiled for the target of
/// hone::active_isa() (AVX2, or AVX-512 with BW) with the loop flattened into it and vectorized at
/// any -O level. Only for code whose results cannot depend on the target (integer and byte work,
/// such as the checkpoint byte transforms): float math goes through a functor's vector form or the
/// element loops.
template <class F>
HONE_VECTORIZE_FUNCTION HONE_DETAIL_FLATTEN void run_integer_base(const F& f) {
  f();
}
#if defined(HONE_DETAIL_HAS_AVX2) && defined(HONE_ISA_DISPATCH)
template <class F>
HONE_VECTORIZE_FUNCTION HONE_DETAIL_TARGET_AVX2_NOFMA HONE_DETAIL_FLATTEN void run_integer_avx2(
    const F& f) {
  f();
}
#endif
#if defined(HONE_DETAIL_HAS_AVX512) && defined(HONE_ISA_DISPATCH)
template <class F>
HONE_VECTORIZE_FUNCTION HONE_DETAIL_TARGET_AVX512 HONE_DETAIL_FLATTEN void run_integer_avx512(
    const F& f) {
  f();
}
#endif
template <class F>
void run_integer_kernel(const F& f) {
#if defined(HONE_DETAIL_HAS_AVX2) && defined(HONE_ISA_DISPATCH)
  const isa t = active_isa();
#if defined(HONE_DETAIL_HAS_AVX512)
  if (t == isa::avx512) return run_integer_avx512(f);
#endif
  if (t == isa::avx2 || t == isa::avx512) return run_integer_avx2(f);
#endif
  run_integer_base(f);
}

/// The reduction of op(p[i]...) over [begin, end) in reduce_lanes interleaved partial sums (the
/// same order on every target, so the same bits).
template <class R, class Op, class Reduce, class... Ts>
HONE_FORCEINLINE R reduce_range(const Op& op, const Reduce& reduce, R init, std::size_t begin,
                                std::size_t end, Ts*... p) {
#if defined(HONE_DETAIL_HAS_AVX2) && defined(HONE_ISA_DISPATCH)
  const isa t = active_isa();
  if (t == isa::avx2 || t == isa::avx512) {
    return reduce_range_avx2(op, reduce, init, begin, end, p...);
  }
#endif
  return reduce_range_base(op, reduce, init, begin, end, p...);
}
}  // namespace detail

/// Runs `op(p[i]...)` for every i in [0, n), chunked over oneTBB workers. `op` takes one reference
/// per array (const for inputs); the arrays must not overlap.
template <class Op, class... Ts>
void for_each(std::size_t n, const Op& op, Ts*... p) {
  static_assert(sizeof...(Ts) > 0, "hone::for_each needs at least one array");
  static_assert(std::is_invocable_v<const Op&, Ts&...>,
                "hone::for_each: the functor cannot be called with one element reference per "
                "array; its operator() must be const and take (T0&, T1&, ...) in array order.");
  for_each(n, op, host_tuning{}, p...);
}

template <class Op, class... Ts>
void for_each(std::size_t n, const Op& op, host_tuning tuning, Ts*... p) {
  if (n == 0) return;
  if (n <= tuning.grain) {
    detail::apply_range(op, 0, n, p...);
    return;
  }
  detail::parallel_ranges(n, tuning.grain, [&](std::size_t begin, std::size_t end) {
    detail::apply_range(op, begin, end, p...);
  });
}

/// Reduces `op(p[i]...)` over [0, n) with `reduce` (associative; `init` its identity).
/// Deterministic: the same inputs give the same bits whatever the number of threads.
template <class R, class Op, class Reduce, class... Ts>
R transform_reduce(std::size_t n, R init, const Op& op, const Reduce& reduce, host_tuning tuning,
                   Ts*... p) {
  static_assert(std::is_invocable_r_v<R, const Op&, Ts&...>,
                "hone::transform_reduce: the functor must be callable with one element reference "
                "per array and return a value convertible to the result type.");
  if (n == 0) return init;
  if (n <= tuning.grain) return detail::reduce_range(op, reduce, init, 0, n, p...);
  return detail::parallel_reduce_ranges(
      n, tuning.grain, init,
      [&](std::size_t begin, std::size_t end, R acc) {
        return reduce(acc, detail::reduce_range(op, reduce, init, begin, end, p...));
      },
      reduce);
}

template <class R, class Op, class Reduce, class... Ts>
R transform_reduce(std::size_t n, R init, const Op& op, const Reduce& reduce, Ts*... p) {
  return transform_reduce(n, init, op, reduce, host_tuning{}, p...);
}

#if HONE_DETAIL_DEFINITIONS
namespace detail {
/// oneTBB's body of parallel_ranges.
struct tbb_range_body {
  range_body b;
  void operator()(const tbb::blocked_range<std::size_t>& r) const {
    b.run(b.ctx, r.begin(), r.end());
  }
};
HONE_DETAIL_DECL void parallel_ranges(std::size_t n, std::size_t grain, range_body body) {
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, grain), tbb_range_body{body});
}
}  // namespace detail
#endif

HONE_NAMESPACE_END
