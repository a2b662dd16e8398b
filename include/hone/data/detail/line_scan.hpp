// hone/data/detail/line_scan.hpp: the record-boundary scan of a text or JSON Lines chunk, used by
// data::build_line_index (hone/data/line_dataset.hpp) to index those files. Internal: a user never
// calls it; the tests call each kernel against the memchr loop.
//
// line_scan(kernel, skip_empty, s, b, e, out) scans the bytes [b, e) of `s` (the whole file) and,
// for every '\n' at q there, appends q + 1 to `out` when a record starts there: q + 1 is not the
// end of the file and, with `skip_empty` (JSON Lines), the line at q + 1 is not empty
// (empty_line_at: nothing but an optional '\r' before the next '\n' or the end). Text
// (skip_empty false) keeps every line, empty ones too. Whitespace-only lines are not empty.
//
// Kernels (hone::isa values; every one gives the same list, bit for bit, as the memchr loop):
//   isa::scalar  one memchr per line: the oracle of the tests, and the kernel off x86-64 (no NEON
//                kernel is written) and under nvcc
//   isa::sse2    per 64-byte block, the bitmask of '\n' from four 16-byte compares; the x86-64
//                baseline
//   isa::avx2    two 32-byte compares per block; needs AVX2, BMI1 and POPCNT
//   isa::avx512  one 64-byte compare into a mask register per block; needs AVX-512 F/BW, BMI1
//                and POPCNT (left out with HONE_NO_AVX512)
// Each set bit k of a block at q0 is a record start q0 + k + 1. Text writes them all without a
// branch per record (the bits are unrolled 4 and 8 at a time into spare room at the end of a
// per-thread scratch list, as simdjson does; the chunk's starts are then appended to `out` in one
// copy); JSON Lines does the same unless a '\n' of the block is followed by a
// '\n' or '\r' (a '\r' mask is kept beside the '\n' one; the byte after the block is read once),
// in which case that block's starts are checked one by one with empty_line_at. The last partial
// block is copied into a zero-filled 64-byte block (zero bytes are neither '\n' nor '\r'), so no
// byte past the end of `s` is read; bytes past `e` are read only to judge the line after the
// chunk's last '\n'. A start at the end of the file (a file ending in '\n') is dropped last.
//
// Choice: line_scan_kernel(hone::active_isa()) is the kernel build_line_index runs: the best one
// this CPU supports that is not above the active target, so HONE_ISA (e.g. HONE_ISA=scalar) and
// hone::force_isa cap this scan as they cap hone's other host loops. The vector kernels are
// functions with their own target attribute (GCC or Clang on x86-64, any -O level), so a generic
// -O2 build runs the AVX2 or AVX-512 kernel when the CPU has it; with HONE_NO_ISA_DISPATCH a kernel
// is compiled only when the compiler flags allow it. line_scan_supported(t) says whether kernel t
// can run here.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/isa.hpp"
#include "hone/data/detail/csv_scan.hpp"  // empty_line_at

#if defined(HONE_ISA_X86) && defined(__GNUC__)
#define HONE_DETAIL_LINE_SSE2 1
#if !defined(HONE_NO_ISA_DISPATCH) || (defined(__AVX2__) && defined(__BMI__) && defined(__POPCNT__))
#define HONE_DETAIL_LINE_AVX2 1
#endif
#if !defined(HONE_NO_AVX512) && !defined(HONE_OPTIM_NO_AVX512) && \
    (!defined(HONE_NO_ISA_DISPATCH) ||                            \
     (defined(__AVX512F__) && defined(__AVX512BW__) && defined(__BMI__) && defined(__POPCNT__)))
#define HONE_DETAIL_LINE_AVX512 1
#endif
#include <immintrin.h>
#endif

