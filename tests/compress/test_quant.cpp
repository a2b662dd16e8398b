// hone::compress int8 weight quantization and observers: per-channel and per-tensor codes against a
// scalar oracle written here (round half to even done by hand in double), ties on hand-made rows,
// dequantization within scale / 2; ggml Q8_0 blocks against hand-computed blocks (fp16 bits, round
// half away from zero) and a separate oracle of ggml's reference definition; zeros, NaN/Inf and
// empty shapes; observers against brute-force oracles (sorting, double-precision scans).
#define BOOST_TEST_MODULE hone_compress_quant
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <hone/compress/quant.hpp>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../support/error_text.hpp"

namespace hc = hone::compress;

namespace {

std::vector<float> random_rows(std::size_t rows, std::size_t cols, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(rows * cols);
  for (std::size_t r = 0; r < rows; ++r) {
    const float row_scale =
        std::ldexp(1.0f, static_cast<int>(r % 7) - 3);  // rows of different size
    for (std::size_t c = 0; c < cols; ++c) v[r * cols + c] = row_scale * d(rng);
  }
  return v;
}

/// Round half to even, by hand in double (the library uses std::nearbyint).
double oracle_rne(double v) {
  const double f = std::floor(v);
  const double diff = v - f;
  if (diff > 0.5) return f + 1.0;
  if (diff < 0.5) return f;
  return std::fmod(f, 2.0) == 0.0 ? f : f + 1.0;
}

std::int8_t oracle_code(float w, float scale) {
  if (scale == 0.0f) return 0;
  const double q = oracle_rne(static_cast<double>(w / scale));
  return static_cast<std::int8_t>(std::max(-127.0, std::min(127.0, q)));
}

float oracle_absmax(const float* p, std::size_t n) {
  float m = 0.0f;
  for (std::size_t i = 0; i < n; ++i) m = std::fabs(p[i]) > m ? std::fabs(p[i]) : m;
  return m;
}

}  // namespace

BOOST_AUTO_TEST_CASE(per_channel_codes_match_the_oracle_and_dequantize_within_half_a_scale) {
  const std::size_t rows = 37, cols = 101;
  const auto w = random_rows(rows, cols, 1);
  const auto q = hc::quantize_weights(w, rows, cols, hc::quant_granularity::per_channel);
  BOOST_TEST(q.scales.size() == rows);
  std::vector<float> back(w.size());
  hc::dequantize(q, back);
  for (std::size_t r = 0; r < rows; ++r) {
    const float s = oracle_absmax(&w[r * cols], cols) / 127.0f;
    BOOST_TEST(q.scales[r] == s);
    for (std::size_t c = 0; c < cols; ++c) {
      const std::size_t i = r * cols + c;
      BOOST_TEST(q.values[i] == oracle_code(w[i], s), "row " << r << " col " << c);
      BOOST_TEST(std::fabs(back[i] - w[i]) <= 0.5 * s * (1 + 1e-6), "row " << r << " col " << c);
    }
    // the largest magnitude maps to +-127
    const auto it = std::max_element(&w[r * cols], &w[r * cols] + cols,
                                     [](float a, float b) { return std::fabs(a) < std::fabs(b); });
    BOOST_TEST(std::abs(q.values[static_cast<std::size_t>(it - w.data())]) == 127);
  }
}

BOOST_AUTO_TEST_CASE(per_tensor_codes_match_the_oracle) {
  const std::size_t rows = 9, cols = 64;
  const auto w = random_rows(rows, cols, 2);
  const auto q = hc::quantize_weights(w, rows, cols, hc::quant_granularity::per_tensor);
  BOOST_REQUIRE(q.scales.size() == 1u);
  const float s = oracle_absmax(w.data(), w.size()) / 127.0f;
  BOOST_TEST(q.scales[0] == s);
  std::vector<float> back(w.size());
  hc::dequantize(q, back);
  for (std::size_t i = 0; i < w.size(); ++i) {
    BOOST_TEST(q.values[i] == oracle_code(w[i], s));
    BOOST_TEST(std::fabs(back[i] - w[i]) <= 0.5 * s * (1 + 1e-6));
  }
}

