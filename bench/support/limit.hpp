// bench/support/limit.hpp: the same-run "limit" of a memory-bound workload.
//
// A limit is a streaming pass that moves exactly the bytes the workload moves (the same number of
// arrays read, read and written in place, and only written, each `n` elements of the same type)
// with no arithmetic beyond what is needed to consume every loaded word: one bitwise OR per
// loaded vector. It runs on the caller's oneTBB threads, in the same process as the workload.
//
//   axpy    y += a * x            limit<2, 1>  (reads x and y, writes y in place)
//   AdamW   p, m, v from p,g,m,v  limit<4, 3>  (reads 4 arrays, writes 3 of them in place)
//   cast    out = bf16(in)        stream_limit<T, 1, 0, 1> with the sizes of each side
//
// A limit is a ceiling only if no way of streaming those bytes is faster, so every limit is
// measured with several kernels (stream_kernel), each registered as its own row, and
// bench/report.py takes the best row of a workload as its limit:
//
//   "limit"        plain stores; the arrays carved out of one allocation, array k placed
//                  k * (4 KiB + 64 B) further than back to back. Back to back, arrays of a
//                  power-of-two size (64 Mi floats: exactly 256 MiB apart) give an element's
//                  loads and stores the same low address bits, so they compete for the same
//                  cache sets and DRAM banks: on a 2-core AMD EPYC (Zen 4) VM limit<4, 3> ran
//                  at 37% of the staggered pass, below the AdamW step it bounds.
//   "limit_nt"     the same placement, the stores to arrays that are only written
//                  non-temporal (streaming stores bypass the cache, so a written line is not
//                  read first); arrays written in place keep plain stores.
//   "limit_arena"  plain stores, each array a separate allocation (as hone's arenas are: one
//                  per array, all of the same size) cut into hone::host_tuning's chunks.
//
// Why a bitwise OR: the limit must read every word (so the loads cannot be dropped), write every
// output word (so the stores cannot be dropped) and cost nothing else. `word = word | mask | r`
// with a `mask` the compiler cannot see (a volatile load, 0 at run time) does exactly that: one
// VPOR per 64-byte vector, values unchanged, and no store can be proven redundant.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <hone/core/buffer.hpp>
#include <hone/core/isa.hpp>
#include <hone/core/parallel.hpp>
#include <memory>
#include <string>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace hone_bench {

/// The unsigned integer the limit streams in place of T (same size, so the same bytes move).
template <class T>
using stream_word = std::conditional_t<
    sizeof(T) == 1, std::uint8_t,
    std::conditional_t<sizeof(T) == 2, std::uint16_t,
                       std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;

/// How a limit streams its arrays (see the top of this file).
enum class stream_kernel { plain, nontemporal, arena };

/// Every kernel, in the order their rows are registered.
inline constexpr std::array<stream_kernel, 3> stream_kernels = {
    stream_kernel::plain, stream_kernel::nontemporal, stream_kernel::arena};

/// The impl name of a kernel's row: "limit", "limit_nt", "limit_arena".
inline std::string limit_impl(stream_kernel k) {
  switch (k) {
    case stream_kernel::nontemporal:
      return "limit_nt";
    case stream_kernel::arena:
      return "limit_arena";
    case stream_kernel::plain:
      break;
  }
  return "limit";
}

/// Bytes between the ends of consecutive arrays of one allocation: a page and a cache line, so
/// that array k's element i lies k * 64 bytes further into its page than array 0's.
inline constexpr std::size_t stream_stagger_bytes = 4096 + 64;

