// tests/schedule/test_cosine.cpp: hone::cosine_with_warmup against HF transformers' cosine
// lr_lambda functions (transcribed below) and values derived by hand; its validation sentences.
// The method is described in schedule_check.hpp.
#define BOOST_TEST_MODULE hone_schedule_cosine
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "hone/schedule/schedule.hpp"
#include "schedule_check.hpp"

using namespace schedule_test;

namespace {
// transformers/optimization.py lr_lambda functions; LambdaLR multiplies them by the base lr.
namespace hf_ref {

double cosine_schedule_with_warmup(std::int64_t current_step, std::int64_t num_warmup_steps,
                                   std::int64_t num_training_steps, double num_cycles = 0.5) {
  if (current_step < num_warmup_steps) {
    return static_cast<double>(current_step) /
           static_cast<double>(std::max<std::int64_t>(1, num_warmup_steps));
  }
  const double progress =
      static_cast<double>(current_step - num_warmup_steps) /
      static_cast<double>(std::max<std::int64_t>(1, num_training_steps - num_warmup_steps));
  return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * num_cycles * 2.0 * progress)));
}

// _get_cosine_schedule_with_warmup_lr_lambda with min_lr_rate (get_cosine_with_min_lr_...).
double cosine_with_min_lr(std::int64_t current_step, std::int64_t num_warmup_steps,
                          std::int64_t num_training_steps, double min_lr_rate,
                          double num_cycles = 0.5) {
  if (current_step < num_warmup_steps) {
    return static_cast<double>(current_step) /
           static_cast<double>(std::max<std::int64_t>(1, num_warmup_steps));
  }
  const double progress =
      static_cast<double>(current_step - num_warmup_steps) /
      static_cast<double>(std::max<std::int64_t>(1, num_training_steps - num_warmup_steps));
  double factor = 0.5 * (1.0 + std::cos(std::numbers::pi * num_cycles * 2.0 * progress));
  factor = factor * (1 - min_lr_rate) + min_lr_rate;
  return std::max(0.0, factor);
}

}  // namespace hf_ref
}  // namespace

BOOST_AUTO_TEST_CASE(cosine_hand_values) {
  const hone::cosine_with_warmup s{.base_lr = 1.0, .warmup_steps = 10, .total_steps = 110};
  s.validate();
  BOOST_TEST(s.lr(0) == 0.0);
  BOOST_TEST(s.lr(5) == 0.5);
  BOOST_TEST(s.lr(10) == 1.0);  // peak: progress 0
  BOOST_TEST(s.lr(60) == 0.5);  // progress 1/2: cos(pi/2) = 6e-17 vanishes in 1 + cos
  BOOST_TEST(s.lr(35) == 0.5 * (1.0 + std::sqrt(0.5)), tt::tolerance(1e-15));  // progress 1/4
  BOOST_TEST(s.lr(110) == 0.0);  // cos(pi) = -1 exactly
  BOOST_TEST(s.lr(111) == 0.0);  // clamped past total_steps (HF would rise again)
  BOOST_TEST(s.lr(100000) == 0.0);

  const hone::cosine_with_warmup floor{
      .base_lr = 1.0, .warmup_steps = 10, .total_steps = 110, .min_lr = 0.1};
  floor.validate();
  BOOST_TEST(floor.lr(5) == 0.5);  // the warmup starts at 0 whatever min_lr is (as HF)
  BOOST_TEST(floor.lr(10) == 1.0);
  BOOST_TEST(floor.lr(60) == 0.55, tt::tolerance(1e-15));
  BOOST_TEST(floor.lr(110) == 0.1, tt::tolerance(1e-15));
  BOOST_TEST(floor.lr(5000) == 0.1, tt::tolerance(1e-15));

  // No warmup: the peak at update 0.
  BOOST_TEST((hone::cosine_with_warmup{.base_lr = 2.0, .total_steps = 4}.lr(0)) == 2.0);
  // Warmup as long as the whole run: ramp, then min_lr right after.
  const hone::cosine_with_warmup all_warmup{.base_lr = 1.0, .warmup_steps = 4, .total_steps = 4};
  all_warmup.validate();
  BOOST_TEST(all_warmup.lr(2) == 0.5);
  BOOST_TEST(all_warmup.lr(4) == 1.0);
  BOOST_TEST(all_warmup.lr(5) == 0.0);
  BOOST_TEST(all_warmup.lr(6) == 0.0);  // HF: cos(2 pi) -> back to 1.0
}

