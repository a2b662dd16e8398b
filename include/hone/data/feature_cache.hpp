// hone/data/feature_cache.hpp: hone::data::feature_cache, precomputed features (the output of an
// expensive per-sample transform: a decoded and resized image, a tokenized text, a spectrogram)
// kept in RAM within a byte budget, least recently used first out, and spilled to a zstd disk tier
// instead of being lost. Keyed by (sample key, transform version): a lookup at another version
// never serves the old entry. The RL state cache (hone/rl/state_cache.hpp) is built on the same
// LRU core (hone/core/detail/lru.hpp): one LRU in the library. docs/data.md, "Feature cache",
// gives the guarantees, the tests and the spill record layout.
//
//   hone::data::feature_cache<std::uint64_t, float> cache(
//       {.ram_bytes = 2ull << 30, .disk_dir = "/scratch/features", .disk_bytes = 50ull << 30});
//   const std::uint64_t version = params_hash;             // changes when the transform changes
//   hone::data::feature_ref<float> f =
//       cache.get_or_compute(i, version, [&](std::vector<float>& out) {
//         out = transform(dataset[i]);                     // runs on a miss only
//       });
//   consume(f.span());                                     // valid while f lives
//   cache.stats().hit_rate();
//
// Tiers. RAM: `shards` LRUs (8 by default), picked by the key's hash, each under its own mutex with
// ram_bytes / shards of the budget; the budget counts feature bytes (elements x sizeof(T)), not the
// bookkeeping (about 150 bytes per entry). A feature larger than its shard's budget is handed back
// without being kept in RAM (counted in `oversized`; it still goes to the disk tier). Disk (when
// `disk_dir` is given): entries evicted from RAM are appended, zstd-compressed, to one spill file
// `<disk_dir>/features-<pid>-<n>.hfc` created by this cache and removed by its destructor; an
// in-memory index maps each key to its record. A later RAM miss that finds the key on disk at the
// asked version reads the record, checks it (below) and promotes it back to RAM; the record stays
// on disk, so evicting that entry again writes nothing. The spill file is scratch space for one
// process: it is not reopened by a later run, not fsynced, and may be deleted when no process uses
// it.
//
// Disk budget: the spill file never grows past `disk_bytes`. When a record does not fit after its
// end, the file is compacted in place: the bytes of dropped records (stale, damaged, replaced) are
// reclaimed first and, when the live records plus the new one still exceed 3/4 of the budget, the
// oldest spilled records are dropped (first in, first out) until they fit in 3/4 of it (so a full
// tier compacts at most once per quarter budget of spills). A record larger than the whole budget
// is not written (`spill_skipped`).
//
// Guarantees. A lookup returns the bytes its compute function produced for that key at that
// version, or nothing: an entry of another version found in RAM or on disk is dropped and
// counted (`stale`) and the lookup is a miss; a disk record is served only when its magic, key,
// version, element size and count, frame length and the XXH3-64 of the decompressed bytes all
// match, otherwise it is dropped, counted (`corrupt`) and the feature recomputed (a truncated
// file, a flipped byte, a record of another cache). I/O errors: a disk_dir that cannot be created
// or written throws hone::io_error from the constructor; a write or read that fails later (disk
// full, file size limit, EIO) turns the disk tier off for the rest of the cache's life (RAM-only
// from then on), counted in `disk_errors`, with the reason in disk_error(); lookups go on.
//
// Threads: every member function may be called from any number of threads at once (loader
// threads sharing one cache). The compute function runs outside every lock, so two threads
// missing the same key may both compute it (the first insert wins; both count as misses). Disk
// reads and writes of the tier are serialized by one mutex; compression, decompression and
// checking run outside it.
//
// Validity of what is returned: get_or_compute returns a feature_ref<T>, which shares ownership
// of the feature's array. Its span stays valid, and its bytes unchanged, for as long as the
// feature_ref (or a copy of it) lives, whatever the cache does meanwhile (evictions, clear(), its
// destruction).
#pragma once

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/detail/lru.hpp"
#include "hone/core/error.hpp"
#include "hone/io/directory.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/hash.hpp"

