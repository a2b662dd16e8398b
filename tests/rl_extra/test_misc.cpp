// The state cache (LRU order, entry and byte bounds, hit rate, the sharded thread-safe variant)
// and the variable batch size (noise-scale estimators on synthetic gradients of known noise,
// growth within bounds).
#define BOOST_TEST_MODULE hone_rl_extra_misc
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <hone/rl/state_cache.hpp>
#include <hone/rl/variable_batch.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

BOOST_AUTO_TEST_SUITE(state_cache_tests)

BOOST_AUTO_TEST_CASE(lru_order_and_stats) {
  hone::state_cache<int, std::string> c({.max_entries = 3});
  int computed = 0;
  auto feat = [&](int k) {
    ++computed;
    // Built with append rather than "f" + std::to_string(k): g++ 12 at -O3 reports a false
    // -Wrestrict on the latter (GCC PR 105329).
    std::string s = "f";
    s.append(std::to_string(k));
    return s;
  };
  BOOST_TEST(c.get_or_compute(1, feat) == "f1");
  c.get_or_compute(2, feat);
  c.get_or_compute(3, feat);
  BOOST_TEST(c.get_or_compute(1, feat) == "f1");  // hit; 1 becomes most recent
  c.get_or_compute(4, feat);                      // evicts 2 (least recent)
  BOOST_TEST(!c.contains(2));
  BOOST_TEST(c.contains(1));
  BOOST_TEST(c.contains(3));
  BOOST_TEST(c.contains(4));
  BOOST_TEST(computed == 4);
  BOOST_TEST(c.hits() == 1u);
  BOOST_TEST(c.misses() == 4u);
  BOOST_TEST(c.evictions() == 1u);
  BOOST_TEST(c.size() == 3u);
  BOOST_TEST(c.hit_rate() == 0.2);
  c.insert(3, "new");  // replaces
  BOOST_TEST(*c.peek(3) == "new");
  BOOST_TEST(c.size() == 3u);
  c.clear();
  BOOST_TEST(c.size() == 0u);
  BOOST_CHECK_THROW((hone::state_cache<int, int>({.max_entries = 0, .max_bytes = 0})),
                    hone::config_error);
}

BOOST_AUTO_TEST_CASE(byte_bound) {
  auto size_of = [](const std::vector<float>& v) { return v.size() * sizeof(float); };
  hone::state_cache<int, std::vector<float>, std::hash<int>, std::equal_to<int>, decltype(size_of)>
      c({.max_entries = 0, .max_bytes = 4000}, size_of);
  for (int k = 0; k < 100; ++k) {
    c.get_or_compute(k, [](int key) { return std::vector<float>(100 + key % 7, 1.0f); });
    BOOST_TEST(c.bytes() <= 4000u);
  }
  BOOST_TEST(c.size() >= 8u);
  BOOST_TEST(c.evictions() == 100u - c.size());
}

BOOST_AUTO_TEST_CASE(hit_rate_on_a_skewed_workload) {
  // States drawn from a Zipf-like law over 10,000 keys; a 1,000-entry cache catches most.
  hone::state_cache<std::uint64_t, std::vector<float>> c({.max_entries = 1000});
  std::mt19937_64 g(1);
  std::uniform_real_distribution<double> u(0, 1);
  for (int i = 0; i < 100000; ++i) {
    const auto key = static_cast<std::uint64_t>(std::pow(10000.0, u(g)));  // log-uniform
    c.get_or_compute(key, [](std::uint64_t k) { return std::vector<float>(8, float(k)); });
  }
  BOOST_TEST_MESSAGE("state_cache hit rate: " << c.hit_rate());
  BOOST_TEST(c.hit_rate() > 0.6);
  BOOST_TEST(c.size() == 1000u);
}

