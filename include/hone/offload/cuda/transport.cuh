// hone/offload/cuda/transport.cuh: the CUDA transport of the offload engine.
//
// Copies run with cudaMemcpyAsync on a side stream (created non-blocking, so it never serializes
// with the legacy default stream) between device memory and the engine's pinned staging buffers
// (staging_space = pinned_host_space, allocated with cudaHostAlloc). Ordering with the model's
// compute stream is kept on the device, without host synchronization:
//  - begin_to_host / begin_to_device: the side stream waits for an event recorded on the compute
//    stream (the gradients are written / the forward-backward reading the parameters is done);
//  - end_to_host / end_to_device: the compute stream waits for an event recorded on the side
//    stream (the next backward may overwrite the gradients / the next forward sees new weights).
// Each bucket has one event per direction; wait_to_host(b) / wait_to_device(b) block the calling
// host thread on it (cudaEventSynchronize is thread-safe), which is what lets the host optimizer
// start on bucket b while later buckets are still being copied.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/cuda/error.hpp"
#include "hone/core/error.hpp"
#include "hone/core/space.hpp"
#include "hone/offload/transport.hpp"

HONE_NAMESPACE_BEGIN
namespace offload {

class cuda_transport {
 public:
  using staging_space = pinned_host_space;

  /// `compute` is the stream the model's forward/backward runs on (0: the legacy default stream).
  explicit cuda_transport(cudaStream_t compute = nullptr) : compute_(compute) {
    HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    try {
      HONE_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
      HONE_CUDA_CHECK(cudaEventCreateWithFlags(&side_done_, cudaEventDisableTiming));
    } catch (...) {
      release();
      throw;
    }
  }
  cuda_transport(cuda_transport&& o) noexcept
      : compute_(o.compute_),
        side_(std::exchange(o.side_, nullptr)),
        compute_done_(std::exchange(o.compute_done_, nullptr)),
        side_done_(std::exchange(o.side_done_, nullptr)),
        to_host_(std::move(o.to_host_)),
        to_device_(std::move(o.to_device_)) {}
  cuda_transport(const cuda_transport&) = delete;
  cuda_transport& operator=(const cuda_transport&) = delete;
  cuda_transport& operator=(cuda_transport&&) = delete;
  ~cuda_transport() { release(); }

  [[nodiscard]] cudaStream_t side_stream() const noexcept { return side_; }
  [[nodiscard]] cudaStream_t compute_stream() const noexcept { return compute_; }

  /// Creates one event per bucket and direction.
  void prepare(std::size_t buckets) {
    destroy_bucket_events();
    to_host_.assign(buckets, nullptr);
    to_device_.assign(buckets, nullptr);
    for (std::size_t b = 0; b < buckets; ++b) {
      HONE_CUDA_CHECK(cudaEventCreateWithFlags(&to_host_[b], cudaEventDisableTiming));
      HONE_CUDA_CHECK(cudaEventCreateWithFlags(&to_device_[b], cudaEventDisableTiming));
    }
  }

  void begin_to_host() { side_waits_for_compute(); }
  void to_host(void* dst, const void* src, std::size_t bytes, std::size_t bucket) {
    check(bucket);
    if (bytes != 0) {
      HONE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, side_));
    }
    HONE_CUDA_CHECK(cudaEventRecord(to_host_[bucket], side_));
  }
  void end_to_host() { compute_waits_for_side(); }
  void wait_to_host(std::size_t bucket) {
    check(bucket);
    HONE_CUDA_CHECK(cudaEventSynchronize(to_host_[bucket]));
  }

  void begin_to_device() { side_waits_for_compute(); }
  void to_device(void* dst, const void* src, std::size_t bytes, std::size_t bucket) {
    check(bucket);
    if (bytes != 0) {
      HONE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, side_));
    }
    HONE_CUDA_CHECK(cudaEventRecord(to_device_[bucket], side_));
  }
  void end_to_device() { compute_waits_for_side(); }
  /// Blocks until the last upload of `bucket` is done (an event never recorded counts as done).
  void wait_to_device(std::size_t bucket) {
    check(bucket);
    HONE_CUDA_CHECK(cudaEventSynchronize(to_device_[bucket]));
  }

  void synchronize() { HONE_CUDA_CHECK(cudaStreamSynchronize(side_)); }

 private:
  void check(std::size_t bucket) const {
    HONE_REQUIRE(bucket < to_host_.size(), "hone::offload::cuda_transport: bucket " +
                                               std::to_string(bucket) + " out of range (" +
                                               std::to_string(to_host_.size()) + " prepared)");
  }
  void side_waits_for_compute() {
    HONE_CUDA_CHECK(cudaEventRecord(compute_done_, compute_));
    HONE_CUDA_CHECK(cudaStreamWaitEvent(side_, compute_done_, 0));
  }
  void compute_waits_for_side() {
    HONE_CUDA_CHECK(cudaEventRecord(side_done_, side_));
    HONE_CUDA_CHECK(cudaStreamWaitEvent(compute_, side_done_, 0));
  }
  void destroy_bucket_events() noexcept {
    for (auto e : to_host_)
      if (e != nullptr) (void)cudaEventDestroy(e);
    for (auto e : to_device_)
      if (e != nullptr) (void)cudaEventDestroy(e);
    to_host_.clear();
    to_device_.clear();
  }
  void release() noexcept {
    if (side_ != nullptr) (void)cudaStreamSynchronize(side_);
    destroy_bucket_events();
    if (compute_done_ != nullptr) (void)cudaEventDestroy(compute_done_);
    if (side_done_ != nullptr) (void)cudaEventDestroy(side_done_);
    if (side_ != nullptr) (void)cudaStreamDestroy(side_);
    compute_done_ = side_done_ = nullptr;
    side_ = nullptr;
  }

  cudaStream_t compute_ = nullptr;
  cudaStream_t side_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;
  cudaEvent_t side_done_ = nullptr;
  std::vector<cudaEvent_t> to_host_;
  std::vector<cudaEvent_t> to_device_;
};

static_assert(transport<cuda_transport>);

}  // namespace offload
HONE_NAMESPACE_END
