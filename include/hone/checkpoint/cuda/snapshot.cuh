// hone/checkpoint/cuda/snapshot.cuh: checkpoints of tensors in GPU memory, and of the CUDA trainer.
// Include only from .cu files (it needs the CUDA runtime; hone/checkpoint/writer.hpp stays
// host-only).
//
//   ck::checkpoint_writer w({.root = "ckpt", .async = true});
//   ...
//   w.save(step, [&](ck::snapshot& s) {
//     ck::device_snapshot d(s, stream);                  // copies on `stream`
//     d.add(ck::files::weights, "emb", {rows, dim}, emb_device_span);
//     d.add_arena(ck::files::optimizer, "exp_avg.", moments_arena);  // one copy per arena
//     d.finish();                                       // copies, one stream sync, conversions
//   });                                                 // the files are written in the background
//
//   w.save(step, [&](ck::snapshot& s) { ck::capture(t, s, extra); });   // a CUDA hone::trainer
//   ck::training_state st = ck::restore(t, ck::newest_valid("ckpt")->path);
//
// device_snapshot records device tensors; finish() turns the snapshot's staging buffer into
// page-locked host memory (cudaHostAlloc through pinned_host_space; the buffer stays with the
// snapshot, so a checkpoint_writer reuses it from save to save and grows it only when a checkpoint
// is larger than any before), reserves the room of every recorded tensor at once (so the buffer
// never moves under a copy in flight), issues one cudaMemcpyAsync per tensor on the given stream
// (neighbouring tensors of one allocation, e.g. the slots of an arena, merge into one copy),
// synchronizes that stream once and then converts the tensors stored in another dtype (their raw
// bytes land in the staging buffer's spare room first). When finish() returns the snapshot owns
// its bytes: the training stream may go on while the writer's thread writes the files. A failed
// CUDA call throws hone::cuda_error naming the call, after the stream has been synchronized (no
// copy still lands in the buffer).
//
// hone/checkpoint/trainer_checkpoint.hpp's capture() and restore() serve a trainer whose state
// lives on the device (hone/train/cuda/trainer.cuh) once this header is included: it supplies
// their device stager and loader (the one front is written once there), and the every_n_steps
// policy then checkpoints a CUDA trainer too. capture() stages the fp32 master weights (or the
// export dtype), every optimizer state arena and the same state.json as the host trainer, on the
// trainer's stream; restore() verifies the directory, reads each tensor into host memory, copies
// it to the device on the trainer's stream through two bounded pinned staging buffers (2 x 32 MiB
// whatever the checkpoint's size), publishes the working weights and synchronizes once. The files
// are the host trainer's: a checkpoint of one restores into the other.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/checkpoint/state.hpp"
#include "hone/checkpoint/tensor_file.hpp"
#include "hone/checkpoint/trainer_checkpoint.hpp"
#include "hone/checkpoint/verify.hpp"
#include "hone/checkpoint/writer.hpp"
#include "hone/core/arena.hpp"
#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/cuda/error.hpp"
#include "hone/core/cuda/space.hpp"
#include "hone/core/device_span.hpp"
#include "hone/core/error.hpp"
#include "hone/io/dtype.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// Copies tensors in device memory into a snapshot (see the file comment). Records with add*,
/// copies in finish(); nothing is in flight outside finish().
class device_snapshot {
 public:
  /// Copies into `s` on `stream` (null: the legacy default stream).
  explicit device_snapshot(snapshot& s, cudaStream_t stream = nullptr) noexcept
      : s_(&s), stream_(stream) {}
  device_snapshot(const device_snapshot&) = delete;
  device_snapshot& operator=(const device_snapshot&) = delete;

  /// A tag for tensors that lie in one device allocation: copies of neighbours with the same tag
  /// whose gaps match in device memory and in the staging buffer merge into one cudaMemcpyAsync.
  [[nodiscard]] std::size_t new_allocation_tag() noexcept { return ++tags_; }

  /// Records device tensor `data` for file `file`, stored as `export_as` (default: its dtype).
  template <class T>
  void add(std::string_view file, std::string name, shape_type shape, device_span<T> data,
           std::optional<io::dtype> export_as = std::nullopt, std::size_t allocation_tag = 0) {
    using V = std::remove_cv_t<T>;
    add_bytes(file, std::move(name), io::dtype_of<V>, export_as.value_or(io::dtype_of<V>),
              std::move(shape), static_cast<const void*>(data.data()), data.size_bytes(),
              allocation_tag);
  }

