// hone/compress/cuda/distill.cuh: the fused distillation loss of hone/compress/distill.hpp on the
// GPU, for logits, labels and gradient in device memory. Include only from .cu files.
//
// One block of 256 threads per row runs the host version's three steps on that row: the maxima of
// the student and teacher logits (and whether all are finite), the sums of exponentials (float per
// thread, double across the block), then the gradient, recomputing the exponentials instead of
// storing them. A second kernel of one block sums the per-row terms in a fixed order and finds the
// first bad row. Both reductions go through hone::detail::block_reduce (a fixed order for the fixed
// block size), with no atomics, so the results have the same bits on every run. The math is the
// host's, with CUDA's expf/logf instead of the host's polynomial, so the two agree to rounding
// (tests/compress/test_distill_gpu.cu compares them).
//
// Use: a distill_workspace per stream; enqueue() queues the work (no synchronization); result()
// waits for the stream, copies the three numbers back and throws what the host version throws for a
// label outside [0, classes) or (nonfinite_logits::error) a logit that is not finite, naming the
// first such row (labels are checked on the device: they live there).
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "hone/compress/distill.hpp"
#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/cuda/block_reduce.cuh"
#include "hone/core/cuda/error.hpp"
#include "hone/core/cuda/space.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {
namespace detail {

inline constexpr int distill_threads = 256;

/// Row status codes written by the row kernel.
enum : int { distill_row_ok = 0, distill_row_nonfinite = 1, distill_row_bad_label = 2 };

struct distill_device_args {
  std::size_t batch;
  std::size_t classes;
  const float* student;
  const float* teacher;
  const std::int32_t* labels;  // null without labels
  float* grad;                 // null for the loss alone
  float inv_t;
  double temperature;
  double alpha;
  double grad_scale;
  double* row_kl;
  double* row_ce;
  int* row_status;
};

struct distill_max_op {
  __device__ __forceinline__ float operator()(float a, float b) const { return a > b ? a : b; }
};
struct distill_int_max_op {
  __device__ __forceinline__ int operator()(int a, int b) const { return a > b ? a : b; }
};
struct distill_min_op {
  __device__ __forceinline__ long long operator()(long long a, long long b) const {
    return a < b ? a : b;
  }
};
struct distill_sum_op {
  __device__ __forceinline__ double operator()(double a, double b) const { return a + b; }
};

template <int Threads>
__global__ void __launch_bounds__(Threads) distill_rows_kernel(distill_device_args a) {
  using freduce = hone::detail::block_reduce<float, Threads>;
  using ireduce = hone::detail::block_reduce<int, Threads>;
  using dreduce = hone::detail::block_reduce<double, Threads>;
  __shared__ typename freduce::storage fs;
  __shared__ typename ireduce::storage is;
  __shared__ typename dreduce::storage ds;
  const std::size_t i = blockIdx.x;
  const std::size_t n = a.classes;
  const float* s = a.student + i * n;
  const float* t = a.teacher + i * n;
  float* g = a.grad != nullptr ? a.grad + i * n : nullptr;

  float ms = -FLT_MAX, mt = -FLT_MAX;
  int bad = 0;
  for (std::size_t j = threadIdx.x; j < n; j += Threads) {
    const float x = s[j], y = t[j];
    if (!isfinite(x) || !isfinite(y)) bad = 1;
    ms = x > ms ? x : ms;
    mt = y > mt ? y : mt;
  }
  ms = freduce(fs).all_reduce(ms, distill_max_op{});
  __syncthreads();
  mt = freduce(fs).all_reduce(mt, distill_max_op{});
  bad = ireduce(is).all_reduce(bad, distill_int_max_op{});
  std::size_t label = 0;
  if (a.labels != nullptr) {
    const std::int32_t y = a.labels[i];
    if (y < 0 || static_cast<std::size_t>(y) >= n) {
      bad = distill_row_bad_label;  // the same in every thread: each reads the same label
    } else {
      label = static_cast<std::size_t>(y);
    }
  }
  if (bad != 0) {
    if (g != nullptr) {
      for (std::size_t j = threadIdx.x; j < n; j += Threads) g[j] = __int_as_float(0x7fc00000);
    }
    if (threadIdx.x == 0) {
      a.row_kl[i] = __longlong_as_double(0x7ff8000000000000LL);
      a.row_ce[i] = __longlong_as_double(0x7ff8000000000000LL);
      a.row_status[i] =
          bad == distill_row_bad_label ? distill_row_bad_label : distill_row_nonfinite;
    }
    return;
  }
  const double s_y = a.labels != nullptr ? static_cast<double>(s[label]) : 0.0;  // before g = s
  const bool ce = a.labels != nullptr;
  float zs = 0.0f, zt = 0.0f, z1 = 0.0f, cross = 0.0f;
  for (std::size_t j = threadIdx.x; j < n; j += Threads) {
    const float x = s[j], y = t[j];
    const float es = expf((x - ms) * a.inv_t);
    const float et = expf((y - mt) * a.inv_t);
    zs += es;
    zt += et;
    cross += et * (y - x);
    if (ce) z1 += expf(x - ms);
  }
  __syncthreads();
  const double Zs = dreduce(ds).all_reduce(static_cast<double>(zs), distill_sum_op{});
  __syncthreads();
  const double Zt = dreduce(ds).all_reduce(static_cast<double>(zt), distill_sum_op{});
  __syncthreads();
  const double Z1 = dreduce(ds).all_reduce(static_cast<double>(z1), distill_sum_op{});
  __syncthreads();
  const double X = dreduce(ds).all_reduce(static_cast<double>(cross), distill_sum_op{});
  const double T = a.temperature;
  if (g != nullptr) {
    const double per_row = a.grad_scale / static_cast<double>(a.batch);
    const double kd = a.alpha * T * per_row;
    const double hard = (1.0 - a.alpha) * per_row;
    const float cs = static_cast<float>(kd / Zs);
    const float ct = static_cast<float>(kd / Zt);
    const float c1 = ce ? static_cast<float>(hard / Z1) : 0.0f;
    for (std::size_t j = threadIdx.x; j < n; j += Threads) {
      const float x = s[j], y = t[j];
      float v = cs * expf((x - ms) * a.inv_t) - ct * expf((y - mt) * a.inv_t);
      if (ce) {
        v += c1 * expf(x - ms);
        if (j == label) v -= static_cast<float>(hard);
      }
      g[j] = v;
    }
  }
  if (threadIdx.x == 0) {
    const double lse_diff =
        (static_cast<double>(mt) - static_cast<double>(ms)) / T + log(Zt) - log(Zs);
    a.row_kl[i] = X / Zt / T - lse_diff;
    a.row_ce[i] = ce ? static_cast<double>(ms) + log(Z1) - s_y : 0.0;
    a.row_status[i] = distill_row_ok;
  }
}

/// out[0] = sum of row_kl, out[1] = sum of row_ce (each thread a fixed strided set of rows in
/// order, then the block in a fixed order); first_bad[0] = the first row with a status,
/// first_bad[1] its status (batch and 0 when none).
template <int Threads>
__global__ void __launch_bounds__(Threads)
    distill_sum_kernel(const double* row_kl, const double* row_ce, const int* row_status,
                       std::size_t batch, double* out, long long* first_bad) {
  using dreduce = hone::detail::block_reduce<double, Threads>;
  using lreduce = hone::detail::block_reduce<long long, Threads>;
  __shared__ typename dreduce::storage ds;
  __shared__ typename lreduce::storage ls;
  double kl = 0.0, ce = 0.0;
  long long bad = static_cast<long long>(batch);
  for (std::size_t i = threadIdx.x; i < batch; i += Threads) {
    kl += row_kl[i];
    ce += row_ce[i];
    if (row_status[i] != distill_row_ok && static_cast<long long>(i) < bad) {
      bad = static_cast<long long>(i);
    }
  }
  kl = dreduce(ds).sum(kl);
  __syncthreads();
  ce = dreduce(ds).sum(ce);
  bad = lreduce(ls).reduce(bad, distill_min_op{});
  if (threadIdx.x == 0) {
    out[0] = kl;
    out[1] = ce;
    first_bad[0] = bad;
    first_bad[1] = bad < static_cast<long long>(batch) ? row_status[bad] : 0;
  }
}

}  // namespace detail