BOOST_AUTO_TEST_CASE(cosine_matches_hf_transformers) {
  for (const double base : {1.0, 3e-4, 0.1}) {
    for (const double min_ratio : {0.0, 0.1, 0.5, 1.0}) {
      for (const auto& phases : std::vector<std::pair<std::int64_t, std::int64_t>>{
               {0, 1}, {0, 7}, {1, 1}, {3, 3}, {10, 110}, {100, 1000}, {37, 5001}, {0, 12345}}) {
        // (Named copies rather than structured bindings: clang 14 cannot capture those.)
        const std::int64_t warmup = phases.first;
        const std::int64_t total = phases.second;
        const double min_lr = base * min_ratio;
        const hone::cosine_with_warmup s{.base_lr = base,
                                         .warmup_steps = static_cast<std::uint64_t>(warmup),
                                         .total_steps = static_cast<std::uint64_t>(total),
                                         .min_lr = min_lr};
        s.validate();
        const std::string what = "cosine base " + std::to_string(base) + " min_ratio " +
                                 std::to_string(min_ratio) + " warmup " + std::to_string(warmup) +
                                 " total " + std::to_string(total);
        // The decay lasts max(1, total - warmup) updates (HF's denominator), so it ends at
        // update `last` = max(total, warmup + 1). Up to and including it, hone equals HF bit for
        // bit: the plain get_cosine_schedule_with_warmup when min_lr = 0, the min_lr variant
        // (with HF's min_lr_rate = min_lr / lr) otherwise.
        const std::int64_t last = std::max(total, warmup + 1);
        expect_all_steps(last + 1, what, [&](std::int64_t t, std::string& d) {
          const double h = s.lr(static_cast<std::uint64_t>(t));
          const double r = min_lr == 0.0
                               ? base * hf_ref::cosine_schedule_with_warmup(t, warmup, total)
                               : base * hf_ref::cosine_with_min_lr(t, warmup, total, min_lr / base);
          d = pair_text(h, r);
          return h == r;
        });
        // Past it, hone stays at min_lr (HF's cosine would rise again).
        const double end = s.lr(static_cast<std::uint64_t>(last));
        BOOST_TEST(end == min_lr, tt::tolerance(1e-15));
        for (const std::uint64_t t : {1ull, 2ull, 1000ull, 1ull << 40}) {
          BOOST_TEST(s.lr(static_cast<std::uint64_t>(last) + t) == end);
        }
        if (last + 1 - warmup >= 2) {  // HF's value a full decay length past the end: back up
          const std::int64_t decay = std::max<std::int64_t>(1, total - warmup);
          BOOST_TEST(hf_ref::cosine_schedule_with_warmup(last + decay, warmup, total) == 1.0,
                     tt::tolerance(1e-12));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(cosine_validation) {
  expect_config_error([] { hone::cosine_with_warmup{.total_steps = 10}.validate(); }, "base_lr");
  expect_config_error([] { hone::cosine_with_warmup{.base_lr = 1.0}.validate(); }, "total_steps");
  expect_config_error(
      [] {
        hone::cosine_with_warmup{.base_lr = 1.0, .warmup_steps = 11, .total_steps = 10}.validate();
      },
      "warmup_steps (11) must not exceed total_steps (10)");
  expect_config_error(
      [] { hone::cosine_with_warmup{.base_lr = 1.0, .total_steps = 10, .min_lr = 2.0}.validate(); },
      "min_lr");
  expect_config_error(
      [] {
        hone::cosine_with_warmup{.base_lr = 1.0, .total_steps = 10, .min_lr = -0.5}.validate();
      },
      "min_lr");
}
