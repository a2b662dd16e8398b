// hone/checkpoint/writer.hpp: saving checkpoints, synchronously or in the background.
//
//   ck::checkpoint_writer w({.root = "ckpt", .async = true, .busy = ck::on_busy::skip,
//                            .retention = ck::retention_policy{.keep_last = 3}});
//   for (...) {
//     t.step(batch);
//     w.check();                                     // a failed background save throws here
//     if (step % 100 == 0)
//       w.save(step, [&](ck::snapshot& s) { ck::capture(t, s, extra_state); });
//   }
//   w.wait();                                        // the last save is committed (or throws)
//
// A snapshot copies every tensor into one staging buffer that is reused between saves (no
// allocation once it has grown to the checkpoint's size). The buffer is pageable host memory by
// default; tensors in GPU memory are copied by hone/checkpoint/cuda/snapshot.cuh (from .cu files:
// this header stays host-only), which switches it to page-locked memory (staging_allocator,
// cudaHostAlloc through pinned_host_space), reserves the room of all its tensors at once
// (reserve(), add_uninitialized()) and fills it with cudaMemcpyAsync and one stream
// synchronization. The background thread writes the files of the snapshot while training
// continues: at most one save is in flight; when the next save point comes while it still runs,
// on_busy::wait blocks until it is done, on_busy::skip skips this save (counted in
// saves_skipped()). An error in the background (disk full, permissions) is kept and thrown by the
// next check(), save() or wait(), never swallowed. Each save is an atomic directory
// (directory.hpp); retention runs after each commit.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/checkpoint/directory.hpp"
#include "hone/checkpoint/retention.hpp"
#include "hone/checkpoint/safetensors.hpp"
#include "hone/checkpoint/state.hpp"
#include "hone/checkpoint/tensor_file.hpp"
#include "hone/checkpoint/verify.hpp"
#include "hone/core/config.hpp"
#include "hone/core/device_span.hpp"
#include "hone/core/error.hpp"
#include "hone/core/space.hpp"
#include "hone/io/directory.hpp"
#include "hone/io/dtype.hpp"
#include "hone/profile/zone.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// How a snapshot's staging buffer is allocated: pageable host memory by default, page-locked
/// (pinned) memory for tensors copied from a GPU (of<pinned_host_space>(), which the device
/// snapshot of hone/checkpoint/cuda/snapshot.cuh selects by itself).
struct staging_allocator {
  void* (*allocate)(std::size_t bytes) = &space_traits<host_space>::allocate;
  void (*deallocate)(void* p, std::size_t bytes) noexcept = &space_traits<host_space>::deallocate;
  bool page_locked = false;  // cudaHostAlloc'ed: device-to-host copies into it are asynchronous

  /// The allocator of a host-accessible memory space.
  template <memory_space Space>
  requires host_accessible_v<Space>
  [[nodiscard]] static staging_allocator of() noexcept {
    bool pinned = false;
    if constexpr (requires { space_traits<Space>::pinned(); })
      pinned = space_traits<Space>::pinned();
    return {&space_traits<Space>::allocate, &space_traits<Space>::deallocate, pinned};
  }
};

namespace detail {
template <class R>
inline constexpr bool is_device_span_v = false;
template <class T>
inline constexpr bool is_device_span_v<device_span<T>> = true;

/// The staging bytes of a snapshot: one allocation of a staging_allocator, move-only.
class staging_bytes {
 public:
  staging_bytes() = default;
  staging_bytes(staging_allocator a, std::size_t n)
      : alloc_(a), data_(static_cast<std::byte*>(a.allocate(n))), size_(n) {}
  staging_bytes(staging_bytes&& o) noexcept
      : alloc_(o.alloc_),
        data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  staging_bytes& operator=(staging_bytes&& o) noexcept {
    if (this != &o) {
      release();
      alloc_ = o.alloc_;
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  staging_bytes(const staging_bytes&) = delete;
  staging_bytes& operator=(const staging_bytes&) = delete;
  ~staging_bytes() { release(); }

  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] const staging_allocator& allocator() const noexcept { return alloc_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) alloc_.deallocate(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }
  staging_allocator alloc_{};
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

inline void check_tensor_file_name(std::string_view file) {
  HONE_REQUIRE(
      is_valid_manifest_name(file) && file != files::manifest && file != files::state,
      "hone::checkpoint::snapshot: '" + std::string(file) + "' cannot be a tensor file name");
}
}  // namespace detail

/// Everything one checkpoint holds, copied out of the training objects: tensor files (each a list
/// of tensors in the shared staging buffer) and the training state.
class snapshot {
 public:
  training_state state;

