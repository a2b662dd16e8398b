// hone/data/detail/csv_scan.hpp: the quote-aware record-boundary scan of a CSV chunk, used by
// data::build_line_index (hone/data/line_dataset.hpp) to index CSV files. Internal: a user never
// calls it; the tests call each kernel against the scalar loop.
//
// csv_scan(kernel, s, b, e, starts) scans the bytes [b, e) of `s` (the whole file) and, for every
// '\n' at q there after which a record starts (csv_starts_record(s, q + 1): not the end of the
// file, not an empty line), appends q + 1 to starts[0] when an even number of '"' lie in [b, q)
// (the '\n' is outside quotes if the chunk began outside) and to starts[1] when an odd number do
// (outside quotes if the chunk began inside). It returns whether [b, e) holds an odd number of
// '"'. The caller picks one list per chunk with the quote parity of the chunks before it.
//
// Kernels (hone::isa values; every one gives the same lists, bit for bit, as the scalar loop):
//   isa::scalar  the byte loop: the oracle of the tests, and the kernel off x86-64 (no NEON
//                kernel is written) and under nvcc
//   isa::sse2    per 64-byte block, bitmasks of '"' and '\n' from four 16-byte compares; the
//                inside-quotes mask is the prefix XOR of the quote mask by a shift-xor cascade
//                (x ^= x << 1, 2, 4, ..., 32); the x86-64 baseline
//   isa::avx2    two 32-byte compares per block; the prefix XOR as one carry-less multiply by
//                all-ones (PCLMULQDQ, as simdjson does); needs AVX2, PCLMULQDQ and BMI1
//   isa::avx512  one 64-byte compare into a mask register per block, PCLMULQDQ as for avx2;
//                needs AVX-512 F/BW, PCLMULQDQ and BMI1 (left out with HONE_NO_AVX512)
// In every vector kernel the quote state is carried from one block to the next (all ones while
// inside quotes), each '\n' bit of a block is read off with the inside-quotes bit at its place,
// and the last partial block is copied into a zero-filled 64-byte block (zero bytes are neither
// '"' nor '\n'), so no byte past `e` is read except by csv_starts_record.
//
// Choice: csv_scan_kernel(hone::active_isa()) is the kernel build_line_index runs: the best one
// this CPU supports that is not above the active target, so HONE_ISA (e.g. HONE_ISA=scalar) and
// hone::force_isa cap this scan as they cap hone's other host loops. The vector kernels are
// functions with their own target attribute (GCC or Clang on x86-64, any -O level), so a generic
// -O2 build runs the AVX2 or AVX-512 kernel when the CPU has it; with HONE_NO_ISA_DISPATCH a kernel
// is compiled only when the compiler flags allow it. csv_scan_supported(t) says whether kernel t
// can run here.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/isa.hpp"

#if defined(HONE_ISA_X86) && defined(__GNUC__)
#define HONE_DETAIL_CSV_SSE2 1
#if !defined(HONE_NO_ISA_DISPATCH) || (defined(__AVX2__) && defined(__PCLMUL__) && defined(__BMI__))
#define HONE_DETAIL_CSV_AVX2 1
#endif
#if !defined(HONE_NO_AVX512) && !defined(HONE_OPTIM_NO_AVX512) && \
    (!defined(HONE_NO_ISA_DISPATCH) ||                            \
     (defined(__AVX512F__) && defined(__AVX512BW__) && defined(__PCLMUL__) && defined(__BMI__)))
#define HONE_DETAIL_CSV_AVX512 1
#endif
#include <immintrin.h>
#endif

