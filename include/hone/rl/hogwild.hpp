// hone/rl/hogwild.hpp: HOGWILD! (Niu, Recht, Re, Wright 2011): lock-free parallel SGD on shared
// CPU parameters. Workers read the parameters, compute a sample's gradient and write their update
// back without any lock; an update may be overwritten by a concurrent one (a "lost update"), which
// the analysis shows costs little when updates are sparse or small.
//
// Race-free in the C++ sense: every access to the shared parameters during a run goes through
// std::atomic_ref<float> with memory_order_relaxed (hogwild_params::load/store/add), so the program
// has no data race (no undefined behaviour, ThreadSanitizer-clean), yet a relaxed load or store of
// an aligned float compiles to the same plain mov a racy access would: no lock prefix, no fence.
// hogwild_params::atomic_add is the variant without lost updates (a relaxed CAS loop, slower under
// contention). Between runs the parameters are ordinary floats again: the end of hogwild_run
// happens-before its return (oneTBB joins its workers).
//
// hogwild_run(params, n, step, options) calls step(sample, view) once per sample per epoch, the
// samples of an epoch shuffled (seeded: options.seed, epoch) and split over the oneTBB workers of
// the caller's arena (options.threads > 0 runs it in an arena of that many threads). step may run
// concurrently with itself: per-worker scratch belongs in thread_local storage or in the step.
// serial_run is the same loop in sample order on the calling thread, the reference a HOGWILD! run
// is compared against (same samples, same epochs).
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN

static_assert(std::atomic_ref<float>::required_alignment == alignof(float),
              "hone::hogwild needs atomic_ref<float> on plainly aligned floats");

/// The shared parameters as HOGWILD! workers see them: relaxed atomic accesses only.
class hogwild_params {
 public:
  explicit hogwild_params(std::span<float> params) noexcept : p_(params) {}

  [[nodiscard]] std::size_t size() const noexcept { return p_.size(); }
  [[nodiscard]] float load(std::size_t i) const noexcept {
    return std::atomic_ref<float>(p_[i]).load(std::memory_order_relaxed);
  }
  void store(std::size_t i, float v) const noexcept {
    std::atomic_ref<float>(p_[i]).store(v, std::memory_order_relaxed);
  }
  /// p[i] += delta as a relaxed load then a relaxed store: HOGWILD!'s update (a concurrent add to
  /// the same element may be lost).
  void add(std::size_t i, float delta) const noexcept { store(i, load(i) + delta); }
  /// p[i] += delta with no lost update (relaxed read-modify-write).
  void atomic_add(std::size_t i, float delta) const noexcept {
    std::atomic_ref<float>(p_[i]).fetch_add(delta, std::memory_order_relaxed);
  }
  /// Copies the parameters (relaxed loads) into `out` (out.size() == size()).
  void snapshot(std::span<float> out) const noexcept {
    for (std::size_t i = 0; i < p_.size() && i < out.size(); ++i) out[i] = load(i);
  }

 private:
  std::span<float> p_;
};

struct hogwild_options {
  std::size_t epochs = 1;
  /// Samples per oneTBB task.
  std::size_t grain = 64;
  /// Shuffles each epoch's sample order (seeded by seed and the epoch number).
  bool shuffle = true;
  std::uint64_t seed = 1;
  /// Worker threads (0: the caller's arena).
  std::size_t threads = 0;
};

namespace detail {
inline void hogwild_order(std::vector<std::size_t>& order, std::size_t epoch,
                          const hogwild_options& o) {
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (o.shuffle) {
    std::mt19937_64 g(o.seed * 0x9E3779B97F4A7C15ULL + epoch);
    std::shuffle(order.begin(), order.end(), g);
  }
}
}  // namespace detail

/// HOGWILD!: step(sample, hogwild_params) for every sample of every epoch, in parallel, lock-free.
template <class Step>
void hogwild_run(std::span<float> params, std::size_t n_samples, Step&& step,
                 const hogwild_options& options = {}) {
  HONE_REQUIRE(options.grain > 0, "hone::hogwild_run: the grain must be positive");
  const hogwild_params view(params);
  std::vector<std::size_t> order(n_samples);
  auto body = [&] {
    for (std::size_t e = 0; e < options.epochs; ++e) {
      detail::hogwild_order(order, e, options);
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n_samples, options.grain),
                        [&](const tbb::blocked_range<std::size_t>& r) {
                          for (std::size_t i = r.begin(); i != r.end(); ++i) step(order[i], view);
                        });
    }
  };
  if (options.threads > 0) {
    tbb::task_arena arena(static_cast<int>(options.threads));
    arena.execute(body);
  } else {
    body();
  }
}

/// The serial reference: the same epochs and per-epoch orders on the calling thread.
template <class Step>
void serial_run(std::span<float> params, std::size_t n_samples, Step&& step,
                const hogwild_options& options = {}) {
  const hogwild_params view(params);
  std::vector<std::size_t> order(n_samples);
  for (std::size_t e = 0; e < options.epochs; ++e) {
    detail::hogwild_order(order, e, options);
    for (std::size_t i = 0; i < n_samples; ++i) step(order[i], view);
  }
}

HONE_NAMESPACE_END
