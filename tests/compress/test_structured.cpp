// hone::compress structured pruning: neuron scores and selection against a long double oracle
// (norms, stable sort), keep_rows / keep_cols, and prune_neurons on a 3-layer MLP that implements
// the hook: its matrices really shrink, and its outputs equal (bit for bit) those of the original
// MLP with the removed neurons' rows, biases and columns zeroed; sentences for bad input.
#define BOOST_TEST_MODULE hone_compress_structured
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <hone/compress.hpp>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace hc = hone::compress;

namespace {

/// in -> h1 -> h2 -> out with ReLU, row-major weights [out, in] per layer.
struct mlp {
  std::vector<std::size_t> dims;  // in, h1, h2, out
  std::vector<std::vector<float>> w, b;
  explicit mlp(std::vector<std::size_t> d) : dims(std::move(d)) {
    std::mt19937 rng(9);
    std::normal_distribution<float> n(0.0f, 0.7f);
    for (std::size_t l = 0; l + 1 < dims.size(); ++l) {
      w.emplace_back(dims[l + 1] * dims[l]);
      b.emplace_back(dims[l + 1]);
      for (auto& x : w.back()) x = n(rng);
      for (auto& x : b.back()) x = n(rng);
    }
  }
  std::vector<float> forward(std::span<const float> x) const {
    std::vector<float> a(x.begin(), x.end());
    for (std::size_t l = 0; l < w.size(); ++l) {
      std::vector<float> z(dims[l + 1]);
      for (std::size_t o = 0; o < dims[l + 1]; ++o) {
        float s = b[l][o];
        for (std::size_t i = 0; i < dims[l]; ++i) s += w[l][o * dims[l] + i] * a[i];
        z[o] = (l + 1 < w.size()) ? std::max(s, 0.0f) : s;
      }
      a = std::move(z);
    }
    return a;
  }
  std::size_t parameter_count() const {
    std::size_t n = 0;
    for (std::size_t l = 0; l < w.size(); ++l) n += w[l].size() + b[l].size();
    return n;
  }
  // ---- the hook: hidden layers 0 (h1) and 1 (h2) ----
  std::size_t neuron_layer_count() const { return dims.size() - 2; }
  hc::neuron_layer_view neuron_layer(std::size_t l) const {
    return {w[l], dims[l + 1], dims[l], w[l + 1], dims[l + 2]};
  }
  void keep_neurons(std::size_t l, std::span<const std::size_t> kept) {
    w[l] = hc::keep_rows(w[l], dims[l + 1], dims[l], kept);
    b[l] = hc::keep_rows(b[l], dims[l + 1], 1, kept);
    w[l + 1] = hc::keep_cols(w[l + 1], dims[l + 2], dims[l + 1], kept);
    dims[l + 1] = kept.size();
  }
};
static_assert(hc::check_neuron_prunable<mlp>());

/// The oracle's choice: scores in long double, indices stable-sorted by score descending, the
/// first `keep` in ascending order.
std::vector<std::size_t> oracle_keep(const hc::neuron_layer_view& v, std::size_t keep, bool out) {
  std::vector<long double> s(v.neurons, 0.0L);
  for (std::size_t j = 0; j < v.neurons; ++j) {
    for (std::size_t c = 0; c < v.in_features; ++c) {
      s[j] += static_cast<long double>(v.in[j * v.in_features + c]) * v.in[j * v.in_features + c];
    }
    if (out) {
      for (std::size_t o = 0; o < v.out_features; ++o) {
        s[j] += static_cast<long double>(v.out[o * v.neurons + j]) * v.out[o * v.neurons + j];
      }
    }
  }
  std::vector<std::size_t> idx(v.neurons);
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  std::stable_sort(idx.begin(), idx.end(),
                   [&](std::size_t a, std::size_t b) { return s[a] > s[b]; });
  idx.resize(keep);
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

BOOST_AUTO_TEST_CASE(keep_rows_and_cols) {
  const std::vector<float> m{1, 2, 3, 4, 5, 6};  // [2, 3]
  const std::vector<std::size_t> r{1}, c{0, 2};
  BOOST_TEST(hc::keep_rows(m, 2, 3, r) == (std::vector<float>{4, 5, 6}));
  BOOST_TEST(hc::keep_cols(m, 2, 3, c) == (std::vector<float>{1, 3, 4, 6}));
}

BOOST_AUTO_TEST_CASE(selection_matches_the_oracle_with_ties) {
  // Rows 0 and 2 tie, as do 1 and 3: the lower index stays.
  const std::vector<float> in{3, 4, 1, 0, 0, 5, 0, 1};  // [4, 2]: norms 5, 1, 5, 1
  const hc::neuron_layer_view v{in, 4, 2};
  const auto s = hc::neuron_norms(v, hc::neuron_score::in_only);
  BOOST_TEST(hc::select_neurons(s, 1) == (std::vector<std::size_t>{0}));
  BOOST_TEST(hc::select_neurons(s, 3) == (std::vector<std::size_t>{0, 1, 2}));
  BOOST_TEST(hc::select_neurons(s, 3) == oracle_keep(v, 3, false));
}

BOOST_AUTO_TEST_CASE(pruned_mlp_is_smaller_and_computes_the_masked_function) {
  for (const auto score : {hc::neuron_score::in_only, hc::neuron_score::in_and_out}) {
    for (const double fraction : {0.0, 0.25, 0.5, 0.9}) {
      const mlp original({24, 40, 33, 5});
      mlp pruned = original, masked = original;
      // The oracle's choice, layer by layer, on the model as it shrinks.
      mlp shadow = original;
      std::vector<std::vector<std::size_t>> expect;
      for (std::size_t l = 0; l < 2; ++l) {
        const auto v = shadow.neuron_layer(l);
        const auto drop = static_cast<std::size_t>(std::floor(fraction * v.neurons));
        expect.push_back(oracle_keep(v, v.neurons - drop, score == hc::neuron_score::in_and_out));
        shadow.keep_neurons(l, expect.back());
      }
      const auto kept = hc::prune_neurons(pruned, fraction, score);
      BOOST_TEST_CONTEXT("fraction " << fraction) {
        BOOST_TEST(kept == expect);
        BOOST_TEST(pruned.dims[1] == 40 - static_cast<std::size_t>(std::floor(fraction * 40)));
        BOOST_TEST(pruned.dims[2] == 33 - static_cast<std::size_t>(std::floor(fraction * 33)));
        BOOST_TEST(pruned.w[1].size() == pruned.dims[2] * pruned.dims[1]);
        if (fraction >= 0.5) BOOST_TEST(pruned.parameter_count() * 2 <= original.parameter_count());
        // Masked twin: zero the removed neurons' input rows and biases (ReLU gives 0 for them).
        for (std::size_t l = 0; l < 2; ++l) {
          std::vector<bool> keep(masked.dims[l + 1], false);
          for (const std::size_t j : kept[l]) keep[j] = true;
          for (std::size_t j = 0; j < keep.size(); ++j) {
            if (keep[j]) continue;
            masked.b[l][j] = 0.0f;
            for (std::size_t c = 0; c < masked.dims[l]; ++c)
              masked.w[l][j * masked.dims[l] + c] = 0.0f;
          }
        }
        std::mt19937 rng(4);
        std::normal_distribution<float> n(0.0f, 1.0f);
        for (int trial = 0; trial < 20; ++trial) {
          std::vector<float> x(24);
          for (auto& v : x) v = n(rng);
          BOOST_TEST(pruned.forward(x) == masked.forward(x));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_input_is_a_sentence) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const hone::config_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto has = [](const std::string& m, const std::string& part) {
    BOOST_TEST_CONTEXT(m) {
      BOOST_TEST(m.find(part) != std::string::npos);
    }
  };
  mlp net({4, 6, 5, 2});
  has(message([&] { hc::prune_neurons(net, 1.0); }), "the fraction is 1.0");
  has(message([&] { hc::prune_neurons(net, -0.1); }), "it must lie in [0, 1)");
  const std::vector<float> in(7);
  has(message([&] {
        (void)hc::neuron_norms({in, 2, 4});
      }),
      "the input matrix holds 7 values, not neurons * in_features = 2 * 4");
  const std::vector<std::size_t> bad{3};
  has(message([&] { (void)hc::keep_rows(in, 7, 1, std::vector<std::size_t>{9}); }), "row 9");
  has(message([&] { (void)hc::keep_cols(in, 1, 7, std::vector<std::size_t>{7}); }), "column 7");
}
