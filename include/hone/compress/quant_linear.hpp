// hone/compress/quant_linear.hpp: the dynamic int8 linear layer y = x W^T + b. W is quantized once
// (symmetric int8, per output row) and packed; each call quantizes the rows of x to asymmetric
// uint8 (per row, zero point included), multiplies with int32 accumulation, and dequantizes and
// adds the bias in the epilogue. Three kernels give bit-identical int32 accumulators: a scalar one,
// AVX2 (sign-extended 16-bit pairs, _mm256_madd_epi16, never saturating) and AVX-512 VNNI
// (_mm512_dpbusd_epi32, u8 x s8 into int32, and an AVX-512 epilogue giving the scalar one's bits);
// the fastest the CPU supports is chosen at run time, so a generic -O2 build still gets it. The
// kernels are in detail/int8_gemm_kernels.hpp. docs/quant.md.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/blocked_range2d.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hone/compress/detail/int8_gemm_kernels.hpp"
#include "hone/compress/quant.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

/// Which int8 GEMM kernel runs. automatic picks the fastest the CPU supports.
enum class int8_kernel { automatic, scalar, avx2, avx512_vnni };

[[nodiscard]] inline const char* int8_kernel_name(int8_kernel k) noexcept {
  switch (k) {
    case int8_kernel::automatic:
      return "automatic";
    case int8_kernel::scalar:
      return "scalar";
    case int8_kernel::avx2:
      return "avx2";
    case int8_kernel::avx512_vnni:
      return "avx512_vnni";
  }
  return "?";
}

/// Whether this CPU (and this build's compiler) can run kernel k.
[[nodiscard]] inline bool int8_kernel_supported(int8_kernel k) noexcept {
  switch (k) {
    case int8_kernel::automatic:
    case int8_kernel::scalar:
      return true;
#if HONE_QUANT_X86
    case int8_kernel::avx2:
      return __builtin_cpu_supports("avx2");
    case int8_kernel::avx512_vnni:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vnni");
#else
    default:
      return false;
#endif
  }
  return false;
}

/// The kernel `automatic` resolves to on this CPU.
[[nodiscard]] inline int8_kernel best_int8_kernel() noexcept {
  if (int8_kernel_supported(int8_kernel::avx512_vnni)) return int8_kernel::avx512_vnni;
  if (int8_kernel_supported(int8_kernel::avx2)) return int8_kernel::avx2;
  return int8_kernel::scalar;
}

/// Weights [n, k] int8 packed for the kernels: panels of 16 output rows; within a panel, groups of
/// 4 consecutive k for each of the 16 rows: byte (panel p, group g, row i, j) = W[16 p + i, 4 g +
/// j]. k is padded to a multiple of 4 and n to a multiple of 16 with zero codes.
struct packed_int8_weights {
  std::size_t n = 0, k = 0;    // logical shape
  std::size_t kp = 0, np = 0;  // padded
  std::vector<std::int8_t> data;

  static packed_int8_weights pack(std::span<const std::int8_t> w, std::size_t n, std::size_t k) {
    HONE_REQUIRE(w.size() == n * k, "hone::compress::packed_int8_weights::pack: the codes hold " +
                                        std::to_string(w.size()) + " values, but [" +
                                        std::to_string(n) + ", " + std::to_string(k) + "] needs " +
                                        std::to_string(n * k) + ".");
    packed_int8_weights p;
    p.n = n;
    p.k = k;
    p.kp = (k + 3) / 4 * 4;
    p.np = (n + 15) / 16 * 16;
    p.data.assign(p.np * p.kp, 0);
    for (std::size_t r = 0; r < n; ++r) {
      const std::size_t panel = r / 16, i = r % 16;
      for (std::size_t c = 0; c < k; ++c) {
        const std::size_t g = c / 4, j = c % 4;
        p.data[panel * 16 * p.kp + g * 64 + i * 4 + j] = w[r * k + c];
      }
    }
    return p;
  }
};

