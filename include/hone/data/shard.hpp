// hone/data/shard.hpp: sharded record files (layout: hone/data/shard_format.hpp, docs/data.md).
//
//  - shard_writer packs records (byte strings) into shards `<name>-00000.hshard`, ... in a
//    directory: records gather into frames of about `frame_bytes` decoded bytes (a record larger
//    than that gets a frame of its own), each frame one independent zstd frame; a shard is
//    closed before it would exceed `shard_bytes`. Each shard appears atomically (written under a
//    temporary name, fsynced, renamed into place, directory fsynced).
//  - shard_file validates one shard when it opens it (header, footer and its checksum, index and
//    its checksum, every entry against the others) and reads record i by decoding the one frame
//    that holds it, after checking that frame's compressed bytes, decoded size, decoded checksum
//    and record table. Damage is a hone::io::format_error naming the file and the frame.
//  - shard_dataset reads a set of shards as one dataset (records numbered across the shards in
//    the order given).
//
// Threads: shard_file and shard_dataset are immutable after opening; get(i, record) is const and
// may run on any number of threads at once, each with its own shard_record. The shard_record is
// the reader's cache: it keeps the last frame it decoded (and a zstd context), so reading records
// of the same frame one after another decodes that frame once. Both model hone's dataset concept
// (hone/data/dataset.hpp) with buffer_type = shard_record, so the loader gives each batch slot
// its own.
#pragma once

#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/data/shard_format.hpp"
#include "hone/io/error.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/hash.hpp"

HONE_NAMESPACE_BEGIN
namespace data {

namespace detail {
struct shard_dctx_deleter {
  void operator()(ZSTD_DCtx* c) const noexcept { ZSTD_freeDCtx(c); }
};
struct shard_cctx_deleter {
  void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); }
};
/// A process-wide serial number per opened shard: the key of a shard_record's cached frame (an
/// address could be reused by a later shard).
inline std::uint64_t next_shard_serial() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}
[[noreturn]] inline void shard_fail(std::string_view context, const std::string& what) {
  throw io::format_error("hone: shard '" + std::string(context) + "' " + what);
}
}  // namespace detail

/// A record read from a shard, and the reader's cache: the frame it came from stays decoded in it
/// so the next record of that frame costs no decompression. Reuse one per thread.
class shard_record {
 public:
  shard_record() = default;
  shard_record(const shard_record& o)
      : frame_(o.frame_),
        key_(o.key_),
        begin_(o.begin_),
        end_(o.end_),
        frames_decoded_(o.frames_decoded_) {}
  shard_record& operator=(const shard_record& o) {
    if (this != &o) {
      frame_ = o.frame_;
      key_ = o.key_;
      begin_ = o.begin_;
      end_ = o.end_;
      frames_decoded_ = o.frames_decoded_;
    }
    return *this;
  }
  shard_record(shard_record&&) noexcept = default;
  shard_record& operator=(shard_record&&) noexcept = default;
  ~shard_record() = default;

  /// The record's bytes (valid until the next get into this record).
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept {
    return std::span<const std::byte>(frame_).subspan(begin_, end_ - begin_);
  }
  /// The record's bytes as characters.
  [[nodiscard]] std::string_view view() const noexcept {
    return {reinterpret_cast<const char*>(frame_.data()) + begin_, end_ - begin_};
  }
  [[nodiscard]] std::size_t size() const noexcept { return end_ - begin_; }
  /// How many frames this record has decoded so far (what the cache saved shows here).
  [[nodiscard]] std::uint64_t frames_decoded() const noexcept { return frames_decoded_; }

 private:
  friend class shard_file;
  struct key {
    std::uint64_t shard = 0;  // serial of the shard_file (0: nothing cached)
    std::uint64_t frame = 0;
    friend bool operator==(const key&, const key&) = default;
  };
  std::vector<std::byte> frame_;  // the decoded frame: record table, then records
  key key_{};
  std::size_t begin_ = 0, end_ = 0;
  std::uint64_t frames_decoded_ = 0;
  std::unique_ptr<ZSTD_DCtx, detail::shard_dctx_deleter> dctx_;
};

