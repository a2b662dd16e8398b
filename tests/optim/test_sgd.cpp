// Tests of SGD (hone::sgd, sgd_state): against a double-precision transcription of
// torch.optim.SGD (plain, L2, heavy ball, dampening, Nesterov, a scheduled momentum) over several
// steps, six slots and two parameter groups; the first step's buffer is the gradient.
#define BOOST_TEST_MODULE hone_optim_sgd
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>
#include <hone/core/arena.hpp>
#include <hone/optim/sgd.hpp>
#include <optional>
#include <random>
#include <vector>

#include "optim_check.hpp"

using namespace optim_test;

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