  /// Records `bytes` bytes at device address `device_data`, of dtype `source` and shape `shape`,
  /// stored as `stored`. config_error for a bad file name, a conversion dtype.hpp cannot do, or a
  /// shape that does not describe `bytes` bytes.
  void add_bytes(std::string_view file, std::string name, io::dtype source, io::dtype stored,
                 shape_type shape, const void* device_data, std::size_t bytes,
                 std::size_t allocation_tag = 0) {
    detail::check_tensor_file_name(file);
    HONE_REQUIRE(source == stored || io::can_convert(source, stored),
                 "hone::checkpoint::device_snapshot: cannot store " +
                     std::string(io::dtype_name(source)) + " as " +
                     std::string(io::dtype_name(stored)) + " (tensor '" + name + "')");
    const std::optional<std::uint64_t> want = checked_byte_size(shape, io::dtype_size(source));
    HONE_REQUIRE(want && *want == bytes,
                 "hone::checkpoint::device_snapshot: tensor '" + name + "' has shape " +
                     shape_string(shape) + " of " + std::string(io::dtype_name(source)) + " but " +
                     std::to_string(bytes) + " bytes; give the shape of the data");
    HONE_REQUIRE(device_data != nullptr || bytes == 0,
                 "hone::checkpoint::device_snapshot: tensor '" + name +
                     "' has a null device pointer; pass the device memory to copy");
    entries_.push_back({std::string(file), std::move(name), source, stored, std::move(shape),
                        static_cast<const std::byte*>(device_data), bytes,
                        bytes / io::dtype_size(source) * io::dtype_size(stored), allocation_tag});
  }