/// One validated shard, memory-mapped (or borrowed bytes, for tests and fuzzing).
class shard_file {
 public:
  using buffer_type = shard_record;

  /// Maps and validates the shard at `path`.
  [[nodiscard]] static shard_file open(const std::filesystem::path& path) {
    shard_file f;
    f.map_ = io::mapped_file(path);
    f.init(f.map_.bytes(), path.string());
    return f;
  }
  /// Validates the shard held in `bytes` (borrowed: it must outlive the result); `context` names
  /// it in errors.
  [[nodiscard]] static shard_file view(std::span<const std::byte> bytes, std::string context) {
    shard_file f;
    f.init(bytes, std::move(context));
    return f;
  }

  /// Number of records.
  [[nodiscard]] std::size_t size() const noexcept { return static_cast<std::size_t>(records_); }
  [[nodiscard]] std::span<const shard_frame_info> frames() const noexcept { return frames_; }
  [[nodiscard]] std::uint64_t file_size() const noexcept { return bytes_.size(); }
  /// The path (or the name given to view()).
  [[nodiscard]] const std::string& context() const noexcept { return context_; }

  /// Reads record `i` into `out`, decoding at most one frame (none when `out` holds that frame
  /// already). config_error for an index past the end; io::format_error naming the file and the
  /// frame when the frame is damaged.
  void get(std::size_t i, shard_record& out) const {
    HONE_REQUIRE(i < records_, "hone::data::shard_file::get: record " + std::to_string(i) +
                                   " is past the end of shard '" + context_ + "' (" +
                                   std::to_string(records_) + " records)");
    const auto it = std::upper_bound(
        frames_.begin(), frames_.end(), static_cast<std::uint64_t>(i),
        [](std::uint64_t r, const shard_frame_info& f) { return r < f.first_record; });
    const auto frame = static_cast<std::size_t>(it - frames_.begin()) - 1;
    load_frame(frame, out);
    const std::size_t k = i - static_cast<std::size_t>(frames_[frame].first_record);
    const std::size_t table = 8 * static_cast<std::size_t>(frames_[frame].records);
    const std::byte* ends = out.frame_.data();
    out.begin_ =
        table + (k == 0 ? 0 : static_cast<std::size_t>(detail::shard_get64(ends + 8 * (k - 1))));
    out.end_ = table + static_cast<std::size_t>(detail::shard_get64(ends + 8 * k));
  }

  /// Decodes and checks frame `f` (its compressed checksum, decoded size and checksum, record
  /// table); `scratch` is the decoding buffer.
  void verify_frame(std::size_t f, shard_record& scratch) const {
    HONE_REQUIRE(f < frames_.size(), "hone::data::shard_file::verify_frame: frame " +
                                         std::to_string(f) + " is past the end of shard '" +
                                         context_ + "' (" + std::to_string(frames_.size()) +
                                         " frames)");
    scratch.key_ = {};
    load_frame(f, scratch);
  }
  /// Decodes and checks every frame (what `hone-data verify` does). Memory: one frame.
  void verify() const {
    shard_record scratch;
    for (std::size_t f = 0; f < frames_.size(); ++f) verify_frame(f, scratch);
  }

 private:
  shard_file() = default;

  std::string frame_name(std::size_t f) const {
    const auto& e = frames_[f];
    return "frame " + std::to_string(f) + " (records " + std::to_string(e.first_record) + " to " +
           std::to_string(e.first_record + e.records - 1) + ", file offset " +
           std::to_string(e.offset) + ")";
  }

