// hone/io/file_io.hpp: POSIX file operations with errors that say which file and why, the
// building blocks of every file hone writes atomically (checkpoints, saved replay buffers,
// memory-mapped replay rings).
//
//  - output_file: create/truncate, write-all (short writes and EINTR handled), fsync, close with
//    its error checked; hashes (XXH3-128) and counts every byte it writes, so a MANIFEST entry
//    costs no second read.
//  - input_file: pread with exact-size checks (a short file is an io::format_error, "truncated").
//  - mapped_file: a read-only mmap of a whole file (what the tensor readers validate and view),
//    and pread of a range of it (what they copy tensors with).
//  - read_small_file, hash_file, write_file, sync_directory, rename_path, exchange_paths.
//  - unique_fd, open_or_throw, fsync_or_throw, regular_file_size: the descriptor-level pieces, for
//    files that need other system calls (ftruncate, fallocate, a shared mmap).
//
// Every failing system call becomes hone::io_error naming the operation, the path and errno's
// text; ENOSPC and EDQUOT add "disk full". Content that is too short or too large becomes
// hone::io::format_error (a hone::checkpoint_error). A file appears atomically when it is written
// under a temporary name, fsynced, renamed into place (rename_path) and its directory fsynced
// (sync_directory).
#pragma once

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28, _GNU_SOURCE)
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/error.hpp"
#include "hone/io/hash.hpp"

HONE_NAMESPACE_BEGIN
namespace io {

/// Throws io_error: "hone: cannot <action> '<path>': <errno text>", plus a hint for a full disk.
[[noreturn]] inline void throw_io_error(std::string_view action, const std::filesystem::path& path,
                                        int err) {
  std::string msg = "hone: cannot " + std::string(action) + " '" + path.string() +
                    "': " + std::system_category().message(err);
  if (err == ENOSPC || err == EDQUOT) {
    msg +=
        " (disk full: free space on that file system, keep fewer checkpoints or saves, or "
        "write elsewhere; hone's atomic writers leave the previous version untouched)";
  }
  throw io_error(msg);
}

/// The size and XXH3-128 of a file as written or read: one MANIFEST entry without the name.
struct file_digest {
  std::uint64_t size = 0;
  digest128 hash{};
  friend bool operator==(const file_digest&, const file_digest&) = default;
};

/// Largest count passed to one read/write call (Linux transfers at most 0x7ffff000 bytes per call).
inline constexpr std::size_t max_io_bytes = std::size_t{1} << 30;
/// write() size of output_file while hashing: half of a core's L2 on the machines measured
/// (bench_checkpoint's ckpt_save_1G, 2026-11-21).
inline constexpr std::size_t hash_io_bytes = std::size_t{512} << 10;

/// An owned POSIX file descriptor; closes on destruction (errors there are ignored: call close()).
class unique_fd {
 public:
  unique_fd() noexcept = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~unique_fd() { reset(); }
  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Closes and returns close()'s errno (0 on success). EINTR is not retried: on Linux the
  /// descriptor is released even then, and retrying could close another thread's new file.
  int close() noexcept {
    if (fd_ < 0) return 0;
    const int rc = ::close(std::exchange(fd_, -1));
    return (rc == 0 || errno == EINTR) ? 0 : errno;
  }

 private:
  void reset() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }
  int fd_ = -1;
};

/// open(2) with O_CLOEXEC, retried on EINTR; io_error "cannot <action> '<path>': ..." on failure.
/// `mode` is the permission of a file that O_CREAT creates.
inline unique_fd open_or_throw(const std::filesystem::path& path, int flags,
                               std::string_view action, mode_t mode = 0) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw_io_error(action, path, errno);
  return unique_fd(fd);
}

/// fsync(2) of `fd`, retried on EINTR; io_error naming `path` on failure.
inline void fsync_or_throw(int fd, const std::filesystem::path& path) {
  int rc;
  do {
    rc = ::fsync(fd);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) throw_io_error("fsync", path, errno);
}

/// Size of an open regular file; io_error for anything that is not a regular file.
inline std::uint64_t regular_file_size(int fd, const std::filesystem::path& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_io_error("stat", path, errno);
  if (!S_ISREG(st.st_mode)) throw_io_error("read", path, S_ISDIR(st.st_mode) ? EISDIR : EINVAL);
  return static_cast<std::uint64_t>(st.st_size);
}

/// How output_file opens its path.
enum class create_mode {
  truncate,   // create, or empty an existing file
  exclusive,  // create; io_error (EEXIST) if the path exists
};

/// Whether output_file hashes what it writes.
enum class write_hashing {
  on,   // XXH3-128 of every byte written, in write()
  off,  // the caller hashes the same bytes itself (e.g. on another thread); digest().hash is zero
};

