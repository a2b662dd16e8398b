// hone/checkpoint/detail/byte_planes.hpp: the loops behind hone/checkpoint/byte_transforms.hpp
// (byte-plane transposes and the float split). Internal: use shuffle_bytes, transform_bytes and
// their inverses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/parallel.hpp"  // HONE_VECTORIZE_FUNCTION

HONE_NAMESPACE_BEGIN
namespace checkpoint {
namespace detail {
// The transforms run once per byte written (ahead of zstd-1 at ~0.6 GB/s per core), so they must
// not cost a visible share of it: with the element size a compile-time constant and the arrays
// declared non-overlapping, g++ and clang vectorize these loops (byte gathers become shuffles);
// HONE_VECTORIZE_FUNCTION asks g++ to do so at -O2 as well. The generic item loop ran at 2-3 GB/s,
// the fixed ones at 10-50 (`-O3 -march=native`, one core of the 2-core CI machine).
/// Byte j of element i moves between i * item + j (elements) and j * n + i (planes): to the planes
/// when ToPlanes, back otherwise. Item is the element size when fixed at compile time (0: `item`).
template <bool ToPlanes, std::size_t Item>
HONE_VECTORIZE_FUNCTION void transpose_planes(const std::uint8_t* HONE_RESTRICT src, std::size_t n,
                                              std::size_t item,
                                              std::uint8_t* HONE_RESTRICT dst) noexcept {
  const std::size_t k = Item != 0 ? Item : item;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < k; ++j) {
      if constexpr (ToPlanes) {
        dst[j * n + i] = src[i * k + j];
      } else {
        dst[i * k + j] = src[j * n + i];
      }
    }
  }
}

/// The transforms' loops assume their input and output do not overlap.
inline void check_disjoint(std::span<const std::byte> in, std::span<const std::byte> out,
                           const char* who) {
  HONE_REQUIRE(
      in.empty() || in.data() + in.size() <= out.data() || out.data() + out.size() <= in.data(),
      std::string("hone::checkpoint::") + who + ": the input and output overlap");
}

template <bool ToPlanes>
void transpose_planes(std::span<const std::byte> in, std::size_t item, std::span<std::byte> out,
                      const char* who) {
  HONE_REQUIRE(
      item > 0 && in.size() % item == 0 && out.size() == in.size(),
      std::string("hone::checkpoint::") + who + ": sizes are not a whole number of elements");
  check_disjoint(in, out, who);
  const std::size_t n = in.size() / item;
  const auto* src = reinterpret_cast<const std::uint8_t*>(in.data());
  auto* dst = reinterpret_cast<std::uint8_t*>(out.data());
  switch (item) {
    case 1:
      if (n != 0) std::memcpy(dst, src, n);
      return;
    case 2:
      return hone::detail::run_integer_kernel(
          [&] { transpose_planes<ToPlanes, 2>(src, n, item, dst); });
    case 4:
      return hone::detail::run_integer_kernel(
          [&] { transpose_planes<ToPlanes, 4>(src, n, item, dst); });
    case 8:
      return hone::detail::run_integer_kernel(
          [&] { transpose_planes<ToPlanes, 8>(src, n, item, dst); });
    default:
      return hone::detail::run_integer_kernel(
          [&] { transpose_planes<ToPlanes, 0>(src, n, item, dst); });
  }
}
template <std::size_t Item>
inline std::uint32_t load_le(const std::uint8_t* p) noexcept {
  std::uint32_t v = 0;
  for (std::size_t k = Item; k-- > 0;) v = (v << 8) | p[k];
  return v;
}
template <std::size_t Item>
inline void store_le(std::uint8_t* p, std::uint32_t v) noexcept {
  for (std::size_t k = 0; k < Item; ++k) p[k] = static_cast<std::uint8_t>((v >> (8 * k)) & 0xff);
}

// The split of elements [begin, end) of `Item` bytes (4: F32, 2: BF16) into Item byte planes of n
// bytes. The delta of element i reads element i - 1's exponent from the input, so iterations are
// independent and the loop vectorizes; split_floats peels element 0 (no predecessor).
template <std::size_t Item, bool Delta>
HONE_VECTORIZE_FUNCTION void split_floats_range(const std::uint8_t* HONE_RESTRICT src,
                                                std::size_t begin, std::size_t end, std::size_t n,
                                                std::uint8_t* HONE_RESTRICT dst) noexcept {
  constexpr unsigned mant = Item == 4 ? 23 : 7;
  for (std::size_t i = begin; i < end; ++i) {
    const std::uint32_t x = load_le<Item>(src + i * Item);
    const std::uint32_t e = (x >> mant) & 0xff;
    const std::uint32_t m = x & ((std::uint32_t{1} << mant) - 1);
    const std::uint32_t sign = x >> (8 * Item - 1);
    std::uint32_t prev = 0;
    if constexpr (Delta) prev = (load_le<Item>(src + (i - 1) * Item) >> mant) & 0xff;
    dst[i] = static_cast<std::uint8_t>((e - prev) & 0xff);
    dst[n + i] = static_cast<std::uint8_t>((sign << 7) | (m >> (mant - 7)));
    if constexpr (Item == 4) {
      dst[2 * n + i] = static_cast<std::uint8_t>((m >> 8) & 0xff);
      dst[3 * n + i] = static_cast<std::uint8_t>(m & 0xff);
    }
  }
}
template <std::size_t Item, bool Delta>
void split_floats(const std::uint8_t* src, std::size_t n, std::uint8_t* dst) noexcept {
  if (n == 0) return;
  split_floats_range<Item, false>(src, 0, 1, n, dst);  // element 0: its delta is from 0
  // The bulk on the CPU's best target (hone::detail::run_integer_kernel: byte work, the same
  // bytes on every target).
  hone::detail::run_integer_kernel([&] { split_floats_range<Item, Delta>(src, 1, n, n, dst); });
}
template <std::size_t Item, bool Delta>
HONE_VECTORIZE_FUNCTION void unsplit_floats(const std::uint8_t* HONE_RESTRICT src, std::size_t n,
                                            std::uint8_t* HONE_RESTRICT dst) noexcept {
  constexpr unsigned mant = Item == 4 ? 23 : 7;
  std::uint32_t prev = 0;  // the running sum of the deltas (a scan: this loop stays scalar)
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t b0 = src[i];
    const std::uint32_t e = Delta ? (b0 + prev) & 0xff : b0;
    prev = e;
    const std::uint32_t b1 = src[n + i];
    std::uint32_t m = (b1 & 0x7f) << (mant - 7);
    if constexpr (Item == 4) {
      m |= (std::uint32_t{src[2 * n + i]} << 8) | std::uint32_t{src[3 * n + i]};
    }
    store_le<Item>(dst + i * Item, ((b1 >> 7) << (8 * Item - 1)) | (e << mant) | m);
  }
}
}  // namespace detail
}  // namespace checkpoint
HONE_NAMESPACE_END
