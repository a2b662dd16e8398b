// hone/optim/clipping.hpp: gradient clipping policies and the fused gradient check.
//
// hone folds clipping into the optimizer step: clip_grad_norm measures the total norm in one
// read-only pass and returns a coefficient, which the caller multiplies into
// optimizer_step_args::grad_scale (together with the loss-scale unscaling), so the gradients are
// never rewritten. The same pass reports non-finite gradients; the caller then skips the step.
//
//   const float unscale = 1.0f / loss_scale;
//   const auto r = hone::clip_grad_norm{.max_norm = 1.0f}.clip(grads, unscale);
//   if (!r.nonfinite) state.step(opt, {.step = ++t, .lr = lr, .grad_scale = unscale *
//   r.coefficient},
//                                master, grads.all().data());
//
// PyTorch's torch.nn.utils.clip_grad_norm_(error_if_nonfinite=False) would instead scale the
// gradients by a NaN or zero coefficient and step anyway; with error_if_nonfinite=True it throws.
// hone reports (clip_result::nonfinite) by default and throws hone::error when
// error_if_nonfinite is set.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include "hone/core/arena.hpp"
#include "hone/core/config.hpp"
#include "hone/core/detail/separate_compilation.hpp"
#include "hone/core/error.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/core/parallel.hpp"
#include "hone/core/roles.hpp"
#include "hone/optim/detail/simd.hpp"

HONE_NAMESPACE_BEGIN

/// Result of grad_norm_and_check: the sum of squares of grad * grad_scale (double accumulation)
/// and whether any gradient is inf or NaN.
struct grad_stats {
  double sum_sq = 0.0;
  bool found_nonfinite = false;
};

/// What a clipping policy reports for one step.
struct clip_result {
  /// Total norm of the unscaled gradients (grad * grad_scale); empty when the policy does not
  /// measure it.
  std::optional<float> norm = std::nullopt;
  /// Multiply optimizer_step_args::grad_scale by this (1 when nothing is to be scaled).
  float coefficient = 1.0f;
  /// A gradient is inf or NaN: skip the optimizer step (always false for policies that do not
  /// look at the gradients).
  bool nonfinite = false;
};

/// A clipping policy: plays roles::clipping.
template <class C>
concept clipping_policy = plays_role_v<C, roles::clipping>;

namespace detail {
struct square_to_double {
  template <class G>
  HONE_HOST_DEVICE double operator()(const G& g) const {
    const double x = grad_to_float(g);
    return x * x;
  }
};
struct abs_to_double {
  template <class G>
  HONE_HOST_DEVICE double operator()(const G& g) const {
    const double x = grad_to_float(g);
    return x < 0 ? -x : x;
  }
};
/// |g| with NaN kept, and a max that keeps NaN from either side (torch's max propagates NaN).
struct abs_to_float {
  template <class G>
  HONE_HOST_DEVICE float operator()(const G& g) const {
    const float x = grad_to_float(g);
    return x < 0.0f ? -x : x;
  }
};
struct max_nan {
  HONE_HOST_DEVICE float operator()(float a, float b) const { return (a != a || a > b) ? a : b; }
};
struct pow_to_double {
  double p;
  template <class G>
  double operator()(const G& g) const {
    return std::pow(std::fabs(static_cast<double>(grad_to_float(g))), p);
  }
};

HONE_DETAIL_DECL void check_grad_scale(float s, const char* who);
#if HONE_DETAIL_DEFINITIONS
HONE_DETAIL_DECL void check_grad_scale(float s, const char* who) {
  HONE_REQUIRE(
      std::isfinite(s) && s > 0.0f,
      std::string(who) + ": grad_scale must be finite and positive, got " + std::to_string(s));
}
#endif
}  // namespace detail

