// hone/checkpoint/compress.hpp: hone compressed tensor files (".hct"): safetensors' tensors,
// each cut into chunks that are byte-plane shuffled and zstd-compressed, with an XXH3-64 per chunk.
//
// Why shuffle: the bytes of a float are not alike. The high byte of bf16 weights (sign and
// exponent) takes few values, the low byte is close to random; interleaved, zstd sees noise.
// Grouping byte k of every element together (a "byte plane", as Blosc and ZipNN do) gives zstd
// one highly compressible plane and one incompressible one. Measured on trained weights (see
// /work/shared ANCHORS "Checkpointing" and tests/checkpoint): bf16 1.28x raw -> ~1.46x shuffled
// at zstd level 1. A chunk that does not shrink is stored raw, so incompressible tensors cost
// nothing but the index.
//
// These files are hone's own format; convert them back to plain safetensors with
// decompress_to_safetensors() (the hone-ckpt tool's job). The layout (docs/checkpoint.md has the
// full description):
//
//   offset       size  field
//   0            8     magic 89 48 43 54 0D 0A 1A 0A ("\x89HCT\r\n\x1a\n", PNG-style)
//   8            4     u32 LE format version (1)
//   12           4     u32 LE flags (0; readers refuse others)
//   16           D     chunk data: the stored chunks of every tensor, back to back, in data order
//   16 + D       N     index: UTF-8 JSON, a safetensors header whose tensor entries also have
//                      "encoding": "shuffle-zstd" and "chunks": [[raw, stored, "xxh3-64"], ...]
//   16 + D + N   8     u64 LE index offset (16 + D)
//   +8           8     u64 LE index length N (<= 100,000,000)
//   +16          8     u64 LE XXH3-64 of the N index bytes
//   +24          8     end magic "HCT-END\n"
//
// "data_offsets" are those of the equivalent plain safetensors file, so conversion back is exact.
// A chunk holds `raw` bytes of the tensor (a multiple of the element size, at most 64 MiB): when
// stored < raw its `stored` bytes are one zstd frame of the shuffled chunk; when stored == raw they
// are the chunk's bytes unchanged; stored > raw is invalid. The hash is XXH3-64 (seed 0) of the
// chunk's raw (unshuffled) bytes. The index is written last, so compressed sizes need not be known
// in advance and the file streams to disk; the trailer finds the index.
//
// Compression runs chunks in parallel on oneTBB (a pipeline: read/convert, shuffle + compress in
// parallel, write in order), with memory bounded by 2 chunks in flight per thread.
#pragma once

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/parallel_pipeline.h>
#include <oneapi/tbb/task_arena.h>
#include <zstd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hone/checkpoint/dtype.hpp"
#include "hone/checkpoint/file_io.hpp"
#include "hone/checkpoint/hash.hpp"
#include "hone/checkpoint/json.hpp"
#include "hone/checkpoint/safetensors.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// First 8 bytes of a compressed tensor file.
inline constexpr std::array<unsigned char, 8> compressed_magic = {0x89, 'H',  'C',  'T',
                                                                  '\r', '\n', 0x1a, '\n'};
/// Last 8 bytes of a compressed tensor file.
inline constexpr std::array<unsigned char, 8> compressed_end_magic = {'H', 'C', 'T', '-',
                                                                      'E', 'N', 'D', '\n'};
/// The format version this header writes and reads.
inline constexpr std::uint32_t compressed_version = 1;
/// The largest chunk a reader accepts (bounds the memory a damaged index can demand).
inline constexpr std::uint64_t max_chunk_bytes = std::uint64_t{64} << 20;
/// The suffix of compressed tensor files.
inline constexpr std::string_view compressed_suffix = ".hct";

/// How to compress.
struct compression_options {
  int level = 1;  // zstd level (1 = fastest; negative: faster still)
  std::size_t chunk_bytes = std::size_t{1} << 20;  // raw bytes per chunk (rounded to elements)
};

/// Whether `start` (a file's first bytes) begins with the compressed tensor file magic.
[[nodiscard]] inline bool is_compressed_tensor_file(std::span<const std::byte> start) noexcept {
  if (start.size() < compressed_magic.size()) return false;
  for (std::size_t i = 0; i < compressed_magic.size(); ++i) {
    if (start[i] != static_cast<std::byte>(compressed_magic[i])) return false;
  }
  return true;
}

