// hone/compress/cuda/qat.cuh: fake quantization of weights in device memory, the GPU half of
// hone/compress/qat.hpp. Include only from .cu files; qat.hpp includes it itself when nvcc compiles
// it, so a CUDA trainer built with hone::compress::fake_quant_training needs nothing more.
//
//   hone::compress::fake_quantize_async(w, rows, cols, granularity, out, stream, workspace);
//
// computes out = T(dequantize(quantize_weights(w, rows, cols, granularity))) on `stream`, with the
// host version's arithmetic step by step: scale = max |w| / 127 (per row or per tensor), code =
// clamp(round(w / scale), -127, 127) as an integer, with round half to even (0 when the scale is
// 0), value = float(code) * scale (so a negative weight that rounds to 0 gives +0, as on the host),
// then the cast to the working type (round to nearest even, as the host's conversions). A maximum
// is exact in any order and IEEE division and multiplication round as the host's do, so the results
// are the host's bits (tests/compress/test_qat_gpu.cu compares them) unless the program was built
// with --use_fast_math or -prec-div=false (hone::require_ieee_device_math tells).
//
// Kernels: per_channel runs one block of 256 threads per row (a grid-stride loop over rows): the
// row's maximum through hone::detail::block_reduce, then the row's codes. per_tensor runs two: the
// tensor's maximum (blocks reduce, then one atomicMax on the float's bits, which order like the
// values for non-negative floats), then an element-wise pass reading the scale from device memory.
// No host synchronization: a value that is NaN or infinite sets the workspace's flag for that call
// (index `slot`), which the caller reads back later (fake_quant_training checks it at its next
// apply or on check()).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "hone/compress/qat.hpp"
#include "hone/compress/quant.hpp"
#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/cuda/block_reduce.cuh"
#include "hone/core/cuda/error.hpp"
#include "hone/core/cuda/space.hpp"
#include "hone/core/device_span.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

/// Device memory of fake_quantize_async: one non-finite flag and one tensor maximum per slot
/// (a caller that fake-quantizes several tensors in one step gives each its own slot), and their
/// page-locked host copies.
class fake_quant_workspace {
 public:
  explicit fake_quant_workspace(std::size_t slots = 1)
      : flags_(slots), maxima_(slots), host_flags_(slots) {
    for (std::size_t i = 0; i < slots; ++i) host_flags_.data()[i] = 0;
  }
  [[nodiscard]] std::size_t slots() const noexcept { return flags_.size(); }
  /// Zeroes the flags on `stream` (before the calls of one round).
  void clear_flags(cudaStream_t stream) {
    if (slots() > 0) {
      HONE_CUDA_CHECK(cudaMemsetAsync(flags_.data(), 0, slots() * sizeof(int), stream));
    }
  }
  /// Copies the flags to host memory on `stream`; host_flags() holds them once the stream has
  /// reached this point.
  void read_flags(cudaStream_t stream) {
    if (slots() > 0) {
      HONE_CUDA_CHECK(cudaMemcpyAsync(host_flags_.data(), flags_.data(), slots() * sizeof(int),
                                      cudaMemcpyDeviceToHost, stream));
    }
  }
  [[nodiscard]] const int* host_flags() const noexcept { return host_flags_.data(); }
  [[nodiscard]] int* device_flags() noexcept { return flags_.data(); }
  [[nodiscard]] unsigned* device_maxima() noexcept { return maxima_.data(); }

 private:
  buffer<int, cuda_space> flags_;
  buffer<unsigned, cuda_space> maxima_;
  buffer<int, pinned_host_space> host_flags_;
};

