// examples/train_mlp/mlp_cuda.cuh: the user's MLP again, on a CUDA device (include from .cu only).
//
//   inputs -> fc1 -> ReLU -> fc2 -> ReLU -> fc3 -> softmax cross-entropy
//
// The same network as mlp.hpp, with the same parameter layout and the same initial weights from
// the same seed (mlp_common.hpp), so the CPU and CUDA runs are comparable. Values and gradients
// live in two hone::arena<T, hone::cuda_space> laid out by one hone::arena_layout; parameters()
// hands out hone::parameter<T, hone::cuda_space> records (hone::device_span views), which is what
// makes hone::trainer pick its CUDA implementation (hone/train/cuda/trainer.cuh). With T = float
// the trainer's master weights are this arena (zero copy); with bfloat16/half it keeps fp32
// master weights on the device and casts them back into this arena after each update.
//
// Compute: the matrix products are cuBLAS GEMMs (cublasGemmEx) with inputs in the working type T
// (CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F) and fp32 accumulation (CUBLAS_COMPUTE_32F: no TF32, no
// fp16 accumulation). Pre-activations and logits come out in fp32; the activations and the
// gradients w.r.t. the pre-activations, which feed the next GEMMs, are rounded to T (as in apex /
// torch.autocast mixed precision). Small kernels below do the rest: the input cast, bias + ReLU,
// softmax cross-entropy (loss, gradient, correct predictions), the bias gradient (column sums in
// fp32) and ReLU'. With fp16 a scaled gradient beyond 65504 becomes inf, which the trainer detects
// and skips, as on the CPU.
//
// Every kernel and GEMM runs on the model's own stream, which the trainer uses too
// (cuda_stream()); forward_backward and evaluate synchronize it once, to return the loss.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <hone/core/arena.hpp>
#include <hone/core/bfloat16.hpp>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <hone/core/cuda/space.hpp>
#include <hone/core/error.hpp>
#include <hone/core/half.hpp>
#include <hone/core/model.hpp>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mlp_common.hpp"

namespace train_mlp::cuda {

// ---- cuBLAS and CUDA handles -----------------------------------------------------------------

/// Throws hone::cuda_error naming the cuBLAS call when it did not succeed.
inline void cublas_check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw hone::cuda_error(std::string(call) + " failed: " + cublasGetStatusString(status),
                           static_cast<int>(status));
  }
}
#define TRAIN_MLP_CUBLAS_CHECK(call) ::train_mlp::cuda::cublas_check((call), #call)

/// cuBLAS's name of the working type.
template <class T>
constexpr cudaDataType_t cuda_data_type() {
  if constexpr (std::is_same_v<T, float>) {
    return CUDA_R_32F;
  } else if constexpr (std::is_same_v<T, hone::bfloat16>) {
    return CUDA_R_16BF;
  } else {
    static_assert(std::is_same_v<T, hone::half>,
                  "train_mlp::cuda: the working type must be float, hone::bfloat16 or hone::half");
    return CUDA_R_16F;
  }
}

/// An owned CUDA stream (blocking: it waits for the legacy default stream, on which hone's
/// arenas are zeroed) and a cuBLAS handle bound to it.
class stream_and_blas {
 public:
  stream_and_blas() {
    HONE_CUDA_CHECK(cudaStreamCreate(&stream_));
    try {
      TRAIN_MLP_CUBLAS_CHECK(cublasCreate(&blas_));
      TRAIN_MLP_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    } catch (...) {
      if (blas_ != nullptr) (void)cublasDestroy(blas_);
      (void)cudaStreamDestroy(stream_);
      throw;
    }
  }
  stream_and_blas(const stream_and_blas&) = delete;
  stream_and_blas& operator=(const stream_and_blas&) = delete;
  ~stream_and_blas() {
    (void)cublasDestroy(blas_);
    (void)cudaStreamDestroy(stream_);
  }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] cublasHandle_t blas() const noexcept { return blas_; }

 private:
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
};

// ---- kernels ---------------------------------------------------------------------------------
namespace kernels {
// Matrices are row-major, as in mlp.hpp: a [rows x cols] matrix has element (i, j) at i * cols + j.

constexpr int block = 256;
inline unsigned grid_for(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>((n + block - 1) / block, 65535));
}

