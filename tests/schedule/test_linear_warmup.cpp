// tests/schedule/test_linear_warmup.cpp: hone::linear_warmup against PyTorch's LinearLR (closed
// and recursive forms, transcribed below) and values derived by hand; its validation sentences.
// The method is described in schedule_check.hpp.
#define BOOST_TEST_MODULE hone_schedule_linear_warmup
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "hone/schedule/schedule.hpp"
#include "schedule_check.hpp"

using namespace schedule_test;

namespace {
namespace torch_ref {

// LinearLR._get_closed_form_lr.
double linear_lr_closed(double base_lr, double start_factor, double end_factor,
                        std::int64_t total_iters, std::int64_t last_epoch) {
  return base_lr * (start_factor + (end_factor - start_factor) *
                                       static_cast<double>(std::min(total_iters, last_epoch)) /
                                       static_cast<double>(total_iters));
}

// LinearLR.get_lr, the recursive form step() uses: the lrs of epochs 0..n-1.
std::vector<double> linear_lr_recursive(double base_lr, double start_factor, double end_factor,
                                        std::int64_t total_iters, std::int64_t n) {
  std::vector<double> lrs;
  double lr = base_lr;
  for (std::int64_t last_epoch = 0; last_epoch < n; ++last_epoch) {
    if (last_epoch == 0) {
      lr = lr * start_factor;
    } else if (last_epoch <= total_iters) {
      lr = lr * (1.0 + (end_factor - start_factor) /
                           (static_cast<double>(total_iters) * start_factor +
                            static_cast<double>(last_epoch - 1) * (end_factor - start_factor)));
    }
    lrs.push_back(lr);
  }
  return lrs;
}

}  // namespace torch_ref
}  // namespace

BOOST_AUTO_TEST_CASE(linear_warmup_hand_values) {
  const hone::linear_warmup s{.base_lr = 0.05, .warmup_steps = 4, .start_factor = 0.5};
  s.validate();
  const double expected[] = {0.025, 0.03125, 0.0375, 0.04375, 0.05, 0.05, 0.05};
  for (std::uint64_t t = 0; t < 7; ++t) BOOST_TEST(s.lr(t) == expected[t], tt::tolerance(1e-15));
  BOOST_TEST(s.lr(1'000'000) == 0.05);  // exactly base_lr after the ramp
  // The default start_factor is PyTorch's 1/3.
  const hone::linear_warmup pytorch_default{.base_lr = 0.3, .warmup_steps = 5};
  BOOST_TEST(pytorch_default.lr(0) == 0.1, tt::tolerance(1e-15));
  // No warmup: constant.
  const hone::linear_warmup none{.base_lr = 0.5, .warmup_steps = 0};
  none.validate();
  BOOST_TEST(none.lr(0) == 0.5);
}

BOOST_AUTO_TEST_CASE(linear_warmup_matches_pytorch_linear_lr) {
  for (const double base : {1.0, 0.05, 3e-4}) {
    for (const double sf : {1.0 / 3.0, 0.01, 0.05, 0.5, 0.999, 1.0}) {
      for (const std::int64_t total : {1, 2, 5, 40, 1000}) {
        const hone::linear_warmup s{
            .base_lr = base, .warmup_steps = static_cast<std::uint64_t>(total), .start_factor = sf};
        s.validate();
        const std::int64_t n = total + 10;
        const auto recursive = torch_ref::linear_lr_recursive(base, sf, 1.0, total, n);
        const std::string what = "LinearLR base " + std::to_string(base) + " start_factor " +
                                 std::to_string(sf) + " total_iters " + std::to_string(total);
        // Closed form: the same operations during the ramp (bit-exact); afterwards hone returns
        // base_lr and PyTorch base_lr * (sf + (1 - sf)), equal up to one rounding.
        expect_all_steps(n, what + " (closed form)", [&](std::int64_t t, std::string& d) {
          const double h = s.lr(static_cast<std::uint64_t>(t));
          const double r = torch_ref::linear_lr_closed(base, sf, 1.0, total, t);
          d = pair_text(h, r);
          return t < total ? h == r : std::abs(h - r) <= 2.3e-16 * base;
        });
        // Recursive form (what PyTorch's step() produces): equal up to accumulated rounding.
        expect_all_steps(n, what + " (recursive form)", [&](std::int64_t t, std::string& d) {
          const double h = s.lr(static_cast<std::uint64_t>(t));
          const double r = recursive[static_cast<std::size_t>(t)];
          d = pair_text(h, r);
          return std::abs(h - r) <= 1e-13 * base;
        });
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(linear_warmup_validation) {
  expect_config_error([] { hone::linear_warmup{.warmup_steps = 10}.validate(); }, "base_lr");
  expect_config_error(
      [] {
        hone::linear_warmup{.base_lr = 1.0, .warmup_steps = 10, .start_factor = 0.0}.validate();
      },
      "start_factor");
  expect_config_error(
      [] {
        hone::linear_warmup{.base_lr = 1.0, .warmup_steps = 10, .start_factor = 1.5}.validate();
      },
      "start_factor");
  expect_config_error(
      [] {
        hone::linear_warmup{.base_lr = 1.0, .warmup_steps = 10, .start_factor = -0.1}.validate();
      },
      "(0, 1]");
}