/// One read-only pass over n gradients (float, bfloat16 or half): the sum of squares of
/// grad * grad_scale, accumulated in double, and whether any is non-finite. Deterministic
/// (hone::transform_reduce). The unscale factor is applied to the sum, not per element.
template <class G>
grad_stats grad_norm_and_check(const G* grad, std::size_t n, float grad_scale = 1.0f,
                               host_tuning tuning = {}) {
  detail::check_grad_scale(grad_scale, "hone::grad_norm_and_check");
  const double sum = transform_reduce(n, 0.0, detail::square_to_double{}, plus{}, tuning, grad);
  const double s = grad_scale;
  // Squares of finite floats never overflow a double (and n * FLT_MAX^2 < DBL_MAX), so the sum is
  // finite exactly when every gradient is.
  return {sum * s * s, !std::isfinite(sum)};
}

/// grad_norm_and_check over every tensor of a list (one pass, deterministic).
template <class G>
grad_stats grad_norm_and_check(const tensor_lists<G>& grads, float grad_scale = 1.0f,
                               host_tuning tuning = {}) {
  detail::check_grad_scale(grad_scale, "hone::grad_norm_and_check");
  const double sum = transform_reduce(grads, 0.0, detail::square_to_double{}, plus{}, tuning);
  const double s = grad_scale;
  return {sum * s * s, !std::isfinite(sum)};
}

/// Clip by total norm, torch.nn.utils.clip_grad_norm_ semantics: the norm of all gradients
/// together (as if concatenated), coefficient = min(1, max_norm / (norm + 1e-6)).
struct clip_grad_norm {
  using role = roles::clipping;
  float max_norm = 1.0f;
  /// 2 (default), 1, infinity (std::numeric_limits<float>::infinity()) or any p > 0.
  float norm_type = 2.0f;
  /// Throw hone::error on a non-finite norm instead of reporting it.
  bool error_if_nonfinite = false;

  /// The norm and coefficient of n gradients (scaled by grad_scale). Reads only.
  template <class G>
  clip_result clip(const G* grad, std::size_t n, float grad_scale = 1.0f,
                   host_tuning tuning = {}) const;

  /// The same over tensor lists (G may be const).
  template <class G>
  clip_result clip(const tensor_lists<G>& grads, float grad_scale = 1.0f,
                   host_tuning tuning = {}) const {
    check();
    detail::check_grad_scale(grad_scale, "hone::clip_grad_norm");
    double total = 0.0;
    if (std::isinf(norm_type)) {
      total = transform_reduce(grads, 0.0f, detail::abs_to_float{}, detail::max_nan{}, tuning);
      total *= grad_scale;
    } else if (norm_type == 2.0f) {
      total = std::sqrt(grad_norm_and_check(grads, grad_scale, tuning).sum_sq);
    } else if (norm_type == 1.0f) {
      total = transform_reduce(grads, 0.0, detail::abs_to_double{}, plus{}, tuning);
      total *= grad_scale;
    } else {
      const double p = norm_type;
      total = transform_reduce(grads, 0.0, detail::pow_to_double{p}, plus{}, tuning);
      total = std::pow(total, 1.0 / p) * grad_scale;
    }
    return finish(static_cast<float>(total));
  }

  /// The same over a whole gradient arena (its zero padding does not change any norm).
  template <class G, class Space>
  clip_result clip(const arena<G, Space>& grads, float grad_scale = 1.0f,
                   host_tuning tuning = {}) const requires(space_traits<Space>::host_accessible) {
    return clip(grads.all().data(), grads.all().size(), grad_scale, tuning);
  }

