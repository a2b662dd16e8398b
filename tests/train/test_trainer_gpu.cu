// GPU test (label gpu) of the CUDA trainer (hone/train/cuda/trainer.cuh) against the host trainer:
// the same model math (a linear regression whose forward/backward runs on the host and moves its
// weights and gradients through device memory), the same policies, the same batches. Checks per
// step: skipped flags and loss scales identical, losses and gradient norms equal to float
// tolerance; at the end, master weights and moments equal to float tolerance (the device AdamW
// may contract multiply-adds). fp32 (AdamW, L2 clipping, OneCycle, accumulation), bf16 (SGD with
// momentum, clipping by value) and fp16 (dynamic loss scale) with an injected inf: the skipped
// step leaves the device master weights, moments and working weights bit-identical.
// Exits 77 (skipped) when no CUDA device is present.
#define BOOST_TEST_MODULE hone_train_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <hone/optim/sgd.hpp>
#include <hone/schedule/one_cycle.hpp>
#include <hone/train/cuda/trainer.cuh>
#include <hone/train/trainer.hpp>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "../support/gpu.hpp"
#include "../support/linear_model.hpp"

namespace {
struct gpu_fixture {
  gpu_fixture() { hone::test::skip_without_gpu(); }
};

/// The same model with its tensors in device memory.
template <class T>
struct device_linear {
  std::size_t dim;
  hone::buffer<T, hone::cuda_space> w, gw, b, gb;
  float nan_in_grad = 0;  // passed to the host twin (fault injection)
  explicit device_linear(std::size_t d) : dim(d), w(d), gw(d), b(1), gb(1) {
    linear<T> init(d);
    HONE_CUDA_CHECK(cudaMemcpy(w.data(), init.w.data(), d * sizeof(T), cudaMemcpyHostToDevice));
    HONE_CUDA_CHECK(cudaMemcpy(b.data(), init.b.data(), sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<hone::parameter<T, hone::cuda_space>> parameters() {
    return {{"w", {dim}, {w.data(), dim}, {gw.data(), dim}},
            {"bias", {1}, {b.data(), 1}, {gb.data(), 1}}};
  }
  float forward_backward(const batch& bt, float scale) {
    linear<T> m(dim);
    HONE_CUDA_CHECK(cudaMemcpy(m.w.data(), w.data(), dim * sizeof(T), cudaMemcpyDeviceToHost));
    HONE_CUDA_CHECK(cudaMemcpy(m.b.data(), b.data(), sizeof(T), cudaMemcpyDeviceToHost));
    m.nan_in_grad = nan_in_grad;
    const float loss = m.forward_backward(bt, scale);
    HONE_CUDA_CHECK(cudaMemcpy(gw.data(), m.gw.data(), dim * sizeof(T), cudaMemcpyHostToDevice));
    HONE_CUDA_CHECK(cudaMemcpy(gb.data(), m.gb.data(), sizeof(T), cudaMemcpyHostToDevice));
    return loss;
  }
};

template <class T>
std::vector<T> download(const T* p, std::size_t n) {
  std::vector<T> h(n);
  HONE_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Runs host and device trainers side by side; inf injected at step `poison_at` (-1: never).
template <class T, class... Policies>
void check_parity(int steps, int poison_at, Policies... policies) {
  const std::size_t dim = 29;
  linear<T> hm(dim);
  device_linear<T> dm(dim);
  hone::trainer ht(hm, policies...);
  hone::trainer dt(dm, policies...);
  static_assert(std::is_same_v<typename decltype(dt)::space_type, hone::cuda_space>);
  static_assert(std::is_same_v<typename decltype(ht)::space_type, hone::host_space>);
  const std::size_t total = dt.layout().total();
  for (int s = 0; s < steps; ++s) {
    const std::vector<batch> parts{make_batch(6, dim, static_cast<unsigned>(40 + 2 * s)),
                                   make_batch(10, dim, static_cast<unsigned>(41 + 2 * s))};
    const bool poison = s == poison_at;
    hm.nan_in_grad = dm.nan_in_grad = poison ? std::numeric_limits<float>::infinity() : 0.0f;
    std::vector<float> master_before, m_before;
    std::vector<T> w_before;
    if (poison) {
      master_before = download(dt.master_weights().data(), total);
      w_before = download(dm.w.data(), dim);
      dt.optimizer_state().for_each_tensor([&](std::string_view, const auto& a) {
        if (m_before.empty()) m_before = download(a.all().data(), total);
      });
    }
    const auto rh = ht.step(std::span<const batch>(parts));
    const auto rd = dt.step(std::span<const batch>(parts));
    BOOST_TEST_CONTEXT("step " << s) {
      BOOST_TEST(rd.skipped == rh.skipped);
      BOOST_TEST(rd.loss_scale == rh.loss_scale);
      BOOST_TEST(rd.lr == rh.lr);
      BOOST_TEST(rd.step == rh.step);
      BOOST_TEST(rd.loss == rh.loss, boost::test_tools::tolerance(1e-4f));
      if (!rh.skipped) BOOST_TEST(rd.grad_norm == rh.grad_norm, boost::test_tools::tolerance(1e-4));
      BOOST_TEST((dt.scaler().state() == ht.scaler().state()));
      if (poison) {
        BOOST_TEST(rd.skipped);
        BOOST_TEST(!std::isfinite(rd.grad_norm));
        BOOST_TEST(same_bits(master_before, download(dt.master_weights().data(), total)));
        BOOST_TEST(same_bits(w_before, download(dm.w.data(), dim)));
        std::vector<float> m_after;
        dt.optimizer_state().for_each_tensor([&](std::string_view, const auto& a) {
          if (m_after.empty()) m_after = download(a.all().data(), total);
        });
        BOOST_TEST(same_bits(m_before, m_after));
      }
    }
  }
  const auto dmaster = download(dt.master_weights().data(), total);
  const auto hmaster = ht.master_weights();
  for (std::size_t i = 0; i < total; ++i) {
    BOOST_TEST(dmaster[i] == hmaster[i], boost::test_tools::tolerance(1e-4f));
  }
  std::vector<std::vector<float>> hs, ds;
  ht.optimizer_state().for_each_tensor(
      [&](std::string_view, const auto& a) { hs.emplace_back(a.all().begin(), a.all().end()); });
  dt.optimizer_state().for_each_tensor(
      [&](std::string_view, const auto& a) { ds.push_back(download(a.all().data(), total)); });
  BOOST_TEST(hs.size() == ds.size());
  for (std::size_t t = 0; t < hs.size() && t < ds.size(); ++t) {
    for (std::size_t i = 0; i < total; ++i) {
      BOOST_TEST(ds[t][i] == hs[t][i], boost::test_tools::tolerance(1e-3f));
    }
  }
  BOOST_TEST(dt.steps_done() == ht.steps_done());
}
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(gpu_fixture);

BOOST_AUTO_TEST_CASE(fp32_adamw_clip_one_cycle_accumulate) {
  check_parity<float>(12, 5, hone::fp32{}, hone::adamw{.weight_decay = 0.1f},
                      hone::accumulate::by_count{}, hone::clip_grad_norm{.max_norm = 0.5f},
                      hone::one_cycle{.max_lr = 0.02, .total_steps = 100});
}

BOOST_AUTO_TEST_CASE(bf16_sgd_clip_by_value) {
  check_parity<hone::bfloat16>(
      12, 7, hone::bf16_mixed{}, hone::sgd{.momentum = 0.9f, .weight_decay = 0.01f},
      hone::accumulate::steps<2>{}, hone::clip_grad_value{.clip_value = 0.1f},
      hone::constant_lr{.base_lr = 0.05});
}

BOOST_AUTO_TEST_CASE(fp16_dynamic_scale_with_an_injected_inf) {
  check_parity<hone::half>(
      12, 4, hone::fp16_mixed<>{.scaler = {.init_scale = 1024, .growth_interval = 2}},
      hone::adamw{}, hone::accumulate::steps<2>{}, hone::constant_lr{.base_lr = 0.01});
}
