// hone/compress/cuda/quant_linear.cuh: the dynamic int8 linear layer of hone/compress/
// quant_linear.hpp on the GPU, y = x W^T + b for x and y in device memory, with the int8 product
// on cuBLASLt's integer tensor-core (IMMA) path. Include only from .cu files; link CUDA::cublasLt.
//
//   hc::quantized_weights q = hc::quantize_weights(w, out, in);   // or read_quantized(...)
//   hc::cuda_int8_linear lin(q, bias);   // packs the codes once into device memory
//   lin.forward(d_x, m, d_y, stream);    // queued on `stream`, no synchronization
//
// Each forward queues three steps on the caller's stream:
//  1. one block per row of x: the row's [min, max] (widened to 0) through hone::detail::
//     block_reduce (cub::BlockReduce), then the host's asymmetric uint8 codes with the host's
//     operations in the same order (scale = (hi - lo) / 255, zero point = round_half_even(-lo /
//     scale), code = clamp(round_half_even(x * (1 / scale)) + zero point, 0, 255), every step
//     rounded to nearest as on the host: the same codes, scale and zero point bit for bit).
//     cuBLASLt multiplies signed bytes only, so the code u is stored as u - 128 (int8);
//  2. cublasLtMatmul, CUDA_R_8I x CUDA_R_8I -> CUDA_R_32I with CUBLAS_COMPUTE_32I, in the "TN"
//     form the IMMA kernels take with plain column-major layouts (A = the weights, transposed;
//     B = the codes, not transposed); acc[r, o] = sum_k (u[r, k] - 128) Wq[o, k], exact;
//  3. the epilogue: the host's accumulator is acc + 128 sum_k Wq[o, k], so the host's corrected
//     sum acc_u - zero_point * wsum[o] is acc + (128 - zero_point) * wsum[o] (64-bit integers),
//     and y = scale_x * scale_w[o] * that + b[o] in double, rounded once to float: the host's
//     formula, with __dmul_rn / __dadd_rn so that nothing is fused (the host's bits).
//
// Shapes: cuBLASLt's IMMA kernels want 4-byte (preferably 16-byte) aligned pointers and
// dimensions that are multiples of 4, and small or unaligned int8 products have been refused or
// wrong in some cuBLASLt versions (pytorch#106840, #107671: PyTorch's _int_mm refuses M <= 16);
// the layer pads instead of refusing: in_features to a multiple of 16 (zero weight codes, so the
// padding adds nothing), out_features to a multiple of 16, and the rows of x to a multiple of 16,
// at least 32 (rows of zero codes whose results are not read). in_features is limited to 66000 as
// on the host (the int32 sums cannot overflow).
//
// A row of x holding a NaN or an infinity, which the host layer refuses with an exception, gives
// a row of NaN here (the device cannot throw without waiting for the stream).
//
// One forward at a time per layer object (the scratch buffers are the layer's): calls on
// different streams must be ordered by the caller, or use one layer per stream.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hone/compress/quant.hpp"
#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/cuda/block_reduce.cuh"
#include "hone/core/cuda/error.hpp"
#include "hone/core/cuda/space.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {
namespace detail {

inline constexpr int int8_quant_threads = 256;

/// Throws hone::cuda_error naming the cuBLASLt call, its status and the place.
inline void cublaslt_check(cublasStatus_t status, const char* call, const std::string& context,
                           source_location loc = source_location::current()) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw cuda_error(std::string(call) + " failed: " + cublasLtGetStatusString(status) + " (" +
                         cublasLtGetStatusName(status) + ")" + context + " at " +
                         ::hone::detail::where(loc),
                     static_cast<int>(status));
  }
}

