// hone/dist/nccl/data_parallel.hpp: hone::dist::nccl_data_parallel, the CUDA trainer's gradient
// reduction role over NCCL (PyTorch DDP's gradient averaging for a model in GPU memory). CMake
// target hone::nccl. A host header (no kernels): it compiles with the host compiler or nvcc.
//
//   cudaSetDevice(local_rank);
//   hone::dist::mpi_comm world;
//   auto comm = hone::dist::nccl_comm::bootstrap(world, stream);   // outlives the trainer
//   hone::trainer t(cuda_model, hone::bf16_mixed{}, hone::adamw{},
//                   hone::clip_grad_norm{.max_norm = 1.0f},
//                   hone::dist::nccl_data_parallel(comm));         // 25 MiB buckets, average
//
// After the last micro-batch of a step the CUDA trainer hands its fp32 master gradients (one flat
// device arena) and its stream to reduce(). The arena is cut into the buckets of
// hone::data_parallel (hone::dist::plan_buckets: slices of the arena itself, planned from its
// end, the first one 1 MiB, the others 25 MiB by default); each bucket is one in-place NCCL
// all_reduce (ncclSum, or ncclAvg with `average`) on the communicator's stream, which first waits
// for the trainer's stream (an event: the gradients are final), and the trainer's stream then
// waits for the last bucket. The host waits for each bucket's request in order (bounded by the
// communicator's timeout), so a rank that is missing is a hone::dist_error naming the step, the
// bucket and the communicator's message, never a hang in the trainer's next synchronization.
// The trainer then computes the norm, the inf/NaN check and the clipping coefficient from the
// reduced gradients, so loss-scale skips and global-norm clipping decide alike on every rank.
//
// Not here (hone::data_parallel has them for host models): uneven inputs (join) and
// weight_by_count; the options refuse them with a sentence.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/device_span.hpp"
#include "hone/core/error.hpp"
#include "hone/core/roles.hpp"
#include "hone/dist/data_parallel.hpp"
#include "hone/dist/nccl/nccl_comm.hpp"

HONE_NAMESPACE_BEGIN

namespace dist {

/// The CUDA trainer's data-parallel gradient reduction over an nccl_comm (see the header comment).
/// Holds a reference to the communicator, which must outlive the policy and the trainer. Copying
/// the policy copies the reference, the options and the plan (the trainer copies it before its
/// first step).
class nccl_data_parallel {
 public:
  using role = roles::gradient_reduction;
  using communicator_type = nccl_comm;

  explicit nccl_data_parallel(nccl_comm& comm, data_parallel_options options = {})
      : comm_(&comm), options_(options) {
    (void)plan_buckets(0, 1, options_);  // checks the sizes
    HONE_REQUIRE(!options_.uneven_inputs && !options_.weight_by_count,
                 "hone::dist::nccl_data_parallel: uneven_inputs and weight_by_count are not "
                 "available for CUDA models yet; give every rank the same number of batches per "
                 "step, or use hone::data_parallel with a host model");
    HONE_REQUIRE(options_.wire == wire_format::fp32,
                 "hone::dist::nccl_data_parallel: options.wire asks for 16-bit gradients on the "
                 "wire, which only hone::data_parallel (host models) does yet; leave options.wire "
                 "at wire_format::fp32");
  }

  /// Sums (with options().average: averages) `master_gradients` over the ranks, in place, ordered
  /// on `stream`. Every rank calls it with an arena of the same size, once per step. Throws
  /// dist_error (naming the step and the bucket) when a bucket fails or times out.
  void reduce(device_span<float> master_gradients, cudaStream_t stream) {
    ++reductions_;
    if (plan_elements_ != master_gradients.size() || plan_.empty()) {
      plan_ = plan_buckets(master_gradients.size(), comm_->size(), options_);
      plan_elements_ = master_gradients.size();
    }
    if (master_gradients.size() == 0) return;
    ensure_events();
    const cudaStream_t cs = comm_->stream();
    check(cudaEventRecord(ready_, stream), "cudaEventRecord (gradients ready)");
    check(cudaStreamWaitEvent(cs, ready_, 0), "cudaStreamWaitEvent (communicator stream)");
    const reduce_op op = reduce_op::sum;
    std::vector<nccl_comm::request> requests;
    requests.reserve(plan_.size());
    for (std::size_t b = 0; b < plan_.size(); ++b) {
      std::span<float> slice(master_gradients.data() + plan_[b].offset, plan_[b].count);
      try {
        requests.push_back(options_.average && comm_->size() > 1 ? comm_->all_reduce_average(slice)
                                                                 : comm_->all_reduce(slice, op));
      } catch (const std::exception& e) {
        failed(b, "starting its all_reduce", e);
      }
    }
    check(cudaEventRecord(done_, cs), "cudaEventRecord (reduction done)");
    check(cudaStreamWaitEvent(stream, done_, 0), "cudaStreamWaitEvent (trainer stream)");
    for (std::size_t b = 0; b < requests.size(); ++b) {
      try {
        requests[b].wait();
      } catch (const std::exception& e) {
        failed(b, "its all_reduce", e);
      }
    }
  }

  /// The buckets of an arena of `elements` floats (offsets and counts, in reduction order).
  [[nodiscard]] std::vector<bucket> buckets(std::size_t elements) const {
    return plan_buckets(elements, comm_->size(), options_);
  }
  [[nodiscard]] const data_parallel_options& options() const noexcept { return options_; }
  [[nodiscard]] nccl_comm& communicator() const noexcept { return *comm_; }
  /// How many reductions have run (the step number in errors).
  [[nodiscard]] std::uint64_t reductions() const noexcept { return reductions_; }

  nccl_data_parallel(const nccl_data_parallel& o)
      : comm_(o.comm_), options_(o.options_), plan_(o.plan_), plan_elements_(o.plan_elements_) {}
  nccl_data_parallel& operator=(const nccl_data_parallel&) = delete;
  ~nccl_data_parallel() {
    if (ready_ != nullptr) (void)cudaEventDestroy(ready_);
    if (done_ != nullptr) (void)cudaEventDestroy(done_);
  }

 private:
  void ensure_events() {
    if (ready_ == nullptr) {
      check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    }
    if (done_ == nullptr) {
      check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    }
  }

  void check(cudaError_t rc, const char* what) const {
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      throw dist_error("hone::dist::nccl_data_parallel: step " + std::to_string(reductions_) +
                       ": " + what + " failed: " + cudaGetErrorString(rc));
    }
  }

  [[noreturn]] void failed(std::size_t b, const char* what, const std::exception& e) const {
    throw dist_error("hone::dist::nccl_data_parallel: step " + std::to_string(reductions_) +
                     ", bucket " + std::to_string(b) + " of " + std::to_string(plan_.size()) +
                     " (elements " + std::to_string(plan_[b].offset) + " to " +
                     std::to_string(plan_[b].offset + plan_[b].count) + "), " + what + ": " +
                     e.what());
  }

  nccl_comm* comm_;
  data_parallel_options options_;
  std::vector<bucket> plan_;
  std::size_t plan_elements_ = 0;
  std::uint64_t reductions_ = 0;
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

}  // namespace dist

HONE_NAMESPACE_END