  /// Adds a tensor to file `file` (e.g. files::weights), copying its bytes into the staging
  /// buffer; stored as `export_as` (default: its own dtype).
  template <std::ranges::contiguous_range R>
  requires std::ranges::sized_range<R>
  void add(std::string_view file, std::string name, shape_type shape, const R& data,
           std::optional<io::dtype> export_as = std::nullopt) {
    static_assert(!detail::is_device_span_v<std::remove_cvref_t<R>>,
                  "hone::checkpoint::snapshot::add: this is a view of device memory "
                  "(hone::device_span); copy it with hone::checkpoint::device_snapshot from "
                  "hone/checkpoint/cuda/snapshot.cuh (in a .cu file), which stages it through "
                  "pinned memory");
    using T = std::remove_cv_t<std::ranges::range_value_t<R>>;
    const auto bytes = std::as_bytes(std::span<const T>(
        std::ranges::data(data), static_cast<std::size_t>(std::ranges::size(data))));
    add_bytes(file, std::move(name), io::dtype_of<T>, export_as.value_or(io::dtype_of<T>),
              std::move(shape), bytes);
  }

  /// Adds raw little-endian bytes of dtype `source`, stored as `stored`.
  void add_bytes(std::string_view file, std::string name, io::dtype source, io::dtype stored,
                 shape_type shape, std::span<const std::byte> bytes) {
    detail::check_tensor_file_name(file);
    HONE_REQUIRE(source == stored || io::can_convert(source, stored),
                 "hone::checkpoint::snapshot: cannot store " + std::string(io::dtype_name(source)) +
                     " as " + std::string(io::dtype_name(stored)));
    const std::size_t n = bytes.size() / io::dtype_size(source) * io::dtype_size(stored);
    const std::span<std::byte> dst = append(file, std::move(name), stored, std::move(shape), n);
    if (source == stored) {
      if (n > 0) std::memcpy(dst.data(), bytes.data(), n);
    } else {
      io::convert(bytes, source, dst, stored);  // converted now: the snapshot owns its bytes
    }
  }

  // ---- for producers that fill the staging buffer themselves (cuda/snapshot.cuh) ----

  /// Every tensor starts on this boundary of the staging buffer.
  static constexpr std::size_t alignment = 64;
  /// `bytes` rounded up to the alignment: what a tensor of `bytes` takes at most in reserve().
  [[nodiscard]] static constexpr std::size_t aligned(std::size_t bytes) noexcept {
    return (bytes + alignment - 1) / alignment * alignment;
  }

  /// Makes room for `bytes` more bytes after the tensors held (count each future tensor as
  /// aligned(size)): the next add_uninitialized() calls within that room do not move the buffer.
  void reserve(std::size_t bytes) { reserve_staging(aligned(used_) + bytes); }

  /// Adds tensor `name` of dtype `stored` and shape `shape` to file `file` and returns its
  /// `bytes` bytes in the staging buffer, uninitialized: the caller fills them before the snapshot
  /// is written. The span stays valid until the next add, reserve or allocator change (which may
  /// move the buffer). config_error when the shape does not describe `bytes` bytes.
  [[nodiscard]] std::span<std::byte> add_uninitialized(std::string_view file, std::string name,
                                                       io::dtype stored, shape_type shape,
                                                       std::size_t bytes) {
    detail::check_tensor_file_name(file);
    const std::optional<std::uint64_t> want = checked_byte_size(shape, io::dtype_size(stored));
    HONE_REQUIRE(want && *want == bytes,
                 "hone::checkpoint::snapshot: tensor '" + name + "' has shape " +
                     shape_string(shape) + " of " + std::string(io::dtype_name(stored)) + " but " +
                     std::to_string(bytes) + " bytes; give the shape of the data");
    return append(file, std::move(name), stored, std::move(shape), bytes);
  }

