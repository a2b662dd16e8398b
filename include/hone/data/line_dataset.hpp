// hone/data/line_dataset.hpp: lazy datasets over a memory-mapped text file: one record per line
// (text), per RFC 4180 record (CSV) or per JSON Lines line (jsonl). The file is never loaded:
// an offset index of 8 bytes per record (the uint64 offset of each record's first byte) is built
// in parallel on oneTBB, saved next to the file as `<file>.hidx` (written atomically) and reused
// while the file is unchanged (same size, mtime and XXH3-128 of its first and last 64 KiB).
// Records are std::string_views into the mapping (zero copy); csv_split() unquotes a CSV record's
// fields into a caller-provided buffer.
//
// Record rules (docs/data.md):
//  - A record ends at '\n' (for CSV: a '\n' outside quotes) or at the end of the file; a last line
//    without a newline is a record. A '\r' before the '\n' (CRLF) is not part of the record.
//  - text: every line is a record, an empty line too. csv and jsonl: empty lines (nothing but an
//    optional '\r') are skipped.
//  - A UTF-8 byte order mark at the start of the file is skipped. Bytes are returned as they are:
//    invalid UTF-8 is not checked or repaired.
//  - CSV quoting: every '"' flips "inside quotes" (a doubled quote "" inside a quoted field flips
//    twice, so newlines inside quoted fields stay inside the record). A file that ends inside
//    quotes is refused with the offset of its last record.
//  - jsonl: a record is not parsed when read; json(i) parses one and names the record on error.
//
// The parallel scan: the file's data extents (holes of a sparse file hold only zero bytes, hence
// no '\n' or '"', and are skipped) are cut into chunks scanned concurrently. For CSV each chunk
// keeps two candidate lists: the record starts it would have if it began outside quotes and those
// if it began inside; the quote parity of the chunks before it (an in-order prefix) picks one. The
// result is identical to a sequential scan and to a scan with any thread count or chunk size.
// The chunk scans are vectorized: per 64-byte block, a bitmask of '\n' whose set bits are the
// record starts (text and JSON Lines, detail/line_scan.hpp), for CSV with a bitmask of '"' and
// the quote state by a prefix XOR (detail/csv_scan.hpp); SSE2, AVX2 or AVX-512 chosen at run
// time. HONE_ISA or hone::force_isa (core/isa.hpp) caps them as it does hone's other host loops.
#pragma once

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/isa.hpp"
#include "hone/data/detail/csv_scan.hpp"
#include "hone/data/detail/line_scan.hpp"
#include "hone/io/error.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/hash.hpp"
#include "hone/io/json.hpp"