HONE_NAMESPACE_BEGIN
namespace data::detail {

/// Whether the line starting at `p` is empty (nothing but an optional '\r' before '\n' or the end).
[[nodiscard]] inline bool empty_line_at(std::string_view s, std::uint64_t p) noexcept {
  if (p >= s.size()) return true;
  if (s[p] == '\n') return true;
  return s[p] == '\r' && (p + 1 == s.size() || s[p + 1] == '\n');
}

/// Whether a CSV record starts at the line start `p` (not the end of `s`, not an empty line).
[[nodiscard]] inline bool csv_starts_record(std::string_view s, std::uint64_t p) noexcept {
  return p < s.size() && !empty_line_at(s, p);
}

/// The scalar kernel (the reference of the others): one byte at a time.
inline bool csv_scan_scalar(std::string_view s, std::uint64_t b, std::uint64_t e,
                            std::vector<std::uint64_t>* starts) {
  const char* base = s.data();
  unsigned parity = 0;
  for (std::uint64_t q = b; q < e; ++q) {
    const char c = base[q];
    if (c == '"') {
      parity ^= 1U;
    } else if (c == '\n' && csv_starts_record(s, q + 1)) {
      // Outside quotes at q when the chunk's start state XOR the local parity is 0.
      starts[parity].push_back(q + 1);
    }
  }
  return parity != 0;
}

#if defined(HONE_DETAIL_CSV_SSE2)

/// The record starts after the '\n' bits of the 64-byte block at q0; bit k of `inside` is the
/// quote parity (from the chunk's start) at byte q0 + k.
HONE_FORCEINLINE void csv_emit(std::uint64_t newlines, std::uint64_t inside, std::uint64_t q0,
                               std::string_view s, std::vector<std::uint64_t>* starts) {
  while (newlines != 0) {
    const auto k = static_cast<unsigned>(__builtin_ctzll(newlines));
    const std::uint64_t p = q0 + k + 1;
    if (csv_starts_record(s, p)) starts[(inside >> k) & 1U].push_back(p);
    newlines &= newlines - 1;
  }
}

/// Bit k of the result: the XOR of bits 0..k of x (the shift-xor cascade).
HONE_FORCEINLINE std::uint64_t prefix_xor_shifts(std::uint64_t x) noexcept {
  x ^= x << 1;
  x ^= x << 2;
  x ^= x << 4;
  x ^= x << 8;
  x ^= x << 16;
  x ^= x << 32;
  return x;
}

/// One block of the SSE2 kernel: the quote state `carry` (all ones inside quotes) is updated.
HONE_FORCEINLINE void csv_block_sse2(const char* p, std::uint64_t q0, std::uint64_t& carry,
                                     std::string_view s, std::vector<std::uint64_t>* starts) {
  const __m128i quote = _mm_set1_epi8('"');
  const __m128i newline = _mm_set1_epi8('\n');
  std::uint64_t quotes = 0;
  std::uint64_t newlines = 0;
  for (unsigned j = 0; j < 4; ++j) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * j));
    quotes |= std::uint64_t{static_cast<std::uint16_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, quote)))}
              << (16 * j);
    newlines |=
        std::uint64_t{static_cast<std::uint16_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, newline)))}
        << (16 * j);
  }
  const std::uint64_t inside = prefix_xor_shifts(quotes) ^ carry;
  csv_emit(newlines, inside, q0, s, starts);
  carry = std::uint64_t{0} - (inside >> 63);
}

inline bool csv_scan_sse2(std::string_view s, std::uint64_t b, std::uint64_t e,
                          std::vector<std::uint64_t>* starts) {
  const char* base = s.data();
  std::uint64_t carry = 0;
  std::uint64_t i = b;
  for (; e - i >= 64; i += 64) csv_block_sse2(base + i, i, carry, s, starts);
  if (i < e) {
    alignas(64) char tail[64] = {};
    std::memcpy(tail, base + i, static_cast<std::size_t>(e - i));
    csv_block_sse2(tail, i, carry, s, starts);
  }
  return carry != 0;
}

#endif  // HONE_DETAIL_CSV_SSE2

#if defined(HONE_DETAIL_CSV_AVX2)

#define HONE_DETAIL_CSV_TARGET_AVX2 __attribute__((target("avx,avx2,pclmul,bmi")))

/// Bit k of the result: the XOR of bits 0..k of x (a carry-less multiply by all-ones).
HONE_DETAIL_CSV_TARGET_AVX2 HONE_FORCEINLINE std::uint64_t prefix_xor_avx2(std::uint64_t x) {
  const __m128i r =
      _mm_clmulepi64_si128(_mm_cvtsi64_si128(static_cast<long long>(x)), _mm_set1_epi8(-1), 0);
  return static_cast<std::uint64_t>(_mm_cvtsi128_si64(r));
}

/// The 64-bit mask of the bytes of the two halves `lo`, `hi` of a block equal to those of `c`.
HONE_DETAIL_CSV_TARGET_AVX2 HONE_FORCEINLINE std::uint64_t mask_avx2(__m256i lo, __m256i hi,
                                                                     __m256i c) {
  const auto l = static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(lo, c)));
  const auto h = static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(hi, c)));
  return std::uint64_t{l} | (std::uint64_t{h} << 32);
}

HONE_DETAIL_CSV_TARGET_AVX2 HONE_FORCEINLINE void csv_block_avx2(
    const char* p, std::uint64_t q0, std::uint64_t& carry, std::string_view s,
    std::vector<std::uint64_t>* starts) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
  const std::uint64_t quotes = mask_avx2(lo, hi, _mm256_set1_epi8('"'));
  const std::uint64_t inside = prefix_xor_avx2(quotes) ^ carry;
  csv_emit(mask_avx2(lo, hi, _mm256_set1_epi8('\n')), inside, q0, s, starts);
  carry = std::uint64_t{0} - (inside >> 63);
}