/// Byte-plane shuffle: out[j * n + i] = in[i * item + j] for the n = in.size() / item elements.
inline void shuffle_bytes(std::span<const std::byte> in, std::size_t item,
                          std::span<std::byte> out) {
  require(item > 0 && in.size() % item == 0 && out.size() == in.size(),
          "hone::checkpoint::shuffle_bytes: sizes are not a whole number of elements");
  const std::size_t n = in.size() / item;
  const std::byte* src = in.data();
  std::byte* dst = out.data();
  if (item == 1) {
    if (n != 0) std::memcpy(dst, src, n);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < item; ++j) dst[j * n + i] = src[i * item + j];
  }
}

/// Inverse of shuffle_bytes.
inline void unshuffle_bytes(std::span<const std::byte> in, std::size_t item,
                            std::span<std::byte> out) {
  require(item > 0 && in.size() % item == 0 && out.size() == in.size(),
          "hone::checkpoint::unshuffle_bytes: sizes are not a whole number of elements");
  const std::size_t n = in.size() / item;
  const std::byte* src = in.data();
  std::byte* dst = out.data();
  if (item == 1) {
    if (n != 0) std::memcpy(dst, src, n);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < item; ++j) dst[i * item + j] = src[j * n + i];
  }
}

/// Where one chunk of a compressed tensor lies and what it must decode to.
struct chunk_info {
  std::uint64_t raw_bytes = 0;     // bytes of the tensor it holds
  std::uint64_t stored_bytes = 0;  // bytes in the file (== raw_bytes: stored uncompressed)
  std::uint64_t file_offset = 0;   // where the stored bytes start in the file
  std::uint64_t hash = 0;          // XXH3-64 of the raw bytes
};

namespace detail {

struct zstd_cctx_deleter {
  void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); }
};
struct zstd_dctx_deleter {
  void operator()(ZSTD_DCtx* c) const noexcept { ZSTD_freeDCtx(c); }
};

inline void append_chunks_json(std::string& out, std::span<const chunk_info> chunks) {
  out += ",\"encoding\":\"shuffle-zstd\",\"chunks\":[";
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    if (c != 0) out += ',';
    out += '[';
    out += std::to_string(chunks[c].raw_bytes);
    out += ',';
    out += std::to_string(chunks[c].stored_bytes);
    out += ",\"";
    out += hex64(chunks[c].hash);
    out += "\"]";
  }
  out += ']';
}

/// Decodes one chunk (validated offsets) into `out` (raw_bytes long) and checks its hash.
/// `scratch` is reused between calls.
inline void decode_chunk(std::span<const std::byte> file, const chunk_info& c, std::size_t item,
                         std::span<std::byte> out, std::vector<std::byte>& scratch, ZSTD_DCtx* dctx,
                         std::string_view context, std::string_view name,
                         std::size_t chunk_number) {
  const auto stored = file.subspan(static_cast<std::size_t>(c.file_offset),
                                   static_cast<std::size_t>(c.stored_bytes));
  const auto where = [&] {
    return "tensor " + quote_name(name) + " chunk " + std::to_string(chunk_number);
  };
  if (c.stored_bytes == c.raw_bytes) {
    if (!out.empty()) std::memcpy(out.data(), stored.data(), out.size());
  } else {
    scratch.resize(static_cast<std::size_t>(c.raw_bytes));
    const std::size_t r =
        ZSTD_decompressDCtx(dctx, scratch.data(), scratch.size(), stored.data(), stored.size());
    if (ZSTD_isError(r)) {
      fail(context, where() + " does not decompress: " + ZSTD_getErrorName(r));
    }
    if (r != c.raw_bytes) {
      fail(context, where() + " decompresses to " + std::to_string(r) + " bytes, not " +
                        std::to_string(c.raw_bytes));
    }
    unshuffle_bytes(scratch, item, out);
  }
  if (hash64(out) != c.hash) {
    fail(context, where() + ": checksum mismatch (the file is damaged)");
  }
}

/// The trailer of a compressed file.
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