namespace detail {

inline constexpr int fake_quant_threads = 256;

struct fake_quant_max_op {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/// max |w| over the part of w this thread visits (NaN and infinities set *flag instead).
__device__ __forceinline__ float fake_quant_local_max(const float* w, std::size_t begin,
                                                      std::size_t end, std::size_t stride,
                                                      int* flag) {
  float m = 0.0f;
  bool bad = false;
  for (std::size_t i = begin; i < end; i += stride) {
    const float a = fabsf(w[i]);
    bad |= !(a <= FLT_MAX);  // NaN or infinite
    m = fmaxf(m, a);
  }
  if (bad) atomicOr(flag, 1);
  return m;
}

/// The host's quantize_symmetric and the dequantization, cast to T. The code goes through an
/// integer as on the host: rintf alone would keep the sign of a negative value that rounds to
/// zero, and -0.0 * scale is not the host's +0.0.
template <class T>
__device__ __forceinline__ T fake_quant_value(float x, float scale) {
  if (scale == 0.0f) return static_cast<T>(0.0f);
  const int q = min(max(__float2int_rn(x / scale), -127), 127);  // round half to even
  return static_cast<T>(static_cast<float>(q) * scale);
}

/// per_channel: one block per row (grid-stride over rows).
template <class T>
__global__ void __launch_bounds__(fake_quant_threads)
    fake_quant_rows_kernel(const float* w, std::size_t rows, std::size_t cols, T* out, int* flag) {
  using reduce_t = ::hone::detail::block_reduce<float, fake_quant_threads>;
  __shared__ typename reduce_t::storage storage;
  for (std::size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* row = w + r * cols;
    const float local = fake_quant_local_max(row, threadIdx.x, cols, fake_quant_threads, flag);
    const float scale = reduce_t(storage).all_reduce(local, fake_quant_max_op{}) / 127.0f;
    for (std::size_t c = threadIdx.x; c < cols; c += fake_quant_threads) {
      out[r * cols + c] = fake_quant_value<T>(row[c], scale);
    }
    __syncthreads();  // the storage is used again by the next row
  }
}

/// per_tensor, first pass: the tensor's max |w| into *max_bits (zeroed before).
__global__ void __launch_bounds__(fake_quant_threads)
    fake_quant_tensor_max_kernel(const float* w, std::size_t n, unsigned* max_bits, int* flag) {
  using reduce_t = ::hone::detail::block_reduce<float, fake_quant_threads>;
  __shared__ typename reduce_t::storage storage;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * fake_quant_threads;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * fake_quant_threads + threadIdx.x;
  const float local = fake_quant_local_max(w, first, n, stride, flag);
  const float m = reduce_t(storage).reduce(local, fake_quant_max_op{});
  if (threadIdx.x == 0) atomicMax(max_bits, __float_as_uint(m));
}

/// per_tensor, second pass: every element with the tensor's scale.
template <class T>
__global__ void __launch_bounds__(fake_quant_threads)
    fake_quant_tensor_kernel(const float* w, std::size_t n, const unsigned* max_bits, T* out) {
  const float scale = __uint_as_float(*max_bits) / 127.0f;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * fake_quant_threads;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * fake_quant_threads + threadIdx.x;
       i < n; i += stride) {
    out[i] = fake_quant_value<T>(w[i], scale);
  }
}

/// Blocks for an element-wise pass over n values: one per 1024 values (4 per thread), at most
/// 65535 (the grid-stride loops cover the rest).
inline unsigned fake_quant_blocks(std::size_t n) {
  constexpr std::size_t cap = 65535;
  const std::size_t per = static_cast<std::size_t>(fake_quant_threads) * 4;
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(cap, (n + per - 1) / per)));
}

}  // namespace detail