HONE_NAMESPACE_BEGIN
namespace data {

/// How a file is cut into records.
enum class line_format : std::uint8_t {
  text = 1,   // one record per line, empty lines included
  csv = 2,    // RFC 4180 records (quoted fields may hold newlines); empty lines skipped
  jsonl = 3,  // JSON Lines: one JSON value per line; empty lines skipped
};

[[nodiscard]] constexpr std::string_view format_name(line_format f) noexcept {
  switch (f) {
    case line_format::text:
      return "text";
    case line_format::csv:
      return "csv";
    case line_format::jsonl:
      return "jsonl";
  }
  return "unknown";
}

/// What to do with a saved index.
enum class index_policy {
  reuse_or_rebuild,  // reuse a valid saved index; rebuild (and save) a missing or stale one
  rebuild,           // always scan the file (and save the result)
  require_valid,  // reuse a valid saved index; a missing or stale one is a hone::io::format_error
};

struct line_dataset_options {
  index_policy policy = index_policy::reuse_or_rebuild;
  bool save_index = true;  // write the index next to the file (or index_path)
  std::optional<std::filesystem::path> index_path{};  // default: "<file>.hidx"
  std::size_t threads = 0;                            // 0: oneTBB's default concurrency
  std::size_t chunk_bytes = std::size_t{4} << 20;     // bytes per scanned chunk (>= 1)
};

namespace detail {

inline constexpr char hidx_magic[8] = {'H', 'O', 'N', 'E', 'H', 'I', 'D', 'X'};
inline constexpr std::uint32_t hidx_version = 1;
// magic 8, version 4, format 1, pad 3, size 8, mtime 8, head/tail hash 16, data begin 8, count 8
inline constexpr std::size_t hidx_header_bytes = 64;
inline constexpr std::size_t head_tail_bytes = std::size_t{64} << 10;

/// Where the records start: after a UTF-8 byte order mark, if there is one.
[[nodiscard]] inline std::uint64_t data_begin(std::string_view s) noexcept {
  return (s.size() >= 3 && s.substr(0, 3) == "\xEF\xBB\xBF") ? 3 : 0;
}

/// Whether a record starts at `p` (a line start) in format `f`.
[[nodiscard]] inline bool keeps(line_format f, std::string_view s, std::uint64_t p) noexcept {
  if (p >= s.size()) return false;
  return f == line_format::text || !empty_line_at(s, p);
}

/// One scanned chunk's record starts: for CSV, [0] if the chunk began outside quotes and [1] if
/// inside; `odd` is whether the chunk holds an odd number of '"'.
struct chunk_scan {
  std::vector<std::uint64_t> starts[2];
  bool odd = false;
};

/// The scan kernel build_line_index runs for format `f` under the active target `t`.
[[nodiscard]] inline isa scan_kernel(line_format f, isa t) noexcept {
  return f == line_format::csv ? csv_scan_kernel(t) : line_scan_kernel(t);
}

/// Scans [b, e) of `s`: every '\n' at q there makes q + 1 a candidate record start (kept as
/// keeps() says). CSV runs csv kernel `kernel` (detail/csv_scan.hpp), text and JSON Lines line
/// kernel `kernel` (detail/line_scan.hpp).
inline void scan_chunk(line_format f, std::string_view s, std::uint64_t b, std::uint64_t e,
                       chunk_scan& out, isa kernel = isa::scalar) {
  if (f != line_format::csv) {
    line_scan(kernel, f == line_format::jsonl, s, b, e, out.starts[0]);
    return;
  }
  out.odd = csv_scan(kernel, s, b, e, out.starts);
}

/// The data extents of an open file (SEEK_DATA/SEEK_HOLE); the whole [0, size) where the file
/// system cannot tell.
[[nodiscard]] inline std::vector<std::pair<std::uint64_t, std::uint64_t>> data_extents(
    int fd, std::uint64_t size) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  std::uint64_t pos = 0;
  while (pos < size) {
    const ::off_t d = ::lseek(fd, static_cast<::off_t>(pos), SEEK_DATA);
    if (d < 0) {
      if (errno == ENXIO) break;  // only a hole from pos to the end
      return {{0, size}};         // SEEK_DATA unsupported: scan everything
    }
    const ::off_t h = ::lseek(fd, d, SEEK_HOLE);
    if (h < 0) return {{0, size}};
    const auto db = static_cast<std::uint64_t>(d);
    const auto he = std::min<std::uint64_t>(static_cast<std::uint64_t>(h), size);
    if (he <= db) break;
    out.emplace_back(db, he);
    pos = he;
  }
  return out;
}

/// The sequential reference: one pass over [begin, size) with the same rules.
[[nodiscard]] inline std::vector<std::uint64_t> sequential_index(line_format f,
                                                                 std::string_view s) {
  std::vector<std::uint64_t> out;
  const std::uint64_t begin = data_begin(s);
  if (keeps(f, s, begin)) out.push_back(begin);
  bool quoted = false;
  for (std::uint64_t q = begin; q < s.size(); ++q) {
    if (f == line_format::csv && s[q] == '"') quoted = !quoted;
    if (s[q] == '\n' && !quoted && keeps(f, s, q + 1)) out.push_back(q + 1);
  }
  return out;
}

}  // namespace detail