  /// What pieces of the gradients contribute to the norm when they are reduced apart (hone::zero's
  /// shards): the largest |g| for order infinity (pieces combine by maximum,
  /// norm_combines_by_max()), else the sum of |g|^p in double (pieces add up; p = 2: the squares).
  /// norm_from_partial of the combined value is the norm (unscaled gradients).
  template <class G>
  [[nodiscard]] double norm_partial(const G* grad, std::size_t n, host_tuning tuning = {}) const {
    if (n == 0) return 0.0;
    if (std::isinf(norm_type)) {
      return transform_reduce(n, 0.0f, detail::abs_to_float{}, detail::max_nan{}, tuning, grad);
    }
    if (norm_type == 2.0f) {
      return transform_reduce(n, 0.0, detail::square_to_double{}, plus{}, tuning, grad);
    }
    if (norm_type == 1.0f) {
      return transform_reduce(n, 0.0, detail::abs_to_double{}, plus{}, tuning, grad);
    }
    return transform_reduce(n, 0.0, detail::pow_to_double{norm_type}, plus{}, tuning, grad);
  }
  [[nodiscard]] bool norm_combines_by_max() const noexcept { return std::isinf(norm_type); }
  /// The norm of combined partials: as it is (infinity, 1), its square root (2), its p-th root.
  [[nodiscard]] double norm_from_partial(double combined) const {
    if (std::isinf(norm_type) || norm_type == 1.0f) return combined;
    if (norm_type == 2.0f) return std::sqrt(combined);
    return std::pow(combined, 1.0 / static_cast<double>(norm_type));
  }

  /// The coefficient for a measured total norm (also used by the CUDA path).
  [[nodiscard]] HONE_DETAIL_DECL clip_result finish(float total_norm) const;

  /// Throws config_error unless max_norm is finite and positive and norm_type positive.
  HONE_DETAIL_DECL void check() const;
};

// clip_grad_norm's members, out of the class: with separate compilation the pass over a pointer
// is compiled once in hone::compiled (src/optim.cpp) and the rest is defined there.
template <class G>
clip_result clip_grad_norm::clip(const G* grad, std::size_t n, float grad_scale,
                                 host_tuning tuning) const {
  check();
  detail::check_grad_scale(grad_scale, "hone::clip_grad_norm");
  // L2: the scale inside the root, as grad_norm_and_check reports the sum of squares
  const double total = norm_type == 2.0f
                           ? std::sqrt(grad_norm_and_check(grad, n, grad_scale, tuning).sum_sq)
                           : norm_from_partial(norm_partial(grad, n, tuning)) * grad_scale;
  return finish(static_cast<float>(total));
}

#if HONE_DETAIL_DEFINITIONS
HONE_DETAIL_DECL clip_result clip_grad_norm::finish(float total_norm) const {
  clip_result r;
  r.norm = total_norm;
  if (!std::isfinite(total_norm)) {
    if (error_if_nonfinite) {
      throw error("hone::clip_grad_norm: the total norm of order " + std::to_string(norm_type) +
                  " of the gradients is non-finite (" + std::to_string(total_norm) +
                  "), so it cannot be clipped; skip this step, or set error_if_nonfinite = "
                  "false to have it reported in clip_result::nonfinite");
    }
    r.nonfinite = true;
    return r;
  }
  // PyTorch: clip_coef = max_norm / (total_norm + 1e-6), clamped to at most 1, in float.
  const float coef = max_norm / (total_norm + 1e-6f);
  r.coefficient = coef < 1.0f ? coef : 1.0f;
  return r;
}

HONE_DETAIL_DECL void clip_grad_norm::check() const {
  HONE_REQUIRE(std::isfinite(max_norm) && max_norm > 0.0f,
               "hone::clip_grad_norm: max_norm must be finite and positive, got " +
                   std::to_string(max_norm));
  HONE_REQUIRE(norm_type > 0.0f && !std::isnan(norm_type),
               "hone::clip_grad_norm: norm_type must be positive (2, 1, any p > 0, or infinity), "
               "got " +
                   std::to_string(norm_type));
}
#endif

#if HONE_DETAIL_EXTERN_TEMPLATES
#define HONE_DETAIL_CLIPPING_EXTERN(G)                                                           \
  extern template grad_stats grad_norm_and_check<G>(const G*, std::size_t, float, host_tuning);  \
  extern template clip_result clip_grad_norm::clip<G>(const G*, std::size_t, float, host_tuning) \
      const;
