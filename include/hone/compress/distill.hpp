// hone/compress/distill.hpp: the fused knowledge-distillation loss on logits (Hinton et al., 2015).
//
// For student logits s and teacher logits t of shape [batch, classes], hard labels y, temperature
// T and weight alpha, with p^T(x) = softmax(x / T):
//
//   loss = alpha * T^2 * KL(p^T(t) || p^T(s)) + (1 - alpha) * CE(s, y)
//
// each term averaged over the batch (PyTorch's
// `alpha * T*T * F.kl_div(F.log_softmax(s/T, 1), F.log_softmax(t/T, 1), log_target=True,
// reduction='batchmean') + (1 - alpha) * F.cross_entropy(s, y)`). The gradient with respect to the
// student logits is, per element,
//
//   d loss / d s_ij = [alpha * T * (p^T(s)_ij - p^T(t)_ij) + (1 - alpha) * (p^1(s)_ij - [j ==
//   y_i])]
//                     / batch
//
// (times options.grad_scale, for a loss-scaled backward pass). The teacher receives no gradient.
//
// One pass per row: a row is handled start to end by one thread (its maximum, then its sums of
// exponentials, then its gradient, while it sits in cache), instead of the half-dozen whole-tensor
// passes of the composed PyTorch expression. Stability: every exponential is taken of a logit minus
// its row's maximum (log-sum-exp), so logits of any finite size (1e4 apart, say) give finite
// results; the per-row logarithms and the batch sums are done in double.
//
// Determinism: rows run in parallel on oneTBB, but each row's arithmetic is fixed and the per-row
// losses are summed in row order afterwards, so the loss and the gradient have the same bits on any
// number of threads.
//
// Instruction sets: the row kernel is compiled for SSE2 (or what the build's flags allow), AVX2
// and AVX-512 in every optimized GCC/Clang x86-64 build, and each call runs the one that
// hone::active_isa() names (hone/core/isa.hpp: the best this CPU supports, or HONE_ISA /
// force_isa()), so a generic -O2 build runs AVX-512 code on an AVX-512 machine. Products are never
// fused into adds in the kernel (no FMA, whatever -ffp-contract says), so every target gives the
// same bits.
//
// The CUDA version (hone/compress/cuda/distill.cuh, from .cu files) computes the same function.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/detail/no_contract.hpp"
#include "hone/core/error.hpp"
#include "hone/core/isa.hpp"
#include "hone/core/parallel.hpp"  // HONE_RESTRICT

// The row kernels (one per instruction set, below) ask for vectorization themselves, as
// core/parallel.hpp's loops do (g++ at -O2 vectorizes nothing with its very-cheap cost model), for
// if-conversion too (the exponential's clamp and the maxima are selects, which -O2 leaves as
// branches that keep a loop scalar), and for no contraction of products into FMAs (g++'s default
// -ffp-contract=fast would fuse them in the AVX-512 and -march=native copies only). The loops
// they inline are written without attributes. Clang vectorizes at -O2 and contracts only within
// an expression: HONE_DETAIL_DISTILL_NO_CONTRACT turns that off in each loop function.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__NVCC__)
#define HONE_DETAIL_DISTILL_VECTORIZE                                                          \
  __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic", "tree-loop-if-convert", \
                          "fp-contract=off")))
#else
#define HONE_DETAIL_DISTILL_VECTORIZE
#endif
#if defined(__clang__)
#define HONE_DETAIL_DISTILL_NO_CONTRACT _Pragma("clang fp contract(off)")
#else
#define HONE_DETAIL_DISTILL_NO_CONTRACT
#endif