BOOST_AUTO_TEST_CASE(ties_round_to_even) {
  // scale = 127 / 127 = 1 exactly, so the codes are round_half_even(w)
  const std::vector<float> w{127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -2.5f, -3.5f, 1.25f};
  const auto q = hc::quantize_weights(w, 1, w.size());
  BOOST_TEST(q.scales[0] == 1.0f);
  const std::vector<std::int8_t> want{127, 0, 2, 2, 0, -2, -4, 1};
  BOOST_TEST(q.values == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(zero_rows_and_empty_shapes) {
  const std::vector<float> w{0, 0, 0, 1, -2, 4};
  const auto q = hc::quantize_weights(w, 2, 3);
  BOOST_TEST(q.scales[0] == 0.0f);
  BOOST_TEST(q.values[0] == 0);
  BOOST_TEST(q.values[2] == 0);
  std::vector<float> back(6);
  hc::dequantize(q, back);
  BOOST_TEST(back[0] == 0.0f);
  BOOST_TEST(back[5] == 4.0f);
  const auto e0 = hc::quantize_weights({}, 0, 5);
  BOOST_TEST(e0.values.empty());
  BOOST_TEST(e0.scales.empty());
  const auto e1 = hc::quantize_weights({}, 3, 0, hc::quant_granularity::per_channel);
  BOOST_TEST(e1.scales.size() == 3u);
  const auto e2 = hc::quantize_weights({}, 0, 0, hc::quant_granularity::per_tensor);
  BOOST_TEST(e2.scales.size() == 1u);
  BOOST_TEST(e2.scales[0] == 0.0f);
}

BOOST_AUTO_TEST_CASE(non_finite_and_wrong_sizes_are_refused_with_sentences) {
  std::vector<float> w(12, 1.0f);
  w[6] = std::numeric_limits<float>::quiet_NaN();  // row 1, column 2 of [3, 4]
  const auto m =
      hone_test::error_of<hone::config_error>([&] { (void)hc::quantize_weights(w, 3, 4); });
  BOOST_TEST(m.find("row 1, column 2") != std::string::npos, m);
  BOOST_TEST(m.find("NaN") != std::string::npos, m);
  w[6] = -std::numeric_limits<float>::infinity();
  const auto i =
      hone_test::error_of<hone::config_error>([&] { (void)hc::quantize_weights(w, 3, 4); });
  BOOST_TEST(i.find("infinite") != std::string::npos, i);
  const auto s = hone_test::error_of<hone::config_error>(
      [&] { (void)hc::quantize_weights(std::vector<float>(11), 3, 4); });
  BOOST_TEST(s.find("[3, 4] needs 12") != std::string::npos, s);
  std::vector<float> out(5);
  const auto d = hone_test::error_of<hone::config_error>(
      [&] { hc::dequantize(hc::quantize_weights(std::vector<float>(12), 3, 4), out); });
  BOOST_TEST(d.find("[3, 4]") != std::string::npos, d);
}

// ---- Q8_0 ----

BOOST_AUTO_TEST_CASE(q8_0_hand_computed_blocks) {
  std::vector<float> x(96, 0.0f);
  // block 0: amax 127, so d = 1 (fp16 0x3c00), and the codes are roundf(x): halves away from zero
  const float b0[8] = {127.0f, 0.5f, -0.5f, 2.5f, -2.5f, 1.4999f, -126.6f, 3.0f};
  std::copy(b0, b0 + 8, x.begin());
  // block 1: x = j - 16, amax 16: d = 16 / 127 = 0.12598425..., fp16 2^-3 * (1 + 8/1024) = 0x3008
  // (0.12597656, the nearer of 0x3008 and 0x3009 = 0.12609863); codes use the fp32 d:
  // 1 / d = 7.9375, so x = 1 -> 8 (7.9375), 2 -> 16 (15.875), 3 -> 24 (23.8125), -16 -> -127
  for (int j = 0; j < 32; ++j) x[32 + static_cast<std::size_t>(j)] = static_cast<float>(j - 16);
  // block 2: zeros: d = 0 and zero codes
  const auto blocks = hc::quantize_q8_0(x);
  BOOST_REQUIRE(blocks.size() == 3u);
  BOOST_TEST(blocks[0].d == 0x3c00u);
  const std::int8_t want0[8] = {127, 1, -1, 3, -3, 1, -127, 3};
  for (int j = 0; j < 8; ++j) BOOST_TEST(blocks[0].qs[j] == want0[j], "j " << j);
  for (int j = 8; j < 32; ++j) BOOST_TEST(blocks[0].qs[j] == 0);
  BOOST_TEST(blocks[1].d == 0x3008u);
  BOOST_TEST(blocks[1].qs[0] == -127);  // x = -16
  BOOST_TEST(blocks[1].qs[16] == 0);    // x = 0
  BOOST_TEST(blocks[1].qs[17] == 8);    // x = 1
  BOOST_TEST(blocks[1].qs[18] == 16);   // x = 2
  BOOST_TEST(blocks[1].qs[19] == 24);   // x = 3
  BOOST_TEST(blocks[1].qs[15] == -8);   // x = -1
  BOOST_TEST(blocks[1].qs[31] == 119);  // x = 15: 119.0625
  BOOST_TEST(blocks[2].d == 0u);
  for (int j = 0; j < 32; ++j) BOOST_TEST(blocks[2].qs[j] == 0);
  // ggml's byte layout: 2 bytes of little-endian fp16, then the 32 codes; 34 bytes a block
  const auto bytes = hc::q8_0_bytes(blocks);
  BOOST_REQUIRE(bytes.size() == 3u * 34u);
  BOOST_TEST(static_cast<unsigned>(bytes[34]) == 0x08u);
  BOOST_TEST(static_cast<unsigned>(bytes[35]) == 0x30u);
  BOOST_TEST(static_cast<int>(static_cast<std::int8_t>(bytes[36])) == -127);
  // dequantized with the fp16 d
  std::vector<float> back(96);
  hc::dequantize_q8_0(blocks, back);
  BOOST_TEST(back[3] == 3.0f);
  BOOST_TEST(back[32 + 17] == 8.0f * 0.1259765625f);
}

BOOST_AUTO_TEST_CASE(q8_0_random_rows_match_the_reference_definition) {
  const auto x = random_rows(8, 128, 3);
  const auto blocks = hc::quantize_q8_0(x);
  std::vector<float> back(x.size());
  hc::dequantize_q8_0(blocks, back);
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    const float amax = oracle_absmax(&x[32 * b], 32);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const hone::half hd(d);
    BOOST_TEST(blocks[b].d == hd.bits());
    const float dh = static_cast<float>(hd);
    for (std::size_t j = 0; j < 32; ++j) {
      const float v = x[32 * b + j] * id;
      // round half away from zero, by hand
      const double r = v >= 0 ? std::floor(static_cast<double>(v) + 0.5)
                              : -std::floor(-static_cast<double>(v) + 0.5);
      BOOST_TEST(blocks[b].qs[j] == static_cast<std::int8_t>(r), "block " << b << " j " << j);
      BOOST_TEST(back[32 * b + j] == static_cast<float>(blocks[b].qs[j]) * dh);
      // within half a (fp32) scale plus the fp16 rounding of d times the code
      BOOST_TEST(std::fabs(back[32 * b + j] - x[32 * b + j]) <=
                 0.5 * d * (1 + 1e-6) + 127.0 * std::fabs(dh - d));
    }
  }
}

BOOST_AUTO_TEST_CASE(q8_0_refuses_partial_blocks_non_finite_and_fp16_overflow) {
  const auto p = hone_test::error_of<hone::config_error>(
      [] { (void)hc::quantize_q8_0(std::vector<float>(33)); });
  BOOST_TEST(p.find("multiple of 32") != std::string::npos, p);
  std::vector<float> x(64, 1.0f);
  x[40] = std::numeric_limits<float>::infinity();
  const auto i = hone_test::error_of<hone::config_error>([&] { (void)hc::quantize_q8_0(x); });
  BOOST_TEST(i.find("index 40") != std::string::npos, i);
  x[40] = 1e7f;
  const auto o = hone_test::error_of<hone::config_error>([&] { (void)hc::quantize_q8_0(x); });
  BOOST_TEST(o.find("block 1") != std::string::npos, o);
  BOOST_TEST(hc::quantize_q8_0({}).empty());
}

// ---- observers ----

BOOST_AUTO_TEST_CASE(minmax_and_moving_average_against_scans) {
  std::mt19937 rng(4);
  std::normal_distribution<float> d(0.5f, 2.0f);
  std::vector<std::vector<float>> batches(6, std::vector<float>(50));
  for (auto& b : batches)
    for (auto& v : b) v = d(rng);
  hc::minmax_observer mm;
  const auto r = hc::calibrate(mm, batches);
  float lo = batches[0][0], hi = batches[0][0];
  for (const auto& b : batches)
    for (const float v : b) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  BOOST_TEST(r.lo == lo);
  BOOST_TEST(r.hi == hi);

  hc::moving_average_minmax_observer ma(0.25f);
  const auto m = hc::calibrate(ma, batches);
  double olo = 0, ohi = 0;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    double blo = 1e300, bhi = -1e300;
    for (const float v : batches[i]) {
      blo = std::min(blo, static_cast<double>(v));
      bhi = std::max(bhi, static_cast<double>(v));
    }
    if (i == 0) {
      olo = blo;
      ohi = bhi;
    } else {
      olo = 0.75 * olo + 0.25 * blo;
      ohi = 0.75 * ohi + 0.25 * bhi;
    }
  }
  BOOST_TEST(m.lo == olo, boost::test_tools::tolerance(1e-5));
  BOOST_TEST(m.hi == ohi, boost::test_tools::tolerance(1e-5));
  BOOST_TEST(hc::minmax_observer{}.range().hi == 0.0f);
  const auto c =
      hone_test::error_of<hone::config_error>([] { hc::moving_average_minmax_observer bad(0.0f); });
  BOOST_TEST(c.find("(0, 1]") != std::string::npos, c);
}