/// Checks a cuBLASLt call; `context` (a std::string) is built only when the call failed.
#define HONE_CUBLASLT_CHECK(call, context)                                               \
  do {                                                                                   \
    const cublasStatus_t hone_cublaslt_status_ = (call);                                 \
    if (hone_cublaslt_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                     \
      ::hone::compress::detail::cublaslt_check(hone_cublaslt_status_, #call, (context)); \
  } while (false)

struct int8_min_op {
  __device__ __forceinline__ float operator()(float a, float b) const { return b < a ? b : a; }
};
struct int8_max_op {
  __device__ __forceinline__ float operator()(float a, float b) const { return a < b ? b : a; }
};
struct int8_or_op {
  __device__ __forceinline__ int operator()(int a, int b) const { return a | b; }
};

/// One block per padded row r < rows_padded: rows r < m of x [m, k] become codes[r, 0..kp)
/// (u - 128, the padding columns holding zero_point - 128 as the host pads with the zero point)
/// with scale[r] and zero_point[r]; rows r >= m become zero codes.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    int8_quantize_rows_kernel(const float* __restrict__ x, std::size_t m, std::size_t k,
                              std::size_t kp, std::int8_t* __restrict__ codes,
                              float* __restrict__ scale, std::int32_t* __restrict__ zero_point) {
  using freduce = hone::detail::block_reduce<float, Threads>;
  using ireduce = hone::detail::block_reduce<int, Threads>;
  __shared__ typename freduce::storage fs;
  __shared__ typename ireduce::storage is;
  const std::size_t r = blockIdx.x;
  std::int8_t* out = codes + r * kp;
  if (r >= m) {
    for (std::size_t j = threadIdx.x; j < kp; j += Threads) out[j] = 0;
    return;
  }
  const float* row = x + r * k;
  // The host's row_range_scalar: lo = min(lo, v), hi = max(hi, v) from 0 (std::min / std::max
  // keep the first operand unless the second is strictly beyond it, as these do, so even the
  // sign of a zero bound is the host's; NaN compares false and is caught by `bad`).
  float lo = 0.0f, hi = 0.0f;
  int bad = 0;
  for (std::size_t j = threadIdx.x; j < k; j += Threads) {
    const float v = row[j];
    bad |= isfinite(v) ? 0 : 1;
    lo = v < lo ? v : lo;
    hi = hi < v ? v : hi;
  }
  lo = freduce(fs).all_reduce(lo, int8_min_op{});
  __syncthreads();
  hi = freduce(fs).all_reduce(hi, int8_max_op{});
  bad = ireduce(is).all_reduce(bad, int8_or_op{});
  // affine_uint8({lo, hi}) of quant.hpp, operation for operation.
  float s = 1.0f;
  float zp = 0.0f;
  if (hi != lo) {
    s = __fdiv_rn(__fsub_rn(hi, lo), 255.0f);
    zp = rintf(__fdiv_rn(-lo, s));
    zp = zp < 0.0f ? 0.0f : (255.0f < zp ? 255.0f : zp);
  }
  const float inv = __fdiv_rn(1.0f, s);
  if (threadIdx.x == 0) {
    scale[r] = bad != 0 ? __int_as_float(0x7fc00000) : s;
    zero_point[r] = static_cast<std::int32_t>(zp);
  }
  const int pad = static_cast<int>(zp) - 128;
  for (std::size_t j = threadIdx.x; j < kp; j += Threads) {
    int c = pad;
    if (j < k && bad != 0) {
      c = 0;  // a row with a NaN or an infinity: its scale is NaN, its outputs NaN
    } else if (j < k) {
      // clamp(nearbyint(x * inv) + zp, 0, 255) as the host's quantize_codes_scalar
      float t = __fadd_rn(rintf(__fmul_rn(row[j], inv)), zp);
      t = t < 0.0f ? 0.0f : (255.0f < t ? 255.0f : t);
      c = static_cast<int>(t) - 128;
    }
    out[j] = static_cast<std::int8_t>(c);
  }
}

/// y[r, o] = scale[r] * w_scale[o] * (acc[r, o] + (128 - zero_point[r]) * wsum[o]) + bias[o]
/// for r < m, o < n: the host's epilogue (see the file comment). A template, as every kernel in
/// a header, so that the translation units including it do not each define the host stub.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    int8_linear_epilogue_kernel(const std::int32_t* __restrict__ acc, std::size_t ldc,
                                const float* __restrict__ scale,
                                const std::int32_t* __restrict__ zero_point,
                                const float* __restrict__ w_scale,
                                const std::int32_t* __restrict__ wsum,
                                const float* __restrict__ bias, std::size_t m, std::size_t n,
                                float* __restrict__ y) {
  const std::size_t total = m * n;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const std::size_t r = i / n, o = i % n;
    const long long corrected = static_cast<long long>(acc[r * ldc + o]) +
                                static_cast<long long>(128 - zero_point[r]) * wsum[o];
    const double v =
        __dmul_rn(__dmul_rn(static_cast<double>(scale[r]), static_cast<double>(w_scale[o])),
                  static_cast<double>(corrected));
    y[i] = __double2float_rn(__dadd_rn(v, bias != nullptr ? static_cast<double>(bias[o]) : 0.0));
  }
}