/// out = T(in), element-wise (the input batch into the working type).
template <class T>
__global__ void cast_to(const float* in, T* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    out[i] = T(in[i]);
  }
}

/// pre[i, j] += bias[j]; with `post`, also post[i, j] = T(max(pre[i, j], 0)) (hidden layers).
template <class T>
__global__ void bias_relu(float* pre, const T* bias, T* post, std::size_t rows, std::size_t cols) {
  const std::size_t n = rows * cols;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float z = pre[i] + static_cast<float>(bias[i % cols]);
    pre[i] = z;
    if (post != nullptr) post[i] = T(z > 0.0f ? z : 0.0f);
  }
}

/// Softmax cross-entropy, one thread per sample of logits z [rows x classes] (fp32):
///   loss[i]    = max_i + log(sum_j exp(z_ij - max_i)) - z_i,y_i   (as mlp.hpp, in double)
///   correct[i] = 1 when the first largest logit is the label's
///   delta[i,j] = (softmax_ij - [j == y_i]) * scale_over_n  in T (unless delta is null), the
///                gradient of loss * loss_scale w.r.t. the logits for a mean over n samples.
template <class T>
__global__ void softmax_cross_entropy(const float* z, const std::int32_t* labels, std::size_t rows,
                                      std::size_t classes, float scale_over_n, T* delta,
                                      double* loss, unsigned* correct) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < rows;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float* zi = z + i * classes;
    const auto y = static_cast<std::size_t>(labels[i]);
    float zmax = zi[0];
    std::size_t best = 0;
    for (std::size_t c = 1; c < classes; ++c) {
      if (zi[c] > zmax) {
        zmax = zi[c];
        best = c;
      }
    }
    float sum = 0.0f;
    for (std::size_t c = 0; c < classes; ++c) sum += expf(zi[c] - zmax);
    loss[i] =
        static_cast<double>(zmax) + log(static_cast<double>(sum)) - static_cast<double>(zi[y]);
    correct[i] = best == y ? 1u : 0u;
    if (delta != nullptr) {
      for (std::size_t c = 0; c < classes; ++c) {
        const float p = expf(zi[c] - zmax) / sum;
        delta[i * classes + c] = T((p - (c == y ? 1.0f : 0.0f)) * scale_over_n);
      }
    }
  }
}

/// One block: out_loss = sum of loss[0, n) (double), out_correct = sum of correct[0, n), in a
/// fixed order (deterministic).
__global__ void sum_losses(const double* loss, const unsigned* correct, std::size_t n,
                           double* out_loss, unsigned long long* out_correct) {
  __shared__ double ls[block];
  __shared__ unsigned long long cs[block];
  double l = 0.0;
  unsigned long long c = 0;
  for (std::size_t i = threadIdx.x; i < n; i += block) {
    l += loss[i];
    c += correct[i];
  }
  ls[threadIdx.x] = l;
  cs[threadIdx.x] = c;
  __syncthreads();
  for (int s = block / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) {
      ls[threadIdx.x] += ls[threadIdx.x + s];
      cs[threadIdx.x] += cs[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *out_loss = ls[0];
    *out_correct = cs[0];
  }
}

/// grad[j] = T(sum_i delta[i, j]) (the bias gradient), summed in fp32, one thread per column.
template <class T>
__global__ void column_sums(const T* delta, std::size_t rows, std::size_t cols, T* grad) {
  for (std::size_t j = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; j < cols;
       j += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (std::size_t i = 0; i < rows; ++i) s += static_cast<float>(delta[i * cols + j]);
    grad[j] = T(s);
  }
}

/// delta[i] = T(pre[i] > 0 ? upstream[i] : 0) (ReLU').
template <class T>
__global__ void relu_backward(const float* upstream, const float* pre, T* delta, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    delta[i] = T(pre[i] > 0.0f ? upstream[i] : 0.0f);
  }
}
}  // namespace kernels

// ---- the model -------------------------------------------------------------------------------

template <class T>
class mlp {
  static constexpr std::size_t layers = mlp_layers;

 public:
  using value_type = T;

