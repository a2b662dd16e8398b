// hone/rl/mmap_ring.hpp: a disk-backed ring of fixed-size records on a memory-mapped file, for
// replay buffers larger than RAM (pages are file-backed: the kernel keeps the hot ones in memory
// and writes the rest back), that survives a kill of the process and reopens where it stopped.
//
// File layout (all integers little-endian, the native order of the hosts hone supports):
//
//   offset  size                     field
//   0       72                       header slot A
//   512     72                       header slot B
//   4096    capacity * record_size   records; slot s at 4096 + s * record_size
//
// A header slot: magic "HONERING", u32 version (1), u32 header bytes (4096), u64 record_size,
// u64 capacity, u64 generation, u64 begin, u64 end, u64 user tag, u64 XXH3-64 of the 64 bytes
// before it. `begin` and `end` are sequence numbers (the n-th record ever added has sequence n);
// the live records are [begin, end), record `seq` lives in slot seq % capacity.
//
// Commit protocol: add() only writes the record bytes. commit() makes everything added so far
// part of the file's state: (1) msync(MS_SYNC) of the record pages written since the last commit
// (skipped with options.sync = false), (2) the new header (generation + 1) written into the slot
// that does NOT hold the current header, (3) msync of the header page. A kill at any point leaves
// one intact slot: either the new one or the previous one (a torn slot fails its checksum), and
// open() takes the intact slot with the highest generation. Before add() overwrites a slot that
// holds a committed record (the ring is full), it commits with `begin` moved past a block of
// options.evict_block records, so a committed header never names a slot that is being
// overwritten: at most evict_block of the oldest records are dropped early.
//
// Guarantee after SIGKILL (or any process death): open() sees exactly the records of the last
// completed commit, each byte-identical to what was added, plus nothing else. Commits happen in
// commit(), every options.commit_every adds, when the ring wraps, and in close()/the destructor;
// so at most commit_every - 1 of the newest records are lost to a kill. With options.sync = true
// (the default) the same holds after an operating-system crash or power loss, as far as the
// storage device honours flushes; with sync = false only process death is covered (the page
// cache still holds the writes) and commits cost no I/O wait.
//
// Damage is an exception, never a crash: open() throws hone::checkpoint_error naming the file and
// the problem (not a ring file, both header copies damaged, unsupported version, file length not
// matching capacity * record_size, record size or capacity other than expected, begin/end out of
// range) and hone::io_error for failing system calls (open, fstat, mmap, msync, ...). The file is
// preallocated (posix_fallocate) at creation, so writes through the mapping never hit a full disk
// (which would be SIGBUS); truncating the file while it is mapped remains the caller's fault.
//
// Threads: one writer; reads concurrent with add() need external synchronization (as for the
// in-memory ring). Records are byte spans; push_value/value_at copy trivially copyable types,
// emplace(fill) writes a record in place, slot_data(slot) reads a slot without a liveness check
// (for hone::mmap_storage, which tracks live slots itself: hone/rl/mmap_storage.hpp).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/hash.hpp"

HONE_NAMESPACE_BEGIN

/// Options of an mmap_ring (creation and reopening).
struct mmap_ring_options {
  /// Commit automatically after this many add() calls (0: only explicit commits, wraps, close).
  std::size_t commit_every = 1024;
  /// Records dropped at once when add() would overwrite a committed record (>= 1, <= capacity).
  /// 0 picks max(1, min(commit_every, capacity / 16)).
  std::size_t evict_block = 0;
  /// msync the written records and the header at each commit (survive OS crashes, not only kills).
  bool sync = true;
  /// Reserve the file's blocks at creation (posix_fallocate), so a full disk is an io_error at
  /// create() rather than SIGBUS while writing through the mapping.
  bool preallocate = true;
};

