// tests/train/test_early_stopping.cpp: hone::early_stopping against PyTorch Lightning's
// EarlyStopping, and hone::best_weights_keeper.
//
// Method. Hand-written metric sequences pin the documented semantics (strict min_delta, patience
// counting, modes, non-finite metrics, thresholds, sticky stop, reset). A transcription of
// Lightning's _evaluate_stopping_criteria (callbacks/early_stopping.py), written here without
// hone's code, is then run side by side with hone on random metric sequences; without thresholds
// the two must agree on every check (stop decision, best value, wait count).
#define BOOST_TEST_MODULE hone_early_stopping
#include <boost/test/unit_test.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "hone/core/bfloat16.hpp"
#include "hone/train/early_stopping.hpp"

namespace {

constexpr double k_nan = std::numeric_limits<double>::quiet_NaN();
constexpr double k_inf = std::numeric_limits<double>::infinity();

// Lightning's EarlyStopping: __init__ (min_delta sign, best_score) and
// _evaluate_stopping_criteria (without the thresholds).
struct lightning_ref {
  bool min_mode;
  double min_delta;
  std::int64_t patience;
  bool check_finite;
  std::int64_t wait_count = 0;
  double best_score;

  lightning_ref(bool min, double delta, std::int64_t pat, bool finite)
      : min_mode(min),
        min_delta(delta * (min ? -1 : 1)),
        patience(pat),
        check_finite(finite),
        best_score(min ? k_inf : -k_inf) {}

  bool monitor_op(double a, double b) const { return min_mode ? a < b : a > b; }

