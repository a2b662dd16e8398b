// HOGWILD! against the serial run: sparse logistic regression and dense least squares reach the
// same final loss (within a tolerance) lock-free on several threads. Also run under
// ThreadSanitizer: every access to the shared parameters is a relaxed std::atomic_ref.
#define BOOST_TEST_MODULE hone_rl_extra_hogwild
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <hone/rl/hogwild.hpp>
#include <random>
#include <vector>

namespace {

struct sparse_problem {
  std::size_t dim = 0;
  std::size_t nnz = 0;  // per sample
  std::vector<std::uint32_t> index;
  std::vector<float> value;
  std::vector<float> label;  // 0 or 1

  sparse_problem(std::size_t n, std::size_t d, std::size_t k, std::uint64_t seed) : dim(d), nnz(k) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<std::uint32_t> feat(0, static_cast<std::uint32_t>(d - 1));
    std::uniform_real_distribution<float> u(0, 1);
    std::vector<float> w(d);
    for (auto& x : w) x = normal(g);
    for (std::size_t i = 0; i < n; ++i) {
      float z = 0;
      for (std::size_t j = 0; j < k; ++j) {
        const std::uint32_t f = feat(g);
        const float v = normal(g);
        index.push_back(f);
        value.push_back(v);
        z += w[f] * v;
      }
      label.push_back(u(g) < 1.0f / (1.0f + std::exp(-z)) ? 1.0f : 0.0f);
    }
  }
  [[nodiscard]] std::size_t size() const { return label.size(); }
  [[nodiscard]] float margin(std::size_t i, const std::vector<float>& w) const {
    float z = 0;
    for (std::size_t j = 0; j < nnz; ++j) z += w[index[i * nnz + j]] * value[i * nnz + j];
    return z;
  }
  [[nodiscard]] double loss(const std::vector<float>& w) const {
    double l = 0;
    for (std::size_t i = 0; i < size(); ++i) {
      const double z = margin(i, w);
      l += std::log1p(std::exp(-std::abs(z))) + std::max(z, 0.0) - label[i] * z;
    }
    return l / static_cast<double>(size());
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(sparse_logistic_regression_matches_serial) {
  const sparse_problem prob(20000, 500, 8, 42);
  const float lr = 0.05f;
  auto step = [&](std::size_t i, const hone::hogwild_params& w) {
    const std::size_t k = prob.nnz;
    float z = 0;
    for (std::size_t j = 0; j < k; ++j) z += w.load(prob.index[i * k + j]) * prob.value[i * k + j];
    const float err = 1.0f / (1.0f + std::exp(-z)) - prob.label[i];
    for (std::size_t j = 0; j < k; ++j) {
      w.add(prob.index[i * k + j], -lr * err * prob.value[i * k + j]);
    }
  };
  hone::hogwild_options opt;
  opt.epochs = 5;
  opt.grain = 32;
  std::vector<float> w_serial(prob.dim, 0.0f), w_hog(prob.dim, 0.0f);
  const double l0 = prob.loss(w_serial);
  hone::serial_run(w_serial, prob.size(), step, opt);
  hone::hogwild_run(w_hog, prob.size(), step, opt);
  const double ls = prob.loss(w_serial);
  const double lh = prob.loss(w_hog);
  BOOST_TEST_MESSAGE("logistic loss: start " << l0 << ", serial " << ls << ", hogwild " << lh);
  BOOST_TEST(ls < 0.8 * l0);
  BOOST_TEST(std::abs(lh - ls) < 0.02 * ls);
}

BOOST_AUTO_TEST_CASE(dense_least_squares_with_atomic_add) {
  // y = <w*, x> + noise, 16 dense features: every update touches every parameter (the worst case
  // for lost updates), so atomic_add is used.
  constexpr std::size_t n = 8000, d = 16;
  std::mt19937_64 g(5);
  std::normal_distribution<float> normal;
  std::vector<float> x(n * d), y(n), w_true(d);
  for (auto& v : w_true) v = normal(g);
  for (std::size_t i = 0; i < n; ++i) {
    float s = 0;
    for (std::size_t j = 0; j < d; ++j) {
      x[i * d + j] = normal(g);
      s += x[i * d + j] * w_true[j];
    }
    y[i] = s + 0.1f * normal(g);
  }
  auto loss = [&](const std::vector<float>& w) {
    double l = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double r = -y[i];
      for (std::size_t j = 0; j < d; ++j) r += w[j] * x[i * d + j];
      l += 0.5 * r * r;
    }
    return l / n;
  };
  const float lr = 0.005f;
  auto step = [&](std::size_t i, const hone::hogwild_params& w) {
    float r = -y[i];
    for (std::size_t j = 0; j < d; ++j) r += w.load(j) * x[i * d + j];
    for (std::size_t j = 0; j < d; ++j) w.atomic_add(j, -lr * r * x[i * d + j]);
  };
  hone::hogwild_options opt;
  opt.epochs = 3;
  opt.threads = 2;  // its own arena
  std::vector<float> ws(d, 0.0f), wh(d, 0.0f);
  hone::serial_run(ws, n, step, opt);
  hone::hogwild_run(wh, n, step, opt);
  const double ls = loss(ws), lh = loss(wh);
  BOOST_TEST_MESSAGE("least squares loss: serial " << ls << ", hogwild " << lh);
  BOOST_TEST(ls < 0.01);  // noise floor 0.005
  BOOST_TEST(std::abs(lh - ls) < 0.2 * ls + 1e-4);
  // The view reads what the workers wrote.
  std::vector<float> snap(d);
  hone::hogwild_params(wh).snapshot(snap);
  BOOST_TEST(snap == wh);
}
