// tests/schedule/test_one_cycle.cpp: hone::one_cycle against PyTorch's OneCycleLR.get_lr
// (transcribed below) on every step of a sweep of configurations, and values derived by hand; its
// validation sentences. The method is described in schedule_check.hpp.
#define BOOST_TEST_MODULE hone_schedule_one_cycle
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "hone/schedule/schedule.hpp"
#include "schedule_check.hpp"

using namespace schedule_test;

namespace {

// torch.optim.lr_scheduler.OneCycleLR: _annealing_cos / _annealing_linear and get_lr's loop over
// self._schedule_phases.
namespace torch_ref {

double annealing_cos(double start, double end, double pct) {
  const double cos_out = std::cos(std::numbers::pi * pct) + 1;
  return end + (start - end) / 2.0 * cos_out;
}
double annealing_linear(double start, double end, double pct) {
  return (end - start) * pct + start;
}

struct phase {
  double end_step;
  const char* start_lr;
  const char* end_lr;
  const char* start_momentum;
  const char* end_momentum;
};

struct one_cycle_lr {
  double max_lr;
  std::int64_t total_steps;
  double pct_start = 0.3;
  bool cos = true;
  bool three_phase = false;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25.0;
  double final_div_factor = 1e4;

  std::vector<phase> phases() const {
    if (three_phase) {
      return {{pct_start * static_cast<double>(total_steps) - 1, "initial_lr", "max_lr",
               "max_momentum", "base_momentum"},
              {2 * pct_start * static_cast<double>(total_steps) - 2, "max_lr", "initial_lr",
               "base_momentum", "max_momentum"},
              {static_cast<double>(total_steps - 1), "initial_lr", "min_lr", "max_momentum",
               "max_momentum"}};
    }
    return {{pct_start * static_cast<double>(total_steps) - 1, "initial_lr", "max_lr",
             "max_momentum", "base_momentum"},
            {static_cast<double>(total_steps - 1), "max_lr", "min_lr", "base_momentum",
             "max_momentum"}};
  }

  // group["initial_lr"], group["max_lr"], ... as set in __init__.
  double group(const std::string& key) const {
    const double initial_lr = max_lr / div_factor;
    if (key == "initial_lr") return initial_lr;
    if (key == "max_lr") return max_lr;
    if (key == "min_lr") return initial_lr / final_div_factor;
    if (key == "max_momentum") return max_momentum;
    if (key == "base_momentum") return base_momentum;
    throw std::logic_error("unknown key " + key);
  }

  // (lr, momentum) after `step_num` calls of scheduler.step() past construction.
  std::pair<double, double> get(std::int64_t step_num) const {
    const auto ph = phases();
    double start_step = 0.0;
    for (std::size_t i = 0; i < ph.size(); ++i) {
      const double end_step = ph[i].end_step;
      if (static_cast<double>(step_num) <= end_step || i == ph.size() - 1) {
        const double pct = (static_cast<double>(step_num) - start_step) / (end_step - start_step);
        const auto anneal = cos ? annealing_cos : annealing_linear;
        return {anneal(group(ph[i].start_lr), group(ph[i].end_lr), pct),
                anneal(group(ph[i].start_momentum), group(ph[i].end_momentum), pct)};
      }
      start_step = ph[i].end_step;
    }
    throw std::logic_error("unreachable");
  }
};

}  // namespace torch_ref
}  // namespace