/// A validated compressed tensor file in memory (mapped or borrowed). Indices, offsets, lengths and
/// the index checksum are checked on open; chunk contents are checked (decompressed size, XXH3-64)
/// when read or verified.
class compressed_file {
 public:
  [[nodiscard]] static compressed_file open(const std::filesystem::path& path) {
    compressed_file f;
    f.map_ = mapped_file(path);
    f.init(f.map_.bytes(), path.string());
    return f;
  }
  /// Validates the file held in `bytes` (borrowed: it must outlive the result).
  [[nodiscard]] static compressed_file view(std::span<const std::byte> bytes, std::string context) {
    compressed_file f;
    f.init(bytes, std::move(context));
    return f;
  }

  [[nodiscard]] const std::string& context() const noexcept { return context_; }
  /// Tensors in data order, with the offsets of the equivalent plain safetensors file.
  [[nodiscard]] std::span<const tensor_info> tensors() const noexcept { return tensors_; }
  [[nodiscard]] const metadata_map& metadata() const noexcept { return metadata_; }
  [[nodiscard]] std::uint64_t file_size() const noexcept { return bytes_.size(); }
  [[nodiscard]] const tensor_info* find(std::string_view name) const noexcept {
    return index_.find(tensors_, name);
  }
  [[nodiscard]] const tensor_info& at(std::string_view name) const {
    if (const tensor_info* t = find(name)) return *t;
    detail::fail(context_, "has no tensor " + detail::quote_name(name));
  }
  /// The chunks of tensor `t` (which must belong to this file).
  [[nodiscard]] std::span<const chunk_info> chunks(const tensor_info& t) const {
    const auto [first, count] = chunk_range_[position(t)];
    return std::span<const chunk_info>(chunks_).subspan(first, count);
  }
  /// Bytes tensor `t` occupies in this file.
  [[nodiscard]] std::uint64_t stored_bytes(const tensor_info& t) const {
    std::uint64_t n = 0;
    for (const auto& c : chunks(t)) n += c.stored_bytes;
    return n;
  }

  /// Decompresses tensor `t` into `out` (its size in dtype `as`, default its own), checking every
  /// chunk's size and XXH3-64; checkpoint_error naming the file, tensor and chunk on damage.
  /// Chunks decode in parallel on oneTBB.
  void read(const tensor_info& t, std::span<std::byte> out, std::optional<dtype> as = {}) const {
    const dtype to = as.value_or(t.type);
    require(can_convert(t.type, to), "hone::checkpoint::compressed_file::read: cannot convert " +
                                         std::string(dtype_name(t.type)) + " to " +
                                         std::string(dtype_name(to)));
    require(out.size() == t.elements() * dtype_size(to),
            "hone::checkpoint::compressed_file::read: tensor '" + t.name + "' needs " +
                std::to_string(t.elements() * dtype_size(to)) + " bytes, the output has " +
                std::to_string(out.size()));
    const auto cs = chunks(t);
    std::vector<std::uint64_t> raw_offset(cs.size());
    std::uint64_t off = 0;
    for (std::size_t i = 0; i < cs.size(); ++i) {
      raw_offset[i] = off;
      off += cs[i].raw_bytes;
    }
    const std::size_t in_item = dtype_size(t.type);
    const std::size_t out_item = dtype_size(to);
    const auto decode_range = [&](std::size_t lo, std::size_t hi) {
      std::unique_ptr<ZSTD_DCtx, detail::zstd_dctx_deleter> dctx(ZSTD_createDCtx());
      if (!dctx) throw allocation_error("hone: cannot create a zstd decompression context", 0);
      std::vector<std::byte> scratch;
      std::vector<std::byte> converted;
      for (std::size_t i = lo; i < hi; ++i) {
        const auto& c = cs[i];
        const std::size_t first_elem = static_cast<std::size_t>(raw_offset[i] / in_item);
        const std::size_t elems = static_cast<std::size_t>(c.raw_bytes / in_item);
        auto dst = out.subspan(first_elem * out_item, elems * out_item);
        if (to == t.type) {
          detail::decode_chunk(bytes_, c, in_item, dst, scratch, dctx.get(), context_, t.name, i);
        } else {
          converted.resize(static_cast<std::size_t>(c.raw_bytes));
          detail::decode_chunk(bytes_, c, in_item, converted, scratch, dctx.get(), context_, t.name,
                               i);
          convert(converted, t.type, dst, to);
        }
      }
    };
    if (cs.size() <= 1) {
      decode_range(0, cs.size());
    } else {
      tbb::parallel_for(
          tbb::blocked_range<std::size_t>(0, cs.size(), 1),
          [&](const tbb::blocked_range<std::size_t>& r) { decode_range(r.begin(), r.end()); });
    }
  }

