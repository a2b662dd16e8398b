// hone/data/cuda/staging.hpp: loader batches staged to the device on the user's stream. The
// loader's collate writes into pinned_batch objects (pinned memory, hone/data/pinned_batch.hpp);
// cuda_stager copies each batch with cudaMemcpyAsync on the user's stream into one of a ring of
// device buffers and records an event after the copy; the user's kernels queued on that stream
// read the device batch in stream order.
//
//   hone::data::batch_layout layout(64);
//   layout.add<std::int32_t>("tokens", 2048).add<float>("weight", 1);
//   hone::data::loader ld(ds, hone::data::pinned_batch(layout), collate,
//                         {.batch_size = 64, .threads = 2, .prefetch = 3});
//   hone::data::cuda_stager stage(ld, layout, stream);           // 2 device buffers by default
//   while (const hone::data::device_batch* b = stage.next()) {   // nullptr: the epoch ended
//     auto tokens = b->field<std::int32_t>(0);                   // device_span, padded_rows rows
//     step<<<grid, block, 0, stream>>>(tokens, b->info.rows);    // on the same stream
//   }
//
// Pinned buffers. They are the loader's own prefetch + 1 reused batches (a ring of at least 2):
// the collate writes straight into page-locked memory and there is no extra host copy. The loader
// refills a batch as soon as next() is called again, so before calling the loader's next() the
// stager waits (cudaEventSynchronize, only at that point) for the event recorded after the copy
// of the batch it holds. That copy was queued behind the previous step's work on the stream, so
// the call that returns batch m waits at most until step m - 2 (the work queued before batch
// m - 1's copy) has finished: the GPU works on step m - 1 while the loader's threads assemble
// the following batches and the host queues step m. Nothing else waits on the host.
//
// Device buffers. A ring of `device_buffers` (>= 2) blocks of layout.bytes() each; the m-th batch
// goes to block m mod device_buffers. Copies into a block are queued on the user's stream, so they
// run after every piece of work queued on that stream before them.
//
// Lifetime (exact rule). The device_batch returned by next() (the object and info.indices, which
// point into the loader's batch) is valid until the next call of next() or the stager's
// destruction. Its device memory holds the batch for all work queued on `stream` before the call
// of next() that returns the device_buffers-th following batch (that call's copy reuses the block;
// calls returning nullptr copy nothing; with the default 2: work queued before the call that
// returns the batch after next). Work on another stream must wait for copied() (recorded after
// the copy) before reading, and be ordered before the copy that reuses the block (record an event
// on that stream and make `stream` wait for it). The stager owns the device memory; it frees it
// when destroyed, after waiting for its copies.
//
// Sizes. Every batch the loader delivers must have the stager's layout (the same fields, element
// sizes, counts per row and rows): another layout is a config_error naming the field. A layout
// with fewer rows than the loader's batch_size is refused when the stager is built. Short batches
// (the last batch of an epoch with last_batch::keep, or one that lost skipped records) copy only
// their padded_rows rows of each field; fields of 0 bytes copy nothing and have a null pointer.
//
// Threads: one consumer thread calls next(), as for the loader; do not call the loader's own
// next() while a stager reads it (it would refill the batch under the copy in flight). Resume:
// save ld.state() after the step that used the last batch, exactly as without the stager.
#pragma once

#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/cuda/error.hpp"
#include "hone/core/cuda/space.hpp"
#include "hone/core/device_span.hpp"
#include "hone/core/error.hpp"
#include "hone/data/loader.hpp"
#include "hone/data/pinned_batch.hpp"

HONE_NAMESPACE_BEGIN
namespace data {

struct stager_options {
  std::size_t device_buffers = 2;  // the ring of device blocks (>= 2)
};

/// A batch in device memory, as cuda_stager::next() hands it out (lifetime: header comment).
class device_batch {
 public:
  batch_info info;  // as the loader gave it (info.indices valid until the next next())

  [[nodiscard]] const batch_layout& layout() const noexcept { return *layout_; }
  /// Rows copied (padded_rows: the real rows, plus padding with last_batch::pad).
  [[nodiscard]] std::size_t rows() const noexcept { return info.padded_rows; }
  /// The device block holding the batch (field k at layout().field(k).offset); may be null when
  /// the layout has 0 bytes.
  [[nodiscard]] std::byte* data() const noexcept { return block_; }
  /// Which of the stager's device blocks holds it.
  [[nodiscard]] std::size_t block() const noexcept { return index_; }

