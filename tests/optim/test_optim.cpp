// Tests of the optimizers (SGD, AdamW, 8-bit AdamW), parameter groups, quantization and gradient
// clipping. Every optimizer is checked against a scalar reference written here in double
// precision from PyTorch's documented algorithms (torch.optim.SGD / AdamW,
// torch.nn.utils.clip_grad_norm_ / clip_grad_value_), over several steps of random data, several
// slots and parameter groups with their own learning-rate scale and weight decay.
#define BOOST_TEST_MODULE hone_optim
#include <boost/test/unit_test.hpp>

#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <hone/core/arena.hpp>
#include <hone/core/bfloat16.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/adamw_8bit.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/optim/detail/simd.hpp>
#include <hone/optim/param_group.hpp>
#include <hone/optim/quantization.hpp>
#include <hone/optim/sgd.hpp>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

// ---- test problems ------------------------------------------------------------------------------

/// Slots of mixed sizes: one crossing the 64 Ki chunk grain, tails that are not multiples of any
/// vector width, biases and norms (no-decay names), and a head with its own learning rate.
hone::arena_layout test_layout() {
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
std::vector<hone::param_group> test_groups(const hone::arena_layout& layout) {
  return hone::make_param_groups(
      layout, {{hone::is_no_decay_name, 0.5f, 0.0f},
               {[](std::string_view n) { return n.starts_with("head."); }, 2.0f, 0.05f}});
}

struct slot_hyper {
  double lr_scale;
  double weight_decay;
};

/// Per slot: (lr_scale, weight decay) implied by test_groups for a policy decay `policy_wd`.
std::vector<slot_hyper> slot_hypers(const hone::arena_layout& layout, double policy_wd) {
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

void fill_normal(std::span<float> x, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> d(0.0f, stddev);
  for (auto& v : x) v = d(rng);
}

std::vector<double> to_double(std::span<const float> x) {
  return {x.begin(), x.end()};
}

/// |got - ref| <= rtol * |ref| + atol_rel * max|ref| for every element.
void check_close(const std::string& what, std::span<const float> got,
                 const std::vector<double>& ref, double rtol = 1e-5, double atol_rel = 1e-6) {
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
void adamw_reference(adam_ref& s, std::span<const float> grad, double grad_scale, double lr,
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
void sgd_reference(sgd_ref& s, std::span<const float> grad, double grad_scale, double lr, double wd,
                   double momentum, double dampening, bool nesterov, bool first) {
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
float lr_at(std::uint64_t t) {
  return 1e-2f * (1.0f - 0.1f * static_cast<float>(t));
}
constexpr float test_grad_scale = 0.25f;

}  // namespace

// ---- policies and roles
// ---------------------------------------------------------------------------

static_assert(hone::plays_role_v<hone::adamw, hone::roles::optimizer>);
static_assert(hone::plays_role_v<hone::sgd, hone::roles::optimizer>);
static_assert(hone::plays_role_v<hone::adamw_8bit, hone::roles::optimizer>);
static_assert(hone::optimizer_policy<hone::adamw>);
static_assert(hone::optimizer_policy<hone::sgd>);
static_assert(hone::optimizer_policy<hone::adamw_8bit>);
static_assert(hone::clipping_policy<hone::clip_grad_norm>);
static_assert(hone::clipping_policy<hone::clip_grad_value>);
static_assert(hone::clipping_policy<hone::no_clipping>);
static_assert(!hone::optimizer_policy<hone::clip_grad_norm>);
static_assert(std::is_same_v<hone::optimizer_state_t<hone::adamw>, hone::adamw_state<>>);
static_assert(std::is_trivially_copyable_v<hone::adamw_functor<hone::bfloat16>>);
static_assert(std::is_trivially_copyable_v<hone::sgd_momentum_functor<float>>);

BOOST_AUTO_TEST_CASE(policy_defaults_are_pytorchs) {
  const hone::adamw a;
  BOOST_TEST(a.beta1 == 0.9f);
  BOOST_TEST(a.beta2 == 0.999f);
  BOOST_TEST(a.eps == 1e-8f);
  BOOST_TEST(a.weight_decay == 1e-2f);
  BOOST_TEST(!a.amsgrad);
  const hone::sgd s;
  BOOST_TEST(s.momentum == 0.0f);
  BOOST_TEST(s.dampening == 0.0f);
  BOOST_TEST(!s.nesterov);
  BOOST_TEST(s.weight_decay == 0.0f);
  const hone::adamw_8bit q;
  BOOST_TEST(q.block == 256u);
  BOOST_TEST(q.min_8bit_size == 4096u);
  const hone::clip_grad_norm c;
  BOOST_TEST(c.max_norm == 1.0f);
  BOOST_TEST(c.norm_type == 2.0f);
}

// ---- parameter groups ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(param_groups_from_names) {
  const auto layout = test_layout();
  BOOST_TEST(hone::is_no_decay_name("head.bias"));
  BOOST_TEST(hone::is_no_decay_name("encoder.LayerNorm.weight"));
  BOOST_TEST(hone::is_no_decay_name("blocks.3.rmsnorm.scale"));
  BOOST_TEST(!hone::is_no_decay_name("ln_f.weight"));
  BOOST_TEST(!hone::is_no_decay_name("bias_proj.weight"));

  const auto nd = hone::no_decay_groups(layout);
  BOOST_REQUIRE_EQUAL(nd.size(), 1u);
  BOOST_TEST(nd[0].slots == (std::vector<std::size_t>{1, 2, 5}), boost::test_tools::per_element());
  BOOST_TEST(nd[0].weight_decay.value() == 0.0f);

  const auto g = test_groups(layout);
  BOOST_REQUIRE_EQUAL(g.size(), 2u);
  BOOST_TEST(g[0].slots == (std::vector<std::size_t>{1, 2, 5}), boost::test_tools::per_element());
  BOOST_TEST(g[1].slots == (std::vector<std::size_t>{4}), boost::test_tools::per_element());
  BOOST_TEST(g[1].lr_scale == 2.0f);

  // Bad groups are configuration errors with the slot named.
  hone::arena<float> master(layout), grad(layout);
  hone::adamw opt;
  hone::adamw_state<> st(opt, layout);
  const hone::optimizer_step_args args{.step = 1, .lr = 1e-3f};
  std::vector<hone::param_group> twice{{{0}}, {{0, 1}}};
  BOOST_CHECK_THROW(st.step(opt, args, master.all().data(), grad.all().data(), twice),
                    hone::config_error);
  std::vector<hone::param_group> missing{{{99}}};
  BOOST_CHECK_THROW(st.step(opt, args, master.all().data(), grad.all().data(), missing),
                    hone::config_error);
  std::vector<hone::param_group> negative{{{0}, -1.0f}};
  BOOST_CHECK_THROW(st.step(opt, args, master.all().data(), grad.all().data(), negative),
                    hone::config_error);
  BOOST_CHECK_THROW(hone::make_param_groups(layout, {hone::param_group_rule{}}),
                    hone::config_error);
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_config_errors) {
  const auto layout = test_layout();
  hone::arena<float> master(layout), grad(layout);
  float* p = master.all().data();
  const float* g = grad.all().data();
  hone::adamw opt;
  hone::adamw_state<> st(opt, layout);
  BOOST_CHECK_THROW(st.step(opt, {.step = 0, .lr = 1e-3f}, p, g), hone::config_error);
  BOOST_CHECK_THROW(st.step(opt, {.step = 1, .lr = -1.0f}, p, g), hone::config_error);
  BOOST_CHECK_THROW(
      st.step(opt, {.step = 1, .lr = 1e-3f, .grad_scale = std::numeric_limits<float>::infinity()},
              p, g),
      hone::config_error);
  BOOST_CHECK_THROW(st.step(hone::adamw{.amsgrad = true}, {.step = 1, .lr = 1e-3f}, p, g),
                    hone::config_error);
  BOOST_CHECK_THROW((void)st.max_exp_avg_sq(), hone::config_error);
  BOOST_CHECK_THROW((hone::adamw_state<>(hone::adamw{.beta1 = 1.0f}, layout)), hone::config_error);
  BOOST_CHECK_THROW((hone::sgd_state<>(hone::sgd{.nesterov = true}, layout)), hone::config_error);
  BOOST_CHECK_THROW(
      (hone::sgd_state<>(hone::sgd{.momentum = 0.9f, .dampening = 0.1f, .nesterov = true}, layout)),
      hone::config_error);
  hone::sgd plain;
  hone::sgd_state<> ss(plain, layout);
  BOOST_CHECK_THROW(ss.step(plain, {.step = 1, .lr = 1e-3f, .momentum = 0.9f}, p, g),
                    hone::config_error);
  BOOST_CHECK_THROW((hone::adamw_8bit_state<>(hone::adamw_8bit{.block = 100}, layout)),
                    hone::config_error);
}

// ---- AdamW --------------------------------------------------------------------------------------

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
// path), and those bits are the unfused formula's. Built twice: test_optim with the project's
// flags and test_optim_native with -march=native, where the compiler may fuse (FMA hardware).
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

// ---- SGD ----------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(sgd_matches_reference) {
  const hone::sgd policies[] = {
      {},                                                            // plain
      {.weight_decay = 1e-2f},                                       // plain + L2
      {.momentum = 0.9f},                                            // heavy ball
      {.momentum = 0.9f, .dampening = 0.1f, .weight_decay = 1e-3f},  // dampening
      {.momentum = 0.9f, .nesterov = true, .weight_decay = 1e-2f},   // Nesterov
  };
  for (const auto& opt : policies) {
    BOOST_TEST_CONTEXT("momentum " << opt.momentum << " dampening " << opt.dampening << " nesterov "
                                   << opt.nesterov << " wd " << opt.weight_decay) {
      const auto layout = test_layout();
      const auto groups = test_groups(layout);
      const auto hyper = slot_hypers(layout, opt.weight_decay);
      std::mt19937 rng(99);
      hone::arena<float> master(layout), grad(layout);
      for (std::size_t i = 0; i < layout.size(); ++i) fill_normal(master.view(i), rng);
      std::vector<sgd_ref> ref(layout.size());
      for (std::size_t i = 0; i < layout.size(); ++i) {
        ref[i] = {to_double(master.view(i)), std::vector<double>(layout[i].count)};
      }
      hone::sgd_state<> state(opt, layout);
      BOOST_TEST(state.has_momentum() == (opt.momentum != 0.0f));
      for (std::uint64_t t = 1; t <= 5; ++t) {
        for (std::size_t i = 0; i < layout.size(); ++i) fill_normal(grad.view(i), rng);
        // Step 3 takes a schedule-driven momentum when the policy has momentum.
        std::optional<float> mu;
        if (opt.momentum != 0.0f && t == 3) mu = 0.85f;
        state.step(opt, {.step = t, .lr = lr_at(t), .grad_scale = test_grad_scale, .momentum = mu},
                   master.all().data(), static_cast<const float*>(grad.all().data()), groups);
        for (std::size_t i = 0; i < layout.size(); ++i) {
          sgd_reference(ref[i], grad.view(i), test_grad_scale, lr_at(t) * hyper[i].lr_scale,
                        hyper[i].weight_decay, mu.value_or(opt.momentum), opt.dampening,
                        opt.nesterov, t == 1);
        }
      }
      for (std::size_t i = 0; i < layout.size(); ++i) {
        check_close(layout[i].name + " param", master.view(i), ref[i].p);
        if (state.has_momentum()) {
          check_close(layout[i].name + " momentum_buffer", state.momentum_buffer().view(i),
                      ref[i].buf);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(sgd_first_step_initializes_the_buffer_with_the_gradient) {
  hone::arena_layout layout(sizeof(float));
  layout.add("w", 21);
  hone::arena<float> master(layout), grad(layout);
  std::mt19937 rng(3);
  fill_normal(grad.all(), rng);
  hone::sgd opt{.momentum = 0.9f, .dampening = 0.5f};
  hone::sgd_state<> st(opt, layout);
  st.step(opt, {.step = 1, .lr = 0.1f}, master.all().data(),
          static_cast<const float*>(grad.all().data()));
  // PyTorch: buf = clone(grad) on the first step, no dampening.
  BOOST_TEST(
      std::memcmp(st.momentum_buffer().all().data(), grad.all().data(), 21 * sizeof(float)) == 0);
  for (std::size_t i = 0; i < 21; ++i) {
    BOOST_TEST(master.all()[i] == -0.1f * grad.all()[i]);
  }
}

// ---- quantization -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(dynamic_maps_match_bitsandbytes) {
  const auto& s = hone::dynamic_map(true).values;
  const auto& u = hone::dynamic_map(false).values;
  BOOST_TEST(std::is_sorted(s.begin(), s.end()));
  BOOST_TEST(std::is_sorted(u.begin(), u.end()));
  BOOST_TEST(std::adjacent_find(s.begin(), s.end()) == s.end());  // 256 distinct values
  BOOST_TEST(std::adjacent_find(u.begin(), u.end()) == u.end());
  // Known entries of bitsandbytes' create_dynamic_map (float32).
  BOOST_TEST(s[255] == 1.0f);
  BOOST_TEST(s[127] == 0.0f);
  BOOST_TEST(s[128] == 5.5e-7f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(s[254] == 0.99296875f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(s[0] == -0.99296875f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(u[0] == 0.0f);
  BOOST_TEST(u[1] == 3.25e-7f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(u[254] == 0.996484375f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(u[255] == 1.0f);
  // Entries per decade [0.1, 1) * 10^-k: signed 64, 32, ..., 1 positives; unsigned 128, ..., 2.
  for (int k = 0; k < 7; ++k) {
    const float hi = std::pow(10.0f, static_cast<float>(-k));
    const float lo = hi / 10.0f;
    const auto count = [&](const std::array<float, 256>& m) {
      return std::count_if(m.begin(), m.end(), [&](float x) { return x >= lo && x < hi; });
    };
    BOOST_TEST(count(s) == (64 >> k), "signed decade " << k);
    BOOST_TEST(count(u) == (128 >> k), "unsigned decade " << k);
  }
}

// The direct index (adamw_8bit's encoder) against the binary search, bit for bit: every 512th
// float bit pattern (both signs, subnormals, infinities, NaN), both ends of every bucket and
// their neighbours, and every entry, midpoint and their neighbours; keep_sign too.
BOOST_AUTO_TEST_CASE(quantization_index_matches_the_binary_search) {
  for (bool is_signed : {true, false}) {
    const auto& idx = hone::dynamic_map_index(is_signed);
    BOOST_TEST_REQUIRE(idx.usable(), "a bucket of the dynamic map holds two entries");
    const float* map = idx.map();
    std::size_t checked = 0, bad = 0;
    auto check = [&](std::uint32_t bits) {
      float x;
      std::memcpy(&x, &bits, sizeof x);
      ++checked;
      const auto a = idx.nearest(x);
      const auto b = hone::quantize_nearest(map, x);
      if (a != b) {
        if (bad++ < 5) BOOST_TEST_MESSAGE("x " << x << " index " << int(a) << " search " << int(b));
      }
      for (float value : {x, -x, 1.0f, -1.0f}) {
        if (idx.nearest_keep_sign(x, value) != hone::quantize_keep_sign(map, x, value)) ++bad;
      }
    };
    for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); b += 512) {
      check(static_cast<std::uint32_t>(b) | 0x5au);
    }
    for (std::uint64_t k = 0; k < hone::quantization_index::buckets; ++k) {
      const auto first = static_cast<std::uint32_t>(k << hone::quantization_index::key_shift);
      const std::uint32_t last = first | ((1u << hone::quantization_index::key_shift) - 1u);
      for (std::uint32_t d = 0; d < 3; ++d) {
        check(first + d);
        check(last - d);
      }
    }
    auto around = [&](float v) {
      std::uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      for (std::uint32_t d = 0; d < 5; ++d) {
        check(bits + d);
        check(bits - d);
      }
    };
    for (int j = 0; j < 256; ++j) {
      around(map[j]);
      if (j < 255) around((map[j] + map[j + 1]) / 2.0f);
    }
    BOOST_TEST(bad == 0u,
               bad << " of " << checked << " values differ (signed " << is_signed << ")");
  }
}

BOOST_AUTO_TEST_CASE(quantize_nearest_is_the_nearest_entry) {
  std::mt19937 rng(5);
  for (bool sgn : {true, false}) {
    const auto& map = hone::dynamic_map(sgn).values;
    std::uniform_real_distribution<float> uni(sgn ? -1.1f : -0.1f, 1.1f);
    std::vector<float> xs;
    for (int i = 0; i < 20000; ++i) xs.push_back(uni(rng));
    for (int i = 0; i < 20000; ++i)  // small magnitudes across the decades
      xs.push_back((sgn && (i & 1) ? -1.0f : 1.0f) *
                   std::pow(10.0f, std::uniform_real_distribution<float>(-8.0f, 0.0f)(rng)));
    for (float x : map) xs.push_back(x);
    for (float x : xs) {
      int best = 0;
      for (int c = 1; c < 256; ++c) {
        if (std::fabs(map[c] - x) < std::fabs(map[best] - x)) best = c;
      }
      const int got = hone::quantize_nearest(map.data(), x);
      BOOST_REQUIRE_MESSAGE(std::fabs(map[got] - x) == std::fabs(map[best] - x),
                            "x = " << x << ": code " << got << " (" << map[got] << ") vs " << best
                                   << " (" << map[best] << ")");
    }
  }
}

BOOST_AUTO_TEST_CASE(blockwise_round_trip_error_is_bounded) {
  std::mt19937 rng(11);
  const std::size_t n = 256 * 37 + 101;  // a partial last block
  std::vector<float> x(n);
  // Magnitudes spread over 10 orders, random signs, plus exact zeros.
  std::uniform_real_distribution<float> e(-8.0f, 2.0f);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = (i % 97 == 0) ? 0.0f : ((i & 1) ? -1.0f : 1.0f) * std::pow(10.0f, e(rng));
  }
  for (bool sgn : {true, false}) {
    std::vector<float> in = x;
    if (!sgn) {
      for (auto& v : in) v = std::fabs(v);
    }
    const auto& map = hone::dynamic_map(sgn);
    double half_gap = 0.0;
    for (int c = 0; c + 1 < 256; ++c)
      half_gap = std::max(half_gap, 0.5 * (map.values[c + 1] - map.values[c]));
    BOOST_TEST(half_gap < (sgn ? 0.00704 : 0.00352));
    const std::size_t blocks = (n + 255) / 256;
    std::vector<std::uint8_t> codes(n);
    std::vector<float> absmax(blocks), out(n);
    hone::quantize_blockwise(in.data(), n, 256, map, codes.data(), absmax.data());
    hone::dequantize_blockwise(codes.data(), absmax.data(), n, 256, map, out.data());
    for (std::size_t b = 0; b < blocks; ++b) {
      float amax = 0.0f;
      for (std::size_t i = b * 256; i < std::min(n, b * 256 + 256); ++i)
        amax = std::max(amax, std::fabs(in[i]));
      BOOST_REQUIRE_EQUAL(absmax[b], amax);
    }
    for (std::size_t i = 0; i < n; ++i) {
      const double a = absmax[i / 256];
      BOOST_REQUIRE_MESSAGE(std::fabs(out[i] - in[i]) <= (half_gap + 1e-6) * a + 1e-30,
                            "element " << i << ": " << in[i] << " -> " << out[i]);
      if (in[i] == 0.0f) BOOST_REQUIRE_EQUAL(out[i], 0.0f);
      // The block maximum is exact, except -absmax: the signed map's lowest entry is -0.993.
      if (std::fabs(in[i]) == a) {
        BOOST_REQUIRE_EQUAL(out[i], in[i] < 0 ? map.values[0] * absmax[i / 256] : in[i]);
      }
    }
  }
  // The sign rule of the optimizer: a small negative value stays negative.
  const auto& s = hone::dynamic_map(true).values;
  const auto c = hone::quantize_keep_sign(s.data(), -1e-9f, -1e-9f);
  BOOST_TEST(s[c] < 0.0f);
  BOOST_TEST(s[hone::quantize_keep_sign(s.data(), 1e-9f, 1e-9f)] == 0.0f);
  BOOST_TEST(s[hone::quantize_keep_sign(s.data(), 0.0f, -0.0f)] == 0.0f);
}

// ---- 8-bit AdamW --------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(adamw_8bit_state_memory_of_a_64m_layout) {
  // A 64 Mi-parameter model: three big matrices and a few small tensors (fp32 state kept).
  hone::arena_layout layout(sizeof(float));
  layout.add("embed.weight", std::size_t{32} << 20);
  layout.add("mlp.weight", std::size_t{16} << 20);
  layout.add("head.weight", (std::size_t{16} << 20) - 20000);
  for (int i = 0; i < 5; ++i) layout.add("norm" + std::to_string(i) + ".weight", 4000);
  BOOST_TEST(layout.total() >= (std::size_t{64} << 20) - 64);
  hone::adamw_8bit opt;
  hone::adamw_8bit_state<> st(opt, layout);
  const std::size_t fp32_state = 2 * sizeof(float) * layout.total();  // exp_avg + exp_avg_sq
  const double ratio = static_cast<double>(st.bytes()) / static_cast<double>(fp32_state);
  BOOST_TEST_MESSAGE("8-bit AdamW state: " << st.bytes() << " bytes = " << ratio
                                           << " x fp32 AdamW state (" << fp32_state << ")");
  BOOST_TEST(ratio <= 0.27);
  BOOST_TEST(st.quantized(0));
  BOOST_TEST(!st.quantized(3));
  std::vector<std::string> names;
  st.for_each_tensor([&](std::string_view n, const auto&) { names.emplace_back(n); });
  BOOST_TEST(names.size() == 6u);
}

namespace {
struct two_runs {
  hone::arena_layout layout;
  hone::arena<float> p8, p32, p0;
};

/// A noisy quadratic (g = p - target + noise), stepped by 8-bit and fp32 AdamW from the same start.
two_runs run_8bit_and_fp32(std::uint64_t steps, std::size_t min_8bit_size) {
  hone::arena_layout layout(sizeof(float));
  layout.add("w1.weight", 20000);
  layout.add("w2.weight", 5000);
  layout.add("w1.bias", 100);
  layout.add("norm.weight", 3000);
  std::mt19937 rng(2024);
  hone::arena<float> target(layout), p8(layout), p32(layout), p0(layout), grad(layout),
      noise(layout);
  fill_normal(target.all(), rng);
  fill_normal(p0.all(), rng, 0.5f);
  std::copy(p0.all().begin(), p0.all().end(), p8.all().begin());
  std::copy(p0.all().begin(), p0.all().end(), p32.all().begin());
  const hone::adamw_8bit o8{.min_8bit_size = min_8bit_size};
  const hone::adamw o32;
  hone::adamw_8bit_state<> s8(o8, layout);
  hone::adamw_state<> s32(o32, layout);
  const auto groups = hone::no_decay_groups(layout);
  hone::arena<float> grad8(layout);
  for (std::uint64_t t = 1; t <= steps; ++t) {
    fill_normal(noise.all(), rng, 0.1f);
    for (std::size_t k = 0; k < grad.all().size(); ++k) {
      grad.all()[k] = p32.all()[k] - target.all()[k] + noise.all()[k];
      grad8.all()[k] = p8.all()[k] - target.all()[k] + noise.all()[k];
    }
    const hone::optimizer_step_args args{.step = t, .lr = 1e-2f};
    s32.step(o32, args, p32.all().data(), static_cast<const float*>(grad.all().data()), groups);
    s8.step(o8, args, p8.all().data(), static_cast<const float*>(grad8.all().data()), groups);
  }
  // Small slots: bit-identical state as well.
  for (std::size_t i = 0; i < layout.size(); ++i) {
    if (s8.quantized(i)) continue;
    std::vector<float> m(layout[i].count), v(layout[i].count);
    s8.read_moments(i, m.data(), v.data());
    BOOST_TEST(std::memcmp(m.data(), s32.exp_avg().view(i).data(), m.size() * 4) == 0);
    BOOST_TEST(std::memcmp(v.data(), s32.exp_avg_sq().view(i).data(), v.size() * 4) == 0);
  }
  return {layout, std::move(p8), std::move(p32), std::move(p0)};
}
}  // namespace

BOOST_AUTO_TEST_CASE(adamw_8bit_tracks_fp32_adamw) {
  // 100 steps of a noisy quadratic: the trajectories stay within a few percent of the distance
  // travelled (measured: ~3.4%; the difference is the re-quantization noise of the moments).
  const auto r = run_8bit_and_fp32(100, 4096);
  for (std::size_t i = 0; i < r.layout.size(); ++i) {
    const auto a = r.p8.view(i);
    const auto b = r.p32.view(i);
    const auto z = r.p0.view(i);
    if (r.layout[i].count < 4096) {
      // Under min_8bit_size: exactly the fp32 AdamW path.
      BOOST_TEST(std::memcmp(a.data(), b.data(), a.size_bytes()) == 0, r.layout[i].name);
      continue;
    }
    double diff = 0.0, moved = 0.0;
    for (std::size_t k = 0; k < a.size(); ++k) {
      diff += (static_cast<double>(a[k]) - b[k]) * (static_cast<double>(a[k]) - b[k]);
      moved += (static_cast<double>(b[k]) - z[k]) * (static_cast<double>(b[k]) - z[k]);
    }
    const double rel = std::sqrt(diff / moved);
    BOOST_TEST_MESSAGE(r.layout[i].name << ": ||p8 - p32|| / ||p32 - p0|| = " << rel);
    BOOST_TEST(rel < 0.06, r.layout[i].name << ": 8-bit AdamW drifted from fp32 AdamW by " << rel);
  }
}

BOOST_AUTO_TEST_CASE(adamw_8bit_step_is_adamw_on_its_decoded_state) {
  // Every step of a quantized slot is the fp32 AdamW step taken from the decoded moments, and the
  // new moments are stored within half a map gap of the exact ones (sign of m kept).
  hone::arena_layout layout(sizeof(float));
  layout.add("w", 3 * 256 + 200);
  std::mt19937 rng(12);
  hone::arena<float> master(layout), grad(layout);
  fill_normal(master.all(), rng);
  const hone::adamw_8bit opt{.weight_decay = 0.05f, .min_8bit_size = 64};
  hone::adamw_8bit_state<> st(opt, layout);
  BOOST_REQUIRE(st.quantized(0));
  const std::size_t n = layout[0].count;
  for (std::uint64_t t = 1; t <= 8; ++t) {
    fill_normal(grad.all(), rng, 0.01f * static_cast<float>(t));
    std::vector<float> m0(n), v0(n);
    st.read_moments(0, m0.data(), v0.data());
    adam_ref ref{to_double(master.view(0)), {m0.begin(), m0.end()}, {v0.begin(), v0.end()}, {}};
    adamw_reference(ref, grad.view(0), 0.5, 1e-3, opt.weight_decay, opt.beta1, opt.beta2, opt.eps,
                    false, t);
    st.step(opt, {.step = t, .lr = 1e-3f, .grad_scale = 0.5f}, master.all().data(),
            static_cast<const float*>(grad.all().data()));
    check_close("param at step " + std::to_string(t), master.view(0), ref.p);
    std::vector<float> m(n), v(n);
    st.read_moments(0, m.data(), v.data());
    for (std::size_t b = 0; b * 256 < n; ++b) {
      const std::size_t e = std::min(n, b * 256 + 256);
      double am = 0.0, av = 0.0;
      for (std::size_t k = b * 256; k < e; ++k) {
        am = std::max(am, std::fabs(ref.m[k]));
        av = std::max(av, ref.v[k]);
      }
      for (std::size_t k = b * 256; k < e; ++k) {
        BOOST_REQUIRE_MESSAGE(std::fabs(m[k] - ref.m[k]) <= 0.00704 * am * 1.001,
                              "step " << t << " m[" << k << "] " << m[k] << " vs " << ref.m[k]);
        BOOST_REQUIRE_MESSAGE(std::fabs(v[k] - ref.v[k]) <= 0.00352 * av * 1.001,
                              "step " << t << " v[" << k << "] " << v[k] << " vs " << ref.v[k]);
        if (ref.m[k] < 0) BOOST_REQUIRE(m[k] < 0.0f);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(adamw_8bit_with_everything_in_fp32_is_adamw) {
  const auto r = run_8bit_and_fp32(5, std::size_t{1} << 30);
  BOOST_TEST(std::memcmp(r.p8.all().data(), r.p32.all().data(), r.p8.all().size_bytes()) == 0);
}

BOOST_AUTO_TEST_CASE(adamw_8bit_first_step_against_reference) {
  // One step from zero state: the moments are exact before quantization, so the parameters must
  // match the fp32 reference, and the decoded moments must be within one map gap of it.
  hone::arena_layout layout(sizeof(float));
  layout.add("w", 5000 + 77);
  std::mt19937 rng(8);
  hone::arena<float> master(layout), grad(layout);
  fill_normal(master.all(), rng);
  fill_normal(grad.all(), rng, 0.01f);
  adam_ref ref{to_double(master.view(0)),
               std::vector<double>(layout[0].count),
               std::vector<double>(layout[0].count),
               {}};
  hone::adamw_8bit opt;
  hone::adamw_8bit_state<> st(opt, layout);
  st.step(opt, {.step = 1, .lr = 1e-3f, .grad_scale = 2.0f}, master.all().data(),
          static_cast<const float*>(grad.all().data()));
  adamw_reference(ref, grad.view(0), 2.0, 1e-3, opt.weight_decay, opt.beta1, opt.beta2, opt.eps,
                  false, 1);
  check_close("param", master.view(0), ref.p);
  std::vector<float> m(layout[0].count), v(layout[0].count);
  st.read_moments(0, m.data(), v.data());
  for (std::size_t b = 0; b * 256 < m.size(); ++b) {
    double am = 0.0, av = 0.0;
    const std::size_t e = std::min(m.size(), b * 256 + 256);
    for (std::size_t k = b * 256; k < e; ++k) {
      am = std::max(am, std::fabs(ref.m[k]));
      av = std::max(av, ref.v[k]);
    }
    for (std::size_t k = b * 256; k < e; ++k) {
      BOOST_REQUIRE(std::fabs(m[k] - ref.m[k]) <= 0.00704 * am * 1.0001);
      BOOST_REQUIRE(std::fabs(v[k] - ref.v[k]) <= 0.00352 * av * 1.0001);
      if (ref.m[k] < 0) BOOST_REQUIRE(m[k] < 0.0f);
    }
  }
}

// ---- clipping -----------------------------------------------------------------------------------

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
