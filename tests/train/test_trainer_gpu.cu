// GPU test (label gpu) of the CUDA trainer (hone/train/cuda/trainer.cuh) against the host trainer:
// the same model math (a linear regression whose forward/backward runs on the host and moves its
// weights and gradients through device memory), the same policies, the same batches. Checks per
// step: skipped flags and loss scales identical, losses and gradient norms equal to float
// tolerance; at the end, master weights and moments equal to float tolerance (the two reduce the
// gradient norm in different orders, so clipping coefficients differ in the last bits). fp32
// (AdamW, L2 clipping, OneCycle, accumulation), bf16 (SGD with momentum, clipping by value) and
// fp16 (dynamic loss scale) with an injected inf: the skipped step leaves the device master
// weights, moments and working weights bit-identical.
// The offload role on a CUDA model (hone::offload::optimizer_to_host, cuda_transport): immediate
// mode equals the plain CUDA trainer bit for bit (same device unscale, norm and clipping
// coefficient; the host and device optimizers give the same bits, no FMA contraction on either
// side), for a model whose tensors are separate buffers and for one laid out as an arena, with
// buckets ending inside tensors; delayed mode tracks the host trainer's delayed offload.
// With NCCL (hone::nccl): hone::dist::nccl_data_parallel over a one-rank nccl_comm takes the
// local steps bit for bit.
// Exits 77 (skipped) when no CUDA device is present.
#define BOOST_TEST_MODULE hone_train_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <hone/core/arena.hpp>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <hone/core/cuda/math_mode.cuh>
#include <hone/offload/optimizer_to_host.hpp>
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

#if defined(HONE_WITH_NCCL)
#include <chrono>
#include <hone/dist/nccl/data_parallel.hpp>
#endif