HONE_NAMESPACE_BEGIN
namespace data::detail {

/// The memchr kernel (the reference of the others): one call per line.
inline void line_scan_memchr(bool skip_empty, std::string_view s, std::uint64_t b, std::uint64_t e,
                             std::vector<std::uint64_t>& out) {
  const char* base = s.data();
  const char* p = base + b;
  const char* end = base + e;
  while (p < end) {
    const void* hit = std::memchr(p, '\n', static_cast<std::size_t>(end - p));
    if (hit == nullptr) break;
    const auto q = static_cast<std::uint64_t>(static_cast<const char*>(hit) - base);
    if (q + 1 < s.size() && !(skip_empty && empty_line_at(s, q + 1))) out.push_back(q + 1);
    p = static_cast<const char*>(hit) + 1;
  }
}

#if defined(HONE_DETAIL_LINE_SSE2)

/// The record starts of a chunk, written into the scanning thread's scratch list (kept at least
/// 64 entries longer than the starts written, so a block's starts need no capacity check, and
/// reused from chunk to chunk, so its pages are not faulted in and zeroed again); finish()
/// appends them to `out`, allocating exactly what they need.
class line_sink {
 public:
  line_sink(std::vector<std::uint64_t>& out, std::string_view s, std::uint64_t chunk_bytes)
      : out_(out), s_(s), scratch_(scratch()) {
    // Room for one start per 32 bytes to begin with (lines of 32 bytes or more on average need
    // no growth); shorter ones double it as often as needed.
    const auto want = 64 + static_cast<std::size_t>(chunk_bytes / 32);
    if (scratch_.size() < want) scratch_.resize(want);
    w_ = scratch_.data();
  }
  line_sink(const line_sink&) = delete;
  line_sink& operator=(const line_sink&) = delete;

  /// The starts after the '\n' bits `nl` of the block at q0. With `SkipEmpty`, `next` has bit k
  /// set when the byte after q0 + k is '\n' or '\r' (the line there may be empty).
  template <bool SkipEmpty>
  HONE_FORCEINLINE void block(std::uint64_t nl, std::uint64_t next, std::uint64_t q0) {
    if (nl == 0) return;
    if (scratch_.size() - n_ < 64) grow();
    if (SkipEmpty && (nl & next) != 0) {
      while (nl != 0) {  // a '\n' or '\r' after a '\n': judge each start
        const std::uint64_t p = q0 + static_cast<unsigned>(std::countr_zero(nl)) + 1;
        w_[n_] = p;
        n_ += empty_line_at(s_, p) ? 0 : 1;
        nl &= nl - 1;
      }
      return;
    }
    const auto count = static_cast<std::size_t>(std::popcount(nl));
    std::uint64_t* o = w_ + n_;
    const std::uint64_t q1 = q0 + 1;
    // countr_zero(0) is 64: the writes past `count` land in the spare room and are overwritten.
    for (int k = 0; k < 4; ++k) {
      o[k] = q1 + static_cast<unsigned>(std::countr_zero(nl));
      nl &= nl - 1;
    }
    if (count > 4) {
      for (int k = 4; k < 8; ++k) {
        o[k] = q1 + static_cast<unsigned>(std::countr_zero(nl));
        nl &= nl - 1;
      }
      for (std::size_t k = 8; nl != 0; ++k) {
        o[k] = q1 + static_cast<unsigned>(std::countr_zero(nl));
        nl &= nl - 1;
      }
    }
    n_ += count;
  }

  /// Drops a start at the end of the file (only the last one can be) and appends the starts to
  /// `out`. A scratch list grown past 32 MiB (huge chunks of short lines) is given back.
  void finish() {
    if (n_ > 0 && w_[n_ - 1] >= s_.size()) --n_;
    out_.insert(out_.end(), w_, w_ + n_);
    if (scratch_.size() > (std::size_t{4} << 20)) std::vector<std::uint64_t>().swap(scratch_);
  }

 private:
  static std::vector<std::uint64_t>& scratch() {
    thread_local std::vector<std::uint64_t> list;
    return list;
  }
  void grow() {
    scratch_.resize(scratch_.size() * 2 + 64);
    w_ = scratch_.data();
  }

