// tests/optim/optim_check.hpp: what the optimizer tests share: the test problems (a layout of
// mixed slot sizes and its parameter groups), random fills, a relative-tolerance comparison, and
// the double-precision references written from PyTorch's documented algorithms
// (torch.optim.SGD / AdamW), against which every optimizer is checked over several steps of
// random data, several slots and parameter groups with their own learning-rate scale and decay.
#pragma once

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <hone/core/arena.hpp>
#include <hone/optim/param_group.hpp>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace optim_test {

// ---- test problems ------------------------------------------------------------------------------

/// Slots of mixed sizes: one crossing the 64 Ki chunk grain, tails that are not multiples of any
/// vector width, biases and norms (no-decay names), and a head with its own learning rate.
inline hone::arena_layout test_layout() {
  hone::arena_layout layout(sizeof(float));
  layout.add("embed.weight", 70001);
  layout.add("block.0.norm.weight", 33);
  layout.add("block.0.attn.bias", 7);
  layout.add("block.0.mlp.weight", 4099);
  layout.add("head.weight", 1000);
  layout.add("head.bias", 1);
  return layout;
}

/// Group 0: biases and norms, no weight decay, half the learning rate. Group 1: the head, twice
/// the learning rate and its own decay. The rest: the default group.
inline std::vector<hone::param_group> test_groups(const hone::arena_layout& layout) {
  return hone::make_param_groups(
      layout, {{hone::is_no_decay_name, 0.5f, 0.0f},
               {[](std::string_view n) { return n.starts_with("head."); }, 2.0f, 0.05f}});
}

struct slot_hyper {
  double lr_scale;
  double weight_decay;
};

/// Per slot: (lr_scale, weight decay) implied by test_groups for a policy decay `policy_wd`.
inline std::vector<slot_hyper> slot_hypers(const hone::arena_layout& layout, double policy_wd) {
  std::vector<slot_hyper> h(layout.size(), {1.0, policy_wd});
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const auto& n = layout[i].name;
    if (hone::is_no_decay_name(n)) {
      h[i] = {0.5, 0.0};
    } else if (n.starts_with("head.")) {
      h[i] = {2.0, static_cast<double>(0.05f)};
    }
  }
  return h;
}

inline void fill_normal(std::span<float> x, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> d(0.0f, stddev);
  for (auto& v : x) v = d(rng);
}

inline std::vector<double> to_double(std::span<const float> x) {
  return {x.begin(), x.end()};
}

/// |got - ref| <= rtol * |ref| + atol_rel * max|ref| for every element.
inline void check_close(const std::string& what, std::span<const float> got,
                        const std::vector<double>& ref, double rtol = 1e-5,
                        double atol_rel = 1e-6) {
  BOOST_REQUIRE_EQUAL(got.size(), ref.size());
  double scale = 0.0;
  for (double r : ref) scale = std::max(scale, std::fabs(r));
  std::size_t bad = 0;
  double worst = 0.0;
  std::size_t worst_i = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double tol = rtol * std::fabs(ref[i]) + atol_rel * scale + 1e-30;
    if (err > tol) ++bad;
    if (err / tol > worst) {
      worst = err / tol;
      worst_i = i;
    }
  }
  BOOST_TEST(bad == 0u, what << ": " << bad << " of " << ref.size()
                             << " elements out of tolerance; worst at " << worst_i << ": "
                             << got[worst_i] << " vs " << ref[worst_i]);
}

// ---- double-precision references (PyTorch's documented algorithms) ----------------------------

struct adam_ref {
  std::vector<double> p, m, v, vmax;
};

/// torch.optim.AdamW, one step on one tensor.
inline void adamw_reference(adam_ref& s, std::span<const float> grad, double grad_scale, double lr,
                            double wd, double beta1, double beta2, double eps, bool amsgrad,
                            std::uint64_t t) {
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(t));
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    const double g = static_cast<double>(grad[i]) * grad_scale;
    s.p[i] -= lr * wd * s.p[i];
    s.m[i] = beta1 * s.m[i] + (1.0 - beta1) * g;
    s.v[i] = beta2 * s.v[i] + (1.0 - beta2) * g * g;
    double vhat = s.v[i];
    if (amsgrad) {
      s.vmax[i] = std::max(s.vmax[i], s.v[i]);
      vhat = s.vmax[i];
    }
    const double denom = std::sqrt(vhat) / std::sqrt(bc2) + eps;
    s.p[i] -= lr / bc1 * s.m[i] / denom;
  }
}

struct sgd_ref {
  std::vector<double> p, buf;
};

/// torch.optim.SGD, one step on one tensor (buffer initialized with the first gradient).
inline void sgd_reference(sgd_ref& s, std::span<const float> grad, double grad_scale, double lr,
                          double wd, double momentum, double dampening, bool nesterov, bool first) {
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    double d = static_cast<double>(grad[i]) * grad_scale;
    if (wd != 0.0) d += wd * s.p[i];
    if (momentum != 0.0) {
      s.buf[i] = first ? d : momentum * s.buf[i] + (1.0 - dampening) * d;
      d = nesterov ? d + momentum * s.buf[i] : s.buf[i];
    }
    s.p[i] -= lr * d;
  }
}

// A schedule of per-step arguments used by the multi-step tests.
inline float lr_at(std::uint64_t t) {
  return 1e-2f * (1.0f - 0.1f * static_cast<float>(t));
}
inline constexpr float test_grad_scale = 0.25f;

}  // namespace optim_test