HONE_NAMESPACE_BEGIN
namespace data {

/// How a feature_cache is sized. ram_bytes is required; disk_dir and disk_bytes go together.
struct feature_cache_options {
  std::size_t ram_bytes = 0;         ///< budget of the RAM tier, in feature bytes (> 0)
  std::filesystem::path disk_dir{};  ///< directory of the spill file; empty: RAM only
  std::uint64_t disk_bytes = 0;      ///< budget of the spill file (> 0 with a disk_dir)
  int zstd_level = 1;                ///< zstd level of spilled records (ZSTD_minCLevel..max)
  std::size_t shards = 8;            ///< RAM shards, each with its own mutex and 1/shards budget
};

/// What a feature_cache has done. Every lookup is exactly one of ram_hits, disk_hits, misses.
struct feature_cache_stats {
  std::uint64_t ram_hits = 0;
  std::uint64_t disk_hits = 0;  ///< read back from the spill file, checked, promoted to RAM
  std::uint64_t misses = 0;     ///< the compute function ran
  std::uint64_t stale = 0;      ///< lookups that found (and dropped) another version's entry
  std::uint64_t corrupt = 0;    ///< disk records that failed a check: dropped, recomputed
  std::uint64_t evictions = 0;  ///< entries evicted from RAM (to the disk tier when there is one)
  std::uint64_t oversized = 0;  ///< features larger than a shard's RAM budget, not kept in RAM
  std::uint64_t spills = 0;     ///< records written to the spill file
  std::uint64_t spill_skipped = 0;   ///< records larger than disk_bytes, not written
  std::uint64_t disk_evictions = 0;  ///< records dropped (oldest first) to keep within disk_bytes
  std::uint64_t compactions = 0;     ///< in-place compactions of the spill file
  std::uint64_t disk_errors = 0;     ///< I/O errors that turned the disk tier off (0 or 1)
  std::size_t ram_entries = 0;
  std::size_t ram_bytes = 0;       ///< feature bytes held in RAM (<= the RAM budget)
  std::uint64_t disk_entries = 0;  ///< records the disk index serves
  std::uint64_t disk_bytes = 0;    ///< size of the spill file (<= the disk budget)

  [[nodiscard]] std::uint64_t lookups() const noexcept { return ram_hits + disk_hits + misses; }
  /// (ram_hits + disk_hits) / lookups; 0 before the first lookup.
  [[nodiscard]] double hit_rate() const noexcept {
    const std::uint64_t n = lookups();
    return n == 0 ? 0.0 : static_cast<double>(ram_hits + disk_hits) / static_cast<double>(n);
  }
};

/// A cached feature: shares ownership of its array, so its view stays valid while it lives.
template <class T>
class feature_ref {
 public:
  feature_ref() = default;
  explicit feature_ref(std::shared_ptr<const std::vector<T>> p) noexcept : p_(std::move(p)) {}

  [[nodiscard]] std::span<const T> span() const noexcept {
    return p_ ? std::span<const T>(*p_) : std::span<const T>();
  }
  operator std::span<const T>() const noexcept { return span(); }  // NOLINT: a view of it
  [[nodiscard]] const T* data() const noexcept { return p_ ? p_->data() : nullptr; }
  [[nodiscard]] std::size_t size() const noexcept { return p_ ? p_->size() : 0; }
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }
  [[nodiscard]] const T& operator[](std::size_t i) const noexcept { return (*p_)[i]; }
  [[nodiscard]] const T* begin() const noexcept { return data(); }
  [[nodiscard]] const T* end() const noexcept { return data() + size(); }
  explicit operator bool() const noexcept { return static_cast<bool>(p_); }
  /// The shared array itself.
  [[nodiscard]] const std::shared_ptr<const std::vector<T>>& shared() const noexcept { return p_; }

 private:
  std::shared_ptr<const std::vector<T>> p_;
};