  /// inputs -> hidden -> hidden -> classes, the CPU model's initial weights for `seed`, zero
  /// biases (needs a CUDA device).
  mlp(std::size_t inputs, std::size_t hidden, std::size_t classes, std::uint64_t seed)
      : sizes_{inputs, hidden, hidden, classes},
        layout_(mlp_layout(sizes_, sizeof(T))),
        values_(layout_),
        grads_(layout_),
        results_(1),
        results_host_(1) {
    std::vector<T> host(layout_.total(), T(0.0f));
    const auto init = initial_weights(sizes_, seed);  // mlp_common.hpp, as the CPU model
    for (std::size_t l = 0; l < layers; ++l) {
      T* w = host.data() + layout_[2 * l].offset;
      for (std::size_t i = 0; i < init[l].size(); ++i) w[i] = T(init[l][i]);
    }
    HONE_CUDA_CHECK(cudaMemcpyAsync(values_.all().data(), host.data(), host.size() * sizeof(T),
                                    cudaMemcpyHostToDevice, cuda_.stream()));
    HONE_CUDA_CHECK(cudaStreamSynchronize(cuda_.stream()));
  }

  // The model cannot move: parameters() hands out views of its arenas.
  mlp(const mlp&) = delete;
  mlp& operator=(const mlp&) = delete;

  /// fc1.weight [inputs x hidden], fc1.bias [hidden], ... in device memory (y = x W + b).
  std::vector<hone::parameter<T, hone::cuda_space>> parameters() {
    return mlp_parameters<T, hone::cuda_space>(layout_, sizes_, values_, grads_);
  }

  /// The stream every kernel of the model and of the trainer runs on.
  [[nodiscard]] cudaStream_t cuda_stream() const noexcept { return cuda_.stream(); }

