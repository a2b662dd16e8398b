// The AVX-512 twins of the sum tree's in-node search and reductions against the scalar
// definitions they must reproduce bit for bit (and that the CUDA sampler runs). Compiled with
// -mavx512f; exits 77 (skipped) on a CPU without AVX-512F.
#define BOOST_TEST_MODULE hone_rl_avx512
#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <hone/rl/rng.hpp>
#include <hone/rl/sum_tree.hpp>
#include <vector>

#if !defined(__AVX512F__)
#error "test_rl_avx512.cpp must be compiled with -mavx512f"
#endif

namespace {
struct cpu_check {
  cpu_check() {
    if (!__builtin_cpu_supports("avx512f")) {
      std::printf("CPU without AVX-512F: skipping\n");
      std::exit(77);
    }
  }
};
BOOST_TEST_GLOBAL_FIXTURE(cpu_check);

template <class T>
void random_node(hone::replay_rng& rng, T* c) {
  for (int i = 0; i < 16; ++i) {
    const double r = rng.uniform();
    c[i] = static_cast<T>(r < 0.3 ? 0.0 : rng.uniform() * (r < 0.5 ? 1e-8 : 1e3));
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(in_node_search_is_bit_identical) {
  hone::replay_rng rng(3);
  long mismatches = 0;
  for (int t = 0; t < 300000; ++t) {
    double c[16];
    float f[16];
    random_node(rng, c);
    random_node(rng, f);
    for (const double total : {hone::detail::node_sum_scalar<16>(c)}) {
      if (!(total > 0.0)) continue;
      for (double u : {rng.uniform() * total, total, total * 1.5, 0.0}) {
        double u1 = u;
        double u2 = u;
        const auto a = hone::detail::find_child_scalar<16>(c, u1);
        const auto b = hone::detail::find_child_avx512(c, u2);
        mismatches += (a != b || u1 != u2 || !(c[a] > 0.0)) ? 1 : 0;
      }
    }
    const double ft = hone::detail::node_sum_scalar<16>(f);
    if (!(ft > 0.0)) continue;
    double u1 = rng.uniform() * ft;
    double u2 = u1;
    const auto a = hone::detail::find_child_scalar<16>(f, u1);
    const auto b = hone::detail::find_child_avx512(f, u2);
    mismatches += (a != b || u1 != u2 || !(f[a] > 0.0f)) ? 1 : 0;
  }
  BOOST_TEST(mismatches == 0);
}

BOOST_AUTO_TEST_CASE(shared_node_ends_are_bit_identical) {
  // node_ends16_avx512 / child_from_ends_avx512 (find_batch on the levels it shares between
  // walks) against the scalar ends and search.
  hone::replay_rng rng(4);
  long mismatches = 0;
  for (int t = 0; t < 300000; ++t) {
    double c[16];
    float f[16];
    random_node(rng, c);
    random_node(rng, f);
    const auto check = [&](const auto* node) {
      double scalar[17];
      hone::detail::node_ends_scalar<16>(node, scalar);
      __m512d p0;
      __m512d p1;
      hone::detail::node_ends16_avx512(node, p0, p1);
      double vec[17];
      vec[0] = 0.0;
      _mm512_storeu_pd(vec + 1, p0);
      _mm512_storeu_pd(vec + 9, p1);
      mismatches += std::memcmp(scalar, vec, sizeof vec) != 0 ? 1 : 0;
      if (!(scalar[16] > 0.0)) return;
      for (double u : {rng.uniform() * scalar[16], scalar[1 + rng.below(16)], scalar[16], 0.0}) {
        double u1 = u;
        double u2 = u;
        const auto a = hone::detail::child_from_ends_scalar<16>(node, scalar, u1);
        const auto b = hone::detail::child_from_ends_avx512(node, vec, u2);
        mismatches += (a != b || std::memcmp(&u1, &u2, 8) != 0) ? 1 : 0;
      }
    };
    check(c);
    check(f);
  }
  BOOST_TEST(mismatches == 0);
}

BOOST_AUTO_TEST_CASE(reductions_are_bit_identical) {
  hone::replay_rng rng(5);
  long mismatches = 0;
  for (int t = 0; t < 300000; ++t) {
    double c[16];
    float f[16];
    random_node(rng, c);
    random_node(rng, f);
    mismatches += hone::detail::node_sum_scalar<16>(c) != hone::detail::node_sum16_avx512(c);
    mismatches += hone::detail::node_sum_scalar<16>(f) != hone::detail::node_sum16_avx512(f);
    mismatches +=
        hone::detail::node_min_scalar<16, true>(f) != hone::detail::node_min16_avx512<true>(f);
    mismatches +=
        hone::detail::node_min_scalar<16, false>(f) != hone::detail::node_min16_avx512<false>(f);
  }
  BOOST_TEST(mismatches == 0);
}

BOOST_AUTO_TEST_CASE(whole_tree_matches_a_scalar_walk) {
  // The tree (AVX-512 build) against a walk done with the scalar functions only.
  constexpr std::size_t n = 300007;
  hone::replay_rng rng(9);
  std::vector<float> p(n);
  for (auto& x : p) x = rng.uniform() < 0.2 ? 0.0f : static_cast<float>(rng.uniform());
  hone::sum_tree<16> tree(n);
  tree.assign(p);
  const auto& l = tree.layout();
  for (int k = 0; k < 100000; ++k) {
    const double target = rng.uniform() * tree.total();
    double u = target;
    std::size_t node = 0;
    for (std::size_t lv = 0; lv < l.depth; ++lv) {
      node = node * 16 +
             hone::detail::find_child_scalar<16>(tree.sums().data() + l.offset[lv] + node * 16, u);
    }
    std::vector<float> group(16, 0.0f);
    for (std::size_t i = 0; i < 16 && node * 16 + i < n; ++i) group[i] = p[node * 16 + i];
    const std::size_t scalar = node * 16 + hone::detail::find_child_scalar<16>(group.data(), u);
    BOOST_REQUIRE(tree.find(target) == scalar);
  }
  // find_batch on stratified batches (sorted targets: its shared top levels) against find().
  for (const std::size_t batch : {16u, 256u, 512u, 1000u}) {
    std::vector<double> targets(batch);
    for (std::size_t k = 0; k < batch; ++k) {
      targets[k] = hone::detail::stratified_target(k, rng.uniform(), tree.total(), batch);
    }
    targets.back() = tree.total();
    std::vector<std::size_t> leaves(batch);
    tree.find_batch(targets, leaves);
    for (std::size_t k = 0; k < batch; ++k) BOOST_REQUIRE(leaves[k] == tree.find(targets[k]));
  }
}