  bool evaluate(double current) {
    bool should_stop = false;
    if (check_finite && !std::isfinite(current)) {
      should_stop = true;
    } else if (monitor_op(current - min_delta, best_score)) {
      should_stop = false;
      best_score = current;
      wait_count = 0;
    } else {
      wait_count += 1;
      if (wait_count >= patience) should_stop = true;
    }
    return should_stop;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(min_mode_patience) {
  hone::early_stopping stop({.mode = hone::monitor_mode::min, .patience = 3});
  BOOST_TEST(stop.best() == k_inf);
  BOOST_TEST(!stop.best_step().has_value());
  BOOST_TEST(!stop.update(1.0));  // check 0: first finite value is always a best
  BOOST_TEST(stop.improved());
  BOOST_TEST(!stop.update(0.9));  // check 1: best
  BOOST_TEST(!stop.update(0.95));
  BOOST_TEST(!stop.improved());
  BOOST_TEST(stop.wait_count() == 1u);
  BOOST_TEST(!stop.update(0.9));  // equal is not better
  BOOST_TEST(stop.wait_count() == 2u);
  BOOST_TEST(stop.update(0.91));  // third check in a row without improvement
  BOOST_TEST(stop.should_stop());
  BOOST_TEST((stop.reason() == hone::stop_reason::patience));
  BOOST_TEST(stop.best() == 0.9);
  BOOST_TEST(*stop.best_step() == 1u);
  BOOST_TEST(*stop.stop_step() == 4u);
  BOOST_TEST(stop.checks() == 5u);
  BOOST_TEST(stop.message().find("did not improve for 3 checks") != std::string::npos,
             stop.message());
  // Sticky: later checks are still recorded but the answer stays "stop".
  BOOST_TEST(stop.update(0.1));
  BOOST_TEST(stop.improved());
  BOOST_TEST(stop.best() == 0.1);
  BOOST_TEST((stop.reason() == hone::stop_reason::patience));
  BOOST_TEST(*stop.stop_step() == 4u);
  // reset() starts over with the same options.
  stop.reset();
  BOOST_TEST(!stop.should_stop());
  BOOST_TEST(stop.checks() == 0u);
  BOOST_TEST(stop.best() == k_inf);
  BOOST_TEST(!stop.update(5.0));
  BOOST_TEST(*stop.best_step() == 0u);
}

BOOST_AUTO_TEST_CASE(improvement_resets_wait) {
  hone::early_stopping stop({.patience = 2});
  BOOST_TEST(!stop.update(1.0));
  BOOST_TEST(!stop.update(1.5));
  BOOST_TEST(!stop.update(0.5));  // improvement: wait back to 0
  BOOST_TEST(stop.wait_count() == 0u);
  BOOST_TEST(!stop.update(0.6));
  BOOST_TEST(stop.update(0.7));
}

BOOST_AUTO_TEST_CASE(min_delta_is_strict) {
  // best 1.0, min_delta 0.25: 0.75 is exactly min_delta better, which is not enough.
  hone::early_stopping stop({.patience = 10, .min_delta = 0.25});
  stop.update(1.0);
  stop.update(0.75);
  BOOST_TEST(!stop.improved());
  BOOST_TEST(stop.best() == 1.0);
  stop.update(0.7);
  BOOST_TEST(stop.improved());
  BOOST_TEST(stop.best() == 0.7);

  hone::early_stopping up({.mode = hone::monitor_mode::max, .patience = 10, .min_delta = 0.25});
  up.update(1.0);
  up.update(1.25);
  BOOST_TEST(!up.improved());
  up.update(1.5);
  BOOST_TEST(up.improved());
  BOOST_TEST(up.best() == 1.5);
}

BOOST_AUTO_TEST_CASE(max_mode) {
  hone::early_stopping stop({.mode = hone::monitor_mode::max, .patience = 2});
  BOOST_TEST(stop.best() == -k_inf);
  BOOST_TEST(!stop.update(0.5, 10));  // caller's own step numbers
  BOOST_TEST(!stop.update(0.7, 20));
  BOOST_TEST(!stop.update(0.6, 30));
  BOOST_TEST(stop.update(0.7, 40));  // equal to best: no improvement, second in a row
  BOOST_TEST(stop.best() == 0.7);
  BOOST_TEST(*stop.best_step() == 20u);
  BOOST_TEST(*stop.stop_step() == 40u);
}

BOOST_AUTO_TEST_CASE(patience_zero_stops_at_first_non_improvement) {
  hone::early_stopping stop({.patience = 0});
  BOOST_TEST(!stop.update(1.0));
  BOOST_TEST(!stop.update(0.5));
  BOOST_TEST(stop.update(0.5));
}

BOOST_AUTO_TEST_CASE(non_finite_metrics) {
  // check_finite (default): a NaN or infinite metric stops at once and is not recorded.
  for (const double bad : {k_nan, k_inf, -k_inf}) {
    hone::early_stopping stop({.patience = 5});
    BOOST_TEST(!stop.update(1.0));
    BOOST_TEST(stop.update(bad));
    BOOST_TEST((stop.reason() == hone::stop_reason::non_finite));
    BOOST_TEST(stop.best() == 1.0);
    BOOST_TEST(stop.wait_count() == 0u);
    BOOST_TEST(stop.message().find("became") != std::string::npos, stop.message());
    stop.update(0.5);  // recorded, but the message still names the metric that stopped it
    BOOST_TEST(stop.message().find(std::isnan(bad) ? "nan" : "inf") != std::string::npos,
               stop.message());
  }
  // check_finite = false: NaN counts as no improvement, like any other non-improving value.
  hone::early_stopping lenient({.patience = 2, .check_finite = false});
  BOOST_TEST(!lenient.update(1.0));
  BOOST_TEST(!lenient.update(k_nan));
  BOOST_TEST(lenient.wait_count() == 1u);
  BOOST_TEST(!lenient.improved());
  BOOST_TEST(lenient.best() == 1.0);
  BOOST_TEST(std::isnan(lenient.last()));
  BOOST_TEST(lenient.update(k_nan));
  BOOST_TEST((lenient.reason() == hone::stop_reason::patience));
  // ... and a first NaN does not become the best either.
  hone::early_stopping first_nan({.patience = 3, .check_finite = false});
  first_nan.update(k_nan);
  BOOST_TEST(!first_nan.best_step().has_value());
  first_nan.update(2.0);
  BOOST_TEST(first_nan.improved());
  BOOST_TEST(first_nan.wait_count() == 0u);
}

BOOST_AUTO_TEST_CASE(thresholds) {
  // Stopping threshold: stop once strictly better; that metric is recorded as the best.
  hone::early_stopping target({.patience = 10, .stopping_threshold = 0.1});
  BOOST_TEST(!target.update(0.5));
  BOOST_TEST(!target.update(0.1));  // not strictly below
  BOOST_TEST(target.update(0.05, 7));
  BOOST_TEST((target.reason() == hone::stop_reason::stopping_threshold));
  BOOST_TEST(target.best() == 0.05);
  BOOST_TEST(*target.best_step() == 7u);
  // Divergence threshold: stop once strictly worse.
  hone::early_stopping diverge({.patience = 10, .divergence_threshold = 10.0});
  BOOST_TEST(!diverge.update(1.0));
  BOOST_TEST(!diverge.update(10.0));
  BOOST_TEST(diverge.update(10.5));
  BOOST_TEST((diverge.reason() == hone::stop_reason::divergence_threshold));
  // In max mode the directions flip.
  hone::early_stopping acc({.mode = hone::monitor_mode::max,
                            .patience = 10,
                            .stopping_threshold = 0.99,
                            .divergence_threshold = 0.2});
  BOOST_TEST(!acc.update(0.5));
  BOOST_TEST(acc.update(0.995));
  BOOST_TEST((acc.reason() == hone::stop_reason::stopping_threshold));
  hone::early_stopping acc2({.mode = hone::monitor_mode::max, .divergence_threshold = 0.2});
  BOOST_TEST(!acc2.update(0.5));
  BOOST_TEST(acc2.update(0.1));
  BOOST_TEST((acc2.reason() == hone::stop_reason::divergence_threshold));
}

BOOST_AUTO_TEST_CASE(options_validation) {
  const auto make = [](const hone::early_stopping_options& options) {
    const hone::early_stopping stop(options);
    return stop.checks();
  };
  BOOST_CHECK_THROW(make({.min_delta = -0.1}), hone::config_error);
  BOOST_CHECK_THROW(make({.min_delta = k_nan}), hone::config_error);
  BOOST_CHECK_THROW(make({.stopping_threshold = k_nan}), hone::config_error);
  BOOST_CHECK_THROW(make({.divergence_threshold = k_inf}), hone::config_error);
  try {
    make({.min_delta = -1.0});
    BOOST_ERROR("no hone::config_error for a negative min_delta");
  } catch (const hone::config_error& e) {
    BOOST_TEST(std::string(e.what()).find("min_delta must be") != std::string::npos, e.what());
  }
  BOOST_TEST(std::string(hone::to_string(hone::stop_reason::divergence_threshold)) ==
             "divergence_threshold");
}

BOOST_AUTO_TEST_CASE(matches_lightning_on_random_sequences) {
  std::mt19937_64 rng(12345);
  std::size_t checks = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const bool min_mode = trial % 2 == 0;
    const double min_delta = std::array{0.0, 0.01, 0.1, 0.5}[(trial / 2) % 4];
    const std::int64_t patience = (trial / 8) % 6;
    const bool check_finite = (trial / 48) % 2 == 0;
    hone::early_stopping stop({.mode = min_mode ? hone::monitor_mode::min : hone::monitor_mode::max,
                               .patience = static_cast<std::uint64_t>(patience),
                               .min_delta = min_delta,
                               .check_finite = check_finite});
    lightning_ref ref(min_mode, min_delta, patience, check_finite);
    std::uniform_real_distribution<double> step(-0.3, 0.3);
    std::uniform_int_distribution<int> pick(0, 99);
    double metric = 1.0;
    bool ref_stopped = false;
    for (int i = 0; i < 60; ++i) {
      metric += step(rng);
      double value = metric;
      const int p = pick(rng);
      if (p == 0) value = k_nan;
      if (p == 1) value = k_inf;
      if (p == 2) value = -k_inf;
      const bool ref_stop = ref.evaluate(value);
      const bool hone_stop = stop.update(value);
      ref_stopped = ref_stopped || ref_stop;
      ++checks;
      // Lightning reports each check's decision; hone's is sticky, so compare with "any so far".
      BOOST_TEST_REQUIRE(hone_stop == ref_stopped, "trial " << trial << " check " << i);
      if (!(check_finite && !std::isfinite(value))) {
        BOOST_TEST_REQUIRE(stop.wait_count() == static_cast<std::uint64_t>(ref.wait_count),
                           "trial " << trial << " check " << i);
      }
      BOOST_TEST_REQUIRE((stop.best() == ref.best_score ||
                          (std::isnan(stop.best()) && std::isnan(ref.best_score))),
                         "trial " << trial << " check " << i);
    }
  }
  BOOST_TEST_MESSAGE(checks << " checks compared with the Lightning transcription");
}

// ---- best_weights_keeper -----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(keeper_snapshot_and_restore_float_and_bfloat16) {
  std::vector<float> master = {1.0f, 2.0f, 3.0f, -0.0f, std::numeric_limits<float>::quiet_NaN()};
  std::array<hone::bfloat16, 3> working = {hone::bfloat16(0.5f), hone::bfloat16(-1.5f),
                                           hone::bfloat16::from_bits(0x7fc1)};
  std::vector<double> empty;

