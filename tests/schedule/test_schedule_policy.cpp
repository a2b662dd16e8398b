// tests/schedule/test_schedule_policy.cpp: the schedule concepts (schedule_policy,
// momentum_schedule_policy, check_schedule) on hone's schedules and on user-written ones, picking
// by role, constant evaluation, constant_lr, and a user-written schedule through the concept.
#define BOOST_TEST_MODULE hone_schedule_policy
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "hone/schedule/schedule.hpp"
#include "schedule_check.hpp"

using namespace schedule_test;

// ---- concepts ----------------------------------------------------------------------------------

namespace {

struct good_custom {  // step decay: lr halves every 10 updates
  using role = hone::roles::schedule;
  double base_lr = 1.0;
  double lr(std::uint64_t step) const { return base_lr * std::pow(0.5, double(step / 10)); }
  void validate() const {}
};
struct custom_with_momentum {
  using role = hone::roles::schedule;
  float lr(std::uint64_t) const { return 1.0f; }  // float converts to double: accepted
  void validate() const {}
  double momentum(std::uint64_t) const { return 0.9; }  // always drives momentum
};
struct no_role {
  double lr(std::uint64_t) const { return 1.0; }
  void validate() const {}
};
struct wrong_role {
  using role = hone::roles::optimizer;
  double lr(std::uint64_t) const { return 1.0; }
  void validate() const {}
};
struct no_validate {
  using role = hone::roles::schedule;
  double lr(std::uint64_t) const { return 1.0; }
};
struct no_lr {
  using role = hone::roles::schedule;
  void validate() const {}
};
struct lr_not_a_number {
  using role = hone::roles::schedule;
  std::string lr(std::uint64_t) const { return "1e-3"; }
  void validate() const {}
};
struct lr_not_const {
  using role = hone::roles::schedule;
  double lr(std::uint64_t) { return 1.0; }
  void validate() const {}
};
struct validate_not_const {
  using role = hone::roles::schedule;
  double lr(std::uint64_t) const { return 1.0; }
  void validate() {}
};

static_assert(hone::schedule_policy<hone::constant_lr>);
static_assert(hone::schedule_policy<hone::linear_warmup>);
static_assert(hone::schedule_policy<hone::cosine_with_warmup>);
static_assert(hone::schedule_policy<hone::one_cycle>);
static_assert(hone::schedule_policy<hone::wsd>);
static_assert(hone::schedule_policy<good_custom> && hone::check_schedule<good_custom>());
static_assert(hone::check_schedule<hone::one_cycle>());
static_assert(!hone::schedule_policy<int>);
static_assert(!hone::schedule_policy<double>);
static_assert(!hone::schedule_policy<no_role>);
static_assert(!hone::schedule_policy<wrong_role>);
static_assert(!hone::schedule_policy<no_validate>);
static_assert(!hone::schedule_policy<no_lr>);
static_assert(!hone::schedule_policy<lr_not_a_number>);
static_assert(!hone::schedule_policy<lr_not_const>);
static_assert(!hone::schedule_policy<validate_not_const>);

static_assert(hone::momentum_schedule_policy<hone::one_cycle>);
static_assert(hone::momentum_schedule_policy<custom_with_momentum>);
static_assert(!hone::momentum_schedule_policy<hone::cosine_with_warmup>);
static_assert(!hone::momentum_schedule_policy<good_custom>);
static_assert(!hone::momentum_schedule_policy<int>);

// The trainer picks the schedule from its policy pack by role.
static_assert(std::is_same_v<
              hone::pick<hone::roles::schedule, hone::constant_lr, wrong_role, hone::one_cycle>,
              hone::one_cycle>);
static_assert(std::is_same_v<hone::pick<hone::roles::schedule, hone::constant_lr, wrong_role>,
                             hone::constant_lr>);

// Schedules are aggregates (designated initializers) and trivially copyable (passed by value
// to kernels).
static_assert(std::is_aggregate_v<hone::one_cycle> && std::is_aggregate_v<hone::wsd>);
static_assert(std::is_trivially_copyable_v<hone::one_cycle> &&
              std::is_trivially_copyable_v<hone::cosine_with_warmup> &&
              std::is_trivially_copyable_v<hone::wsd>);

// The schedules without transcendental functions are usable in constant expressions.
constexpr hone::linear_warmup constexpr_warmup{
    .base_lr = 0.5, .warmup_steps = 2, .start_factor = 0.5};
static_assert(constexpr_warmup.lr(0) == 0.25 && constexpr_warmup.lr(1) == 0.375 &&
              constexpr_warmup.lr(2) == 0.5 && constexpr_warmup.lr(1000) == 0.5);
static_assert(hone::constant_lr{.base_lr = 0.125}.lr(12345) == 0.125);
static_assert(hone::one_cycle{
                  .max_lr = 1.0, .total_steps = 10, .div_factor = 4.0, .final_div_factor = 2.0}
                  .min_lr() == 0.125);
static_assert(hone::wsd{.base_lr = 1.0, .warmup_steps = 1, .stable_steps = 2, .decay_steps = 3}
                  .total_steps() == 6);

}  // namespace

// ---- constant_lr -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(constant_lr_values_and_validation) {
  const hone::constant_lr s{.base_lr = 3e-4};
  s.validate();
  for (std::uint64_t t : {0ull, 1ull, 999ull, ~0ull}) BOOST_TEST(s.lr(t) == 3e-4);
  expect_config_error([] { hone::constant_lr{}.validate(); }, "left unset");
  expect_config_error([] { hone::constant_lr{.base_lr = -1e-3}.validate(); }, "base_lr");
  expect_config_error(
      [] { hone::constant_lr{.base_lr = std::numeric_limits<double>::quiet_NaN()}.validate(); },
      "base_lr");
  expect_config_error(
      [] { hone::constant_lr{.base_lr = std::numeric_limits<double>::infinity()}.validate(); },
      "base_lr");
}

// ---- a user-written schedule through the concept ----------------------------------------------

namespace {
template <hone::schedule_policy S>
std::vector<double> first_lrs(const S& s, std::uint64_t n) {
  s.validate();
  std::vector<double> lrs;
  for (std::uint64_t t = 0; t < n; ++t) lrs.push_back(static_cast<double>(s.lr(t)));
  return lrs;
}
template <hone::schedule_policy S>
std::optional<double> momentum_or_none(const S& s, std::uint64_t t) {
  if constexpr (hone::momentum_schedule_policy<S>) {
    return s.momentum(t);
  } else {
    return std::nullopt;
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(custom_schedule_through_concept) {
  const auto lrs = first_lrs(good_custom{.base_lr = 1.0}, 25);
  BOOST_TEST(lrs[0] == 1.0);
  BOOST_TEST(lrs[10] == 0.5);
  BOOST_TEST(lrs[24] == 0.25);
  BOOST_TEST(!momentum_or_none(good_custom{}, 3).has_value());
  BOOST_TEST(*momentum_or_none(custom_with_momentum{}, 3) == 0.9);
  BOOST_TEST(*momentum_or_none(hone::one_cycle{.max_lr = 0.1, .total_steps = 100}, 29) == 0.85);
}