  /// Records every slot of a device arena as tensor `prefix + slot name` of file `file` (1-D, or
  /// the shape `shapes` gives the slot's name), copied with one cudaMemcpyAsync when stored in
  /// the arena's dtype.
  template <class T>
  void add_arena(std::string_view file, std::string_view prefix, const arena<T, cuda_space>& a,
                 const shape_map* shapes = nullptr,
                 std::optional<io::dtype> export_as = std::nullopt) {
    const std::size_t tag = new_allocation_tag();
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto& slot = a.layout()[i];
      add(file, std::string(prefix) + slot.name, shape_for(shapes, slot.name, slot.count),
          a.view(i), export_as, tag);
    }
  }

  /// Copies every recorded tensor into the snapshot (pinned staging, cudaMemcpyAsync on the
  /// stream, one cudaStreamSynchronize, then the dtype conversions) and forgets the records.
  void finish() {
    last_copies_ = 0;
    if (entries_.empty()) return;
    std::vector<entry> es = std::exchange(entries_, {});
    s_->set_allocator(staging_allocator::of<pinned_host_space>());
    std::size_t room = 0;
    for (const entry& e : es) {
      room += snapshot::aligned(e.stored_bytes);
      if (e.converts()) room += snapshot::aligned(e.bytes);
    }
    s_->reserve(room);  // nothing below moves the buffer
    std::vector<std::byte*> dst(es.size());
    for (std::size_t i = 0; i < es.size(); ++i) {
      entry& e = es[i];
      dst[i] = s_->add_uninitialized(e.file, std::move(e.name), e.stored, std::move(e.shape),
                                     e.stored_bytes)
                   .data();
    }
    const std::span<std::byte> spare = s_->spare();
    std::vector<std::byte*> raw(es.size(), nullptr);
    std::size_t used = 0;
    for (std::size_t i = 0; i < es.size(); ++i) {
      if (!es[i].converts()) continue;
      raw[i] = spare.data() + used;
      used += snapshot::aligned(es[i].bytes);
    }
    try {
      copy_all(es, dst, raw);
      HONE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    } catch (...) {
      (void)cudaStreamSynchronize(stream_);  // no copy may land in the buffer after this throws
      (void)cudaGetLastError();
      throw;
    }
    for (std::size_t i = 0; i < es.size(); ++i) {
      const entry& e = es[i];
      if (!e.converts()) continue;
      io::convert(std::span<const std::byte>(raw[i], e.bytes), e.source,
                  std::span<std::byte>(dst[i], e.stored_bytes), e.stored);
    }
  }

  /// Tensors recorded and not copied yet.
  [[nodiscard]] std::size_t pending() const noexcept { return entries_.size(); }
  /// The cudaMemcpyAsync calls the last finish() issued.
  [[nodiscard]] std::size_t last_copies() const noexcept { return last_copies_; }

 private:
  struct entry {
    std::string file;
    std::string name;
    io::dtype source;
    io::dtype stored;
    shape_type shape;
    const std::byte* data;
    std::size_t bytes;
    std::size_t stored_bytes;
    std::size_t tag;
    [[nodiscard]] bool converts() const noexcept { return source != stored; }
  };

  static shape_type shape_for(const shape_map* shapes, std::string_view name, std::size_t count) {
    if (shapes != nullptr) {
      if (const auto it = shapes->find(name); it != shapes->end()) return it->second;
    }
    return shape_type{count};
  }

  void copy_all(const std::vector<entry>& es, const std::vector<std::byte*>& dst,
                const std::vector<std::byte*>& raw) {
    // A run of copies merged into one: [from, from + bytes) -> [to, to + bytes).
    std::uintptr_t from = 0;
    std::byte* to = nullptr;
    std::size_t bytes = 0;
    std::size_t tag = 0;
    const auto flush = [&] {
      if (bytes == 0) return;
      HONE_CUDA_CHECK(cudaMemcpyAsync(to, reinterpret_cast<const void*>(from), bytes,
                                      cudaMemcpyDeviceToHost, stream_));
      ++last_copies_;
      bytes = 0;
    };
    for (std::size_t i = 0; i < es.size(); ++i) {
      const entry& e = es[i];
      if (e.bytes == 0) continue;
      const auto src = reinterpret_cast<std::uintptr_t>(e.data);
      std::byte* out = e.converts() ? raw[i] : dst[i];
      // Merge direct copies of one allocation when the gap is the same on both sides (the
      // staging gap is padding between consecutive tensors; the device gap lies in the
      // allocation).
      if (bytes != 0 && !e.converts() && e.tag != 0 && e.tag == tag && src >= from + bytes &&
          out >= to + bytes && src - from == static_cast<std::uintptr_t>(out - to)) {
        bytes = static_cast<std::size_t>(out - to) + e.bytes;
        continue;
      }
      flush();
      if (e.converts()) {
        HONE_CUDA_CHECK(cudaMemcpyAsync(out, e.data, e.bytes, cudaMemcpyDeviceToHost, stream_));
        ++last_copies_;
        continue;
      }
      from = src;
      to = out;
      bytes = e.bytes;
      tag = e.tag;
    }
    flush();
  }

  snapshot* s_;
  cudaStream_t stream_;
  std::vector<entry> entries_;
  std::size_t tags_ = 0;
  std::size_t last_copies_ = 0;
};

/// A hone::trainer whose state lives in CUDA device memory (hone/train/cuda/trainer.cuh). A CUDA
/// trainer with the offload role is not one: its master weights and optimizer state are the
/// offload engine's host memory, and the host stager serves it.
template <class Trainer>
concept device_trainer = detail::device_state_trainer_v<Trainer>;

namespace detail {
/// capture()'s stager for a CUDA trainer (trainer_checkpoint.hpp): the same files as the host's,
/// recorded in a device_snapshot on the trainer's stream and copied in finish() (one stream
/// synchronization).
template <>
class trainer_stager<true> {
 public:
  template <class Trainer>
  trainer_stager(Trainer& t, snapshot& s)
      : d_(s, t.exec().stream),
        // The trainer's own master arena is one allocation; bound zero-copy, the master weights
        // are the model's tensors, which may be separate allocations that merely lie next to
        // each other.
        weights_tag_(t.zero_copy() ? 0 : d_.new_allocation_tag()) {}
  void add_weights(const std::string& name, shape_type shape, device_span<float> master,
                   io::dtype stored) {
    d_.add(files::weights, name, std::move(shape), device_span<const float>(master), stored,
           weights_tag_);
  }
  template <class Arena>
  void add_state(const std::string& prefix, const Arena& a, const trainer_save_options& o) {
    d_.add_arena(files::optimizer, prefix, a, o.shapes);
  }
  void finish() { d_.finish(); }