  hone::best_weights_keeper keeper;
  keeper.track(master).track(std::span(working)).track(empty);
  BOOST_TEST(keeper.tracked() == 2u);  // empty arrays are skipped
  BOOST_TEST(keeper.bytes() == 5 * sizeof(float) + 3 * sizeof(hone::bfloat16));
  BOOST_TEST(!keeper.has_snapshot());
  BOOST_CHECK_THROW(keeper.restore(), hone::config_error);

  const auto master_bits = [&] {
    std::vector<std::uint32_t> bits;
    for (float f : master) bits.push_back(std::bit_cast<std::uint32_t>(f));
    return bits;
  };
  keeper.snapshot();
  BOOST_TEST(keeper.has_snapshot());
  const auto saved = master_bits();
  for (float& f : master) f = 42.0f;
  for (auto& b : working) b = hone::bfloat16(7.0f);
  keeper.restore();
  BOOST_TEST(master_bits() == saved);  // bit for bit: -0 and the NaN payload survive
  BOOST_TEST(working[0].bits() == hone::bfloat16(0.5f).bits());
  BOOST_TEST(working[1].bits() == hone::bfloat16(-1.5f).bits());
  BOOST_TEST(working[2].bits() == 0x7fc1);

  // A later snapshot replaces the earlier one; restore can be repeated.
  master[0] = 10.0f;
  keeper.snapshot();
  master[0] = 11.0f;
  keeper.restore();
  keeper.restore();
  BOOST_TEST(master[0] == 10.0f);

