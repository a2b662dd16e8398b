// tests/compress/distill_reference.hpp: the distillation loss and its gradient computed the slow,
// obvious way in long double (log-softmax of each row with its own maximum, the KL sum term by
// term, the cross-entropy from the log-softmax), written apart from hone's kernels: the oracle of
// test_distill and test_distill_gpu. Its gradient formula is itself checked against central finite
// differences of its loss (test_distill, "reference_gradient_matches_finite_differences").
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace distill_test {

/// The reference's results in double, for translation units that cannot hold long double (nvcc
/// treats it as double in a .cu file and warns): compute_double is defined in
/// distill_reference.cpp, compiled by the host compiler.
struct reference_double {
  double loss = 0, kl = 0, ce = 0;
  std::vector<double> grad;
};
reference_double compute_double(std::size_t batch, std::size_t classes, const std::vector<float>& s,
                                const std::vector<float>& t,
                                const std::vector<std::int32_t>& labels, double temperature,
                                double alpha, double grad_scale = 1.0);

#if !defined(__CUDACC__)
struct reference {
  long double loss = 0, kl = 0, ce = 0;
  std::vector<long double> grad;
};

inline std::vector<long double> log_softmax(const float* x, std::size_t n, long double T) {
  long double m = -INFINITY;
  for (std::size_t j = 0; j < n; ++j) m = std::fmax(m, static_cast<long double>(x[j]) / T);
  long double z = 0;
  for (std::size_t j = 0; j < n; ++j) z += std::exp(static_cast<long double>(x[j]) / T - m);
  const long double lse = m + std::log(z);
  std::vector<long double> out(n);
  for (std::size_t j = 0; j < n; ++j) out[j] = static_cast<long double>(x[j]) / T - lse;
  return out;
}

/// loss = alpha T^2 mean_i KL(softmax(t_i/T) || softmax(s_i/T)) + (1 - alpha) mean_i CE(s_i, y_i);
/// labels empty: no CE term.
inline reference compute(std::size_t batch, std::size_t classes, const std::vector<float>& s,
                         const std::vector<float>& t, const std::vector<std::int32_t>& labels,
                         double temperature, double alpha, double grad_scale = 1.0) {
  const long double T = temperature, a = alpha, B = static_cast<long double>(batch);
  reference r;
  r.grad.assign(batch * classes, 0.0L);
  for (std::size_t i = 0; i < batch; ++i) {
    const float* si = s.data() + i * classes;
    const float* ti = t.data() + i * classes;
    const auto ls = log_softmax(si, classes, T);
    const auto lt = log_softmax(ti, classes, T);
    const auto l1 = log_softmax(si, classes, 1.0L);
    long double kl = 0;
    for (std::size_t j = 0; j < classes; ++j) kl += std::exp(lt[j]) * (lt[j] - ls[j]);
    r.kl += kl;
    if (!labels.empty()) r.ce += -l1[static_cast<std::size_t>(labels[i])];
    for (std::size_t j = 0; j < classes; ++j) {
      long double g = a * T * (std::exp(ls[j]) - std::exp(lt[j]));
      if (!labels.empty()) {
        g += (1 - a) * (std::exp(l1[j]) - (j == static_cast<std::size_t>(labels[i]) ? 1.0L : 0.0L));
      }
      r.grad[i * classes + j] = g / B * grad_scale;
    }
  }
  r.kl /= B;
  r.ce /= B;
  r.loss = a * T * T * r.kl + (labels.empty() ? 0.0L : (1 - a) * r.ce);
  return r;
}
#endif

/// Logits uniform in [-spread, spread] around a per-row offset.
inline std::vector<float> random_logits(std::size_t n, float spread, std::uint32_t seed,
                                        float offset = 0.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-spread, spread);
  std::vector<float> v(n);
  for (auto& x : v) x = offset + u(rng);
  return v;
}

inline std::vector<std::int32_t> random_labels(std::size_t batch, std::size_t classes,
                                               std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> u(0, static_cast<std::int32_t>(classes) - 1);
  std::vector<std::int32_t> v(batch);
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace distill_test