namespace {
struct gpu_fixture {
  gpu_fixture() {
    hone::test::skip_without_gpu();
    hone::require_ieee_device_math(
        "tests/train/test_trainer_gpu.cu");  // it compares device and host bits
  }
};

/// The same model with its tensors in device memory.
template <class T>
struct device_linear {
  std::size_t dim;
  hone::buffer<T, hone::cuda_space> w, gw, b, gb;
  float nan_in_grad = 0;  // passed to the host twin (fault injection)
  const T* weights() const { return w.data(); }
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

/// The same model with both tensors in one device arena laid out as the trainer's fp32 layout
/// (the offload engine then publishes straight into the model's weights).
template <class T>
struct device_linear_arena {
  std::size_t dim;
  hone::arena_layout layout;
  hone::arena<T, hone::cuda_space> w, g;
  float nan_in_grad = 0;
  static hone::arena_layout make_layout(std::size_t d) {
    hone::arena_layout l(sizeof(float));
    l.add("w", d);
    l.add("bias", 1);
    return l;
  }
  explicit device_linear_arena(std::size_t d)
      : dim(d), layout(make_layout(d)), w(layout), g(layout) {
    linear<T> init(d);
    HONE_CUDA_CHECK(
        cudaMemcpy(w.view(0).data(), init.w.data(), d * sizeof(T), cudaMemcpyHostToDevice));
    HONE_CUDA_CHECK(cudaMemcpy(w.view(1).data(), init.b.data(), sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<hone::parameter<T, hone::cuda_space>> parameters() {
    return {{"w", {dim}, {w.view(0).data(), dim}, {g.view(0).data(), dim}},
            {"bias", {1}, {w.view(1).data(), 1}, {g.view(1).data(), 1}}};
  }
  const T* weights() const { return w.view(0).data(); }
  float forward_backward(const batch& bt, float scale) {
    linear<T> m(dim);
    HONE_CUDA_CHECK(
        cudaMemcpy(m.w.data(), w.view(0).data(), dim * sizeof(T), cudaMemcpyDeviceToHost));
    HONE_CUDA_CHECK(cudaMemcpy(m.b.data(), w.view(1).data(), sizeof(T), cudaMemcpyDeviceToHost));
    m.nan_in_grad = nan_in_grad;
    const float loss = m.forward_backward(bt, scale);
    HONE_CUDA_CHECK(
        cudaMemcpy(g.view(0).data(), m.gw.data(), dim * sizeof(T), cudaMemcpyHostToDevice));
    HONE_CUDA_CHECK(cudaMemcpy(g.view(1).data(), m.gb.data(), sizeof(T), cudaMemcpyHostToDevice));
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

/// The offload role against the plain CUDA trainer (immediate mode): everything bit for bit.
template <template <class> class Model, class T, class... Policies>
void check_offload_matches_plain(int steps, int poison_at, Policies... policies) {
  const std::size_t dim = 29;
  Model<T> pm(dim), om(dim);
  hone::trainer pt(pm, policies...);
  // 48-byte buckets: 12 gradients each, so buckets end inside "w".
  hone::trainer ot(om, policies..., hone::offload::optimizer_to_host{.bucket_bytes = 48});
  static_assert(decltype(ot)::offloaded && !decltype(pt)::offloaded);
  static_assert(std::is_same_v<typename decltype(ot)::space_type, hone::cuda_space>);
  const std::size_t total = pt.layout().total();
  BOOST_TEST(ot.layout().total() == total);
  for (int s = 0; s < steps; ++s) {
    const std::vector<batch> parts{make_batch(6, dim, static_cast<unsigned>(70 + 2 * s)),
                                   make_batch(10, dim, static_cast<unsigned>(71 + 2 * s))};
    pm.nan_in_grad = om.nan_in_grad =
        s == poison_at ? std::numeric_limits<float>::infinity() : 0.0f;
    const auto rp = pt.step(std::span<const batch>(parts));
    const auto ro = ot.step(std::span<const batch>(parts));
    BOOST_TEST_CONTEXT("step " << s) {
      BOOST_TEST(ro.skipped == rp.skipped);
      BOOST_TEST(ro.skipped == (s == poison_at));
      BOOST_TEST(ro.loss_scale == rp.loss_scale);
      BOOST_TEST(ro.loss == rp.loss);
      if (!rp.skipped) BOOST_TEST(ro.grad_norm == rp.grad_norm);
      BOOST_TEST(ro.step == rp.step);
      BOOST_TEST(same_bits(download(om.weights(), dim), download(pm.weights(), dim)),
                 "working weights");
    }
  }
  const auto pmaster = download(pt.master_weights().data(), total);
  const std::span<float> omaster = ot.master_weights();  // host memory
  BOOST_TEST(same_bits(pmaster, std::vector<float>(omaster.begin(), omaster.end())),
             "master weights");
  std::vector<std::vector<float>> ps, os;
  pt.optimizer_state().for_each_tensor(
      [&](std::string_view, const auto& a) { ps.push_back(download(a.all().data(), total)); });
  ot.optimizer_state().for_each_tensor(
      [&](std::string_view, const auto& a) { os.emplace_back(a.all().begin(), a.all().end()); });
  BOOST_TEST(ps.size() == os.size());
  for (std::size_t t = 0; t < ps.size() && t < os.size(); ++t) {
    BOOST_TEST(same_bits(ps[t], os[t]), "optimizer state tensor " << t);
  }
}

/// A gradient reduction that halves the gradients (a mean over two ranks whose peer contributed
/// zeros), with the host and the CUDA member function: the same policy for both trainers.
struct halve_gradients {
  using role = hone::roles::gradient_reduction;
  struct halve {
    __host__ __device__ void operator()(float& g) const { g *= 0.5f; }
  };
  void reduce(std::span<float> g) const {
    for (float& x : g) x *= 0.5f;
  }
  void reduce(hone::device_span<float> g, cudaStream_t stream) const {
    hone::tensor_lists<float> lists;
    lists.add(g.size(), g.data());
    hone::for_each(hone::cuda_exec{stream}, lists, halve{});
  }
};
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(gpu_fixture);

BOOST_AUTO_TEST_CASE(offload_fp32_adamw_clip_matches_the_device_trainer) {
  check_offload_matches_plain<device_linear, float>(
      10, 4, hone::fp32{}, hone::adamw{.weight_decay = 0.1f}, hone::accumulate::by_count{},
      hone::clip_grad_norm{.max_norm = 0.5f}, hone::one_cycle{.max_lr = 0.02, .total_steps = 100});
  check_offload_matches_plain<device_linear_arena, float>(
      10, -1, hone::fp32{}, hone::adamw{}, hone::accumulate::steps<2>{},
      hone::clip_grad_norm{.max_norm = 0.5f}, hone::constant_lr{.base_lr = 0.01});
}

BOOST_AUTO_TEST_CASE(offload_bf16_sgd_and_fp16_adamw_match_the_device_trainer) {
  check_offload_matches_plain<device_linear_arena, hone::bfloat16>(
      10, 6, hone::bf16_mixed{}, hone::sgd{.momentum = 0.9f, .nesterov = true},
      hone::accumulate::steps<2>{}, hone::clip_grad_value{.clip_value = 0.1f},
      hone::constant_lr{.base_lr = 0.05});
  check_offload_matches_plain<device_linear, hone::half>(
      10, 3, hone::fp16_mixed<>{.scaler = {.init_scale = 1024, .growth_interval = 2}},
      hone::adamw{}, hone::accumulate::steps<2>{}, hone::constant_lr{.base_lr = 0.01});
}

// Delayed update (ZeRO-Offload): the CUDA trainer against the host trainer with the same delayed
// offload role (whose recursion test_trainer checks on the CPU), to float tolerance.
BOOST_AUTO_TEST_CASE(offload_delayed_tracks_the_host_trainer) {
  const std::size_t dim = 29;
  linear<float> hm(dim);
  device_linear<float> dm(dim);
  const hone::offload::optimizer_to_host off{.bucket_bytes = 64, .delayed_update = true};
  hone::trainer ht(hm, hone::adamw{}, hone::constant_lr{.base_lr = 0.01}, off);
  hone::trainer dt(dm, hone::adamw{}, hone::constant_lr{.base_lr = 0.01}, off);
  for (int s = 0; s < 8; ++s) {
    const batch b = make_batch(12, dim, static_cast<unsigned>(90 + s));
    const auto rh = ht.step(b);
    const auto rd = dt.step(b);
    BOOST_TEST(rd.loss == rh.loss, boost::test_tools::tolerance(1e-4f));
    BOOST_TEST(rd.step == rh.step);
    BOOST_TEST(dt.offload_engine().pending());
  }
  ht.flush();
  dt.flush();
  BOOST_TEST(!dt.offload_engine().pending());
  const auto w = download(dm.weights(), dim);
  for (std::size_t i = 0; i < dim; ++i) {
    BOOST_TEST(w[i] == hm.w[i], boost::test_tools::tolerance(1e-4f));
  }
}

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

// The gradient reduction role on the device: the reduced gradients feed the norm, the clipping
// coefficient, the inf check (an inf injected at step 4) and the update, as on the host.
BOOST_AUTO_TEST_CASE(fp16_gradient_reduction_with_l2_clipping_and_an_injected_inf) {
  check_parity<hone::half>(
      12, 4, hone::fp16_mixed<>{.scaler = {.init_scale = 1024, .growth_interval = 2}},
      hone::adamw{}, hone::accumulate::steps<2>{}, hone::clip_grad_norm{.max_norm = 0.3f},
      halve_gradients{}, hone::constant_lr{.base_lr = 0.01});
}

#if defined(HONE_WITH_NCCL)
// hone::dist::nccl_data_parallel over a one-rank nccl_comm (one GPU is what a test machine has):
// the reduced gradients are the rank's own (sum and average over one rank are exact), so the CUDA
// trainer with the policy takes the same steps bit for bit as without it: the events that order
// the NCCL stream between the trainer's stream, the buckets (tiny here, so the 30 gradients are cut
// into 5 slices) and the host waits all run. Step 4 carries an inf: both skip it.
BOOST_AUTO_TEST_CASE(nccl_data_parallel_over_one_rank_is_the_local_step) {
  using namespace std::chrono_literals;
  cudaStream_t nccl_stream = nullptr;
  HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&nccl_stream, cudaStreamNonBlocking));
  {
    hone::dist::nccl_comm comm(hone::dist::nccl_unique_id::create(), 0, 1, nccl_stream, 20s);
    const std::size_t dim = 29;
    device_linear<hone::half> am(dim), bm(dim);
    const auto scaler = hone::fp16_mixed<>{.scaler = {.init_scale = 1024, .growth_interval = 2}};
    const hone::dist::nccl_data_parallel dp(
        comm, {.bucket_bytes = 32, .first_bucket_bytes = 8, .average = true});
    BOOST_TEST(dp.buckets(dim + 1).size() == 5u);
    // The 16-bit wire is host-only: refused with a sentence.
    BOOST_CHECK_THROW(hone::dist::nccl_data_parallel(comm, {.wire = hone::wire_format::bf16}),
                      hone::config_error);
    hone::trainer at(am, scaler, hone::adamw{}, hone::accumulate::steps<2>{},
                     hone::clip_grad_norm{.max_norm = 0.3f}, dp,
                     hone::constant_lr{.base_lr = 0.01});
    hone::trainer bt(bm, scaler, hone::adamw{}, hone::accumulate::steps<2>{},
                     hone::clip_grad_norm{.max_norm = 0.3f}, hone::constant_lr{.base_lr = 0.01});
    const std::size_t total = at.layout().total();
    for (int s = 0; s < 8; ++s) {
      const std::vector<batch> parts{make_batch(6, dim, static_cast<unsigned>(70 + 2 * s)),
                                     make_batch(10, dim, static_cast<unsigned>(71 + 2 * s))};
      am.nan_in_grad = bm.nan_in_grad = s == 4 ? std::numeric_limits<float>::infinity() : 0.0f;
      const auto ra = at.step(std::span<const batch>(parts));
      const auto rb = bt.step(std::span<const batch>(parts));
      BOOST_TEST_CONTEXT("step " << s) {
        BOOST_TEST(ra.skipped == rb.skipped);
        BOOST_TEST(ra.skipped == (s == 4));
        BOOST_TEST(ra.loss == rb.loss);
        BOOST_TEST(ra.loss_scale == rb.loss_scale);
        if (!ra.skipped) BOOST_TEST(ra.grad_norm == rb.grad_norm);
        BOOST_TEST(same_bits(download(at.master_weights().data(), total),
                             download(bt.master_weights().data(), total)));
        BOOST_TEST(same_bits(download(am.w.data(), dim), download(bm.w.data(), dim)));
      }
    }
    BOOST_TEST(!comm.failed());
  }
  HONE_CUDA_CHECK(cudaStreamDestroy(nccl_stream));
}
#endif