namespace detail {
template <class U, std::size_t RO, std::size_t RW, std::size_t WO>
struct stream_arrays {
  std::array<const U*, RO> ro;
  std::array<U*, RW> rw;
  std::array<U*, WO> wo;
};

// Unrolls a loop with a constant trip count completely, also at -O2 (where g++ unrolls only what
// does not grow the code, and an inner loop over the arrays left rolled keeps the element loop
// from vectorizing).
// (An always-inlined lambda: what run_best runs; nvcc's front end takes no attribute there.)
#if defined(__CUDACC__)
#define HONE_BENCH_INLINE_LAMBDA
#else
#define HONE_BENCH_INLINE_LAMBDA __attribute__((always_inline))
#endif

#if defined(__CUDACC__)
#define HONE_BENCH_UNROLL  // nvcc's front end knows no GCC pragma; the .cu benches' limits
#elif defined(__GNUC__) && !defined(__clang__)
#define HONE_BENCH_UNROLL _Pragma("GCC unroll 16")
#elif defined(__clang__)
#define HONE_BENCH_UNROLL _Pragma("unroll")
#else
#define HONE_BENCH_UNROLL
#endif

// The element loop of a limit. The inner loops over the arrays have constant trip counts and are
// unrolled (HONE_BENCH_UNROLL) before the element loop is vectorized; `ivdep` states that the
// arrays do not overlap, so no runtime alias check is emitted.
template <class U, std::size_t RO, std::size_t RW, std::size_t WO>
inline __attribute__((always_inline)) void stream_body(const stream_arrays<U, RO, RW, WO>& a,
                                                       U mask, std::size_t begin, std::size_t end) {
  const auto ro = a.ro;
  const auto rw = a.rw;
  const auto wo = a.wo;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC ivdep
#elif defined(__clang__)
#pragma clang loop vectorize(assume_safety)
#endif
  for (std::size_t i = begin; i < end; ++i) {
    U r = mask;
    if constexpr (RO > 0) {
      HONE_BENCH_UNROLL
      for (std::size_t k = 0; k < RO; ++k) r |= ro[k][i];
    }
    U all = r;
    if constexpr (RW > 0) {
      HONE_BENCH_UNROLL
      for (std::size_t k = 0; k < RW; ++k) {
        const U v = rw[k][i];
        all |= v;
        rw[k][i] = static_cast<U>(v | r);
      }
    }
    if constexpr (WO > 0) {
      HONE_BENCH_UNROLL
      for (std::size_t k = 0; k < WO; ++k) wo[k][i] = all;
    }
  }
}

// A limit's loop compiled for each x86-64 target hone's loops choose from at run time
// (hone/core/isa.hpp) and asked to vectorize whatever the build's -O level (g++ 12 at -O2
// vectorizes nothing with its very-cheap cost model): run_best(f) runs f, an always-inlined call of
// a loop, inside a function compiled for the best target of this CPU, so a generic -O2 build's
// limit streams with the widest vectors the CPU has, as hone's own loops do, and stays a ceiling
// in every build. Never inlined into the benchmark loop, so the mask stays opaque.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define HONE_BENCH_VECTORIZE optimize("tree-vectorize", "vect-cost-model=dynamic"),
#define HONE_BENCH_AVX512 "avx,avx2,avx512f,avx512bw,prefer-vector-width=512"
#else
#define HONE_BENCH_VECTORIZE
#define HONE_BENCH_AVX512 "avx,avx2,avx512f,avx512bw"
#endif
template <class F>
__attribute__((HONE_BENCH_VECTORIZE noinline, flatten)) void run_base(const F& f) {
  f();
}
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
template <class F>
__attribute__((HONE_BENCH_VECTORIZE noinline, flatten, target("avx,avx2"))) void run_avx2(
    const F& f) {
  f();
}
template <class F>
__attribute__((HONE_BENCH_VECTORIZE noinline, flatten, target(HONE_BENCH_AVX512))) void run_avx512(
    const F& f) {
  f();
}
#endif
template <class F>
void run_best(const F& f) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
  static const hone::isa best = hone::best_isa();
  if (best == hone::isa::avx512) return run_avx512(f);
  if (best == hone::isa::avx2) return run_avx2(f);
#endif
  run_base(f);
}

template <class U, std::size_t RO, std::size_t RW, std::size_t WO>
void stream_range(const stream_arrays<U, RO, RW, WO>& a, U mask, std::size_t begin,
                  std::size_t end) {
  run_best([&]() HONE_BENCH_INLINE_LAMBDA { stream_body(a, mask, begin, end); });
}

// 64 bytes as one value (GCC and clang vector extension; lowered to the widest vectors the target
// has). OR is bitwise, so the element width does not matter inside a vector.
typedef std::uint64_t vec64 __attribute__((vector_size(64), may_alias));

// (Vectors are passed by reference: passing 64-byte vectors by value changes the ABI with the
// target's vector width, which g++ warns about.)
inline void load64(vec64& v, const void* p) noexcept {
  v = *static_cast<const vec64*>(p);
}

