// hone::compress 2:4 sparsity: the pattern against a per-group sorting oracle (ties included), the
// packed layout bit for bit on a hand-made matrix, pack() of a pruned matrix, and the matvec and
// matmul kernels against a double-precision dense product of the same pruned matrix; the same bits
// on 1 and 2 threads; sentences for bad shapes and groups with too many nonzeros.
#define BOOST_TEST_MODULE hone_compress_sparse24
#include <boost/test/unit_test.hpp>

#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <hone/compress.hpp>
#include <random>
#include <string>
#include <vector>

namespace hc = hone::compress;

namespace {

std::vector<float> random_matrix(std::size_t n, std::uint32_t seed, bool ties) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> q(-3, 3);
  std::vector<float> v(n);
  for (auto& x : v) x = ties ? 0.5f * static_cast<float>(q(rng)) : d(rng);
  return v;
}

/// The oracle: per group of 4, columns sorted by (|w| descending, column ascending); the first two
/// are kept.
std::vector<float> oracle_prune(const std::vector<float>& w, std::size_t rows, std::size_t cols) {
  std::vector<float> out(w.size(), 0.0f);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t g = 0; g < cols / 4; ++g) {
      std::array<std::size_t, 4> c{0, 1, 2, 3};
      const float* q = w.data() + r * cols + 4 * g;
      std::stable_sort(c.begin(), c.end(), [&](std::size_t a, std::size_t b) {
        return std::fabs(q[a]) > std::fabs(q[b]);
      });
      for (int k = 0; k < 2; ++k) out[r * cols + 4 * g + c[k]] = q[c[k]];
    }
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(pattern_matches_the_sorting_oracle) {
  for (const bool ties : {false, true}) {
    for (const std::size_t cols : {std::size_t{4}, std::size_t{12}, std::size_t{64}}) {
      const std::size_t rows = 9;
      const auto w = random_matrix(rows * cols, static_cast<std::uint32_t>(cols) + ties, ties);
      const auto m = hc::sparse24_matrix::prune(w, rows, cols);
      BOOST_TEST(m.to_dense() == oracle_prune(w, rows, cols));
      BOOST_TEST(m.values().size() == rows * cols / 2);
      BOOST_TEST(m.positions().size() == rows * ((cols / 4 + 1) / 2));
      // pack() of the pruned dense matrix gives the same dense matrix back.
      const auto dense = m.to_dense();
      BOOST_TEST(hc::sparse24_matrix::pack(dense, rows, cols).to_dense() == dense);
    }
  }
}

BOOST_AUTO_TEST_CASE(packed_layout_bit_for_bit) {
  // Row 0: group 0 keeps columns 1 and 3 (|5|, |-7|), group 1 keeps 0 and 2 (|2|, |1.5|; 1 ties
  // with 3 at |1| and loses to 2). Nibbles 1 | 3 << 2 = 0xD and 0 | 2 << 2 = 0x8: byte 0x8D.
  const std::vector<float> w{0, 5, 0.5f, -7, 2, 1, 1.5f, -1};
  const auto m = hc::sparse24_matrix::prune(w, 1, 8);
  BOOST_TEST(m.positions().size() == 1u);
  BOOST_TEST(m.positions()[0] == 0x8D);
  BOOST_TEST(std::vector<float>(m.values().begin(), m.values().end()) ==
             (std::vector<float>{5, -7, 2, 1.5f}));
  BOOST_TEST(m.bytes() == 4 * sizeof(float) + 1);
  // A group with one nonzero: its position first, then the lowest free column (a zero).
  const auto p = hc::sparse24_matrix::pack(std::vector<float>{0, 0, 3, 0}, 1, 4);
  BOOST_TEST(p.positions()[0] == (0 | (2 << 2)));
  BOOST_TEST(std::vector<float>(p.values().begin(), p.values().end()) ==
             (std::vector<float>{0, 3}));
}

BOOST_AUTO_TEST_CASE(kernels_match_the_dense_product) {
  // 1032 columns: 258 groups, so the matmul's column blocks of 64 groups end in a partial one.
  for (const std::size_t cols :
       {std::size_t{4}, std::size_t{12}, std::size_t{256}, std::size_t{1032}}) {
    const std::size_t rows = 33;
    const auto w = random_matrix(rows * cols, 7, false);
    const auto m = hc::sparse24_matrix::prune(w, rows, cols);
    const auto d = oracle_prune(w, rows, cols);
    for (const std::size_t batch : {std::size_t{1}, std::size_t{7}, std::size_t{64}}) {
      const auto x = random_matrix(batch * cols, 11, false);
      std::vector<float> y(batch * rows, -1.0f);
      hc::sparse24_matmul(m, x, batch, y);
      for (std::size_t i = 0; i < batch; ++i) {
        for (std::size_t r = 0; r < rows; ++r) {
          double ref = 0.0, mag = 0.0;
          for (std::size_t c = 0; c < cols; ++c) {
            ref += static_cast<double>(d[r * cols + c]) * static_cast<double>(x[i * cols + c]);
            mag += std::fabs(static_cast<double>(d[r * cols + c]) * x[i * cols + c]);
          }
          BOOST_TEST(std::fabs(y[i * rows + r] - ref) <= 1e-6 * (1.0 + mag),
                     "row " << i << ", output " << r << ", cols " << cols);
        }
      }
      if (batch == 1) {
        std::vector<float> yv(rows, -1.0f);
        hc::sparse24_matvec(m, x, yv);
        for (std::size_t r = 0; r < rows; ++r) BOOST_TEST(std::fabs(yv[r] - y[r]) <= 1e-6f);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(same_bits_on_any_number_of_threads) {
  const std::size_t rows = 200, cols = 128, batch = 17;
  const auto m = hc::sparse24_matrix::prune(random_matrix(rows * cols, 3, false), rows, cols);
  const auto x = random_matrix(batch * cols, 4, false);
  std::vector<std::vector<float>> ys;
  for (const int threads : {1, 2}) {
    tbb::task_arena arena(threads);
    std::vector<float> y(batch * rows);
    arena.execute([&] { hc::sparse24_matmul(m, x, batch, y); });
    ys.push_back(y);
  }
  BOOST_TEST(ys[0] == ys[1]);
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
  const std::vector<float> w(12, 1.0f);
  has(message([&] { (void)hc::sparse24_matrix::prune(w, 2, 6); }), "a multiple of 4");
  has(message([&] { (void)hc::sparse24_matrix::prune(w, 2, 8); }),
      "the matrix holds 12 values but the shape [2, 8] needs 16");
  has(message([&] { (void)hc::sparse24_matrix::pack(w, 3, 4); }),
      "row 0, columns 0-3 hold 4 nonzeros");
  std::vector<float> nan = w;
  nan[6] = std::nanf("");
  has(message([&] { (void)hc::sparse24_matrix::prune(nan, 3, 4); }), "row 1, column 2 is NaN");
  const auto m = hc::sparse24_matrix::prune(w, 3, 4);
  std::vector<float> x(5), y(3);
  has(message([&] { hc::sparse24_matvec(m, x, y); }), "x holds 5 values");
  has(message([&] { hc::sparse24_matmul(m, x, 2, y); }), "X needs m * cols values");
}