  /// Mean cross-entropy over the batch; writes d(loss * loss_scale)/d(parameter) in T.
  float forward_backward(const batch& b, float loss_scale) {
    const std::size_t n = b.count();
    const std::size_t k = sizes_[layers];
    upload(b);
    forward(n);
    kernels::softmax_cross_entropy<T><<<kernels::grid_for(n), kernels::block, 0, stream()>>>(
        pre_[layers - 1].data(), labels_.data(), n, k, loss_scale / static_cast<float>(n),
        delta_[layers - 1].data(), sample_loss_.data(), sample_correct_.data());
    hone::check_last_launch("train_mlp softmax_cross_entropy");
    sum_results(n);

    for (std::size_t l = layers; l-- > 0;) {
      const std::size_t in = sizes_[l], out = sizes_[l + 1];
      const T* input = l == 0 ? x_.data() : post_[l - 1].data();
      // fc.weight gradient [in x out] = input^T [in x n] * delta [n x out], straight into the
      // working gradient arena.
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, out, in, n, delta_[l].data(), out, input, in,
           grads_.view(2 * l).data(), cuda_data_type<T>(), out);
      kernels::column_sums<T><<<kernels::grid_for(out), kernels::block, 0, stream()>>>(
          delta_[l].data(), n, out, grads_.view(2 * l + 1).data());
      hone::check_last_launch("train_mlp column_sums");
      if (l > 0) {
        // Gradient w.r.t. the layer's input [n x in] = delta [n x out] * W^T [out x in], in fp32,
        // then through the ReLU into the previous layer's delta.
        gemm(CUBLAS_OP_T, CUBLAS_OP_N, in, n, out, values_.view(2 * l).data(), out,
             delta_[l].data(), out, upstream_.data(), CUDA_R_32F, in);
        kernels::relu_backward<T><<<kernels::grid_for(n * in), kernels::block, 0, stream()>>>(
            upstream_.data(), pre_[l - 1].data(), delta_[l - 1].data(), n * in);
        hone::check_last_launch("train_mlp relu_backward");
      }
    }
    const results r = read_results();
    return static_cast<float>(r.loss_sum / static_cast<double>(n));
  }

  /// Loss and accuracy on a whole split (forward only, in chunks).
  evaluation evaluate(const split& data, std::size_t features) {
    hone::require(features == sizes_[0],
                  "train_mlp::cuda::mlp::evaluate: the split has " + std::to_string(features) +
                      " features per sample, the model takes " + std::to_string(sizes_[0]));
    constexpr std::size_t chunk = 512;
    double loss_sum = 0.0;
    unsigned long long correct = 0;
    for (std::size_t start = 0; start < data.size(); start += chunk) {
      const std::size_t n = std::min(chunk, data.size() - start);
      const batch b{std::span<const float>(data.x).subspan(start * features, n * features),
                    std::span<const std::int32_t>(data.y).subspan(start, n)};
      upload(b);
      forward(n);
      kernels::softmax_cross_entropy<T><<<kernels::grid_for(n), kernels::block, 0, stream()>>>(
          pre_[layers - 1].data(), labels_.data(), n, sizes_[layers], 0.0f,
          static_cast<T*>(nullptr), sample_loss_.data(), sample_correct_.data());
      hone::check_last_launch("train_mlp softmax_cross_entropy");
      sum_results(n);
      const results r = read_results();
      loss_sum += r.loss_sum;
      correct += r.correct;
    }
    const auto total = static_cast<double>(data.size());
    return {loss_sum / total, static_cast<double>(correct) / total};
  }

  [[nodiscard]] const hone::arena_layout& layout() const noexcept { return layout_; }

  /// A copy of the working gradients of slot `i` as float (for tests).
  [[nodiscard]] std::vector<float> gradient(std::size_t i) const {
    const auto g = grads_.view(i);
    std::vector<T> host(g.size());
    HONE_CUDA_CHECK(cudaMemcpyAsync(host.data(), g.data(), g.size() * sizeof(T),
                                    cudaMemcpyDeviceToHost, cuda_.stream()));
    HONE_CUDA_CHECK(cudaStreamSynchronize(cuda_.stream()));
    return {host.begin(), host.end()};
  }

 private:
  struct results {
    double loss_sum;
    unsigned long long correct;
  };

  [[nodiscard]] cudaStream_t stream() const noexcept { return cuda_.stream(); }

  /// C [m x n] (column-major, ldc) = op(A) * op(B) in cuBLAS's column-major terms; A and B hold T,
  /// C holds c_type; fp32 accumulation. A row-major [r x c] matrix is a column-major [c x r] one,
  /// so the row-major products of the comments above map onto these arguments.
  void gemm(cublasOperation_t op_a, cublasOperation_t op_b, std::size_t m, std::size_t n,
            std::size_t k, const T* a, std::size_t lda, const T* b, std::size_t ldb, void* c,
            cudaDataType_t c_type, std::size_t ldc) {
    const float one = 1.0f, zero = 0.0f;
    TRAIN_MLP_CUBLAS_CHECK(
        cublasGemmEx(cuda_.blas(), op_a, op_b, static_cast<int>(m), static_cast<int>(n),
                     static_cast<int>(k), &one, a, cuda_data_type<T>(), static_cast<int>(lda), b,
                     cuda_data_type<T>(), static_cast<int>(ldb), &zero, c, c_type,
                     static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  /// Copies a batch's samples (cast to T) and labels to the device, after checking the labels.
  void upload(const batch& b) {
    const std::size_t n = b.count();
    hone::require(n > 0, "train_mlp::cuda::mlp: empty batch");
    hone::require(b.x.size() == n * sizes_[0],
                  "train_mlp::cuda::mlp: the batch has " + std::to_string(b.x.size()) +
                      " input values for " + std::to_string(n) + " samples of " +
                      std::to_string(sizes_[0]) + " features");
    for (const std::int32_t y : b.y) {
      hone::require(y >= 0 && static_cast<std::size_t>(y) < sizes_[layers],
                    "train_mlp::cuda::mlp: label " + std::to_string(y) + " is not a class in [0, " +
                        std::to_string(sizes_[layers]) + ")");
    }
    reserve(n);
    const std::size_t values = n * sizes_[0];
    if constexpr (std::is_same_v<T, float>) {
      HONE_CUDA_CHECK(cudaMemcpyAsync(x_.data(), b.x.data(), values * sizeof(float),
                                      cudaMemcpyHostToDevice, stream()));
    } else {
      HONE_CUDA_CHECK(cudaMemcpyAsync(x_float_.data(), b.x.data(), values * sizeof(float),
                                      cudaMemcpyHostToDevice, stream()));
      kernels::cast_to<T><<<kernels::grid_for(values), kernels::block, 0, stream()>>>(
          x_float_.data(), x_.data(), values);
      hone::check_last_launch("train_mlp cast_to");
    }
    HONE_CUDA_CHECK(cudaMemcpyAsync(labels_.data(), b.y.data(), n * sizeof(std::int32_t),
                                    cudaMemcpyHostToDevice, stream()));
  }

  // Forward pass over the n uploaded samples: pre-activations (fp32), ReLU outputs (T) and the
  // logits (pre_[2], fp32).
  void forward(std::size_t n) {
    for (std::size_t l = 0; l < layers; ++l) {
      const std::size_t in = sizes_[l], out = sizes_[l + 1];
      const T* input = l == 0 ? x_.data() : post_[l - 1].data();
      // pre [n x out] = input [n x in] * W [in x out]
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, out, n, in, values_.view(2 * l).data(), out, input, in,
           pre_[l].data(), CUDA_R_32F, out);
      T* post = l + 1 < layers ? post_[l].data() : nullptr;
      kernels::bias_relu<T><<<kernels::grid_for(n * out), kernels::block, 0, stream()>>>(
          pre_[l].data(), values_.view(2 * l + 1).data(), post, n, out);
      hone::check_last_launch("train_mlp bias_relu");
    }
  }

  void sum_results(std::size_t n) {
    kernels::sum_losses<<<1, kernels::block, 0, stream()>>>(
        sample_loss_.data(), sample_correct_.data(), n, &results_.data()->loss_sum,
        &results_.data()->correct);
    hone::check_last_launch("train_mlp sum_losses");
  }

  /// Copies the sums to pinned host memory and waits for the stream.
  results read_results() {
    HONE_CUDA_CHECK(cudaMemcpyAsync(results_host_.data(), results_.data(), sizeof(results),
                                    cudaMemcpyDeviceToHost, stream()));
    HONE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    return *results_host_.data();
  }

  /// Scratch for n samples (grown, never shrunk). Waits for the stream before freeing old buffers.
  void reserve(std::size_t n) {
    if (n <= capacity_) return;
    HONE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    capacity_ = n;
    x_ = hone::buffer<T, hone::cuda_space>(n * sizes_[0]);
    if constexpr (!std::is_same_v<T, float>) {
      x_float_ = hone::buffer<float, hone::cuda_space>(n * sizes_[0]);
    }
    labels_ = hone::buffer<std::int32_t, hone::cuda_space>(n);
    std::size_t widest = 0;
    for (std::size_t l = 0; l < layers; ++l) {
      pre_[l] = hone::buffer<float, hone::cuda_space>(n * sizes_[l + 1]);
      delta_[l] = hone::buffer<T, hone::cuda_space>(n * sizes_[l + 1]);
      if (l + 1 < layers) post_[l] = hone::buffer<T, hone::cuda_space>(n * sizes_[l + 1]);
      if (l > 0) widest = std::max(widest, sizes_[l]);
    }
    upstream_ = hone::buffer<float, hone::cuda_space>(n * widest);
    sample_loss_ = hone::buffer<double, hone::cuda_space>(n);
    sample_correct_ = hone::buffer<unsigned, hone::cuda_space>(n);
  }

  stream_and_blas cuda_;  // first: destroyed last, after every buffer the stream may still use
  layer_sizes sizes_;
  hone::arena_layout layout_;
  hone::arena<T, hone::cuda_space> values_, grads_;
  // Scratch: the batch (T; float before the cast), labels; per layer pre-activations (fp32), ReLU
  // outputs (T, hidden layers), gradients w.r.t. the pre-activations (T); the gradient w.r.t. a
  // hidden layer's output before ReLU' (fp32); per-sample losses and hits.
  std::size_t capacity_ = 0;
  hone::buffer<T, hone::cuda_space> x_;
  hone::buffer<float, hone::cuda_space> x_float_;
  hone::buffer<std::int32_t, hone::cuda_space> labels_;
  std::array<hone::buffer<float, hone::cuda_space>, layers> pre_;
  std::array<hone::buffer<T, hone::cuda_space>, layers> post_, delta_;
  hone::buffer<float, hone::cuda_space> upstream_;
  hone::buffer<double, hone::cuda_space> sample_loss_;
  hone::buffer<unsigned, hone::cuda_space> sample_correct_;
  hone::buffer<results, hone::cuda_space> results_;
  hone::buffer<results, hone::pinned_host_space> results_host_;
};

}  // namespace train_mlp::cuda
