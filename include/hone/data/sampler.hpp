// hone/data/sampler.hpp: the order in which a loader reads a dataset. A sampler gives an epoch's
// order (a list of sample indices) as a pure function of (dataset size, seed, epoch): nothing is
// carried from one epoch to the next, so the loader's resume state is only (seed, epoch,
// position), and a resumed run rebuilds the very same order.
//
//   sequential_sampler        0, 1, ..., n - 1 every epoch
//   shuffled_sampler          a permutation of 0..n-1, a new one per epoch (Fisher-Yates driven
//                             by xoshiro256++ seeded from (seed, epoch) through splitmix64)
//   weighted_sampler          `count` indices drawn by weight, with or without replacement
//                             (without: Efraimidis-Spirakis keys log(u) / w, largest first)
//   distributed_sampler<S>    S's order dealt out to `world` ranks (see below)
//
// Distributed reading and the meaning of "position". Every rank builds the same epoch order
// (same sampler, seed and epoch). The position p of an epoch is the number of entries of that
// order consumed by all ranks together; the entries [0, p) are done, [p, m) are not. From
// position p, rank r of w reads the entries p + r, p + r + w, p + r + 2w, ... (round robin). When
// every rank has read L entries (ranks step in lockstep: one batch each per step), the entries
// [p, p + L w) are done and the new position is p + L w: still a prefix of the order. So a run
// resumed at position p with another world size w' deals out exactly the entries not yet read,
// [p, m), among its w' ranks. The remainder R = m - p rarely divides by w: `tail::pad` gives
// every rank ceil(R / w) entries, the missing ones repeating the order from its start (as
// PyTorch's DistributedSampler does), `tail::drop` gives floor(R / w) and leaves the last R mod w
// entries of the epoch unread. A single process is world 1, rank 0: position is the count read.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/rl/rng.hpp"

HONE_NAMESPACE_BEGIN
namespace data {

/// The random generator samplers and batch transforms use, recorded in the loader's state so a
/// state written by another generator is refused instead of silently giving other orders.
inline constexpr std::string_view sampler_rng_name = "splitmix64+xoshiro256++/1";

namespace detail {
/// splitmix64's output function: a bijective 64-bit mix.
[[nodiscard]] constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
/// A 64-bit key of (seed, a, b, c): the counter-based part of every random choice the loader
/// makes, so a draw depends on these numbers only and never on the order threads ran in.
[[nodiscard]] constexpr std::uint64_t key(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0,
                                          std::uint64_t c = 0) noexcept {
  std::uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ULL);
  h = mix64(h ^ (a + 0x9e3779b97f4a7c15ULL));
  h = mix64(h ^ (b + 0x632be59bd9b4e019ULL));
  return mix64(h ^ (c + 0x85157af5c6ea6d6bULL));
}
/// A uniform double in (0, 1) from a key (53 bits, never 0: log() of it is finite).
[[nodiscard]] constexpr double open_unit(std::uint64_t k) noexcept {
  return (static_cast<double>(k >> 11) + 0.5) * 0x1.0p-53;
}
// Streams of key(): which random choice a key is for.
inline constexpr std::uint64_t stream_shuffle = 1;
inline constexpr std::uint64_t stream_weighted = 2;
inline constexpr std::uint64_t stream_batch = 3;
}  // namespace detail

/// The generator of one epoch's (or batch's) random choices: xoshiro256++ seeded from
/// detail::key(seed, stream, a, b). A pure function of its arguments.
[[nodiscard]] inline replay_rng keyed_rng(std::uint64_t seed, std::uint64_t stream, std::uint64_t a,
                                          std::uint64_t b = 0) noexcept {
  return replay_rng(detail::key(seed, stream, a, b));
}

/// A sampler: `epoch_order(n, seed, epoch, out)` fills `out` with the sample indices (each < n)
/// of that epoch in reading order, a pure function of its arguments; `name()` names the kind
/// (recorded in the loader's state).
template <class S>
concept sampler = std::is_object_v<S> && std::copy_constructible<S> &&
    requires(const S& s, std::size_t n, std::uint64_t seed, std::uint64_t epoch,
             std::vector<std::uint64_t>& out) {
  s.epoch_order(n, seed, epoch, out);
  { s.name() } -> std::convertible_to<std::string_view>;
};