HONE_NAMESPACE_BEGIN
namespace compress {

/// The shape of a logits matrix: `batch` rows of `classes` values each, row-major, contiguous.
struct logits_shape {
  std::size_t batch = 0;
  std::size_t classes = 0;
};

/// What the loss does with a logit that is not finite (NaN or +-infinity).
enum class nonfinite_logits : std::uint8_t {
  /// Throw hone::config_error naming the first such row and whether the student or the teacher
  /// holds it (the default: a silent NaN would reach the optimizer).
  error,
  /// Let it through: that row's loss terms and its whole gradient row are NaN, so the batch loss
  /// is NaN, and a trainer's inf/NaN check (a loss scaler) skips the step.
  propagate,
};

/// The loss's parameters.
struct distill_options {
  /// T > 0: both softmaxes of the KL term are taken of logits / T; the term is multiplied by T^2
  /// so that its gradient keeps its size as T changes.
  float temperature = 1.0f;
  /// Weight of the distillation term, in [0, 1]; the hard-label cross-entropy gets 1 - alpha.
  /// With alpha == 1 no labels are needed.
  float alpha = 0.5f;
  /// The gradient is that of loss * grad_scale (a loss scaler's scale); the returned loss is not
  /// scaled.
  float grad_scale = 1.0f;
  nonfinite_logits nonfinite = nonfinite_logits::error;
};

/// The batch means of the loss and of its two terms: loss = alpha * T^2 * kl + (1 - alpha) * ce.
struct distill_value {
  double loss = 0.0;
  double kl = 0.0;  ///< mean over rows of KL(p^T(t) || p^T(s)), without the T^2 factor
  double ce = 0.0;  ///< mean over rows of the cross-entropy of softmax(s) with the labels (0 when
                    ///< there are no labels)
};

namespace detail {

/// Registers of the row loops: each reduction keeps this many partial sums (one vector register
/// of AVX-512, two of AVX, four of SSE2/NEON), so the compiler vectorizes it without reassociating
/// floating-point sums, and the combining order is fixed by the code, not by the flags.
inline constexpr std::size_t distill_lanes = 16;

/// The larger of a and b, for finite a and b: the sign of a - b picks one through integer masks,
/// so a loop of it vectorizes at -O2 with plain SSE2 (a float select, `a > b ? a : b`, stays a
/// branch there and keeps the whole loop scalar).
HONE_FORCEINLINE float distill_max(float a, float b) noexcept {
  const std::int32_t below = std::bit_cast<std::int32_t>(a - b) >> 31;  // all ones when a < b
  return std::bit_cast<float>((std::bit_cast<std::int32_t>(a) & ~below) |
                              (std::bit_cast<std::int32_t>(b) & below));
}

/// e^x for finite x <= 0 (a logit minus its row's maximum, over T), written so that a loop of it
/// vectorizes (no libm call, no branch): Cephes' expf (range reduction by ln 2 in two parts and a
/// degree-6 polynomial, about 1 ulp). Arguments below -87 give e^-87 (1.6e-38) instead of a
/// denormal or zero, which no sum of a row (at least 1, from the maximum) can notice. Rows with a
/// logit that is not finite never get here.
HONE_FORCEINLINE float distill_exp(float x) noexcept {
  HONE_DETAIL_DISTILL_NO_CONTRACT
  x = distill_max(x, -87.0f);
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float k = x * 1.44269504088896341f + shifter;
  const float n = k - shifter;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::int32_t e = (std::bit_cast<std::int32_t>(k) - 0x4B400000 + 127) << 23;
  return p * std::bit_cast<float>(e);
}

/// One row's results: the KL and cross-entropy terms, or NaN where a logit is not finite.
struct distill_row_terms {
  double kl;
  double ce;
  bool finite;
};

/// Pass 1: the row maxima, and whether every logit is finite (x - x is 0 for a finite x, NaN for
/// an infinity or a NaN).
HONE_FORCEINLINE bool distill_row_max(const float* HONE_RESTRICT s, const float* HONE_RESTRICT t,
                                      std::size_t n, float& max_s, float& max_t) {
  constexpr std::size_t L = distill_lanes;
  float ms[L], mt[L], ck[L];
  for (std::size_t k = 0; k < L; ++k) {
    ms[k] = -std::numeric_limits<float>::max();
    mt[k] = -std::numeric_limits<float>::max();
    ck[k] = 0.0f;
  }
  std::size_t j = 0;
  for (; j + L <= n; j += L) {
    for (std::size_t k = 0; k < L; ++k) {
      const float a = s[j + k], b = t[j + k];
      ms[k] = distill_max(a, ms[k]);
      mt[k] = distill_max(b, mt[k]);
      ck[k] += (a - a) + (b - b);
    }
  }
  for (std::size_t k = 0; j < n; ++j, ++k) {
    const float a = s[j], b = t[j];
    ms[k] = distill_max(a, ms[k]);
    mt[k] = distill_max(b, mt[k]);
    ck[k] += (a - a) + (b - b);
  }
  float m1 = ms[0], m2 = mt[0], c = ck[0];
  for (std::size_t k = 1; k < L; ++k) {
    m1 = distill_max(ms[k], m1);
    m2 = distill_max(mt[k], m2);
    c += ck[k];
  }
  max_s = m1;
  max_t = m2;
  return c == 0.0f;
}

/// One element of pass 2 (below), into partial sums k.
template <bool SameT, bool CE, bool Store>
HONE_FORCEINLINE void distill_sum_element(const float* s, const float* HONE_RESTRICT t,
                                          std::size_t j, std::size_t k, float max_s, float max_t,
                                          float inv_t, float* es, float* HONE_RESTRICT et,
                                          float* HONE_RESTRICT e1, float* HONE_RESTRICT as,
                                          float* HONE_RESTRICT at, float* HONE_RESTRICT a1,
                                          float* HONE_RESTRICT ax) {
  HONE_DETAIL_DISTILL_NO_CONTRACT
  const float sj = s[j], tj = t[j];
  const float xs = distill_exp((sj - max_s) * inv_t);
  const float xt = distill_exp((tj - max_t) * inv_t);
  as[k] += xs;
  at[k] += xt;
  ax[k] += xt * (tj - sj);
  if constexpr (CE && !SameT) {
    const float x1 = distill_exp(sj - max_s);
    a1[k] += x1;
    if constexpr (Store) e1[j] = x1;
  }
  if constexpr (Store) {
    es[j] = xs;
    et[j] = xt;
  }
}

/// Pass 2 of a row: the sums of exponentials of the student at T (zs) and at 1 (z1), of the
/// teacher at T (zt), and sum_j e^((t_j - max_t)/T) * (t_j - s_j) (cross). With `Store`, the
/// exponentials are kept for pass 3: e^((s - max_s)/T) in es, the teacher's in et, e^(s - max_s)
/// in e1 (es may be the student row itself: each element is read before it is written).
template <bool SameT, bool CE, bool Store>
HONE_FORCEINLINE void distill_row_sums(const float* s, const float* HONE_RESTRICT t, std::size_t n,
                                       float max_s, float max_t, float inv_t, float* es,
                                       float* HONE_RESTRICT et, float* HONE_RESTRICT e1, double& zs,
                                       double& zt, double& z1, double& cross) {
  constexpr std::size_t L = distill_lanes;
  // Float partial sums over blocks of 1024 logits, gathered into double partial sums after each
  // block: the sums of a 32 Ki-class row keep about 1e-7 relative error instead of 1e-5.
  constexpr std::size_t block = 1024;
  double ds[L], dt[L], d1[L], dx[L];
  for (std::size_t k = 0; k < L; ++k) ds[k] = dt[k] = d1[k] = dx[k] = 0.0;
  for (std::size_t b = 0; b < n; b += block) {
    const std::size_t end = n - b < block ? n : b + block;
    float as[L], at[L], a1[L], ax[L];
    for (std::size_t k = 0; k < L; ++k) as[k] = at[k] = a1[k] = ax[k] = 0.0f;
    std::size_t j = b;
    for (; j + L <= end; j += L) {
      for (std::size_t k = 0; k < L; ++k) {
        distill_sum_element<SameT, CE, Store>(s, t, j + k, k, max_s, max_t, inv_t, es, et, e1, as,
                                              at, a1, ax);
      }
    }
    for (std::size_t k = 0; j < end; ++j, ++k) {
      distill_sum_element<SameT, CE, Store>(s, t, j, k, max_s, max_t, inv_t, es, et, e1, as, at, a1,
                                            ax);
    }
    for (std::size_t k = 0; k < L; ++k) {
      ds[k] += as[k];
      dt[k] += at[k];
      d1[k] += a1[k];
      dx[k] += ax[k];
    }
  }
  double s1 = ds[0], s2 = dt[0], s3 = d1[0], s4 = dx[0];
  for (std::size_t k = 1; k < L; ++k) {
    s1 += ds[k];
    s2 += dt[k];
    s3 += d1[k];
    s4 += dx[k];
  }
  zs = s1;
  zt = s2;
  z1 = (CE && SameT) ? s1 : s3;
  cross = s4;
}

/// Pass 3 of a row: g = cs * es - ct * et + c1 * e1 (e1 == es when T == 1); g may be es itself.
template <bool SameT, bool CE>
HONE_FORCEINLINE void distill_row_grad(float* g, const float* es, const float* HONE_RESTRICT et,
                                       const float* HONE_RESTRICT e1, std::size_t n, float cs,
                                       float ct, float c1) {
  HONE_DETAIL_DISTILL_NO_CONTRACT
  if constexpr (CE && !SameT) {
    for (std::size_t j = 0; j < n; ++j) g[j] = cs * es[j] - ct * et[j] + c1 * e1[j];
  } else {
    for (std::size_t j = 0; j < n; ++j) g[j] = cs * es[j] - ct * et[j];
  }
}

/// Everything the rows share.
struct distill_plan {
  logits_shape shape;
  const float* student;
  const float* teacher;
  const std::int32_t* labels;  // null without labels
  float* grad;                 // null for the loss alone
  double temperature;
  double alpha;
  double grad_scale;
};

/// One row, start to end. `scratch` holds 2 * classes floats when the gradient is wanted.
template <bool SameT, bool CE>
HONE_FORCEINLINE distill_row_terms distill_row(const distill_plan& p, std::size_t i,
                                               float* scratch) {
  const std::size_t n = p.shape.classes;
  const float* s = p.student + i * n;
  const float* t = p.teacher + i * n;
  float* g = p.grad != nullptr ? p.grad + i * n : nullptr;
  const float inv_t = static_cast<float>(1.0 / p.temperature);
  float max_s = 0.0f, max_t = 0.0f;
  if (!distill_row_max(s, t, n, max_s, max_t)) {
    if (g != nullptr) {
      for (std::size_t j = 0; j < n; ++j) g[j] = std::numeric_limits<float>::quiet_NaN();
    }
    const double nan = std::numeric_limits<double>::quiet_NaN();
    return {nan, nan, false};
  }
  const std::size_t y = CE ? static_cast<std::size_t>(p.labels[i]) : 0;
  const double s_y = CE ? static_cast<double>(s[y]) : 0.0;  // read before g (maybe s) is written
  double zs = 0.0, zt = 0.0, z1 = 0.0, cross = 0.0;
  if (g != nullptr) {
    distill_row_sums<SameT, CE, true>(s, t, n, max_s, max_t, inv_t, g, scratch, scratch + n, zs, zt,
                                      z1, cross);
  } else {
    distill_row_sums<SameT, CE, false>(s, t, n, max_s, max_t, inv_t, nullptr, nullptr, nullptr, zs,
                                       zt, z1, cross);
  }
  // KL(pt || ps) = sum_j pt_j (t_j - s_j) / T - (lse(t/T) - lse(s/T)), with
  // lse(x/T) = max(x)/T + log(sum_j e^((x_j - max(x))/T)).
  const double T = p.temperature;
  const double lse_diff =
      (static_cast<double>(max_t) - static_cast<double>(max_s)) / T + std::log(zt) - std::log(zs);
  const double kl = cross / zt / T - lse_diff;
  const double ce = CE ? static_cast<double>(max_s) + std::log(z1) - s_y : 0.0;
  if (g != nullptr) {
    const double per_row = p.grad_scale / static_cast<double>(p.shape.batch);
    const double kd = p.alpha * T * per_row;
    const double hard = (1.0 - p.alpha) * per_row;
    double cs = kd / zs;
    const double ct = kd / zt;
    const double c1 = CE ? hard / z1 : 0.0;
    if constexpr (SameT) cs += c1;
    distill_row_grad<SameT, CE>(g, g, scratch, scratch + n, n, static_cast<float>(cs),
                                static_cast<float>(ct), static_cast<float>(c1));
    if constexpr (CE) g[y] -= static_cast<float>(hard);
  }
  return {kl, ce, true};
}

/// The row kernel, compiled once per instruction set: the build's own target, and with run-time
/// dispatch AVX2 and AVX-512 (the loops above are inlined into each).
template <bool SameT, bool CE>
HONE_DETAIL_DISTILL_VECTORIZE distill_row_terms distill_row_default(const distill_plan& p,
                                                                    std::size_t i, float* scratch) {
  return distill_row<SameT, CE>(p, i, scratch);
}
#if defined(HONE_ISA_DISPATCH)
template <bool SameT, bool CE>
__attribute__((target("avx,avx2"))) HONE_DETAIL_DISTILL_VECTORIZE distill_row_terms
distill_row_avx2(const distill_plan& p, std::size_t i, float* scratch) {
  return distill_row<SameT, CE>(p, i, scratch);
}
template <bool SameT, bool CE>
__attribute__((target("avx,avx2,avx512f,avx512bw,avx512dq,avx512vl")))
HONE_DETAIL_DISTILL_VECTORIZE distill_row_terms
distill_row_avx512(const distill_plan& p, std::size_t i, float* scratch) {
  return distill_row<SameT, CE>(p, i, scratch);
}
#endif

using distill_row_fn = distill_row_terms (*)(const distill_plan&, std::size_t, float*);

/// The kernel hone::active_isa() picks (the build's own for scalar and sse2).
template <bool SameT, bool CE>
distill_row_fn distill_row_kernel() {
#if defined(HONE_ISA_DISPATCH)
  switch (active_isa()) {
    case isa::avx512:
      return &distill_row_avx512<SameT, CE>;
    case isa::avx2:
      return &distill_row_avx2<SameT, CE>;
    default:
      break;
  }
#endif
  return &distill_row_default<SameT, CE>;
}

template <bool SameT, bool CE>
void distill_rows(const distill_plan& p, std::span<distill_row_terms> out) {
  const distill_row_fn row = distill_row_kernel<SameT, CE>();
  const std::size_t n = p.shape.classes;
  // Rows per task: at least ~8 Ki logits, so that narrow rows do not pay a task each.
  const std::size_t grain = n >= 8192 ? 1 : 8192 / n;
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, p.shape.batch, grain),
                    [&](const tbb::blocked_range<std::size_t>& r) {
                      std::unique_ptr<float[]> scratch;
                      if (p.grad != nullptr) scratch = std::make_unique<float[]>(2 * n);
                      for (std::size_t i = r.begin(); i != r.end(); ++i) {
                        out[i] = row(p, i, scratch.get());
                      }
                    });
}