  // Tracking another array discards the snapshot, which would not cover it.
  std::vector<float> more = {1.0f};
  keeper.track(more);
  BOOST_TEST(!keeper.has_snapshot());
  BOOST_CHECK_THROW(keeper.restore(), hone::config_error);
  keeper.clear();
  BOOST_TEST(keeper.tracked() == 0u);
  BOOST_TEST(keeper.bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(keeper_with_early_stopping) {
  // A toy run: weights drift each epoch; the validation loss is lowest at epoch 2. After the stop,
  // restore() brings back the weights of epoch 2.
  std::vector<float> weights(1000, 0.0f);
  hone::best_weights_keeper best;
  best.track(weights);
  hone::early_stopping stop({.patience = 2});
  const double losses[] = {1.0, 0.8, 0.5, 0.6, 0.55, 0.4};
  std::uint64_t stopped_at = 0;
  for (std::uint64_t epoch = 0; epoch < 6; ++epoch) {
    for (float& w : weights) w = static_cast<float>(epoch);  // "training"
    if (stop.update(losses[epoch], epoch, best)) {
      stopped_at = epoch;
      break;
    }
  }
  BOOST_TEST(stopped_at == 4u);
  BOOST_TEST(*stop.best_step() == 2u);
  BOOST_TEST(weights[0] == 4.0f);
  best.restore();
  for (float w : weights) BOOST_TEST_REQUIRE(w == 2.0f);
}

// Compile-time properties of track(): mutable contiguous ranges only.
namespace {
template <class R>
concept trackable = requires(hone::best_weights_keeper& k, R&& r) {
  k.track(std::forward<R>(r));
};
static_assert(trackable<std::vector<float>&>);
static_assert(trackable<std::span<float>>);
static_assert(trackable<std::span<hone::bfloat16, 4>>);
static_assert(trackable<std::array<double, 3>&>);
static_assert(!trackable<std::vector<float>>, "a temporary vector would dangle");
}  // namespace

// state() / restore(): splitting a random metric sequence at every position and restoring the
// state into a fresh object gives the same decisions, best values and wait counts afterwards as
// the uninterrupted object (including thresholds, NaN and stops before the split).
BOOST_AUTO_TEST_CASE(state_and_restore_continue_exactly) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 40; ++trial) {
    const hone::early_stopping_options o{
        .mode = trial % 2 == 0 ? hone::monitor_mode::min : hone::monitor_mode::max,
        .patience = static_cast<std::uint64_t>(trial % 4),
        .min_delta = trial % 3 == 0 ? 0.01 : 0.0,
        .check_finite = trial % 5 != 0,
        .stopping_threshold = trial % 7 == 0 ? std::optional<double>(0.05) : std::nullopt};
    std::vector<double> metrics(30);
    for (auto& m : metrics) m = u(rng) < 0.05 ? k_nan : u(rng);
    for (std::size_t split = 0; split <= metrics.size(); ++split) {
      hone::early_stopping straight(o), first(o), resumed(o);
      for (std::size_t i = 0; i < split; ++i) {
        (void)straight.update(metrics[i], 10 * i);
        (void)first.update(metrics[i], 10 * i);
      }
      resumed.restore(first.state());
      for (std::size_t i = split; i < metrics.size(); ++i) {
        const bool a = straight.update(metrics[i], 10 * i);
        const bool b = resumed.update(metrics[i], 10 * i);
        BOOST_TEST(a == b);
        BOOST_TEST(std::bit_cast<std::uint64_t>(straight.best()) ==
                   std::bit_cast<std::uint64_t>(resumed.best()));
        BOOST_TEST(straight.wait_count() == resumed.wait_count());
        BOOST_TEST(straight.improved() == resumed.improved());
      }
      BOOST_TEST((straight.best_step() == resumed.best_step()));
      BOOST_TEST((straight.stop_step() == resumed.stop_step()));
      BOOST_TEST((straight.reason() == resumed.reason()));
      BOOST_TEST(straight.checks() == resumed.checks());
      BOOST_TEST(straight.message() == resumed.message());
    }
  }
  // Inconsistent states are refused.
  hone::early_stopping es;
  hone::early_stopping_state bad;
  bad.reason = hone::stop_reason::patience;  // without a stop step
  BOOST_CHECK_THROW(es.restore(bad), hone::config_error);
  bad = {};
  bad.wait_count = 3;  // more waits than checks
  BOOST_CHECK_THROW(es.restore(bad), hone::config_error);
  bad = {};
  bad.best_step = 4;  // a best step with the initial +inf best
  BOOST_CHECK_THROW(es.restore(bad), hone::config_error);
  for (const auto r :
       {hone::stop_reason::none, hone::stop_reason::patience, hone::stop_reason::non_finite,
        hone::stop_reason::stopping_threshold, hone::stop_reason::divergence_threshold}) {
    BOOST_TEST((hone::stop_reason_from_string(hone::to_string(r)) == r));
  }
  BOOST_TEST(!hone::stop_reason_from_string("bored").has_value());
}

BOOST_AUTO_TEST_CASE(keeper_snapshot_bytes_round_trip) {
  std::vector<float> a{1.0f, -2.0f, 3.5f};
  std::vector<hone::bfloat16> b{hone::bfloat16(0.25f), hone::bfloat16(-8.0f)};
  hone::best_weights_keeper k;
  k.track(a).track(b);
  BOOST_TEST(k.snapshot_bytes().empty());
  k.snapshot();
  const auto saved = k.snapshot_bytes();
  BOOST_REQUIRE(saved.size() == 3 * 4 + 2 * 2);
  BOOST_TEST(std::memcmp(saved.data(), a.data(), 12) == 0);  // arrays back to back, track order
  BOOST_TEST(std::memcmp(saved.data() + 12, b.data(), 4) == 0);
  const std::vector<std::byte> copy(saved.begin(), saved.end());
  // Another keeper over other arrays of the same sizes takes the bytes and restores them.
  std::vector<float> a2(3, 0.0f);
  std::vector<hone::bfloat16> b2(2, hone::bfloat16(0.0f));
  hone::best_weights_keeper k2;
  k2.track(a2).track(b2);
  k2.restore_snapshot(copy);
  BOOST_TEST(a2[0] == 0.0f);  // not written until restore()
  k2.restore();
  BOOST_TEST(std::memcmp(a2.data(), a.data(), 12) == 0);
  BOOST_TEST(std::memcmp(b2.data(), b.data(), 4) == 0);
  BOOST_CHECK_THROW(k2.restore_snapshot(std::span(copy).first(15)), hone::config_error);
}
