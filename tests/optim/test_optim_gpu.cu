// GPU tests (label gpu): every CUDA optimizer and clipping kernel against the host path running the
// same functors on the same random data, the in-kernel skip when found_inf is set (state and
// parameters bit-identical to before), and a whole step with no host synchronization (device
// clip coefficient and found_inf consumed by the optimizer kernels). Exits 77 (skipped) when no
// CUDA device is present.
#define BOOST_TEST_MODULE hone_optim_gpu
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <hone/core/arena.hpp>
#include <hone/core/bfloat16.hpp>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/math_mode.cuh>
#include <hone/optim/cuda/adamw.cuh>
#include <hone/optim/cuda/adamw_8bit.cuh>
#include <hone/optim/cuda/clipping.cuh>
#include <hone/optim/cuda/sgd.cuh>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../support/gpu.hpp"

namespace {
struct gpu_fixture {
  gpu_fixture() {
    hone::test::skip_without_gpu();
    hone::require_ieee_device_math(
        "tests/optim/test_optim_gpu.cu");  // it compares device and host bits
  }
};

using hone::cuda_space;

hone::arena_layout test_layout() {
  hone::arena_layout layout(sizeof(float));
  layout.add("embed.weight", 300001);  // several 64 Ki chunks of the multi-tensor apply
  layout.add("block.0.norm.weight", 33);
  layout.add("block.0.attn.bias", 7);
  layout.add("block.0.mlp.weight", 4099);
  layout.add("head.weight", 70000);
  layout.add("head.bias", 1);
  return layout;
}

std::vector<hone::param_group> test_groups(const hone::arena_layout& layout) {
  return hone::make_param_groups(
      layout, {{hone::is_no_decay_name, 0.5f, 0.0f},
               {[](std::string_view n) { return n.starts_with("head."); }, 2.0f, 0.05f}});
}

template <class T>
void fill_normal(std::span<T> x, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> d(0.0f, stddev);
  for (auto& v : x) v = T(d(rng));
}

template <class T>
hone::arena<T, cuda_space> to_device(const hone::arena<T>& h) {
  hone::arena<T, cuda_space> d(h.layout());
  HONE_CUDA_CHECK(
      cudaMemcpy(d.all().data(), h.all().data(), h.all().size_bytes(), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
std::vector<T> to_host(const hone::arena<T, cuda_space>& d) {
  std::vector<T> h(d.all().size());
  HONE_CUDA_CHECK(
      cudaMemcpy(h.data(), d.all().data(), d.all().size_bytes(), cudaMemcpyDeviceToHost));
  return h;
}

template <class T>
std::vector<T> to_vector(const hone::arena<T>& h) {
  return {h.all().begin(), h.all().end()};
}

/// Within a few ulps (paths whose reductions run in a different order on the device).
void check_close(const std::string& what, const std::vector<float>& got,
                 const std::vector<float>& ref, double rtol = 2e-5, double atol_rel = 1e-6) {
  BOOST_REQUIRE_EQUAL(got.size(), ref.size());
  double scale = 0.0;
  for (float r : ref) scale = std::max(scale, std::fabs(static_cast<double>(r)));
  std::size_t bad = 0, worst_i = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double tol = rtol * std::fabs(static_cast<double>(ref[i])) + atol_rel * scale + 1e-30;
    if (err > tol) ++bad;
    if (err / tol > worst) {
      worst = err / tol;
      worst_i = i;
    }
  }
  BOOST_TEST(bad == 0u, what << ": " << bad << " of " << ref.size() << " out of tolerance; worst "
                             << got[worst_i] << " vs " << ref[worst_i] << " at " << worst_i);
}

/// Bit for bit: the AdamW and SGD updates never fuse a product into an FMA on either side
/// (hone/optim/detail/simd.hpp, "no contraction") and use IEEE sqrt and division, so the device
/// must reproduce the host's bits. Reports the first difference.
void check_same(const std::string& what, const std::vector<float>& got,
                const std::vector<float>& ref) {
  BOOST_REQUIRE_EQUAL(got.size(), ref.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (std::memcmp(&got[i], &ref[i], sizeof(float)) != 0 && bad++ == 0) first = i;
  }
  BOOST_TEST(bad == 0u, what << ": " << bad << " of " << ref.size()
                             << " elements differ from the host's bits; first at " << first << ": "
                             << got[first] << " vs " << ref[first]);
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// A device int initialized to `value`.
hone::buffer<int, cuda_space> device_flag(int value) {
  hone::buffer<int, cuda_space> f(1);
  HONE_CUDA_CHECK(cudaMemcpy(f.data(), &value, sizeof(int), cudaMemcpyHostToDevice));
  return f;
}
template <class T>
T read_device(const T* p) {
  T v{};
  HONE_CUDA_CHECK(cudaMemcpy(&v, p, sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

float lr_at(std::uint64_t t) {
  return 1e-2f * (1.0f - 0.1f * static_cast<float>(t));
}
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(gpu_fixture);

// ---- parity with the host
// ---------------------------------------------------------------------------

template <class G>
void adamw_parity(const hone::adamw& opt) {
  const auto layout = test_layout();
  const auto groups = test_groups(layout);
  std::mt19937 rng(31);
  hone::arena<float> hp(layout);
  hone::arena<G> hg(layout);
  fill_normal(hp.all(), rng);
  auto dp = to_device(hp);
  hone::adamw_state<> hs(opt, layout);
  hone::adamw_state<cuda_space> ds(opt, layout);
  for (std::uint64_t t = 1; t <= 4; ++t) {
    fill_normal(hg.all(), rng, 0.1f * static_cast<float>(t));
    auto dg = to_device(hg);
    const std::optional<float> beta1 = t == 3 ? std::optional<float>(0.85f) : std::nullopt;
    const hone::optimizer_step_args args{
        .step = t, .lr = lr_at(t), .grad_scale = 0.25f, .momentum = beta1};
    hs.step(opt, args, hp.all().data(), static_cast<const G*>(hg.all().data()), groups);
    hone::step(hone::cuda_exec{}, ds, opt, args, dp.all().data(),
               static_cast<const G*>(dg.all().data()), groups);
  }
  HONE_CUDA_CHECK(cudaDeviceSynchronize());
  check_same("param", to_host(dp), to_vector(hp));
  check_same("exp_avg", to_host(ds.exp_avg()), to_vector(hs.exp_avg()));
  check_same("exp_avg_sq", to_host(ds.exp_avg_sq()), to_vector(hs.exp_avg_sq()));
  if (opt.amsgrad) {
    check_same("max_exp_avg_sq", to_host(ds.max_exp_avg_sq()), to_vector(hs.max_exp_avg_sq()));
  }
}

BOOST_AUTO_TEST_CASE(adamw_cuda_matches_host) {
  adamw_parity<float>(hone::adamw{});
}
BOOST_AUTO_TEST_CASE(adamw_bf16_grad_cuda_matches_host) {
  adamw_parity<hone::bfloat16>(hone::adamw{.weight_decay = 0.1f});
}
BOOST_AUTO_TEST_CASE(adamw_amsgrad_cuda_matches_host) {
  adamw_parity<float>(hone::adamw{.beta2 = 0.99f, .amsgrad = true});
}

BOOST_AUTO_TEST_CASE(sgd_cuda_matches_host) {
  const hone::sgd policies[] = {{},
                                {.weight_decay = 1e-2f},
                                {.momentum = 0.9f, .dampening = 0.1f, .weight_decay = 1e-3f},
                                {.momentum = 0.9f, .nesterov = true, .weight_decay = 1e-2f}};
  for (const auto& opt : policies) {
    const auto layout = test_layout();
    const auto groups = test_groups(layout);
    std::mt19937 rng(41);
    hone::arena<float> hp(layout), hg(layout);
    fill_normal(hp.all(), rng);
    auto dp = to_device(hp);
    hone::sgd_state<> hs(opt, layout);
    hone::sgd_state<cuda_space> ds(opt, layout);
    for (std::uint64_t t = 1; t <= 4; ++t) {
      fill_normal(hg.all(), rng);
      auto dg = to_device(hg);
      const hone::optimizer_step_args args{.step = t, .lr = lr_at(t), .grad_scale = 0.5f};
      hs.step(opt, args, hp.all().data(), static_cast<const float*>(hg.all().data()), groups);
      hone::step(hone::cuda_exec{}, ds, opt, args, dp.all().data(),
                 static_cast<const float*>(dg.all().data()), groups);
    }
    HONE_CUDA_CHECK(cudaDeviceSynchronize());
    check_same("param", to_host(dp), to_vector(hp));
    if (hs.has_momentum()) {
      check_same("momentum_buffer", to_host(ds.momentum_buffer()), to_vector(hs.momentum_buffer()));
    }
  }
}

BOOST_AUTO_TEST_CASE(adamw_8bit_cuda_matches_host) {
  for (std::size_t block : {std::size_t{256}, std::size_t{64}, std::size_t{2048}}) {
    BOOST_TEST_CONTEXT("block " << block) {
      const auto layout = test_layout();
      const auto groups = test_groups(layout);
      const hone::adamw_8bit opt{.block = block};
      std::mt19937 rng(51);
      hone::arena<float> hp(layout), hg(layout);
      fill_normal(hp.all(), rng);
      auto dp = to_device(hp);
      hone::adamw_8bit_state<> hs(opt, layout);
      hone::adamw_8bit_state<cuda_space> ds(opt, layout);
      for (std::uint64_t t = 1; t <= 3; ++t) {
        fill_normal(hg.all(), rng, 0.01f);
        auto dg = to_device(hg);
        const hone::optimizer_step_args args{.step = t, .lr = lr_at(t)};
        hs.step(opt, args, hp.all().data(), static_cast<const float*>(hg.all().data()), groups);
        hone::step(hone::cuda_exec{}, ds, opt, args, dp.all().data(),
                   static_cast<const float*>(dg.all().data()), groups);
      }
      HONE_CUDA_CHECK(cudaDeviceSynchronize());
      // FMA contraction on the device can move a moment across a code boundary; the next step then
      // decodes one code apart (0.7% of the block's absmax), hence the looser tolerances.
      check_close("param", to_host(dp), to_vector(hp), 1e-4, 1e-4);
      check_close("fp32 exp_avg", to_host(ds.exp_avg()), to_vector(hs.exp_avg()));
      check_close("absmax", to_host(ds.exp_avg_absmax()), to_vector(hs.exp_avg_absmax()), 1e-3);
      // Codes: a value within rounding of a decision boundary may land one code apart.
      const auto dc = to_host(ds.exp_avg_codes());
      const auto hc = to_vector(hs.exp_avg_codes());
      std::size_t off_by_one = 0, worse = 0;
      for (std::size_t i = 0; i < dc.size(); ++i) {
        const int d = std::abs(static_cast<int>(dc[i]) - static_cast<int>(hc[i]));
        off_by_one += d == 1;
        worse += d > 1;
      }
      BOOST_TEST(worse == 0u);
      BOOST_TEST(off_by_one <= dc.size() / 100 + 1);
    }
  }
}

// ---- the in-kernel skip
// --------------------------------------------------------------------------------

namespace {
template <class State, class Policy>
void check_skip(const Policy& opt) {
  const auto layout = test_layout();
  std::mt19937 rng(61);
  hone::arena<float> hp(layout), hg(layout);
  fill_normal(hp.all(), rng);
  fill_normal(hg.all(), rng);
  auto dp = to_device(hp);
  auto dg = to_device(hg);
  State ds(opt, layout);
  // One applied step so the state is not all zeros.
  hone::step(hone::cuda_exec{}, ds, opt, {.step = 1, .lr = 1e-2f}, dp.all().data(),
             static_cast<const float*>(dg.all().data()));
  HONE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::vector<unsigned char>> before;
  auto snapshot = [&] {
    std::vector<std::vector<unsigned char>> s;
    const auto p = to_host(dp);
    s.emplace_back(reinterpret_cast<const unsigned char*>(p.data()),
                   reinterpret_cast<const unsigned char*>(p.data() + p.size()));
    ds.for_each_tensor([&](std::string_view, const auto& a) {
      const auto h = to_host(a);
      s.emplace_back(reinterpret_cast<const unsigned char*>(h.data()),
                     reinterpret_cast<const unsigned char*>(h.data() + h.size()));
    });
    return s;
  };
  before = snapshot();
  // A NaN gradient, flagged: the step must leave everything as it was.
  hg.view(0)[5] = std::numeric_limits<float>::quiet_NaN();
  auto dbad = to_device(hg);
  auto flag = device_flag(1);
  hone::step(hone::cuda_exec{}, ds, opt, {.step = 2, .lr = 1e-2f}, dp.all().data(),
             static_cast<const float*>(dbad.all().data()), {}, flag.data());
  HONE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto after = snapshot();
  BOOST_REQUIRE_EQUAL(after.size(), before.size());
  for (std::size_t k = 0; k < after.size(); ++k) {
    BOOST_TEST((after[k] == before[k]), "tensor " << k << " changed although found_inf was set");
  }
  // The same call with the flag cleared does update.
  auto clear = device_flag(0);
  hone::step(hone::cuda_exec{}, ds, opt, {.step = 2, .lr = 1e-2f}, dp.all().data(),
             static_cast<const float*>(dg.all().data()), {}, clear.data());
  HONE_CUDA_CHECK(cudaDeviceSynchronize());
  BOOST_TEST(!(snapshot()[0] == before[0]));
}
}  // namespace

BOOST_AUTO_TEST_CASE(found_inf_skips_inside_the_kernels) {
  check_skip<hone::adamw_state<cuda_space>>(hone::adamw{});
  check_skip<hone::adamw_state<cuda_space>>(hone::adamw{.amsgrad = true});
  check_skip<hone::sgd_state<cuda_space>>(hone::sgd{.momentum = 0.9f});
  check_skip<hone::sgd_state<cuda_space>>(hone::sgd{});
  check_skip<hone::adamw_8bit_state<cuda_space>>(hone::adamw_8bit{});
}

// ---- clipping
// ------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(grad_norm_and_check_cuda_matches_host) {
  hone::grad_norm_workspace ws;
  std::mt19937 rng(71);
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{3'000'001}}) {
    hone::arena_layout layout(sizeof(float));
    layout.add("g", n);
    hone::arena<float> hg(layout);
    fill_normal(hg.all(), rng);
    auto dg = to_device(hg);
    hone::buffer<double, cuda_space> sum(1);
    auto flag = device_flag(0);
    hone::grad_norm_and_check(hone::cuda_exec{}, static_cast<const float*>(dg.all().data()),
                              dg.all().size(), 0.5f, ws, sum.data(), flag.data());
    const auto host = hone::grad_norm_and_check(hg.all().data(), hg.all().size(), 0.5f);
    BOOST_TEST(read_device(sum.data()) == host.sum_sq, boost::test_tools::tolerance(1e-12));
    BOOST_TEST(read_device(flag.data()) == 0);
    // Deterministic: the same bits twice.
    hone::buffer<double, cuda_space> sum2(1);
    hone::grad_norm_and_check(hone::cuda_exec{}, static_cast<const float*>(dg.all().data()),
                              dg.all().size(), 0.5f, ws, sum2.data(), flag.data());
    BOOST_TEST(read_device(sum2.data()) == read_device(sum.data()));
    // A NaN sets the flag.
    hg.all()[n / 2] = std::numeric_limits<float>::quiet_NaN();
    auto dbad = to_device(hg);
    hone::grad_norm_and_check(hone::cuda_exec{}, static_cast<const float*>(dbad.all().data()),
                              dbad.all().size(), 0.5f, ws, sum.data(), flag.data());
    BOOST_TEST(read_device(flag.data()) == 1);
  }
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_cuda_matches_host) {
  hone::grad_norm_workspace ws;
  std::mt19937 rng(81);
  hone::arena<float> hg(test_layout());
  fill_normal(hg.all(), rng, 0.01f);
  auto dg = to_device(hg);
  hone::buffer<float, cuda_space> out(2);
  for (float p : {2.0f, 1.0f, std::numeric_limits<float>::infinity()}) {
    for (float max_norm : {0.01f, 1e6f}) {
      const hone::clip_grad_norm clip{.max_norm = max_norm, .norm_type = p};
      hone::clip(hone::cuda_exec{}, clip, static_cast<const float*>(dg.all().data()),
                 dg.all().size(), 0.25f, ws, out.data(), out.data() + 1);
      const auto host = clip.clip(hg, 0.25f);
      BOOST_TEST(read_device(out.data()) == *host.norm, boost::test_tools::tolerance(1e-6f));
      BOOST_TEST(read_device(out.data() + 1) == host.coefficient,
                 boost::test_tools::tolerance(1e-6f));
    }
  }
  BOOST_CHECK_THROW(hone::clip(hone::cuda_exec{}, hone::clip_grad_norm{.norm_type = 3.0f},
                               static_cast<const float*>(dg.all().data()), dg.all().size(), 1.0f,
                               ws, out.data(), out.data() + 1),
                    hone::config_error);
}

BOOST_AUTO_TEST_CASE(clip_grad_value_cuda_matches_host) {
  std::mt19937 rng(91);
  hone::arena<hone::bfloat16> hg(test_layout());
  fill_normal(hg.all(), rng);
  hg.all()[123] = hone::bfloat16(std::numeric_limits<float>::infinity());
  auto dg = to_device(hg);
  auto flag = device_flag(0);
  const hone::clip_grad_value clip{.clip_value = 0.2f};
  hone::clip(hone::cuda_exec{}, clip, dg.all().data(), dg.all().size(), 0.5f, flag.data());
  const auto host = clip.clip(hg, 0.5f);
  BOOST_TEST(host.nonfinite);
  BOOST_TEST(read_device(flag.data()) == 1);
  const auto d = to_host(dg);
  BOOST_TEST(std::memcmp(d.data(), hg.all().data(), hg.all().size_bytes()) == 0);
}

// ---- a whole step without host synchronization
// -----------------------------------------------------

BOOST_AUTO_TEST_CASE(clip_coefficient_and_found_inf_feed_the_step_on_the_device) {
  const auto layout = test_layout();
  std::mt19937 rng(101);
  hone::arena<float> hp(layout), hg(layout);
  fill_normal(hp.all(), rng);
  fill_normal(hg.all(), rng, 100.0f);  // scaled gradients, clipped below
  auto dp = to_device(hp);
  auto dg = to_device(hg);
  hone::grad_norm_workspace ws;
  hone::buffer<float, cuda_space> norm_coef(2);
  auto flag = device_flag(0);
  const hone::clip_grad_norm clip{.max_norm = 1.0f};
  const float unscale = 1.0f / 64.0f;
  const hone::adamw opt;
  hone::adamw_state<cuda_space> ds(opt, layout);
  hone::cuda_exec exec{};
  hone::clip(exec, clip, static_cast<const float*>(dg.all().data()), dg.all().size(), unscale, ws,
             norm_coef.data(), norm_coef.data() + 1, flag.data());
  hone::step(exec, ds, opt, {.step = 1, .lr = 1e-3f, .grad_scale = unscale}, dp.all().data(),
             static_cast<const float*>(dg.all().data()), {}, flag.data(), norm_coef.data() + 1);
  HONE_CUDA_CHECK(cudaDeviceSynchronize());
  // The host pipeline: measure, fold, step.
  const auto r = clip.clip(hg, unscale);
  BOOST_REQUIRE(!r.nonfinite);
  BOOST_REQUIRE(r.coefficient < 1.0f);
  hone::adamw_state<> hs(opt, layout);
  hs.step(opt, {.step = 1, .lr = 1e-3f, .grad_scale = unscale * r.coefficient}, hp.all().data(),
          static_cast<const float*>(hg.all().data()));
  check_close("param", to_host(dp), to_vector(hp));
  check_close("exp_avg", to_host(ds.exp_avg()), to_vector(hs.exp_avg()), 1e-4);
}
