// Tests of gradient clipping (hone::clip_grad_norm, clip_grad_value, no_clipping,
// grad_norm_and_check): norms 2, 1, 3 and infinity against torch.nn.utils.clip_grad_norm_'s
// definition, determinism across thread counts, non-finite reports, value clipping of the unscaled
// gradients, and folding the coefficient into the step against clipping the gradients.
#define BOOST_TEST_MODULE hone_optim_clipping
#include <boost/test/unit_test.hpp>

#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <hone/core/arena.hpp>
#include <hone/core/multi_tensor.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/clipping.hpp>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "optim_check.hpp"

using namespace optim_test;

namespace {
double ref_norm(std::span<const float> g, double scale, double p) {
  if (std::isinf(p)) {
    double m = 0.0;
    for (float x : g) m = std::max(m, std::fabs(static_cast<double>(x)));
    return m * scale;
  }
  double s = 0.0;
  for (float x : g) s += std::pow(std::fabs(static_cast<double>(x)), p);
  return std::pow(s, 1.0 / p) * scale;
}
}  // namespace

BOOST_AUTO_TEST_CASE(clip_grad_norm_matches_reference) {
  const auto layout = test_layout();
  std::mt19937 rng(17);
  hone::arena<float> grad(layout);
  for (std::size_t i = 0; i < layout.size(); ++i) fill_normal(grad.view(i), rng, 0.01f * (i + 1));
  const float s = 0.125f;
  for (float p : {2.0f, 1.0f, 3.0f, std::numeric_limits<float>::infinity()}) {
    for (float max_norm : {0.01f, 1.0f, 1e6f}) {
      const hone::clip_grad_norm clip{.max_norm = max_norm, .norm_type = p};
      const auto r = clip.clip(grad, s);
      const double n = ref_norm(grad.all(), s, p);
      BOOST_TEST(!r.nonfinite);
      BOOST_TEST(static_cast<double>(*r.norm) == n, boost::test_tools::tolerance(1e-6));
      const double coef = std::min(1.0, max_norm / (n + 1e-6));
      BOOST_TEST(static_cast<double>(r.coefficient) == coef, boost::test_tools::tolerance(1e-6));
      // The list form sums the same values.
      hone::tensor_lists<const float> lists;
      for (std::size_t i = 0; i < layout.size(); ++i)
        lists.add(layout[i].count, grad.view(i).data());
      const auto r2 = clip.clip(lists, s);
      BOOST_TEST(static_cast<double>(*r2.norm) == n, boost::test_tools::tolerance(1e-6));
    }
  }
}

BOOST_AUTO_TEST_CASE(clip_norm_is_deterministic_across_thread_counts) {
  std::vector<float> g(3'000'001);
  std::mt19937 rng(4);
  fill_normal(g, rng);
  const hone::clip_grad_norm clip;
  const auto many = clip.clip(g.data(), g.size());
  hone::clip_result one;
  tbb::task_arena(1).execute([&] { one = clip.clip(g.data(), g.size()); });
  BOOST_TEST(*many.norm == *one.norm);
  const auto a = hone::grad_norm_and_check(g.data(), g.size(), 0.5f);
  hone::grad_stats b;
  tbb::task_arena(1).execute([&] { b = hone::grad_norm_and_check(g.data(), g.size(), 0.5f); });
  BOOST_TEST(a.sum_sq == b.sum_sq);
}