/// A non-temporal store of 64 bytes at a 64-byte aligned address (a plain store where the target
/// has no streaming store).
inline void stream64(void* p, const vec64& v) noexcept {
#if defined(__AVX512F__)
  __m512i x;
  std::memcpy(&x, &v, 64);
  _mm512_stream_si512(static_cast<__m512i*>(p), x);
#elif defined(__AVX__)
  __m256i x[2];
  std::memcpy(x, &v, 64);
  _mm256_stream_si256(static_cast<__m256i*>(p), x[0]);
  _mm256_stream_si256(static_cast<__m256i*>(p) + 1, x[1]);
#elif defined(__SSE2__)
  __m128i x[4];
  std::memcpy(x, &v, 64);
  for (int k = 0; k < 4; ++k) _mm_stream_si128(static_cast<__m128i*>(p) + k, x[k]);
#else
  *static_cast<vec64*>(p) = v;
#endif
}

inline void stream_fence() noexcept {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// The pass of stream_range with non-temporal stores to the arrays that are only written (an
// array read and written in place is in the cache when it is stored: a streaming store would
// only evict it early): 64-byte vectors between the first and the last 64-byte boundary of the
// range (every array has the same alignment phase), the ends element by element with plain
// stores.
template <class U, std::size_t RO, std::size_t RW, std::size_t WO>
[[gnu::noinline]] void stream_range_nt(const stream_arrays<U, RO, RW, WO>& a, U mask,
                                       std::size_t begin, std::size_t end) {
  constexpr std::size_t per = 64 / sizeof(U);
  const void* first = nullptr;
  if constexpr (RO > 0) {
    first = a.ro[0];
  } else {
    first = a.rw[0];
  }
  const std::size_t phase = (reinterpret_cast<std::uintptr_t>(first) % 64) / sizeof(U);
  std::size_t body = (begin + phase + per - 1) / per * per - phase;  // first aligned element
  if (body > end) body = end;
  std::size_t tail = body + (end - body) / per * per;
  stream_range(a, mask, begin, body);
  U lanes[per];
  for (std::size_t k = 0; k < per; ++k) lanes[k] = mask;
  vec64 m;
  std::memcpy(&m, lanes, 64);
  for (std::size_t i = body; i < tail; i += per) {
    vec64 r = m;
    vec64 v;
    if constexpr (RO > 0) {
      for (std::size_t k = 0; k < RO; ++k) {
        load64(v, a.ro[k] + i);
        r |= v;
      }
    }
    vec64 all = r;
    if constexpr (RW > 0) {
      for (std::size_t k = 0; k < RW; ++k) {
        load64(v, a.rw[k] + i);
        all |= v;
        v |= r;
        *reinterpret_cast<vec64*>(a.rw[k] + i) = v;  // in place: the line is in the cache already
      }
    }
    if constexpr (WO > 0) {
      for (std::size_t k = 0; k < WO; ++k) stream64(a.wo[k] + i, all);
    }
  }
  stream_fence();  // streaming stores are weakly ordered: drain them before the task ends
  stream_range(a, mask, tail, end);
}

template <class U>
void first_touch(U* p, std::size_t n, std::size_t grain, std::size_t seed) {
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, grain),
                    [p, seed](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t i = r.begin(); i != r.end(); ++i) {
                        p[i] = static_cast<U>((seed + i) * 2654435761u);
                      }
                    });
}
}  // namespace detail

/// How the limit is cut over oneTBB threads: 64 Ki elements per task (hone::host_tuning's grain)
/// with the auto partitioner; see docs/benchmarks.md for the partitioners and grains compared.
struct limit_tuning {
  std::size_t grain = hone::host_tuning{}.grain;
};