  /// Decompresses every chunk of every tensor and checks it (the deep check of a tool's verify).
  /// Memory: two chunks, however large the tensors.
  void verify() const {
    for (const auto& t : tensors_) for_each_chunk(t, [](std::span<const std::byte>) {});
  }

  /// Streams tensor `t`'s raw bytes, chunk by chunk, to `sink(std::span<const std::byte>)`.
  template <class Sink>
  void for_each_chunk(const tensor_info& t, Sink&& sink) const {
    std::unique_ptr<ZSTD_DCtx, detail::zstd_dctx_deleter> dctx(ZSTD_createDCtx());
    if (!dctx) throw allocation_error("hone: cannot create a zstd decompression context", 0);
    std::vector<std::byte> scratch, raw;
    const auto cs = chunks(t);
    for (std::size_t i = 0; i < cs.size(); ++i) {
      raw.resize(static_cast<std::size_t>(cs[i].raw_bytes));
      detail::decode_chunk(bytes_, cs[i], dtype_size(t.type), raw, scratch, dctx.get(), context_,
                           t.name, i);
      sink(std::span<const std::byte>(raw));
    }
  }

 private:
  compressed_file() = default;

  std::size_t position(const tensor_info& t) const {
    const auto* p = &t;
    require(!tensors_.empty() && p >= tensors_.data() && p < tensors_.data() + tensors_.size(),
            "hone::checkpoint::compressed_file: the tensor_info is not one of this file's");
    return static_cast<std::size_t>(p - tensors_.data());
  }