/// Enqueues out = T(fake-quantized w) on `stream` (see the top of this file): w and out are
/// [rows, cols] row-major in device memory (out may be w when T is float). A NaN or infinite
/// value in w sets workspace.device_flags()[slot]; out is then undefined for that tensor.
template <class T>
void fake_quantize_async(device_span<const float> w, std::size_t rows, std::size_t cols,
                         quant_granularity granularity, device_span<T> out, cudaStream_t stream,
                         fake_quant_workspace& workspace, std::size_t slot = 0) {
  constexpr const char* who = "hone::compress::fake_quantize_async";
  detail::require_fake_quant_shape(who, w.size(), out.size(), rows, cols);
  HONE_REQUIRE(slot < workspace.slots(), std::string(who) + ": slot " + std::to_string(slot) +
                                             " is outside the workspace's " +
                                             std::to_string(workspace.slots()) +
                                             " slots; make the workspace with one slot "
                                             "per tensor of a round.");
  const std::size_t n = rows * cols;
  if (n == 0) return;
  int* flag = workspace.device_flags() + slot;
  if (granularity == quant_granularity::per_channel) {
    const auto blocks = static_cast<unsigned>(std::min<std::size_t>(rows, 65535));
    detail::fake_quant_rows_kernel<T>
        <<<blocks, detail::fake_quant_threads, 0, stream>>>(w.data(), rows, cols, out.data(), flag);
  } else {
    unsigned* max_bits = workspace.device_maxima() + slot;
    HONE_CUDA_CHECK(cudaMemsetAsync(max_bits, 0, sizeof(unsigned), stream));
    const unsigned blocks = detail::fake_quant_blocks(n);
    detail::fake_quant_tensor_max_kernel<<<blocks, detail::fake_quant_threads, 0, stream>>>(
        w.data(), n, max_bits, flag);
    detail::fake_quant_tensor_kernel<T>
        <<<blocks, detail::fake_quant_threads, 0, stream>>>(w.data(), n, max_bits, out.data());
  }
  HONE_CUDA_CHECK(cudaGetLastError());
}

namespace detail {

/// fake_quant_training's device side (declared in qat.hpp): a workspace with one slot per tensor,
/// and an event after the last round's copy of the flags.
class fake_quant_device_impl final : public fake_quant_device {
 public:
  explicit fake_quant_device_impl(std::size_t slots) : workspace_(slots) {
    HONE_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~fake_quant_device_impl() override { (void)cudaEventDestroy(done_); }
  fake_quant_device_impl(const fake_quant_device_impl&) = delete;
  fake_quant_device_impl& operator=(const fake_quant_device_impl&) = delete;

  void begin(void* stream) override { workspace_.clear_flags(static_cast<cudaStream_t>(stream)); }
  void end(void* stream, std::uint64_t step) override {
    const auto s = static_cast<cudaStream_t>(stream);
    workspace_.read_flags(s);
    HONE_CUDA_CHECK(cudaEventRecord(done_, s));
    step_ = step;
    pending_ = true;
  }
  void check(const std::vector<fake_quant_target>& targets) override {
    if (!pending_) return;
    HONE_CUDA_CHECK(cudaEventSynchronize(done_));
    pending_ = false;
    const int* flags = workspace_.host_flags();
    for (std::size_t i = 0; i < targets.size() && i < workspace_.slots(); ++i) {
      if (flags[i] != 0) [[unlikely]] {
        ::hone::detail::config_failure(
            "hone::compress::fake_quant_training: the master weights of '" + targets[i].name +
            "' held a NaN or infinite value when they were fake-quantized after step " +
            std::to_string(step_) +
            " (on the GPU; the model's working weights of that tensor are undefined since). "
            "int8 quantization needs finite values: lower the learning rate, clip the "
            "gradients, or check the update.");
      }
    }
  }
  fake_quant_workspace& workspace() noexcept { return workspace_; }

 private:
  fake_quant_workspace workspace_;
  cudaEvent_t done_ = nullptr;
  std::uint64_t step_ = 0;
  bool pending_ = false;
};

template <class T>
void fake_quant_device_write(const float* master, const fake_quant_target& x,
                             quant_granularity granularity, void* stream, fake_quant_device& device,
                             std::size_t slot) {
  const std::size_t n = x.rows * x.cols;
  fake_quantize_async(device_span<const float>{master + x.offset, n}, x.rows, x.cols, granularity,
                      device_span<T>{static_cast<T*>(x.weights), n},
                      static_cast<cudaStream_t>(stream),
                      static_cast<fake_quant_device_impl&>(device).workspace(), slot);
}

template <int>
std::shared_ptr<fake_quant_device> make_fake_quant_device(std::size_t slots) {
  return std::make_shared<fake_quant_device_impl>(slots);
}

}  // namespace detail
}  // namespace compress
HONE_NAMESPACE_END
