// tests/rl/per_parity.hpp: the CPU reference and the write scenarios shared by the GPU
// prioritized-replay test (test_rl_gpu.cu, on a device) and the test of its write steps run on the
// host (test_rl_per_steps.cu). Include after <boost/test/unit_test.hpp>.
//
// A "side" under test offers insert(keys), update(keys, raw) (std::vector arguments) and state()
// (a per_tree_state: every array of the tree and the scalars, on the host).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <hone/rl/cuda/per.cuh>
#include <hone/rl/prioritized_sampler.hpp>
#include <hone/rl/rng.hpp>
#include <utility>
#include <vector>

namespace per_parity {

/// The CPU side: the CPU sampler plus the tags a buffer would keep.
template <std::size_t A>
struct cpu_side {
  hone::prioritized_sampler<A> sampler;
  std::vector<std::uint64_t> tags;
  cpu_side(std::size_t cap, const hone::prioritized<A>& cfg)
      : sampler(cap, cfg), tags(cap, ~std::uint64_t{0}) {}
  void insert(const std::vector<std::uint64_t>& keys) {
    for (std::uint64_t k : keys) {
      const std::size_t s = k % tags.size();
      tags[s] = k;
      sampler.insert(s, 1);
    }
  }
  // The CPU buffer's update: stale keys skipped, the rest applied in batch order.
  void update(const std::vector<std::uint64_t>& keys, const std::vector<float>& raw) {
    std::vector<std::size_t> slots;
    std::vector<float> values;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::size_t s = keys[i] % tags.size();
      if (tags[s] != keys[i]) continue;                           // stale
      if (!(raw[i] >= 0.0f) || !std::isfinite(raw[i])) continue;  // what the GPU does
      slots.push_back(s);
      values.push_back(raw[i]);
    }
    sampler.update(slots, values);
  }
};

/// Every array of a tree and its scalars, on the host.
struct per_tree_state {
  std::vector<float> leaves;  // capacity entries
  std::vector<double> sums;
  std::vector<float> mins;
  std::vector<std::uint64_t> tags;
  hone::detail::per_device_scalars scalars;
};

/// The side's tree holds the CPU tree's bits.
template <std::size_t A>
void expect_same_tree(const cpu_side<A>& cpu, const per_tree_state& s) {
  const auto& tree = cpu.sampler.tree();
  BOOST_REQUIRE_EQUAL(s.leaves.size(), tree.leaves().size());
  BOOST_REQUIRE_EQUAL(s.sums.size(), tree.sums().size());
  BOOST_REQUIRE_EQUAL(s.mins.size(), tree.mins().size());
  BOOST_TEST(std::memcmp(s.leaves.data(), tree.leaves().data(), s.leaves.size() * 4) == 0);
  BOOST_TEST(std::memcmp(s.sums.data(), tree.sums().data(), s.sums.size() * 8) == 0);
  BOOST_TEST(std::memcmp(s.mins.data(), tree.mins().data(), s.mins.size() * 4) == 0);
  BOOST_TEST((s.tags == cpu.tags));
  BOOST_TEST(s.scalars.total == tree.total());
  BOOST_TEST(s.scalars.min == tree.min());
  BOOST_TEST(s.scalars.max_priority == cpu.sampler.max_priority());
}

template <std::size_t A, class Side>
void insert_both(cpu_side<A>& cpu, Side& side, const std::vector<std::uint64_t>& keys) {
  cpu.insert(keys);
  side.insert(keys);
}
template <std::size_t A, class Side>
void update_both(cpu_side<A>& cpu, Side& side, const std::vector<std::uint64_t>& keys,
                 const std::vector<float>& raw) {
  cpu.update(keys, raw);
  side.update(keys, raw);
}

// Batches far larger than one block (256 entries) in which most slots are written many times, the
// writes of one slot spread over different blocks and not in key order: the last write of each
// slot in batch order must win, for tags (inserts) and priorities (updates), bit for bit.
template <std::size_t A, class Side>
void run_duplicates(std::size_t cap, const hone::prioritized<A>& cfg) {
  cpu_side<A> cpu(cap, cfg);
  Side side(cap, cfg);
  hone::replay_rng rng(11);
  // Inserts: 3 x cap keys in a shuffled order, so a slot's keys arrive in any order.
  std::vector<std::uint64_t> keys(3 * cap);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  for (std::size_t i = keys.size(); i-- > 1;) std::swap(keys[i], keys[rng.below(i + 1)]);
  insert_both(cpu, side, keys);
  expect_same_tree(cpu, side.state());
  for (int round = 0; round < 6; ++round) {
    // Updates: 20 x cap entries over the current keys of 40 slots (each written ~cap / 2 times)
    // and stale keys of the same slots, with distinct values (so the winner shows in the bits),
    // a zero now and then, a NaN and a negative value (ignored).
    std::vector<std::uint64_t> current(40);
    for (auto& s : current) s = rng.below(cap);
    std::vector<std::uint64_t> uk(20 * cap);
    std::vector<float> raw(uk.size());
    for (std::size_t i = 0; i < uk.size(); ++i) {
      const std::size_t slot = current[rng.below(current.size())];
      uk[i] = cpu.tags[slot] - (rng.uniform() < 0.2 ? cap : 0);  // a fifth are stale
      raw[i] = rng.uniform() < 0.05 ? 0.0f : static_cast<float>(rng.uniform() * 100.0);
    }
    raw[uk.size() - 1] = std::nanf("");
    raw[uk.size() - 2] = -1.0f;
    update_both(cpu, side, uk, raw);
    expect_same_tree(cpu, side.state());
    // A batch that rewrites 100 slots twice (the later key's tag must win), then updates of the
    // new keys in a batch of one block plus one entry.
    std::vector<std::uint64_t> ik;
    for (std::size_t k = 0; k < 100; ++k) ik.push_back(cpu.tags[k] + cap);
    for (std::size_t k = 0; k < 100; ++k) ik.push_back(cpu.tags[k] + 2 * cap);
    insert_both(cpu, side, ik);
    expect_same_tree(cpu, side.state());
    std::vector<std::uint64_t> nk(257);
    std::vector<float> nr(nk.size());
    for (std::size_t i = 0; i < nk.size(); ++i) {
      nk[i] = cpu.tags[rng.below(100)];
      nr[i] = static_cast<float>(rng.uniform());
    }
    update_both(cpu, side, nk, nr);
    expect_same_tree(cpu, side.state());
  }
}

// One batch of updates over a large tree: 3 x cap entries (cap = 100003: about 1200 blocks), every
// current key updated at least once, most several times; the inserts wrap around the capacity.
template <class Side>
void run_large_batch() {
  constexpr std::size_t cap = 100003;
  const hone::prioritized<16> cfg{.alpha = 1.0, .epsilon = 0.0};
  cpu_side<16> cpu(cap, cfg);
  Side side(cap, cfg);
  std::vector<std::uint64_t> keys(cap + 5000);  // the first 5000 slots get newer keys
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  insert_both(cpu, side, keys);
  expect_same_tree(cpu, side.state());
  hone::replay_rng rng(5);
  std::vector<std::uint64_t> uk(3 * cap);
  std::vector<float> raw(uk.size());
  for (std::size_t i = 0; i < uk.size(); ++i) {
    uk[i] = cpu.tags[i < cap ? i : rng.below(cap)];
    raw[i] = rng.uniform() < 0.05 ? 0.0f : static_cast<float>(rng.uniform() * 3.0);
  }
  update_both(cpu, side, uk, raw);
  expect_same_tree(cpu, side.state());
}

}  // namespace per_parity