namespace detail {
inline constexpr char mmap_ring_magic[8] = {'H', 'O', 'N', 'E', 'R', 'I', 'N', 'G'};
inline constexpr std::uint32_t mmap_ring_version = 1;
inline constexpr std::uint64_t mmap_ring_header_bytes = 4096;
inline constexpr std::uint64_t mmap_ring_slot_offset[2] = {0, 512};

struct mmap_ring_header {
  char magic[8];
  std::uint32_t version;
  std::uint32_t header_bytes;
  std::uint64_t record_size;
  std::uint64_t capacity;
  std::uint64_t generation;
  std::uint64_t begin;
  std::uint64_t end;
  std::uint64_t user_tag;
  std::uint64_t checksum;  // XXH3-64 of the 64 bytes above

  [[nodiscard]] std::uint64_t compute_checksum() const noexcept {
    return io::hash64(std::as_bytes(std::span(reinterpret_cast<const char*>(this), 64)));
  }
  [[nodiscard]] bool magic_ok() const noexcept {
    return std::memcmp(magic, mmap_ring_magic, 8) == 0;
  }
};
static_assert(sizeof(mmap_ring_header) == 72 && offsetof(mmap_ring_header, checksum) == 64);
static_assert(std::is_trivially_copyable_v<mmap_ring_header>);
}  // namespace detail