  void init(std::span<const std::byte> bytes, std::string context) {
    using detail::fail;
    context_ = std::move(context);
    bytes_ = bytes;
    const std::uint64_t size = bytes.size();
    if (size < detail::prelude_bytes + detail::trailer_bytes) {
      fail(context_, "the file is " + std::to_string(size) +
                         " bytes, too short for a compressed tensor file (at least " +
                         std::to_string(detail::prelude_bytes + detail::trailer_bytes) + ")");
    }
    if (!is_compressed_tensor_file(bytes)) {
      fail(context_, "does not start with the magic bytes of a hone compressed tensor file");
    }
    const std::uint32_t version = detail::read_u32_le(bytes.data() + 8);
    if (version != compressed_version) {
      fail(context_, "is a compressed tensor file of format version " + std::to_string(version) +
                         "; this hone reads version " + std::to_string(compressed_version) +
                         (version > compressed_version ? " (written by a newer hone?)" : ""));
    }
    if (const std::uint32_t flags = detail::read_u32_le(bytes.data() + 12); flags != 0) {
      fail(context_, "has unknown flags " + std::to_string(flags) + " in its prelude");
    }
    const std::byte* trailer = bytes.data() + (size - detail::trailer_bytes);
    for (std::size_t i = 0; i < compressed_end_magic.size(); ++i) {
      if (trailer[24 + i] != static_cast<std::byte>(compressed_end_magic[i])) {
        fail(context_, "does not end with the end magic of a compressed tensor file (truncated?)");
      }
    }
    const std::uint64_t index_offset = detail::read_u64_le(trailer);
    const std::uint64_t index_len = detail::read_u64_le(trailer + 8);
    const std::uint64_t index_hash = detail::read_u64_le(trailer + 16);
    if (index_len > max_header_bytes) {
      fail(context_, "index length " + std::to_string(index_len) + " exceeds the " +
                         std::to_string(max_header_bytes) + "-byte limit");
    }
    const std::uint64_t index_end = size - detail::trailer_bytes;
    if (index_offset < detail::prelude_bytes || index_offset > index_end ||
        index_end - index_offset != index_len) {
      fail(context_, "index at offset " + std::to_string(index_offset) + " with length " +
                         std::to_string(index_len) + " does not end where the trailer begins (" +
                         std::to_string(index_end) + ")");
    }
    const auto index_bytes =
        bytes.subspan(static_cast<std::size_t>(index_offset), static_cast<std::size_t>(index_len));
    if (hash64(index_bytes) != index_hash) {
      fail(context_, "index checksum mismatch (the index is damaged)");
    }
    const json::value root = detail::parse_header_json(index_bytes, context_, "index");
    auto entries = detail::validate_header(root, context_, metadata_);
    std::uint64_t file_offset = detail::prelude_bytes;
    tensors_.reserve(entries.size());
    chunk_range_.reserve(entries.size());
    for (auto& e : entries) {
      const std::string who = "tensor " + detail::quote_name(e.info.name);
      const json::value* enc = e.object->find("encoding");
      if (enc == nullptr || !enc->is_string() || enc->as_string() != "shuffle-zstd") {
        fail(context_, who + ": \"encoding\" must be \"shuffle-zstd\"");
      }
      const json::value* list = e.object->find("chunks");
      if (list == nullptr || !list->is_array()) {
        fail(context_, who + ": \"chunks\" must be an array of [raw, stored, hash]");
      }
      const std::size_t item = dtype_size(e.info.type);
      const std::size_t first = chunks_.size();
      std::uint64_t raw_total = 0;
      for (const auto& c : list->as_array()) {
        const std::string cw = who + " chunk " + std::to_string(chunks_.size() - first);
        if (!c.is_array() || c.size() != 3) {
          fail(context_, cw + " is not [raw bytes, stored bytes, \"xxh3-64\"]");
        }
        chunk_info ci;
        ci.raw_bytes = detail::entry_u64(c.as_array()[0], context_, cw + " raw size");
        ci.stored_bytes = detail::entry_u64(c.as_array()[1], context_, cw + " stored size");
        const json::value& h = c.as_array()[2];
        const auto hv = h.is_string() ? parse_hex64(h.as_string()) : std::nullopt;
        if (!hv) fail(context_, cw + ": the hash is not 16 lowercase hexadecimal digits");
        ci.hash = *hv;
        if (ci.raw_bytes == 0 || ci.raw_bytes % item != 0 || ci.raw_bytes > max_chunk_bytes) {
          fail(context_, cw + " holds " + std::to_string(ci.raw_bytes) +
                             " raw bytes: not a positive multiple of the element size up to " +
                             std::to_string(max_chunk_bytes));
        }
        if (ci.stored_bytes == 0 || ci.stored_bytes > ci.raw_bytes) {
          fail(context_, cw + " stores " + std::to_string(ci.stored_bytes) + " bytes for " +
                             std::to_string(ci.raw_bytes) + " raw ones");
        }
        if (ci.raw_bytes > e.info.size_bytes() - raw_total) {
          fail(context_, who + ": the chunks hold more than the tensor's " +
                             std::to_string(e.info.size_bytes()) + " bytes");
        }
        raw_total += ci.raw_bytes;
        if (ci.stored_bytes > index_offset - file_offset) {
          fail(context_, cw + " runs past the chunk data into the index (offset " +
                             std::to_string(file_offset) + ", " + std::to_string(ci.stored_bytes) +
                             " bytes)");
        }
        ci.file_offset = file_offset;
        file_offset += ci.stored_bytes;
        chunks_.push_back(ci);
      }
      if (raw_total != e.info.size_bytes()) {
        fail(context_, who + ": the chunks hold " + std::to_string(raw_total) +
                           " bytes, the tensor has " + std::to_string(e.info.size_bytes()));
      }
      chunk_range_.emplace_back(first, chunks_.size() - first);
      tensors_.push_back(std::move(e.info));
    }
    if (file_offset != index_offset) {
      fail(context_,
           std::to_string(index_offset - file_offset) + " bytes of chunk data belong to no tensor");
    }
    index_ = detail::name_index(tensors_);
  }

  mapped_file map_;
  std::span<const std::byte> bytes_;
  std::string context_;
  std::vector<tensor_info> tensors_;
  metadata_map metadata_;
  detail::name_index index_;
  std::vector<chunk_info> chunks_;
  std::vector<std::pair<std::size_t, std::size_t>> chunk_range_;  // per tensor: first, count
};