BOOST_AUTO_TEST_CASE(percentile_against_a_full_sort) {
  std::mt19937 rng(5);
  std::cauchy_distribution<float> d(0.0f, 1.0f);
  std::vector<float> all(1001);
  for (auto& v : all) v = d(rng);
  hc::percentile_observer p(0.99);
  p.observe(std::span<const float>(all).first(500));
  p.observe(std::span<const float>(all).subspan(500));
  std::vector<double> s(all.begin(), all.end());
  std::sort(s.begin(), s.end());
  const auto q = [&](double t) {
    const double pos = t * (s.size() - 1);
    const auto i = static_cast<std::size_t>(pos);
    return i + 1 < s.size() ? s[i] + (pos - i) * (s[i + 1] - s[i]) : s[i];
  };
  const auto r = p.range();
  BOOST_TEST(r.lo == q(0.01), boost::test_tools::tolerance(1e-6));
  BOOST_TEST(r.hi == q(0.99), boost::test_tools::tolerance(1e-6));
  BOOST_TEST(r.hi < s.back());  // the tail is clipped
}

namespace {
/// MSE of symmetric int8 quantization with threshold t, all in double (scale t / 127).
double oracle_mse(const std::vector<float>& v, double t) {
  const double s = t / 127.0;
  double sum = 0;
  for (const float x : v) {
    const double q = std::max(-127.0, std::min(127.0, oracle_rne(x / s)));
    sum += (q * s - x) * (q * s - x);
  }
  return sum / static_cast<double>(v.size());
}
}  // namespace

