// hone/train/accumulate.hpp: gradient accumulation policies (role: accumulation).
//
//   accumulate::none       one micro-batch per step.
//   accumulate::steps<N>   exactly N micro-batches per step, each weighted 1/N (the mean).
//   accumulate::by_count   any number of micro-batches, each weighted by its sample or token count
//                          over the total count of the whole accumulated batch.
//
// by_count is the fix for the 2024 normalization bug (transformers PR #34191): when each
// micro-batch's loss is a mean over its own count, averaging those means over micro-batches of
// different sizes is wrong; the gradient of the whole batch is sum_i (count_i / total) * grad_i.
// A batch's count comes from hone::batch_traits<B>::count(b): b.count() or else b.size().
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/roles.hpp"

HONE_NAMESPACE_BEGIN

/// Customization point: how many samples (or tokens) a batch holds.
template <class B>
struct batch_traits {
  template <class U = B>
  requires requires(const U& b) {
    { b.count() } -> std::convertible_to<std::size_t>;
  }
  static std::size_t count(const U& b) { return static_cast<std::size_t>(b.count()); }
  template <class U = B>
  requires(!requires(const U& b) { b.count(); }) && requires(const U& b) {
    { b.size() } -> std::convertible_to<std::size_t>;
  }
  static std::size_t count(const U& b) { return static_cast<std::size_t>(b.size()); }
};

template <class B>
concept countable_batch = requires(const B& b) {
  { batch_traits<B>::count(b) } -> std::convertible_to<std::size_t>;
};

namespace accumulate {

struct none {
  using role = roles::accumulation;
  template <class Batch>
  std::vector<float> weights(std::span<const Batch> micro) const {
    HONE_REQUIRE(micro.size() == 1,
                 "hone::accumulate::none: a step takes exactly one micro-batch, got " +
                     std::to_string(micro.size()) +
                     "; use hone::accumulate::steps<N> or by_count to accumulate");
    return {1.0f};
  }
};

template <std::size_t N>
struct steps {
  static_assert(N >= 1, "hone::accumulate::steps<N>: N must be at least 1");
  using role = roles::accumulation;
  static constexpr std::size_t micro_batches = N;
  template <class Batch>
  std::vector<float> weights(std::span<const Batch> micro) const {
    HONE_REQUIRE(micro.size() == N, "hone::accumulate::steps<" + std::to_string(N) +
                                        ">: a step takes exactly " + std::to_string(N) +
                                        " micro-batches, got " + std::to_string(micro.size()));
    return std::vector<float>(N, 1.0f / static_cast<float>(N));
  }
};

struct by_count {
  using role = roles::accumulation;
  template <class Batch>
  std::vector<float> weights(std::span<const Batch> micro) const {
    static_assert(countable_batch<Batch>,
                  "hone::accumulate::by_count weights micro-batches by their size: give the batch "
                  "type a count() (or size()) member returning its number of samples or tokens, "
                  "or specialize hone::batch_traits<YourBatch>::count.");
    HONE_REQUIRE(!micro.empty(),
                 "hone::accumulate::by_count: a step needs at least one micro-batch");
    double total = 0;
    std::vector<float> w(micro.size());
    for (const auto& b : micro) total += static_cast<double>(batch_traits<Batch>::count(b));
    HONE_REQUIRE(total > 0,
                 "hone::accumulate::by_count: the micro-batches hold no samples (total "
                 "count 0); skip empty batches before calling step");
    for (std::size_t i = 0; i < micro.size(); ++i) {
      w[i] = static_cast<float>(static_cast<double>(batch_traits<Batch>::count(micro[i])) / total);
    }
    return w;
  }
};

}  // namespace accumulate

/// An accumulation policy gives one weight per micro-batch of a step.
template <class A, class Batch>
concept accumulation_policy = requires(const A& a, std::span<const Batch> micro) {
  requires std::same_as<typename A::role, roles::accumulation>;
  { a.template weights<Batch>(micro) } -> std::same_as<std::vector<float>>;
};

HONE_NAMESPACE_END
