// hone/precision/loss_scale.hpp: loss scalers for fp16 training.
//
// dynamic_loss_scale follows PyTorch's GradScaler (torch/amp/grad_scaler.py and the CPU kernel of
// _amp_update_scale_): init 2^16, growth 2.0, backoff 0.5, growth interval 2000. On a step with an
// inf/NaN gradient the scale backs off and the growth tracker resets; after `growth_interval`
// consecutive good steps it grows, but never to a non-finite value. Added, as in Megatron /
// DeepSpeed: `hysteresis` (back off only after N consecutive overflows; 1 = PyTorch) and
// [min_scale, max_scale] bounds. When an overflow arrives with the scale already at min_scale the
// scaler throws hone::error instead of collapsing towards 0 (apex #834, #318).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN

/// Configuration of the dynamic scaler (aggregate: `dynamic_loss_scale{.growth_interval = 1000}`).
struct dynamic_loss_scale {
  float init_scale = 65536.0f;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  std::int32_t growth_interval = 2000;
  std::int32_t hysteresis = 1;  // consecutive overflows needed before backing off
  float min_scale = 1.0f;       // DeepSpeed's default; an overflow at this scale is an error
  float max_scale = std::numeric_limits<float>::max();
};

/// A fixed scale (1 = no scaling). Overflowed steps are still skipped.
struct static_loss_scale {
  float scale = 1.0f;
};

/// Everything a checkpoint needs to restore a scaler exactly (transformers #34053: a resumed run
/// must not restart at 65536).
struct loss_scale_state {
  float scale = 1.0f;
  std::int32_t growth_tracker = 0;      // consecutive good steps since the last change
  std::int32_t hysteresis_tracker = 1;  // overflows still tolerated before backing off
  std::uint64_t skipped_steps = 0;      // total steps skipped for non-finite gradients
  friend bool operator==(const loss_scale_state&, const loss_scale_state&) = default;
};

namespace detail {
inline bool positive_finite(float x) {
  return std::isfinite(x) && x > 0.0f;
}
}  // namespace detail

/// The runtime scaler for a dynamic_loss_scale configuration.
class dynamic_loss_scaler {
 public:
  explicit dynamic_loss_scaler(const dynamic_loss_scale& cfg = {}) : cfg_(cfg) {
    HONE_REQUIRE(detail::positive_finite(cfg.init_scale),
                 "hone::dynamic_loss_scale: init_scale must be a positive finite number");
    HONE_REQUIRE(std::isfinite(cfg.growth_factor) && cfg.growth_factor > 1.0f,
                 "hone::dynamic_loss_scale: growth_factor must be greater than 1");
    HONE_REQUIRE(cfg.backoff_factor > 0.0f && cfg.backoff_factor < 1.0f,
                 "hone::dynamic_loss_scale: backoff_factor must be in (0, 1)");
    HONE_REQUIRE(cfg.growth_interval >= 1,
                 "hone::dynamic_loss_scale: growth_interval must be >= 1");
    HONE_REQUIRE(cfg.hysteresis >= 1, "hone::dynamic_loss_scale: hysteresis must be >= 1");
    HONE_REQUIRE(
        detail::positive_finite(cfg.min_scale) && detail::positive_finite(cfg.max_scale) &&
            cfg.min_scale <= cfg.init_scale && cfg.init_scale <= cfg.max_scale,
        "hone::dynamic_loss_scale: need 0 < min_scale <= init_scale <= max_scale, all finite");
    state_.scale = cfg.init_scale;
    state_.hysteresis_tracker = cfg.hysteresis;
  }

  [[nodiscard]] float scale() const noexcept { return state_.scale; }
  [[nodiscard]] const loss_scale_state& state() const noexcept { return state_; }
  [[nodiscard]] const dynamic_loss_scale& config() const noexcept { return cfg_; }

