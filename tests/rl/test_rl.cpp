// Tests of the replay-buffer core: transitions, the sum tree (against a linear prefix-sum
// reference), no drift, the prioritized sampler (chi-square on the sampling frequencies, weights,
// beta annealing, running max, zero priorities), generation-tagged keys, n-step returns against
// hand-computed sequences, the composed buffer (uniform and prioritized, add_batch wrap, gather),
// and save / restore through the state accessors.
#define BOOST_TEST_MODULE hone_rl
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <hone/rl/replay_buffer.hpp>
#include <hone/rl/sum_tree.hpp>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

using step = hone::transition<hone::field<"obs", float, 4>, hone::field<"action", std::int32_t>,
                              hone::field<"reward", float>, hone::field<"next_obs", float, 4>,
                              hone::field<"terminated", bool>, hone::field<"truncated", bool>,
                              hone::field<"discount", float>>;

struct user_step {
  float obs[2][2];
  std::int64_t action;
  double reward;
  std::array<float, 4> next_obs;
  std::uint8_t terminated;
  std::uint8_t truncated;
  double discount;
};
using user_transition = hone::transition<
    hone::member<"obs", &user_step::obs>, hone::member<"action", &user_step::action>,
    hone::member<"reward", &user_step::reward>, hone::member<"next_obs", &user_step::next_obs>,
    hone::member<"terminated", &user_step::terminated>,
    hone::member<"truncated", &user_step::truncated>,
    hone::member<"discount", &user_step::discount>>;

/// A record whose every field is derived from `id`, so a gathered row can be checked whole.
step::record make_step(std::uint64_t id) {
  step::record r{};
  const auto x = static_cast<float>(id);
  hone::get<"obs">(r) = {x, x + 0.25f, x + 0.5f, x + 0.75f};
  hone::get<"action">(r) = static_cast<std::int32_t>(id % 7);
  hone::get<"reward">(r) = x * 0.5f;
  hone::get<"next_obs">(r) = {x + 1, x + 1.25f, x + 1.5f, x + 1.75f};
  hone::get<"terminated">(r) = id % 3 == 0;
  hone::get<"truncated">(r) = id % 5 == 0;
  hone::get<"discount">(r) = 0.99f;
  return r;
}

/// Checks row r of a batch against make_step(id) for the id its obs encodes; returns the id.
std::uint64_t check_row(const hone::replay_batch<step>& b, std::size_t r) {
  const auto obs = b.get<"obs">();
  const auto id = static_cast<std::uint64_t>(obs[r * 4]);
  const step::record ref = make_step(id);
  const step::record got = b.row(r);
  BOOST_TEST((got == ref), "row " << r << " (id " << id << ") is torn or wrong");
  return id;
}

/// Exact-enough reference sum: Neumaier summation in long double.
long double reference_sum(std::span<const float> v) {
  long double s = 0.0L;
  long double c = 0.0L;
  for (float x : v) {
    const long double t = s + x;
    c += std::fabs(s) >= std::fabs(static_cast<long double>(x)) ? (s - t) + x : (x - t) + s;
    s = t;
  }
  return s + c;
}

float reference_min_positive(std::span<const float> v) {
  float m = std::numeric_limits<float>::infinity();
  for (float x : v) {
    if (x > 0.0f) m = std::min(m, x);
  }
  return m;
}

std::vector<float> random_priorities(std::size_t n, std::uint32_t seed, double zero_fraction) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> p(n);
  for (auto& x : p) {
    x = u(rng) < zero_fraction ? 0.0f : std::exp(8.0f * u(rng) - 4.0f);  // 0.018 .. 55
  }
  return p;
}

// Every leaf's interval [prefix before, prefix after) from a long double linear scan.
std::vector<long double> prefix_ends(std::span<const float> v) {
  std::vector<long double> e(v.size() + 1, 0.0L);
  for (std::size_t i = 0; i < v.size(); ++i) e[i + 1] = e[i] + v[i];
  return e;
}

template <std::size_t A>
void check_find_against_reference(std::size_t capacity, std::uint32_t seed) {
  const auto p = random_priorities(capacity, seed, 0.3);
  hone::sum_tree<A> tree(capacity);
  tree.assign(p);
  const auto ends = prefix_ends(p);
  BOOST_TEST(static_cast<double>(std::fabs(tree.total() - ends.back())) <=
             1e-12 * static_cast<double>(ends.back()) + 1e-300);
  BOOST_TEST(tree.min() == reference_min_positive(p));
  if (!(tree.total() > 0.0)) return;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> targets;
  for (int k = 0; k < 2000; ++k) targets.push_back(u(rng) * tree.total());
  // Boundaries, the very end and past it: still a positive leaf.
  for (std::size_t i = 0; i < std::min<std::size_t>(capacity, 200); ++i) {
    targets.push_back(static_cast<double>(ends[i]));
  }
  targets.push_back(tree.total());
  targets.push_back(std::nextafter(tree.total(), 0.0));
  targets.push_back(tree.total() * 2.0);
  targets.push_back(0.0);
  std::vector<std::size_t> batch(targets.size());
  tree.find_batch(targets, batch);
  const long double tol = 1e-9L * ends.back();
  for (std::size_t k = 0; k < targets.size(); ++k) {
    const std::size_t i = tree.find(targets[k]);
    BOOST_REQUIRE(i < capacity);
    BOOST_TEST(batch[k] == i);
    BOOST_TEST(p[i] > 0.0f, "leaf " << i << " with priority 0 was found for " << targets[k]);
    const long double t = std::min<long double>(targets[k], ends.back());
    BOOST_TEST((ends[i] <= t + tol && t <= ends[i + 1] + tol),
               "target " << targets[k] << " landed in leaf " << i << " [" << (double)ends[i] << ", "
                         << (double)ends[i + 1] << ")");
  }
}

}  // namespace