  /// Field k in device memory: rows() * row_elements elements of T (T of the size the field was
  /// added with); row r starts at element r * row_elements. Null data for a field of 0 bytes.
  template <class T>
  [[nodiscard]] device_span<T> field(std::size_t k) const {
    const batch_field& f = layout_->field(k);
    detail::check_field_type<T>(f, k, "hone::data::device_batch::field");
    const std::size_t n = f.row_elements * rows();
    if (n == 0) return {};
    return {reinterpret_cast<T*>(block_ + f.offset), n};
  }
  template <class T>
  [[nodiscard]] device_span<T> field(std::string_view name) const {
    return field<T>(layout_->index_of(name));
  }
  /// Elements per row of field k (its shape is rows() x row_elements(k)).
  [[nodiscard]] std::size_t row_elements(std::size_t k) const {
    return layout_->field(k).row_elements;
  }

 private:
  template <class Loader>
  friend class cuda_stager;
  const batch_layout* layout_ = nullptr;
  std::byte* block_ = nullptr;
  std::size_t index_ = 0;
};

namespace detail {
/// An owned CUDA event without timing (created and destroyed with checks).
class staging_event {
 public:
  staging_event() { HONE_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  staging_event(staging_event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  staging_event(const staging_event&) = delete;
  staging_event& operator=(const staging_event&) = delete;
  staging_event& operator=(staging_event&&) = delete;
  ~staging_event() {
    if (e_ != nullptr) (void)cudaEventDestroy(e_);
  }
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};
}  // namespace detail

/// Copies a loader's pinned batches to device memory on the user's stream (header comment).
/// Not movable: it holds the loader by reference and hands out pointers to its own members.
template <class Loader>
class cuda_stager {
  static_assert(std::same_as<typename Loader::batch_type, pinned_batch>,
                "hone::data::cuda_stager: the loader's batch type must be "
                "hone::data::pinned_batch (pass hone::data::pinned_batch(layout) as the loader's "
                "prototype): the stager copies the batch's pinned block to the device as it is");

 public:
  /// Stages the batches of `ld` (which must outlive the stager) laid out by `layout`, copying on
  /// `stream` (0: the legacy default stream).
  cuda_stager(Loader& ld, batch_layout layout, cudaStream_t stream, stager_options options = {})
      : ld_(ld), layout_(std::move(layout)), stream_(stream), options_(options) {
    HONE_REQUIRE(options_.device_buffers >= 2,
                 "hone::data::cuda_stager: device_buffers is " +
                     std::to_string(options_.device_buffers) +
                     "; at least 2 are needed so that the copy of the next batch can overlap the "
                     "current step");
    HONE_REQUIRE(layout_.rows() >= ld_.options().batch_size,
                 "hone::data::cuda_stager: the layout holds " + std::to_string(layout_.rows()) +
                     " rows but the loader's batch_size is " +
                     std::to_string(ld_.options().batch_size) +
                     "; build the layout with batch_layout(batch_size)");
    blocks_.reserve(options_.device_buffers);
    events_.reserve(options_.device_buffers);
    for (std::size_t i = 0; i < options_.device_buffers; ++i) {
      blocks_.emplace_back(layout_.bytes());
      events_.emplace_back();
    }
    batch_.layout_ = &layout_;
  }
  cuda_stager(const cuda_stager&) = delete;
  cuda_stager& operator=(const cuda_stager&) = delete;
  /// Waits for the copies it queued (the loader's batch it holds and its device blocks are then
  /// free to be reused or released).
  ~cuda_stager() {
    for (const auto& e : events_) (void)cudaEventSynchronize(e.get());
  }

