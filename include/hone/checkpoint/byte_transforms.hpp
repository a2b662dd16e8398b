// hone/checkpoint/byte_transforms.hpp: the byte transforms of compressed tensor files
// (hone/checkpoint/compressed_format.hpp), applied to each chunk before zstd: the byte-plane
// shuffle (any dtype) and the float split (F32, BF16), with their exact inverses.
//
// Why transform: the bytes of a float are not alike. The high byte of bf16 weights (sign and
// exponent) takes few values, the low byte is close to random; interleaved, zstd sees noise.
// Grouping byte k of every element together (a "byte plane", as Blosc and ZipNN do) gives zstd
// one highly compressible plane and one incompressible one. Measured on trained weights
// (docs/checkpoint.md and tests/checkpoint): bf16 1.28x raw -> ~1.46x shuffled at zstd level 1. A
// chunk that does not shrink is stored raw, so incompressible tensors cost nothing but the index.
//
// The float split (format version 2) goes one step further for F32 and BF16, whose exponent is 8
// bits that straddle two bytes: it moves the whole exponent into one byte plane and the sign next
// to the top mantissa bits, so the plane zstd can compress holds exactly the exponent; "delta"
// stores each exponent as its difference (mod 256) from the previous element's, which is small
// where neighbouring values have similar magnitudes (Adam second moments: an exponent costs ~2
// bits instead of ~4). Per element of F32, x = sign | exponent e | mantissa m (1 + 8 + 23 bits):
//   plane 0: e (split) or (e - e_prev) mod 256 (split-delta; e_prev = 0 at a chunk's start)
//   plane 1: sign << 7 | m >> 16          plane 2: (m >> 8) & 0xff        plane 3: m & 0xff
// BF16 (1 + 8 + 7 bits): plane 0 as above, plane 1: sign << 7 | m. Every transform is a bijection
// on the chunk's bytes, so decompression is exact. The writer picks per tensor (default) the
// transform whose zstd output is smallest on a sample of the tensor's first bytes, and records it
// as the tensor's "encoding"; docs/benchmarks.md has the measured ratios and the entropy bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "hone/checkpoint/compressed_format.hpp"
#include "hone/checkpoint/detail/byte_planes.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// Byte-plane shuffle: out[j * n + i] = in[i * item + j] for the n = in.size() / item elements.
/// `in` and `out` must not overlap.
inline void shuffle_bytes(std::span<const std::byte> in, std::size_t item,
                          std::span<std::byte> out) {
  detail::transpose_planes<true>(in, item, out, "shuffle_bytes");
}

/// Inverse of shuffle_bytes.
inline void unshuffle_bytes(std::span<const std::byte> in, std::size_t item,
                            std::span<std::byte> out) {
  detail::transpose_planes<false>(in, item, out, "unshuffle_bytes");
}
/// Applies transform `t` to `in` (whole elements of `item` bytes) into `out` (same size).
/// config_error when the transform does not apply to elements of that size.
inline void transform_bytes(chunk_transform t, std::span<const std::byte> in, std::size_t item,
                            std::span<std::byte> out) {
  if (t == chunk_transform::shuffle) return shuffle_bytes(in, item, out);
  HONE_REQUIRE((item == 2 || item == 4) && in.size() % item == 0 && out.size() == in.size(),
               "hone::checkpoint::transform_bytes: the split transforms take whole 2- or 4-byte "
               "elements (BF16, F32)");
  detail::check_disjoint(in, out, "transform_bytes");
  const std::size_t n = in.size() / item;
  const bool delta = t == chunk_transform::split_delta;
  const auto* src = reinterpret_cast<const std::uint8_t*>(in.data());
  auto* dst = reinterpret_cast<std::uint8_t*>(out.data());
  if (item == 4) {
    delta ? detail::split_floats<4, true>(src, n, dst)
          : detail::split_floats<4, false>(src, n, dst);
  } else {
    delta ? detail::split_floats<2, true>(src, n, dst)
          : detail::split_floats<2, false>(src, n, dst);
  }
}

/// Inverse of transform_bytes.
inline void untransform_bytes(chunk_transform t, std::span<const std::byte> in, std::size_t item,
                              std::span<std::byte> out) {
  if (t == chunk_transform::shuffle) return unshuffle_bytes(in, item, out);
  HONE_REQUIRE((item == 2 || item == 4) && in.size() % item == 0 && out.size() == in.size(),
               "hone::checkpoint::untransform_bytes: the split transforms take whole 2- or 4-byte "
               "elements (BF16, F32)");
  detail::check_disjoint(in, out, "untransform_bytes");
  const std::size_t n = in.size() / item;
  const bool delta = t == chunk_transform::split_delta;
  const auto* src = reinterpret_cast<const std::uint8_t*>(in.data());
  auto* dst = reinterpret_cast<std::uint8_t*>(out.data());
  if (item == 4) {
    delta ? detail::unsplit_floats<4, true>(src, n, dst)
          : detail::unsplit_floats<4, false>(src, n, dst);
  } else {
    delta ? detail::unsplit_floats<2, true>(src, n, dst)
          : detail::unsplit_floats<2, false>(src, n, dst);
  }
}
}  // namespace checkpoint
HONE_NAMESPACE_END
