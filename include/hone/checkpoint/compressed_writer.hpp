// hone/checkpoint/compressed_writer.hpp: writing hone compressed tensor files
// (hone/checkpoint/compressed_format.hpp) from a tensor_writer, to a file, to memory or to any
// sink.
//
// Compression runs chunks in parallel on oneTBB (a pipeline: read/convert, transform + compress in
// parallel, write in order), with memory bounded by 2 chunks in flight per thread.
// Each tensor's transform is chosen per compression_options (by default, for F32 and BF16, the one
// whose zstd output is smallest on a sample of the tensor's first bytes).
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/parallel_pipeline.h>
#include <oneapi/tbb/task_arena.h>
#include <zstd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <span>
#include <string>
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

HONE_NAMESPACE_BEGIN
namespace checkpoint {

namespace detail {
inline void append_chunks_json(std::string& out, chunk_transform t,
                               std::span<const chunk_info> chunks) {
  out += ",\"encoding\":\"";
  out += encoding_name(t);
  out += "\",\"chunks\":[";
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    if (c != 0) out += ',';
    out += '[';
    out += std::to_string(chunks[c].raw_bytes);
    out += ',';
    out += std::to_string(chunks[c].stored_bytes);
    out += ",\"";
    out += io::hex64(chunks[c].hash);
    out += "\"]";
  }
  out += ']';
}
/// Compresses the transformed chunk `in` (`item` byte planes of equal size) into one zstd frame in
/// `out` (at least ZSTD_compressBound(in.size()) bytes) and returns its size. Each plane ends a
/// zstd block (ZSTD_e_flush), so no block mixes planes and each gets its own literal statistics
/// (a small chunk would otherwise share one Huffman table between an exponent plane and mantissa
/// noise). The frame decodes with any zstd decoder.
inline std::size_t compress_planes(ZSTD_CCtx* cctx, std::span<const std::byte> in, std::size_t item,
                                   std::span<std::byte> out, int level) {
  const auto check = [](std::size_t r) {
    if (ZSTD_isError(r)) {
      throw error(std::string("hone: zstd compression failed: ") + ZSTD_getErrorName(r));
    }
    return r;
  };
  (void)check(ZSTD_CCtx_reset(cctx, ZSTD_reset_session_only));
  (void)check(ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level));
  (void)check(ZSTD_CCtx_setPledgedSrcSize(cctx, in.size()));
  const std::size_t plane = in.size() / item;
  ZSTD_outBuffer dst{out.data(), out.size(), 0};
  for (std::size_t p = 0; p < item; ++p) {
    const bool last = p + 1 == item;
    ZSTD_inBuffer src{in.data() + p * plane, last ? in.size() - p * plane : plane, 0};
    const ZSTD_EndDirective mode = last ? ZSTD_e_end : ZSTD_e_flush;
    // With dst at least ZSTD_compressBound(in.size()) each call completes (returns 0).
    while (check(ZSTD_compressStream2(cctx, &dst, &src, mode)) != 0 || src.pos != src.size) {
      if (dst.pos == dst.size) throw error("hone: zstd compression needs a larger output buffer");
    }
  }
  return dst.pos;
}
/// The transform of each tensor of `layout` (see compression_options::transform), reading samples
/// through `writer`; the samples are compressed in parallel on oneTBB.
inline std::vector<chunk_transform> choose_transforms(const tensor_writer& writer,
                                                      const std::vector<tensor_info>& layout,
                                                      const std::vector<std::size_t>& order,
                                                      const compression_options& options) {
  std::vector<chunk_transform> out(layout.size(), chunk_transform::shuffle);
  const auto splits = [](io::dtype t) { return transform_applies(chunk_transform::split, t); };
  if (options.transform) {
    for (std::size_t i = 0; i < layout.size(); ++i) {
      if (transform_applies(*options.transform, layout[i].type)) out[i] = *options.transform;
    }
    return out;
  }
  std::vector<std::size_t> candidates;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    if (splits(layout[i].type) && layout[i].size_bytes() > 0) candidates.push_back(i);
  }
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, candidates.size(), 1),
      [&](const tbb::blocked_range<std::size_t>& r) {
        std::unique_ptr<ZSTD_CCtx, zstd_cctx_deleter> cctx(ZSTD_createCCtx());
        if (!cctx) throw allocation_error("hone: cannot create a zstd compression context", 0);
        std::vector<std::byte> raw, moved, packed;
        for (std::size_t k = r.begin(); k != r.end(); ++k) {
          const std::size_t i = candidates[k];
          const std::size_t item = io::dtype_size(layout[i].type);
          const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(
              layout[i].size_bytes(), std::max(item, options.sample_bytes / item * item)));
          raw.resize(n);
          moved.resize(n);
          packed.resize(ZSTD_compressBound(n));
          writer.read_stored(order[i], 0, raw);
          std::size_t best = std::numeric_limits<std::size_t>::max();
          for (const auto t :
               {chunk_transform::shuffle, chunk_transform::split, chunk_transform::split_delta}) {
            transform_bytes(t, raw, item, moved);
            const std::size_t z = compress_planes(cctx.get(), moved, item, packed, options.level);
            if (z < best) {
              best = z;
              out[i] = t;
            }
          }
        }
      });
  return out;
}
}  // namespace detail

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
  require(options.sample_bytes > 0, "hone::checkpoint: compression sample_bytes must be positive");
  const std::vector<tensor_info> layout = writer.layout();
  const std::vector<std::size_t> order = writer.file_order();
  const std::vector<chunk_transform> transforms =
      detail::choose_transforms(writer, layout, order, options);

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
        const std::size_t item = io::dtype_size(layout[next_tensor].type);
        const std::size_t chunk = std::max(item, options.chunk_bytes / item * item);
        job* j = &slots[sequence++ % tokens];
        j->tensor = next_tensor;
        j->offset = next_offset;
        j->length = static_cast<std::size_t>(
            std::min<std::uint64_t>(chunk, layout[next_tensor].size_bytes() - next_offset));
        next_offset += j->length;
        return j;
      }) & tbb::make_filter<job*, job*>(tbb::filter_mode::parallel, [&](job* j) -> job* {
        const std::size_t item = io::dtype_size(layout[j->tensor].type);
        j->raw.resize(j->length);
        writer.read_stored(order[j->tensor], j->offset, j->raw);
        j->info.raw_bytes = j->length;
        j->info.hash = io::hash64(j->raw);
        j->shuffled.resize(j->length);
        transform_bytes(transforms[j->tensor], j->raw, item, j->shuffled);
        if (!j->cctx) {
          j->cctx.reset(ZSTD_createCCtx());
          if (!j->cctx) {
            throw allocation_error("hone: cannot create a zstd compression context", 0);
          }
        }
        j->packed.resize(ZSTD_compressBound(j->length));
        const std::size_t r =
            detail::compress_planes(j->cctx.get(), j->shuffled, item, j->packed, options.level);
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
  detail::append_header_json(index, layout, writer.metadata(),
                             [&](std::size_t i, std::string& out) {
                               detail::append_chunks_json(out, transforms[i], chunks[i]);
                             });
  require(index.size() <= max_header_bytes,
          "hone::checkpoint: the compressed file's index would exceed " +
              std::to_string(max_header_bytes) + " bytes; use larger chunks");
  const auto index_bytes = std::as_bytes(std::span(index.data(), index.size()));
  sink.write(index_bytes);
  std::array<std::byte, detail::trailer_bytes> trailer{};
  detail::write_u64_le(trailer.data(), file_offset);
  detail::write_u64_le(trailer.data() + 8, index.size());
  detail::write_u64_le(trailer.data() + 16, io::hash64(index_bytes));
  for (std::size_t i = 0; i < compressed_end_magic.size(); ++i) {
    trailer[24 + i] = static_cast<std::byte>(compressed_end_magic[i]);
  }
  sink.write(trailer);
}

/// Writes the tensors of `writer` as a compressed tensor file at `path` (created or truncated),
/// fsyncs it when `sync`, and returns its size and XXH3-128.
inline io::file_digest write_compressed(const tensor_writer& writer,
                                        const std::filesystem::path& path,
                                        const compression_options& options = {}, bool sync = true) {
  io::output_file out(path);
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
  // A stored chunk is never larger than its raw bytes: the tensors plus the prelude, index and
  // trailer's usual size fit without a reallocation (each one copied the whole file so far).
  std::uint64_t raw = 0;
  for (const auto& e : writer.entries()) raw += e.stored_bytes();
  s.bytes.reserve(static_cast<std::size_t>(raw) + detail::prelude_bytes + detail::trailer_bytes +
                  std::size_t{4096});
  write_compressed_to(writer, s, options);
  return std::move(s.bytes);
}

}  // namespace checkpoint
HONE_NAMESPACE_END