// ---- transition -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(transition_describes_fields) {
  static_assert(step::field_count == 7);
  static_assert(step::bytes == 16 + 4 + 4 + 16 + 1 + 1 + 4);
  static_assert(step::index_of<"reward">() == 2);
  static_assert(step::has<"obs"> && !step::has<"Obs">);
  static_assert(std::is_same_v<decltype(hone::get<"obs">(std::declval<step::record&>())),
                               std::array<float, 4>&>);
  using frame = hone::field<"frame", std::uint8_t, 84, 84>;
  static_assert(frame::count == 7056 && frame::rank == 2 && frame::shape[1] == 84);
  static_assert(std::is_same_v<user_transition::record, user_step>);
  static_assert(user_transition::field_at<0>::count == 4 &&
                user_transition::field_at<0>::rank == 2);
  static_assert(user_transition::bytes == 16 + 8 + 8 + 16 + 1 + 1 + 8);

  step::record r = make_step(12);
  BOOST_TEST(hone::get<"obs">(r)[1] == 12.25f);
  BOOST_TEST(r.get<"action">() == 5);
  hone::replay_batch<step> b(3);
  b.set_row(1, r);
  BOOST_TEST((b.row(1) == r));
  BOOST_TEST(b.get<"next_obs">().size() == 12u);
}

BOOST_AUTO_TEST_CASE(user_struct_round_trips_through_a_buffer) {
  hone::replay_buffer<user_transition> buffer(8);
  user_step s{};
  s.obs[1][0] = 3.5f;
  s.action = -9;
  s.reward = 0.125;
  s.next_obs = {1, 2, 3, 4};
  s.terminated = 1;
  buffer.add(s);
  hone::replay_batch<user_transition> b;
  buffer.sample(4, b);
  for (std::size_t r = 0; r < 4; ++r) {
    const user_step got = b.row(r);
    BOOST_TEST(got.obs[1][0] == 3.5f);
    BOOST_TEST(got.action == -9);
    BOOST_TEST(got.reward == 0.125);
    BOOST_TEST(got.next_obs[3] == 4.0f);
    BOOST_TEST(got.terminated == 1);
    BOOST_TEST(b.keys()[r] == 0u);
    BOOST_TEST(b.weights()[r] == 1.0f);
  }
}

// ---- sum tree -----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(sum_tree_layout_pads_every_level) {
  const auto l = hone::detail::sum_tree_layout::make(16, std::size_t{1} << 26);
  BOOST_TEST(l.depth == 6u);
  BOOST_TEST(l.size[0] == 16u);
  BOOST_TEST(l.used[0] == 4u);  // 64 entries below the top: 4 of its 16 entries are real
  BOOST_TEST(l.size[5] == (std::size_t{1} << 22));
  const auto one = hone::detail::sum_tree_layout::make(16, 1);
  BOOST_TEST(one.depth == 1u);
  BOOST_TEST(one.leaves == 16u);
  const auto bin = hone::detail::sum_tree_layout::make(2, 1000);
  BOOST_TEST(bin.depth == 9u);  // 1000 -> 500 -> 250 -> 126 -> 64 -> 32 -> 16 -> 8 -> 4 -> 2
  BOOST_CHECK_THROW(hone::sum_tree<16>(0), hone::config_error);
}

BOOST_AUTO_TEST_CASE(sum_tree_find_matches_linear_reference) {
  for (std::size_t cap : {1u, 2u, 3u, 15u, 16u, 17u, 255u, 256u, 257u, 1000u, 4097u, 70001u}) {
    check_find_against_reference<2>(cap, static_cast<std::uint32_t>(cap));
    check_find_against_reference<4>(cap, static_cast<std::uint32_t>(cap) + 1);
    check_find_against_reference<8>(cap, static_cast<std::uint32_t>(cap) + 2);
    check_find_against_reference<16>(cap, static_cast<std::uint32_t>(cap) + 3);
    check_find_against_reference<64>(cap, static_cast<std::uint32_t>(cap) + 4);
  }
}