inline std::size_t round_up(std::size_t v, std::size_t to) {
  return (v + to - 1) / to * to;
}

}  // namespace detail

/// Options of cuda_int8_linear.
struct cuda_int8_linear_options {
  /// A cuBLASLt handle to use (the caller keeps it alive and destroys it); null: the layer
  /// creates its own on the current device.
  cublasLtHandle_t handle = nullptr;
  /// Bytes of cuBLASLt workspace the layer allocates and passes to cublasLtMatmul.
  std::size_t workspace_bytes = std::size_t{4} << 20;
};

/// The dynamic int8 linear layer on the GPU (see the file comment). Move-only.
class cuda_int8_linear {
 public:
  static constexpr std::size_t max_in_features = 66000;

  /// Quantizes `weight` ([out_features, in_features] row-major fp32, host memory) per output row,
  /// as dynamic_int8_linear does, and uploads it.
  cuda_int8_linear(std::span<const float> weight, std::size_t out_features, std::size_t in_features,
                   std::span<const float> bias = {}, const cuda_int8_linear_options& options = {})
      : cuda_int8_linear(
            quantize_weights(weight, out_features, in_features, quant_granularity::per_channel),
            bias, options) {}

  /// From quantized weights (per channel or per tensor; host memory), e.g. a host layer's
  /// weights() or read_quantized(...). Uploads synchronously.
  explicit cuda_int8_linear(const quantized_weights& q, std::span<const float> bias = {},
                            const cuda_int8_linear_options& options = {})
      : n_(q.rows), k_(q.cols) {
    constexpr const char* who = "hone::compress::cuda_int8_linear";
    HONE_REQUIRE(n_ > 0 && k_ > 0, std::string(who) + ": the weight is [" + std::to_string(n_) +
                                       ", " + std::to_string(k_) +
                                       "]; a linear layer needs at least one input and one "
                                       "output feature.");
    HONE_REQUIRE(k_ <= max_in_features,
                 std::string(who) + ": in_features = " + std::to_string(k_) +
                     " is above 66000, where int32 accumulators may overflow; split the layer "
                     "along its inputs.");
    HONE_REQUIRE(q.values.size() == n_ * k_, std::string(who) + ": the quantized weights hold " +
                                                 std::to_string(q.values.size()) +
                                                 " codes, but their shape [" + std::to_string(n_) +
                                                 ", " + std::to_string(k_) + "] needs " +
                                                 std::to_string(n_ * k_) + ".");
    const std::size_t scales_needed = q.granularity == quant_granularity::per_tensor ? 1 : n_;
    HONE_REQUIRE(
        q.scales.size() == scales_needed,
        std::string(who) + ": the quantized weights hold " + std::to_string(q.scales.size()) +
            " scales; " +
            (q.granularity == quant_granularity::per_tensor ? "per_tensor" : "per_channel") +
            " weights need " + std::to_string(scales_needed) + ".");
    HONE_REQUIRE(bias.empty() || bias.size() == n_,
                 std::string(who) + ": the bias holds " + std::to_string(bias.size()) +
                     " values; it must be empty or hold out_features = " + std::to_string(n_) +
                     ".");
    kp_ = detail::round_up(k_, 16);
    np_ = detail::round_up(n_, 16);

    std::vector<std::int8_t> packed(np_ * kp_, 0);  // [np, kp] row-major = column-major kp x np
    std::vector<std::int32_t> wsum(n_, 0);
    std::vector<float> w_scale(n_);
    for (std::size_t o = 0; o < n_; ++o) {
      std::int32_t s = 0;
      for (std::size_t c = 0; c < k_; ++c) {
        const std::int8_t v = q.values[o * k_ + c];
        packed[o * kp_ + c] = v;
        s += v;
      }
      wsum[o] = s;
      w_scale[o] = q.scale(o);
    }
    weights_ = buffer<std::int8_t, cuda_space>(packed.size());
    wsum_ = buffer<std::int32_t, cuda_space>(n_);
    w_scale_ = buffer<float, cuda_space>(n_);
    HONE_CUDA_CHECK(
        cudaMemcpy(weights_.data(), packed.data(), packed.size(), cudaMemcpyHostToDevice));
    HONE_CUDA_CHECK(
        cudaMemcpy(wsum_.data(), wsum.data(), n_ * sizeof(std::int32_t), cudaMemcpyHostToDevice));
    HONE_CUDA_CHECK(
        cudaMemcpy(w_scale_.data(), w_scale.data(), n_ * sizeof(float), cudaMemcpyHostToDevice));
    if (!bias.empty()) {
      bias_ = buffer<float, cuda_space>(n_);
      HONE_CUDA_CHECK(
          cudaMemcpy(bias_.data(), bias.data(), n_ * sizeof(float), cudaMemcpyHostToDevice));
    }
    // A pageable cudaMemcpy may return before its DMA lands; kernels on the caller's
    // non-blocking stream are not ordered after the legacy default stream, so wait here.
    HONE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    if (options.workspace_bytes > 0) {
      workspace_ = buffer<std::byte, cuda_space>(options.workspace_bytes);
    }
    handle_ = options.handle;
    if (handle_ == nullptr) {
      HONE_CUBLASLT_CHECK(cublasLtCreate(&handle_), std::string(" (creating the layer's handle)"));
      owns_handle_ = true;
    }
    try {
      HONE_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32I, CUDA_R_32I),
                          shape_context(0));
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      HONE_CUBLASLT_CHECK(
          cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
          shape_context(0));
      HONE_CUBLASLT_CHECK(
          cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
          shape_context(0));
      // A: the weights as stored, kp x np column-major (op(A) = A^T is np x kp)
      HONE_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&a_layout_, CUDA_R_8I, kp_, np_,
                                                     static_cast<std::int64_t>(kp_)),
                          shape_context(0));
    } catch (...) {
      release();
      throw;
    }
  }

  cuda_int8_linear(const cuda_int8_linear&) = delete;
  cuda_int8_linear& operator=(const cuda_int8_linear&) = delete;
  cuda_int8_linear(cuda_int8_linear&& o) noexcept { take(o); }
  cuda_int8_linear& operator=(cuda_int8_linear&& o) noexcept {
    if (this != &o) {
      release();
      take(o);
    }
    return *this;
  }
  ~cuda_int8_linear() { release(); }

  [[nodiscard]] std::size_t in_features() const noexcept { return k_; }
  [[nodiscard]] std::size_t out_features() const noexcept { return n_; }
  /// in_features padded to a multiple of 16 (the row stride of the codes).
  [[nodiscard]] std::size_t padded_in_features() const noexcept { return kp_; }
  /// out_features padded to a multiple of 16 (the row stride of the accumulators).
  [[nodiscard]] std::size_t padded_out_features() const noexcept { return np_; }
  /// The rows of x the GEMM runs for m rows: m rounded up to a multiple of 16, at least 32.
  [[nodiscard]] static std::size_t padded_rows(std::size_t m) noexcept {
    return std::max<std::size_t>(32, detail::round_up(m, 16));
  }

  /// y [m, out_features] = x [m, in_features] W^T + b, x and y in device memory (row-major,
  /// fp32), queued on `stream` (no synchronization). m == 0 does nothing. Grows the layer's
  /// scratch (cudaMalloc) the first time a larger m comes; reserve() does it ahead.
  void forward(const float* x, std::size_t m, float* y, cudaStream_t stream) {
    constexpr const char* who = "hone::compress::cuda_int8_linear::forward";
    if (m == 0) return;
    HONE_REQUIRE(x != nullptr && y != nullptr,
                 std::string(who) + ": x or y is a null pointer with m = " + std::to_string(m) +
                     " rows; pass device arrays of m * in_features and m * out_features floats.");
    HONE_REQUIRE(m <= max_rows, std::string(who) + ": m = " + std::to_string(m) +
                                    " rows exceed the limit of " + std::to_string(max_rows) +
                                    " per call; split the batch.");
    reserve(m);
    const std::size_t mp = padded_rows(m);
    const plan& p = plan_for(mp);
    detail::int8_quantize_rows_kernel<detail::int8_quant_threads>
        <<<static_cast<unsigned>(mp), detail::int8_quant_threads, 0, stream>>>(
            x, m, k_, kp_, codes_.data(), x_scale_.data(), x_zero_point_.data());
    check_last_launch("hone::compress::detail::int8_quantize_rows_kernel");
    const std::int32_t alpha = 1, beta = 0;
    HONE_CUBLASLT_CHECK(
        cublasLtMatmul(handle_, desc_, &alpha, weights_.data(), a_layout_, codes_.data(),
                       p.b_layout, &beta, acc_.data(), p.c_layout, acc_.data(), p.c_layout,
                       p.has_algo ? &p.algo : nullptr, p.has_algo ? workspace_.data() : nullptr,
                       p.has_algo ? p.workspace : 0, stream),
        shape_context(mp));
    const std::size_t total = m * n_;
    const unsigned blocks =
        static_cast<unsigned>(std::min<std::size_t>((total + 255) / 256, std::size_t{1} << 16));
    detail::int8_linear_epilogue_kernel<256><<<blocks, 256, 0, stream>>>(
        acc_.data(), np_, x_scale_.data(), x_zero_point_.data(), w_scale_.data(), wsum_.data(),
        bias_.empty() ? nullptr : bias_.data(), m, n_, y);
    check_last_launch("hone::compress::detail::int8_linear_epilogue_kernel");
  }

  /// Allocates the scratch for up to m rows now (forward does it when needed).
  void reserve(std::size_t m) {
    const std::size_t mp = padded_rows(m);
    if (mp <= rows_) return;
    codes_ = buffer<std::int8_t, cuda_space>(mp * kp_);
    acc_ = buffer<std::int32_t, cuda_space>(mp * np_);
    x_scale_ = buffer<float, cuda_space>(mp);
    x_zero_point_ = buffer<std::int32_t, cuda_space>(mp);
    rows_ = mp;
  }

  // ---- the last forward's intermediates, in device memory (tests, inspection) ----
  /// The activation codes u - 128, [padded_rows(m), padded_in_features()].
  [[nodiscard]] const std::int8_t* device_codes() const noexcept { return codes_.data(); }
  /// The activation scales and zero points of the m rows.
  [[nodiscard]] const float* device_activation_scales() const noexcept { return x_scale_.data(); }
  [[nodiscard]] const std::int32_t* device_zero_points() const noexcept {
    return x_zero_point_.data();
  }
  /// cuBLASLt's int32 sums over the codes u - 128, [padded_rows(m), padded_out_features()].
  [[nodiscard]] const std::int32_t* device_accumulators() const noexcept { return acc_.data(); }
  /// The packed weight codes, [padded_out_features(), padded_in_features()] row-major.
  [[nodiscard]] const std::int8_t* device_weights() const noexcept { return weights_.data(); }

 private:
  static constexpr std::size_t max_rows = std::size_t{1} << 30;

  struct plan {
    std::size_t rows = 0;
    cublasLtMatrixLayout_t b_layout = nullptr, c_layout = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool has_algo = false;
    std::size_t workspace = 0;
  };

  [[nodiscard]] std::string shape_context(std::size_t mp) const {
    return " (hone::compress::cuda_int8_linear, int8 GEMM of " + std::to_string(mp) +
           " padded rows x " + std::to_string(kp_) + " padded in_features x " +
           std::to_string(np_) + " padded out_features)";
  }

  /// The layouts and the algorithm for mp rows, built on first use. The heuristic's first choice
  /// within the workspace; when it offers none, cuBLASLt's own choice without workspace (algo
  /// null), the form PyTorch's int8 GEMM has always used.
  const plan& plan_for(std::size_t mp) {
    for (const plan& p : plans_) {
      if (p.rows == mp) return p;
    }
    if (plans_.size() >= 32) destroy_plans();
    plan p;
    p.rows = mp;
    const std::string ctx = shape_context(mp);
    try {
      HONE_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&p.b_layout, CUDA_R_8I, kp_, mp,
                                                     static_cast<std::int64_t>(kp_)),
                          ctx);
      HONE_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&p.c_layout, CUDA_R_32I, np_, mp,
                                                     static_cast<std::int64_t>(np_)),
                          ctx);
      cublasLtMatmulPreference_t pref = nullptr;
      HONE_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&pref), ctx);
      const std::size_t ws = workspace_.size();
      cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      if (st == CUBLAS_STATUS_SUCCESS) {
        st = cublasLtMatmulAlgoGetHeuristic(handle_, desc_, a_layout_, p.b_layout, p.c_layout,
                                            p.c_layout, pref, 1, &result, &found);
      }
      (void)cublasLtMatmulPreferenceDestroy(pref);
      if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS &&
          result.workspaceSize <= ws) {
        p.algo = result.algo;
        p.has_algo = true;
        p.workspace = result.workspaceSize;
      }
    } catch (...) {
      destroy_plan(p);
      throw;
    }
    plans_.push_back(p);
    return plans_.back();
  }

  static void destroy_plan(plan& p) noexcept {
    if (p.b_layout != nullptr) (void)cublasLtMatrixLayoutDestroy(p.b_layout);
    if (p.c_layout != nullptr) (void)cublasLtMatrixLayoutDestroy(p.c_layout);
    p.b_layout = p.c_layout = nullptr;
  }
  void destroy_plans() noexcept {
    for (plan& p : plans_) destroy_plan(p);
    plans_.clear();
  }

  void release() noexcept {
    destroy_plans();
    if (a_layout_ != nullptr) (void)cublasLtMatrixLayoutDestroy(a_layout_);
    if (desc_ != nullptr) (void)cublasLtMatmulDescDestroy(desc_);
    if (owns_handle_ && handle_ != nullptr) (void)cublasLtDestroy(handle_);
    a_layout_ = nullptr;
    desc_ = nullptr;
    handle_ = nullptr;
    owns_handle_ = false;
  }

  void take(cuda_int8_linear& o) noexcept {
    n_ = o.n_;
    k_ = o.k_;
    kp_ = o.kp_;
    np_ = o.np_;
    rows_ = std::exchange(o.rows_, 0);
    weights_ = std::move(o.weights_);
    wsum_ = std::move(o.wsum_);
    w_scale_ = std::move(o.w_scale_);
    bias_ = std::move(o.bias_);
    workspace_ = std::move(o.workspace_);
    codes_ = std::move(o.codes_);
    acc_ = std::move(o.acc_);
    x_scale_ = std::move(o.x_scale_);
    x_zero_point_ = std::move(o.x_zero_point_);
    handle_ = std::exchange(o.handle_, nullptr);
    owns_handle_ = std::exchange(o.owns_handle_, false);
    desc_ = std::exchange(o.desc_, nullptr);
    a_layout_ = std::exchange(o.a_layout_, nullptr);
    plans_ = std::move(o.plans_);
    o.plans_.clear();
  }

  std::size_t n_ = 0, k_ = 0, kp_ = 0, np_ = 0, rows_ = 0;
  buffer<std::int8_t, cuda_space> weights_;
  buffer<std::int32_t, cuda_space> wsum_;
  buffer<float, cuda_space> w_scale_;
  buffer<float, cuda_space> bias_;
  buffer<std::byte, cuda_space> workspace_;
  buffer<std::int8_t, cuda_space> codes_;
  buffer<std::int32_t, cuda_space> acc_;
  buffer<float, cuda_space> x_scale_;
  buffer<std::int32_t, cuda_space> x_zero_point_;
  cublasLtHandle_t handle_ = nullptr;
  bool owns_handle_ = false;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_layout_ = nullptr;
  std::vector<plan> plans_;
};

}  // namespace compress
HONE_NAMESPACE_END
