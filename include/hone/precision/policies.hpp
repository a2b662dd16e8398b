// hone/precision/policies.hpp: precision policies (role: precision).
//
//   hone::fp32                      fp32 weights and gradients; overflowed steps are skipped.
//   hone::bf16_mixed                bf16 working weights and gradients, fp32 master weights and
//                                   gradients; no loss scaling, but one inf/NaN in a bf16
//                                   gradient skips the step before it reaches the moments.
//   hone::fp16_mixed<Scaler>        fp16 working copy, fp32 master, loss scaling (dynamic by
//                                   default, PyTorch GradScaler semantics).
//
// A skipped step leaves master weights, optimizer moments, the step counter and the schedule
// untouched; only the scaler's state (and its skipped-step count) moves.
#pragma once

#include <concepts>
#include <type_traits>

#include "hone/core/bfloat16.hpp"
#include "hone/core/config.hpp"
#include "hone/core/half.hpp"
#include "hone/core/roles.hpp"
#include "hone/precision/loss_scale.hpp"

HONE_NAMESPACE_BEGIN

struct fp32 {
  using role = roles::precision;
  using working_type = float;
  using scaler_config = static_loss_scale;
  scaler_config scaler{};
  static constexpr const char* name = "fp32";
};

struct bf16_mixed {
  using role = roles::precision;
  using working_type = bfloat16;
  using scaler_config = static_loss_scale;
  scaler_config scaler{};
  static constexpr const char* name = "bf16";
};

template <class Scaler = dynamic_loss_scale>
struct fp16_mixed {
  using role = roles::precision;
  using working_type = half;
  using scaler_config = Scaler;
  scaler_config scaler{};
  static constexpr const char* name = "fp16";
};

/// A precision policy: a working type hone can unscale and cast, and a scaler configuration.
template <class P>
concept precision_policy = requires(const P& p) {
  typename P::working_type;
  typename P::scaler_config;
  typename scaler_for<typename P::scaler_config>::type;
  { p.scaler } -> std::convertible_to<typename P::scaler_config>;
  requires std::same_as<typename P::role, roles::precision>;
}
&&(std::same_as<typename P::working_type, float> ||
   std::same_as<typename P::working_type, bfloat16> ||
   std::same_as<typename P::working_type, half>);

HONE_NAMESPACE_END