// node_ends + child_from_ends (what find_batch runs on levels it shares between walks) against
// find_child (what find() runs): the same child and the same remainder, bit for bit, on nodes
// with zeros, tiny and huge children, for targets inside, on the ends, at and past the total.
template <std::size_t A, class T, bool Wide = false>
long shared_ends_mismatches(std::uint32_t seed) {
  const hone::detail::wide_tag<Wide> wide{};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  long mismatches = 0;
  for (int t = 0; t < 20000; ++t) {
    T c[A];
    for (std::size_t i = 0; i < A; ++i) {
      const double r = u01(rng);
      c[i] = static_cast<T>(r < 0.3 ? 0.0 : u01(rng) * (r < 0.5 ? 1e-30 : r < 0.6 ? 1e30 : 1.0));
    }
    double ends[A + 1];
    hone::detail::node_ends<A>(c, ends, wide);
    double scalar_ends[A + 1];
    hone::detail::node_ends_scalar<A>(c, scalar_ends);
    mismatches += std::memcmp(ends, scalar_ends, sizeof ends) != 0 ? 1 : 0;
    const double total = ends[A];
    if (!(total > 0.0)) continue;
    const std::size_t j = static_cast<std::size_t>(u01(rng) * static_cast<double>(A + 1));
    for (const double target :
         {u01(rng) * total, ends[j], std::nextafter(ends[j], 0.0), total, total * 1.5, 0.0}) {
      double u1 = target;
      double u2 = target;
      double u3 = target;
      const std::size_t a = hone::detail::find_child_scalar<A>(c, u1);
      const std::size_t b = hone::detail::child_from_ends<A>(c, ends, u2, wide);
      const std::size_t d = hone::detail::child_from_ends_scalar<A>(c, scalar_ends, u3);
      mismatches += (a != b || a != d || std::memcmp(&u1, &u2, 8) != 0 ||
                     std::memcmp(&u1, &u3, 8) != 0 || !(c[a] > T(0)))
                        ? 1
                        : 0;
    }
  }
  return mismatches;
}

BOOST_AUTO_TEST_CASE(sum_tree_shared_node_ends_match_the_in_node_search) {
  BOOST_TEST((shared_ends_mismatches<2, double>(1)) == 0);
  BOOST_TEST((shared_ends_mismatches<4, float>(2)) == 0);
  BOOST_TEST((shared_ends_mismatches<16, double>(3)) == 0);
  BOOST_TEST((shared_ends_mismatches<16, float>(4)) == 0);
  BOOST_TEST((shared_ends_mismatches<64, double>(5)) == 0);
  // The AVX-512 twins the tree runs when hone::active_isa() is avx512 (16 children).
  if (hone::isa_supported(hone::isa::avx512)) {
    BOOST_TEST((shared_ends_mismatches<16, double, true>(3)) == 0);
    BOOST_TEST((shared_ends_mismatches<16, float, true>(4)) == 0);
  }
}

// A stratified batch (sorted targets, hundreds of walks through each top node: the levels
// find_batch shares) against find() walk by walk, over a tree with zeros and tiny priorities.
template <std::size_t A>
void check_stratified_batch(std::size_t capacity, std::size_t batch, std::uint32_t seed) {
  const auto p = random_priorities(capacity, seed, 0.3);
  hone::sum_tree<A> tree(capacity);
  tree.assign(p);
  if (!(tree.total() > 0.0)) return;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::vector<double> targets(batch);
  for (std::size_t k = 0; k < batch; ++k) {
    targets[k] = hone::detail::stratified_target(k, u01(rng), tree.total(), batch);
  }
  targets.back() = tree.total();  // the end: still a positive leaf
  std::vector<std::size_t> leaves(batch);
  tree.find_batch(targets, leaves);
  for (std::size_t k = 0; k < batch; ++k) {
    BOOST_REQUIRE(leaves[k] == tree.find(targets[k]));
    BOOST_REQUIRE(p[leaves[k]] > 0.0f);
  }
}

BOOST_AUTO_TEST_CASE(sum_tree_stratified_batch_matches_single_walks) {
  for (std::size_t cap : {16u, 300u, 4096u, 65537u, 1u << 20}) {
    for (std::size_t batch : {1u, 7u, 64u, 256u, 1000u}) {
      check_stratified_batch<2>(cap, batch, static_cast<std::uint32_t>(cap + batch));
      check_stratified_batch<16>(cap, batch, static_cast<std::uint32_t>(cap + batch + 1));
      check_stratified_batch<64>(cap, batch, static_cast<std::uint32_t>(cap + batch + 2));
    }
  }
}

