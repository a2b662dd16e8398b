// Tests of the optimizer and clipping policies as policies: their roles and concepts, PyTorch's
// defaults, parameter groups built from names, and the configuration errors of bad arguments.
#define BOOST_TEST_MODULE hone_optim_policies
#include <boost/test/unit_test.hpp>

#include <hone/core/arena.hpp>
#include <hone/core/bfloat16.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/adamw_8bit.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/optim/param_group.hpp>
#include <hone/optim/sgd.hpp>
#include <limits>
#include <string_view>
#include <type_traits>
#include <vector>

#include "optim_check.hpp"

using namespace optim_test;

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
