// Label slow: the drift bound of the issue at full length. 1e8 priority updates (batches of 256,
// mixed magnitudes) on a 1 Mi-leaf 16-ary tree, then the relative error of the total against a
// Neumaier long double sum of the leaves must be below 1e-9 (it is ~1e-16: every sum is recomputed
// from its children, so the tree equals a freshly built one; this test checks that bit for bit).
#define BOOST_TEST_MODULE hone_rl_drift_slow
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <hone/rl/rng.hpp>
#include <hone/rl/sum_tree.hpp>
#include <vector>

BOOST_AUTO_TEST_CASE(one_hundred_million_updates) {
  constexpr std::size_t n = std::size_t{1} << 20;
  constexpr std::size_t updates = 100'000'000;
  hone::sum_tree<16> tree(n);
  std::vector<float> leaves(n, 1.0f);
  tree.assign(leaves);
  hone::replay_rng rng(17);
  std::vector<std::size_t> idx(256);
  std::vector<float> v(256);
  for (std::size_t done = 0; done < updates; done += idx.size()) {
    for (std::size_t k = 0; k < idx.size(); ++k) {
      idx[k] = static_cast<std::size_t>(rng.below(n));
      v[k] = static_cast<float>(rng.uniform() < 0.5 ? rng.uniform() * 1e-3 : rng.uniform() * 1e3);
      leaves[idx[k]] = v[k];
    }
    tree.set_batch(idx, v);
  }
  long double s = 0.0L;
  long double c = 0.0L;
  for (float x : leaves) {
    const long double t = s + x;
    c += std::fabs(s) >= x ? (s - t) + x : (x - t) + s;
    s = t;
  }
  const long double ref = s + c;
  const double rel = static_cast<double>(std::fabs(tree.total() - ref) / ref);
  BOOST_TEST_MESSAGE("relative error of the total after 1e8 updates: " << rel);
  BOOST_TEST(rel < 1e-9);
  hone::sum_tree<16> fresh(n);
  fresh.assign(leaves);
  BOOST_TEST(std::memcmp(tree.sums().data(), fresh.sums().data(), tree.sums().size_bytes()) == 0);
}