BOOST_AUTO_TEST_CASE(sum_tree_tiny_and_huge_priorities_never_pick_zero) {
  // Priorities spanning 60 orders of magnitude next to zeros: the hard case for rounding.
  std::vector<float> p(5000, 0.0f);
  std::mt19937 rng(7);
  for (std::size_t i = 0; i < p.size(); i += 3)
    p[i] = std::ldexp(1.0f, static_cast<int>(rng() % 200) - 100);
  hone::sum_tree<16> t16(p.size());
  hone::sum_tree<2> t2(p.size());
  t16.assign(p);
  t2.assign(p);
  std::mt19937_64 r64(8);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int k = 0; k < 100000; ++k) {
    const double x = u(r64);
    BOOST_REQUIRE(p[t16.find(x * t16.total())] > 0.0f);
    BOOST_REQUIRE(p[t2.find(x * t2.total())] > 0.0f);
  }
}

BOOST_AUTO_TEST_CASE(sum_tree_set_fill_and_batch_agree_with_rebuild) {
  constexpr std::size_t n = 100003;
  hone::sum_tree<16> a(n);
  hone::sum_tree<16> b(n);
  std::mt19937 rng(11);
  std::vector<float> values(n, 0.0f);
  a.fill(5, 40000, 2.5f);
  std::fill(values.begin() + 5, values.begin() + 40005, 2.5f);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::size_t> idx(700);
    std::vector<float> v(idx.size());
    for (std::size_t k = 0; k < idx.size(); ++k) {
      idx[k] = rng() % n;
      v[k] = (rng() % 4 == 0) ? 0.0f : static_cast<float>(rng() % 1000) * 0.01f;
    }
    idx[3] = idx[2];  // a repeated index keeps its last value
    if (round % 2 == 0) {
      a.set_batch(idx, v);
    } else {
      for (std::size_t k = 0; k < idx.size(); ++k) a.set(idx[k], v[k]);
    }
    for (std::size_t k = 0; k < idx.size(); ++k) values[idx[k]] = v[k];
  }
  b.assign(values);
  // Recomputed-from-children sums are a function of the leaves only: bit-identical.
  BOOST_TEST(std::equal(a.leaves().begin(), a.leaves().end(), b.leaves().begin()));
  BOOST_TEST(std::memcmp(a.sums().data(), b.sums().data(), a.sums().size_bytes()) == 0);
  BOOST_TEST(std::memcmp(a.mins().data(), b.mins().data(), a.mins().size_bytes()) == 0);
  BOOST_TEST(a.total() == b.total());
  BOOST_TEST(a.min() == reference_min_positive(values));
}

// Drift: 2 million random updates of a 65536-leaf tree (a few seconds in a Debug build at most).
// Every sum is recomputed from its children, so the tree after k updates is bit-identical to a
// tree built from scratch over the same leaves, for every k: the error of the total is the error
// of one pairwise summation (here < 1e-13 relative) and cannot grow with k. That is what makes the
// extrapolation to 1e8 updates exact, not statistical; the slow-labelled test_rl_drift_slow runs
// the full 1e8 to show it.
BOOST_AUTO_TEST_CASE(sum_tree_does_not_drift) {
  constexpr std::size_t n = 65536;
  hone::sum_tree<16> tree(n);
  hone::sum_tree<2> binary(n);
  std::vector<float> values(n, 1.0f);
  tree.assign(values);
  binary.assign(values);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<std::size_t> idx(256);
  std::vector<float> v(256);
  double worst = 0.0;
  for (int batch = 1; batch <= 8000; ++batch) {
    for (std::size_t k = 0; k < idx.size(); ++k) {
      idx[k] = rng() % n;
      // Mixed magnitudes make a delta-updated float or double tree drift quickly.
      v[k] = u(rng) < 0.5f ? u(rng) * 1e-3f : u(rng) * 1e3f;
    }
    tree.set_batch(idx, v);
    binary.set_batch(idx, v);
    for (std::size_t k = 0; k < idx.size(); ++k) values[idx[k]] = v[k];
    if (batch % 2000 == 0) {
      const long double ref = reference_sum(values);
      const double e16 = static_cast<double>(std::fabs(tree.total() - ref) / ref);
      const double e2 = static_cast<double>(std::fabs(binary.total() - ref) / ref);
      worst = std::max({worst, e16, e2});
      hone::sum_tree<16> fresh(n);
      fresh.assign(values);
      BOOST_TEST(tree.total() == fresh.total());
      BOOST_TEST(std::memcmp(tree.sums().data(), fresh.sums().data(), tree.sums().size_bytes()) ==
                 0);
    }
  }
  BOOST_TEST_MESSAGE("worst relative error of the total after 2.048e6 updates: " << worst);
  BOOST_TEST(worst < 1e-12);
}