namespace detail {

/// A spilled record: a 48-byte header, the key's bytes, one zstd frame of the feature's bytes.
/// Integers in the host's byte order (the magic's last byte 'L' says little-endian, where hone
/// runs). Offsets: 0 magic, 8 u64 version, 16 u64 element count, 24 u32 element bytes, 28 u32 key
/// bytes, 32 u64 frame bytes, 40 u64 XXH3-64 of the raw feature bytes, 48 key, 48 + K frame.
inline constexpr char feature_record_magic[8] = {'H', 'O', 'N', 'E', 'F', 'C', '1', 'L'};
inline constexpr std::size_t feature_record_header_bytes = 48;

inline void fc_put64(std::byte* p, std::uint64_t v) noexcept {
  std::memcpy(p, &v, 8);
}
inline void fc_put32(std::byte* p, std::uint32_t v) noexcept {
  std::memcpy(p, &v, 4);
}
inline std::uint64_t fc_get64(const std::byte* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline std::uint32_t fc_get32(const std::byte* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

/// Per-thread zstd contexts (a spill or a promotion runs on the thread that evicted or missed).
inline ZSTD_CCtx* fc_cctx() {
  struct holder {
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ~holder() { ZSTD_freeCCtx(c); }
  };
  thread_local holder h;
  if (h.c == nullptr)
    throw allocation_error("hone::data::feature_cache: ZSTD_createCCtx failed", 0);
  return h.c;
}
inline ZSTD_DCtx* fc_dctx() {
  struct holder {
    ZSTD_DCtx* c = ZSTD_createDCtx();
    ~holder() { ZSTD_freeDCtx(c); }
  };
  thread_local holder h;
  if (h.c == nullptr)
    throw allocation_error("hone::data::feature_cache: ZSTD_createDCtx failed", 0);
  return h.c;
}

/// A process-wide number making each cache's spill file name unique.
inline std::uint64_t next_feature_spill_serial() noexcept {
  static std::atomic<std::uint64_t> next{0};
  return next.fetch_add(1, std::memory_order_relaxed);
}

/// What the disk tier found for a lookup.
enum class spill_outcome { absent, hit, stale, corrupt };

/// The disk tier: one append-only spill file and its index, under one mutex.
template <class Key, class T, class Hash>
class feature_spill {
 public:
  feature_spill(const std::filesystem::path& dir, std::uint64_t budget, int level)
      : budget_(budget), level_(level) {
    try {
      io::ensure_directory(dir);
      for (int attempt = 0;; ++attempt) {
        path_ = dir / ("features-" + std::to_string(::getpid()) + "-" +
                       std::to_string(next_feature_spill_serial()) + ".hfc");
        const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) {
          fd_ = io::unique_fd(fd);
          break;
        }
        if (errno != EEXIST || attempt >= 1000) io::throw_io_error("create", path_, errno);
      }
    } catch (const io_error& e) {
      throw io_error(std::string("hone::data::feature_cache: the disk tier cannot use '") +
                     dir.string() + "' (" + e.what() +
                     "); give a writable disk_dir, or none for a RAM-only cache");
    }
  }
  ~feature_spill() { close_and_remove(); }
  feature_spill(const feature_spill&) = delete;
  feature_spill& operator=(const feature_spill&) = delete;

  /// Looks `key` up at `version`. On a hit `out` holds the checked feature. A record of another
  /// version is dropped (stale); a record failing any check is dropped and counted (corrupt).
  spill_outcome load(const Key& key, std::uint64_t version, std::vector<T>& out) {
    std::vector<std::byte> rec;
    record r;
    {
      const std::lock_guard lock(mutex_);
      if (!fd_) return spill_outcome::absent;
      const auto it = index_.find(key);
      if (it == index_.end()) return spill_outcome::absent;
      if (it->second.version != version) {
        drop_locked(it);
        return spill_outcome::stale;
      }
      r = it->second;
      rec.resize(static_cast<std::size_t>(r.bytes));
      const read_result rr = read_locked(r.offset, rec);
      if (rr == read_result::error) return spill_outcome::absent;  // the tier is off now
      if (rr == read_result::short_read) {
        drop_locked(it);
        ++corrupt_;
        return spill_outcome::corrupt;
      }
    }
    if (decode(rec, key, r, out)) return spill_outcome::hit;
    const std::lock_guard lock(mutex_);
    const auto it = index_.find(key);
    if (it != index_.end() && it->second.serial == r.serial) drop_locked(it);
    ++corrupt_;
    return spill_outcome::corrupt;
  }

  /// Writes `feature` as key's record at `version` unless that record is on disk already. Never
  /// throws: a failure turns the tier off (disk_error()).
  void store(const Key& key, std::uint64_t version, const std::vector<T>& feature) noexcept {
    try {
      {
        const std::lock_guard lock(mutex_);
        if (!fd_) return;
        const auto it = index_.find(key);
        if (it != index_.end() && it->second.version == version) return;
      }
      std::vector<std::byte> rec = encode(key, version, feature);  // outside the lock
      const std::lock_guard lock(mutex_);
      if (!fd_) return;
      if (auto it = index_.find(key); it != index_.end()) {
        if (it->second.version == version) return;  // another thread spilled it meanwhile
        drop_locked(it);                            // another version: obsolete now
      }
      if (rec.size() > budget_) {
        ++spill_skipped_;
        return;
      }
      if (end_ + rec.size() > budget_ && !compact_locked(rec.size())) return;
      if (!write_locked(end_, rec)) return;
      index_.emplace(key, record{end_, rec.size(), version, feature.size(), next_serial_++});
      end_ += rec.size();
      live_ += rec.size();
      ++spills_;
    } catch (const std::exception& e) {
      const std::lock_guard lock(mutex_);
      disable_locked(std::string("hone::data::feature_cache: spilling a feature failed (") +
                     e.what() + "); the disk tier is off, the cache goes on in RAM only");
    }
  }

  [[nodiscard]] bool contains(const Key& key, std::uint64_t version) const {
    const std::lock_guard lock(mutex_);
    const auto it = index_.find(key);
    return it != index_.end() && it->second.version == version;
  }
  void clear() {
    const std::lock_guard lock(mutex_);
    if (!fd_) return;
    index_.clear();
    live_ = 0;
    end_ = 0;
    if (::ftruncate(fd_.get(), 0) != 0) {
      disable_locked(io_message("truncate", errno));
    }
  }
  void add_to(feature_cache_stats& s) const {
    const std::lock_guard lock(mutex_);
    s.corrupt += corrupt_;
    s.spills += spills_;
    s.spill_skipped += spill_skipped_;
    s.disk_evictions += disk_evictions_;
    s.compactions += compactions_;
    s.disk_errors += disk_errors_;
    s.disk_entries += index_.size();
    s.disk_bytes += end_;
  }
  void reset_stats() {
    const std::lock_guard lock(mutex_);
    corrupt_ = spills_ = spill_skipped_ = disk_evictions_ = compactions_ = 0;
  }
  [[nodiscard]] bool enabled() const {
    const std::lock_guard lock(mutex_);
    return static_cast<bool>(fd_);
  }
  [[nodiscard]] std::string error_message() const {
    const std::lock_guard lock(mutex_);
    return error_;
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  struct record {
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;  // the whole record
    std::uint64_t version = 0;
    std::uint64_t count = 0;  // elements
    std::uint64_t serial = 0;
  };
  using index_type = std::unordered_map<Key, record, Hash>;
  enum class read_result { ok, short_read, error };

  static std::vector<std::byte> encode(const Key& key, std::uint64_t version,
                                       const std::vector<T>& feature, int level) {
    const std::size_t raw = feature.size() * sizeof(T);
    const std::size_t head = feature_record_header_bytes + sizeof(Key);
    std::vector<std::byte> rec(head + ZSTD_compressBound(raw));
    ZSTD_CCtx* c = fc_cctx();
    ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters);
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);
    const std::size_t frame =
        ZSTD_compress2(c, rec.data() + head, rec.size() - head, feature.data(), raw);
    if (ZSTD_isError(frame)) {
      throw error(std::string("zstd compression failed: ") + ZSTD_getErrorName(frame));
    }
    std::byte* h = rec.data();
    std::memcpy(h, feature_record_magic, 8);
    fc_put64(h + 8, version);
    fc_put64(h + 16, feature.size());
    fc_put32(h + 24, static_cast<std::uint32_t>(sizeof(T)));
    fc_put32(h + 28, static_cast<std::uint32_t>(sizeof(Key)));
    fc_put64(h + 32, frame);
    fc_put64(h + 40, io::hash64(std::as_bytes(std::span<const T>(feature))));
    std::memcpy(h + feature_record_header_bytes, &key, sizeof(Key));
    rec.resize(head + frame);
    return rec;
  }
  std::vector<std::byte> encode(const Key& key, std::uint64_t version,
                                const std::vector<T>& feature) const {
    return encode(key, version, feature, level_);
  }

  /// Checks every field against what the index expects, then decompresses and checks the bytes.
  static bool decode(std::span<const std::byte> rec, const Key& key, const record& r,
                     std::vector<T>& out) {
    const std::size_t head = feature_record_header_bytes + sizeof(Key);
    if (rec.size() < head) return false;
    const std::byte* h = rec.data();
    if (std::memcmp(h, feature_record_magic, 8) != 0 || fc_get64(h + 8) != r.version ||
        fc_get64(h + 16) != r.count || fc_get32(h + 24) != sizeof(T) ||
        fc_get32(h + 28) != sizeof(Key) || fc_get64(h + 32) != rec.size() - head ||
        std::memcmp(h + feature_record_header_bytes, &key, sizeof(Key)) != 0) {
      return false;
    }
    out.resize(static_cast<std::size_t>(r.count));
    const std::size_t raw = out.size() * sizeof(T);
    const std::size_t n =
        ZSTD_decompressDCtx(fc_dctx(), out.data(), raw, h + head, rec.size() - head);
    if (ZSTD_isError(n) || n != raw) return false;
    return io::hash64(std::as_bytes(std::span<const T>(out))) == fc_get64(h + 40);
  }

  read_result read_locked(std::uint64_t offset, std::span<std::byte> out) {
    std::size_t done = 0;
    while (done < out.size()) {
      const std::size_t n = std::min(out.size() - done, io::max_io_bytes);
      const ::ssize_t r =
          ::pread(fd_.get(), out.data() + done, n, static_cast<::off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        disable_locked(io_message("read", errno));
        return read_result::error;
      }
      if (r == 0) return read_result::short_read;
      done += static_cast<std::size_t>(r);
    }
    return read_result::ok;
  }
  bool write_locked(std::uint64_t offset, std::span<const std::byte> in) {
    std::size_t done = 0;
    while (done < in.size()) {
      const std::size_t n = std::min(in.size() - done, io::max_io_bytes);
      const ::ssize_t w =
          ::pwrite(fd_.get(), in.data() + done, n, static_cast<::off_t>(offset + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        disable_locked(io_message("write", w < 0 ? errno : EIO));
        return false;
      }
      done += static_cast<std::size_t>(w);
    }
    return true;
  }

  /// Makes room for `need` bytes at the end (see the header: reclaim dropped bytes, then drop the
  /// oldest records until the file plus `need` fits in 3/4 of the budget). False when the tier
  /// went off meanwhile.
  bool compact_locked(std::size_t need) {
    ++compactions_;
    std::vector<std::pair<Key, record>> live(index_.begin(), index_.end());
    std::sort(live.begin(), live.end(),
              [](const auto& a, const auto& b) { return a.second.offset < b.second.offset; });
    const std::uint64_t low_water = budget_ - budget_ / 4;
    std::size_t first = 0;
    while (first < live.size() && live_ + need > low_water) {
      index_.erase(live[first].first);
      live_ -= live[first].second.bytes;
      ++disk_evictions_;
      ++first;
    }
    std::uint64_t to = 0;
    std::vector<std::byte> buf;
    for (std::size_t i = first; i < live.size(); ++i) {
      auto it = index_.find(live[i].first);
      record& r = it->second;
      if (r.offset != to) {
        buf.resize(static_cast<std::size_t>(r.bytes));
        const read_result rr = read_locked(r.offset, buf);
        if (rr == read_result::error) return false;
        if (rr == read_result::short_read) {  // the file was cut short under the cache
          live_ -= r.bytes;
          index_.erase(it);
          ++corrupt_;
          continue;
        }
        if (!write_locked(to, buf)) return false;
        r.offset = to;
      }
      to += r.bytes;
    }
    if (::ftruncate(fd_.get(), static_cast<::off_t>(to)) != 0) {
      disable_locked(io_message("truncate", errno));
      return false;
    }
    end_ = to;
    return true;
  }

  void drop_locked(typename index_type::iterator it) {
    live_ -= it->second.bytes;
    index_.erase(it);
  }
  std::string io_message(const char* what, int err) const {
    return "hone::data::feature_cache: cannot " + std::string(what) + " the spill file '" +
           path_.string() + "': " + std::system_category().message(err) +
           "; the disk tier is off, the cache goes on in RAM only (free space or give another "
           "disk_dir)";
  }
  void disable_locked(std::string why) {
    if (!fd_) return;
    ++disk_errors_;
    error_ = std::move(why);
    index_.clear();
    live_ = 0;
    end_ = 0;
    close_and_remove();
  }
  void close_and_remove() noexcept {
    if (fd_) {
      (void)fd_.close();
      std::error_code ec;
      std::filesystem::remove(path_, ec);
    }
  }

  std::uint64_t budget_;
  int level_;
  std::filesystem::path path_;
  io::unique_fd fd_;
  mutable std::mutex mutex_;
  index_type index_;
  std::uint64_t end_ = 0;   // size of the spill file
  std::uint64_t live_ = 0;  // bytes of the records in the index
  std::uint64_t next_serial_ = 0;
  std::uint64_t corrupt_ = 0, spills_ = 0, spill_skipped_ = 0, disk_evictions_ = 0;
  std::uint64_t compactions_ = 0, disk_errors_ = 0;
  std::string error_;
};

}  // namespace detail

/// Precomputed features in RAM (LRU within a byte budget) with an optional zstd disk tier, keyed
/// by (sample key, transform version). Thread-safe; see the top of this header.
template <class Key, class T, class Hash = std::hash<Key>>
class feature_cache {
  static_assert(std::is_trivially_copyable_v<Key> && std::has_unique_object_representations_v<Key>,
                "hone::data::feature_cache: the sample key must be a trivially copyable type "
                "without padding (an integer, or a struct of integers without padding), because "
                "the disk tier stores and compares it byte for byte; hash another key (a string, a "
                "path) to a 64-bit integer first.");
  static_assert(std::equality_comparable<Key>,
                "hone::data::feature_cache: the sample key must be comparable with ==.");
  static_assert(std::is_invocable_r_v<std::size_t, const Hash&, const Key&>,
                "hone::data::feature_cache: Hash must be callable on a const Key& and return a "
                "std::size_t (std::hash<Key> is the default).");
  static_assert(std::is_trivially_copyable_v<T> && !std::is_pointer_v<T> && !std::is_const_v<T>,
                "hone::data::feature_cache: the feature element type T must be a trivially "
                "copyable value type (float, an integer, hone::bfloat16, ...): features are kept "
                "and spilled as raw bytes.");