/// Record starts of `s` (a whole file's bytes) in format `f`, scanned in parallel over the byte
/// ranges `extents` (ascending, disjoint; bytes outside them must be zero) in chunks of
/// `chunk_bytes` with at most `threads` threads (0: oneTBB's default). `what` names the file in
/// errors. Identical to a sequential scan whatever the chunk size and thread count.
[[nodiscard]] inline std::vector<std::uint64_t> build_line_index(
    line_format f, std::string_view s,
    const std::vector<std::pair<std::uint64_t, std::uint64_t>>& extents, std::size_t chunk_bytes,
    std::size_t threads, std::string_view what = "the data") {
  if (chunk_bytes == 0) {
    throw config_error("hone: line_dataset_options::chunk_bytes is 0; give it at least 1 byte");
  }
  const std::uint64_t begin = detail::data_begin(s);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> chunks;
  for (auto [b, e] : extents) {
    b = std::max(b, begin);
    e = std::min<std::uint64_t>(e, s.size());
    for (std::uint64_t p = b; p < e; p += chunk_bytes) {
      chunks.emplace_back(p, std::min<std::uint64_t>(e, p + chunk_bytes));
    }
  }
  std::vector<detail::chunk_scan> scans(chunks.size());
  const isa kernel = detail::scan_kernel(f, active_isa());
  auto body = [&] {
    tbb::parallel_for(std::size_t{0}, chunks.size(), [&](std::size_t c) {
      detail::scan_chunk(f, s, chunks[c].first, chunks[c].second, scans[c], kernel);
    });
  };
  if (threads == 0) {
    body();
  } else {
    tbb::task_arena arena(static_cast<int>(std::min<std::size_t>(threads, 1U << 16)));
    arena.execute(body);
  }
  std::vector<std::uint64_t> out;
  std::size_t total = detail::keeps(f, s, begin) ? 1 : 0;
  bool quoted = false;
  for (const auto& sc : scans) {
    total += sc.starts[quoted ? 1 : 0].size();
    quoted = quoted != sc.odd;
  }
  if (quoted) {
    throw io::format_error("hone: the CSV file " + std::string(what) +
                           " ends inside a quoted field (an opening '\"' has no closing one); "
                           "close the quote or escape it as \"\"");
  }
  out.reserve(total);
  if (detail::keeps(f, s, begin)) out.push_back(begin);
  quoted = false;
  for (const auto& sc : scans) {
    const auto& v = sc.starts[quoted ? 1 : 0];
    out.insert(out.end(), v.begin(), v.end());
    quoted = quoted != sc.odd;
  }
  return out;
}

/// The end (exclusive, before a CRLF's '\r') of the record starting at `p`.
[[nodiscard]] inline std::uint64_t record_end(line_format f, std::string_view s,
                                              std::uint64_t p) noexcept {
  std::uint64_t e = s.size();
  if (f == line_format::csv) {
    bool quoted = false;
    for (std::uint64_t q = p; q < s.size(); ++q) {
      if (s[q] == '"') {
        quoted = !quoted;
      } else if (s[q] == '\n' && !quoted) {
        e = q;
        break;
      }
    }
  } else if (p < s.size()) {
    const void* hit = std::memchr(s.data() + p, '\n', s.size() - p);
    if (hit != nullptr) e = static_cast<std::uint64_t>(static_cast<const char*>(hit) - s.data());
  }
  if (e > p && s[e - 1] == '\r') --e;
  return e;
}

/// Splits one CSV record into fields: quotes removed, "" inside quotes made one '"'. The unquoted
/// bytes go to `buffer` (resized; reuse it across calls) and `fields` (cleared) holds views into
/// it, valid until `buffer` changes. A '"' outside quotes starts a quoted part even mid-field (a
/// lenient reading of text RFC 4180 does not allow); bytes after a closing quote are kept.
inline void csv_split(std::string_view record, std::string& buffer,
                      std::vector<std::string_view>& fields) {
  buffer.resize(record.size());
  fields.clear();
  std::vector<std::pair<std::size_t, std::size_t>> bounds;
  std::size_t w = 0;
  std::size_t field_begin = 0;
  bool quoted = false;
  for (std::size_t i = 0; i < record.size(); ++i) {
    const char c = record[i];
    if (c == '"') {
      if (quoted && i + 1 < record.size() && record[i + 1] == '"') {
        buffer[w++] = '"';
        ++i;
      } else {
        quoted = !quoted;
      }
    } else if (c == ',' && !quoted) {
      bounds.emplace_back(field_begin, w);
      field_begin = w;
    } else {
      buffer[w++] = c;
    }
  }
  bounds.emplace_back(field_begin, w);
  buffer.resize(w);
  fields.reserve(bounds.size());
  for (const auto& [b, e] : bounds) fields.emplace_back(buffer.data() + b, e - b);
}

/// A lazy dataset over a text, CSV or JSON Lines file. Holds the mapping and 8 bytes per record.
class line_dataset {
 public:
  using buffer_type = std::string;