// ---- prioritized sampler ---------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(prioritized_frequencies_follow_priorities_chi_square) {
  constexpr std::size_t n = 500;
  using buffer_t = hone::replay_buffer<step, hone::prioritized<16>>;
  buffer_t buffer(n, hone::prioritized<16>{.alpha = 1.0, .epsilon = 0.0});
  for (std::uint64_t i = 0; i < n; ++i) buffer.add(make_step(i));
  // Priorities 1..20 and a block of zeros.
  std::vector<std::uint64_t> keys(n);
  std::vector<float> prio(n);
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = i;
    prio[i] = (i >= 100 && i < 150) ? 0.0f : static_cast<float>(1 + i % 20);
  }
  BOOST_TEST(buffer.update_priorities(keys, prio) == n);
  double total = 0.0;
  for (float p : prio) total += p;
  std::vector<double> count(n, 0.0);
  hone::replay_batch<step> b;
  constexpr int calls = 800;
  constexpr std::size_t batch = 250;
  for (int c = 0; c < calls; ++c) {
    buffer.sample(batch, b);
    for (std::size_t r = 0; r < batch; ++r) {
      const std::uint64_t id = check_row(b, r);
      BOOST_REQUIRE(prio[id] > 0.0f);
      BOOST_REQUIRE(b.keys()[r] == id);
      count[id] += 1.0;
    }
  }
  const double draws = static_cast<double>(calls) * batch;
  double chi2 = 0.0;
  std::size_t df = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (prio[i] == 0.0f) {
      BOOST_TEST(count[i] == 0.0);
      continue;
    }
    const double expected = draws * prio[i] / total;
    chi2 += (count[i] - expected) * (count[i] - expected) / expected;
    ++df;
  }
  --df;
  // Stratified draws are less variable than independent ones: the statistic sits below df, and
  // a sampler that ignores priorities would be off by orders of magnitude.
  BOOST_TEST_MESSAGE("chi-square " << chi2 << " with " << df << " degrees of freedom");
  BOOST_TEST(chi2 < static_cast<double>(df) + 6.0 * std::sqrt(2.0 * static_cast<double>(df)));
}

BOOST_AUTO_TEST_CASE(prioritized_weights_beta_annealing_and_running_max) {
  hone::prioritized<4> cfg{
      .alpha = 0.5, .beta = 0.4, .beta_final = 1.0, .beta_steps = 10, .epsilon = 0.01};
  hone::replay_buffer<step, hone::prioritized<4>> buffer(64, cfg);
  for (std::uint64_t i = 0; i < 10; ++i) buffer.add(make_step(i));
  // New items enter at the running maximum (initially 1).
  for (std::size_t s = 0; s < 10; ++s) BOOST_TEST(buffer.priorities()[s] == 1.0f);
  const std::vector<std::uint64_t> keys{0, 1, 2};
  const std::vector<float> raw{3.0f, 0.0f, 8.99f};
  buffer.update_priorities(keys, raw);
  BOOST_TEST(buffer.priorities()[0] == static_cast<float>(std::pow(3.01, 0.5)));
  BOOST_TEST(buffer.priorities()[1] == static_cast<float>(std::pow(0.01, 0.5)));
  BOOST_TEST(buffer.priorities()[2] == 3.0f);
  BOOST_TEST(buffer.sampler().max_priority() == 3.0f);
  buffer.add(make_step(10));
  BOOST_TEST(buffer.priorities()[10] == 3.0f);

  hone::replay_batch<step> b;
  for (int call = 0; call < 15; ++call) {
    const double beta = buffer.sampler().beta();
    BOOST_TEST(beta == 0.4 + 0.6 * std::min(1.0, call / 10.0), boost::test_tools::tolerance(1e-12));
    buffer.sample(32, b);
    const double pmin = std::pow(0.01, 0.5);
    for (std::size_t r = 0; r < b.size(); ++r) {
      const double p = buffer.priorities()[b.slots()[r]];
      const double w = std::pow(p / static_cast<float>(pmin), -beta);
      BOOST_TEST(b.weights()[r] == w, boost::test_tools::tolerance(1e-5));
      BOOST_TEST(b.weights()[r] <= 1.0f);
    }
  }
  BOOST_TEST(buffer.sampler().beta() == 1.0);
}

BOOST_AUTO_TEST_CASE(prioritized_zero_priority_items_are_never_sampled) {
  hone::replay_buffer<step, hone::prioritized<16>> buffer(
      1000, hone::prioritized<16>{.alpha = 1.0, .epsilon = 0.0});
  for (std::uint64_t i = 0; i < 1000; ++i) buffer.add(make_step(i));
  std::vector<std::uint64_t> keys;
  std::vector<float> prio;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    keys.push_back(i);
    prio.push_back(i % 10 == 3 ? 1e-30f : 0.0f);  // tiny positive next to zeros
  }
  buffer.update_priorities(keys, prio);
  hone::replay_batch<step> b;
  for (int c = 0; c < 400; ++c) {
    buffer.sample(256, b);
    for (std::size_t r = 0; r < b.size(); ++r) BOOST_REQUIRE(b.keys()[r] % 10 == 3);
  }
  std::fill(prio.begin(), prio.end(), 0.0f);
  buffer.update_priorities(keys, prio);
  BOOST_CHECK_THROW(buffer.sample(1, b), hone::error);
}