/// Fails to compile with a sentence naming what S lacks; true when S is a sampler.
template <class S>
consteval bool check_sampler() {
  if constexpr (!requires(const S& s, std::size_t n, std::uint64_t seed, std::uint64_t epoch,
                          std::vector<std::uint64_t>& out) {
                  s.epoch_order(n, seed, epoch, out);
                }) {
    static_assert(sampler<S>,
                  "hone::data::sampler: this type has no const member function "
                  "epoch_order(std::size_t n, std::uint64_t seed, std::uint64_t epoch, "
                  "std::vector<std::uint64_t>& out) filling `out` with an epoch's sample indices. "
                  "Add it; it must depend on its arguments only, so a resumed run rebuilds the "
                  "same order.");
    return false;
  } else if constexpr (!sampler<S>) {
    static_assert(sampler<S>,
                  "hone::data::sampler: this type has no const member function name() returning "
                  "its kind as a std::string_view (it is saved in the loader's state). Add "
                  "`std::string_view name() const`, and make the type copyable.");
    return false;
  } else {
    return true;
  }
}

/// 0, 1, ..., n - 1 every epoch.
struct sequential_sampler {
  void epoch_order(std::size_t n, std::uint64_t, std::uint64_t,
                   std::vector<std::uint64_t>& out) const {
    out.resize(n);
    std::iota(out.begin(), out.end(), std::uint64_t{0});
  }
  [[nodiscard]] std::string_view name() const noexcept { return "sequential"; }
};

/// A new permutation of 0..n-1 per epoch: Fisher-Yates (from the back) with the unbiased draws of
/// keyed_rng(seed, stream_shuffle, epoch). The same (seed, epoch) gives the same permutation.
struct shuffled_sampler {
  void epoch_order(std::size_t n, std::uint64_t seed, std::uint64_t epoch,
                   std::vector<std::uint64_t>& out) const {
    out.resize(n);
    std::iota(out.begin(), out.end(), std::uint64_t{0});
    replay_rng rng = keyed_rng(seed, detail::stream_shuffle, epoch);
    for (std::size_t i = n; i > 1; --i) {
      const std::size_t j = static_cast<std::size_t>(rng.below(i));
      std::swap(out[i - 1], out[j]);
    }
  }
  [[nodiscard]] std::string_view name() const noexcept { return "shuffled"; }
};

/// `count` sample indices per epoch drawn with probability proportional to `weights` (one per
/// sample, finite and >= 0, not all 0). With replacement, draw k is the index whose cumulative
/// weight interval holds u_k * total, u_k uniform from the key (seed, epoch, k): draws are
/// independent. Without replacement, sample i gets the key log(u_i) / w_i and the `count` largest
/// keys are taken, largest first (Efraimidis and Spirakis 2006: the same law as drawing one at a
/// time and removing it); a zero weight is never drawn, and `count` may not exceed the number of
/// positive weights.
class weighted_sampler {
 public:
  weighted_sampler(std::vector<double> weights, std::size_t count, bool replacement = true)
      : count_(count), replacement_(replacement) {
    double total = 0.0;
    std::size_t positive = 0;
    for (std::size_t i = 0; i < weights.size(); ++i) {
      const double w = weights[i];
      if (!std::isfinite(w) || w < 0.0) {
        throw config_error("hone::data::weighted_sampler: weight " + std::to_string(i) + " is " +
                           std::to_string(w) + "; weights must be finite and >= 0");
      }
      total += w;
      positive += w > 0.0 ? 1 : 0;
    }
    if (positive == 0) {
      throw config_error("hone::data::weighted_sampler: all " + std::to_string(weights.size()) +
                         " weights are 0; give at least one sample a positive weight");
    }
    if (!replacement && count > positive) {
      throw config_error("hone::data::weighted_sampler: " + std::to_string(count) +
                         " samples without replacement, but only " + std::to_string(positive) +
                         " weights are positive; lower the count or draw with replacement");
    }
    auto cum = std::make_shared<std::vector<double>>(weights.size());
    std::partial_sum(weights.begin(), weights.end(), cum->begin());
    total_ = total;
    cumulative_ = std::move(cum);
    weights_ = std::make_shared<const std::vector<double>>(std::move(weights));
  }