HONE_DETAIL_CSV_TARGET_AVX2 inline bool csv_scan_avx2(std::string_view s, std::uint64_t b,
                                                      std::uint64_t e,
                                                      std::vector<std::uint64_t>* starts) {
  const char* base = s.data();
  std::uint64_t carry = 0;
  std::uint64_t i = b;
  for (; e - i >= 64; i += 64) csv_block_avx2(base + i, i, carry, s, starts);
  if (i < e) {
    alignas(64) char tail[64] = {};
    std::memcpy(tail, base + i, static_cast<std::size_t>(e - i));
    csv_block_avx2(tail, i, carry, s, starts);
  }
  return carry != 0;
}

#endif  // HONE_DETAIL_CSV_AVX2

#if defined(HONE_DETAIL_CSV_AVX512)

#define HONE_DETAIL_CSV_TARGET_AVX512 \
  __attribute__((target("avx,avx2,avx512f,avx512bw,pclmul,bmi")))

HONE_DETAIL_CSV_TARGET_AVX512 HONE_FORCEINLINE void csv_block_avx512(
    const char* p, std::uint64_t q0, std::uint64_t& carry, std::string_view s,
    std::vector<std::uint64_t>* starts) {
  const __m512i v = _mm512_loadu_si512(p);
  const std::uint64_t quotes = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('"'));
  const std::uint64_t newlines = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('\n'));
  const __m128i r =
      _mm_clmulepi64_si128(_mm_cvtsi64_si128(static_cast<long long>(quotes)), _mm_set1_epi8(-1), 0);
  const std::uint64_t inside = static_cast<std::uint64_t>(_mm_cvtsi128_si64(r)) ^ carry;
  csv_emit(newlines, inside, q0, s, starts);
  carry = std::uint64_t{0} - (inside >> 63);
}

HONE_DETAIL_CSV_TARGET_AVX512 inline bool csv_scan_avx512(std::string_view s, std::uint64_t b,
                                                          std::uint64_t e,
                                                          std::vector<std::uint64_t>* starts) {
  const char* base = s.data();
  std::uint64_t carry = 0;
  std::uint64_t i = b;
  for (; e - i >= 64; i += 64) csv_block_avx512(base + i, i, carry, s, starts);
  if (i < e) {
    alignas(64) char tail[64] = {};
    std::memcpy(tail, base + i, static_cast<std::size_t>(e - i));
    csv_block_avx512(tail, i, carry, s, starts);
  }
  return carry != 0;
}

#endif  // HONE_DETAIL_CSV_AVX512

/// Whether CSV kernel `t` is compiled and this CPU can run it.
[[nodiscard]] inline bool csv_scan_supported(isa t) noexcept {
  switch (t) {
    case isa::scalar:
      return true;
#if defined(HONE_DETAIL_CSV_SSE2)
    case isa::sse2:
      return true;  // the x86-64 baseline
#endif
#if defined(HONE_DETAIL_CSV_AVX2)
    case isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("pclmul") &&
             __builtin_cpu_supports("bmi");
#endif
#if defined(HONE_DETAIL_CSV_AVX512)
    case isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("bmi");
#endif
    default:
      return false;
  }
}

/// The kernel that runs for the active target `t`: the best supported one not above it.
[[nodiscard]] inline isa csv_scan_kernel(isa t) noexcept {
  if (t == isa::avx512 && csv_scan_supported(isa::avx512)) return isa::avx512;
  if ((t == isa::avx512 || t == isa::avx2) && csv_scan_supported(isa::avx2)) return isa::avx2;
  if (t != isa::scalar && csv_scan_supported(isa::sse2)) return isa::sse2;
  return isa::scalar;
}

/// Scans [b, e) of `s` with kernel `t` (see the file comment); returns the chunk's quote parity.
/// A config_error when `t` cannot run here.
inline bool csv_scan(isa t, std::string_view s, std::uint64_t b, std::uint64_t e,
                     std::vector<std::uint64_t>* starts) {
  if (!csv_scan_supported(t)) {
    throw config_error("hone: the CSV scan kernel " + std::string(to_string(t)) +
                       " cannot run on this CPU or was not compiled in this build; use "
                       "csv_scan_kernel(hone::active_isa()) or isa::scalar");
  }
  if (b >= e) return false;
  switch (t) {
#if defined(HONE_DETAIL_CSV_AVX512)
    case isa::avx512:
      return csv_scan_avx512(s, b, e, starts);
#endif
#if defined(HONE_DETAIL_CSV_AVX2)
    case isa::avx2:
      return csv_scan_avx2(s, b, e, starts);
#endif
#if defined(HONE_DETAIL_CSV_SSE2)
    case isa::sse2:
      return csv_scan_sse2(s, b, e, starts);
#endif
    default:
      return csv_scan_scalar(s, b, e, starts);
  }
}

}  // namespace data::detail
HONE_NAMESPACE_END