 public:
  using key_type = Key;
  using value_type = T;

  /// io_error when disk_dir cannot be created or written; config_error for a budget of 0, 0
  /// shards, a disk_dir without disk_bytes (or the reverse), a zstd level out of range.
  explicit feature_cache(const feature_cache_options& options, Hash hash = {})
      : options_(options), hash_(std::move(hash)) {
    HONE_REQUIRE(options.ram_bytes > 0,
                 "hone::data::feature_cache: ram_bytes is 0; give the RAM tier a byte budget "
                 "(e.g. .ram_bytes = std::size_t{1} << 30 for 1 GiB)");
    HONE_REQUIRE(options.shards > 0,
                 "hone::data::feature_cache: shards is 0; use at least one shard (8 by default)");
    HONE_REQUIRE(options.ram_bytes >= options.shards,
                 "hone::data::feature_cache: ram_bytes (" + std::to_string(options.ram_bytes) +
                     ") is smaller than the number of shards (" + std::to_string(options.shards) +
                     "); each shard gets ram_bytes / shards: give a larger budget or fewer shards");
    HONE_REQUIRE(options.disk_dir.empty() || options.disk_bytes > 0,
                 "hone::data::feature_cache: disk_dir is given but disk_bytes is 0; give the disk "
                 "tier a byte budget, or leave disk_dir empty for a RAM-only cache");
    HONE_REQUIRE(!options.disk_dir.empty() || options.disk_bytes == 0,
                 "hone::data::feature_cache: disk_bytes is set but disk_dir is empty; name the "
                 "directory of the spill file, or set disk_bytes to 0 for a RAM-only cache");
    HONE_REQUIRE(options.zstd_level >= ZSTD_minCLevel() && options.zstd_level <= ZSTD_maxCLevel(),
                 "hone::data::feature_cache: zstd_level " + std::to_string(options.zstd_level) +
                     " is out of zstd's range " + std::to_string(ZSTD_minCLevel()) + " to " +
                     std::to_string(ZSTD_maxCLevel()) + " (1, the default, is fast)");
    const std::size_t per = options.ram_bytes / options.shards;
    shards_.reserve(options.shards);
    for (std::size_t i = 0; i < options.shards; ++i) {
      shards_.push_back(std::make_unique<shard>(per, hash_));
    }
    if (!options.disk_dir.empty()) {
      disk_ =
          std::make_unique<spill_type>(options.disk_dir, options.disk_bytes, options.zstd_level);
    }
  }