/// A ring of `capacity` records of `record_size` bytes in a memory-mapped file (see the top of
/// this header for the format and the crash-consistency guarantee).
class mmap_ring {
 public:
  /// Creates a new ring file at `path` (io_error if it exists). The file is built under a
  /// temporary name and renamed into place, so a kill during creation leaves no partial file.
  static mmap_ring create(const std::filesystem::path& path, std::size_t record_size,
                          std::size_t capacity, const mmap_ring_options& options = {}) {
    HONE_REQUIRE(record_size > 0, "hone::mmap_ring: the record size must be positive");
    HONE_REQUIRE(capacity > 0, "hone::mmap_ring: the capacity must be positive");
    const std::uint64_t bytes = file_bytes_for(path, record_size, capacity);
    if (std::filesystem::exists(path)) io::throw_io_error("create", path, EEXIST);
    std::filesystem::path tmp = path;
    tmp += ".creating";
    std::filesystem::remove(tmp);
    {
      io::unique_fd fd = io::open_or_throw(tmp, O_RDWR | O_CREAT | O_EXCL, "create", 0644);
      if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
        const int err = errno;
        std::filesystem::remove(tmp);
        io::throw_io_error("resize", tmp, err);
      }
      if (options.preallocate) {
        const int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes));
        // EOPNOTSUPP/EINVAL: a file system without fallocate; the sparse file still works.
        if (err != 0 && err != EOPNOTSUPP && err != EINVAL) {
          std::filesystem::remove(tmp);
          io::throw_io_error("preallocate", tmp, err);
        }
      }
      detail::mmap_ring_header h{};
      std::memcpy(h.magic, detail::mmap_ring_magic, 8);
      h.version = detail::mmap_ring_version;
      h.header_bytes = static_cast<std::uint32_t>(detail::mmap_ring_header_bytes);
      h.record_size = record_size;
      h.capacity = capacity;
      h.generation = 1;
      h.checksum = h.compute_checksum();
      pwrite_all(fd.get(), tmp, &h, sizeof h, detail::mmap_ring_slot_offset[0]);
      if (options.sync) io::fsync_or_throw(fd.get(), tmp);
      if (const int err = fd.close(); err != 0) io::throw_io_error("close", tmp, err);
    }
    io::rename_path(tmp, path);
    if (options.sync) {
      io::sync_directory(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
    }
    return open(path, options, record_size, capacity);
  }

  /// Reopens an existing ring file. When given, `expected_record_size` and `expected_capacity`
  /// must match the file's (checkpoint_error otherwise).
  static mmap_ring open(const std::filesystem::path& path, const mmap_ring_options& options = {},
                        std::optional<std::size_t> expected_record_size = std::nullopt,
                        std::optional<std::size_t> expected_capacity = std::nullopt) {
    mmap_ring r;
    r.path_ = path;
    r.options_ = options;
    r.fd_ = io::open_or_throw(path, O_RDWR, "open");
    struct stat st {};
    if (::fstat(r.fd_.get(), &st) != 0) io::throw_io_error("stat", path, errno);
    if (!S_ISREG(st.st_mode)) r.fail("is not a regular file");
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    if (file_size < detail::mmap_ring_header_bytes) {
      r.fail("is " + std::to_string(file_size) +
             " bytes, shorter than a ring header (truncated or not a ring file)");
    }
    detail::mmap_ring_header slots[2];
    bool valid[2];
    bool any_magic = false;
    for (int i = 0; i < 2; ++i) {
      pread_all(r.fd_.get(), path, &slots[i], sizeof slots[i], detail::mmap_ring_slot_offset[i]);
      any_magic = any_magic || slots[i].magic_ok();
      valid[i] = slots[i].magic_ok() && slots[i].checksum == slots[i].compute_checksum();
    }
    if (!any_magic) r.fail("is not a hone mmap_ring file (bad magic)");
    if (!valid[0] && !valid[1]) r.fail("has a damaged header: both header copies fail checksum");
    const int cur = (valid[0] && valid[1]) ? (slots[1].generation > slots[0].generation ? 1 : 0)
                                           : (valid[0] ? 0 : 1);
    const detail::mmap_ring_header& h = slots[cur];
    if (h.version != detail::mmap_ring_version) {
      r.fail("has format version " + std::to_string(h.version) + "; this hone reads version " +
             std::to_string(detail::mmap_ring_version));
    }
    if (h.header_bytes != detail::mmap_ring_header_bytes || h.record_size == 0 || h.capacity == 0) {
      r.fail("has a header with impossible sizes (header " + std::to_string(h.header_bytes) +
             ", record " + std::to_string(h.record_size) + ", capacity " +
             std::to_string(h.capacity) + ")");
    }
    if (h.capacity > (~std::uint64_t{0} - detail::mmap_ring_header_bytes) / h.record_size) {
      r.fail("has a header whose capacity * record size overflows");
    }
    const std::uint64_t want = detail::mmap_ring_header_bytes + h.capacity * h.record_size;
    if (file_size != want) {
      r.fail("is " + std::to_string(file_size) + " bytes but its header (capacity " +
             std::to_string(h.capacity) + " x record " + std::to_string(h.record_size) +
             " bytes) needs " + std::to_string(want) + " (truncated or extended)");
    }
    if (h.begin > h.end || h.end - h.begin > h.capacity) {
      r.fail("has an inconsistent header (begin " + std::to_string(h.begin) + ", end " +
             std::to_string(h.end) + ", capacity " + std::to_string(h.capacity) + ")");
    }
    if (expected_record_size && *expected_record_size != h.record_size) {
      r.fail("holds records of " + std::to_string(h.record_size) + " bytes, not the expected " +
             std::to_string(*expected_record_size));
    }
    if (expected_capacity && *expected_capacity != h.capacity) {
      r.fail("has capacity " + std::to_string(h.capacity) + ", not the expected " +
             std::to_string(*expected_capacity));
    }
    if (want > static_cast<std::uint64_t>(~std::size_t{0})) {
      io::throw_io_error("map", path, EFBIG);
    }
    void* p = ::mmap(nullptr, static_cast<std::size_t>(want), PROT_READ | PROT_WRITE, MAP_SHARED,
                     r.fd_.get(), 0);
    if (p == MAP_FAILED) io::throw_io_error("map", path, errno);
    r.base_ = static_cast<std::byte*>(p);
    r.map_bytes_ = static_cast<std::size_t>(want);
    r.header_ = h;
    r.current_slot_ = cur;
    r.end_ = h.end;
    r.dirty_begin_ = h.end;
    r.record_size_ = static_cast<std::size_t>(h.record_size);
    r.capacity_ = static_cast<std::size_t>(h.capacity);
    if (r.options_.evict_block == 0) {
      r.options_.evict_block = std::max<std::size_t>(
          1, std::min(r.options_.commit_every == 0 ? r.capacity_ / 16 : r.options_.commit_every,
                      r.capacity_ / 16));
    }
    r.options_.evict_block = std::min(r.options_.evict_block, r.capacity_);
    return r;
  }

  /// Opens `path` when it exists (checking record size and capacity), creates it otherwise.
  static mmap_ring open_or_create(const std::filesystem::path& path, std::size_t record_size,
                                  std::size_t capacity, const mmap_ring_options& options = {}) {
    if (std::filesystem::exists(path)) return open(path, options, record_size, capacity);
    return create(path, record_size, capacity, options);
  }

  mmap_ring(mmap_ring&& o) noexcept { swap(o); }
  mmap_ring& operator=(mmap_ring&& o) noexcept {
    if (this != &o) {
      mmap_ring tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }
  mmap_ring(const mmap_ring&) = delete;
  mmap_ring& operator=(const mmap_ring&) = delete;
  /// Commits and unmaps; errors are swallowed (call close() to see them).
  ~mmap_ring() {
    try {
      close();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
    }
  }

  /// Commits, unmaps and closes the file (io_error on failure). The object is then empty.
  void close() {
    if (base_ == nullptr) return;
    commit();
    ::munmap(base_, map_bytes_);
    base_ = nullptr;
    if (const int err = fd_.close(); err != 0) io::throw_io_error("close", path_, err);
  }

  /// Appends one record (record_size() bytes) and returns its sequence number. Overwrites the
  /// oldest record once the ring is full.
  std::uint64_t push(std::span<const std::byte> record) {
    HONE_REQUIRE(record.size() == record_size_,
                 "hone::mmap_ring::push: the record must be exactly record_size() bytes");
    return emplace(
        [&](std::span<std::byte> slot) { std::memcpy(slot.data(), record.data(), record_size_); });
  }

  /// push() that lets fill(std::span<std::byte> slot) write the record_size() bytes of the new
  /// record in place (no staging copy: what hone::mmap_storage packs a transition with). fill
  /// must write every byte and must not throw. Returns the record's sequence number.
  template <class Fill>
  std::uint64_t emplace(Fill&& fill) {
    require_open();
    const std::uint64_t seq = end_;
    if (seq >= header_.begin + capacity_) {
      // The slot holds a committed record: move the committed begin past a block first.
      commit_with_begin(seq - capacity_ + options_.evict_block);
    }
    fill(std::span<std::byte>(slot_ptr(seq), record_size_));
    end_ = seq + 1;
    if (options_.commit_every != 0 && end_ - header_.end >= options_.commit_every) commit();
    return seq;
  }

  /// push() of a trivially copyable object of exactly record_size() bytes.
  template <class T>
  requires std::is_trivially_copyable_v<T> std::uint64_t push_value(const T& value) {
    return push(std::as_bytes(std::span(&value, 1)));
  }

  /// Makes every record added so far survive a kill (see the header comment).
  void commit() {
    require_open();
    if (end_ == header_.end && !pending_tag_) return;
    commit_with_begin(header_.begin);
  }

  /// Record i of the live records, 0 being the oldest (i < size()).
  [[nodiscard]] std::span<const std::byte> operator[](std::size_t i) const {
    return {slot_ptr(oldest() + i), record_size_};
  }
  /// The record with sequence number `seq` (oldest() <= seq < end()).
  [[nodiscard]] std::span<const std::byte> at_sequence(std::uint64_t seq) const {
    if (seq < oldest() || seq >= end_) {
      throw config_error("hone::mmap_ring: sequence " + std::to_string(seq) +
                         " is not live (live range [" + std::to_string(oldest()) + ", " +
                         std::to_string(end_) + "))");
    }
    return {slot_ptr(seq), record_size_};
  }
  /// Record i (0 = oldest) copied into a trivially copyable T of record_size() bytes.
  template <class T>
  requires std::is_trivially_copyable_v<T>
  [[nodiscard]] T value_at(std::size_t i) const {
    HONE_REQUIRE(sizeof(T) == record_size_,
                 "hone::mmap_ring::value_at: sizeof(T) != record_size()");
    T out;
    std::memcpy(&out, slot_ptr(oldest() + i), sizeof(T));
    return out;
  }

  /// The bytes of slot `slot` (< capacity()), whatever it holds: no liveness check. For storages
  /// that keep their own record of which slots are live (hone::mmap_storage); others use
  /// operator[] or at_sequence().
  [[nodiscard]] const std::byte* slot_data(std::size_t slot) const noexcept {
    return base_ + detail::mmap_ring_header_bytes + slot * record_size_;
  }
  /// The options in effect (evict_block resolved).
  [[nodiscard]] const mmap_ring_options& options() const noexcept { return options_; }

  /// Live records: those added and not yet overwritten (or dropped by an eviction block).
  [[nodiscard]] std::size_t size() const noexcept {
    return static_cast<std::size_t>(end_ - oldest());
  }
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t record_size() const noexcept { return record_size_; }
  /// Sequence number of the oldest live record.
  [[nodiscard]] std::uint64_t oldest() const noexcept { return header_.begin; }
  /// Sequence number the next record will get (records ever added, across reopenings).
  [[nodiscard]] std::uint64_t end() const noexcept { return end_; }
  /// The `end` of the last commit: what a reopen after a kill would see.
  [[nodiscard]] std::uint64_t committed_end() const noexcept { return header_.end; }
  /// Commits so far in the file's life (the header generation).
  [[nodiscard]] std::uint64_t generation() const noexcept { return header_.generation; }
  /// A caller-defined 64-bit value kept in the header (written at the next commit).
  [[nodiscard]] std::uint64_t user_tag() const noexcept {
    return pending_tag_.value_or(header_.user_tag);
  }
  void set_user_tag(std::uint64_t tag) noexcept { pending_tag_ = tag; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  [[nodiscard]] bool is_open() const noexcept { return base_ != nullptr; }
  /// Bytes of the file (header + records).
  [[nodiscard]] std::size_t file_bytes() const noexcept { return map_bytes_; }

 private:
  mmap_ring() = default;

  void swap(mmap_ring& o) noexcept {
    std::swap(path_, o.path_);
    std::swap(options_, o.options_);
    std::swap(fd_, o.fd_);
    std::swap(base_, o.base_);
    std::swap(map_bytes_, o.map_bytes_);
    std::swap(header_, o.header_);
    std::swap(current_slot_, o.current_slot_);
    std::swap(end_, o.end_);
    std::swap(dirty_begin_, o.dirty_begin_);
    std::swap(record_size_, o.record_size_);
    std::swap(capacity_, o.capacity_);
    std::swap(pending_tag_, o.pending_tag_);
  }

  static std::uint64_t file_bytes_for(const std::filesystem::path& path, std::size_t record_size,
                                      std::size_t capacity) {
    const auto rs = static_cast<std::uint64_t>(record_size);
    const auto cap = static_cast<std::uint64_t>(capacity);
    if (cap > (~std::uint64_t{0} - detail::mmap_ring_header_bytes) / rs) {
      throw config_error("hone::mmap_ring: capacity * record size overflows for '" + path.string() +
                         "'");
    }
    return detail::mmap_ring_header_bytes + cap * rs;
  }

  [[noreturn]] void fail(const std::string& problem) const {
    throw checkpoint_error("hone: mmap_ring file '" + path_.string() + "' " + problem);
  }
  void require_open() const {
    if (base_ == nullptr) throw config_error("hone::mmap_ring: the ring is closed");
  }

  [[nodiscard]] std::byte* slot_ptr(std::uint64_t seq) const noexcept {
    return base_ + detail::mmap_ring_header_bytes + (seq % capacity_) * record_size_;
  }

  // msync [from, to) of the mapping, rounded out to pages.
  void sync_range(std::size_t from, std::size_t to) {
    if (!options_.sync || from >= to) return;
    static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t a = from / page * page;
    if (::msync(base_ + a, to - a, MS_SYNC) != 0) io::throw_io_error("msync", path_, errno);
  }
  // msync the record slots of sequences [from, to).
  void sync_records(std::uint64_t from, std::uint64_t to) {
    if (!options_.sync || from >= to) return;
    if (to - from >= capacity_) {
      sync_range(detail::mmap_ring_header_bytes, map_bytes_);
      return;
    }
    const std::size_t a = static_cast<std::size_t>(from % capacity_);
    const std::size_t b = static_cast<std::size_t>(to % capacity_);
    const std::size_t hb = detail::mmap_ring_header_bytes;
    if (a < b || b == 0) {
      sync_range(hb + a * record_size_, hb + (b == 0 ? capacity_ : b) * record_size_);
    } else {
      sync_range(hb + a * record_size_, map_bytes_);
      sync_range(hb, hb + b * record_size_);
    }
  }

  void commit_with_begin(std::uint64_t new_begin) {
    new_begin = std::min(new_begin, end_);
    // 1. The records: durable before any header names them.
    sync_records(dirty_begin_, end_);
    // The record stores must precede the header stores. A kill discards no store the CPU has
    // executed (they all reach the shared page cache), so only the compiler's order matters: a
    // signal fence keeps it (and, unlike a thread fence, is supported under ThreadSanitizer).
    std::atomic_signal_fence(std::memory_order_seq_cst);
    // 2. The new header into the other slot.
    detail::mmap_ring_header h = header_;
    h.generation = header_.generation + 1;
    h.begin = new_begin;
    h.end = end_;
    if (pending_tag_) h.user_tag = *pending_tag_;
    h.checksum = h.compute_checksum();
    const int next = 1 - current_slot_;
    std::memcpy(base_ + detail::mmap_ring_slot_offset[next], &h, sizeof h);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    // 3. The header page.
    sync_range(0, detail::mmap_ring_header_bytes);
    header_ = h;
    current_slot_ = next;
    dirty_begin_ = end_;
    pending_tag_.reset();
  }

  static void pwrite_all(int fd, const std::filesystem::path& path, const void* data, std::size_t n,
                         std::uint64_t offset) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ::ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        io::throw_io_error("write", path, errno);
      }
      p += w;
      n -= static_cast<std::size_t>(w);
      offset += static_cast<std::uint64_t>(w);
    }
  }
  static void pread_all(int fd, const std::filesystem::path& path, void* data, std::size_t n,
                        std::uint64_t offset) {
    auto* p = static_cast<char*>(data);
    while (n > 0) {
      const ::ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        io::throw_io_error("read", path, errno);
      }
      if (r == 0) io::throw_io_error("read", path, EIO);
      p += r;
      n -= static_cast<std::size_t>(r);
      offset += static_cast<std::uint64_t>(r);
    }
  }

  std::filesystem::path path_;
  mmap_ring_options options_{};
  io::unique_fd fd_;
  std::byte* base_ = nullptr;
  std::size_t map_bytes_ = 0;
  detail::mmap_ring_header header_{};
  int current_slot_ = 0;
  std::uint64_t end_ = 0;
  std::uint64_t dirty_begin_ = 0;  // first sequence written since the last commit
  std::size_t record_size_ = 0;
  std::size_t capacity_ = 0;
  std::optional<std::uint64_t> pending_tag_;
};

HONE_NAMESPACE_END