  void load_frame(std::size_t f, shard_record& out) const {
    const shard_record::key want{serial_, f};
    if (out.key_ == want) return;
    out.key_ = {};  // nothing valid cached while decoding (an exception leaves it empty)
    const auto& e = frames_[f];
    const auto stored = bytes_.subspan(static_cast<std::size_t>(e.offset),
                                       static_cast<std::size_t>(e.compressed_bytes));
    const auto fail = [&](const std::string& what) {
      detail::shard_fail(context_, frame_name(f) + " " + what +
                                       " (the shard is damaged: write it again from its source)");
    };
    if (io::hash64(stored) != e.compressed_hash) {
      fail("does not match its checksum in the index");
    }
    const unsigned long long content = ZSTD_getFrameContentSize(stored.data(), stored.size());
    if (content != e.decoded_bytes) fail("is not a zstd frame of the size the index gives");
    if (!out.dctx_) {
      out.dctx_.reset(ZSTD_createDCtx());
      if (!out.dctx_) throw allocation_error("hone: cannot create a zstd decompression context", 0);
    }
    out.frame_.resize(static_cast<std::size_t>(e.decoded_bytes));
    const std::size_t r = ZSTD_decompressDCtx(out.dctx_.get(), out.frame_.data(), out.frame_.size(),
                                              stored.data(), stored.size());
    if (ZSTD_isError(r)) fail(std::string("does not decompress: ") + ZSTD_getErrorName(r));
    if (r != e.decoded_bytes) {
      fail("decompresses to " + std::to_string(r) + " bytes, not " +
           std::to_string(e.decoded_bytes));
    }
    if (io::hash64(out.frame_) != e.decoded_hash) {
      fail("decodes to bytes that do not match their checksum in the index");
    }
    // The record table: non-decreasing ends, the last one at the end of the record data.
    const std::uint64_t data = e.decoded_bytes - 8 * e.records;
    std::uint64_t prev = 0;
    for (std::uint64_t k = 0; k < e.records; ++k) {
      const std::uint64_t end = detail::shard_get64(out.frame_.data() + 8 * k);
      if (end < prev || end > data || (k + 1 == e.records && end != data)) {
        fail("has a record table that does not cut its " + std::to_string(data) +
             " bytes of records into " + std::to_string(e.records) + " records (record " +
             std::to_string(e.first_record + k) + " ends at " + std::to_string(end) + ")");
      }
      prev = end;
    }
    ++out.frames_decoded_;
    out.key_ = want;
  }

