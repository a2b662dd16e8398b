// bench/support/limit.hpp: the same-run "limit" of a memory-bound workload.
//
// A limit is a streaming pass that moves exactly the bytes the workload moves (the same number of
// arrays read, read and written in place, and only written, each `n` elements of the same type)
// with no arithmetic beyond what is needed to consume every loaded word: one bitwise OR per
// loaded vector. It runs over ONE contiguous allocation on the caller's oneTBB threads, so its
// bytes per second are the bandwidth ceiling of this machine for that access pattern, measured in
// the same process as the workload. Every benchmark reports its fraction of it.
//
//   axpy    y += a * x            limit<2, 1>  (reads x and y, writes y in place)
//   AdamW   p, m, v from p,g,m,v  limit<4, 3>  (reads 4 arrays, writes 3 of them in place)
//   cast    out = bf16(in)        stream_limit<T, 1, 0, 1> with the sizes of each side
//
// Why a bitwise OR: the limit must read every word (so the loads cannot be dropped), write every
// output word (so the stores cannot be dropped) and cost nothing else. `word = word | mask | r`
// with a `mask` the compiler cannot see (a volatile load, 0 at run time) does exactly that: one
// VPOR per 64-byte vector, values unchanged, and no store can be proven redundant. Plain stores
// (not non-temporal) are used because the workloads use plain stores too.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <hone/core/buffer.hpp>
#include <type_traits>

namespace hone_bench {

/// The unsigned integer the limit streams in place of T (same size, so the same bytes move).
template <class T>
using stream_word = std::conditional_t<
    sizeof(T) == 1, std::uint8_t,
    std::conditional_t<sizeof(T) == 2, std::uint16_t,
                       std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;

namespace detail {
template <class U, std::size_t RO, std::size_t RW, std::size_t WO>
struct stream_arrays {
  std::array<const U*, RO> ro;
  std::array<U*, RW> rw;
  std::array<U*, WO> wo;
};

// Never inlined into the benchmark loop, so the mask stays opaque and the loop is compiled once.
// The inner loops over the arrays have constant trip counts and are unrolled before the element
// loop is vectorized; `ivdep` states that the arrays do not overlap (they are disjoint slices of
// one allocation), so no runtime alias check is emitted.
template <class U, std::size_t RO, std::size_t RW, std::size_t WO>
[[gnu::noinline]] void stream_range(const stream_arrays<U, RO, RW, WO>& a, U mask,
                                    std::size_t begin, std::size_t end) {
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
      for (std::size_t k = 0; k < RO; ++k) r |= ro[k][i];
    }
    U all = r;
    if constexpr (RW > 0) {
      for (std::size_t k = 0; k < RW; ++k) {
        const U v = rw[k][i];
        all |= v;
        rw[k][i] = static_cast<U>(v | r);
      }
    }
    if constexpr (WO > 0) {
      for (std::size_t k = 0; k < WO; ++k) wo[k][i] = all;
    }
  }
}
}  // namespace detail

/// How the limit is cut over oneTBB threads. 64 Ki elements per task (256 KiB per float array)
/// with the auto partitioner; see docs/benchmarks.md for the partitioners and grains compared.
struct limit_tuning {
  std::size_t grain = std::size_t{1} << 16;
};

/// A streaming pass over `ReadOnly` arrays that are only read, `ReadWrite` arrays read and written
/// in place and `WriteOnly` arrays only written, each `n` elements of T, carved out of one
/// contiguous allocation. The allocation is initialized (first touch) in the constructor.
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

  explicit stream_limit(std::size_t n, limit_tuning tuning = {})
      : n_(n), tuning_(tuning), storage_(n * arrays) {
    word* base = storage_.data();
    for (std::size_t k = 0; k < arrays; ++k) {
      word* p = base + k * n;
      if (k < ReadOnly) {
        arrays_.ro[k] = p;
      } else if (k < reads) {
        arrays_.rw[k - ReadOnly] = p;
      } else {
        arrays_.wo[k - reads] = p;
      }
    }
    // First touch on the worker threads, with the same cut as run(), then one warm-up pass.
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n * arrays, tuning_.grain),
                      [base](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t i = r.begin(); i != r.end(); ++i) {
                          base[i] = static_cast<word>(i * 2654435761u);
                        }
                      });
    run();
  }

  /// One pass: every read array loaded once, every written array stored once.
  void run() {
    const word mask = mask_;  // volatile load: opaque to the optimizer, 0 at run time
    const auto& a = arrays_;
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n_, tuning_.grain),
                      [&a, mask](const tbb::blocked_range<std::size_t>& r) {
                        detail::stream_range(a, mask, r.begin(), r.end());
                      });
  }

  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  /// Bytes one pass moves: each read array read once, each written array written once.
  [[nodiscard]] std::size_t bytes_per_pass() const noexcept {
    return n_ * sizeof(T) * (reads + writes);
  }
  /// First word of the allocation (to check in tests that a pass kept the data).
  [[nodiscard]] word front() const noexcept { return storage_[0]; }

 private:
  std::size_t n_;
  limit_tuning tuning_;
  hone::buffer<word> storage_;
  detail::stream_arrays<word, ReadOnly, ReadWrite, WriteOnly> arrays_{};
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