/// A file being written: every byte goes through write(), which loops over short writes and EINTR
/// and hashes what it wrote (unless write_hashing::off). Call sync() for durability and close() to
/// see close()'s error; the destructor closes silently (a file abandoned by an exception is the
/// caller's to remove).
class output_file {
 public:
  explicit output_file(std::filesystem::path path, create_mode mode = create_mode::truncate,
                       write_hashing hashing = write_hashing::on)
      : path_(std::move(path)),
        fd_(open_or_throw(path_,
                          O_WRONLY | O_CREAT | (mode == create_mode::exclusive ? O_EXCL : O_TRUNC),
                          "create", 0644)),
        hashing_(hashing) {}

  /// Writes all of `bytes` (io_error on failure, "disk full" on ENOSPC/EDQUOT).
  void write(std::span<const std::byte> bytes) {
    require_open();
    while (!bytes.empty()) {
      // While hashing, write in blocks small enough to be hashed straight from the cache that the
      // write just pulled them through (one pass over memory instead of two).
      const std::size_t n =
          std::min(bytes.size(), hashing_ == write_hashing::on ? hash_io_bytes : max_io_bytes);
      const ::ssize_t w = ::write(fd_.get(), bytes.data(), n);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw_io_error("write", path_, errno);
      }
      if (w == 0) throw_io_error("write", path_, EIO);
      const auto done = static_cast<std::size_t>(w);
      if (hashing_ == write_hashing::on) hasher_.update(bytes.first(done));
      size_ += done;
      bytes = bytes.subspan(done);
    }
  }
  void write(std::string_view text) { write(std::as_bytes(std::span(text.data(), text.size()))); }

  /// fsync: the data and the file's metadata are on the device when this returns.
  void sync() {
    require_open();
    fsync_or_throw(fd_.get(), path_);
  }

  /// Closes the file (io_error if close reports a deferred write error) and returns its size and
  /// hash.
  file_digest close() {
    require_open();
    if (const int err = fd_.close(); err != 0) throw_io_error("close", path_, err);
    return digest();
  }

  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  /// Bytes written so far and their XXH3-128 (zero with write_hashing::off).
  [[nodiscard]] file_digest digest() const noexcept {
    return {size_, hashing_ == write_hashing::on ? hasher_.digest() : digest128{}};
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  [[nodiscard]] bool is_open() const noexcept { return static_cast<bool>(fd_); }

 private:
  void require_open() const {
    if (!fd_) throw_io_error("write", path_, EBADF);
  }
  std::filesystem::path path_;
  unique_fd fd_;
  write_hashing hashing_ = write_hashing::on;
  hasher hasher_;
  std::uint64_t size_ = 0;
};

/// Writes `bytes` to `path` (created or truncated), fsyncs it when `sync`, closes it.
inline file_digest write_file(const std::filesystem::path& path, std::span<const std::byte> bytes,
                              bool sync = true) {
  output_file out(path);
  out.write(bytes);
  if (sync) out.sync();
  return out.close();
}
inline file_digest write_file(const std::filesystem::path& path, std::string_view text,
                              bool sync = true) {
  return write_file(path, std::as_bytes(std::span(text.data(), text.size())), sync);
}

/// fsyncs a directory, making the creation, removal and renaming of its entries durable.
inline void sync_directory(const std::filesystem::path& dir) {
  unique_fd fd = open_or_throw(dir, O_RDONLY | O_DIRECTORY, "open directory");
  fsync_or_throw(fd.get(), dir);
  if (const int err = fd.close(); err != 0) throw_io_error("close", dir, err);
}

/// Renames `from` to `to` atomically (rename(2): an existing file `to`, or an empty directory
/// `to` when `from` is a directory, is replaced); io_error naming both paths on failure. Make it
/// durable with sync_directory() on the parent.
inline void rename_path(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    throw_io_error("rename '" + from.string() + "' to", to, errno);
  }
}

/// Swaps the paths `a` and `b` in one atomic step (renameat2 with RENAME_EXCHANGE: both must
/// exist; a directory may swap with a directory). Returns false, changing nothing, when the file
/// system or kernel cannot exchange (EINVAL, ENOSYS, ENOTSUP: the caller falls back to renames);
/// io_error naming both paths on any other failure. Make it durable with sync_directory() on the
/// parent.
inline bool exchange_paths(const std::filesystem::path& a, const std::filesystem::path& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  const int err = errno;
  if (err == EINVAL || err == ENOSYS || err == ENOTSUP) return false;
  throw_io_error("exchange '" + a.string() + "' with", b, err);
}

/// A regular file opened for reading at explicit offsets.
class input_file {
 public:
  input_file() = default;  // no file: size 0
  explicit input_file(std::filesystem::path path)
      : path_(std::move(path)), fd_(open_or_throw(path_, O_RDONLY, "open")) {
    size_ = regular_file_size(fd_.get(), path_);
  }
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  [[nodiscard]] int native_handle() const noexcept { return fd_.get(); }

