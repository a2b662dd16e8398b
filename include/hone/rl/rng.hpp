// hone/rl/rng.hpp: the random number generator replay buffers own (xoshiro256++), small and with
// a state that can be read and written back, so a restored buffer continues the same sample
// sequence. Also the draws the samplers need: uniform doubles in [0, 1) and unbiased integers in
// [0, n) (Lemire's multiply-shift with rejection).
#pragma once

#include <array>
#include <cstdint>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN

namespace detail {
__extension__ using uint128 = unsigned __int128;  // __extension__: no -Wpedantic warning
}  // namespace detail

/// xoshiro256++ 1.0 (Blackman and Vigna), seeded through splitmix64.
class replay_rng {
 public:
  using result_type = std::uint64_t;
  using state_type = std::array<std::uint64_t, 4>;

  explicit replay_rng(std::uint64_t seed = 0x5eed5eed5eedULL) noexcept { this->seed(seed); }

  void seed(std::uint64_t seed) noexcept {
    for (auto& w : s_) {
      seed += 0x9e3779b97f4a7c15ULL;  // splitmix64
      std::uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      w = z ^ (z >> 31);
    }
  }

  static constexpr result_type min() noexcept { return 0; }
  static constexpr result_type max() noexcept { return ~std::uint64_t{0}; }

  result_type operator()() noexcept {
    const std::uint64_t result = rotl(s_[0] + s_[3], 23) + s_[0];
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  /// A uniform double in [0, 1) with 53 random bits.
  double uniform() noexcept { return static_cast<double>((*this)() >> 11) * 0x1.0p-53; }

  /// An unbiased integer in [0, n), n > 0 (Lemire 2019).
  std::uint64_t below(std::uint64_t n) noexcept {
    detail::uint128 m = static_cast<detail::uint128>((*this)()) * n;
    auto low = static_cast<std::uint64_t>(m);
    if (low < n) {
      const std::uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<detail::uint128>((*this)()) * n;
        low = static_cast<std::uint64_t>(m);
      }
    }
    return static_cast<std::uint64_t>(m >> 64);
  }

  /// The whole state (for saving a buffer) and its restoration.
  [[nodiscard]] state_type state() const noexcept { return s_; }
  void set_state(const state_type& s) noexcept { s_ = s; }

  friend bool operator==(const replay_rng&, const replay_rng&) = default;

 private:
  static constexpr std::uint64_t rotl(std::uint64_t x, int k) noexcept {
    return (x << k) | (x >> (64 - k));
  }
  state_type s_{};
};

HONE_NAMESPACE_END