BOOST_AUTO_TEST_CASE(prioritized_rejects_bad_priorities_and_applies_none) {
  hone::replay_buffer<step, hone::prioritized<>> buffer(16);
  for (std::uint64_t i = 0; i < 4; ++i) buffer.add(make_step(i));
  const std::vector<std::uint64_t> keys{0, 1, 2};
  BOOST_CHECK_THROW(buffer.update_priorities(keys, std::vector<float>{0.5f, std::nanf(""), 1.0f}),
                    hone::config_error);
  BOOST_CHECK_THROW(buffer.update_priorities(keys, std::vector<float>{0.5f, -1.0f, 1.0f}),
                    hone::config_error);
  BOOST_CHECK_THROW(buffer.update_priorities(keys, std::vector<float>{0.5f}), hone::config_error);
  BOOST_TEST(buffer.priorities()[0] == 1.0f);  // nothing applied
  BOOST_CHECK_THROW(
      (hone::replay_buffer<step, hone::prioritized<>>(4, hone::prioritized<>{.alpha = -1.0})),
      hone::config_error);
}

// ---- keys (generation tags) -----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(updates_for_overwritten_slots_are_ignored) {
  constexpr std::size_t cap = 8;
  hone::replay_buffer<step, hone::prioritized<>> buffer(
      cap, hone::prioritized<>{.alpha = 1.0, .epsilon = 0.0});
  for (std::uint64_t i = 0; i < cap; ++i) buffer.add(make_step(i));
  hone::replay_batch<step> b;
  buffer.sample(16, b);
  const std::vector<std::uint64_t> old_keys(b.keys().begin(), b.keys().end());
  for (std::uint64_t k : old_keys) BOOST_TEST(buffer.contains(k));
  // Overwrite slots 0..4 (keys 8..12); the old keys of those slots are now stale.
  for (std::uint64_t i = cap; i < cap + 5; ++i) buffer.add(make_step(i));
  const std::vector<float> prio(old_keys.size(), 7.0f);
  std::size_t expected = 0;
  for (std::uint64_t k : old_keys) expected += k >= 5 ? 1 : 0;
  BOOST_TEST(buffer.update_priorities(old_keys, prio) == expected);
  for (std::size_t s = 0; s < cap; ++s) {
    const bool updated = s >= 5 && std::find(old_keys.begin(), old_keys.end(), s) != old_keys.end();
    BOOST_TEST(buffer.priorities()[s] == (updated ? 7.0f : 1.0f), "slot " << s);
  }
  BOOST_TEST(!buffer.contains(0));
  BOOST_TEST(buffer.contains(12));
  BOOST_TEST(!buffer.contains(13));  // not written yet
  // Keys come back with the sample: slot s holds key s + 8 for s < 5.
  buffer.sample(64, b);
  for (std::size_t r = 0; r < b.size(); ++r) {
    const std::size_t s = b.slots()[r];
    BOOST_TEST(b.keys()[r] == (s < 5 ? s + cap : s));
    BOOST_TEST(check_row(b, r) == b.keys()[r]);
  }
}

// ---- n-step returns -----------------------------------------------------------------------------

namespace {
struct emitted {
  float obs, reward, next_obs, discount;
  bool terminated, truncated;
};
step::record env_step(float t, float reward, bool terminated, bool truncated) {
  step::record r{};
  hone::get<"obs">(r) = {t, 0, 0, 0};
  hone::get<"action">(r) = static_cast<std::int32_t>(t);
  hone::get<"reward">(r) = reward;
  hone::get<"next_obs">(r) = {t + 1, 0, 0, 0};
  hone::get<"terminated">(r) = terminated;
  hone::get<"truncated">(r) = truncated;
  hone::get<"discount">(r) = -1.0f;  // overwritten by the window
  return r;
}
}  // namespace

