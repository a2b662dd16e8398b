// GPU test (label gpu) of the device precision path against its CPU reference:
//  - the fused unscale pass (hone/precision/cuda/unscale.cuh) against the host pass
//    (hone/precision/unscale.hpp) for float, bfloat16 and half gradients, over more tensors than
//    one launch holds and tensors longer than one chunk: master gradients bit-identical, sum of
//    squares equal up to summation order, found_inf for an inf and a NaN, and the clipping
//    coefficient against hone::clip_grad_norm::finish;
//  - the device loss-scale update (hone/precision/cuda/loss_scale.cuh) against
//    hone::dynamic_loss_scaler on a random overflow pattern (with hysteresis), the collapse error,
//    and the static scaler's skip count.
// Exits 77 (skipped) when no CUDA device is present.
#define BOOST_TEST_MODULE hone_precision_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <hone/core/bfloat16.hpp>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <hone/core/cuda/math_mode.cuh>
#include <hone/core/half.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/precision/cuda/loss_scale.cuh>
#include <hone/precision/cuda/unscale.cuh>
#include <hone/precision/loss_scale.hpp>
#include <hone/precision/unscale.hpp>
#include <limits>
#include <random>
#include <vector>

#include "../support/gpu.hpp"

namespace {
struct gpu_fixture {
  gpu_fixture() {
    hone::test::skip_without_gpu();
    hone::require_ieee_device_math(
        "tests/precision/test_precision_gpu.cu");  // it compares device and host bits
  }
};

template <class T>
void upload(hone::buffer<T, hone::cuda_space>& d, const std::vector<T>& h) {
  HONE_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <class T>
std::vector<T> download(const hone::buffer<T, hone::cuda_space>& d) {
  std::vector<T> h(d.size());
  HONE_CUDA_CHECK(cudaMemcpy(h.data(), d.data(), d.size_bytes(), cudaMemcpyDeviceToHost));
  return h;
}
template <class T>
T read_one(const T* device) {
  T v{};
  HONE_CUDA_CHECK(cudaMemcpy(&v, device, sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

/// Tensor sizes: 100 tensors (more than the 93 of one depth-2 launch), two longer than a chunk.
std::vector<std::size_t> sizes() {
  std::vector<std::size_t> s;
  for (int i = 0; i < 100; ++i) s.push_back(static_cast<std::size_t>(1 + (i * 37) % 1500));
  s[3] = 70000;
  s[60] = 200001;
  return s;
}

/// Two micro-batches through the host and the device pass; an optional poison in the second.
template <class G>
void check_unscale(float poison) {
  BOOST_TEST_CONTEXT("G size " << sizeof(G) << ", poison " << poison) {
    const auto sz = sizes();
    std::size_t total = 0;
    std::vector<std::size_t> off;
    for (auto n : sz) {
      off.push_back(total);
      total += n;
    }
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 300.0f);
    std::vector<G> g1(total), g2(total);
    for (auto& x : g1) x = G(nd(rng));
    for (auto& x : g2) x = G(nd(rng));
    if (poison != 0.0f) g2[off[60] + 12345] = G(poison);
    std::vector<float> h_master(total, 1.0f);

    hone::buffer<G, hone::cuda_space> d_g1(total), d_g2(total);
    hone::buffer<float, hone::cuda_space> d_master(total);
    upload(d_g1, g1);
    upload(d_g2, g2);
    upload(d_master, h_master);
    hone::buffer<double, hone::cuda_space> d_sum(1);
    hone::buffer<int, hone::cuda_space> d_inf(1);
    hone::buffer<float, hone::cuda_space> d_norm(1), d_coef(1);
    HONE_CUDA_CHECK(cudaMemset(d_inf.data(), 0, sizeof(int)));

    hone::tensor_lists<float, const G> h1, h2, dl1, dl2;
    for (std::size_t t = 0; t < sz.size(); ++t) {
      h1.add(sz[t], h_master.data() + off[t], g1.data() + off[t]);
      h2.add(sz[t], h_master.data() + off[t], g2.data() + off[t]);
      dl1.add(sz[t], d_master.data() + off[t], d_g1.data() + off[t]);
      dl2.add(sz[t], d_master.data() + off[t], d_g2.data() + off[t]);
    }
    const float f1 = 0.3f / 1024.0f, f2 = 0.7f / 1024.0f;
    hone::unscale_workspace ws;
    const hone::clip_grad_norm clip{.max_norm = 0.5f};
    hone::unscale_outputs out{d_sum.data(), d_inf.data(), d_norm.data(), d_coef.data(),
                              clip.max_norm};
    hone::cuda_exec exec{};
    hone::unscale_accumulate_into(exec, dl1, f1, false, ws, out);
    const double first = read_one(d_sum.data());
    hone::unscale_accumulate_into(exec, dl2, f2, true, ws, out);
    HONE_CUDA_CHECK(cudaDeviceSynchronize());

    const double h_first = hone::unscale_accumulate_into(h1, f1, false);
    const double h_sum = hone::unscale_accumulate_into(h2, f2, true);
    BOOST_TEST(first == h_first, boost::test_tools::tolerance(1e-12));
    const auto d_m = download(d_master);
    // Bit for bit, except a NaN's payload: the host's product keeps the NaN operand's (x86
    // quiets it), the device's is the canonical 0x7fffffff (seen on an H200). Both are NaN.
    std::size_t differ = 0;
    for (std::size_t i = 0; i < total; ++i) {
      const bool both_nan = std::isnan(d_m[i]) && std::isnan(h_master[i]);
      if (!both_nan && std::memcmp(&d_m[i], &h_master[i], sizeof(float)) != 0) ++differ;
    }
    BOOST_TEST(differ == 0u);
    const double sum = read_one(d_sum.data());
    const int found = read_one(d_inf.data());
    if (poison == 0.0f) {
      BOOST_TEST(std::isfinite(h_sum));
      BOOST_TEST(sum == h_sum, boost::test_tools::tolerance(1e-12));
      BOOST_TEST(found == 0);
      const float norm = read_one(d_norm.data());
      BOOST_TEST(norm == static_cast<float>(std::sqrt(h_sum)), boost::test_tools::tolerance(1e-6f));
      const float coef = clip.finish(static_cast<float>(std::sqrt(h_sum))).coefficient;
      BOOST_TEST(coef < 1.0f);  // the clip is active for this data
      BOOST_TEST(read_one(d_coef.data()) == coef, boost::test_tools::tolerance(1e-6f));
    } else {
      BOOST_TEST(!std::isfinite(h_sum));
      BOOST_TEST(!std::isfinite(sum));
      BOOST_TEST(found == 1);
      BOOST_TEST(read_one(d_coef.data()) == 1.0f);
    }
  }
}
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(gpu_fixture);

BOOST_AUTO_TEST_CASE(unscale_matches_the_host_pass) {
  for (float poison :
       {0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    check_unscale<float>(poison);
    check_unscale<hone::bfloat16>(poison);
    check_unscale<hone::half>(poison);
  }
}

BOOST_AUTO_TEST_CASE(empty_lists_give_a_zero_sum) {
  hone::tensor_lists<float, const float> none;
  hone::unscale_workspace ws;
  hone::buffer<double, hone::cuda_space> d_sum(1);
  hone::buffer<int, hone::cuda_space> d_inf(1);
  HONE_CUDA_CHECK(cudaMemset(d_inf.data(), 0, sizeof(int)));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  HONE_CUDA_CHECK(cudaMemcpy(d_sum.data(), &nan, sizeof(double), cudaMemcpyHostToDevice));
  hone::unscale_accumulate_into(hone::cuda_exec{}, none, 1.0f, false, ws,
                                {.sum_sq = d_sum.data(), .found_inf = d_inf.data()});
  HONE_CUDA_CHECK(cudaDeviceSynchronize());
  BOOST_TEST(read_one(d_sum.data()) == 0.0);
  BOOST_TEST(read_one(d_inf.data()) == 0);
}

BOOST_AUTO_TEST_CASE(device_dynamic_scale_follows_the_host_scaler) {
  const hone::dynamic_loss_scale cfg{
      .init_scale = 1024.0f, .growth_interval = 3, .hysteresis = 2, .max_scale = 65536.0f};
  hone::dynamic_loss_scaler host(cfg);
  hone::device_loss_scaler dev;
  hone::cuda_exec exec{};
  dev.load(exec, host.state());
  hone::buffer<int, hone::cuda_space> d_inf(1);
  std::mt19937 rng(3);
  std::bernoulli_distribution overflow(0.3);
  int applied = 0;
  for (int s = 0; s < 3000; ++s) {
    const int inf = overflow(rng) ? 1 : 0;
    HONE_CUDA_CHECK(
        cudaMemcpyAsync(d_inf.data(), &inf, sizeof(int), cudaMemcpyHostToDevice, exec.stream));
    dev.update(exec, d_inf.data(), cfg);
    applied += host.update(inf != 0) ? 1 : 0;
    const auto st = dev.read_state(exec, cfg.min_scale);
    BOOST_TEST((st == host.state()), "step " << s);
    if (st != host.state()) break;
  }
  BOOST_TEST(applied > 1000);
  BOOST_TEST(host.scale() != cfg.init_scale);  // the scale moved both ways along the run
}

BOOST_AUTO_TEST_CASE(device_scale_collapse_is_an_error_and_static_counts_skips) {
  const hone::dynamic_loss_scale cfg{.init_scale = 2.0f, .min_scale = 2.0f};
  hone::dynamic_loss_scaler host(cfg);
  hone::device_loss_scaler dev;
  hone::cuda_exec exec{};
  dev.load(exec, host.state());
  hone::buffer<int, hone::cuda_space> d_inf(1);
  const int one = 1;
  HONE_CUDA_CHECK(cudaMemcpy(d_inf.data(), &one, sizeof(int), cudaMemcpyHostToDevice));
  dev.update(exec, d_inf.data(), cfg);
  BOOST_CHECK_THROW(host.update(true), hone::error);
  BOOST_CHECK_THROW(dev.read_state(exec, cfg.min_scale), hone::error);

  hone::static_loss_scaler st({.scale = 8.0f});
  hone::device_loss_scaler sdev;
  sdev.load(exec, st.state());
  sdev.update(exec, d_inf.data(), hone::static_loss_scale{.scale = 8.0f});
  sdev.update(exec, d_inf.data(), hone::static_loss_scale{.scale = 8.0f});
  st.update(true);
  st.update(true);
  BOOST_TEST((sdev.read_state(exec) == st.state()));
}