namespace detail {

inline int8_kernel resolve_kernel(int8_kernel k, const char* who) {
  if (k == int8_kernel::automatic) return best_int8_kernel();
  HONE_REQUIRE(int8_kernel_supported(k),
               std::string(who) + ": the " + int8_kernel_name(k) +
                   " kernel is not supported by this CPU; use int8_kernel::automatic or "
                   "int8_kernel::scalar.");
  return k;
}

/// Rows [0, m) x panels [p0, p1) with kernel k (int8_gemm_kernels.hpp's contract).
inline void int8_gemm_panels(int8_kernel k, const std::uint8_t* a, std::size_t m,
                             const packed_int8_weights& w, std::size_t p0, std::size_t p1,
                             std::int32_t* c, std::size_t ldc) {
  switch (k) {
#if HONE_QUANT_X86
    case int8_kernel::avx512_vnni:
      int8_gemm_vnni(a, m, w.data.data(), w.kp, p0, p1, c, ldc);
      return;
    case int8_kernel::avx2:
      int8_gemm_avx2(a, m, w.data.data(), w.kp, p0, p1, c, ldc);
      return;
#endif
    default:
      int8_gemm_scalar(a, m, w.data.data(), w.kp, p0, p1, c, ldc);
      return;
  }
}

/// int8_gemm after its checks (c: m x np). Products of at least 2^20 multiply-adds run on oneTBB
/// in tiles of up to 64 rows x 4 panels, each reusing its panels from cache across its rows; each
/// output is one task's sum in k order, so the bits do not depend on the thread count.
inline void int8_gemm_tiles(int8_kernel k, const std::uint8_t* a, std::size_t m,
                            const packed_int8_weights& w, std::int32_t* c) {
  const std::size_t panels = w.np / 16;
  if (m * w.np * w.kp < (std::size_t{1} << 20)) {
    int8_gemm_panels(k, a, m, w, 0, panels, c, w.np);
    return;
  }
  tbb::parallel_for(tbb::blocked_range2d<std::size_t>(0, m, 64, 0, panels, 4),
                    [&](const tbb::blocked_range2d<std::size_t>& t) {
                      const std::size_t r0 = t.rows().begin();
                      int8_gemm_panels(k, a + r0 * w.kp, t.rows().size(), w, t.cols().begin(),
                                       t.cols().end(), c + r0 * w.np, w.np);
                    });
}

}  // namespace detail

/// c[r * np + o] = sum over k of a[r, k] * W[o, k] for r < m, o < np (int32, exact): `a` holds m
/// rows of w.kp uint8 values, c holds m * w.np. Rows of 16-output panels run on oneTBB when the
/// product is large. Every kernel gives the same integers.
inline void int8_gemm(std::span<const std::uint8_t> a, std::size_t m, const packed_int8_weights& w,
                      std::span<std::int32_t> c, int8_kernel kernel = int8_kernel::automatic) {
  constexpr const char* who = "hone::compress::int8_gemm";
  HONE_REQUIRE(a.size() == m * w.kp && c.size() == m * w.np,
               std::string(who) + ": a holds " + std::to_string(a.size()) + " bytes and c " +
                   std::to_string(c.size()) + " values; with m = " + std::to_string(m) +
                   " they need m * kp = " + std::to_string(m * w.kp) +
                   " and m * np = " + std::to_string(m * w.np) + ".");
  detail::int8_gemm_tiles(detail::resolve_kernel(kernel, who), a.data(), m, w, c.data());
}