/// A streaming pass over `ReadOnly` arrays that are only read, `ReadWrite` arrays read and written
/// in place and `WriteOnly` arrays only written, each `n` elements of T. run(kernel) runs one
/// pass with one of the kernels of stream_kernel. The staggered allocation (kernels plain and
/// nontemporal) is initialized (first touch) in the constructor; the separate allocations of the
/// arena kernel on its first run.
template <class T, std::size_t ReadOnly, std::size_t ReadWrite, std::size_t WriteOnly = 0>
class stream_limit {
  static_assert(ReadOnly + ReadWrite > 0, "a limit must read at least one array");
  static_assert(ReadWrite + WriteOnly > 0, "a limit must write at least one array");
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8,
                "stream_limit streams 1, 2, 4 or 8 byte elements");

 public:
  using word = stream_word<T>;
  static constexpr std::size_t arrays = ReadOnly + ReadWrite + WriteOnly;
  static constexpr std::size_t reads = ReadOnly + ReadWrite;
  static constexpr std::size_t writes = ReadWrite + WriteOnly;
  /// Elements from the start of one array of the staggered allocation to the start of the next.
  static constexpr std::size_t pitch(std::size_t n) noexcept {
    const std::size_t line = 64 / sizeof(word);
    return (n + line - 1) / line * line + stream_stagger_bytes / sizeof(word);
  }

  explicit stream_limit(std::size_t n, limit_tuning tuning = {})
      : n_(n), tuning_(tuning), storage_(pitch(n) * arrays) {
    word* base = storage_.data();
    for (std::size_t k = 0; k < arrays; ++k) place(staggered_, k, base + k * pitch(n));
    detail::first_touch(base, storage_.size(), tuning_.grain, 0);
    run();
  }

  /// One pass: every read array loaded once, every written array stored once.
  void run(stream_kernel kernel = stream_kernel::plain) {
    const word mask = mask_;  // volatile load: opaque to the optimizer, 0 at run time
    if (kernel == stream_kernel::arena && !arena_) make_arena();
    const auto& a = kernel == stream_kernel::arena ? arena_->views : staggered_;
    if (kernel == stream_kernel::nontemporal) {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n_, tuning_.grain),
                        [&a, mask](const tbb::blocked_range<std::size_t>& r) {
                          detail::stream_range_nt(a, mask, r.begin(), r.end());
                        });
    } else {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n_, tuning_.grain),
                        [&a, mask](const tbb::blocked_range<std::size_t>& r) {
                          detail::stream_range(a, mask, r.begin(), r.end());
                        });
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  /// Bytes one pass moves: each read array read once, each written array written once.
  [[nodiscard]] std::size_t bytes_per_pass() const noexcept {
    return n_ * sizeof(T) * (reads + writes);
  }
  /// Element i of array k (in the order read-only, read-write, write-only) as the given kernel
  /// sees it (for tests: a pass keeps the data, arrays do not overlap).
  [[nodiscard]] word at(stream_kernel kernel, std::size_t k, std::size_t i) const {
    return array(kernel, k)[i];
  }
  /// Array k's first element as the given kernel places it (the arena kernel's after its first
  /// run).
  [[nodiscard]] const word* array(stream_kernel kernel, std::size_t k) const {
    const auto& a = kernel == stream_kernel::arena ? arena_->views : staggered_;
    if (k < ReadOnly) return a.ro[k];
    if (k < reads) return a.rw[k - ReadOnly];
    return a.wo[k - reads];
  }

 private:
  using arrays_t = detail::stream_arrays<word, ReadOnly, ReadWrite, WriteOnly>;
  struct arena_arrays {
    std::array<hone::buffer<word>, arrays> storage;
    arrays_t views{};
  };

  static void place(arrays_t& a, std::size_t k, word* p) {
    if (k < ReadOnly) {
      a.ro[k] = p;
    } else if (k < reads) {
      a.rw[k - ReadOnly] = p;
    } else {
      a.wo[k - reads] = p;
    }
  }
  void make_arena() {
    auto a = std::make_unique<arena_arrays>();
    for (std::size_t k = 0; k < arrays; ++k) {
      a->storage[k] = hone::buffer<word>(n_);
      detail::first_touch(a->storage[k].data(), n_, tuning_.grain, k * n_);
      place(a->views, k, a->storage[k].data());
    }
    arena_ = std::move(a);
  }

  std::size_t n_;
  limit_tuning tuning_;
  hone::buffer<word> storage_;
  arrays_t staggered_{};
  std::unique_ptr<arena_arrays> arena_;
  inline static volatile word mask_ = 0;
};

namespace detail {
template <class T, std::size_t Reads, std::size_t Writes>
struct limit_for {
  // In-place workloads (optimizers, axpy): the written arrays are among the read ones.
  static_assert(Writes <= Reads,
                "hone_bench::limit<Reads, Writes> describes in-place updates (Writes <= Reads); "
                "use stream_limit<T, ReadOnly, ReadWrite, WriteOnly> for write-only outputs");
  using type = stream_limit<T, Reads - Writes, Writes, 0>;
};
}  // namespace detail

/// The limit of an in-place update that reads `Reads` arrays and writes `Writes` of them back.
template <std::size_t Reads, std::size_t Writes, class T = float>
using limit = typename detail::limit_for<T, Reads, Writes>::type;

}  // namespace hone_bench
