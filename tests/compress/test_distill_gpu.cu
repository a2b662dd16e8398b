// GPU test (label gpu): hone::compress::distill_workspace (the CUDA distillation loss) against the
// host hone::compress::distill_loss and the long double reference of distill_reference.hpp, on
// random, wide (32000 classes) and extreme (1e4-range) logits, T in {1, 2, 4}; the same bits on two
// runs; bad labels and non-finite logits reported with their row. Exits 77 (skipped) without a
// CUDA device.
#define BOOST_TEST_MODULE hone_compress_distill_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <hone/compress/cuda/distill.cuh>
#include <hone/core/cuda/error.hpp>
#include <limits>
#include <string>
#include <vector>

#include "../support/gpu.hpp"
#include "distill_reference.hpp"

namespace hc = hone::compress;
using distill_test::random_labels;
using distill_test::random_logits;

namespace {

struct gpu_fixture {
  gpu_fixture() { hone::test::skip_without_gpu(); }
};

template <class T>
struct device_array {
  T* p = nullptr;
  explicit device_array(const std::vector<T>& host) {
    HONE_CUDA_CHECK(cudaMalloc(&p, host.size() * sizeof(T) + 1));
    HONE_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~device_array() { (void)cudaFree(p); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
};

struct gpu_result {
  hc::distill_value value;
  std::vector<float> grad;
};

gpu_result run_gpu(std::size_t batch, std::size_t classes, const std::vector<float>& s,
                   const std::vector<float>& t, const std::vector<std::int32_t>& labels,
                   const hc::distill_options& o) {
  device_array<float> ds(s), dt(t), dg(std::vector<float>(s.size(), -7.0f));
  device_array<std::int32_t> dy(labels.empty() ? std::vector<std::int32_t>{0} : labels);
  hc::distill_workspace ws(4);  // grows to the batch
  gpu_result r;
  ws.enqueue({batch, classes}, ds.p, dt.p, labels.empty() ? nullptr : dy.p, dg.p, o, nullptr);
  r.value = ws.result(nullptr);
  r.grad.resize(s.size());
  HONE_CUDA_CHECK(
      cudaMemcpy(r.grad.data(), dg.p, s.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return r;
}

void compare(std::size_t batch, std::size_t classes, const std::vector<float>& s,
             const std::vector<float>& t, const std::vector<std::int32_t>& labels,
             const hc::distill_options& o, const char* what) {
  BOOST_TEST_CONTEXT(what << " classes " << classes << " T " << o.temperature) {
    const gpu_result g = run_gpu(batch, classes, s, t, labels, o);
    std::vector<float> hg(s.size());
    const hc::distill_value h = hc::distill_loss({batch, classes}, s, t, labels, hg, o);
    const auto ref = distill_test::compute_double(batch, classes, s, t, labels, o.temperature,
                                                  o.alpha, o.grad_scale);
    float max_abs = 0.0f;
    for (const float x : s) max_abs = std::fmax(max_abs, std::fabs(x));
    for (const float x : t) max_abs = std::fmax(max_abs, std::fabs(x));
    const double T = o.temperature;
    const double tol = 2e-5 * (T * T * (1.0 + max_abs / T) + 1.0 + max_abs);
    BOOST_TEST(std::fabs(g.value.loss - ref.loss) <= tol);
    BOOST_TEST(std::fabs(g.value.loss - h.loss) <= tol);
    const double gtol = 1e-5 * (o.alpha * T + 1.0) / static_cast<double>(batch);
    double worst_ref = 0.0, worst_host = 0.0;
    for (std::size_t i = 0; i < hg.size(); ++i) {
      worst_ref = std::fmax(worst_ref, std::fabs(g.grad[i] - ref.grad[i]));
      worst_host = std::fmax(worst_host, std::fabs(g.grad[i] - static_cast<double>(hg[i])));
    }
    BOOST_TEST(worst_ref <= gtol);
    BOOST_TEST(worst_host <= gtol);
    const gpu_result again = run_gpu(batch, classes, s, t, labels, o);
    BOOST_TEST(again.value.loss == g.value.loss);
    BOOST_TEST(std::memcmp(again.grad.data(), g.grad.data(), g.grad.size() * sizeof(float)) == 0);
  }
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(gpu_fixture);

BOOST_AUTO_TEST_CASE(matches_host_and_reference) {
  std::uint32_t seed = 1;
  for (const std::size_t classes :
       {std::size_t{1}, std::size_t{17}, std::size_t{1029}, std::size_t{32000}}) {
    const std::size_t batch = classes > 10000 ? 3 : 9;
    const auto s = random_logits(batch * classes, 6.0f, ++seed);
    const auto t = random_logits(batch * classes, 6.0f, ++seed, 1.0f);
    const auto labels = random_labels(batch, classes, ++seed);
    for (const float T : {1.0f, 2.0f, 4.0f}) {
      compare(batch, classes, s, t, labels, {T, 0.3f}, "random");
      compare(batch, classes, s, t, {}, {T, 1.0f}, "no labels");
    }
  }
  const std::size_t batch = 5, classes = 300;
  const auto s = random_logits(batch * classes, 1e4f, 90);
  const auto t = random_logits(batch * classes, 1e4f, 91, 2e4f);
  const auto labels = random_labels(batch, classes, 92);
  for (const float T : {1.0f, 2.0f, 4.0f}) compare(batch, classes, s, t, labels, {T, 0.5f}, "1e4");
}

BOOST_AUTO_TEST_CASE(bad_rows_are_named) {
  const std::size_t batch = 4, classes = 50;
  auto s = random_logits(batch * classes, 3.0f, 5);
  const auto t = random_logits(batch * classes, 3.0f, 6);
  auto labels = random_labels(batch, classes, 7);
  labels[2] = 50;
  std::string m;
  try {
    run_gpu(batch, classes, s, t, labels, {2.0f, 0.5f});
  } catch (const hone::config_error& e) {
    m = e.what();
  }
  BOOST_TEST(m.find("the label of row 2 is outside [0, 50)") != std::string::npos, m);
  labels[2] = 3;
  s[3 * classes + 7] = std::numeric_limits<float>::infinity();
  m.clear();
  try {
    run_gpu(batch, classes, s, t, labels, {2.0f, 0.5f});
  } catch (const hone::config_error& e) {
    m = e.what();
  }
  BOOST_TEST(m.find("logit of row 3 is not finite") != std::string::npos, m);
  hc::distill_options o{2.0f, 0.5f};
  o.nonfinite = hc::nonfinite_logits::propagate;
  const gpu_result p = run_gpu(batch, classes, s, t, labels, o);
  BOOST_TEST(std::isnan(p.value.loss));
  for (std::size_t j = 0; j < classes; ++j) BOOST_TEST(std::isnan(p.grad[3 * classes + j]));
  BOOST_TEST(std::isfinite(p.grad[0]));
}