namespace detail {

/// Whether every value of x is finite (integer test of the exponent bits: vectorizes).
inline bool all_finite(std::span<const float> x) noexcept {
  std::uint32_t bad = 0;
  for (const float v : x) {
    std::uint32_t b;
    std::memcpy(&b, &v, 4);
    bad |= static_cast<std::uint32_t>((b & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

inline void quantize_codes_scalar(std::span<const float> x, std::uint8_t* out, float inv,
                                  float zp) noexcept {
  for (std::size_t i = 0; i < x.size(); ++i) {
    out[i] = static_cast<std::uint8_t>(std::clamp(std::nearbyint(x[i] * inv) + zp, 0.0f, 255.0f));
  }
}

inline void row_range_scalar(std::span<const float> x, float& lo, float& hi) noexcept {
  lo = 0.0f;
  hi = 0.0f;
  for (const float v : x) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
}

#if HONE_QUANT_X86
/// The same range as row_range_scalar for finite x (a zero's sign may differ, which affine_uint8
/// does not see). The masked forms with a full mask stand in for the plain intrinsics, whose
/// undefined pass-through trips gcc 12's -Wmaybe-uninitialized.
__attribute__((target("avx512f"))) inline void row_range_avx512(std::span<const float> x, float& lo,
                                                                float& hi) noexcept {
  __m512 vlo = _mm512_setzero_ps(), vhi = _mm512_setzero_ps();
  std::size_t i = 0;
  for (; i + 16 <= x.size(); i += 16) {
    const __m512 v = _mm512_loadu_ps(x.data() + i);
    vlo = _mm512_mask_min_ps(vlo, 0xffff, v, vlo);
    vhi = _mm512_mask_max_ps(vhi, 0xffff, v, vhi);
  }
  if (i < x.size()) {
    const auto m = static_cast<__mmask16>((1u << (x.size() - i)) - 1u);
    const __m512 v = _mm512_maskz_loadu_ps(m, x.data() + i);  // the zeros are in the range anyway
    vlo = _mm512_mask_min_ps(vlo, 0xffff, v, vlo);
    vhi = _mm512_mask_max_ps(vhi, 0xffff, v, vhi);
  }
  // lanes reduced through memory (gcc 12's _mm512_reduce_* trip -Wmaybe-uninitialized)
  alignas(64) float l[16], h[16];
  _mm512_store_ps(l, vlo);
  _mm512_store_ps(h, vhi);
  lo = l[0];
  hi = h[0];
  for (int j = 1; j < 16; ++j) {
    lo = std::min(lo, l[j]);
    hi = std::max(hi, h[j]);
  }
}

/// The scalar codes, 16 at a time: the same product, round to nearest even (roundscale, as
/// nearbyint in the default mode), the same float add and clamp; exact integers convert exactly.
__attribute__((target("avx512f"))) inline __m512i quantize_codes16(__m512 v, __m512 vinv,
                                                                   __m512 vzp) noexcept {
  const __m512 r = _mm512_maskz_roundscale_ps(0xffff, _mm512_mul_ps(v, vinv),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 lo = _mm512_setzero_ps(), hi = _mm512_set1_ps(255.0f);
  const __m512 t = _mm512_add_ps(r, vzp);
  const __m512 c = _mm512_mask_min_ps(hi, 0xffff, _mm512_mask_max_ps(lo, 0xffff, t, lo), hi);
  return _mm512_maskz_cvttps_epi32(0xffff, c);
}

__attribute__((target("avx512f"))) inline void quantize_codes_avx512(std::span<const float> x,
                                                                     std::uint8_t* out, float inv,
                                                                     float zp) noexcept {
  const __m512 vinv = _mm512_set1_ps(inv), vzp = _mm512_set1_ps(zp);
  const auto code = [&](__m512 v) __attribute__((target("avx512f"))) {
    return quantize_codes16(v, vinv, vzp);
  };
  std::size_t i = 0;
  for (; i + 16 <= x.size(); i += 16) {
    _mm512_mask_cvtusepi32_storeu_epi8(out + i, 0xffff, code(_mm512_loadu_ps(x.data() + i)));
  }
  if (i < x.size()) {
    const auto m = static_cast<__mmask16>((1u << (x.size() - i)) - 1u);
    _mm512_mask_cvtusepi32_storeu_epi8(out + i, m, code(_mm512_maskz_loadu_ps(m, x.data() + i)));
  }
}
#endif

}  // namespace detail

namespace detail {

/// quantize_row_uint8 for a finite row and a resolved kernel (no checks).
inline affine_params quantize_row_uint8_unchecked(std::span<const float> x,
                                                  std::span<std::uint8_t> out,
                                                  int8_kernel k) noexcept {
  float lo = 0.0f, hi = 0.0f;
#if HONE_QUANT_X86
  if (k == int8_kernel::avx512_vnni) {
    row_range_avx512(x, lo, hi);
  } else {
    row_range_scalar(x, lo, hi);
  }
#else
  (void)k;
  row_range_scalar(x, lo, hi);
#endif
  const affine_params p = affine_uint8({lo, hi});
  const float inv = 1.0f / p.scale;
  const float zp = static_cast<float>(p.zero_point);
#if HONE_QUANT_X86
  if (k == int8_kernel::avx512_vnni) {
    quantize_codes_avx512(x, out.data(), inv, zp);
  } else {
    quantize_codes_scalar(x, out.data(), inv, zp);
  }
#else
  quantize_codes_scalar(x, out.data(), inv, zp);
#endif
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(x.size()), out.end(),
            static_cast<std::uint8_t>(p.zero_point));
  return p;
}

}  // namespace detail

/// Per-row activation quantization: the row's range widened to include 0 gives affine_uint8
/// parameters; codes = clamp(round_half_even(x * (1 / scale)) + zero_point, 0, 255). The row is
/// written to out[0, x.size()) and out[x.size(), out.size()) is set to the zero point. The
/// avx512_vnni kernel choice uses AVX-512 code for this too (the same codes); the others scalar.
/// x must be finite (config_error naming the index otherwise).
inline affine_params quantize_row_uint8(std::span<const float> x, std::span<std::uint8_t> out,
                                        int8_kernel kernel = int8_kernel::automatic) {
  constexpr const char* who = "hone::compress::quantize_row_uint8";
  HONE_REQUIRE(out.size() >= x.size(), std::string(who) + ": the output holds " +
                                           std::to_string(out.size()) + " bytes, fewer than the " +
                                           std::to_string(x.size()) + " values of the row.");
  if (!detail::all_finite(x)) detail::require_finite(x, 0, who);
  return detail::quantize_row_uint8_unchecked(x, out, detail::resolve_kernel(kernel, who));
}

/// The dynamic int8 linear layer y = x W^T + b with W [out_features, in_features] (see the header
/// comment). y[r, o] = scale_x[r] * scale_w[o] * (acc[r, o] - zero_point[r] * sum_k Wq[o, k]) +
/// b[o]: the int32 accumulator corrected for the activation zero point exactly (the integer
/// difference), scaled and biased in double (the product never fused with the add) and rounded
/// once to float, the same bits with every kernel (detail::int8_epilogue_one).
class dynamic_int8_linear {
 public:
  /// Quantizes `weight` ([out_features, in_features] row-major, fp32) per output row.
  dynamic_int8_linear(std::span<const float> weight, std::size_t out_features,
                      std::size_t in_features, std::span<const float> bias = {})
      : dynamic_int8_linear(
            quantize_weights(weight, out_features, in_features, quant_granularity::per_channel),
            bias) {}

  /// From already quantized weights (per channel or per tensor), e.g. loaded from a checkpoint.
  explicit dynamic_int8_linear(quantized_weights q, std::span<const float> bias = {})
      : q_(std::move(q)) {
    constexpr const char* who = "hone::compress::dynamic_int8_linear";
    HONE_REQUIRE(q_.rows > 0 && q_.cols > 0, std::string(who) + ": the weight is [" +
                                                 std::to_string(q_.rows) + ", " +
                                                 std::to_string(q_.cols) +
                                                 "]; a linear layer needs at least one input and "
                                                 "one output feature.");
    // The int32 accumulators hold sums of k products |u8 * s8| <= 255 * 127 (the zero point
    // correction is applied in 64-bit), so k * 32385 must stay below 2^31.
    HONE_REQUIRE(q_.cols <= 66000,
                 std::string(who) + ": in_features = " + std::to_string(q_.cols) +
                     " is above 66000, where int32 accumulators of u8 x s8 products may overflow; "
                     "split the layer along its inputs.");
    HONE_REQUIRE(bias.empty() || bias.size() == q_.rows,
                 std::string(who) + ": the bias holds " + std::to_string(bias.size()) +
                     " values; it must be empty or hold out_features = " + std::to_string(q_.rows) +
                     ".");
    bias_.assign(bias.begin(), bias.end());
    packed_ = packed_int8_weights::pack(q_.values, q_.rows, q_.cols);
    // the epilogue's per-output terms in double, padded to np with zeros; |sum| <= 127 * 66000,
    // so the sums are exact
    wscale_.assign(packed_.np, 0.0);
    wsum_.assign(packed_.np, 0.0);
    bias_d_.assign(packed_.np, 0.0);
    for (std::size_t o = 0; o < q_.rows; ++o) {
      std::int64_t s = 0;
      for (std::size_t c = 0; c < q_.cols; ++c) s += q_.values[o * q_.cols + c];
      wsum_[o] = static_cast<double>(s);
      wscale_[o] = static_cast<double>(q_.scale(o));
      if (!bias_.empty()) bias_d_[o] = double{bias_[o]};
    }
  }

  [[nodiscard]] std::size_t in_features() const noexcept { return q_.cols; }
  [[nodiscard]] std::size_t out_features() const noexcept { return q_.rows; }
  [[nodiscard]] const quantized_weights& weights() const noexcept { return q_; }
  [[nodiscard]] std::span<const float> bias() const noexcept { return bias_; }
  [[nodiscard]] const packed_int8_weights& packed() const noexcept { return packed_; }

  /// y [m, out_features] = x [m, in_features] W^T + b (overwrites y). Reuses internal scratch:
  /// one call at a time per layer object (copies are independent).
  void forward(std::span<const float> x, std::size_t m, std::span<float> y,
               int8_kernel kernel = int8_kernel::automatic) {
    constexpr const char* who = "hone::compress::dynamic_int8_linear::forward";
    const std::size_t k = q_.cols, n = q_.rows;
    HONE_REQUIRE(x.size() == m * k && y.size() == m * n,
                 std::string(who) + ": x holds " + std::to_string(x.size()) + " values and y " +
                     std::to_string(y.size()) + "; with m = " + std::to_string(m) +
                     " rows they need m * in_features = " + std::to_string(m * k) +
                     " and m * out_features = " + std::to_string(m * n) + ".");
    if (!detail::all_finite(x)) detail::require_finite(x, k, who);
    const int8_kernel kern = detail::resolve_kernel(kernel, who);
    a_.resize(m * packed_.kp);
    acc_.resize(m * packed_.np);
    params_.resize(m);
    const auto quantize_rows = [&](std::size_t r0, std::size_t r1) {
      for (std::size_t r = r0; r < r1; ++r) {
        params_[r] = detail::quantize_row_uint8_unchecked(
            x.subspan(r * k, k), std::span(a_).subspan(r * packed_.kp, packed_.kp), kern);
      }
    };
    if (m * k < (std::size_t{1} << 16)) {
      quantize_rows(0, m);
    } else {
      tbb::parallel_for(
          tbb::blocked_range<std::size_t>(0, m, 8),
          [&](const tbb::blocked_range<std::size_t>& rr) { quantize_rows(rr.begin(), rr.end()); });
    }
    const detail::int8_epilogue ep{
        params_.data(), wscale_.data(), wsum_.data(), bias_d_.data(), y.data(), n, n};
    detail::int8_gemm_tiles(kern, a_.data(), m, packed_, acc_.data());
    const auto epilogue_rows = [&](std::size_t r0, std::size_t r1) {
#if HONE_QUANT_X86
      if (kern == int8_kernel::avx512_vnni) {
        detail::int8_epilogue_rows_avx512(ep, r0, r1, acc_.data(), packed_.np);
        return;
      }
#endif
      for (std::size_t r = r0; r < r1; ++r) {
        for (std::size_t o = 0; o < n; ++o) {
          y[r * n + o] = detail::int8_epilogue_one(ep, r, o, acc_[r * packed_.np + o]);
        }
      }
    };
    if (m * n < (std::size_t{1} << 16)) {
      epilogue_rows(0, m);
    } else {
      tbb::parallel_for(
          tbb::blocked_range<std::size_t>(0, m, 8),
          [&](const tbb::blocked_range<std::size_t>& rr) { epilogue_rows(rr.begin(), rr.end()); });
    }
  }

  /// The int32 accumulators and activation parameters of the last forward() (for tests and
  /// inspection): acc [m, padded out_features].
  [[nodiscard]] std::span<const std::int32_t> last_accumulators() const noexcept {
    return acc_;
  }
  [[nodiscard]] std::span<const std::uint8_t> last_activations() const noexcept {
    return a_;
  }
  [[nodiscard]] std::span<const affine_params> last_activation_params() const noexcept {
    return params_;
  }

 private:
  quantized_weights q_;
  std::vector<float> bias_;
  packed_int8_weights packed_;
  std::vector<double> wscale_, wsum_, bias_d_;  // [np] each: the epilogue's per-output terms
  std::vector<std::uint8_t> a_;
  std::vector<std::int32_t> acc_;
  std::vector<affine_params> params_;
};

}  // namespace compress
HONE_NAMESPACE_END