/// The message for a row with a logit that is not finite.
inline std::string distill_nonfinite_message(const distill_plan& p, std::size_t row) {
  const std::size_t n = p.shape.classes;
  const char* who = "teacher";
  std::size_t col = 0;
  for (std::size_t j = 0; j < n; ++j) {
    if (!std::isfinite(p.student[row * n + j])) {
      who = "student";
      col = j;
      break;
    }
  }
  if (who[0] == 't') {
    for (std::size_t j = 0; j < n; ++j) {
      if (!std::isfinite(p.teacher[row * n + j])) {
        col = j;
        break;
      }
    }
  }
  const float v = (who[0] == 's' ? p.student : p.teacher)[row * n + col];
  return std::string("hone::compress::distill_loss: the ") + who + " logit at row " +
         std::to_string(row) + ", class " + std::to_string(col) + " is " +
         (std::isnan(v) ? "NaN" : (v > 0 ? "+infinity" : "-infinity")) +
         "; every logit must be finite (check the model's output for that row, or pass "
         "nonfinite_logits::propagate to get a NaN loss instead of this error).";
}

}  // namespace detail

/// Checks the arguments of distill_loss (the CUDA version shares it, without the label values).
/// Throws hone::config_error with a sentence naming what is wrong.
inline void check_distill_arguments(logits_shape shape, std::size_t student_size,
                                    std::size_t teacher_size, std::size_t labels_size,
                                    std::size_t grad_size, const distill_options& o) {
  const std::string f = "hone::compress::distill_loss: ";
  HONE_REQUIRE(shape.batch > 0 && shape.classes > 0,
               f + "the shape is [" + std::to_string(shape.batch) + ", " +
                   std::to_string(shape.classes) +
                   "]; a batch needs at least one row and one class.");
  const std::size_t count = shape.batch * shape.classes;
  HONE_REQUIRE(shape.batch <= std::numeric_limits<std::size_t>::max() / shape.classes,
               f + "the shape's element count overflows std::size_t.");
  HONE_REQUIRE(student_size == count,
               f + "the student logits hold " + std::to_string(student_size) +
                   " values but the shape [" + std::to_string(shape.batch) + ", " +
                   std::to_string(shape.classes) + "] needs " + std::to_string(count) + ".");
  HONE_REQUIRE(teacher_size == count,
               f + "the teacher logits hold " + std::to_string(teacher_size) +
                   " values but the shape [" + std::to_string(shape.batch) + ", " +
                   std::to_string(shape.classes) + "] needs " + std::to_string(count) +
                   " (teacher and student must have the same classes).");
  HONE_REQUIRE(grad_size == 0 || grad_size == count,
               f + "the gradient buffer holds " + std::to_string(grad_size) +
                   " values; pass one of the student's size (" + std::to_string(count) +
                   ") or an empty span for the loss alone.");
  HONE_REQUIRE(std::isfinite(o.temperature) && o.temperature > 0.0f,
               f + "the temperature is " + std::to_string(o.temperature) +
                   "; it must be a finite number above 0 (1 leaves the logits as they are).");
  HONE_REQUIRE(o.alpha >= 0.0f && o.alpha <= 1.0f,
               f + "alpha is " + std::to_string(o.alpha) +
                   "; it weighs the distillation term against the cross-entropy and must lie in "
                   "[0, 1].");
  HONE_REQUIRE(std::isfinite(o.grad_scale),
               f + "grad_scale is not finite; pass the loss scale (1 without one).");
  if (labels_size == 0) {
    HONE_REQUIRE(o.alpha == 1.0f,
                 f + "no labels were given but alpha is " + std::to_string(o.alpha) +
                     ", so the cross-entropy term needs them; pass one label per row, or "
                     "alpha = 1 for the distillation term alone.");
  } else {
    HONE_REQUIRE(labels_size == shape.batch, f + "there are " + std::to_string(labels_size) +
                                                 " labels for " + std::to_string(shape.batch) +
                                                 " rows; pass one label per row.");
  }
}

