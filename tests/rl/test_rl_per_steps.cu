// The write batch of the GPU prioritized-replay sampler (hone/rl/cuda/per.cuh) run on the host:
// per_decide, the stable sort by slot, per_scatter, per_level and per_finish are the functions
// its kernels run for each thread, called here for every thread of every launch in launch order
// (each launch is a serial loop: within one launch no two threads write the same place, and a
// thread reads only what earlier launches wrote), with std::stable_sort standing in for
// cub::DeviceRadixSort (stable too) and a per_max fold over blocks of per_write_threads entries
// for the block reductions. The tree must hold the CPU tree's bits after the same scenarios that
// test_rl_gpu.cu runs on a device: duplicates across blocks (the last write of a slot wins),
// stale keys, invalid values, batches of a thousand blocks. Runs without a GPU (label unit).
#define BOOST_TEST_MODULE hone_rl_per_steps
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <hone/rl/cuda/per.cuh>
#include <limits>
#include <numeric>
#include <vector>

#include "per_parity.hpp"

namespace {
using hone::detail::per_write_mode;

/// The device sampler's arrays in host memory, written by its per-thread steps.
template <std::size_t A>
struct steps_side {
  hone::prioritized<A> cfg;
  hone::detail::sum_tree_layout layout;
  std::vector<float> leaves;
  std::vector<double> sums;
  std::vector<float> mins;
  std::vector<std::uint64_t> tags;
  hone::detail::per_device_scalars scalars;

  steps_side(std::size_t cap, const hone::prioritized<A>& config)
      : cfg(config),
        layout(hone::detail::sum_tree_layout::make(A, cap)),
        leaves(layout.leaves, 0.0f),
        sums(layout.entries, 0.0),
        mins(layout.entries, std::numeric_limits<float>::infinity()),
        tags(cap, hone::detail::per_empty_tag),
        scalars{0.0, std::numeric_limits<float>::infinity(),
                static_cast<float>(config.initial_priority)} {}

  hone::detail::per_device_view<A> view() {
    return {layout, leaves.data(), sums.data(), mins.data(), tags.data(), &scalars};
  }

  // device_prioritized_sampler::write, launch by launch.
  void write(const std::vector<std::uint64_t>& keys, const float* raw, per_write_mode mode) {
    const std::size_t n = keys.size();
    const auto v = view();
    constexpr std::size_t threads = hone::detail::per_write_threads;
    std::vector<std::uint64_t> slots(n);
    std::vector<std::uint32_t> positions(n);
    std::vector<float> value(n);
    std::vector<float> block_max((n + threads - 1) / threads);
    for (std::size_t b = 0; b < block_max.size(); ++b) {  // per_decide_kernel
      float m = -std::numeric_limits<float>::infinity();
      for (std::size_t i = b * threads; i < std::min(n, (b + 1) * threads); ++i) {
        m = hone::detail::per_max{}(
            m, hone::detail::per_decide(v, keys.data(), raw, i, mode, cfg.epsilon, cfg.alpha,
                                        slots.data(), positions.data(), value.data()));
      }
      block_max[b] = m;
    }
    std::vector<std::size_t> order(n);  // cub::DeviceRadixSort::SortPairs (stable)
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t x, std::size_t y) { return slots[x] < slots[y]; });
    std::vector<std::uint64_t> sorted_slots(n);
    std::vector<std::uint32_t> sorted_positions(n);
    for (std::size_t j = 0; j < n; ++j) {
      sorted_slots[j] = slots[order[j]];
      sorted_positions[j] = positions[order[j]];
    }
    for (std::size_t j = 0; j < n; ++j) {  // per_scatter_kernel
      hone::detail::per_scatter(v, sorted_slots.data(), sorted_positions.data(), value.data(),
                                keys.data(), n, mode, j);
    }
    for (std::size_t l = layout.depth; l-- > 0;) {  // per_level_kernel, bottom up
      for (std::size_t j = 0; j < n; ++j) hone::detail::per_level(v, sorted_slots.data(), l, j);
    }
    float m = -std::numeric_limits<float>::infinity();  // per_finish_kernel
    for (float b : block_max) m = hone::detail::per_max{}(m, b);
    hone::detail::per_finish(v, m, mode);
  }

  void insert(const std::vector<std::uint64_t>& keys) {
    write(keys, nullptr, per_write_mode::insert);
  }
  void update(const std::vector<std::uint64_t>& keys, const std::vector<float>& raw) {
    write(keys, raw.data(), per_write_mode::update);
  }
  [[nodiscard]] per_parity::per_tree_state state() const {
    return {std::vector<float>(leaves.begin(), leaves.begin() + layout.capacity), sums, mins, tags,
            scalars};
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(write_steps_duplicates_across_blocks_16ary) {
  per_parity::run_duplicates<16, steps_side<16>>(1000, {.alpha = 1.0, .epsilon = 0.0});
}
BOOST_AUTO_TEST_CASE(write_steps_duplicates_across_blocks_binary) {
  per_parity::run_duplicates<2, steps_side<2>>(777, {.alpha = 1.0, .epsilon = 0.0});
}
// On the host, pow is the CPU's: alpha != 1 and epsilon > 0 keep the bits too.
BOOST_AUTO_TEST_CASE(write_steps_duplicates_with_exponent_4ary) {
  per_parity::run_duplicates<4, steps_side<4>>(1500, {.alpha = 0.6, .epsilon = 1e-6});
}
BOOST_AUTO_TEST_CASE(write_steps_large_batch) {
  per_parity::run_large_batch<steps_side<16>>();
}
