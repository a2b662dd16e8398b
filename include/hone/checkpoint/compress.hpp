// hone/checkpoint/compress.hpp: hone compressed tensor files (".hct"): safetensors' tensors,
// each cut into chunks that are transformed (byte-plane shuffle, or a float split),
// zstd-compressed, with an XXH3-64 per chunk.
//
// Why transform: the bytes of a float are not alike. The high byte of bf16 weights (sign and
// exponent) takes few values, the low byte is close to random; interleaved, zstd sees noise.
// Grouping byte k of every element together (a "byte plane", as Blosc and ZipNN do) gives zstd
// one highly compressible plane and one incompressible one. Measured on trained weights (see
// /work/shared ANCHORS "Checkpointing" and tests/checkpoint): bf16 1.28x raw -> ~1.46x shuffled
// at zstd level 1. A chunk that does not shrink is stored raw, so incompressible tensors cost
// nothing but the index.
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
//
// Compression runs chunks in parallel on oneTBB (a pipeline: read/convert, transform + compress in
// parallel, write in order), with memory bounded by 2 chunks in flight per thread.
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
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
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
#include "hone/core/parallel.hpp"

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
[[nodiscard]] constexpr bool transform_applies(chunk_transform t, dtype type) noexcept {
  return t == chunk_transform::shuffle || type == dtype::f32 || type == dtype::bf16;
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
  require(in.empty() || in.data() + in.size() <= out.data() || out.data() + out.size() <= in.data(),
          std::string("hone::checkpoint::") + who + ": the input and output overlap");
}

template <bool ToPlanes>
void transpose_planes(std::span<const std::byte> in, std::size_t item, std::span<std::byte> out,
                      const char* who) {
  require(item > 0 && in.size() % item == 0 && out.size() == in.size(),
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
      return transpose_planes<ToPlanes, 2>(src, n, item, dst);
    case 4:
      return transpose_planes<ToPlanes, 4>(src, n, item, dst);
    case 8:
      return transpose_planes<ToPlanes, 8>(src, n, item, dst);
    default:
      return transpose_planes<ToPlanes, 0>(src, n, item, dst);
  }
}
}  // namespace detail

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

namespace detail {

#if defined(__SANITIZE_THREAD__)
#define HONE_DETAIL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HONE_DETAIL_TSAN 1
#endif
#endif

/// Makes oneTBB's hand-offs visible to ThreadSanitizer. Debian's libtbb is not built with TSan,
/// so the happens-before edges of its scheduler (a task's writes before the algorithm returns, a
/// pipeline token recycled to another worker) are invisible and TSan reports the later reads as
/// races. Under TSan, every task body calls enter() first and leave() last, and the caller calls
/// enter() after the algorithm: each is a lock/unlock of one mutex, so the mutex order carries
/// the edges TBB really provides. Without TSan both are empty.
struct tbb_handoff {
#if defined(HONE_DETAIL_TSAN)
  std::mutex m;
  void enter() {
    std::lock_guard lock(m);
  }
  void leave() {
    std::lock_guard lock(m);
  }
#else
  void enter() {}
  void leave() {}
#endif
};

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
  split_floats_range<Item, Delta>(src, 1, n, n, dst);
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

/// Applies transform `t` to `in` (whole elements of `item` bytes) into `out` (same size).
/// config_error when the transform does not apply to elements of that size.
inline void transform_bytes(chunk_transform t, std::span<const std::byte> in, std::size_t item,
                            std::span<std::byte> out) {
  if (t == chunk_transform::shuffle) return shuffle_bytes(in, item, out);
  require((item == 2 || item == 4) && in.size() % item == 0 && out.size() == in.size(),
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
  require((item == 2 || item == 4) && in.size() % item == 0 && out.size() == in.size(),
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
    out += hex64(chunks[c].hash);
    out += "\"]";
  }
  out += ']';
}

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
  if (hash64(out) != c.hash) {
    fail(context, where() + ": checksum mismatch (the file is damaged)");
  }
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
          convert(converted, t.type, dst, to);
        }
      }
    };
    if (cs.size() <= 1) {
      decode_range(0, cs.size());
    } else {
      detail::tbb_handoff handoff;
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, cs.size(), 1),
                        [&](const tbb::blocked_range<std::size_t>& r) {
                          handoff.enter();
                          decode_range(r.begin(), r.end());
                          handoff.leave();
                        });
      handoff.enter();
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
      detail::decode_chunk(bytes_, cs[i], transform(t), dtype_size(t.type), raw, scratch,
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
                           std::string(dtype_name(e.info.type)));
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
      transforms_.push_back(*tr);
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
  std::vector<chunk_transform> transforms_;                       // per tensor
  std::uint32_t version_ = compressed_version;
};