/// The distillation loss of a batch (see the top of this file), and, when `grad_student` is not
/// empty, its gradient with respect to the student logits, written there (overwritten, not
/// accumulated; `grad_student` may be the student's own buffer: the gradient then replaces the
/// logits). `labels` holds one class index per row, or is empty when alpha == 1.
///
/// Throws hone::config_error for mismatched sizes, a label outside [0, classes) (naming its row),
/// a temperature or alpha out of range, and (with nonfinite_logits::error) a logit that is not
/// finite, naming its row, class and whether it is the student's or the teacher's.
inline distill_value distill_loss(logits_shape shape, std::span<const float> student,
                                  std::span<const float> teacher,
                                  std::span<const std::int32_t> labels,
                                  std::span<float> grad_student,
                                  const distill_options& options = {}) {
  check_distill_arguments(shape, student.size(), teacher.size(), labels.size(), grad_student.size(),
                          options);
  for (std::size_t i = 0; i < labels.size(); ++i) {
    HONE_REQUIRE(labels[i] >= 0 && static_cast<std::size_t>(labels[i]) < shape.classes,
                 "hone::compress::distill_loss: the label of row " + std::to_string(i) + " is " +
                     std::to_string(labels[i]) + ", outside [0, " + std::to_string(shape.classes) +
                     "); a label is the index of the row's true class.");
  }
  const detail::distill_plan plan{shape,
                                  student.data(),
                                  teacher.data(),
                                  labels.empty() ? nullptr : labels.data(),
                                  grad_student.empty() ? nullptr : grad_student.data(),
                                  static_cast<double>(options.temperature),
                                  static_cast<double>(options.alpha),
                                  static_cast<double>(options.grad_scale)};
  std::vector<detail::distill_row_terms> rows(shape.batch);
  const bool same_t = options.temperature == 1.0f;
  const bool ce = !labels.empty();
  if (same_t && ce) {
    detail::distill_rows<true, true>(plan, rows);
  } else if (ce) {
    detail::distill_rows<false, true>(plan, rows);
  } else if (same_t) {
    detail::distill_rows<true, false>(plan, rows);
  } else {
    detail::distill_rows<false, false>(plan, rows);
  }
  distill_value v;
  for (std::size_t i = 0; i < rows.size(); ++i) {  // row order: the same bits on any thread count
    if (!rows[i].finite && options.nonfinite == nonfinite_logits::error) {
      throw config_error(detail::distill_nonfinite_message(plan, i));
    }
    v.kl += rows[i].kl;
    v.ce += rows[i].ce;
  }
  const double b = static_cast<double>(shape.batch);
  v.kl /= b;
  v.ce /= b;
  const double T = plan.temperature;
  double kd = plan.alpha * T * T * v.kl, hard = (1.0 - plan.alpha) * v.ce;
  HONE_DETAIL_OPAQUE_FP(kd);  // neither product fuses into the add (as in the row kernels)
  HONE_DETAIL_OPAQUE_FP(hard);
  v.loss = kd + hard;
  return v;
}

}  // namespace compress
HONE_NAMESPACE_END