BOOST_AUTO_TEST_CASE(n_step_returns_respect_terminated_and_truncated) {
  hone::n_step_window<step, hone::n_step<3>> w(hone::n_step<3>{.gamma = 0.5});
  std::vector<emitted> out;
  const auto emit = [&](const step::record& r) {
    BOOST_TEST(hone::get<"action">(r) == static_cast<std::int32_t>(hone::get<"obs">(r)[0]));
    out.push_back({hone::get<"obs">(r)[0], hone::get<"reward">(r), hone::get<"next_obs">(r)[0],
                   hone::get<"discount">(r), hone::get<"terminated">(r),
                   hone::get<"truncated">(r)});
  };
  // Episode A: steps 0..4, rewards 1, 2, 3, 4, 5, terminated at step 4.
  for (int t = 0; t < 5; ++t) w.push(env_step(float(t), float(t + 1), t == 4, false), emit);
  // Episode B: steps 10..11, rewards 8, 16, truncated (time limit) at step 11.
  w.push(env_step(10, 8, false, false), emit);
  w.push(env_step(11, 16, false, true), emit);
  // Episode C: steps 20..23, rewards 1 each, stream stops (flush) without an episode end.
  for (int t = 20; t < 24; ++t) w.push(env_step(float(t), 1, false, false), emit);
  BOOST_TEST(w.pending() == 2u);
  w.flush(emit);
  BOOST_TEST(w.pending() == 0u);

  // Hand-computed: gamma = 0.5.
  const std::vector<emitted> expected{
      // obs, reward,                next_obs, discount, terminated, truncated
      {0, 1 + 0.5f * 2 + 0.25f * 3, 3, 0.125f, false, false},  // full window 0..2
      {1, 2 + 0.5f * 3 + 0.25f * 4, 4, 0.125f, false, false},  // 1..3
      {2, 3 + 0.5f * 4 + 0.25f * 5, 5, 0.125f, true, false},   // 2..4 ends terminal
      {3, 4 + 0.5f * 5, 5, 0.25f, true, false},                // 3..4: 2 steps, terminal
      {4, 5, 5, 0.5f, true, false},                            // 4: 1 step, terminal
      {10, 8 + 0.5f * 16, 12, 0.25f, false, true},             // 10..11 truncated: gamma^2
      {11, 16, 12, 0.5f, false, true},                         // 11 truncated: gamma^1
      {20, 1 + 0.5f + 0.25f, 23, 0.125f, false, false},        // 20..22
      {21, 1 + 0.5f + 0.25f, 24, 0.125f, false, false},        // 21..23
      {22, 1 + 0.5f, 24, 0.25f, false, false},                 // flushed: 22..23
      {23, 1, 24, 0.5f, false, false},                         // flushed: 23
  };
  BOOST_TEST_REQUIRE(out.size() == expected.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    BOOST_TEST_CONTEXT("item " << i) {
      BOOST_TEST(out[i].obs == expected[i].obs);
      BOOST_TEST(out[i].reward == expected[i].reward);
      BOOST_TEST(out[i].next_obs == expected[i].next_obs);
      BOOST_TEST(out[i].discount == expected[i].discount);
      BOOST_TEST(out[i].terminated == expected[i].terminated);
      BOOST_TEST(out[i].truncated == expected[i].truncated);
    }
  }
  // reset() drops pending steps.
  w.push(env_step(30, 1, false, false), emit);
  w.reset();
  BOOST_TEST(w.pending() == 0u);
}

BOOST_AUTO_TEST_CASE(n_step_buffer_and_custom_names) {
  using custom = hone::transition<hone::field<"o", float>, hone::field<"r", double>,
                                  hone::field<"next_o", float>, hone::field<"done", std::uint8_t>,
                                  hone::field<"timeout", bool>, hone::field<"g", double>>;
  using policy = hone::n_step<2, "r", "done", "timeout", "g">;
  hone::replay_buffer<custom, policy> buffer(16, policy{.gamma = 0.9});
  for (int t = 0; t < 3; ++t) {
    custom::record r{};
    hone::get<"o">(r) = float(t);
    hone::get<"r">(r) = 1.0;
    hone::get<"next_o">(r) = float(t + 1);
    hone::get<"done">(r) = t == 2 ? 1 : 0;
    buffer.add(r);
  }
  BOOST_TEST(buffer.size() == 3u);  // windows 0..1, 1..2 (terminal), 2 (terminal)
  hone::replay_batch<custom> b;
  buffer.sample(64, b);
  for (std::size_t r = 0; r < b.size(); ++r) {
    const float o = b.get<"o">()[r];
    const double ret = b.get<"r">()[r];
    const double g = b.get<"g">()[r];
    if (o == 0.0f) {
      BOOST_TEST(ret == 1.9, boost::test_tools::tolerance(1e-12));
      BOOST_TEST(g == 0.81, boost::test_tools::tolerance(1e-12));
      BOOST_TEST(b.get<"next_o">()[r] == 2.0f);
      BOOST_TEST(b.get<"done">()[r] == 0);
    } else if (o == 1.0f) {
      BOOST_TEST(ret == 1.9, boost::test_tools::tolerance(1e-12));
      BOOST_TEST(b.get<"next_o">()[r] == 3.0f);
      BOOST_TEST(b.get<"done">()[r] == 1);
    } else {
      BOOST_TEST(ret == 1.0);
      BOOST_TEST(g == 0.9, boost::test_tools::tolerance(1e-12));
      BOOST_TEST(b.get<"done">()[r] == 1);
    }
  }
}