  line_dataset(std::filesystem::path path, line_format format, line_dataset_options opt = {})
      : path_(std::move(path)), format_(format) {
    if (format != line_format::text && format != line_format::csv && format != line_format::jsonl) {
      throw config_error("hone: line_dataset for '" + path_.string() +
                         "' was given an unknown line_format; use text, csv or jsonl");
    }
    index_path_ =
        opt.index_path ? *opt.index_path : std::filesystem::path(path_.string() + ".hidx");
    io::input_file in(path_);
    map_ = io::mapped_file(path_);
    if (map_.size() != in.size()) {
      throw io::format_error("hone: '" + path_.string() +
                             "' changed size while being opened; open it again once it is "
                             "written completely");
    }
    stamp_ = current_stamp();
    bool loaded = false;
    if (opt.policy != index_policy::rebuild) {
      std::string why;
      loaded = load_index(why);
      if (!loaded && opt.policy == index_policy::require_valid) {
        throw io::format_error("hone: the index '" + index_path_.string() +
                               "' cannot be used for '" + path_.string() + "': " + why +
                               "; open it with index_policy::reuse_or_rebuild to rebuild it, or "
                               "delete the index");
      }
    }
    if (!loaded) {
      offsets_ =
          build_line_index(format_, text(), detail::data_extents(in.native_handle(), size_bytes()),
                           opt.chunk_bytes, opt.threads, "'" + path_.string() + "'");
      if (opt.save_index) save_index();
    }
    rebuilt_ = !loaded;
  }

  /// Number of records.
  [[nodiscard]] std::size_t size() const noexcept { return offsets_.size(); }
  /// Record `i` as a view into the mapping (no '\n', no CRLF '\r'; CSV quotes kept).
  [[nodiscard]] std::string_view get(std::size_t i) const {
    check(i);
    const std::uint64_t b = offsets_[i];
    const std::uint64_t e = record_end(format_, text(), b);
    return text().substr(static_cast<std::size_t>(b), static_cast<std::size_t>(e - b));
  }
  [[nodiscard]] std::string_view operator[](std::size_t i) const { return get(i); }
  /// Copies record `i` into `buffer` (the dataset concept's caller-buffer form).
  void get(std::size_t i, std::string& buffer) const { buffer.assign(get(i)); }
  /// Byte offset of record `i` in the file.
  [[nodiscard]] std::uint64_t offset(std::size_t i) const {
    check(i);
    return offsets_[i];
  }
  /// CSV fields of record `i` (see csv_split).
  void fields(std::size_t i, std::string& buffer, std::vector<std::string_view>& out) const {
    csv_split(get(i), buffer, out);
  }
  /// Parses record `i` as JSON; a hone::io::format_error naming the file, record and offset if it
  /// is not valid JSON.
  [[nodiscard]] io::json::value json(std::size_t i) const {
    const std::string context = "'" + path_.string() + "' record " + std::to_string(i) +
                                " at byte " + std::to_string(offset(i));
    return io::json::parse(get(i), context);
  }

  [[nodiscard]] std::span<const std::uint64_t> offsets() const noexcept { return offsets_; }
  [[nodiscard]] line_format format() const noexcept { return format_; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  [[nodiscard]] const std::filesystem::path& index_path() const noexcept { return index_path_; }
  /// Whether the index was scanned (true) or loaded from the saved index (false).
  [[nodiscard]] bool index_rebuilt() const noexcept { return rebuilt_; }
  [[nodiscard]] std::uint64_t size_bytes() const noexcept { return map_.size(); }

 private:
  struct stamp {
    std::uint64_t size = 0;
    std::int64_t mtime_ns = 0;
    io::digest128 head_tail{};
  };

  [[nodiscard]] std::string_view text() const noexcept {
    const auto b = map_.bytes();
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }
  void check(std::size_t i) const {
    if (i >= offsets_.size()) {
      throw config_error("hone: record " + std::to_string(i) + " of '" + path_.string() +
                         "' does not exist: it has " + std::to_string(offsets_.size()) +
                         " records (indices 0 to size() - 1)");
    }
  }
  [[nodiscard]] stamp current_stamp() const {
    stamp st;
    st.size = map_.size();
    struct ::stat sb {};
    if (::stat(path_.c_str(), &sb) != 0) io::throw_io_error("stat", path_, errno);
    st.mtime_ns = static_cast<std::int64_t>(sb.st_mtim.tv_sec) * 1000000000 + sb.st_mtim.tv_nsec;
    const auto b = map_.bytes();
    const std::size_t n = std::min(b.size(), detail::head_tail_bytes);
    io::hasher h;
    h.update(b.first(n));
    h.update(b.last(n));
    st.head_tail = h.digest();
    return st;
  }

  static void put64(std::string& out, std::uint64_t v) {
    char b[8];
    std::memcpy(b, &v, 8);
    out.append(b, 8);
  }
  static std::uint64_t get64(std::span<const std::byte> b, std::size_t at) {
    std::uint64_t v;
    std::memcpy(&v, b.data() + at, 8);
    return v;
  }

  void save_index() const {
    std::string head;
    head.append(detail::hidx_magic, 8);
    const std::uint32_t version = detail::hidx_version;
    head.append(reinterpret_cast<const char*>(&version), 4);
    head.push_back(static_cast<char>(format_));
    head.append(3, '\0');
    put64(head, stamp_.size);
    put64(head, static_cast<std::uint64_t>(stamp_.mtime_ns));
    head.append(reinterpret_cast<const char*>(stamp_.head_tail.bytes.data()), 16);
    put64(head, detail::data_begin(text()));
    put64(head, offsets_.size());
    const auto body = std::as_bytes(std::span(offsets_));
    io::hasher h;
    h.update(std::as_bytes(std::span(head.data(), head.size())));
    h.update(body);
    const io::digest128 sum = h.digest();
    const std::filesystem::path tmp =
        index_path_.string() + ".tmp." + std::to_string(static_cast<long>(::getpid()));
    try {
      io::output_file out(tmp, io::create_mode::truncate, io::write_hashing::off);
      out.write(head);
      out.write(body);
      out.write(std::as_bytes(std::span(sum.bytes)));
      out.sync();
      out.close();
      io::rename_path(tmp, index_path_);
    } catch (...) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw;
    }
    const auto dir = index_path_.parent_path();
    io::sync_directory(dir.empty() ? std::filesystem::path(".") : dir);
  }