  /// The feature of `key` at `version`: from RAM, else from the disk tier (checked, then promoted
  /// to RAM), else computed by `compute(std::vector<T>& out)`, which fills `out` (empty on entry)
  /// with at least one element, and cached. An exception from `compute` propagates and caches
  /// nothing; an empty result is a config_error.
  template <class F>
  feature_ref<T> get_or_compute(const Key& key, std::uint64_t version, F&& compute) {
    static_assert(std::is_invocable_v<F&, std::vector<T>&>,
                  "hone::data::feature_cache::get_or_compute: the compute function must be "
                  "callable as compute(std::vector<T>& out) and fill `out` with the feature.");
    shard& s = shard_for(key);
    bool stale = false;
    {
      const std::lock_guard lock(s.mutex);
      if (ram_entry* e = s.lru.touch(key)) {
        if (e->version == version) {
          ram_hits_.fetch_add(1, std::memory_order_relaxed);
          return feature_ref<T>(e->data);
        }
        s.lru.erase(key);  // another version: never served
        stale = true;
      }
    }
    if (disk_) {
      std::vector<T> loaded;
      const detail::spill_outcome r = disk_->load(key, version, loaded);
      if (r == detail::spill_outcome::hit) {
        if (stale) stale_.fetch_add(1, std::memory_order_relaxed);
        disk_hits_.fetch_add(1, std::memory_order_relaxed);
        return insert(s, key, version, std::make_shared<const std::vector<T>>(std::move(loaded)));
      }
      if (r == detail::spill_outcome::stale) stale = true;
    }
    if (stale) stale_.fetch_add(1, std::memory_order_relaxed);
    misses_.fetch_add(1, std::memory_order_relaxed);
    auto out = std::make_shared<std::vector<T>>();
    compute(*out);
    HONE_REQUIRE(!out->empty(),
                 "hone::data::feature_cache::get_or_compute: the compute function left the "
                 "feature empty (transform version " +
                     std::to_string(version) +
                     "); a feature is a non-empty array: fill `out` with at least one element");
    return insert(s, key, version, std::move(out));
  }