/// Writes the tensors of `writer` as a compressed tensor file to `sink` (anything with
/// write(std::span<const std::byte>)). Runs on the caller's oneTBB arena.
template <class Sink>
void write_compressed_to(const tensor_writer& writer, Sink& sink,
                         const compression_options& options = {}) {
  require(options.level >= ZSTD_minCLevel() && options.level <= ZSTD_maxCLevel(),
          "hone::checkpoint: zstd level " + std::to_string(options.level) + " is outside [" +
              std::to_string(ZSTD_minCLevel()) + ", " + std::to_string(ZSTD_maxCLevel()) + "]");
  require(options.chunk_bytes >= 8 && options.chunk_bytes <= max_chunk_bytes,
          "hone::checkpoint: chunk_bytes must be between 8 and " + std::to_string(max_chunk_bytes));
  const std::vector<tensor_info> layout = writer.layout();
  const std::vector<std::size_t> order = writer.file_order();

  std::array<std::byte, detail::prelude_bytes> prelude{};
  for (std::size_t i = 0; i < compressed_magic.size(); ++i) {
    prelude[i] = static_cast<std::byte>(compressed_magic[i]);
  }
  detail::write_u32_le(prelude.data() + 8, compressed_version);
  detail::write_u32_le(prelude.data() + 12, 0);
  sink.write(prelude);

  struct job {
    std::size_t tensor = 0;  // position in layout
    std::uint64_t offset = 0;
    std::size_t length = 0;
    chunk_info info;
    std::vector<std::byte> raw, shuffled, packed;
    std::unique_ptr<ZSTD_CCtx, detail::zstd_cctx_deleter> cctx;
  };
  const std::size_t tokens = std::max<std::size_t>(
      2, 2 * static_cast<std::size_t>(tbb::this_task_arena::max_concurrency()));
  std::vector<job> slots(tokens);
  std::vector<std::vector<chunk_info>> chunks(layout.size());
  std::size_t next_tensor = 0;
  std::uint64_t next_offset = 0;
  std::size_t sequence = 0;
  std::uint64_t file_offset = detail::prelude_bytes;

  tbb::parallel_pipeline(
      tokens,
      tbb::make_filter<void,
                       job*>(tbb::filter_mode::serial_in_order, [&](tbb::flow_control& fc) -> job* {
        while (next_tensor < layout.size() && next_offset >= layout[next_tensor].size_bytes()) {
          ++next_tensor;
          next_offset = 0;
        }
        if (next_tensor >= layout.size()) {
          fc.stop();
          return nullptr;
        }
        const std::size_t item = dtype_size(layout[next_tensor].type);
        const std::size_t chunk = std::max(item, options.chunk_bytes / item * item);
        job* j = &slots[sequence++ % tokens];
        j->tensor = next_tensor;
        j->offset = next_offset;
        j->length = static_cast<std::size_t>(
            std::min<std::uint64_t>(chunk, layout[next_tensor].size_bytes() - next_offset));
        next_offset += j->length;
        return j;
      }) & tbb::make_filter<job*, job*>(tbb::filter_mode::parallel, [&](job* j) -> job* {
        const std::size_t item = dtype_size(layout[j->tensor].type);
        j->raw.resize(j->length);
        writer.read_stored(order[j->tensor], j->offset, j->raw);
        j->info.raw_bytes = j->length;
        j->info.hash = hash64(j->raw);
        j->shuffled.resize(j->length);
        shuffle_bytes(j->raw, item, j->shuffled);
        if (!j->cctx) {
          j->cctx.reset(ZSTD_createCCtx());
          if (!j->cctx) {
            throw allocation_error("hone: cannot create a zstd compression context", 0);
          }
        }
        j->packed.resize(ZSTD_compressBound(j->length));
        const std::size_t r =
            ZSTD_compressCCtx(j->cctx.get(), j->packed.data(), j->packed.size(), j->shuffled.data(),
                              j->shuffled.size(), options.level);
        if (ZSTD_isError(r)) {
          throw error(std::string("hone: zstd compression failed: ") + ZSTD_getErrorName(r));
        }
        j->info.stored_bytes = r < j->length ? r : j->length;
        return j;
      }) & tbb::make_filter<job*, void>(tbb::filter_mode::serial_in_order, [&](job* j) {
        const bool packed = j->info.stored_bytes < j->info.raw_bytes;
        sink.write(std::span<const std::byte>(packed ? j->packed : j->raw)
                       .first(static_cast<std::size_t>(j->info.stored_bytes)));
        j->info.file_offset = file_offset;
        file_offset += j->info.stored_bytes;
        chunks[j->tensor].push_back(j->info);
      }));

  std::string index;
  detail::append_header_json(
      index, layout, writer.metadata(),
      [&](std::size_t i, std::string& out) { detail::append_chunks_json(out, chunks[i]); });
  require(index.size() <= max_header_bytes,
          "hone::checkpoint: the compressed file's index would exceed " +
              std::to_string(max_header_bytes) + " bytes; use larger chunks");
  const auto index_bytes = std::as_bytes(std::span(index.data(), index.size()));
  sink.write(index_bytes);
  std::array<std::byte, detail::trailer_bytes> trailer{};
  detail::write_u64_le(trailer.data(), file_offset);
  detail::write_u64_le(trailer.data() + 8, index.size());
  detail::write_u64_le(trailer.data() + 16, hash64(index_bytes));
  for (std::size_t i = 0; i < compressed_end_magic.size(); ++i) {
    trailer[24 + i] = static_cast<std::byte>(compressed_end_magic[i]);
  }
  sink.write(trailer);
}