  /// Fills `out` from `offset`; format_error ("truncated") when the file ends first.
  void read_at(std::uint64_t offset, std::span<std::byte> out) const {
    while (!out.empty()) {
      const std::size_t n = std::min(out.size(), max_io_bytes);
      if (offset > static_cast<std::uint64_t>(std::numeric_limits<::off_t>::max())) {
        throw_truncated(offset, out.size());
      }
      const ::ssize_t r = ::pread(fd_.get(), out.data(), n, static_cast<::off_t>(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        throw_io_error("read", path_, errno);
      }
      if (r == 0) throw_truncated(offset, out.size());
      const auto done = static_cast<std::size_t>(r);
      out = out.subspan(done);
      offset += done;
    }
  }

 private:
  [[noreturn]] void throw_truncated(std::uint64_t offset, std::size_t wanted) const {
    throw format_error("hone: '" + path_.string() + "' is truncated: " + std::to_string(wanted) +
                       " more bytes expected at offset " + std::to_string(offset) +
                       ", but the file ends at " + std::to_string(size_));
  }
  std::filesystem::path path_;
  unique_fd fd_;
  std::uint64_t size_ = 0;
};

/// Reads a whole small file (a MANIFEST, a state.json) into a string; format_error if it is larger
/// than `max_bytes`.
inline std::string read_small_file(const std::filesystem::path& path, std::uint64_t max_bytes) {
  input_file in(path);
  if (in.size() > max_bytes) {
    throw format_error("hone: '" + path.string() + "' is " + std::to_string(in.size()) +
                       " bytes, more than the " + std::to_string(max_bytes) +
                       " such a file may have; it is not the file hone wrote");
  }
  std::string text(static_cast<std::size_t>(in.size()), '\0');
  in.read_at(0, std::as_writable_bytes(std::span(text.data(), text.size())));
  return text;
}

/// Size and XXH3-128 of a file, read sequentially in 1 MiB blocks.
inline file_digest hash_file(const std::filesystem::path& path) {
  input_file in(path);
#if defined(POSIX_FADV_SEQUENTIAL)
  (void)::posix_fadvise(in.native_handle(), 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
  std::vector<std::byte> block(std::size_t{1} << 20);
  hasher h;
  std::uint64_t total = 0;
  for (;;) {
    const ::ssize_t r = ::read(in.native_handle(), block.data(), block.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_io_error("read", path, errno);
    }
    if (r == 0) break;
    h.update(std::span<const std::byte>(block.data(), static_cast<std::size_t>(r)));
    total += static_cast<std::uint64_t>(r);
  }
  return {total, h.digest()};
}

/// A whole file mapped read-only (MAP_PRIVATE), with its descriptor kept open for read_at.
/// Move-only; the view stays valid while it lives. Note: if another process truncates the file
/// while it is mapped, touching the lost pages raises SIGBUS; checkpoints are immutable once
/// written, which is what makes mapping them safe.
class mapped_file {
 public:
  mapped_file() noexcept = default;
  explicit mapped_file(const std::filesystem::path& path) : file_(path) {
    size_ = file_.size();
    if (size_ > static_cast<std::uint64_t>(std::numeric_limits<std::size_t>::max())) {
      throw_io_error("map", path, EFBIG);
    }
    if (size_ != 0) {
      void* p = ::mmap(nullptr, static_cast<std::size_t>(size_), PROT_READ, MAP_PRIVATE,
                       file_.native_handle(), 0);
      if (p == MAP_FAILED) throw_io_error("map", path, errno);
      data_ = static_cast<const std::byte*>(p);
    }
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  mapped_file(mapped_file&& o) noexcept
      : file_(std::move(o.file_)),
        data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  mapped_file& operator=(mapped_file&& o) noexcept {
    if (this != &o) {
      unmap();
      file_ = std::move(o.file_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~mapped_file() { unmap(); }

  [[nodiscard]] std::span<const std::byte> bytes() const noexcept {
    return {data_, static_cast<std::size_t>(size_)};
  }
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }

  /// Copies the bytes [offset, offset + out.size()) of the file into `out` with pread: the kernel
  /// copies from the page cache, so the mapping is not faulted in page by page (a cache-warm
  /// 1 GiB load runs at twice the speed of a copy out of the mapping; docs/benchmarks.md).
  /// The range must lie inside the file (config_error otherwise).
  void read_at(std::uint64_t offset, std::span<std::byte> out) const {
    HONE_REQUIRE(offset <= size_ && out.size() <= size_ - offset,
                 "hone::io::mapped_file::read_at: bytes [" + std::to_string(offset) + ", " +
                     std::to_string(offset + out.size()) + ") are outside '" +
                     file_.path().string() + "' (" + std::to_string(size_) + " bytes)");
    if (!out.empty()) file_.read_at(offset, out);
  }

 private:
  void unmap() noexcept {
    if (data_ != nullptr) {
      ::munmap(const_cast<std::byte*>(data_), static_cast<std::size_t>(size_));
    }
    data_ = nullptr;
    size_ = 0;
  }
  input_file file_;
  const std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
};

}  // namespace io
HONE_NAMESPACE_END
