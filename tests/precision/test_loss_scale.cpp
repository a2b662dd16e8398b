// Loss scalers against PyTorch GradScaler's published update rule (_amp_update_scale_), written
// independently here, and against hand-computed sequences.
#define BOOST_TEST_MODULE hone_precision_loss_scale
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <hone/precision/loss_scale.hpp>
#include <limits>
#include <random>
#include <vector>

namespace {
// torch/csrc/.../AmpKernels: the CPU kernel of _amp_update_scale_.
struct torch_grad_scaler {
  float scale, growth, backoff;
  int interval, tracker = 0;
  void update(bool found_inf) {
    if (found_inf) {
      scale *= backoff;
      tracker = 0;
    } else {
      const int successful = tracker + 1;
      if (successful == interval) {
        const float next = scale * growth;
        if (std::isfinite(next)) scale = next;
        tracker = 0;
      } else {
        tracker = successful;
      }
    }
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(defaults_are_pytorchs) {
  const hone::dynamic_loss_scale d;
  BOOST_TEST(d.init_scale == 65536.0f);
  BOOST_TEST(d.growth_factor == 2.0f);
  BOOST_TEST(d.backoff_factor == 0.5f);
  BOOST_TEST(d.growth_interval == 2000);
  BOOST_TEST(hone::dynamic_loss_scaler{}.scale() == 65536.0f);
}

BOOST_AUTO_TEST_CASE(matches_grad_scaler_on_random_overflow_patterns) {
  for (unsigned seed : {1u, 2u, 3u}) {
    for (int interval : {1, 3, 7}) {
      std::mt19937 rng(seed);
      // Overflow rate balanced against growth so the scale wanders both ways without hitting
      // either end of the float range (which the next cases test on purpose).
      std::bernoulli_distribution overflow(0.25 / interval);
      hone::dynamic_loss_scaler s({.init_scale = 0x1p64f,
                                   .growth_interval = interval,
                                   .min_scale = std::numeric_limits<float>::min()});
      torch_grad_scaler ref{0x1p64f, 2.0f, 0.5f, interval};
      for (int step = 0; step < 20000; ++step) {
        const bool inf = overflow(rng);
        const bool applied = s.update(inf);
        ref.update(inf);
        BOOST_REQUIRE_EQUAL(applied, !inf);
        BOOST_REQUIRE_EQUAL(s.scale(), ref.scale);
        BOOST_REQUIRE_EQUAL(s.state().growth_tracker, ref.tracker);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(hand_computed_sequence_and_collapse_error) {
  hone::dynamic_loss_scaler s({.init_scale = 8, .growth_interval = 2, .min_scale = 1});
  const bool pattern[] = {false, false, true, false, true, true, true};
  const float scales[] = {8, 16, 8, 8, 4, 2, 1};
  for (int i = 0; i < 7; ++i) {
    BOOST_TEST(s.update(pattern[i]) == !pattern[i]);
    BOOST_TEST(s.scale() == scales[i], "step " << i);
  }
  BOOST_TEST(s.state().skipped_steps == 4u);
  // Another overflow at the minimum: a clear error, not a scale of 0.5, 0.25, ... 0.
  try {
    s.update(true);
    BOOST_FAIL("overflow at the minimum scale must throw");
  } catch (const hone::error& e) {
    BOOST_TEST(std::string(e.what()).find("already at its minimum") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(hysteresis_needs_consecutive_overflows) {
  hone::dynamic_loss_scaler s({.init_scale = 8, .growth_interval = 100, .hysteresis = 2});
  BOOST_TEST(!s.update(true));  // tolerated, but the step is still skipped
  BOOST_TEST(s.scale() == 8.0f);
  BOOST_TEST(s.update(false));
  BOOST_TEST(!s.update(true));  // not consecutive with the first: tolerated again
  BOOST_TEST(s.scale() == 8.0f);
  BOOST_TEST(!s.update(true));  // second consecutive: back off
  BOOST_TEST(s.scale() == 4.0f);
  BOOST_TEST(!s.update(true));  // tracker was reset: tolerated
  BOOST_TEST(s.scale() == 4.0f);
}

BOOST_AUTO_TEST_CASE(never_grows_past_max_or_to_infinity) {
  hone::dynamic_loss_scaler capped({.init_scale = 4, .growth_interval = 1, .max_scale = 10});
  capped.update(false);
  BOOST_TEST(capped.scale() == 8.0f);
  capped.update(false);
  BOOST_TEST(capped.scale() == 10.0f);
  const float big = std::numeric_limits<float>::max() / 1.5f;
  hone::dynamic_loss_scaler s({.init_scale = big, .growth_interval = 1});
  for (int i = 0; i < 5; ++i) s.update(false);
  BOOST_TEST(std::isfinite(s.scale()));
  BOOST_TEST(s.scale() == big);
}

BOOST_AUTO_TEST_CASE(state_round_trips_and_rejects_foreign_state) {
  hone::dynamic_loss_scaler a({.growth_interval = 3});
  a.update(false);
  a.update(true);
  a.update(false);
  hone::dynamic_loss_scaler b({.growth_interval = 3});
  b.load_state(a.state());
  BOOST_TEST((b.state() == a.state()));
  for (bool inf : {false, false, false, true, false}) BOOST_TEST(a.update(inf) == b.update(inf));
  BOOST_TEST(a.scale() == b.scale());

  hone::loss_scale_state bad = a.state();
  bad.scale = std::numeric_limits<float>::infinity();
  BOOST_CHECK_THROW(b.load_state(bad), hone::config_error);
  bad = a.state();
  bad.growth_tracker = 3;  // == interval: impossible
  BOOST_CHECK_THROW(b.load_state(bad), hone::config_error);
}

BOOST_AUTO_TEST_CASE(configuration_is_validated) {
  BOOST_CHECK_THROW(hone::dynamic_loss_scaler({.init_scale = 0}), hone::config_error);
  BOOST_CHECK_THROW(hone::dynamic_loss_scaler({.growth_factor = 1.0f}), hone::config_error);
  BOOST_CHECK_THROW(hone::dynamic_loss_scaler({.backoff_factor = 1.0f}), hone::config_error);
  BOOST_CHECK_THROW(hone::dynamic_loss_scaler({.growth_interval = 0}), hone::config_error);
  BOOST_CHECK_THROW(hone::dynamic_loss_scaler({.hysteresis = 0}), hone::config_error);
  BOOST_CHECK_THROW(hone::dynamic_loss_scaler({.init_scale = 0.5f, .min_scale = 1}),
                    hone::config_error);
  BOOST_CHECK_THROW(hone::static_loss_scaler({.scale = -1}), hone::config_error);
  hone::static_loss_scaler st({.scale = 128});
  BOOST_TEST(!st.update(true));
  BOOST_TEST(st.update(false));
  BOOST_TEST(st.scale() == 128.0f);
  BOOST_TEST(st.state().skipped_steps == 1u);
}
