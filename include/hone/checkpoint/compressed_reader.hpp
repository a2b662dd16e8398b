// hone/checkpoint/compressed_reader.hpp: reading hone compressed tensor files
// (hone/checkpoint/compressed_format.hpp). compressed_file validates the prelude, trailer and index
// when it opens a file (every offset, length and the index checksum) and checks each chunk's
// decompressed size and XXH3-64 when it is read; damage is a hone::checkpoint_error naming the
// file, the tensor and the chunk. Tensors decode chunk-parallel on oneTBB.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <zstd.h>

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

#include "hone/checkpoint/byte_transforms.hpp"
#include "hone/checkpoint/compressed_format.hpp"
#include "hone/checkpoint/detail/zstd_context.hpp"
#include "hone/checkpoint/safetensors.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/dtype.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/hash.hpp"
#include "hone/io/json.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

namespace detail {
/// Decodes one chunk (validated offsets) into `out` (raw_bytes long) and checks its hash.
/// `scratch` is reused between calls.
inline void decode_chunk(std::span<const std::byte> file, const chunk_info& c,
                         chunk_transform transform, std::size_t item, std::span<std::byte> out,
                         std::vector<std::byte>& scratch, ZSTD_DCtx* dctx, std::string_view context,
                         std::string_view name, std::size_t chunk_number) {
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
    untransform_bytes(transform, scratch, item, out);
  }
  if (io::hash64(out) != c.hash) {
    fail(context, where() + ": checksum mismatch (the file is damaged)");
  }
}
}  // namespace detail

/// A validated compressed tensor file in memory (mapped or borrowed). Indices, offsets, lengths and
/// the index checksum are checked on open; chunk contents are checked (decompressed size, XXH3-64)
/// when read or verified.
class compressed_file {
 public:
  [[nodiscard]] static compressed_file open(const std::filesystem::path& path) {
    compressed_file f;
    f.map_ = io::mapped_file(path);
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
  /// The transform of tensor `t`'s chunks (its "encoding").
  [[nodiscard]] chunk_transform transform(const tensor_info& t) const {
    return transforms_[position(t)];
  }
  /// The file's format version (1 or 2).
  [[nodiscard]] std::uint32_t version() const noexcept { return version_; }
  /// Bytes tensor `t` occupies in this file.
  [[nodiscard]] std::uint64_t stored_bytes(const tensor_info& t) const {
    std::uint64_t n = 0;
    for (const auto& c : chunks(t)) n += c.stored_bytes;
    return n;
  }

  /// Decompresses tensor `t` into `out` (its size in dtype `as`, default its own), checking every
  /// chunk's size and XXH3-64; checkpoint_error naming the file, tensor and chunk on damage.
  /// Chunks decode in parallel on oneTBB.
  void read(const tensor_info& t, std::span<std::byte> out,
            std::optional<io::dtype> as = {}) const {
    const io::dtype to = as.value_or(t.type);
    require(io::can_convert(t.type, to),
            "hone::checkpoint::compressed_file::read: cannot convert " +
                std::string(io::dtype_name(t.type)) + " to " + std::string(io::dtype_name(to)));
    require(out.size() == t.elements() * io::dtype_size(to),
            "hone::checkpoint::compressed_file::read: tensor '" + t.name + "' needs " +
                std::to_string(t.elements() * io::dtype_size(to)) + " bytes, the output has " +
                std::to_string(out.size()));
    const auto cs = chunks(t);
    std::vector<std::uint64_t> raw_offset(cs.size());
    std::uint64_t off = 0;
    for (std::size_t i = 0; i < cs.size(); ++i) {
      raw_offset[i] = off;
      off += cs[i].raw_bytes;
    }
    const std::size_t in_item = io::dtype_size(t.type);
    const std::size_t out_item = io::dtype_size(to);
    const chunk_transform tr = transform(t);
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
          detail::decode_chunk(bytes_, c, tr, in_item, dst, scratch, dctx.get(), context_, t.name,
                               i);
        } else {
          converted.resize(static_cast<std::size_t>(c.raw_bytes));
          detail::decode_chunk(bytes_, c, tr, in_item, converted, scratch, dctx.get(), context_,
                               t.name, i);
          io::convert(converted, t.type, dst, to);
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
      detail::decode_chunk(bytes_, cs[i], transform(t), io::dtype_size(t.type), raw, scratch,
                           dctx.get(), context_, t.name, i);
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
    if (version < compressed_min_version || version > compressed_version) {
      fail(context_, "is a compressed tensor file of format version " + std::to_string(version) +
                         "; this hone reads versions " + std::to_string(compressed_min_version) +
                         " to " + std::to_string(compressed_version) +
                         (version > compressed_version ? " (written by a newer hone?)" : ""));
    }
    version_ = version;
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
    if (io::hash64(index_bytes) != index_hash) {
      fail(context_, "index checksum mismatch (the index is damaged)");
    }
    const io::json::value root = detail::parse_header_json(index_bytes, context_, "index");
    auto entries = detail::validate_header(root, context_, metadata_);
    std::uint64_t file_offset = detail::prelude_bytes;
    tensors_.reserve(entries.size());
    chunk_range_.reserve(entries.size());
    for (auto& e : entries) {
      const std::string who = "tensor " + detail::quote_name(e.info.name);
      const io::json::value* enc = e.object->find("encoding");
      const auto tr = enc != nullptr && enc->is_string() ? transform_of_encoding(enc->as_string())
                                                         : std::nullopt;
      if (!tr || (version == 1 && *tr != chunk_transform::shuffle)) {
        fail(context_,
             who + (version == 1 ? ": \"encoding\" must be \"shuffle-zstd\" in a version 1 file"
                                 : ": \"encoding\" must be \"shuffle-zstd\", \"split-zstd\" or "
                                   "\"split-delta-zstd\""));
      }
      if (!transform_applies(*tr, e.info.type)) {
        fail(context_, who + ": encoding \"" + std::string(encoding_name(*tr)) +
                           "\" applies to F32 and BF16 tensors only, not " +
                           std::string(io::dtype_name(e.info.type)));
      }
      const io::json::value* list = e.object->find("chunks");
      if (list == nullptr || !list->is_array()) {
        fail(context_, who + ": \"chunks\" must be an array of [raw, stored, hash]");
      }
      const std::size_t item = io::dtype_size(e.info.type);
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
        const io::json::value& h = c.as_array()[2];
        const auto hv = h.is_string() ? io::parse_hex64(h.as_string()) : std::nullopt;
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
      transforms_.push_back(*tr);
      tensors_.push_back(std::move(e.info));
    }
    if (file_offset != index_offset) {
      fail(context_,
           std::to_string(index_offset - file_offset) + " bytes of chunk data belong to no tensor");
    }
    index_ = detail::name_index(tensors_);
  }

  io::mapped_file map_;
  std::span<const std::byte> bytes_;
  std::string context_;
  std::vector<tensor_info> tensors_;
  metadata_map metadata_;
  detail::name_index index_;
  std::vector<chunk_info> chunks_;
  std::vector<std::pair<std::size_t, std::size_t>> chunk_range_;  // per tensor: first, count
  std::vector<chunk_transform> transforms_;                       // per tensor
  std::uint32_t version_ = compressed_version;
};

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
}  // namespace checkpoint
HONE_NAMESPACE_END