// ---- the composed buffer ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(uniform_buffer_samples_uniformly_and_gathers_whole_rows) {
  constexpr std::size_t cap = 300;
  hone::replay_buffer<step> buffer(cap);
  BOOST_TEST(buffer.empty());
  hone::replay_batch<step> b;
  BOOST_CHECK_THROW(buffer.sample(4, b), hone::error);
  for (std::uint64_t i = 0; i < 1000; ++i) buffer.add(make_step(i));  // wraps three times
  BOOST_TEST(buffer.size() == cap);
  BOOST_TEST(buffer.total_added() == 1000u);
  std::vector<double> count(cap, 0.0);
  constexpr int calls = 400;
  for (int c = 0; c < calls; ++c) {
    buffer.sample(256, b);
    for (std::size_t r = 0; r < b.size(); ++r) {
      const std::uint64_t id = check_row(b, r);
      BOOST_REQUIRE(id >= 1000 - cap);
      BOOST_REQUIRE(b.keys()[r] == id);
      BOOST_REQUIRE(b.slots()[r] == id % cap);
      BOOST_REQUIRE(b.weights()[r] == 1.0f);
      count[id % cap] += 1.0;
    }
  }
  const double expected = calls * 256.0 / cap;
  double chi2 = 0.0;
  for (double c : count) chi2 += (c - expected) * (c - expected) / expected;
  const double df = cap - 1.0;
  BOOST_TEST(chi2 < df + 6.0 * std::sqrt(2.0 * df));
  BOOST_TEST(chi2 > df - 6.0 * std::sqrt(2.0 * df));  // independent draws: chi2 ~ df
}

BOOST_AUTO_TEST_CASE(add_batch_wraps_and_matches_single_adds) {
  constexpr std::size_t cap = 100;
  hone::replay_buffer<step, hone::prioritized<>> one(cap);
  hone::replay_buffer<step, hone::prioritized<>> many(cap);
  std::uint64_t id = 0;
  for (std::size_t n : {30u, 50u, 45u, 250u, 7u}) {
    hone::replay_batch<step> in(n);
    for (std::size_t r = 0; r < n; ++r) {
      in.set_row(r, make_step(id));
      one.add(make_step(id));
      ++id;
    }
    many.add_batch(in);
  }
  BOOST_TEST(many.total_added() == id);
  BOOST_TEST(one.state().written == many.state().written);
  BOOST_TEST(
      std::equal(one.priorities().begin(), one.priorities().end(), many.priorities().begin()));
  one.seed(5);
  many.seed(5);
  hone::replay_batch<step> a;
  hone::replay_batch<step> b;
  one.sample(200, a);
  many.sample(200, b);
  for (std::size_t r = 0; r < 200; ++r) {
    BOOST_REQUIRE(a.keys()[r] == b.keys()[r]);
    BOOST_REQUIRE(check_row(b, r) == b.keys()[r]);
    BOOST_REQUIRE(b.keys()[r] >= id - cap);
  }
}

BOOST_AUTO_TEST_CASE(save_and_restore_continue_the_same_samples) {
  constexpr std::size_t cap = 1000;
  // Columns named explicitly: for_each_column needs one array per field.
  using buffer_t = hone::replay_buffer<step, hone::ring_storage, hone::prioritized<16>>;
  buffer_t a(cap, hone::ring_storage{}, hone::prioritized<16>{.beta_steps = 50});
  a.seed(99);
  hone::replay_batch<step> b;
  std::mt19937 rng(4);
  for (std::uint64_t i = 0; i < 2500; ++i) {
    a.add(make_step(i));
    if (i % 100 == 99) {
      a.sample(64, b);
      std::vector<float> p(b.size());
      for (auto& x : p) x = static_cast<float>(rng() % 100) * 0.1f;
      a.update_priorities(b.keys(), p);
    }
  }
  // "Save": the state, the priorities and the column bytes.
  const hone::replay_state state = a.state();
  const std::vector<float> priorities(a.priorities().begin(), a.priorities().end());
  std::map<std::string, std::vector<std::byte>> columns;
  a.for_each_column([&](std::string_view name, std::span<std::byte> bytes) {
    columns[std::string(name)].assign(bytes.begin(), bytes.end());
  });
  BOOST_TEST(columns.size() == step::field_count);
  // "Restore" into a fresh buffer.
  buffer_t c(cap, hone::ring_storage{}, hone::prioritized<16>{.beta_steps = 50});
  c.for_each_column([&](std::string_view name, std::span<std::byte> bytes) {
    const auto& saved = columns.at(std::string(name));
    BOOST_REQUIRE(saved.size() == bytes.size());
    std::copy(saved.begin(), saved.end(), bytes.begin());
  });
  c.restore(state, priorities);
  BOOST_TEST(c.total_added() == a.total_added());
  BOOST_TEST(c.sampler().beta() == a.sampler().beta());
  BOOST_TEST(c.sampler().tree().total() == a.sampler().tree().total());
  hone::replay_batch<step> x;
  hone::replay_batch<step> y;
  for (int k = 0; k < 5; ++k) {
    a.sample(128, x);
    c.sample(128, y);
    for (std::size_t r = 0; r < 128; ++r) {
      BOOST_REQUIRE(x.keys()[r] == y.keys()[r]);
      BOOST_REQUIRE(x.weights()[r] == y.weights()[r]);
      BOOST_REQUIRE((x.row(r) == y.row(r)));
    }
    a.add(make_step(3000 + static_cast<std::uint64_t>(k)));
    c.add(make_step(3000 + static_cast<std::uint64_t>(k)));
  }
  BOOST_CHECK_THROW(c.restore(state, {}), hone::config_error);
}