/// Device scratch of distill_loss on the GPU: per-row terms for up to `max_batch` rows and the
/// results. One per stream that runs the loss concurrently; grows when a larger batch comes.
class distill_workspace {
 public:
  explicit distill_workspace(std::size_t max_batch = 1024) { reserve(max_batch); }

  /// Queues the loss and (when `grad` is not null) its gradient on `stream`; logits, labels and
  /// gradient are device pointers of shape.batch * shape.classes elements (labels: shape.batch, or
  /// null when alpha == 1). Sizes and options are checked here, the labels' values on the device.
  void enqueue(logits_shape shape, const float* student, const float* teacher,
               const std::int32_t* labels, float* grad, const distill_options& options,
               cudaStream_t stream) {
    const std::size_t count = shape.batch * shape.classes;
    check_distill_arguments(shape, student != nullptr ? count : 0, teacher != nullptr ? count : 0,
                            labels != nullptr ? shape.batch : 0, grad != nullptr ? count : 0,
                            options);
    HONE_REQUIRE(shape.batch <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
                 "hone::compress::distill_workspace: a batch of " + std::to_string(shape.batch) +
                     " rows exceeds the grid's limit; split it.");
    reserve(shape.batch);
    shape_ = shape;
    options_ = options;
    detail::distill_device_args a{
        shape.batch,
        shape.classes,
        student,
        teacher,
        labels,
        grad,
        static_cast<float>(1.0 / static_cast<double>(options.temperature)),
        static_cast<double>(options.temperature),
        static_cast<double>(options.alpha),
        static_cast<double>(options.grad_scale),
        row_kl_.data(),
        row_ce_.data(),
        row_status_.data()};
    detail::distill_rows_kernel<detail::distill_threads>
        <<<static_cast<unsigned>(shape.batch), detail::distill_threads, 0, stream>>>(a);
    check_last_launch("hone::compress::distill_rows_kernel");
    detail::distill_sum_kernel<detail::distill_threads><<<1, detail::distill_threads, 0, stream>>>(
        row_kl_.data(), row_ce_.data(), row_status_.data(), shape.batch, sums_.data(),
        first_bad_.data());
    check_last_launch("hone::compress::distill_sum_kernel");
  }