  /// The staging capacity past the (aligned) end of the tensors held: scratch space that the next
  /// add overwrites (device snapshots land unconverted bytes here before converting them).
  [[nodiscard]] std::span<std::byte> spare() noexcept {
    const std::size_t start = std::min(aligned(used_), staging_.size());
    return {staging_.data() + start, staging_.size() - start};
  }

  /// How the staging buffer is allocated.
  [[nodiscard]] const staging_allocator& allocator() const noexcept { return staging_.allocator(); }
  /// Moves the staging buffer to memory of allocator `a` (the contents are kept). Nothing is done
  /// when `a` allocates as the current one does.
  void set_allocator(staging_allocator a) {
    const staging_allocator& cur = staging_.allocator();
    if (a.allocate == cur.allocate && a.deallocate == cur.deallocate) return;
    detail::staging_bytes moved(a, staging_.size());
    if (used_ > 0) std::memcpy(moved.data(), staging_.data(), used_);
    staging_ = std::move(moved);
  }
  /// The staging buffer (null before the first tensor): the same pointer across saves once it is
  /// large enough.
  [[nodiscard]] const std::byte* staging_data() const noexcept { return staging_.data(); }

  /// Sets a "__metadata__" entry of tensor file `file`.
  void set_metadata(std::string_view file, std::string key, std::string value) {
    part_for(file).metadata.insert_or_assign(std::move(key), std::move(value));
  }

  /// Forgets the contents; the staging buffer keeps its capacity for the next save.
  void clear() noexcept {
    parts_.clear();
    used_ = 0;
    state = training_state{};
  }

  /// Bytes of tensor data held, and the staging buffer's capacity.
  [[nodiscard]] std::size_t bytes() const noexcept { return used_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return staging_.size(); }

  /// Writes the tensor files and state.json into `dir` (files go through pending_checkpoint).
  void write_into(pending_checkpoint& pc, const write_options& options) const {
    for (const part& p : parts_) {
      tensor_writer w;
      for (const item& it : p.items) {
        w.add(it.name, it.stored, it.shape,
              std::span<const std::byte>(staging_.data() + it.offset, it.bytes));
      }
      for (const auto& [k, v] : p.metadata) w.set_metadata(k, v);
      pc.add(p.file, write_tensors(w, pc.file(p.file), options));
    }
    pc.add(std::string(files::state), write_state(pc.file(files::state), state, options.sync));
  }