BOOST_AUTO_TEST_CASE(concurrent_variant) {
  hone::concurrent_state_cache<std::uint64_t, std::vector<float>> c({.max_entries = 512}, 8);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 g(static_cast<std::uint64_t>(t));
      for (int i = 0; i < 20000; ++i) {
        const std::uint64_t key = g() % 600;
        auto v = c.get_or_compute(
            key, [](std::uint64_t k) { return std::vector<float>(4, static_cast<float>(k)); });
        if ((*v)[0] != static_cast<float>(key)) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  const auto s = c.stats();
  BOOST_TEST(wrong.load() == 0);
  BOOST_TEST(s.hits + s.misses == 80000u);
  BOOST_TEST(s.entries <= 512u);
  BOOST_TEST(s.hit_rate() > 0.5);
  BOOST_TEST_MESSAGE("concurrent_state_cache hit rate: " << s.hit_rate());
}

BOOST_AUTO_TEST_SUITE_END()

// ------------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(variable_batch_tests)

namespace {

/// |mean of b samples|^2 where each sample is G + N(0, sigma^2 I) in `dim` dimensions.
double batch_sq_norm(const std::vector<double>& G, double sigma, std::size_t b,
                     std::mt19937_64& g) {
  std::normal_distribution<double> normal(0.0, sigma / std::sqrt(static_cast<double>(b)));
  double s = 0;
  for (double gj : G) {
    const double v = gj + normal(g);
    s += v * v;
  }
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(two_batch_estimator_recovers_known_noise_scale) {
  // tr(Sigma) = dim * sigma^2 = 1000 * 4 = 4000; |G|^2 = 1000 * 0.01 = 10: B_simple = 400.
  const std::size_t dim = 1000;
  const std::vector<double> G(dim, 0.1);
  std::mt19937_64 g(9);
  hone::variable_batch_policy p({.min_batch = 16, .max_batch = 100000, .beta = 0.99, .warmup = 1});
  for (int i = 0; i < 2000; ++i) {
    p.observe_two_batches(batch_sq_norm(G, 2.0, 32, g), 32, batch_sq_norm(G, 2.0, 512, g), 512);
  }
  const auto m = p.smoothed();
  BOOST_TEST_MESSAGE("two-batch estimate: tr " << m.trace_sigma << ", |G|^2 " << m.grad_sq
                                               << ", B_simple " << p.noise_scale());
  BOOST_TEST(std::abs(m.trace_sigma - 4000.0) < 0.05 * 4000.0);
  BOOST_TEST(std::abs(m.grad_sq - 10.0) < 0.1 * 10.0);
  BOOST_TEST(std::abs(p.noise_scale() - 400.0) < 0.15 * 400.0);
}

BOOST_AUTO_TEST_CASE(per_sample_estimator) {
  const std::size_t dim = 50, batch = 64;
  std::mt19937_64 g(2);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  double tr = 0, gs = 0;
  const int reps = 400;
  for (int r = 0; r < reps; ++r) {
    std::vector<float> grads(batch * dim);
    for (std::size_t i = 0; i < batch; ++i)
      for (std::size_t j = 0; j < dim; ++j) grads[i * dim + j] = 0.2f + normal(g);
    const auto m = hone::noise_moments_from_samples(grads, batch);
    tr += m.trace_sigma;
    gs += m.grad_sq;
  }
  tr /= reps;
  gs /= reps;
  BOOST_TEST(std::abs(tr - 50 * 0.25) < 0.02 * 12.5);  // tr(Sigma) = 12.5
  BOOST_TEST(std::abs(gs - 50 * 0.04) < 0.05 * 2.0);   // |G|^2 = 2
}

BOOST_AUTO_TEST_CASE(batch_grows_with_the_noise_scale_within_bounds) {
  // |G| shrinks over "training" at fixed noise: B_simple grows 40 -> 40,000.
  const std::size_t dim = 400;
  std::mt19937_64 g(4);
  hone::variable_batch_policy p(
      {.min_batch = 64, .max_batch = 8192, .beta = 0.9, .multiple_of = 8, .warmup = 5});
  BOOST_TEST(p.batch_size() == 64u);
  std::size_t prev = p.batch_size();
  std::vector<std::size_t> seen;
  for (int phase = 0; phase < 4; ++phase) {
    const double gj = 0.1 / std::pow(std::sqrt(10.0), phase);  // |G|^2 = 4, 0.4, 0.04, 0.004
    const std::vector<double> G(dim, gj);
    for (int i = 0; i < 200; ++i) {
      const std::size_t b = p.observe_two_batches(batch_sq_norm(G, 0.63, 32, g), 32,
                                                  batch_sq_norm(G, 0.63, 1024, g), 1024);
      BOOST_TEST(b >= prev);  // never shrinks
      BOOST_TEST(b <= 8192u);
      BOOST_TEST(b % 8 == 0u);
      BOOST_TEST(b <= std::max<std::size_t>(prev * 2, 64));  // max_growth
      prev = b;
    }
    seen.push_back(p.batch_size());
    BOOST_TEST_MESSAGE("phase " << phase << ": B_simple " << p.noise_scale() << ", batch "
                                << p.batch_size());
  }
  // tr(Sigma) = 400 * 0.4 = 160: B_simple = 40, 400, 4000, 40000.
  BOOST_TEST(seen[0] <= 128u);
  BOOST_TEST(seen[1] >= 300u);
  BOOST_TEST(seen[1] <= 600u);
  BOOST_TEST(seen[2] >= 3000u);
  BOOST_TEST(seen[3] == 8192u);
  BOOST_CHECK_THROW(hone::variable_batch_policy({.min_batch = 0}), hone::config_error);
  BOOST_CHECK_THROW((void)hone::noise_moments_from_two_batches(1, 8, 1, 8), hone::config_error);
}

BOOST_AUTO_TEST_SUITE_END()