  /// Whether `key` is in RAM at `version` (no statistics, no recency change).
  [[nodiscard]] bool in_ram(const Key& key, std::uint64_t version) const {
    const shard& s = shard_for(key);
    const std::lock_guard lock(s.mutex);
    const ram_entry* e = s.lru.peek(key);
    return e != nullptr && e->version == version;
  }
  /// Whether the disk tier holds a record of `key` at `version` (not checked here).
  [[nodiscard]] bool on_disk(const Key& key, std::uint64_t version) const {
    return disk_ && disk_->contains(key, version);
  }

  /// Drops every entry, in RAM and on disk (the statistics stay).
  void clear() {
    for (auto& s : shards_) {
      const std::lock_guard lock(s->mutex);
      s->lru.clear();
    }
    if (disk_) disk_->clear();
  }
  void reset_stats() {
    ram_hits_ = disk_hits_ = misses_ = stale_ = evictions_ = oversized_ = 0;
    if (disk_) disk_->reset_stats();
  }

  /// A snapshot of the counters and sizes (each tier read under its own lock).
  [[nodiscard]] feature_cache_stats stats() const {
    feature_cache_stats t;
    t.ram_hits = ram_hits_.load(std::memory_order_relaxed);
    t.disk_hits = disk_hits_.load(std::memory_order_relaxed);
    t.misses = misses_.load(std::memory_order_relaxed);
    t.stale = stale_.load(std::memory_order_relaxed);
    t.evictions = evictions_.load(std::memory_order_relaxed);
    t.oversized = oversized_.load(std::memory_order_relaxed);
    for (const auto& s : shards_) {
      const std::lock_guard lock(s->mutex);
      t.ram_entries += s->lru.size();
      t.ram_bytes += s->lru.bytes();
    }
    if (disk_) disk_->add_to(t);
    return t;
  }
  [[nodiscard]] double hit_rate() const { return stats().hit_rate(); }