  // Loads the saved index if it exists and matches the file; otherwise says why in `why`.
  bool load_index(std::string& why) {
    std::error_code ec;
    if (!std::filesystem::exists(index_path_, ec)) {
      why = "it does not exist";
      return false;
    }
    io::mapped_file m(index_path_);
    const auto b = m.bytes();
    if (b.size() < detail::hidx_header_bytes + 16 ||
        std::memcmp(b.data(), detail::hidx_magic, 8) != 0) {
      why = "it is not a hone line index (too short or wrong magic bytes)";
      return false;
    }
    std::uint32_t version;
    std::memcpy(&version, b.data() + 8, 4);
    if (version != detail::hidx_version) {
      why = "its version is " + std::to_string(version) + ", this hone reads version " +
            std::to_string(detail::hidx_version);
      return false;
    }
    if (static_cast<line_format>(b[12]) != format_) {
      why = "it indexes the file as another format than " + std::string(format_name(format_));
      return false;
    }
    const std::uint64_t count = get64(b, 56);
    if (count > (b.size() - detail::hidx_header_bytes - 16) / 8 ||
        detail::hidx_header_bytes + count * 8 + 16 != b.size()) {
      why = "its size " + std::to_string(b.size()) + " does not match its record count " +
            std::to_string(count) + " (the index is truncated or damaged)";
      return false;
    }
    io::hasher h;
    h.update(b.first(detail::hidx_header_bytes + count * 8));
    if (std::memcmp(h.digest().bytes.data(), b.data() + b.size() - 16, 16) != 0) {
      why = "its checksum does not match its content (the index is damaged)";
      return false;
    }
    const std::uint64_t size = get64(b, 16);
    const auto mtime = static_cast<std::int64_t>(get64(b, 24));
    if (size != stamp_.size) {
      why = "the file's size changed from " + std::to_string(size) + " to " +
            std::to_string(stamp_.size) + " bytes since the index was built";
      return false;
    }
    if (mtime != stamp_.mtime_ns) {
      why = "the file's modification time changed since the index was built";
      return false;
    }
    if (std::memcmp(b.data() + 32, stamp_.head_tail.bytes.data(), 16) != 0) {
      why =
          "the file's content (the hash of its first and last 64 KiB) changed since the index "
          "was built";
      return false;
    }
    offsets_.resize(static_cast<std::size_t>(count));
    std::memcpy(offsets_.data(), b.data() + detail::hidx_header_bytes, count * 8);
    for (std::size_t i = 0; i < offsets_.size(); ++i) {
      if (offsets_[i] >= stamp_.size || (i > 0 && offsets_[i] <= offsets_[i - 1])) {
        offsets_.clear();
        why =
            "its offset of record " + std::to_string(i) + " is out of order or past the file's end";
        return false;
      }
    }
    return true;
  }

  std::filesystem::path path_;
  std::filesystem::path index_path_;
  line_format format_;
  io::mapped_file map_;
  stamp stamp_{};
  std::vector<std::uint64_t> offsets_;
  bool rebuilt_ = false;
};

}  // namespace data
HONE_NAMESPACE_END
