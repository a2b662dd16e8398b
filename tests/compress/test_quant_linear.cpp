// hone::compress dynamic int8 linear layer: every int8 GEMM kernel this CPU supports (scalar, AVX2,
// AVX-512 VNNI) against a plain int64 triple loop over the unpacked codes, exactly, on ragged
// shapes (k not a multiple of 4, n not a multiple of 16, m not a multiple of 4) and on extreme
// codes (255 x -127, where a saturating 16-bit path would go wrong); the per-row uint8 activation
// codes against an oracle; forward() against the oracle's epilogue and against a double-precision
// fp32 product within the quantization error bound; the same bits on 1 and 2 threads; sentences for
// bad input.
#define BOOST_TEST_MODULE hone_compress_quant_linear
#include <boost/test/unit_test.hpp>

#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <hone/compress/quant_linear.hpp>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../support/error_text.hpp"

namespace hc = hone::compress;

namespace {

const std::vector<hc::int8_kernel> all_kernels{hc::int8_kernel::scalar, hc::int8_kernel::avx2,
                                               hc::int8_kernel::avx512_vnni};

std::vector<hc::int8_kernel> supported_kernels() {
  std::vector<hc::int8_kernel> v;
  for (auto k : all_kernels) {
    if (hc::int8_kernel_supported(k)) v.push_back(k);
  }
  BOOST_TEST_MESSAGE("int8 kernels on this CPU: " << v.size() << " (best: "
                                                  << hc::int8_kernel_name(hc::best_int8_kernel())
                                                  << ")");
  return v;
}

/// c[r, o] = sum_k a[r, k] * w[o, k] over the unpacked codes, in int64.
std::vector<std::int64_t> oracle_gemm(const std::vector<std::uint8_t>& a,
                                      const std::vector<std::int8_t>& w, std::size_t m,
                                      std::size_t n, std::size_t k) {
  std::vector<std::int64_t> c(m * n, 0);
  for (std::size_t r = 0; r < m; ++r)
    for (std::size_t o = 0; o < n; ++o) {
      std::int64_t s = 0;
      for (std::size_t i = 0; i < k; ++i)
        s += std::int64_t{a[r * k + i]} * std::int64_t{w[o * k + i]};
      c[r * n + o] = s;
    }
  return c;
}

void check_gemm(std::size_t m, std::size_t n, std::size_t k, std::uint32_t seed, bool extreme) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> ua(0, 255), uw(-127, 127);
  std::vector<std::uint8_t> a(m * k);
  std::vector<std::int8_t> w(n * k);
  for (auto& v : a) v = static_cast<std::uint8_t>(extreme ? 255 : ua(rng));
  for (std::size_t i = 0; i < w.size(); ++i) {
    w[i] = static_cast<std::int8_t>(extreme ? (i % 3 == 0 ? 127 : -127) : uw(rng));
  }
  const auto want = oracle_gemm(a, w, m, n, k);
  const auto packed = hc::packed_int8_weights::pack(w, n, k);
  // the kernels read rows of kp bytes; padding bytes may hold anything (their weights are zero)
  std::vector<std::uint8_t> ap(m * packed.kp, 77);
  for (std::size_t r = 0; r < m; ++r) std::copy_n(&a[r * k], k, &ap[r * packed.kp]);
  for (const auto kern : supported_kernels()) {
    std::vector<std::int32_t> c(m * packed.np, -1);
    hc::int8_gemm(ap, m, packed, c, kern);
    std::size_t bad = 0;
    for (std::size_t r = 0; r < m; ++r)
      for (std::size_t o = 0; o < n; ++o) bad += c[r * packed.np + o] != want[r * n + o];
    BOOST_TEST(bad == 0u, hc::int8_kernel_name(kern) << " m " << m << " n " << n << " k " << k
                                                     << ": " << bad << " wrong accumulators");
  }
}