  /// Whether the disk tier is configured and working (false after an I/O error turned it off).
  [[nodiscard]] bool disk_enabled() const { return disk_ && disk_->enabled(); }
  /// Why the disk tier turned off (empty while it works or when there is none).
  [[nodiscard]] std::string disk_error() const { return disk_ ? disk_->error_message() : ""; }
  /// The spill file (empty without a disk tier).
  [[nodiscard]] std::filesystem::path spill_path() const {
    return disk_ ? disk_->path() : std::filesystem::path{};
  }
  [[nodiscard]] const feature_cache_options& options() const noexcept { return options_; }
  /// The RAM budget of each shard (ram_bytes / shards): a larger feature is not kept in RAM.
  [[nodiscard]] std::size_t shard_ram_bytes() const noexcept { return shards_.front()->budget; }

 private:
  using spill_type = detail::feature_spill<Key, T, Hash>;
  struct ram_entry {
    std::uint64_t version;
    std::shared_ptr<const std::vector<T>> data;
  };
  struct shard {
    shard(std::size_t b, const Hash& h) : budget(b), lru(h) {}
    std::size_t budget;
    mutable std::mutex mutex;
    hone::detail::lru_map<Key, ram_entry, Hash> lru;
  };
  struct evicted {
    Key key;
    std::uint64_t version;
    std::shared_ptr<const std::vector<T>> data;
  };