/// Writes the tensors of `writer` as a compressed tensor file at `path` (created or truncated),
/// fsyncs it when `sync`, and returns its size and XXH3-128.
inline file_digest write_compressed(const tensor_writer& writer, const std::filesystem::path& path,
                                    const compression_options& options = {}, bool sync = true) {
  output_file out(path);
  write_compressed_to(writer, out, options);
  if (sync) out.sync();
  return out.close();
}

/// The same file in memory.
[[nodiscard]] inline std::vector<std::byte> compressed_bytes(
    const tensor_writer& writer, const compression_options& options = {}) {
  struct sink {
    std::vector<std::byte> bytes;
    void write(std::span<const std::byte> b) { bytes.insert(bytes.end(), b.begin(), b.end()); }
  } s;
  write_compressed_to(writer, s, options);
  return std::move(s.bytes);
}

/// Writes the plain safetensors file equivalent to a compressed one (same tensors, offsets and
/// metadata: byte-identical to what hone's writer produces for those tensors) to `sink`, checking
/// every chunk on the way.
template <class Sink>
void decompress_to(const compressed_file& in, Sink& sink) {
  const std::string prefix = detail::safetensors_prefix(in.tensors(), in.metadata());
  sink.write(std::as_bytes(std::span(prefix.data(), prefix.size())));
  for (const auto& t : in.tensors()) {
    in.for_each_chunk(t, [&](std::span<const std::byte> raw) { sink.write(raw); });
  }
}

/// Converts the compressed tensor file `in` into the plain safetensors file `out` (readable by
/// Python's safetensors); returns the new file's size and XXH3-128.
inline file_digest decompress_to_safetensors(const std::filesystem::path& in,
                                             const std::filesystem::path& out, bool sync = true) {
  const compressed_file src = compressed_file::open(in);
  output_file dst(out);
  decompress_to(src, dst);
  if (sync) dst.sync();
  return dst.close();
}

/// Converts the plain safetensors file `in` into a compressed tensor file `out`, keeping its
/// tensor order and offsets; returns the new file's size and XXH3-128.
inline file_digest compress_safetensors(const std::filesystem::path& in,
                                        const std::filesystem::path& out,
                                        const compression_options& options = {}, bool sync = true) {
  const safetensors_file src = safetensors_file::open(in);
  tensor_writer w;
  w.set_order(tensor_order::as_added);
  for (const auto& t : src.tensors()) w.add(t.name, t.type, t.shape, src.data(t));
  for (const auto& [k, v] : src.metadata()) w.set_metadata(k, v);
  return write_compressed(w, out, options, sync);
}

}  // namespace checkpoint
HONE_NAMESPACE_END
