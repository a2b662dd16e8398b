// Tests of hone/data/sampler.hpp: each sampler's epoch order against what it must be (the
// identity; a permutation whose positions are uniform over many epochs; draw frequencies against
// the weights by a chi-square bound; the without-replacement law of the first draw), orders as pure
// functions of (seed, epoch), and the distributed deal: for every (size, position, world) the
// ranks' shares are disjoint and cover exactly [position, size), and a run that changes its world
// size mid-epoch reads every entry once.
#define BOOST_TEST_MODULE hone_data_sampler
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <hone/data.hpp>

#include "loader_common.hpp"

namespace data = hone::data;
using loader_test::message_of;
using order_t = std::vector<std::uint64_t>;

namespace {

template <class S>
order_t order_of(const S& s, std::size_t n, std::uint64_t seed, std::uint64_t epoch) {
  order_t out;
  s.epoch_order(n, seed, epoch, out);
  return out;
}

bool is_permutation_of_iota(order_t o) {
  std::sort(o.begin(), o.end());
  for (std::size_t i = 0; i < o.size(); ++i) {
    if (o[i] != i) return false;
  }
  return true;
}

// Chi-square statistic of observed counts against expected probabilities times `total`.
double chi_square(const std::vector<double>& observed, const std::vector<double>& p, double total) {
  double x = 0.0;
  for (std::size_t i = 0; i < observed.size(); ++i) {
    const double e = p[i] * total;
    if (e > 0) x += (observed[i] - e) * (observed[i] - e) / e;
  }
  return x;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_samplers_satisfy_the_concept) {
  static_assert(data::check_sampler<data::sequential_sampler>());
  static_assert(data::check_sampler<data::shuffled_sampler>());
  static_assert(data::check_sampler<data::weighted_sampler>());
  static_assert(data::check_sampler<data::distributed_sampler<data::shuffled_sampler>>());
  struct no_name {
    void epoch_order(std::size_t, std::uint64_t, std::uint64_t, order_t&) const {}
  };
  struct mutable_order {
    void epoch_order(std::size_t, std::uint64_t, std::uint64_t, order_t&) {}
    [[nodiscard]] std::string_view name() const { return "x"; }
  };
  static_assert(!data::sampler<no_name>);
  static_assert(!data::sampler<mutable_order>);
  static_assert(!data::sampler<int>);
}

BOOST_AUTO_TEST_CASE(sequential_is_the_identity_every_epoch) {
  const data::sequential_sampler s;
  for (std::uint64_t e = 0; e < 3; ++e) {
    order_t want(7);
    std::iota(want.begin(), want.end(), 0u);
    BOOST_TEST(order_of(s, 7, 99, e) == want);
  }
  BOOST_TEST(order_of(s, 0, 1, 0).empty());
}

BOOST_AUTO_TEST_CASE(shuffled_is_a_new_permutation_per_epoch_and_a_pure_function) {
  const data::shuffled_sampler s;
  const order_t a0 = order_of(s, 1000, 5, 0);
  BOOST_TEST(is_permutation_of_iota(a0));
  BOOST_TEST(order_of(s, 1000, 5, 0) == a0);  // same (seed, epoch): same order
  BOOST_TEST(order_of(data::shuffled_sampler{}, 1000, 5, 0) == a0);
  BOOST_TEST(order_of(s, 1000, 5, 1) != a0);  // a new epoch
  BOOST_TEST(order_of(s, 1000, 6, 0) != a0);  // another seed
  BOOST_TEST(order_of(s, 1, 5, 3) == order_t{0});
  BOOST_TEST(order_of(s, 0, 5, 3).empty());
}

BOOST_AUTO_TEST_CASE(shuffled_positions_are_uniform_over_epochs) {
  // For n = 6 every (position, value) pair has probability 1/6. Over 12000 epochs each count is
  // Binomial(12000, 1/6); the chi-square over 36 cells (25 degrees of freedom, value at each
  // position; rows and columns sum to fixed totals) stays below 60 for a fair shuffle (p ~ 1e-4)
  // and a biased one (e.g. the naive swap-with-any shuffle, or reusing one permutation) fails it.
  const data::shuffled_sampler s;
  constexpr std::size_t n = 6;
  constexpr std::uint64_t epochs = 12000;
  std::vector<double> counts(n * n, 0.0);
  for (std::uint64_t e = 0; e < epochs; ++e) {
    const order_t o = order_of(s, n, 42, e);
    BOOST_REQUIRE(is_permutation_of_iota(o));
    for (std::size_t p = 0; p < n; ++p) counts[p * n + o[p]] += 1.0;
  }
  const std::vector<double> p(n * n, 1.0 / n);
  const double x = chi_square(counts, p, static_cast<double>(epochs));  // 2000 expected per cell
  BOOST_TEST(x < 60.0, "chi-square " << x);
  BOOST_TEST(x > 5.0, "chi-square " << x << " is too small to be random");
}

BOOST_AUTO_TEST_CASE(weighted_with_replacement_draws_by_weight) {
  const std::vector<double> w{1.0, 0.0, 3.0, 6.0, 0.0, 2.0};
  const double total = 12.0;
  const data::weighted_sampler s(w, 24000, true);
  BOOST_TEST(s.name() == "weighted");
  const order_t o = order_of(s, w.size(), 3, 0);
  BOOST_REQUIRE(o.size() == 24000u);
  std::vector<double> counts(w.size(), 0.0);
  for (const auto i : o) counts[i] += 1.0;
  BOOST_TEST(counts[1] == 0.0);  // zero weights are never drawn
  BOOST_TEST(counts[4] == 0.0);
  std::vector<double> p(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) p[i] = w[i] / total;
  const double x = chi_square(counts, p, 24000.0);
  BOOST_TEST(x < 20.0, "chi-square " << x);  // 3 degrees of freedom: p < 2e-4
  BOOST_TEST(order_of(s, w.size(), 3, 0) == o);
  BOOST_TEST(order_of(s, w.size(), 3, 1) != o);
}

BOOST_AUTO_TEST_CASE(weighted_without_replacement_has_the_sequential_draw_law) {
  const std::vector<double> w{1.0, 0.0, 3.0, 6.0};
  const data::weighted_sampler s(w, 3, false);
  BOOST_TEST(s.name() == "weighted-without-replacement");
  // The first entry follows the weights; the second, given the first f, follows w / (10 - w_f).
  std::vector<double> first(4, 0.0), second_after_3(4, 0.0);
  double after_3 = 0.0;
  constexpr std::uint64_t epochs = 20000;
  for (std::uint64_t e = 0; e < epochs; ++e) {
    const order_t o = order_of(s, w.size(), 11, e);
    BOOST_REQUIRE(o.size() == 3u);
    BOOST_REQUIRE(std::set<std::uint64_t>(o.begin(), o.end()).size() == 3u);  // no repeats
    BOOST_REQUIRE(std::find(o.begin(), o.end(), 1u) == o.end());              // weight 0
    first[o[0]] += 1.0;
    if (o[0] == 3) {
      second_after_3[o[1]] += 1.0;
      after_3 += 1.0;
    }
  }
  BOOST_TEST(chi_square(first, {0.1, 0.0, 0.3, 0.6}, epochs) < 20.0);
  BOOST_TEST(chi_square(second_after_3, {0.25, 0.0, 0.75, 0.0}, after_3) < 15.0);
  BOOST_TEST(second_after_3[3] == 0.0);
}

BOOST_AUTO_TEST_CASE(weighted_refuses_bad_weights_with_a_sentence) {
  BOOST_TEST(message_of([] {
               data::weighted_sampler({1.0, -2.0}, 1);
             }).find("weight 1 is") != std::string::npos);
  BOOST_TEST(message_of([] {
               data::weighted_sampler({0.0, 0.0}, 1);
             }).find("all 2 weights are 0") != std::string::npos);
  BOOST_TEST(message_of([] {
               data::weighted_sampler({1.0, 0.0, 1.0}, 3, false);
             }).find("only 2 weights are positive") != std::string::npos);
  const data::weighted_sampler s({1.0, 1.0}, 4);
  order_t out;
  BOOST_TEST(message_of([&] {
               s.epoch_order(3, 0, 0, out);
             }).find("2 weights for a dataset of 3 samples") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(distributed_shares_are_disjoint_and_cover_the_rest_of_the_epoch) {
  for (std::uint64_t m : {0u, 1u, 7u, 12u, 13u, 50u}) {
    for (std::uint64_t begin = 0; begin <= m; begin += (m > 10 ? 5 : 1)) {
      for (std::uint64_t world = 1; world <= 5; ++world) {
        for (const data::tail t : {data::tail::pad, data::tail::drop}) {
          std::vector<int> seen(m, 0);
          std::uint64_t pads = 0, count = 0;
          for (std::uint64_t r = 0; r < world; ++r) {
            const data::rank_slice s = data::slice_of(m, begin, r, world, t);
            if (r > 0) BOOST_TEST(s.count == count);  // every rank reads as many
            count = s.count;
            for (std::uint64_t k = 0; k < s.count; ++k) {
              const std::uint64_t p = s.position(k);
              BOOST_REQUIRE(s.order_index(k) < m);
              if (p < m) {
                ++seen[p];
              } else {
                ++pads;
              }
            }
          }
          const std::uint64_t rest = m - begin;
          // Oracle: [begin, m) once each (pad), or its first floor(rest / world) * world (drop).
          const std::uint64_t covered = t == data::tail::pad ? rest : rest / world * world;
          for (std::uint64_t p = 0; p < m; ++p) {
            const int want = (p >= begin && p < begin + covered) ? 1 : 0;
            BOOST_TEST(seen[p] == want,
                       "m " << m << " begin " << begin << " world " << world << " position " << p);
          }
          BOOST_TEST(pads == (t == data::tail::pad ? (world - rest % world) % world : 0u));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_world_size_change_mid_epoch_reads_every_entry_once) {
  // Lockstep phases with 3, then 2, then 5 ranks over an epoch of 101 entries: each phase reads a
  // few entries per rank, the position after it is where the next phase deals from.
  const std::uint64_t m = 101;
  std::vector<int> seen(m, 0);
  std::uint64_t position = 0;
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> phases{{3, 7}, {2, 11}, {5, 100}};
  for (const auto& [world, steps] : phases) {
    std::uint64_t read = 0;
    for (std::uint64_t r = 0; r < world; ++r) {
      const data::rank_slice s = data::slice_of(m, position, r, world, data::tail::pad);
      read = std::min(steps, s.count);
      for (std::uint64_t k = 0; k < read; ++k) {
        if (s.position(k) < m) ++seen[s.position(k)];
      }
    }
    position = data::slice_of(m, position, 0, world, data::tail::pad).position_after(read);
  }
  BOOST_TEST(position == m);
  for (std::uint64_t p = 0; p < m; ++p) BOOST_TEST(seen[p] == 1, "position " << p);
}

BOOST_AUTO_TEST_CASE(distributed_sampler_checks_its_rank_and_keeps_the_base_name) {
  const data::distributed_sampler<data::shuffled_sampler> d({}, 1, 4);
  BOOST_TEST(d.name() == "shuffled");
  BOOST_TEST(order_of(d, 30, 2, 1) == order_of(data::shuffled_sampler{}, 30, 2, 1));
  const data::rank_slice s = data::sampler_slice(d, 30, 0);
  BOOST_TEST(s.rank == 1u);
  BOOST_TEST(s.world == 4u);
  BOOST_TEST(s.count == 8u);
  BOOST_TEST(data::sampler_slice(data::sequential_sampler{}, 30, 4).count == 26u);
  BOOST_TEST(message_of([] {
               data::distributed_sampler<data::sequential_sampler>({}, 4, 4);
             }).find("rank 4 of a world of 4") != std::string::npos);
  BOOST_TEST(message_of([] {
               data::distributed_sampler<data::sequential_sampler>({}, 0, 0);
             }).find("world size must be >= 1") != std::string::npos);
}
