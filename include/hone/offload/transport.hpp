// hone/offload/transport.hpp: the transfer layer of the offload engine.
//
// A transport moves bytes between "device" memory (where the model's gradients and working
// parameters live) and host staging buffers, in buckets, and tells the host when a bucket has
// landed. The engine (hone/offload/optimizer_to_host.hpp) is written against the
// offload::transport concept only, so the same bucketing, ordering, casting and delayed-update
// logic runs with:
//  - offload::host_transport (this header): memcpy between two host buffers, the "device" buffer
//    being ordinary host memory. Every copy is complete when the call returns; each call is
//    appended to a log, so tests can check the order of the pipeline on a CPU-only machine.
//  - offload::cuda_transport (hone/offload/cuda/transport.cuh): cudaMemcpyAsync on a side stream
//    into pinned staging buffers, one event per bucket and direction, and stream-ordered waits
//    against the compute stream (no host synchronization except per-bucket event waits).
//
// The protocol of one step, as the engine drives it:
//   begin_to_host();                       // gradients are ready on the compute stream
//   to_host(dst, src, bytes, b) for every bucket b, in order;
//   end_to_host();                         // later compute-stream work may overwrite gradients
//   wait_to_host(b);                       // host: bucket b's gradients have landed
//   wait_to_device(b);                     // host: the previous upload of bucket b is done, its
//                                          // staging may be overwritten
//   begin_to_device(); to_device(dst, src, bytes, b) ...; end_to_device();
//   synchronize();                         // host: every enqueued copy is done
// wait_to_host / wait_to_device may be called from a thread other than the one enqueuing.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/space.hpp"

HONE_NAMESPACE_BEGIN
namespace offload {

/// What a transport must provide (see the protocol above). `staging_space` is the memory space
/// of the host buffers the engine copies into and out of (pinned host memory for CUDA).
template <class T>
concept transport = memory_space<typename T::staging_space> &&
    host_accessible_v<typename T::staging_space> &&
    requires(T& t, void* dst, const void* src, std::size_t n) {
  t.prepare(n);
  t.begin_to_host();
  t.to_host(dst, src, n, n);
  t.end_to_host();
  t.wait_to_host(n);
  t.begin_to_device();
  t.to_device(dst, src, n, n);
  t.end_to_device();
  t.wait_to_device(n);
  t.synchronize();
};

/// One entry of host_transport's log.
struct transfer_record {
  enum class kind { to_host, wait_to_host, to_device, wait_to_device };
  kind what;
  std::size_t bucket;
  std::size_t bytes;  // 0 for waits
  friend bool operator==(const transfer_record&, const transfer_record&) = default;
};

/// The CPU transport: "device" pointers are host pointers and copies are memcpy, finished when the
/// call returns. Logs every copy and wait (the log is read by tests; disable with log = false).
class host_transport {
 public:
  using staging_space = host_space;

  explicit host_transport(bool log = true) : log_enabled_(log) {}

  void prepare(std::size_t buckets) { buckets_ = buckets; }
  void begin_to_host() noexcept {}
  void to_host(void* dst, const void* src, std::size_t bytes, std::size_t bucket) {
    check(bucket);
    if (bytes != 0) std::memcpy(dst, src, bytes);
    record(transfer_record::kind::to_host, bucket, bytes);
  }
  void end_to_host() noexcept {}
  void wait_to_host(std::size_t bucket) {
    check(bucket);
    record(transfer_record::kind::wait_to_host, bucket, 0);
  }
  void begin_to_device() noexcept {}
  void to_device(void* dst, const void* src, std::size_t bytes, std::size_t bucket) {
    check(bucket);
    if (bytes != 0) std::memcpy(dst, src, bytes);
    record(transfer_record::kind::to_device, bucket, bytes);
  }
  void end_to_device() noexcept {}
  void wait_to_device(std::size_t bucket) {
    check(bucket);
    record(transfer_record::kind::wait_to_device, bucket, 0);
  }
  void synchronize() noexcept {}

  /// The calls made so far (copies and waits), in order.
  [[nodiscard]] const std::vector<transfer_record>& log() const noexcept { return log_; }
  void clear_log() noexcept { log_.clear(); }

 private:
  void check(std::size_t bucket) const {
    HONE_REQUIRE(bucket < buckets_, "hone::offload::host_transport: bucket " +
                                        std::to_string(bucket) + " out of range (" +
                                        std::to_string(buckets_) +
                                        " prepared); call prepare(n) first");
  }
  void record(transfer_record::kind k, std::size_t bucket, std::size_t bytes) {
    if (log_enabled_) log_.push_back({k, bucket, bytes});
  }

  bool log_enabled_;
  std::size_t buckets_ = 0;
  std::vector<transfer_record> log_;
};

static_assert(transport<host_transport>);

}  // namespace offload
HONE_NAMESPACE_END