  void init(std::span<const std::byte> bytes, std::string context) {
    context_ = std::move(context);
    bytes_ = bytes;
    serial_ = detail::next_shard_serial();
    const auto fail = [&](const std::string& what) { detail::shard_fail(context_, what); };
    const std::uint64_t size = bytes.size();
    constexpr std::uint64_t least = detail::shard_header_bytes + detail::shard_footer_bytes;
    if (!is_shard_file(bytes)) {
      fail(
          "is not a hone record shard: it does not start with the shard magic bytes (is it "
          "another kind of file?)");
    }
    if (size < least) {
      fail("is " + std::to_string(size) + " bytes, too short for a record shard (at least " +
           std::to_string(least) + "): it is truncated");
    }
    const std::uint32_t version = detail::shard_get32(bytes.data() + 8);
    if (version != shard_version) {
      fail("has format version " + std::to_string(version) + " in its header; this hone reads " +
           "version " + std::to_string(shard_version) +
           (version > shard_version ? " (written by a newer hone?)" : " (the header is damaged)"));
    }
    if (const std::uint32_t flags = detail::shard_get32(bytes.data() + 12); flags != 0) {
      fail("has unknown flags " + std::to_string(flags) + " in its header (the header is damaged)");
    }
    const std::byte* footer = bytes.data() + (size - detail::shard_footer_bytes);
    for (std::size_t i = 0; i < shard_end_magic.size(); ++i) {
      if (footer[48 + i] != static_cast<std::byte>(shard_end_magic[i])) {
        fail("does not end with the shard end magic: it is truncated (or was not fully written)");
      }
    }
    const auto footer_covered = std::span<const std::byte>(footer, detail::shard_footer_hashed);
    if (io::hash64(footer_covered) != detail::shard_get64(footer + 40)) {
      fail("has a footer that does not match its checksum (the footer is damaged)");
    }
    if (detail::shard_get32(footer) != version || detail::shard_get32(footer + 4) != 0) {
      fail("has a footer whose version or flags differ from its header's (the file is damaged)");
    }
    const std::uint64_t index_offset = detail::shard_get64(footer + 8);
    const std::uint64_t frame_count = detail::shard_get64(footer + 16);
    records_ = detail::shard_get64(footer + 24);
    const std::uint64_t index_hash = detail::shard_get64(footer + 32);
    const std::uint64_t index_end = size - detail::shard_footer_bytes;
    if (frame_count > (index_end - detail::shard_header_bytes) / detail::shard_entry_bytes ||
        index_offset != index_end - frame_count * detail::shard_entry_bytes) {
      fail("has a footer whose index (offset " + std::to_string(index_offset) + ", " +
           std::to_string(frame_count) + " frames) does not end where the footer begins (" +
           std::to_string(index_end) + "): the file is truncated or damaged");
    }
    const auto index = bytes.subspan(static_cast<std::size_t>(index_offset),
                                     static_cast<std::size_t>(index_end - index_offset));
    if (io::hash64(index) != index_hash) {
      fail(
          "has a frame index that does not match its checksum in the footer (the index is "
          "damaged)");
    }
    frames_.reserve(static_cast<std::size_t>(frame_count));
    std::uint64_t offset = detail::shard_header_bytes, record = 0;
    for (std::uint64_t f = 0; f < frame_count; ++f) {
      const auto e = detail::decode_frame_entry(index.data() + f * detail::shard_entry_bytes);
      const auto bad = [&](const std::string& what) {
        fail("index entry of frame " + std::to_string(f) + " " + what + " (the index is damaged)");
      };
      if (e.offset != offset) {
        bad("puts it at offset " + std::to_string(e.offset) + ", not " + std::to_string(offset) +
            " where the frame before it ends");
      }
      if (e.compressed_bytes == 0 || e.compressed_bytes > index_offset - offset) {
        bad("gives " + std::to_string(e.compressed_bytes) +
            " compressed bytes, which do not fit before the index");
      }
      if (e.first_record != record) {
        bad("says it starts at record " + std::to_string(e.first_record) + ", not " +
            std::to_string(record));
      }
      if (e.records == 0 || e.records > e.decoded_bytes / 8 ||
          e.decoded_bytes > max_shard_record_bytes + 8 || e.records > records_ - record) {
        bad("gives " + std::to_string(e.records) + " records in " +
            std::to_string(e.decoded_bytes) + " decoded bytes, which is impossible");
      }
      offset += e.compressed_bytes;
      record += e.records;
      frames_.push_back(e);
    }
    if (offset != index_offset) {
      fail("has " + std::to_string(index_offset - offset) +
           " bytes between its last frame and its index that belong to no frame (the index is "
           "damaged)");
    }
    if (record != records_) {
      fail("has frames holding " + std::to_string(record) + " records, but its footer says " +
           std::to_string(records_) + " (the file is damaged)");
    }
  }

  io::mapped_file map_;
  std::span<const std::byte> bytes_;
  std::string context_;
  std::vector<shard_frame_info> frames_;
  std::uint64_t records_ = 0;
  std::uint64_t serial_ = 0;
};

/// A set of shards read as one dataset: record numbers run across the shards in the order given.
/// Immutable and shareable across threads (give each thread its own shard_record).
class shard_dataset {
 public:
  using buffer_type = shard_record;

