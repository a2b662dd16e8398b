// Tests of AdamW (hone::adamw, adamw_state): against a double-precision transcription of
// torch.optim.AdamW (plain, AMSGrad, a scheduled beta1) over several steps, six slots and two
// parameter groups; the first step's lr * sign(g); bf16 gradients; the update's bits wherever an
// element sits; the state tensors' names and sizes.
#define BOOST_TEST_MODULE hone_optim_adamw
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <hone/core/arena.hpp>
#include <hone/core/bfloat16.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/detail/simd.hpp>
#include <hone/optim/sgd.hpp>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "optim_check.hpp"

using namespace optim_test;

namespace {
void run_adamw_against_reference(const hone::adamw& opt) {
  const auto layout = test_layout();
  const auto groups = test_groups(layout);
  const auto hyper = slot_hypers(layout, opt.weight_decay);
  std::mt19937 rng(1234);
  hone::arena<float> master(layout), grad(layout);
  for (std::size_t i = 0; i < layout.size(); ++i) fill_normal(master.view(i), rng);
  std::vector<adam_ref> ref(layout.size());
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const std::size_t n = layout[i].count;
    ref[i] = {to_double(master.view(i)), std::vector<double>(n), std::vector<double>(n),
              std::vector<double>(n)};
  }
  hone::adamw_state<> state(opt, layout);
  for (std::uint64_t t = 1; t <= 6; ++t) {
    for (std::size_t i = 0; i < layout.size(); ++i) fill_normal(grad.view(i), rng, 0.1f * t);
    // Step 4 takes a schedule-driven beta1 (OneCycle), the others the policy's.
    const std::optional<float> beta1 = t == 4 ? std::optional<float>(0.85f) : std::nullopt;
    state.step(opt, {.step = t, .lr = lr_at(t), .grad_scale = test_grad_scale, .momentum = beta1},
               master.all().data(), static_cast<const float*>(grad.all().data()), groups);
    for (std::size_t i = 0; i < layout.size(); ++i) {
      adamw_reference(ref[i], grad.view(i), test_grad_scale, lr_at(t) * hyper[i].lr_scale,
                      hyper[i].weight_decay, beta1.value_or(opt.beta1), opt.beta2, opt.eps,
                      opt.amsgrad, t);
    }
  }
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const auto& name = layout[i].name;
    check_close(name + " param", master.view(i), ref[i].p);
    check_close(name + " exp_avg", state.exp_avg().view(i), ref[i].m);
    check_close(name + " exp_avg_sq", state.exp_avg_sq().view(i), ref[i].v);
    if (opt.amsgrad)
      check_close(name + " max_exp_avg_sq", state.max_exp_avg_sq().view(i), ref[i].vmax);
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(adamw_matches_reference) {
  run_adamw_against_reference(hone::adamw{});
}

BOOST_AUTO_TEST_CASE(adamw_amsgrad_matches_reference) {
  run_adamw_against_reference(hone::adamw{.beta2 = 0.99f, .weight_decay = 0.1f, .amsgrad = true});
}

BOOST_AUTO_TEST_CASE(adamw_first_step_moves_by_lr_times_sign) {
  // Step 1 with bias correction: m̂ = g, v̂ = g², so the update is lr * g / (|g| + eps), i.e.
  // lr * sign(g) for |g| >> eps; with decay the parameter is first scaled by 1 - lr * wd.
  hone::arena_layout layout(sizeof(float));
  layout.add("w", 9);
  hone::arena<float> master(layout), grad(layout);
  const float g[9] = {1.0f, -2.0f, 0.5f, -1e-3f, 3e-2f, 100.0f, -7.0f, 0.25f, -0.125f};
  for (int i = 0; i < 9; ++i) {
    master.all()[i] = 0.1f * static_cast<float>(i);
    grad.all()[i] = g[i];
  }
  const float lr = 1e-3f;
  const float wd = 0.1f;
  hone::adamw opt{.weight_decay = wd};
  hone::adamw_state<> st(opt, layout);
  st.step(opt, {.step = 1, .lr = lr}, master.all().data(),
          static_cast<const float*>(grad.all().data()));
  for (int i = 0; i < 9; ++i) {
    const double p0 = 0.1f * static_cast<float>(i);  // the stored initial value
    const double expected =
        p0 * (1.0 - static_cast<double>(lr) * wd) - lr * (g[i] > 0 ? 1.0 : -1.0);
    BOOST_TEST(std::fabs(master.all()[i] - expected) <= 2e-7,
               "element " << i << ": " << master.all()[i] << " vs " << expected);
    BOOST_TEST(st.exp_avg().all()[i] == (1.0f - 0.9f) * g[i]);
  }
}

BOOST_AUTO_TEST_CASE(adamw_bf16_gradients_match_float_gradients_of_the_same_values) {
  const auto layout = test_layout();
  std::mt19937 rng(7);
  hone::arena<float> m1(layout), m2(layout), gf(layout);
  hone::arena<hone::bfloat16> gb(layout);
  for (std::size_t i = 0; i < layout.size(); ++i) fill_normal(m1.view(i), rng);
  std::copy(m1.all().begin(), m1.all().end(), m2.all().begin());
  hone::adamw opt;
  hone::adamw_state<> s1(opt, layout), s2(opt, layout);
  for (std::uint64_t t = 1; t <= 3; ++t) {
    for (std::size_t k = 0; k < gf.all().size(); ++k) {
      gb.all()[k] = hone::bfloat16(std::normal_distribution<float>(0.0f, 1.0f)(rng));
      gf.all()[k] = hone::to_float(gb.all()[k]);
    }
    s1.step(opt, {.step = t, .lr = 1e-3f, .grad_scale = 0.5f}, m1.all().data(),
            static_cast<const float*>(gf.all().data()));
    s2.step(opt, {.step = t, .lr = 1e-3f, .grad_scale = 0.5f}, m2.all().data(),
            static_cast<const hone::bfloat16*>(gb.all().data()));
  }
  BOOST_TEST(std::memcmp(m1.all().data(), m2.all().data(), m1.all().size_bytes()) == 0);
  BOOST_TEST(std::memcmp(s1.exp_avg_sq().all().data(), s2.exp_avg_sq().all().data(),
                         s1.exp_avg_sq().all().size_bytes()) == 0);
}

// The optimizer's products are never fused into an FMA (hone/optim/detail/simd.hpp, "no
// contraction"), so an element gets the same bits in the vector body, in the zero-padded tail, in
// a one-element range (an offload bucket) and through the element functor (the scalar and CUDA
// path), and those bits are the unfused formula's. Built twice: test_optim_adamw with the
// project's flags and test_optim_adamw_native with -march=native, where the compiler may fuse (FMA
// hardware).
namespace unfused {
// Each product is stored to a volatile and read back, so it is rounded on its own.
float mul(float a, float b) {
  volatile float r = a * b;
  return r;
}
void adamw(const hone::adamw_coefficients& c, float& p, float g, float& m, float& v) {
  const float gs = mul(g, c.grad_scale);
  p = mul(p, c.decay);
  m = mul(c.beta1, m) + mul(c.one_minus_beta1, gs);
  v = mul(c.beta2, v) + mul(mul(c.one_minus_beta2, gs), gs);
  const float denom = mul(std::sqrt(v), c.inv_bc2_sqrt) + c.eps;
  p = p - mul(c.step_size, m) / denom;
}
}  // namespace unfused

BOOST_AUTO_TEST_CASE(update_bits_do_not_depend_on_where_an_element_sits) {
  constexpr std::size_t n = 203;  // several vectors and a tail at every SIMD width
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  std::vector<float> p0(n), g(n), m0(n), v0(n);
  for (std::size_t i = 0; i < n; ++i) {
    p0[i] = nd(rng);
    g[i] = 1e-2f * nd(rng);
    m0[i] = 1e-3f * nd(rng);
    v0[i] = 1e-5f * std::abs(nd(rng));
  }
  const auto c = hone::adamw_coefficients::make(0.9f, 0.999f, 1e-8f,
                                                {.step = 3, .grad_scale = 0.5f}, 1e-3f, 0.01f);
  const hone::adamw_functor<float> op{c};
  const auto idx = std::index_sequence<0, 1, 2, 3>{};

  auto whole_p = p0, whole_m = m0, whole_v = v0;  // vector body + tail
  hone::detail::simd_apply_range(
      op, 0, n, std::make_tuple(whole_p.data(), g.data(), whole_m.data(), whole_v.data()), idx);
  auto one_p = p0, one_m = m0, one_v = v0;  // one-element ranges (all tails)
  for (std::size_t i = 0; i < n; ++i) {
    hone::detail::simd_apply_range(
        op, i, i + 1, std::make_tuple(one_p.data(), g.data(), one_m.data(), one_v.data()), idx);
  }
  auto elem_p = p0, elem_m = m0, elem_v = v0;  // the element functor
  auto ref_p = p0, ref_m = m0, ref_v = v0;     // the unfused formula
  for (std::size_t i = 0; i < n; ++i) {
    op(elem_p[i], g[i], elem_m[i], elem_v[i]);
    unfused::adamw(c, ref_p[i], g[i], ref_m[i], ref_v[i]);
  }
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  BOOST_TEST(same(whole_p, ref_p));
  BOOST_TEST(same(whole_m, ref_m));
  BOOST_TEST(same(whole_v, ref_v));
  BOOST_TEST(same(one_p, ref_p));
  BOOST_TEST(same(one_m, ref_m));
  BOOST_TEST(same(one_v, ref_v));
  BOOST_TEST(same(elem_p, ref_p));
  BOOST_TEST(same(elem_m, ref_m));
  BOOST_TEST(same(elem_v, ref_v));
  BOOST_TEST(!same(ref_p, p0));  // the step did something

  // SGD with Nesterov momentum: vector path and element path agree.
  const hone::sgd_momentum_functor<float> sop{.lr = 0.1f,
                                              .weight_decay = 0.01f,
                                              .grad_scale = 0.5f,
                                              .keep = 0.9f,
                                              .take = 1.0f,
                                              .nesterov_grad = 1.0f,
                                              .nesterov_buf = 0.9f};
  auto sp = p0, sb = m0, ep = p0, eb = m0;
  hone::detail::simd_apply_range(sop, 0, n, std::make_tuple(sp.data(), g.data(), sb.data()),
                                 std::index_sequence<0, 1, 2>{});
  for (std::size_t i = 0; i < n; ++i) sop(ep[i], g[i], eb[i]);
  BOOST_TEST(same(sp, ep));
  BOOST_TEST(same(sb, eb));
}

BOOST_AUTO_TEST_CASE(adamw_state_tensors_are_named_and_counted) {
  const auto layout = test_layout();
  hone::adamw_state<> st(hone::adamw{.amsgrad = true}, layout);
  std::vector<std::string> names;
  st.for_each_tensor([&](std::string_view n, const auto& a) {
    names.emplace_back(n);
    BOOST_TEST(a.layout().total() == layout.total());
  });
  BOOST_TEST(names == (std::vector<std::string>{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}),
             boost::test_tools::per_element());
  BOOST_TEST(st.bytes() == 3 * layout.total() * sizeof(float));
}