BOOST_AUTO_TEST_CASE(non_finite_gradients_are_reported) {
  const auto layout = test_layout();
  hone::arena<float> grad(layout);
  std::mt19937 rng(2);
  fill_normal(grad.all(), rng);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    hone::arena<float> g(layout);
    std::copy(grad.all().begin(), grad.all().end(), g.all().begin());
    g.view(3)[17] = bad;
    for (float p : {2.0f, 1.0f, std::numeric_limits<float>::infinity()}) {
      const auto r = hone::clip_grad_norm{.norm_type = p}.clip(g, 0.5f);
      BOOST_TEST(r.nonfinite, "bad " << bad << " p " << p);
      BOOST_TEST(!std::isfinite(*r.norm));
      BOOST_CHECK_THROW((hone::clip_grad_norm{.norm_type = p, .error_if_nonfinite = true}.clip(g)),
                        hone::error);
    }
    const auto st = hone::grad_norm_and_check(g.all().data(), g.all().size(), 0.5f);
    BOOST_TEST(st.found_nonfinite);
    hone::arena<float> g2(layout);
    std::copy(g.all().begin(), g.all().end(), g2.all().begin());
    const auto rv = hone::clip_grad_value{.clip_value = 0.1f}.clip(g2, 0.5f);
    BOOST_TEST(rv.nonfinite);
    if (std::isnan(bad)) BOOST_TEST(std::isnan(g2.view(3)[17]));
  }
  const auto ok = hone::grad_norm_and_check(grad.all().data(), grad.all().size());
  BOOST_TEST(!ok.found_nonfinite);
  double ref = 0.0;
  for (float x : grad.all()) ref += static_cast<double>(x) * x;
  BOOST_TEST(ok.sum_sq == ref, boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(clip_grad_value_clamps_the_unscaled_gradients) {
  std::vector<float> g(1001);
  std::mt19937 rng(6);
  fill_normal(g, rng);
  const auto orig = g;
  const float s = 0.5f;  // unscale factor: the clip applies to g * s
  const auto r = hone::clip_grad_value{.clip_value = 0.3f}.clip(g.data(), g.size(), s);
  BOOST_TEST(!r.nonfinite);
  BOOST_TEST(!r.norm.has_value());
  BOOST_TEST(r.coefficient == 1.0f);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double expected = std::clamp(static_cast<double>(orig[i]) * s, -0.3, 0.3);
    BOOST_TEST(g[i] * s == expected, boost::test_tools::tolerance(1e-6));
  }
  const auto none = hone::no_clipping{}.clip(g.data(), g.size(), s);
  BOOST_TEST(none.coefficient == 1.0f);
  BOOST_TEST(!none.nonfinite);
}

BOOST_AUTO_TEST_CASE(folding_the_clip_coefficient_equals_clipping_the_gradients) {
  // PyTorch order: unscale, clip_grad_norm_ (rewrites the grads), step. hone: one read pass,
  // then the coefficient folded into grad_scale. Same parameters up to rounding.
  const auto layout = test_layout();
  std::mt19937 rng(21);
  hone::arena<float> p1(layout), p2(layout), grad(layout), clipped(layout);
  fill_normal(p1.all(), rng);
  std::copy(p1.all().begin(), p1.all().end(), p2.all().begin());
  fill_normal(grad.all(), rng, 3.0f);
  const float loss_scale = 1024.0f;
  for (auto& g : grad.all()) g *= loss_scale;
  const float unscale = 1.0f / loss_scale;
  const auto r = hone::clip_grad_norm{.max_norm = 1.0f}.clip(grad, unscale);
  BOOST_REQUIRE(r.coefficient < 1.0f);
  for (std::size_t k = 0; k < grad.all().size(); ++k) {
    clipped.all()[k] = grad.all()[k] * unscale * r.coefficient;
  }
  hone::adamw opt;
  hone::adamw_state<> s1(opt, layout), s2(opt, layout);
  for (std::uint64_t t = 1; t <= 3; ++t) {
    s1.step(opt, {.step = t, .lr = 1e-2f, .grad_scale = unscale * r.coefficient}, p1.all().data(),
            static_cast<const float*>(grad.all().data()));
    s2.step(opt, {.step = t, .lr = 1e-2f}, p2.all().data(),
            static_cast<const float*>(clipped.all().data()));
  }
  check_close("folded vs clipped", p1.all(), to_double(p2.all()), 1e-6, 1e-7);
}