  std::vector<std::uint64_t>& out_;
  std::string_view s_;
  std::vector<std::uint64_t>& scratch_;
  std::size_t n_ = 0;
  std::uint64_t* w_ = nullptr;
};

/// Bit 63 of the `next` mask of the block at q0: whether the byte after it is '\n' or '\r' (past
/// the end of the file: 0; a start there is the end of the file, which finish() drops).
[[nodiscard]] HONE_FORCEINLINE std::uint64_t next_after_block(std::string_view s,
                                                              std::uint64_t q0) noexcept {
  if (q0 + 64 >= s.size()) return 0;
  const char c = s[q0 + 64];
  return (c == '\n' || c == '\r') ? std::uint64_t{1} << 63 : 0;
}

/// The bytes [q0, q0 + 64) of `s` that exist, copied into `tail` (zero-filled past the end).
HONE_FORCEINLINE void copy_tail(char* tail, std::string_view s, std::uint64_t q0) noexcept {
  const std::uint64_t n = std::min<std::uint64_t>(64, s.size() - q0);
  std::memcpy(tail, s.data() + q0, static_cast<std::size_t>(n));
}

/// The '\n' and '\r' masks of the 64-byte block at p (SSE2).
HONE_FORCEINLINE void line_masks_sse2(const char* p, std::uint64_t& nl, std::uint64_t& cr,
                                      bool want_cr) {
  const __m128i newline = _mm_set1_epi8('\n');
  const __m128i ret = _mm_set1_epi8('\r');
  nl = 0;
  cr = 0;
  for (unsigned j = 0; j < 4; ++j) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * j));
    nl |= std::uint64_t{static_cast<std::uint16_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, newline)))}
          << (16 * j);
    if (want_cr) {
      cr |= std::uint64_t{static_cast<std::uint16_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, ret)))}
            << (16 * j);
    }
  }
}

// The block loop of one kernel: MASKS(p, nl, cr, want_cr) fills the masks of the block at p.
// A macro, not a template: each kernel's loop must be compiled with that kernel's target. The
// tail's masks cover the bytes up to 64 past i that exist, so (nl | cr) >> 1 judges the byte
// after the chunk's last '\n' too; only the '\n' bits past e (e - i < 64) are masked off.
#define HONE_DETAIL_LINE_LOOP(SKIP, MASKS)                                               \
  do {                                                                                   \
    line_sink sink(out, s, e - b);                                                       \
    const char* base = s.data();                                                         \
    std::uint64_t i = b;                                                                 \
    std::uint64_t nl = 0;                                                                \
    std::uint64_t cr = 0;                                                                \
    for (; e - i >= 64; i += 64) {                                                       \
      MASKS(base + i, nl, cr, SKIP);                                                     \
      sink.block<SKIP>(nl, SKIP ? (((nl | cr) >> 1) | next_after_block(s, i)) : 0, i);   \
    }                                                                                    \
    if (i < e) {                                                                         \
      alignas(64) char tail[64] = {};                                                    \
      copy_tail(tail, s, i);                                                             \
      MASKS(tail, nl, cr, SKIP);                                                         \
      const std::uint64_t next = SKIP ? (((nl | cr) >> 1) | next_after_block(s, i)) : 0; \
      sink.block<SKIP>(nl & ((std::uint64_t{1} << (e - i)) - 1), next, i);               \
    }                                                                                    \
    sink.finish();                                                                       \
  } while (false)

template <bool SkipEmpty>
inline void line_scan_sse2(std::string_view s, std::uint64_t b, std::uint64_t e,
                           std::vector<std::uint64_t>& out) {
  HONE_DETAIL_LINE_LOOP(SkipEmpty, line_masks_sse2);
}

#endif  // HONE_DETAIL_LINE_SSE2

#if defined(HONE_DETAIL_LINE_AVX2)

#define HONE_DETAIL_LINE_TARGET_AVX2 __attribute__((target("avx,avx2,bmi,popcnt")))

/// The 64-bit mask of the bytes of the two halves `lo`, `hi` of a block equal to those of `c`.
HONE_DETAIL_LINE_TARGET_AVX2 HONE_FORCEINLINE std::uint64_t line_mask_avx2(__m256i lo, __m256i hi,
                                                                           __m256i c) {
  const auto l = static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(lo, c)));
  const auto h = static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(hi, c)));
  return std::uint64_t{l} | (std::uint64_t{h} << 32);
}

/// The '\n' and '\r' masks of the 64-byte block at p (AVX2).
HONE_DETAIL_LINE_TARGET_AVX2 HONE_FORCEINLINE void line_masks_avx2(const char* p, std::uint64_t& nl,
                                                                   std::uint64_t& cr,
                                                                   bool want_cr) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
  nl = line_mask_avx2(lo, hi, _mm256_set1_epi8('\n'));
  cr = want_cr ? line_mask_avx2(lo, hi, _mm256_set1_epi8('\r')) : 0;
}

