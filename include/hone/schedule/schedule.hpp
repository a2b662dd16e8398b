// hone/schedule/schedule.hpp: every learning-rate schedule, and the concepts a trainer checks.
//
// A schedule policy is a type that
//   - declares `using role = hone::roles::schedule;`,
//   - has `lr(std::uint64_t step) const` returning something convertible to double: the learning
//     rate of the 0-based optimizer update `step` (a pure function: no state, no side effects),
//   - has `validate() const`, which throws hone::config_error with a sentence for a bad
//     configuration (a trainer calls it once, before the first update),
// and optionally
//   - `momentum(std::uint64_t step) const` returning something convertible to
//     std::optional<double>: the momentum (or Adam's beta1) for that update, or std::nullopt to
//     leave the optimizer's own value alone.
//
//   static_assert(hone::schedule_policy<my_schedule>);  // or hone::check_schedule<my_schedule>()
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>

#include "hone/core/roles.hpp"
#include "hone/schedule/common.hpp"
#include "hone/schedule/constant.hpp"
#include "hone/schedule/cosine.hpp"
#include "hone/schedule/linear_warmup.hpp"
#include "hone/schedule/one_cycle.hpp"
#include "hone/schedule/wsd.hpp"

HONE_NAMESPACE_BEGIN

/// S has `lr(step) const` returning a value convertible to double.
template <class S>
concept has_schedule_lr = requires(const S& s, std::uint64_t step) {
  { s.lr(step) } -> std::convertible_to<double>;
};

/// S has `validate() const`.
template <class S>
concept has_schedule_validate = requires(const S& s) {
  s.validate();
};

/// A learning-rate schedule a trainer accepts (see the file comment).
template <class S>
concept schedule_policy =
    plays_role_v<S, roles::schedule> && has_schedule_lr<S> && has_schedule_validate<S>;

/// A schedule that also drives momentum: `momentum(step) const` returns something convertible to
/// std::optional<double> (std::nullopt: leave the optimizer's momentum as it is).
template <class S>
concept momentum_schedule_policy = schedule_policy<S> && requires(const S& s, std::uint64_t step) {
  { s.momentum(step) } -> std::convertible_to<std::optional<double>>;
};

/// Compile-time check with one sentence per missing piece; returns true when S is a
/// schedule_policy. Trainers call it so that the first error a user sees says what to add.
template <class S>
consteval bool check_schedule() {
  if constexpr (!plays_role_v<S, roles::schedule>) {
    static_assert(plays_role_v<S, roles::schedule>,
                  "hone::schedule_policy: this type does not declare `using role = "
                  "hone::roles::schedule;`. Add it to your schedule struct (and make sure it is "
                  "not meant for another role).");
    return false;
  } else if constexpr (!has_schedule_lr<S>) {
    static_assert(has_schedule_lr<S>,
                  "hone::schedule_policy: this schedule has no member function "
                  "`double lr(std::uint64_t step) const` returning the learning rate of the "
                  "0-based optimizer update `step`. Add it.");
    return false;
  } else if constexpr (!has_schedule_validate<S>) {
    static_assert(has_schedule_validate<S>,
                  "hone::schedule_policy: this schedule has no member function "
                  "`void validate() const`. Add one that throws hone::config_error with a "
                  "sentence for a bad configuration (an empty body is fine when every value is "
                  "valid).");
    return false;
  } else {
    return true;
  }
}

static_assert(schedule_policy<constant_lr> && schedule_policy<linear_warmup> &&
              schedule_policy<cosine_with_warmup> && schedule_policy<one_cycle> &&
              schedule_policy<wsd>);
static_assert(momentum_schedule_policy<one_cycle> && !momentum_schedule_policy<constant_lr>);

HONE_NAMESPACE_END