  void epoch_order(std::size_t n, std::uint64_t seed, std::uint64_t epoch,
                   std::vector<std::uint64_t>& out) const {
    const std::vector<double>& w = *weights_;
    if (n != w.size()) {
      throw config_error("hone::data::weighted_sampler: " + std::to_string(w.size()) +
                         " weights for a dataset of " + std::to_string(n) +
                         " samples; give one weight per sample");
    }
    out.resize(count_);
    if (replacement_) {
      const std::vector<double>& cum = *cumulative_;
      for (std::size_t k = 0; k < count_; ++k) {
        const double u = detail::open_unit(detail::key(seed, detail::stream_weighted, epoch, k));
        auto it = std::upper_bound(cum.begin(), cum.end(), u * total_);
        if (it == cum.end()) {  // u * total rounded up to total: the last positive weight
          it = std::prev(cum.end());
          while (it != cum.begin() && w[static_cast<std::size_t>(it - cum.begin())] == 0.0) --it;
        }
        out[k] = static_cast<std::uint64_t>(it - cum.begin());
      }
      return;
    }
    std::vector<std::pair<double, std::uint64_t>> keys;
    keys.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (w[i] <= 0.0) continue;
      const double u = detail::open_unit(detail::key(seed, detail::stream_weighted, epoch, i));
      keys.emplace_back(std::log(u) / w[i], i);
    }
    const auto larger = [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::partial_sort(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(count_), keys.end(),
                      larger);
    for (std::size_t k = 0; k < count_; ++k) out[k] = keys[k].second;
  }
  [[nodiscard]] std::string_view name() const noexcept {
    return replacement_ ? "weighted" : "weighted-without-replacement";
  }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] bool replacement() const noexcept { return replacement_; }

 private:
  std::shared_ptr<const std::vector<double>> weights_;     // shared: copies are cheap
  std::shared_ptr<const std::vector<double>> cumulative_;  // prefix sums of weights_
  double total_ = 0.0;
  std::size_t count_ = 0;
  bool replacement_ = true;
};

/// What a distributed sampler does with the R mod world entries left over at the end of an epoch.
enum class tail {
  pad,   // every rank reads ceil(R / world); the missing entries repeat the order from its start
  drop,  // every rank reads floor(R / world); the last R mod world entries are not read
};

/// One rank's share of an epoch order of `m` entries from position `begin` (header comment).
struct rank_slice {
  std::uint64_t begin = 0;  // the epoch position the deal starts at
  std::uint64_t count = 0;  // entries this rank reads
  std::uint64_t rank = 0;
  std::uint64_t world = 1;
  std::uint64_t m = 0;  // entries in the epoch order

  /// The epoch position of this rank's k-th entry (>= m for a padding entry).
  [[nodiscard]] std::uint64_t position(std::uint64_t k) const noexcept {
    return begin + k * world + rank;
  }
  /// The index into the epoch order of this rank's k-th entry (padding wraps to the start).
  [[nodiscard]] std::uint64_t order_index(std::uint64_t k) const noexcept {
    const std::uint64_t p = position(k);
    return p < m ? p : (p - m) % m;
  }
  /// The epoch position once every rank has read `k` entries (at most m).
  [[nodiscard]] std::uint64_t position_after(std::uint64_t k) const noexcept {
    return std::min(m, begin + k * world);
  }
};

/// The share of rank `rank` of `world` of an epoch order of `m` entries, from position `begin`.
[[nodiscard]] inline rank_slice slice_of(std::uint64_t m, std::uint64_t begin, std::uint64_t rank,
                                         std::uint64_t world, tail t) noexcept {
  const std::uint64_t r = begin < m ? m - begin : 0;
  const std::uint64_t count = t == tail::pad ? (r + world - 1) / world : r / world;
  return {begin, count, rank, world, m};
}

/// S's epoch order dealt out to `world` ranks; this object reads rank `rank`'s share. All ranks
/// must use the same S, seed and batch size, and step in lockstep (header comment). The name is
/// S's: a run may resume on another world size, or on one process, from the same state.
template <class S>
requires sampler<S>
class distributed_sampler {
 public:
  distributed_sampler(S base, std::size_t rank, std::size_t world, tail t = tail::pad)
      : base_(std::move(base)), rank_(rank), world_(world), tail_(t) {
    if (world == 0 || rank >= world) {
      throw config_error("hone::data::distributed_sampler: rank " + std::to_string(rank) +
                         " of a world of " + std::to_string(world) +
                         "; the world size must be >= 1 and the rank below it");
    }
  }
  void epoch_order(std::size_t n, std::uint64_t seed, std::uint64_t epoch,
                   std::vector<std::uint64_t>& out) const {
    base_.epoch_order(n, seed, epoch, out);
  }
  [[nodiscard]] std::string_view name() const noexcept { return base_.name(); }
  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] std::size_t world() const noexcept { return world_; }
  [[nodiscard]] tail tail_policy() const noexcept { return tail_; }
  [[nodiscard]] const S& base() const noexcept { return base_; }

 private:
  S base_;
  std::size_t rank_ = 0;
  std::size_t world_ = 1;
  tail tail_ = tail::pad;
};

/// The share a sampler reads: for a distributed_sampler its rank's, else everything (rank 0 of 1).
template <class S>
[[nodiscard]] rank_slice sampler_slice(const S& s, std::uint64_t m, std::uint64_t begin) noexcept {
  if constexpr (requires {
                  s.rank();
                  s.world();
                  s.tail_policy();
                }) {
    return slice_of(m, begin, s.rank(), s.world(), s.tail_policy());
  } else {
    return slice_of(m, begin, 0, 1, tail::pad);
  }
}

}  // namespace data
HONE_NAMESPACE_END