std::vector<float> normal(std::size_t n, std::uint32_t seed, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// forward() with every kernel against the oracle epilogue over the triple-loop accumulators, bit
/// for bit: y = float(double(sx) * sw * double(acc - zp * wsum) + b), the product not fused with
/// the add (as in a build without FMA); and every kernel's y identical.
void check_forward(std::size_t m, std::size_t k, std::size_t n, std::uint32_t seed, bool bias) {
  const auto w = normal(n * k, seed);
  const auto x = normal(m * k, seed + 1, 0.3f);
  const auto b = bias ? normal(n, seed + 2) : std::vector<float>{};
  hc::dynamic_int8_linear lin(w, n, k, b);
  const auto& q = lin.weights();
  std::vector<std::int64_t> wsum(n, 0);
  for (std::size_t o = 0; o < n; ++o)
    for (std::size_t i = 0; i < k; ++i) wsum[o] += q.values[o * k + i];
  std::vector<std::vector<float>> outs;
  for (const auto kern : supported_kernels()) {
    std::vector<float> y(m * n, -7.0f);
    lin.forward(x, m, y, kern);
    const auto a_pad = lin.last_activations();
    std::vector<std::uint8_t> a(m * k);
    for (std::size_t r = 0; r < m; ++r)
      for (std::size_t i = 0; i < k; ++i) a[r * k + i] = a_pad[r * lin.packed().kp + i];
    const auto acc = oracle_gemm(a, q.values, m, n, k);
    std::size_t bad = 0;
    for (std::size_t r = 0; r < m; ++r) {
      const auto p = lin.last_activation_params()[r];
      for (std::size_t o = 0; o < n; ++o) {
        volatile double v =
            double{p.scale} * q.scales[o] * double(acc[r * n + o] - p.zero_point * wsum[o]);
        const double want = v + (bias ? double{b[o]} : 0.0);
        bad += y[r * n + o] != static_cast<float>(want);
      }
    }
    BOOST_TEST(bad == 0u, hc::int8_kernel_name(kern)
                              << " m " << m << " k " << k << " n " << n << ": " << bad
                              << " outputs differ from the oracle");
    outs.push_back(std::move(y));
  }
  for (std::size_t i = 1; i < outs.size(); ++i)
    BOOST_TEST((outs[i] == outs[0]), "kernel " << i << " m " << m);
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_kernel_gives_the_oracle_accumulators_exactly) {
  check_gemm(1, 16, 4, 1, false);
  check_gemm(3, 17, 5, 2, false);
  check_gemm(5, 33, 67, 3, false);
  check_gemm(7, 100, 130, 4, false);
  check_gemm(9, 48, 1, 5, false);
  check_gemm(2, 64, 12, 9, false);     // with the others, every remainder of the 8-row tiles
  check_gemm(70, 300, 257, 6, false);  // large enough for oneTBB tiles
  check_gemm(4, 32, 1000, 7, true);    // 255 * -127 everywhere: no saturation anywhere
  check_gemm(6, 40, 4096, 8, true);
}

BOOST_AUTO_TEST_CASE(every_row_tile_and_panel_remainder_is_exact) {
  // m = 1..17 and 33: every remainder of the 8-row tiles, alone and after full tiles; n = 48: a
  // pair of panels then a single one; n = 33: a padded last panel; k = 37: padded groups
  for (std::size_t m = 1; m <= 17; ++m) {
    check_gemm(m, 48, 37, 100 + static_cast<std::uint32_t>(m), false);
    check_gemm(m, 33, 8, 200 + static_cast<std::uint32_t>(m), false);
  }
  check_gemm(33, 48, 37, 301, false);
  check_gemm(33, 17, 1030, 302, true);  // k past 1024 with extreme codes
}

BOOST_AUTO_TEST_CASE(forward_is_exact_on_ragged_shapes_and_large_ones) {
  // the AVX-512 epilogue's masked last panel (n % 16 != 0), n below one panel, every row tile
  // remainder, with and without bias
  for (std::size_t m : {1u, 2u, 7u, 8u, 9u, 15u, 16u, 17u, 33u}) {
    check_forward(m, 37, 45, 400 + static_cast<std::uint32_t>(m), true);
  }
  check_forward(3, 5, 1, 410, true);
  check_forward(5, 64, 15, 411, false);
  check_forward(4, 16, 16, 412, true);
  check_forward(6, 130, 17, 413, false);
  // above the oneTBB thresholds of the product (2^20) and of the epilogue (2^16 outputs)
  check_forward(70, 20, 1000, 414, true);
}

BOOST_AUTO_TEST_CASE(activation_codes_match_the_oracle) {
  for (const auto kern : supported_kernels()) {
    for (const std::size_t len : {301u, 16u, 15u, 1u}) {  // whole vectors and masked tails
      const auto x = normal(len, 9 + static_cast<std::uint32_t>(len), 0.7f);
      std::vector<std::uint8_t> q(len + 3, 0);
      const auto p = hc::quantize_row_uint8(x, q, kern);
      float lo = 0, hi = 0;
      for (const float v : x) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      BOOST_TEST(p.scale == (hi - lo) / 255.0f);
      BOOST_TEST(p.zero_point == static_cast<int>(std::nearbyint(-lo / p.scale)));
      const float inv = 1.0f / p.scale;
      for (std::size_t i = 0; i < x.size(); ++i) {
        const double v = std::nearbyint(x[i] * inv) + p.zero_point;
        BOOST_TEST(int{q[i]} == static_cast<int>(std::max(0.0, std::min(255.0, v))),
                   hc::int8_kernel_name(kern) << " len " << len << " i " << i);
        // dequantized within half a step
        BOOST_TEST(std::fabs(p.scale * (int{q[i]} - p.zero_point) - x[i]) <=
                   0.5 * p.scale * (1 + 1e-5));
      }
      for (std::size_t i = x.size(); i < q.size(); ++i) BOOST_TEST(int{q[i]} == p.zero_point);
    }
    // a zero row: scale 1, zero point 0, zero codes
    std::vector<float> z(8, 0.0f);
    std::vector<std::uint8_t> zq(8, 9);
    const auto zp = hc::quantize_row_uint8(z, zq, kern);
    BOOST_TEST(zp.zero_point == 0);
    BOOST_TEST(int{zq[3]} == 0);
    z[5] = std::numeric_limits<float>::infinity();
    const auto e =
        hone_test::error_of<hone::config_error>([&] { (void)hc::quantize_row_uint8(z, zq, kern); });
    BOOST_TEST(e.find("index 5") != std::string::npos, e);
  }
}

BOOST_AUTO_TEST_CASE(forward_matches_the_oracle_epilogue_and_the_fp32_product) {
  const std::size_t m = 11, k = 203, n = 45;
  const auto w = normal(n * k, 10);
  const auto x = normal(m * k, 11, 0.3f);
  const auto b = normal(n, 12);
  hc::dynamic_int8_linear lin(w, n, k, b);
  const auto& q = lin.weights();
  std::vector<std::vector<float>> outs;
  for (const auto kern : supported_kernels()) {
    std::vector<float> y(m * n);
    lin.forward(x, m, y, kern);
    outs.push_back(y);
    // the oracle: codes from the activations this call made, accumulators from the triple loop
    const auto a_pad = lin.last_activations();
    std::vector<std::uint8_t> a(m * k);
    for (std::size_t r = 0; r < m; ++r)
      for (std::size_t i = 0; i < k; ++i) a[r * k + i] = a_pad[r * lin.packed().kp + i];
    const auto acc = oracle_gemm(a, q.values, m, n, k);
    for (std::size_t r = 0; r < m; ++r) {
      const auto p = lin.last_activation_params()[r];
      double sx_check_lo = 0, sx_check_hi = 0;
      for (std::size_t i = 0; i < k; ++i) {
        sx_check_lo = std::min(sx_check_lo, double{x[r * k + i]});
        sx_check_hi = std::max(sx_check_hi, double{x[r * k + i]});
      }
      BOOST_TEST(p.scale == static_cast<float>(sx_check_hi - sx_check_lo) / 255.0f,
                 boost::test_tools::tolerance(1e-6f));
      for (std::size_t o = 0; o < n; ++o) {
        std::int64_t wsum = 0;
        for (std::size_t i = 0; i < k; ++i) wsum += q.values[o * k + i];
        const double want =
            double{p.scale} * q.scales[o] * double(acc[r * n + o] - p.zero_point * wsum) + b[o];
        BOOST_TEST(y[r * n + o] == static_cast<float>(want), "r " << r << " o " << o);
        // against the fp32 layer in double: the error of x w with |dx| <= sx / 2, |dw| <= sw / 2
        double exact = b[o], bound = 0;
        for (std::size_t i = 0; i < k; ++i) {
          const double xv = x[r * k + i], wv = w[o * k + i];
          exact += xv * wv;
          bound += 0.5 * p.scale * std::fabs(wv) + 0.5 * q.scales[o] * std::fabs(xv) +
                   0.25 * p.scale * q.scales[o];
        }
        BOOST_TEST(std::fabs(y[r * n + o] - exact) <= bound * 1.0001 + 1e-5,
                   "r " << r << " o " << o);
      }
    }
  }
  for (std::size_t i = 1; i < outs.size(); ++i)
    BOOST_TEST(outs[i] == outs[0], boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(same_bits_on_one_and_two_threads) {
  const std::size_t m = 96, k = 512, n = 256;  // above the threshold for oneTBB tiles
  const auto w = normal(n * k, 13);
  const auto x = normal(m * k, 14);
  hc::dynamic_int8_linear lin(w, n, k);
  std::vector<float> y1(m * n), y2(m * n);
  tbb::task_arena(1).execute([&] { lin.forward(x, m, y1); });
  tbb::task_arena(2).execute([&] { lin.forward(x, m, y2); });
  BOOST_TEST(y1 == y2, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(per_tensor_weights_work_too) {
  const std::size_t m = 3, k = 40, n = 20;
  const auto w = normal(n * k, 15);
  const auto x = normal(m * k, 16);
  hc::dynamic_int8_linear lin(hc::quantize_weights(w, n, k, hc::quant_granularity::per_tensor));
  std::vector<float> y(m * n);
  lin.forward(x, m, y, hc::int8_kernel::scalar);
  const float sw = lin.weights().scales[0];
  for (std::size_t r = 0; r < m; ++r) {
    const float sx = lin.last_activation_params()[r].scale;
    for (std::size_t o = 0; o < n; ++o) {
      double exact = 0, bound = 0;
      for (std::size_t i = 0; i < k; ++i) {
        exact += double{x[r * k + i]} * w[o * k + i];
        bound += 0.5 * sx * std::fabs(w[o * k + i]) + 0.5 * sw * std::fabs(x[r * k + i]) +
                 0.25 * sx * sw;
      }
      BOOST_TEST(std::fabs(y[r * n + o] - exact) <= bound * 1.0001 + 1e-5);
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_input_is_refused_with_sentences) {
  const auto w = normal(8 * 4, 17);
  hc::dynamic_int8_linear lin(w, 8, 4);
  std::vector<float> x(2 * 4, 1.0f), y(2 * 8);
  const auto s = hone_test::error_of<hone::config_error>([&] { lin.forward(x, 3, y); });
  BOOST_TEST(s.find("m * in_features = 12") != std::string::npos, s);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  const auto n = hone_test::error_of<hone::config_error>([&] { lin.forward(x, 2, y); });
  BOOST_TEST(n.find("row 1, column 1") != std::string::npos, n);
  const auto b = hone_test::error_of<hone::config_error>(
      [&] { hc::dynamic_int8_linear bad(w, 8, 4, std::vector<float>(3)); });
  BOOST_TEST(b.find("out_features = 8") != std::string::npos, b);
  const auto e =
      hone_test::error_of<hone::config_error>([&] { hc::dynamic_int8_linear bad({}, 0, 4); });
  BOOST_TEST(e.find("at least one") != std::string::npos, e);
  for (auto k : all_kernels) {
    if (hc::int8_kernel_supported(k)) continue;
    x[5] = 1.0f;
    const auto u = hone_test::error_of<hone::config_error>([&] { lin.forward(x, 2, y, k); });
    BOOST_TEST(u.find("not supported by this CPU") != std::string::npos, u);
  }
}