  /// The next batch in device memory, or nullptr once when the epoch ends (as loader::next()).
  /// Blocks only to wait for the copy of the batch handed out by the previous call (header
  /// comment). Throws what the loader's next() throws, config_error for a batch of another
  /// layout, cuda_error for a failed copy.
  const device_batch* next() {
    if (held_) {  // the loader refills the batch we copied from once its next() is called
      HONE_CUDA_CHECK(cudaEventSynchronize(events_[last_].get()));
      held_ = false;
    }
    loaded_batch<pinned_batch>* hb = ld_.next();
    if (hb == nullptr) return nullptr;
    check(*hb);
    const std::size_t j = next_block_;
    std::byte* dst = blocks_[j].data();
    const std::byte* src = hb->data.data();
    const std::size_t rows = hb->info.padded_rows;
    try {
      held_ = true;
      last_ = j;
      if (rows == layout_.rows()) {  // a full batch: the whole block in one copy
        if (layout_.bytes() != 0) {
          HONE_CUDA_CHECK(
              cudaMemcpyAsync(dst, src, layout_.bytes(), cudaMemcpyHostToDevice, stream_));
        }
      } else {  // a short batch: the rows it has, field by field
        for (const batch_field& f : layout_.fields()) {
          const std::size_t n = rows * f.row_bytes();
          if (n == 0) continue;
          HONE_CUDA_CHECK(
              cudaMemcpyAsync(dst + f.offset, src + f.offset, n, cudaMemcpyHostToDevice, stream_));
        }
      }
      HONE_CUDA_CHECK(cudaEventRecord(events_[j].get(), stream_));
    } catch (...) {
      // A copy may have been queued without its event: wait for the stream so the loader's batch
      // is not refilled under it.
      (void)cudaStreamSynchronize(stream_);
      (void)cudaGetLastError();
      held_ = false;
      throw;
    }
    next_block_ = (j + 1) % blocks_.size();
    batch_.info = hb->info;
    batch_.block_ = dst;
    batch_.index_ = j;
    return &batch_;
  }

  /// The event recorded after the last batch's copy (make another stream wait for it).
  [[nodiscard]] cudaEvent_t copied() const noexcept { return events_[last_].get(); }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] const batch_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] std::size_t device_buffers() const noexcept { return blocks_.size(); }
  [[nodiscard]] Loader& source() noexcept { return ld_; }

 private:
  void check(const loaded_batch<pinned_batch>& hb) const {
    const batch_layout& l = hb.data.layout();
    if (!(l == layout_)) {
      std::string why;
      if (l.rows() != layout_.rows()) {
        why = "it holds " + std::to_string(l.rows()) + " rows, the stager's blocks " +
              std::to_string(layout_.rows());
      } else if (l.size() != layout_.size()) {
        why = "it has " + std::to_string(l.size()) + " fields, the stager's layout " +
              std::to_string(layout_.size());
      } else {
        for (std::size_t k = 0; k < l.size(); ++k) {
          const batch_field& a = l.fields()[k];
          const batch_field& b = layout_.fields()[k];
          if (a == b) continue;
          why = "its field " + std::to_string(k) + " ('" + a.name + "') has " +
                std::to_string(a.row_elements) + " elements of " + std::to_string(a.element_bytes) +
                " bytes per row, the stager's ('" + b.name + "') " +
                std::to_string(b.row_elements) + " elements of " + std::to_string(b.element_bytes) +
                " bytes";
          break;
        }
      }
      const std::string head =
          "hone::data::cuda_stager: the loader delivered a batch of another layout than the "
          "stager's (";
      const std::string tail =
          "), so it does not fit the device blocks; build the stager with the layout of the "
          "loader's prototype";
      throw config_error(head + why + tail);
    }
    HONE_REQUIRE(hb.info.padded_rows <= layout_.rows(),
                 "hone::data::cuda_stager: a batch of " + std::to_string(hb.info.padded_rows) +
                     " rows does not fit the device blocks of " + std::to_string(layout_.rows()) +
                     " rows");
    HONE_REQUIRE(hb.data.bytes() == 0 || hb.data.page_locked(),
                 "hone::data::cuda_stager: the loader's batch is not in page-locked memory (its "
                 "pinned_batch was allocated before the CUDA runtime's pinned backend was "
                 "installed, during static initialization); create the loader and its prototype "
                 "in main() or later");
  }

  Loader& ld_;
  batch_layout layout_;
  cudaStream_t stream_ = nullptr;
  stager_options options_;
  std::vector<buffer<std::byte, cuda_space>> blocks_;
  std::vector<detail::staging_event> events_;
  std::size_t next_block_ = 0;
  std::size_t last_ = 0;
  bool held_ = false;  // a copy from the loader's current batch may be in flight
  device_batch batch_;
};

}  // namespace data
HONE_NAMESPACE_END
