// hone/data/shard_format.hpp: the layout of hone record shards (".hshard"): records (byte strings)
// packed into independently decodable zstd frames, a frame index and a footer, so that one random
// record costs at most one frame's decompression. The writer, reader and dataset are in
// hone/data/shard.hpp; docs/data.md has the full description.
//
//   offset      size     field
//   0           8        magic 89 48 52 53 0D 0A 1A 0A ("\x89HRS\r\n\x1a\n", PNG-style)
//   8           4        u32 LE format version (1)
//   12          4        u32 LE flags (0; readers refuse others)
//   16          ...      frames, back to back from offset 16: each one zstd frame (with its
//                        content size) whose decoded bytes are
//                          n x u64 LE   end of each record, relative to the record data
//                          ...          the n records' bytes, back to back
//   I           56 x F   index, one entry per frame, 7 x u64 LE each:
//                          file offset, compressed bytes, decoded bytes, first record number,
//                          record count (>= 1), XXH3-64 of the compressed bytes, XXH3-64 of the
//                          decoded bytes
//   I + 56 F    56       footer: u32 LE version, u32 LE flags, u64 LE index offset I, u64 LE frame
//                        count F, u64 LE record count, u64 LE XXH3-64 of the index bytes, u64 LE
//                        XXH3-64 of the footer's first 40 bytes, end magic "HRS-END\n"
//
// Every byte is covered: the header's magic, version and flags are compared; the footer carries
// its own checksum; the index is checked against the footer's checksum, and its entries against
// each other (contiguous frames from offset 16 to the index, consecutive record numbers summing to
// the footer's count); a frame's compressed bytes are checked before zstd sees them and its decoded
// bytes (record table included) after. All integers are little-endian; XXH3-64 uses seed 0.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace data {

/// First 8 bytes of a record shard.
inline constexpr std::array<unsigned char, 8> shard_magic = {0x89, 'H',  'R',  'S',
                                                             '\r', '\n', 0x1a, '\n'};
/// Last 8 bytes of a record shard.
inline constexpr std::array<unsigned char, 8> shard_end_magic = {'H', 'R', 'S', '-',
                                                                 'E', 'N', 'D', '\n'};
/// The format version written and read.
inline constexpr std::uint32_t shard_version = 1;
/// The suffix of shard files.
inline constexpr std::string_view shard_suffix = ".hshard";
/// The largest record a writer accepts; a reader refuses frames decoding to more than this plus
/// 8 bytes (bounds the memory a damaged or foreign file can demand).
inline constexpr std::uint64_t max_shard_record_bytes = std::uint64_t{1} << 30;

/// Where one frame lies in its shard and what it decodes to (one index entry).
struct shard_frame_info {
  std::uint64_t offset = 0;            // file offset of the zstd frame
  std::uint64_t compressed_bytes = 0;  // its size in the file
  std::uint64_t decoded_bytes = 0;     // record table (8 bytes a record) + record bytes
  std::uint64_t first_record = 0;      // number (within the shard) of its first record
  std::uint64_t records = 0;           // how many records it holds (>= 1)
  std::uint64_t compressed_hash = 0;   // XXH3-64 of the compressed bytes
  std::uint64_t decoded_hash = 0;      // XXH3-64 of the decoded bytes
  friend bool operator==(const shard_frame_info&, const shard_frame_info&) = default;
};

/// Whether `start` (a file's first bytes) begins with the shard magic.
[[nodiscard]] inline bool is_shard_file(std::span<const std::byte> start) noexcept {
  if (start.size() < shard_magic.size()) return false;
  for (std::size_t i = 0; i < shard_magic.size(); ++i) {
    if (start[i] != static_cast<std::byte>(shard_magic[i])) return false;
  }
  return true;
}

namespace detail {
inline constexpr std::size_t shard_header_bytes = 16;
inline constexpr std::size_t shard_entry_bytes = 56;
inline constexpr std::size_t shard_footer_bytes = 56;
inline constexpr std::size_t shard_footer_hashed = 40;  // bytes covered by the footer's checksum

inline std::uint64_t shard_get64(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint64_t>(p[i]);
  return v;
}
inline std::uint32_t shard_get32(const std::byte* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<std::uint32_t>(p[i]);
  return v;
}
inline void shard_put64(std::byte* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
inline void shard_put32(std::byte* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

/// One index entry in its 56 bytes.
inline void encode_frame_entry(const shard_frame_info& f, std::byte* p) noexcept {
  const std::uint64_t v[7] = {f.offset,  f.compressed_bytes, f.decoded_bytes, f.first_record,
                              f.records, f.compressed_hash,  f.decoded_hash};
  for (int i = 0; i < 7; ++i) shard_put64(p + 8 * i, v[i]);
}
inline shard_frame_info decode_frame_entry(const std::byte* p) noexcept {
  shard_frame_info f;
  f.offset = shard_get64(p);
  f.compressed_bytes = shard_get64(p + 8);
  f.decoded_bytes = shard_get64(p + 16);
  f.first_record = shard_get64(p + 24);
  f.records = shard_get64(p + 32);
  f.compressed_hash = shard_get64(p + 40);
  f.decoded_hash = shard_get64(p + 48);
  return f;
}
}  // namespace detail

}  // namespace data
HONE_NAMESPACE_END
