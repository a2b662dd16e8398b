// hone/checkpoint/compressed_format.hpp: the layout of hone compressed tensor files (".hct"):
// safetensors' tensors, each cut into chunks that are transformed (hone/checkpoint/
// byte_transforms.hpp), zstd-compressed, with an XXH3-64 per chunk. The reader is
// hone/checkpoint/compressed_reader.hpp, the writer hone/checkpoint/compressed_writer.hpp, the
// conversions to and from plain safetensors hone/checkpoint/compressed_convert.hpp;
// hone/checkpoint/compress.hpp includes them all.
//
// These files are hone's own format; convert them back to plain safetensors with
// decompress_to_safetensors() (the hone-ckpt tool's job). The layout (docs/checkpoint.md has the
// full description):
//
//   offset       size  field
//   0            8     magic 89 48 43 54 0D 0A 1A 0A ("\x89HCT\r\n\x1a\n", PNG-style)
//   8            4     u32 LE format version (2 written; 1 and 2 read)
//   12           4     u32 LE flags (0; readers refuse others)
//   16           D     chunk data: the stored chunks of every tensor, back to back, in data order
//   16 + D       N     index: UTF-8 JSON, a safetensors header whose tensor entries also have
//                      "encoding": "shuffle-zstd" | "split-zstd" | "split-delta-zstd" (version 1:
//                      "shuffle-zstd" only; the split encodings only for F32 and BF16) and
//                      "chunks": [[raw, stored, "xxh3-64"], ...]
//   16 + D + N   8     u64 LE index offset (16 + D)
//   +8           8     u64 LE index length N (<= 100,000,000)
//   +16          8     u64 LE XXH3-64 of the N index bytes
//   +24          8     end magic "HCT-END\n"
//
// "data_offsets" are those of the equivalent plain safetensors file, so conversion back is exact.
// A chunk holds `raw` bytes of the tensor (a multiple of the element size, at most 64 MiB): when
// stored < raw its `stored` bytes are one zstd frame of the transformed chunk; when stored == raw
// they are the chunk's bytes unchanged; stored > raw is invalid. The hash is XXH3-64 (seed 0) of
// the chunk's raw (untransformed) bytes. The index is written last, so compressed sizes need not be
// known in advance and the file streams to disk; the trailer finds the index.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "hone/core/config.hpp"
#include "hone/io/dtype.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// First 8 bytes of a compressed tensor file.
inline constexpr std::array<unsigned char, 8> compressed_magic = {0x89, 'H',  'C',  'T',
                                                                  '\r', '\n', 0x1a, '\n'};
/// Last 8 bytes of a compressed tensor file.
inline constexpr std::array<unsigned char, 8> compressed_end_magic = {'H', 'C', 'T', '-',
                                                                      'E', 'N', 'D', '\n'};
/// The format version this header writes (it reads 1 and 2; version 1 files have "shuffle-zstd"
/// tensors only).
inline constexpr std::uint32_t compressed_version = 2;
/// The oldest format version this header reads.
inline constexpr std::uint32_t compressed_min_version = 1;
/// The largest chunk a reader accepts (bounds the memory a damaged index can demand).
inline constexpr std::uint64_t max_chunk_bytes = std::uint64_t{64} << 20;
/// The suffix of compressed tensor files.
inline constexpr std::string_view compressed_suffix = ".hct";

/// How a tensor's chunks are rearranged before zstd (the tensor's "encoding" in the index).
enum class chunk_transform : std::uint8_t {
  shuffle,      ///< "shuffle-zstd": byte planes (any dtype)
  split,        ///< "split-zstd": exponent plane, sign + top mantissa plane, ... (F32, BF16)
  split_delta,  ///< "split-delta-zstd": as split, exponents as deltas from the previous (F32, BF16)
};

/// The encoding name of a transform in the index.
[[nodiscard]] constexpr std::string_view encoding_name(chunk_transform t) noexcept {
  switch (t) {
    case chunk_transform::shuffle:
      return "shuffle-zstd";
    case chunk_transform::split:
      return "split-zstd";
    case chunk_transform::split_delta:
      return "split-delta-zstd";
  }
  return "shuffle-zstd";
}

/// The transform an encoding name denotes, or nullopt for names this hone does not know.
[[nodiscard]] constexpr std::optional<chunk_transform> transform_of_encoding(
    std::string_view name) noexcept {
  for (const auto t :
       {chunk_transform::shuffle, chunk_transform::split, chunk_transform::split_delta}) {
    if (name == encoding_name(t)) return t;
  }
  return std::nullopt;
}

/// Whether transform `t` applies to tensors of `type` (the split transforms need an 8-bit
/// exponent field: F32 and BF16).
[[nodiscard]] constexpr bool transform_applies(chunk_transform t, io::dtype type) noexcept {
  return t == chunk_transform::shuffle || type == io::dtype::f32 || type == io::dtype::bf16;
}

/// How to compress.
struct compression_options {
  int level = 1;  // zstd level (1 = fastest; negative: faster still)
  std::size_t chunk_bytes = std::size_t{1} << 20;  // raw bytes per chunk (rounded to elements)
  /// The transform of every tensor it applies to (others use shuffle), or, when unset, for each
  /// F32 or BF16 tensor the transform whose zstd output is smallest on a sample of the tensor's
  /// first `sample_bytes` (shuffle for other dtypes).
  std::optional<chunk_transform> transform = std::nullopt;
  std::size_t sample_bytes = std::size_t{32} << 10;
};

/// Whether `start` (a file's first bytes) begins with the compressed tensor file magic.
[[nodiscard]] inline bool is_compressed_tensor_file(std::span<const std::byte> start) noexcept {
  if (start.size() < compressed_magic.size()) return false;
  for (std::size_t i = 0; i < compressed_magic.size(); ++i) {
    if (start[i] != static_cast<std::byte>(compressed_magic[i])) return false;
  }
  return true;
}
/// Where one chunk of a compressed tensor lies and what it must decode to.
struct chunk_info {
  std::uint64_t raw_bytes = 0;     // bytes of the tensor it holds
  std::uint64_t stored_bytes = 0;  // bytes in the file (== raw_bytes: stored uncompressed)
  std::uint64_t file_offset = 0;   // where the stored bytes start in the file
  std::uint64_t hash = 0;          // XXH3-64 of the raw bytes
};

namespace detail {
/// The prelude (magic, version, flags) and the trailer (index offset, length, hash, end magic).
inline constexpr std::size_t prelude_bytes = 16;
inline constexpr std::size_t trailer_bytes = 32;

inline std::uint32_t read_u32_le(const std::byte* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<std::uint32_t>(p[i]);
  return v;
}
inline void write_u32_le(std::byte* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
}  // namespace detail

}  // namespace checkpoint
HONE_NAMESPACE_END