  shard& shard_for(const Key& key) { return *shards_[hash_(key) % shards_.size()]; }
  const shard& shard_for(const Key& key) const { return *shards_[hash_(key) % shards_.size()]; }

  /// Caches `data` as key's entry at `version` (unless another thread cached that version first:
  /// then its entry is returned), evicts the shard to its budget and spills what it evicted.
  feature_ref<T> insert(shard& s, const Key& key, std::uint64_t version,
                        std::shared_ptr<const std::vector<T>> data) {
    const std::size_t bytes = data->size() * sizeof(T);
    std::vector<evicted> out;
    {
      const std::lock_guard lock(s.mutex);
      if (const ram_entry* e = s.lru.peek(key); e != nullptr && e->version == version) {
        return feature_ref<T>(e->data);
      }
      if (bytes > s.budget) {
        s.lru.erase(key);
        oversized_.fetch_add(1, std::memory_order_relaxed);
        if (disk_) out.push_back(evicted{key, version, data});
      } else {
        s.lru.insert(key, ram_entry{version, data}, bytes);
        while (s.lru.bytes() > s.budget) {
          auto e = s.lru.pop_lru();
          evictions_.fetch_add(1, std::memory_order_relaxed);
          if (disk_) out.push_back(evicted{e.key, e.value.version, std::move(e.value.data)});
        }
      }
    }
    for (const evicted& e : out) disk_->store(e.key, e.version, *e.data);
    return feature_ref<T>(std::move(data));
  }

  feature_cache_options options_;
  Hash hash_;
  std::vector<std::unique_ptr<shard>> shards_;
  std::unique_ptr<spill_type> disk_;
  std::atomic<std::uint64_t> ram_hits_{0}, disk_hits_{0}, misses_{0}, stale_{0}, evictions_{0},
      oversized_{0};
};

}  // namespace data
HONE_NAMESPACE_END