  shard_dataset() = default;  // an empty set: 0 records
  /// Opens and validates every shard (in this order).
  explicit shard_dataset(const std::vector<std::filesystem::path>& paths) {
    shards_.reserve(paths.size());
    for (const auto& p : paths) add(shard_file::open(p));
  }
  /// Adds an opened shard after the others.
  void add(shard_file f) {
    starts_.push_back(total_);
    total_ += f.size();
    shards_.push_back(std::move(f));
  }

  [[nodiscard]] std::size_t size() const noexcept { return static_cast<std::size_t>(total_); }
  [[nodiscard]] std::span<const shard_file> shards() const noexcept { return shards_; }

  /// Reads record `i` (numbered across the shards) into `out`, decoding at most one frame.
  void get(std::size_t i, shard_record& out) const {
    HONE_REQUIRE(i < total_, "hone::data::shard_dataset::get: record " + std::to_string(i) +
                                 " is past the end of the shard set (" + std::to_string(total_) +
                                 " records in " + std::to_string(shards_.size()) + " shards)");
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), static_cast<std::uint64_t>(i));
    const auto s = static_cast<std::size_t>(it - starts_.begin()) - 1;
    shards_[s].get(i - static_cast<std::size_t>(starts_[s]), out);
  }
  /// Which shard holds record `i`, and its number there.
  [[nodiscard]] std::pair<std::size_t, std::size_t> locate(std::size_t i) const {
    HONE_REQUIRE(i < total_, "hone::data::shard_dataset::locate: record " + std::to_string(i) +
                                 " is past the end of the shard set (" + std::to_string(total_) +
                                 " records)");
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), static_cast<std::uint64_t>(i));
    const auto s = static_cast<std::size_t>(it - starts_.begin()) - 1;
    return {s, i - static_cast<std::size_t>(starts_[s])};
  }

 private:
  std::vector<shard_file> shards_;
  std::vector<std::uint64_t> starts_;
  std::uint64_t total_ = 0;
};