 private:
  device_snapshot d_;
  std::size_t weights_tag_;
};

/// restore()'s loader for a CUDA trainer: each tensor is read (and converted to its arena's dtype)
/// into host memory, then copied to the device through two pinned staging buffers of at most
/// `staging_bytes` each, alternating, on the trainer's stream: the pinned memory a restore takes
/// is bounded (2 x 32 MiB by default) whatever the checkpoint's size, and a chunk's copy overlaps
/// the memcpy into the other buffer. finish() synchronizes the stream once.
template <>
class trainer_loader<true> {
 public:
  static constexpr std::size_t default_staging_bytes = std::size_t{32} << 20;

  template <class Trainer>
  explicit trainer_loader(Trainer& t, std::size_t staging_bytes = default_staging_bytes)
      : stream_(t.exec().stream), chunk_(staging_bytes) {
    HONE_REQUIRE(chunk_ > 0, "hone::checkpoint::restore (CUDA): the staging size must be positive");
    for (cudaEvent_t& e : copied_) {
      HONE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
  }
  trainer_loader(const trainer_loader&) = delete;
  trainer_loader& operator=(const trainer_loader&) = delete;
  ~trainer_loader() {
    if (!synced_) {  // an exception is on its way: let the copies finish before freeing
      (void)cudaStreamSynchronize(stream_);
      (void)cudaGetLastError();
    }
    for (cudaEvent_t e : copied_) (void)cudaEventDestroy(e);
  }

  void load_weights(const tensor_file& f, const std::string& name, device_span<float> out) {
    load(f, name, out.data(), out.size());
  }
  template <class Arena>
  void load_state(const tensor_file& f, Arena& a, const std::string& prefix) {
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto v = a.view(i);
      load(f, prefix + a.layout()[i].name, v.data(), v.size());
    }
  }
  /// Waits for every copy (and the stream's earlier work, e.g. publish_weights).
  void finish() {
    synced_ = true;
    HONE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  /// The largest pinned allocation one staging buffer has reached (at most the staging size).
  [[nodiscard]] std::size_t staging_capacity() const noexcept {
    return std::max(staging_[0].size(), staging_[1].size());
  }

 private:
  /// Reads tensor `name` of `f` (converting its dtype to T) and copies it to the `count` elements
  /// at `device`, stream-ordered, chunk by chunk through the staging buffers.
  template <class T>
  void load(const tensor_file& f, const std::string& name, T* device, std::size_t count) {
    std::vector<T> host(count);
    f.read_into(name, std::span<T>(host));
    const auto* src = reinterpret_cast<const std::byte*>(host.data());
    auto* dst = reinterpret_cast<std::byte*>(device);
    std::size_t left = count * sizeof(T);
    while (left > 0) {
      const std::size_t k = next_;
      next_ ^= 1U;
      if (in_flight_[k]) HONE_CUDA_CHECK(cudaEventSynchronize(copied_[k]));  // buffer k is free
      in_flight_[k] = false;
      const std::size_t n = std::min(left, chunk_);
      if (staging_[k].size() < n) {
        staging_[k] = buffer<std::byte, pinned_host_space>();  // free before allocating more
        staging_[k] = buffer<std::byte, pinned_host_space>(std::min(chunk_, std::max(n, left)));
      }
      std::memcpy(staging_[k].data(), src, n);
      HONE_CUDA_CHECK(cudaMemcpyAsync(dst, staging_[k].data(), n, cudaMemcpyHostToDevice, stream_));
      HONE_CUDA_CHECK(cudaEventRecord(copied_[k], stream_));
      in_flight_[k] = true;
      src += n;
      dst += n;
      left -= n;
    }
  }

  cudaStream_t stream_;
  std::size_t chunk_;
  bool synced_ = false;
  buffer<std::byte, pinned_host_space> staging_[2];
  cudaEvent_t copied_[2] = {nullptr, nullptr};
  bool in_flight_[2] = {false, false};
  unsigned next_ = 0;
};
}  // namespace detail

}  // namespace checkpoint
HONE_NAMESPACE_END
