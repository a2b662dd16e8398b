// hone/serve/prediction_cache_disk.hpp: the optional disk tier of hone::serve::prediction_cache
// (prediction_cache.hpp): entries spilled from RAM, one file each, zstd-compressed and checksummed
// with XXH3-64, written atomically (a temporary sibling renamed into place), within a byte budget
// (the oldest file goes first). A file that is damaged, truncated, of another format, of another
// model version or for another input is never served: it is a miss, and (except a valid entry of
// another input under a colliding name) it is removed and counted. docs/serve.md, "Prediction
// cache", gives the file format.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/directory.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/hash.hpp"

HONE_NAMESPACE_BEGIN
namespace serve {

/// The 128-bit key of a cached prediction: a hash of (model version, input bytes). Equal keys do
/// not make equal requests: every hit is confirmed by comparing the stored version and input.
struct prediction_key {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  friend bool operator==(const prediction_key&, const prediction_key&) = default;
  /// 32 lowercase hexadecimal digits, `hi` first (the name of the key's file on disk).
  [[nodiscard]] std::string hex() const { return io::hex64(hi) + io::hex64(lo); }
};

namespace detail {

struct prediction_key_hash {
  std::size_t operator()(const prediction_key& k) const noexcept {
    return static_cast<std::size_t>(k.lo);
  }
};

/// The entry file: a 56-byte header, the zstd frame of (input bytes, encoded output), and the
/// XXH3-64 of everything before it (8 bytes). Integers are little-endian as the host writes them
/// (the magic's last byte is 'L'; a big-endian file would not match it).
inline constexpr char pc_magic[8] = {'H', 'O', 'N', 'E', 'P', 'C', '1', 'L'};
inline constexpr std::size_t pc_header_bytes = 56;
inline constexpr std::size_t pc_trailer_bytes = 8;
inline constexpr std::string_view pc_suffix = ".hpc";
/// An input or output larger than this in a header is taken as damage, not as a size to allocate.
inline constexpr std::uint64_t pc_max_part_bytes = std::uint64_t{1} << 34;

struct pc_header {
  std::uint64_t version = 0;
  std::int64_t expiry = 0;  // the clock's ticks since its epoch; 0: no TTL
  std::uint64_t input_bytes = 0;
  std::uint64_t output_bytes = 0;
  std::uint64_t frame_bytes = 0;
  std::uint64_t reserved = 0;
};

inline void pc_put64(std::byte* p, std::uint64_t v) noexcept {
  std::memcpy(p, &v, 8);
}
inline std::uint64_t pc_get64(const std::byte* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

/// What a lookup on disk found.
enum class disk_outcome { absent, hit, collision, expired, damaged };

struct disk_counters {
  std::uint64_t hits = 0;          // entries read back, confirmed and promoted to RAM
  std::uint64_t writes = 0;        // entries written (spilled from RAM)
  std::uint64_t write_errors = 0;  // spills lost to a failing write (disk full, permissions)
  std::uint64_t evictions = 0;     // files removed for the byte budget or a newer version
  std::uint64_t damaged = 0;     // files damaged, truncated, foreign or of another version: removed
  std::uint64_t collisions = 0;  // valid entries of another input under the looked-up key
  std::uint64_t expired = 0;     // files past their TTL: removed
  std::uint64_t files = 0;
  std::uint64_t bytes = 0;
};

/// The disk tier: an index (key -> file size, age, version) under one mutex; files are written and
/// read outside it, renamed into place and removed under it (so the index and the directory agree).
class prediction_disk_tier {
 public:
  prediction_disk_tier(std::filesystem::path dir, std::uint64_t budget_bytes, int zstd_level)
      : dir_(std::move(dir)), budget_(budget_bytes), level_(zstd_level) {
    io::ensure_directory(dir_);
    scan();
  }

  /// Writes one entry (outside the lock), then renames it into place and evicts the oldest files
  /// beyond the budget. A failing write is counted, never thrown: a spill is an optimization.
  void store(const prediction_key& key, std::uint64_t version, std::int64_t expiry,
             std::span<const std::byte> input, std::span<const std::byte> output) {
    const std::filesystem::path final_path = path_of(key);
    std::filesystem::path temp;
    std::uint64_t size = 0;
    try {
      const std::vector<std::byte> file = encode(version, expiry, input, output);
      size = file.size();
      if (size > budget_) return;
      temp = io::temp_sibling(final_path, std::to_string(next_temp_.fetch_add(1)) + "-");
      io::write_file(temp, std::span<const std::byte>(file), /*sync=*/false);
    } catch (const std::exception&) {
      std::error_code ec;
      if (!temp.empty()) std::filesystem::remove(temp, ec);
      const std::lock_guard lock(mutex_);
      ++c_.write_errors;
      return;
    }
    const std::lock_guard lock(mutex_);
    if (::rename(temp.c_str(), final_path.c_str()) != 0) {
      std::error_code ec;
      std::filesystem::remove(temp, ec);
      ++c_.write_errors;
      return;
    }
    forget_locked(key);
    index_.emplace(key, file_info{size, seq_, version});
    age_.emplace(seq_++, key);
    c_.bytes += size;
    ++c_.files;
    ++c_.writes;
    while (c_.bytes > budget_ && !age_.empty()) {
      remove_locked(age_.begin()->second);
      ++c_.evictions;
    }
  }

  /// Looks `key` up; on a hit (version, input and TTL confirmed, checksum good) returns the
  /// encoded output in `output` and removes the file (the entry moves to RAM).
  disk_outcome load(const prediction_key& key, std::uint64_t version,
                    std::span<const std::byte> input, bool ttl, std::int64_t now,
                    std::int64_t ttl_ticks, std::vector<std::byte>& output) {
    std::uint64_t seq;
    {
      const std::lock_guard lock(mutex_);
      const auto it = index_.find(key);
      if (it == index_.end()) return disk_outcome::absent;
      seq = it->second.seq;
    }
    std::vector<std::byte> file;
    if (!read_whole(path_of(key), file)) return disk_outcome::absent;  // removed meanwhile
    const disk_outcome r = decode(file, version, input, ttl, now, ttl_ticks, output);
    const std::lock_guard lock(mutex_);
    const auto it = index_.find(key);
    const bool same = it != index_.end() && it->second.seq == seq;
    switch (r) {
      case disk_outcome::hit:
        ++c_.hits;
        break;
      case disk_outcome::collision:
        ++c_.collisions;
        return r;  // a valid entry: kept
      case disk_outcome::expired:
        ++c_.expired;
        break;
      case disk_outcome::damaged:
        ++c_.damaged;
        break;
      case disk_outcome::absent:
        return r;
    }
    if (same) remove_locked(key);
    return r;
  }

  /// A hit whose output the cache then could not decode (a file of another output type): it
  /// counts as damaged, not as a hit (its file is already removed).
  void hit_was_damaged() {
    const std::lock_guard lock(mutex_);
    --c_.hits;
    ++c_.damaged;
  }

  /// Removes the files of versions before `version` whose version is known (written by this
  /// process); the others are never served and leave with the budget.
  void drop_older(std::uint64_t version) {
    const std::lock_guard lock(mutex_);
    std::vector<prediction_key> old;
    for (const auto& [k, f] : index_) {
      if (f.known_version && f.version < version) old.push_back(k);
    }
    for (const auto& k : old) {
      remove_locked(k);
      ++c_.evictions;
    }
  }

  [[nodiscard]] disk_counters counters() const {
    const std::lock_guard lock(mutex_);
    return c_;
  }
  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_; }
  [[nodiscard]] std::filesystem::path path_of(const prediction_key& key) const {
    return dir_ / (key.hex() + std::string(pc_suffix));
  }

 private:
  struct file_info {
    std::uint64_t size = 0;
    std::uint64_t seq = 0;
    std::uint64_t version = 0;
    bool known_version = true;
  };

  std::vector<std::byte> encode(std::uint64_t version, std::int64_t expiry,
                                std::span<const std::byte> input,
                                std::span<const std::byte> output) const {
    std::vector<std::byte> raw(input.size() + output.size());
    if (!input.empty()) std::memcpy(raw.data(), input.data(), input.size());
    if (!output.empty()) std::memcpy(raw.data() + input.size(), output.data(), output.size());
    std::vector<std::byte> file(pc_header_bytes + ZSTD_compressBound(raw.size()) +
                                pc_trailer_bytes);
    const std::size_t frame = ZSTD_compress(file.data() + pc_header_bytes,
                                            file.size() - pc_header_bytes - pc_trailer_bytes,
                                            raw.data(), raw.size(), level_);
    if (ZSTD_isError(frame)) {
      throw error(std::string("hone: zstd compression failed: ") + ZSTD_getErrorName(frame));
    }
    std::memcpy(file.data(), pc_magic, 8);
    pc_put64(file.data() + 8, version);
    pc_put64(file.data() + 16, static_cast<std::uint64_t>(expiry));
    pc_put64(file.data() + 24, input.size());
    pc_put64(file.data() + 32, output.size());
    pc_put64(file.data() + 40, frame);
    pc_put64(file.data() + 48, 0);
    const std::size_t body = pc_header_bytes + frame;
    pc_put64(file.data() + body, io::hash64(std::span<const std::byte>(file.data(), body)));
    file.resize(body + pc_trailer_bytes);
    return file;
  }

  /// Checks everything before trusting anything: size, checksum, magic, sizes, the zstd frame's
  /// exact length, then version, TTL and the full input.
  static disk_outcome decode(std::span<const std::byte> file, std::uint64_t version,
                             std::span<const std::byte> input, bool ttl, std::int64_t now,
                             std::int64_t ttl_ticks, std::vector<std::byte>& output) {
    if (file.size() < pc_header_bytes + pc_trailer_bytes) return disk_outcome::damaged;
    const std::size_t body = file.size() - pc_trailer_bytes;
    if (io::hash64(file.first(body)) != pc_get64(file.data() + body)) return disk_outcome::damaged;
    if (std::memcmp(file.data(), pc_magic, 8) != 0) return disk_outcome::damaged;
    pc_header h;
    h.version = pc_get64(file.data() + 8);
    h.expiry = static_cast<std::int64_t>(pc_get64(file.data() + 16));
    h.input_bytes = pc_get64(file.data() + 24);
    h.output_bytes = pc_get64(file.data() + 32);
    h.frame_bytes = pc_get64(file.data() + 40);
    if (h.frame_bytes != body - pc_header_bytes || h.input_bytes > pc_max_part_bytes ||
        h.output_bytes > pc_max_part_bytes) {
      return disk_outcome::damaged;
    }
    if (h.version != version) return disk_outcome::damaged;  // foreign: never another version's
    // Expired, or an expiry further away than the TTL allows (a clock whose epoch changed since
    // the file was written, e.g. steady_clock across a reboot).
    if (ttl && (h.expiry <= now || h.expiry - now > ttl_ticks)) return disk_outcome::expired;
    if (h.input_bytes != input.size()) return disk_outcome::collision;
    std::vector<std::byte> raw(static_cast<std::size_t>(h.input_bytes + h.output_bytes));
    const std::size_t n = ZSTD_decompress(raw.data(), raw.size(), file.data() + pc_header_bytes,
                                          static_cast<std::size_t>(h.frame_bytes));
    if (ZSTD_isError(n) || n != raw.size()) return disk_outcome::damaged;
    if (!input.empty() && std::memcmp(raw.data(), input.data(), input.size()) != 0) {
      return disk_outcome::collision;
    }
    output.assign(raw.begin() + static_cast<std::ptrdiff_t>(input.size()), raw.end());
    return disk_outcome::hit;
  }

  /// The whole file in `out`, or false when there is no file to read (`out` empty). The answer
  /// comes from the open(2) call itself, never from a second look at the name: a lookup runs
  /// outside the lock, so between a failed open and a later check another thread's load or
  /// eviction may have removed the file and a store renamed a new one into place; asking "does it
  /// exist?" then said yes and a vanished file was counted as damage. ENOENT is a file removed
  /// meanwhile (or never there); EMFILE, ENFILE and ENOMEM are this process's limits, not the
  /// file's: a miss that keeps the file. Any other failure (a name that is no regular file, a
  /// permission, a read error, a file that ends early) reads as damage: `out` empty, which
  /// decode() rejects. An open file is read through its descriptor, so a rename or removal of the
  /// name meanwhile cannot mix two files.
  static bool read_whole(const std::filesystem::path& p, std::vector<std::byte>& out) {
    out.clear();
    int raw;
    do {
      raw = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    } while (raw < 0 && errno == EINTR);
    if (raw < 0) {
      const int err = errno;
      return !(err == ENOENT || err == EMFILE || err == ENFILE || err == ENOMEM);
    }
    const io::unique_fd fd(raw);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 ||
        static_cast<std::uint64_t>(st.st_size) > 2 * pc_max_part_bytes) {
      return true;  // out stays empty: damaged
    }
    out.resize(static_cast<std::size_t>(st.st_size));
    std::size_t done = 0;
    while (done < out.size()) {
      const std::size_t n = std::min(out.size() - done, io::max_io_bytes);
      const ::ssize_t r = ::pread(fd.get(), out.data() + done, n, static_cast<::off_t>(done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {  // a read error, or the file ends before its size
        out.clear();
        return true;
      }
      done += static_cast<std::size_t>(r);
    }
    return true;
  }

  void forget_locked(const prediction_key& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return;
    c_.bytes -= it->second.size;
    --c_.files;
    age_.erase(it->second.seq);
    index_.erase(it);
  }
  void remove_locked(const prediction_key& key) {
    std::error_code ec;
    std::filesystem::remove(path_of(key), ec);
    forget_locked(key);
  }

  /// Indexes the entry files a previous run left (oldest first by modification time), removes
  /// temporaries of writers that are gone, leaves every other file alone.
  void scan() {
    std::vector<std::pair<std::filesystem::file_time_type, std::filesystem::directory_entry>> found;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      std::error_code ec;
      if (name.starts_with(io::temp_prefix)) {
        if (!io::temp_owner_alive(name)) std::filesystem::remove(e.path(), ec);
        continue;
      }
      if (name.size() != 32 + pc_suffix.size() || !name.ends_with(pc_suffix)) continue;
      if (!e.is_regular_file(ec)) continue;
      found.emplace_back(e.last_write_time(ec), e);
    }
    std::sort(found.begin(), found.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [t, e] : found) {
      const std::string name = e.path().filename().string();
      const auto hi = io::parse_hex64(std::string_view(name).substr(0, 16));
      const auto lo = io::parse_hex64(std::string_view(name).substr(16, 16));
      if (!hi || !lo) continue;
      std::error_code ec;
      const std::uint64_t size = e.file_size(ec);
      if (ec) continue;
      const prediction_key key{*lo, *hi};
      index_.emplace(key, file_info{size, seq_, 0, false});
      age_.emplace(seq_++, key);
      c_.bytes += size;
      ++c_.files;
    }
    while (c_.bytes > budget_ && !age_.empty()) {
      remove_locked(age_.begin()->second);
      ++c_.evictions;
    }
  }

  std::filesystem::path dir_;
  std::uint64_t budget_;
  int level_;
  mutable std::mutex mutex_;
  std::unordered_map<prediction_key, file_info, prediction_key_hash> index_;
  std::map<std::uint64_t, prediction_key> age_;  // sequence number -> key, oldest first
  std::uint64_t seq_ = 0;
  std::atomic<std::uint64_t> next_temp_{0};
  disk_counters c_;
};

}  // namespace detail
}  // namespace serve
HONE_NAMESPACE_END
