// hone/rl/uniform_sampler.hpp: the uniform sampler. Every stored item is equally likely (draws
// with replacement, unbiased integers from the buffer's RNG); importance weights are 1.
#pragma once

#include <cstddef>
#include <span>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/rl/rng.hpp"
#include "hone/rl/roles.hpp"

HONE_NAMESPACE_BEGIN

class uniform_sampler;

/// Sampler policy: uniform over the stored items.
struct uniform {
  using role = roles::replay_sampler;
  using sampler_type = uniform_sampler;
};

/// The uniform sampler's engine (what hone::replay_buffer holds for hone::uniform).
class uniform_sampler {
 public:
  static constexpr bool is_prioritized = false;

  uniform_sampler(std::size_t capacity, const uniform& /*config*/) : capacity_(capacity) {}

  // Storage events: the uniform sampler keeps no per-item state.
  void insert(std::size_t /*first*/, std::size_t /*n*/) noexcept {}
  void retire(std::size_t /*slot*/) noexcept {}

  /// Fills slots with out.size() draws from [0, size) for which accept(slot) holds (the
  /// many-writers buffer rejects slots being written; at least one slot must be acceptable) and
  /// weights with 1.
  template <class Accept, class OnSlots = detail::ignore_slots>
  void sample(std::size_t size, replay_rng& rng, std::span<std::size_t> slots,
              std::span<float> weights, const Accept& accept, const OnSlots& on_slots = {}) {
    HONE_REQUIRE(size > 0,
                 "hone::replay_buffer::sample: the buffer is empty; add transitions first");
    for (std::size_t i = 0; i < slots.size(); ++i) {
      std::size_t s = rng.below(size);
      while (!accept(s)) s = rng.below(size);
      slots[i] = s;
      weights[i] = 1.0f;
    }
    on_slots(std::span<const std::size_t>(slots));
  }

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

 private:
  std::size_t capacity_;
};

HONE_NAMESPACE_END