 private:
  struct item {
    std::string name;
    io::dtype stored;
    shape_type shape;
    std::size_t offset;
    std::size_t bytes;
  };
  struct part {
    std::string file;
    std::vector<item> items;
    metadata_map metadata;
  };
  std::span<std::byte> append(std::string_view file, std::string name, io::dtype stored,
                              shape_type shape, std::size_t n) {
    const std::size_t offset = aligned(used_);
    reserve_staging(offset + n);
    used_ = offset + n;
    part& p = part_for(file);
    p.items.push_back({std::move(name), stored, std::move(shape), offset, n});
    return {staging_.data() + offset, n};
  }
  part& part_for(std::string_view file) {
    for (part& p : parts_) {
      if (p.file == file) return p;
    }
    return parts_.emplace_back(part{std::string(file), {}, {}});
  }
  void reserve_staging(std::size_t n) {
    if (n <= staging_.size()) return;
    detail::staging_bytes bigger(staging_.allocator(),
                                 std::max(n, staging_.size() + staging_.size() / 2));
    if (used_ > 0) std::memcpy(bigger.data(), staging_.data(), used_);
    staging_ = std::move(bigger);
  }
  std::vector<part> parts_;
  detail::staging_bytes staging_;
  std::size_t used_ = 0;
};

/// Writes `s` as the checkpoint of `step` under `root` (atomically); returns its path.
inline std::filesystem::path write_snapshot(const std::filesystem::path& root, std::uint64_t step,
                                            const snapshot& s, const write_options& options = {}) {
  pending_checkpoint pc = pending_checkpoint::for_step(root, step);
  s.write_into(pc, options);
  return pc.commit();
}

/// What save() does when the previous background save still runs.
enum class on_busy { wait, skip };

/// How a checkpoint_writer saves.
struct writer_options {
  std::filesystem::path root{};                      // the run's checkpoint directory
  bool async = false;                                // write in a background thread
  on_busy busy = on_busy::wait;                      // async: when a save is still running
  std::optional<compression_options> compression{};  // none: plain safetensors
  bool sync = true;                                  // fsync files and directories
  std::optional<retention_policy> retention{};       // applied after each commit
  bool clean_leftovers = true;                       // remove killed writers' temporaries at start
  /// Called by the destructor with a background save's error that nobody observed (no save(),
  /// check(), wait() or close() after it failed): a destructor cannot throw, and the error must
  /// not vanish. Default (empty): the error is printed to stderr, naming the root.
  std::function<void(std::exception_ptr)> on_unobserved_error{};
};

/// Saves checkpoints of a run under one root, synchronously or one at a time in the background.
class checkpoint_writer {
 public:
  explicit checkpoint_writer(writer_options options) : options_(std::move(options)) {
    HONE_REQUIRE(!options_.root.empty(), "hone::checkpoint::checkpoint_writer: the root is empty");
    io::ensure_directory(options_.root);
    if (options_.clean_leftovers) cleaned_ = clean_leftovers(options_.root);
    if (options_.async) {
      worker_ = std::thread([this] {
        profile::set_thread_name("hone.checkpoint.writer");
        run();
      });
    }
  }
  checkpoint_writer(const checkpoint_writer&) = delete;
  checkpoint_writer& operator=(const checkpoint_writer&) = delete;
  /// Waits for the save in flight. A background error nobody observed goes to
  /// writer_options::on_unobserved_error (default: stderr); call close() to have it thrown.
  ~checkpoint_writer() {
    stop_worker();
    std::exception_ptr err;
    {
      std::lock_guard lock(mutex_);
      err = std::exchange(error_, nullptr);
    }
    if (!err) return;
    if (options_.on_unobserved_error) {
      try {
        options_.on_unobserved_error(err);
      } catch (...) {  // a destructor must not throw
      }
      return;
    }
    try {
      std::rethrow_exception(err);
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "hone::checkpoint::checkpoint_writer (root '%s'): a background save failed "
                   "and the error was never checked: %s\n",
                   options_.root.c_str(), e.what());
    } catch (...) {
      std::fprintf(stderr,
                   "hone::checkpoint::checkpoint_writer (root '%s'): a background save failed "
                   "with a non-standard exception and the error was never checked\n",
                   options_.root.c_str());
    }
  }

  /// Waits for the save in flight, stops the background thread and throws its error, if any:
  /// the end of a run (the destructor cannot throw). save() afterwards is a config_error.
  void close() {
    stop_worker();
    std::lock_guard lock(mutex_);
    closed_ = true;
    rethrow_locked();
  }