template <bool SkipEmpty>
HONE_DETAIL_LINE_TARGET_AVX2 inline void line_scan_avx2(std::string_view s, std::uint64_t b,
                                                        std::uint64_t e,
                                                        std::vector<std::uint64_t>& out) {
  HONE_DETAIL_LINE_LOOP(SkipEmpty, line_masks_avx2);
}

#endif  // HONE_DETAIL_LINE_AVX2

#if defined(HONE_DETAIL_LINE_AVX512)

#define HONE_DETAIL_LINE_TARGET_AVX512 \
  __attribute__((target("avx,avx2,avx512f,avx512bw,bmi,popcnt")))

/// The '\n' and '\r' masks of the 64-byte block at p (AVX-512).
HONE_DETAIL_LINE_TARGET_AVX512 HONE_FORCEINLINE void line_masks_avx512(const char* p,
                                                                       std::uint64_t& nl,
                                                                       std::uint64_t& cr,
                                                                       bool want_cr) {
  const __m512i v = _mm512_loadu_si512(p);
  nl = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('\n'));
  cr = want_cr ? std::uint64_t{_mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('\r'))} : 0;
}

template <bool SkipEmpty>
HONE_DETAIL_LINE_TARGET_AVX512 inline void line_scan_avx512(std::string_view s, std::uint64_t b,
                                                            std::uint64_t e,
                                                            std::vector<std::uint64_t>& out) {
  HONE_DETAIL_LINE_LOOP(SkipEmpty, line_masks_avx512);
}

#endif  // HONE_DETAIL_LINE_AVX512

/// Whether line kernel `t` is compiled and this CPU can run it.
[[nodiscard]] inline bool line_scan_supported(isa t) noexcept {
  switch (t) {
    case isa::scalar:
      return true;
#if defined(HONE_DETAIL_LINE_SSE2)
    case isa::sse2:
      return true;  // the x86-64 baseline
#endif
#if defined(HONE_DETAIL_LINE_AVX2)
    case isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") &&
             __builtin_cpu_supports("popcnt");
#endif
#if defined(HONE_DETAIL_LINE_AVX512)
    case isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("bmi") && __builtin_cpu_supports("popcnt");
#endif
    default:
      return false;
  }
}

/// The kernel that runs for the active target `t`: the best supported one not above it.
[[nodiscard]] inline isa line_scan_kernel(isa t) noexcept {
  if (t == isa::avx512 && line_scan_supported(isa::avx512)) return isa::avx512;
  if ((t == isa::avx512 || t == isa::avx2) && line_scan_supported(isa::avx2)) return isa::avx2;
  if (t != isa::scalar && line_scan_supported(isa::sse2)) return isa::sse2;
  return isa::scalar;
}

/// Scans [b, e) of `s` with kernel `t` (see the file comment), appending to `out`. A config_error
/// when `t` cannot run here.
inline void line_scan(isa t, bool skip_empty, std::string_view s, std::uint64_t b, std::uint64_t e,
                      std::vector<std::uint64_t>& out) {
  if (!line_scan_supported(t)) {
    throw config_error("hone: the line scan kernel " + std::string(to_string(t)) +
                       " cannot run on this CPU or was not compiled in this build; use "
                       "line_scan_kernel(hone::active_isa()) or isa::scalar");
  }
  if (b >= e) return;
  switch (t) {
#if defined(HONE_DETAIL_LINE_AVX512)
    case isa::avx512:
      return skip_empty ? line_scan_avx512<true>(s, b, e, out)
                        : line_scan_avx512<false>(s, b, e, out);
#endif
#if defined(HONE_DETAIL_LINE_AVX2)
    case isa::avx2:
      return skip_empty ? line_scan_avx2<true>(s, b, e, out) : line_scan_avx2<false>(s, b, e, out);
#endif
#if defined(HONE_DETAIL_LINE_SSE2)
    case isa::sse2:
      return skip_empty ? line_scan_sse2<true>(s, b, e, out) : line_scan_sse2<false>(s, b, e, out);
#endif
    default:
      return line_scan_memchr(skip_empty, s, b, e, out);
  }
}

}  // namespace data::detail
HONE_NAMESPACE_END