HONE_DETAIL_CLIPPING_EXTERN(float)
HONE_DETAIL_CLIPPING_EXTERN(bfloat16)
HONE_DETAIL_CLIPPING_EXTERN(half)
#undef HONE_DETAIL_CLIPPING_EXTERN
#endif

/// Clamp functor of clip_grad_value: g = clamp(g, lo, hi), NaN kept; reports non-finite values
/// (through the return value on the host, through *found_inf when set on the device).
template <class G>
struct clip_value_functor {
  float lo, hi;
  int* found_inf = nullptr;

  HONE_HOST_DEVICE int clamp(G& g) const {
    const float x = detail::grad_to_float(g);
    const int bad = !(x - x == 0.0f);  // inf - inf and NaN - NaN are NaN
    if (x < lo) {
      g = G(lo);
    } else if (x > hi) {
      g = G(hi);
    }
    return bad;
  }
  HONE_HOST_DEVICE void operator()(G& g) const {
    if (clamp(g) && found_inf != nullptr) *found_inf = 1;
  }
};

/// Clip by value, torch.nn.utils.clip_grad_value_ semantics applied to the unscaled gradients:
/// the pass clamps grad to [-clip_value, clip_value] / grad_scale in place, so
/// grad * grad_scale lies in [-clip_value, clip_value] (grad_scale stays as it was). The same pass
/// reports non-finite gradients (NaN stays NaN; +-inf become the bounds but are still reported).
struct clip_grad_value {
  using role = roles::clipping;
  float clip_value = 1.0f;

  template <class G>
  clip_result clip(G* grad, std::size_t n, float grad_scale = 1.0f, host_tuning tuning = {}) const {
    static_assert(!std::is_const_v<G>, "hone::clip_grad_value modifies the gradients in place");
    const auto op = functor<G>(grad_scale);
    const int bad = transform_reduce(
        n, 0, [&](G& g) { return op.clamp(g); }, [](int a, int b) { return a | b; }, tuning, grad);
    clip_result r;
    r.nonfinite = bad != 0;
    return r;
  }

  template <class G>
  clip_result clip(const tensor_lists<G>& grads, float grad_scale = 1.0f,
                   host_tuning tuning = {}) const {
    static_assert(!std::is_const_v<G>, "hone::clip_grad_value modifies the gradients in place");
    const auto op = functor<G>(grad_scale);
    const int bad = transform_reduce(
        grads, 0, [&](G& g) { return op.clamp(g); }, [](int a, int b) { return a | b; }, tuning);
    clip_result r;
    r.nonfinite = bad != 0;
    return r;
  }

  template <class G, class Space>
  clip_result clip(arena<G, Space>& grads, float grad_scale = 1.0f, host_tuning tuning = {}) const
      requires(space_traits<Space>::host_accessible) {
    return clip(grads.all().data(), grads.all().size(), grad_scale, tuning);
  }

  /// The clamp functor for a step with this grad_scale (shared with the CUDA path).
  template <class G>
  [[nodiscard]] clip_value_functor<G> functor(float grad_scale, int* found_inf = nullptr) const {
    HONE_REQUIRE(std::isfinite(clip_value) && clip_value >= 0.0f,
                 "hone::clip_grad_value: clip_value must be finite and >= 0, got " +
                     std::to_string(clip_value));
    detail::check_grad_scale(grad_scale, "hone::clip_grad_value");
    const float bound = clip_value / grad_scale;
    return {-bound, bound, found_inf};
  }
};

/// No clipping: reports nothing and scales nothing (no pass over the gradients).
struct no_clipping {
  using role = roles::clipping;
  template <class... Args>
  clip_result clip(Args&&...) const noexcept {
    return {};
  }
};

HONE_NAMESPACE_END