  /// Saves the checkpoint of `step`: `fill(snapshot&)` copies the state into the (reused)
  /// snapshot; then the files are written, now or in the background. Returns false when the save
  /// was skipped (async, on_busy::skip, a save still running). Rethrows a background error.
  /// `fill` runs without the writer's lock held (the background thread is idle then), so it may
  /// call check(), busy() and the other accessors.
  template <class Fill>
  bool save(std::uint64_t step, Fill&& fill) {
    HONE_ZONE("hone.checkpoint.save");  // the caller's stall: waiting, the snapshot, a sync write
    std::unique_lock lock(mutex_);
    HONE_REQUIRE(!closed_, "hone::checkpoint::checkpoint_writer::save: the writer was closed");
    HONE_REQUIRE(!filling_,
                 "hone::checkpoint::checkpoint_writer::save: called from inside a save's fill "
                 "callback; save again after it returns");
    rethrow_locked();
    if (options_.async && pending_) {
      if (options_.busy == on_busy::skip) {
        ++skipped_;
        return false;
      }
      done_cv_.wait(lock, [&] { return !pending_; });
      rethrow_locked();
    }
    filling_ = true;  // the snapshot is ours until pending_ is set
    lock.unlock();
    try {
      HONE_ZONE("hone.checkpoint.snapshot");
      snapshot_.clear();
      fill(snapshot_);
    } catch (...) {
      lock.lock();
      filling_ = false;
      throw;
    }
    if (!options_.async) {
      lock.lock();
      filling_ = false;
      lock.unlock();
      write_one(step);
      return true;
    }
    lock.lock();
    filling_ = false;
    step_ = step;
    pending_ = true;
    lock.unlock();
    cv_.notify_all();
    return true;
  }

  /// Throws the error of a failed background save, if any (once). Cheap: call it every step.
  void check() {
    std::lock_guard lock(mutex_);
    rethrow_locked();
  }
  /// Waits until no save is in flight, then check().
  void wait() {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [&] { return !pending_; });
    rethrow_locked();
  }
  /// Whether a background save is in flight.
  [[nodiscard]] bool busy() const {
    std::lock_guard lock(mutex_);
    return pending_;
  }
  [[nodiscard]] std::size_t saves_skipped() const {
    std::lock_guard lock(mutex_);
    return skipped_;
  }
  [[nodiscard]] std::size_t saves_committed() const {
    std::lock_guard lock(mutex_);
    return committed_;
  }
  /// The newest checkpoint this writer committed.
  [[nodiscard]] std::optional<std::filesystem::path> last_committed() const {
    std::lock_guard lock(mutex_);
    return last_;
  }
  /// The temporaries removed at construction.
  [[nodiscard]] const std::vector<std::filesystem::path>& cleaned() const noexcept {
    return cleaned_;
  }
  [[nodiscard]] const writer_options& options() const noexcept { return options_; }
  /// The staging snapshot (its capacity shows the buffer is reused).
  [[nodiscard]] const snapshot& staging() const noexcept { return snapshot_; }

 private:
  void stop_worker() noexcept {
    if (!worker_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  void rethrow_locked() {
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  void write_one(std::uint64_t step) {
    HONE_ZONE("hone.checkpoint.write");  // the files, fsyncs and the commit
    const std::filesystem::path p =
        write_snapshot(options_.root, step, snapshot_,
                       {.compression = options_.compression, .sync = options_.sync});
    if (options_.retention) {
      HONE_ZONE("hone.checkpoint.retention");
      (void)apply_retention(options_.root, *options_.retention, step);
    }
    std::lock_guard lock(mutex_);
    last_ = p;
    ++committed_;
  }

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || pending_; });
      if (!pending_) return;  // stop_ and nothing to write
      const std::uint64_t step = step_;
      lock.unlock();
      std::exception_ptr err;
      try {
        write_one(step);
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      if (err) error_ = err;
      pending_ = false;
      done_cv_.notify_all();
    }
  }

  writer_options options_;
  snapshot snapshot_;
  std::vector<std::filesystem::path> cleaned_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  std::thread worker_;
  bool stop_ = false;
  bool pending_ = false;
  bool filling_ = false;  // a save's fill callback is running (without the lock)
  bool closed_ = false;
  std::uint64_t step_ = 0;
  std::exception_ptr error_;
  std::size_t skipped_ = 0;
  std::size_t committed_ = 0;
  std::optional<std::filesystem::path> last_;
};

}  // namespace checkpoint
HONE_NAMESPACE_END