/// The shard files `<name>-NNNNN.hshard` in `dir`, in shard order (what shard_writer wrote).
[[nodiscard]] inline std::vector<std::filesystem::path> list_shards(
    const std::filesystem::path& dir, std::string_view name) {
  std::vector<std::filesystem::path> out;
  const std::string prefix = std::string(name) + "-";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (file.size() == prefix.size() + 5 + shard_suffix.size() && file.starts_with(prefix) &&
        file.ends_with(shard_suffix) &&
        std::all_of(file.begin() + static_cast<std::ptrdiff_t>(prefix.size()),
                    file.begin() + static_cast<std::ptrdiff_t>(prefix.size() + 5),
                    [](char c) { return c >= '0' && c <= '9'; })) {
      out.push_back(entry.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// How shard_writer cuts records into frames and shards.
struct shard_options {
  /// Decoded bytes per frame (its records plus 8 bytes each for the record table): a frame is
  /// closed once it reaches this; a record that would push a non-empty frame past it starts the
  /// next frame; a larger record gets a frame of its own. So a decoded frame never exceeds
  /// max(frame_bytes, 8 + its one record). Smaller frames: cheaper random reads, a worse ratio.
  std::size_t frame_bytes = std::size_t{64} << 10;
  /// A shard is closed before its file would grow past this (a frame larger than it still gets a
  /// shard of its own).
  std::uint64_t shard_bytes = std::uint64_t{256} << 20;
  int level = 3;  // zstd level
};

/// What shard_writer wrote: one entry per shard.
struct written_shard {
  std::filesystem::path path;
  std::uint64_t records = 0;
  std::uint64_t frames = 0;
  std::uint64_t bytes = 0;
};

/// Packs records into shards `dir/<name>-00000.hshard`, `-00001`, ... Call finish(); a writer
/// destroyed before it removes the shard it was writing (shards already finished stay).
class shard_writer {
 public:
  shard_writer(std::filesystem::path dir, std::string name, shard_options opt = {})
      : dir_(std::move(dir)), name_(std::move(name)), opt_(opt) {
    HONE_REQUIRE(opt_.frame_bytes >= 1 && opt_.frame_bytes <= max_shard_record_bytes,
                 "hone::data::shard_writer: frame_bytes must be between 1 and " +
                     std::to_string(max_shard_record_bytes) + ", got " +
                     std::to_string(opt_.frame_bytes));
    HONE_REQUIRE(!name_.empty() && name_.find('/') == std::string::npos,
                 "hone::data::shard_writer: the shard name must be a non-empty file name "
                 "without '/', got '" +
                     name_ + "'");
    HONE_REQUIRE(
        std::filesystem::is_directory(dir_),
        "hone::data::shard_writer: '" + dir_.string() + "' is not a directory; create it first");
    cctx_.reset(ZSTD_createCCtx());
    if (!cctx_) throw allocation_error("hone: cannot create a zstd compression context", 0);
  }
  shard_writer(const shard_writer&) = delete;
  shard_writer& operator=(const shard_writer&) = delete;
  ~shard_writer() {
    if (out_) {
      out_.reset();
      std::error_code ec;
      std::filesystem::remove(temp_path(), ec);
    }
  }

  /// Adds one record (at most max_shard_record_bytes).
  void add(std::span<const std::byte> record) {
    require_open();
    HONE_REQUIRE(record.size() <= max_shard_record_bytes,
                 "hone::data::shard_writer::add: record " + std::to_string(records_added_) +
                     " has " + std::to_string(record.size()) + " bytes, more than the " +
                     std::to_string(max_shard_record_bytes) + " a shard record may have");
    if (!ends_.empty() && fill() + record.size() + 8 > opt_.frame_bytes) flush_frame();
    data_.insert(data_.end(), record.begin(), record.end());
    ends_.push_back(data_.size());
    ++records_added_;
    if (fill() >= opt_.frame_bytes) flush_frame();
  }
  void add(std::string_view record) { add(std::as_bytes(std::span(record.data(), record.size()))); }

  /// Writes the last frame and shard and returns every shard written. With no records at all,
  /// one empty shard is written (so the set exists and reads as 0 records).
  std::vector<written_shard> finish() {
    require_open();
    flush_frame();
    if (out_ || written_.empty()) close_shard();
    finished_ = true;
    return written_;
  }
  [[nodiscard]] std::uint64_t records() const noexcept { return records_added_; }

 private:
  /// Decoded bytes of the pending frame: its records and their 8-byte table entries.
  std::size_t fill() const noexcept { return data_.size() + 8 * ends_.size(); }
  void require_open() const {
    HONE_REQUIRE(!finished_, "hone::data::shard_writer: finish() was called already");
  }
  std::filesystem::path final_path() const {
    std::string n = std::to_string(written_.size());
    n.insert(0, n.size() < 5 ? 5 - n.size() : 0, '0');
    return dir_ / (name_ + "-" + n + std::string(shard_suffix));
  }
  std::filesystem::path temp_path() const {
    auto p = final_path();
    p += ".tmp";
    return p;
  }
  void open_shard() {
    out_ = std::make_unique<io::output_file>(temp_path(), io::create_mode::truncate,
                                             io::write_hashing::off);
    std::array<std::byte, detail::shard_header_bytes> h{};
    for (std::size_t i = 0; i < shard_magic.size(); ++i) h[i] = std::byte{shard_magic[i]};
    detail::shard_put32(h.data() + 8, shard_version);
    detail::shard_put32(h.data() + 12, 0);
    out_->write(h);
    frames_.clear();
    shard_records_ = 0;
  }
  void flush_frame() {
    if (ends_.empty()) return;
    decoded_.resize(8 * ends_.size() + data_.size());
    for (std::size_t k = 0; k < ends_.size(); ++k) {
      detail::shard_put64(decoded_.data() + 8 * k, ends_[k]);
    }
    if (!data_.empty()) std::memcpy(decoded_.data() + 8 * ends_.size(), data_.data(), data_.size());
    compressed_.resize(ZSTD_compressBound(decoded_.size()));
    ZSTD_CCtx_reset(cctx_.get(), ZSTD_reset_session_and_parameters);
    ZSTD_CCtx_setParameter(cctx_.get(), ZSTD_c_compressionLevel, opt_.level);
    ZSTD_CCtx_setParameter(cctx_.get(), ZSTD_c_contentSizeFlag, 1);
    const std::size_t n = ZSTD_compress2(cctx_.get(), compressed_.data(), compressed_.size(),
                                         decoded_.data(), decoded_.size());
    if (ZSTD_isError(n)) {
      throw io_error(std::string("hone::data::shard_writer: zstd failed: ") + ZSTD_getErrorName(n));
    }
    const std::uint64_t index_after = (frames_.size() + 2) * detail::shard_entry_bytes;
    if (out_ && !frames_.empty() &&
        out_->size() + n + index_after + detail::shard_footer_bytes > opt_.shard_bytes) {
      close_shard();
    }
    if (!out_) open_shard();
    shard_frame_info e;
    e.offset = out_->size();
    e.compressed_bytes = n;
    e.decoded_bytes = decoded_.size();
    e.first_record = shard_records_;
    e.records = ends_.size();
    e.compressed_hash = io::hash64(std::span<const std::byte>(compressed_.data(), n));
    e.decoded_hash = io::hash64(decoded_);
    out_->write(std::span<const std::byte>(compressed_.data(), n));
    frames_.push_back(e);
    shard_records_ += e.records;
    ends_.clear();
    data_.clear();
  }
  void close_shard() {
    if (!out_) open_shard();
    std::vector<std::byte> tail(frames_.size() * detail::shard_entry_bytes +
                                detail::shard_footer_bytes);
    for (std::size_t f = 0; f < frames_.size(); ++f) {
      detail::encode_frame_entry(frames_[f], tail.data() + f * detail::shard_entry_bytes);
    }
    const std::size_t index_bytes = frames_.size() * detail::shard_entry_bytes;
    std::byte* footer = tail.data() + index_bytes;
    detail::shard_put32(footer, shard_version);
    detail::shard_put32(footer + 4, 0);
    detail::shard_put64(footer + 8, out_->size());
    detail::shard_put64(footer + 16, frames_.size());
    detail::shard_put64(footer + 24, shard_records_);
    detail::shard_put64(footer + 32,
                        io::hash64(std::span<const std::byte>(tail.data(), index_bytes)));
    detail::shard_put64(
        footer + 40, io::hash64(std::span<const std::byte>(footer, detail::shard_footer_hashed)));
    for (std::size_t i = 0; i < shard_end_magic.size(); ++i) {
      footer[48 + i] = std::byte{shard_end_magic[i]};
    }
    out_->write(tail);
    out_->sync();
    const io::file_digest d = out_->close();
    out_.reset();
    io::rename_path(temp_path(), final_path());
    io::sync_directory(dir_);
    written_.push_back({final_path(), shard_records_, frames_.size(), d.size});
  }

  std::filesystem::path dir_;
  std::string name_;
  shard_options opt_;
  std::unique_ptr<ZSTD_CCtx, detail::shard_cctx_deleter> cctx_;
  std::unique_ptr<io::output_file> out_;  // the shard being written, if any
  std::vector<shard_frame_info> frames_;  // its frames so far
  std::uint64_t shard_records_ = 0;       // its records so far
  std::vector<std::uint64_t> ends_;       // the pending frame: record ends
  std::vector<std::byte> data_;           // ... and record bytes
  std::vector<std::byte> decoded_, compressed_;
  std::vector<written_shard> written_;
  std::uint64_t records_added_ = 0;
  bool finished_ = false;
};

}  // namespace data
HONE_NAMESPACE_END