BOOST_AUTO_TEST_CASE(one_cycle_hand_values) {
  // max_lr 0.1, 100 updates, PyTorch defaults: initial 0.1 / 25 = 0.004, min 0.004 / 1e4 = 4e-7;
  // phase 1 ends at float(0.3 * 100) - 1 = 29, phase 2 at 99.
  const hone::one_cycle s{.max_lr = 0.1, .total_steps = 100};
  s.validate();
  BOOST_TEST(s.initial_lr() == 0.004, tt::tolerance(1e-15));
  BOOST_TEST(s.min_lr() == 4e-7, tt::tolerance(1e-15));
  BOOST_TEST(s.lr(0) == 0.004, tt::tolerance(1e-14));
  BOOST_TEST(s.lr(29) == 0.1);  // pct 1: cos(pi) + 1 = 0 exactly
  BOOST_TEST(s.lr(99) == 4e-7, tt::tolerance(1e-14));
  // Midpoint of phase 2: pct = (64 - 29) / (99 - 29) = 1/2, lr = (max + min) / 2.
  BOOST_TEST(s.lr(64) == (0.1 + 4e-7) / 2, tt::tolerance(1e-14));
  // Phase 1 rises, phase 2 falls.
  for (std::uint64_t t = 0; t < 29; ++t) BOOST_TEST(s.lr(t) < s.lr(t + 1));
  for (std::uint64_t t = 29; t < 99; ++t) BOOST_TEST(s.lr(t) > s.lr(t + 1));
  // Momentum goes the other way: 0.95 -> 0.85 at the peak -> 0.95.
  BOOST_TEST(*s.momentum(0) == 0.95, tt::tolerance(1e-14));
  BOOST_TEST(*s.momentum(29) == 0.85);
  BOOST_TEST(*s.momentum(64) == 0.9, tt::tolerance(1e-14));
  BOOST_TEST(*s.momentum(99) == 0.95);
  // Past the last update: the last update's values.
  BOOST_TEST(s.lr(100) == s.lr(99));
  BOOST_TEST(s.lr(~0ull) == s.lr(99));
  BOOST_TEST(*s.momentum(1000) == *s.momentum(99));

  // Linear annealing: straight lines through the same corner points.
  const hone::one_cycle lin{
      .max_lr = 0.1, .total_steps = 100, .anneal_strategy = hone::one_cycle::anneal::linear};
  lin.validate();
  BOOST_TEST(lin.lr(0) == 0.004, tt::tolerance(1e-14));
  BOOST_TEST(lin.lr(10) == 0.004 + 0.096 * 10.0 / 29.0, tt::tolerance(1e-14));
  BOOST_TEST(lin.lr(29) == 0.1, tt::tolerance(1e-15));
  BOOST_TEST(lin.lr(64) == (0.1 + 4e-7) / 2, tt::tolerance(1e-14));
  BOOST_TEST(lin.lr(99) == 4e-7, tt::tolerance(1e-9));
  BOOST_TEST(*lin.momentum(10) == 0.95 - 0.1 * 10.0 / 29.0, tt::tolerance(1e-14));

  // Three phases: 0.004 -> 0.1 (step 29) -> 0.004 (step float(2 * 0.3 * 100) - 2 = 58) -> 4e-7;
  // momentum 0.95 -> 0.85 -> 0.95, then stays at 0.95.
  const hone::one_cycle three{.max_lr = 0.1, .total_steps = 100, .three_phase = true};
  three.validate();
  BOOST_TEST(three.lr(29) == 0.1);
  BOOST_TEST(three.lr(58) == three.initial_lr());
  BOOST_TEST(three.lr(99) == three.min_lr());
  BOOST_TEST(*three.momentum(29) == 0.85);
  BOOST_TEST(*three.momentum(58) == 0.95);
  for (std::uint64_t t = 58; t < 100; ++t) BOOST_TEST(*three.momentum(t) == 0.95);

  // Without momentum cycling there is no momentum to set.
  const hone::one_cycle no_momentum{.max_lr = 0.1, .total_steps = 100, .cycle_momentum = false};
  no_momentum.validate();
  BOOST_TEST(!no_momentum.momentum(0).has_value());
  BOOST_TEST(no_momentum.lr(29) == 0.1);

  // A single update: PyTorch's phase 1 ends at 0.3 - 1 < 0, so update 0 is the end of phase 2.
  const hone::one_cycle single{.max_lr = 1.0, .total_steps = 1};
  single.validate();
  BOOST_TEST(single.lr(0) == single.min_lr());
}