  /// Restores a saved state; throws config_error when it is not one this scaler could reach.
  void load_state(const loss_scale_state& s) {
    HONE_REQUIRE(
        detail::positive_finite(s.scale) && s.scale >= cfg_.min_scale && s.scale <= cfg_.max_scale,
        "hone::dynamic_loss_scaler::load_state: scale " + std::to_string(s.scale) +
            " is outside [min_scale, max_scale] or not finite; the checkpoint does not match "
            "this scaler's configuration");
    HONE_REQUIRE(s.growth_tracker >= 0 && s.growth_tracker < cfg_.growth_interval,
                 "hone::dynamic_loss_scaler::load_state: growth_tracker out of range");
    HONE_REQUIRE(s.hysteresis_tracker >= 1 && s.hysteresis_tracker <= cfg_.hysteresis,
                 "hone::dynamic_loss_scaler::load_state: hysteresis_tracker out of range");
    state_ = s;
  }

  /// Records the outcome of one step and returns true when the update must be applied (no
  /// overflow). Throws hone::error when the gradients overflow with the scale at its minimum.
  bool update(bool found_inf) {
    if (found_inf) {
      ++state_.skipped_steps;
      state_.growth_tracker = 0;
      if (--state_.hysteresis_tracker > 0) return false;  // tolerated (hysteresis)
      state_.hysteresis_tracker = cfg_.hysteresis;
      if (state_.scale <= cfg_.min_scale) {
        throw error(
            "hone::dynamic_loss_scaler: gradients overflow with the loss scale already at "
            "its minimum (" +
            std::to_string(cfg_.min_scale) +
            "). The model produces inf/NaN gradients independently of the scale: check "
            "the data and the loss for NaN, lower the learning rate, or use bf16.");
      }
      const float next = state_.scale * cfg_.backoff_factor;
      state_.scale = next < cfg_.min_scale ? cfg_.min_scale : next;
      return false;
    }
    state_.hysteresis_tracker = cfg_.hysteresis;  // overflows must be consecutive
    if (++state_.growth_tracker == cfg_.growth_interval) {
      state_.growth_tracker = 0;
      const float next = state_.scale * cfg_.growth_factor;
      if (std::isfinite(next)) state_.scale = next < cfg_.max_scale ? next : cfg_.max_scale;
    }
    return true;
  }

 private:
  dynamic_loss_scale cfg_;
  loss_scale_state state_;
};

/// The runtime scaler for a static_loss_scale: a constant that only counts skipped steps.
class static_loss_scaler {
 public:
  explicit static_loss_scaler(const static_loss_scale& cfg = {}) {
    HONE_REQUIRE(detail::positive_finite(cfg.scale),
                 "hone::static_loss_scale: scale must be a positive finite number");
    state_.scale = cfg.scale;
  }
  [[nodiscard]] float scale() const noexcept { return state_.scale; }
  [[nodiscard]] const loss_scale_state& state() const noexcept { return state_; }
  void load_state(const loss_scale_state& s) {
    HONE_REQUIRE(s.scale == state_.scale,
                 "hone::static_loss_scaler::load_state: the checkpoint's scale differs from this "
                 "scaler's constant scale");
    state_ = s;
  }
  bool update(bool found_inf) noexcept {
    if (found_inf) ++state_.skipped_steps;
    return !found_inf;
  }

 private:
  loss_scale_state state_;
};

/// The runtime scaler type of a scaler configuration.
template <class Config>
struct scaler_for {
  static_assert(sizeof(Config) == 0,
                "hone: no loss scaler for this configuration; use hone::dynamic_loss_scale or "
                "hone::static_loss_scale, or specialize hone::scaler_for<YourConfig>.");
};
template <>
struct scaler_for<dynamic_loss_scale> {
  using type = dynamic_loss_scaler;
};
template <>
struct scaler_for<static_loss_scale> {
  using type = static_loss_scaler;
};

HONE_NAMESPACE_END