BOOST_AUTO_TEST_CASE(mse_observer_against_a_dense_threshold_search) {
  std::mt19937 rng(6);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(4000);
  for (auto& x : v) x = d(rng);
  v[17] = 40.0f;  // an outlier: min-max spends most codes on it
  hc::mse_observer m(256);
  m.observe(v);
  const auto r = m.range();
  BOOST_TEST(r.lo == -r.hi);
  double best = 1e300;
  for (int i = 1; i <= 4000; ++i) best = std::min(best, oracle_mse(v, 40.0 * i / 4000.0));
  const double got = oracle_mse(v, r.hi);
  BOOST_TEST(got <= best * 1.02, "got " << got << " best " << best);
  BOOST_TEST(got < oracle_mse(v, 40.0));  // better than min-max
  BOOST_TEST(r.hi < 40.0f);
  BOOST_TEST(m.best_threshold().second == got, boost::test_tools::tolerance(1e-4));
}

BOOST_AUTO_TEST_CASE(affine_parameters_by_hand) {
  const auto p = hc::affine_uint8({-1.0f, 3.0f});
  BOOST_TEST(p.scale == 4.0f / 255.0f);
  BOOST_TEST(p.zero_point == 64);  // round_half_even(1 / (4 / 255)) = round(63.75)
  const auto z = hc::affine_uint8({0.0f, 0.0f});
  BOOST_TEST(z.scale == 1.0f);
  BOOST_TEST(z.zero_point == 0);
  const auto pos = hc::affine_uint8({2.0f, 5.1f});  // widened to [0, 5.1]
  BOOST_TEST(pos.zero_point == 0);
  BOOST_TEST(hc::symmetric_scale({-3.0f, 1.27f}) == 3.0f / 127.0f);
}
