// Tests of the 8-bit quantization of optimizer state: the dynamic maps against bitsandbytes'
// entries, the table-driven index against the binary search bit for bit, the nearest-entry rule,
// and the error bound of a block-wise round trip.
#define BOOST_TEST_MODULE hone_optim_quantization
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <hone/optim/quantization.hpp>
#include <random>
#include <vector>

#include "optim_check.hpp"

using namespace optim_test;

BOOST_AUTO_TEST_CASE(dynamic_maps_match_bitsandbytes) {
  const auto& s = hone::dynamic_map(true).values;
  const auto& u = hone::dynamic_map(false).values;
  BOOST_TEST(std::is_sorted(s.begin(), s.end()));
  BOOST_TEST(std::is_sorted(u.begin(), u.end()));
  BOOST_TEST(std::adjacent_find(s.begin(), s.end()) == s.end());  // 256 distinct values
  BOOST_TEST(std::adjacent_find(u.begin(), u.end()) == u.end());
  // Known entries of bitsandbytes' create_dynamic_map (float32).
  BOOST_TEST(s[255] == 1.0f);
  BOOST_TEST(s[127] == 0.0f);
  BOOST_TEST(s[128] == 5.5e-7f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(s[254] == 0.99296875f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(s[0] == -0.99296875f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(u[0] == 0.0f);
  BOOST_TEST(u[1] == 3.25e-7f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(u[254] == 0.996484375f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(u[255] == 1.0f);
  // Entries per decade [0.1, 1) * 10^-k: signed 64, 32, ..., 1 positives; unsigned 128, ..., 2.
  for (int k = 0; k < 7; ++k) {
    const float hi = std::pow(10.0f, static_cast<float>(-k));
    const float lo = hi / 10.0f;
    const auto count = [&](const std::array<float, 256>& m) {
      return std::count_if(m.begin(), m.end(), [&](float x) { return x >= lo && x < hi; });
    };
    BOOST_TEST(count(s) == (64 >> k), "signed decade " << k);
    BOOST_TEST(count(u) == (128 >> k), "unsigned decade " << k);
  }
}

// The direct index (adamw_8bit's encoder) against the binary search, bit for bit: every 512th
// float bit pattern (both signs, subnormals, infinities, NaN), both ends of every bucket and
// their neighbours, and every entry, midpoint and their neighbours; keep_sign too.
BOOST_AUTO_TEST_CASE(quantization_index_matches_the_binary_search) {
  for (bool is_signed : {true, false}) {
    const auto& idx = hone::dynamic_map_index(is_signed);
    BOOST_TEST_REQUIRE(idx.usable(), "a bucket of the dynamic map holds two entries");
    const float* map = idx.map();
    std::size_t checked = 0, bad = 0;
    auto check = [&](std::uint32_t bits) {
      float x;
      std::memcpy(&x, &bits, sizeof x);
      ++checked;
      const auto a = idx.nearest(x);
      const auto b = hone::quantize_nearest(map, x);
      if (a != b) {
        if (bad++ < 5) BOOST_TEST_MESSAGE("x " << x << " index " << int(a) << " search " << int(b));
      }
      for (float value : {x, -x, 1.0f, -1.0f}) {
        if (idx.nearest_keep_sign(x, value) != hone::quantize_keep_sign(map, x, value)) ++bad;
      }
    };
    for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); b += 512) {
      check(static_cast<std::uint32_t>(b) | 0x5au);
    }
    for (std::uint64_t k = 0; k < hone::quantization_index::buckets; ++k) {
      const auto first = static_cast<std::uint32_t>(k << hone::quantization_index::key_shift);
      const std::uint32_t last = first | ((1u << hone::quantization_index::key_shift) - 1u);
      for (std::uint32_t d = 0; d < 3; ++d) {
        check(first + d);
        check(last - d);
      }
    }
    auto around = [&](float v) {
      std::uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      for (std::uint32_t d = 0; d < 5; ++d) {
        check(bits + d);
        check(bits - d);
      }
    };
    for (int j = 0; j < 256; ++j) {
      around(map[j]);
      if (j < 255) around((map[j] + map[j + 1]) / 2.0f);
    }
    BOOST_TEST(bad == 0u,
               bad << " of " << checked << " values differ (signed " << is_signed << ")");
  }
}

BOOST_AUTO_TEST_CASE(quantize_nearest_is_the_nearest_entry) {
  std::mt19937 rng(5);
  for (bool sgn : {true, false}) {
    const auto& map = hone::dynamic_map(sgn).values;
    std::uniform_real_distribution<float> uni(sgn ? -1.1f : -0.1f, 1.1f);
    std::vector<float> xs;
    for (int i = 0; i < 20000; ++i) xs.push_back(uni(rng));
    for (int i = 0; i < 20000; ++i)  // small magnitudes across the decades
      xs.push_back((sgn && (i & 1) ? -1.0f : 1.0f) *
                   std::pow(10.0f, std::uniform_real_distribution<float>(-8.0f, 0.0f)(rng)));
    for (float x : map) xs.push_back(x);
    for (float x : xs) {
      int best = 0;
      for (int c = 1; c < 256; ++c) {
        if (std::fabs(map[c] - x) < std::fabs(map[best] - x)) best = c;
      }
      const int got = hone::quantize_nearest(map.data(), x);
      BOOST_REQUIRE_MESSAGE(std::fabs(map[got] - x) == std::fabs(map[best] - x),
                            "x = " << x << ": code " << got << " (" << map[got] << ") vs " << best
                                   << " (" << map[best] << ")");
    }
  }
}

BOOST_AUTO_TEST_CASE(blockwise_round_trip_error_is_bounded) {
  std::mt19937 rng(11);
  const std::size_t n = 256 * 37 + 101;  // a partial last block
  std::vector<float> x(n);
  // Magnitudes spread over 10 orders, random signs, plus exact zeros.
  std::uniform_real_distribution<float> e(-8.0f, 2.0f);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = (i % 97 == 0) ? 0.0f : ((i & 1) ? -1.0f : 1.0f) * std::pow(10.0f, e(rng));
  }
  for (bool sgn : {true, false}) {
    std::vector<float> in = x;
    if (!sgn) {
      for (auto& v : in) v = std::fabs(v);
    }
    const auto& map = hone::dynamic_map(sgn);
    double half_gap = 0.0;
    for (int c = 0; c + 1 < 256; ++c)
      half_gap = std::max(half_gap, 0.5 * (map.values[c + 1] - map.values[c]));
    BOOST_TEST(half_gap < (sgn ? 0.00704 : 0.00352));
    const std::size_t blocks = (n + 255) / 256;
    std::vector<std::uint8_t> codes(n);
    std::vector<float> absmax(blocks), out(n);
    hone::quantize_blockwise(in.data(), n, 256, map, codes.data(), absmax.data());
    hone::dequantize_blockwise(codes.data(), absmax.data(), n, 256, map, out.data());
    for (std::size_t b = 0; b < blocks; ++b) {
      float amax = 0.0f;
      for (std::size_t i = b * 256; i < std::min(n, b * 256 + 256); ++i)
        amax = std::max(amax, std::fabs(in[i]));
      BOOST_REQUIRE_EQUAL(absmax[b], amax);
    }
    for (std::size_t i = 0; i < n; ++i) {
      const double a = absmax[i / 256];
      BOOST_REQUIRE_MESSAGE(std::fabs(out[i] - in[i]) <= (half_gap + 1e-6) * a + 1e-30,
                            "element " << i << ": " << in[i] << " -> " << out[i]);
      if (in[i] == 0.0f) BOOST_REQUIRE_EQUAL(out[i], 0.0f);
      // The block maximum is exact, except -absmax: the signed map's lowest entry is -0.993.
      if (std::fabs(in[i]) == a) {
        BOOST_REQUIRE_EQUAL(out[i], in[i] < 0 ? map.values[0] * absmax[i / 256] : in[i]);
      }
    }
  }
  // The sign rule of the optimizer: a small negative value stays negative.
  const auto& s = hone::dynamic_map(true).values;
  const auto c = hone::quantize_keep_sign(s.data(), -1e-9f, -1e-9f);
  BOOST_TEST(s[c] < 0.0f);
  BOOST_TEST(s[hone::quantize_keep_sign(s.data(), 1e-9f, 1e-9f)] == 0.0f);
  BOOST_TEST(s[hone::quantize_keep_sign(s.data(), 0.0f, -0.0f)] == 0.0f);
}