  /// Waits for `stream`, and returns the loss of the last enqueue(); throws hone::config_error
  /// naming the first row with a label outside [0, classes) or (nonfinite_logits::error) a logit
  /// that is not finite. With nonfinite_logits::propagate such a row makes the loss NaN.
  distill_value result(cudaStream_t stream) {
    double sums[2];
    long long bad[2];
    HONE_CUDA_CHECK(
        cudaMemcpyAsync(sums, sums_.data(), sizeof sums, cudaMemcpyDeviceToHost, stream));
    HONE_CUDA_CHECK(
        cudaMemcpyAsync(bad, first_bad_.data(), sizeof bad, cudaMemcpyDeviceToHost, stream));
    HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (bad[1] == detail::distill_row_bad_label) {
      throw config_error("hone::compress::distill_loss (CUDA): the label of row " +
                         std::to_string(bad[0]) + " is outside [0, " +
                         std::to_string(shape_.classes) +
                         "); a label is the index of the row's true class.");
    }
    if (bad[1] == detail::distill_row_nonfinite && options_.nonfinite == nonfinite_logits::error) {
      throw config_error("hone::compress::distill_loss (CUDA): a student or teacher logit of row " +
                         std::to_string(bad[0]) +
                         " is not finite; every logit must be finite (check the model's output "
                         "for that row, or pass nonfinite_logits::propagate to get a NaN loss "
                         "instead of this error).");
    }
    distill_value v;
    const double b = static_cast<double>(shape_.batch);
    v.kl = sums[0] / b;
    v.ce = sums[1] / b;
    const double T = options_.temperature, alpha = options_.alpha;
    v.loss = alpha * T * T * v.kl + (1.0 - alpha) * v.ce;
    return v;
  }

 private:
  void reserve(std::size_t batch) {
    if (batch <= row_kl_.size()) return;
    row_kl_ = buffer<double, cuda_space>(batch);
    row_ce_ = buffer<double, cuda_space>(batch);
    row_status_ = buffer<int, cuda_space>(batch);
  }

  buffer<double, cuda_space> row_kl_;
  buffer<double, cuda_space> row_ce_;
  buffer<int, cuda_space> row_status_;
  buffer<double, cuda_space> sums_{2};
  buffer<long long, cuda_space> first_bad_{2};
  logits_shape shape_{};
  distill_options options_{};
};

}  // namespace compress
HONE_NAMESPACE_END