BOOST_AUTO_TEST_CASE(one_cycle_matches_pytorch_one_cycle_lr) {
  std::size_t configurations = 0;
  std::size_t rejected = 0;
  for (const std::int64_t total : {1, 2, 3, 5, 7, 10, 17, 20, 100, 1000, 12345}) {
    for (const double pct : {0.05, 0.1, 0.25, 0.3, 0.45, 0.5, 0.7, 0.95}) {
      for (const bool cos : {true, false}) {
        for (const bool three : {false, true}) {
          for (const auto& [div, final_div] :
               std::vector<std::pair<double, double>>{{25.0, 1e4}, {10.0, 100.0}, {1.0, 1.0}}) {
            const hone::one_cycle s{.max_lr = 0.1,
                                    .total_steps = static_cast<std::uint64_t>(total),
                                    .pct_start = pct,
                                    .anneal_strategy = cos ? hone::one_cycle::anneal::cos
                                                           : hone::one_cycle::anneal::linear,
                                    .div_factor = div,
                                    .final_div_factor = final_div,
                                    .three_phase = three,
                                    .base_momentum = 0.8,
                                    .max_momentum = 0.9};
            // validate() rejects exactly the configurations PyTorch cannot evaluate (a
            // zero-length first phase) and three phases with pct_start > 0.5.
            const bool zero_length = pct * static_cast<double>(total) == 1.0;
            const bool bad_three = three && pct > 0.5;
            if (zero_length || bad_three) {
              expect_config_error([&] { s.validate(); }, "pct_start");
              ++rejected;
              continue;
            }
            s.validate();
            ++configurations;
            const torch_ref::one_cycle_lr ref{.max_lr = 0.1,
                                              .total_steps = total,
                                              .pct_start = pct,
                                              .cos = cos,
                                              .three_phase = three,
                                              .base_momentum = 0.8,
                                              .max_momentum = 0.9,
                                              .div_factor = div,
                                              .final_div_factor = final_div};
            const std::string what = "OneCycleLR total " + std::to_string(total) + " pct " +
                                     std::to_string(pct) + (cos ? " cos" : " linear") +
                                     (three ? " three_phase" : "") + " div " + std::to_string(div) +
                                     "/" + std::to_string(final_div);
            expect_all_steps(total, what, [&](std::int64_t t, std::string& d) {
              const auto [lr, momentum] = ref.get(t);
              const double h_lr = s.lr(static_cast<std::uint64_t>(t));
              const double h_m = *s.momentum(static_cast<std::uint64_t>(t));
              d = "lr " + pair_text(h_lr, lr) + "; momentum " + pair_text(h_m, momentum);
              return h_lr == lr && h_m == momentum;
            });
            const auto [last_lr, last_m] = ref.get(total - 1);
            BOOST_TEST(s.lr(static_cast<std::uint64_t>(total) + 5) == last_lr);
            BOOST_TEST(*s.momentum(static_cast<std::uint64_t>(total) + 5) == last_m);
          }
        }
      }
    }
  }
  BOOST_TEST_MESSAGE("OneCycleLR: " << configurations << " configurations compared, " << rejected
                                    << " rejected by validate()");
  BOOST_TEST(configurations > 400u);
  BOOST_TEST(rejected > 0u);
}

BOOST_AUTO_TEST_CASE(one_cycle_validation) {
  expect_config_error([] { hone::one_cycle{.total_steps = 100}.validate(); }, "max_lr");
  expect_config_error([] { hone::one_cycle{.max_lr = -0.1, .total_steps = 100}.validate(); },
                      "max_lr");
  expect_config_error([] { hone::one_cycle{.max_lr = 0.1}.validate(); }, "total_steps");
  for (const double pct : {0.0, 1.0, -0.3, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    expect_config_error(
        [&] { hone::one_cycle{.max_lr = 0.1, .total_steps = 100, .pct_start = pct}.validate(); },
        "pct_start must be in (0, 1)");
  }
  expect_config_error(
      [] {
        hone::one_cycle{.max_lr = 0.1, .total_steps = 100, .pct_start = 0.6, .three_phase = true}
            .validate();
      },
      "three_phase");
  expect_config_error(
      [] { hone::one_cycle{.max_lr = 0.1, .total_steps = 10, .pct_start = 0.1}.validate(); },
      "zero steps long");
  expect_config_error(
      [] { hone::one_cycle{.max_lr = 0.1, .total_steps = 100, .div_factor = 0.0}.validate(); },
      "div_factor");
  expect_config_error(
      [] {
        hone::one_cycle{.max_lr = 0.1, .total_steps = 100, .final_div_factor = -1.0}.validate();
      },
      "final_div_factor");
  expect_config_error(
      [] { hone::one_cycle{.max_lr = 0.1, .total_steps = 100, .base_momentum = 1.5}.validate(); },
      "base_momentum");
  expect_config_error(
      [] { hone::one_cycle{.max_lr = 0.1, .total_steps = 100, .max_momentum = -0.1}.validate(); },
      "max_momentum");
  // Momentum values are not checked when momentum is not cycled.
  hone::one_cycle{.max_lr = 0.1, .total_steps = 100, .cycle_momentum = false, .base_momentum = 7.0}
      .validate();
}