namespace detail {
/// The transform of each tensor of `layout` (see compression_options::transform), reading samples
/// through `writer`; the samples are compressed in parallel on oneTBB.
inline std::vector<chunk_transform> choose_transforms(const tensor_writer& writer,
                                                      const std::vector<tensor_info>& layout,
                                                      const std::vector<std::size_t>& order,
                                                      const compression_options& options) {
  std::vector<chunk_transform> out(layout.size(), chunk_transform::shuffle);
  const auto splits = [](dtype t) { return transform_applies(chunk_transform::split, t); };
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
  tbb_handoff handoff;
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, candidates.size(), 1),
      [&](const tbb::blocked_range<std::size_t>& r) {
        handoff.enter();
        std::unique_ptr<ZSTD_CCtx, zstd_cctx_deleter> cctx(ZSTD_createCCtx());
        if (!cctx) throw allocation_error("hone: cannot create a zstd compression context", 0);
        std::vector<std::byte> raw, moved, packed;
        for (std::size_t k = r.begin(); k != r.end(); ++k) {
          const std::size_t i = candidates[k];
          const std::size_t item = dtype_size(layout[i].type);
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
        handoff.leave();
      });
  handoff.enter();
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

  detail::tbb_handoff handoff;
  tbb::parallel_pipeline(
      tokens,
      tbb::make_filter<void,
                       job*>(tbb::filter_mode::serial_in_order, [&](tbb::flow_control& fc) -> job* {
        handoff.enter();
        while (next_tensor < layout.size() && next_offset >= layout[next_tensor].size_bytes()) {
          ++next_tensor;
          next_offset = 0;
        }
        if (next_tensor >= layout.size()) {
          fc.stop();
          handoff.leave();
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
        handoff.leave();
        return j;
      }) & tbb::make_filter<job*, job*>(tbb::filter_mode::parallel, [&](job* j) -> job* {
        handoff.enter();
        const std::size_t item = dtype_size(layout[j->tensor].type);
        j->raw.resize(j->length);
        writer.read_stored(order[j->tensor], j->offset, j->raw);
        j->info.raw_bytes = j->length;
        j->info.hash = hash64(j->raw);
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
        handoff.leave();
        return j;
      }) & tbb::make_filter<job*, void>(tbb::filter_mode::serial_in_order, [&](job* j) {
        handoff.enter();
        const bool packed = j->info.stored_bytes < j->info.raw_bytes;
        sink.write(std::span<const std::byte>(packed ? j->packed : j->raw)
                       .first(static_cast<std::size_t>(j->info.stored_bytes)));
        j->info.file_offset = file_offset;
        file_offset += j->info.stored_bytes;
        chunks[j->tensor].push_back(j->info);
        handoff.leave();
      }));
  handoff.enter();

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
  // A stored chunk is never larger than its raw bytes: the tensors plus the prelude, index and
  // trailer's usual size fit without a reallocation (each one copied the whole file so far).
  std::uint64_t raw = 0;
  for (const auto& e : writer.entries()) raw += e.stored_bytes();
  s.bytes.reserve(static_cast<std::size_t>(raw) + detail::prelude_bytes + detail::trailer_bytes +
                  std::size_t{4096});
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
