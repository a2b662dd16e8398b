// hone::compress fake quantization of activations (qat_activations.hpp) against a scalar double
// oracle of torch's formulas: the observers' ranges and the scale / zero point per step (moving
// average, min-max, affine quint8 and qint8, symmetric qint8), the fake-quantized values and the
// gradient mask (allowing one quantum only where x / scale lies within float rounding of a tie),
// hand-computed ties and boundaries, the observer / fake-quant switches, in place against out of
// place; the conversion to ptq.hpp's static int8 layer against the float forward on fake-quantized
// input; a small QAT loop through the straight-through backward; and the error sentences. The
// bit-for-bit comparison with torch itself is compress_qat_activations_interop
// (qat_activations_interop.py).
#define BOOST_TEST_MODULE hone_compress_qat_activations
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <hone/compress/qat.hpp>
#include <hone/compress/qat_activations.hpp>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../support/error_text.hpp"

namespace hc = hone::compress;

namespace {

std::vector<float> normal(std::size_t n, unsigned seed, float mean = 0.0f, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Batches of several sizes and shapes: mixed sign, ReLU-like, drifting, with an outlier.
std::vector<std::vector<float>> batch_sequence(std::size_t count, unsigned seed) {
  std::vector<std::vector<float>> out;
  for (std::size_t b = 0; b < count; ++b) {
    const auto u = static_cast<unsigned>(b);
    std::vector<float> v = normal(1 + (b * 37) % 300, seed + u, 0.1f * static_cast<float>(b % 5),
                                  0.5f + 0.25f * static_cast<float>(b % 7));
    if (b % 3 == 1) {
      for (auto& x : v) x = std::max(x, 0.0f);  // after a ReLU
    }
    if (b % 11 == 5) v[0] = 40.0f;  // an outlier
    out.push_back(std::move(v));
  }
  return out;
}

bool has(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

/// torch's observer + _calculate_qparams + fake_quantize_per_tensor_affine, in double.
struct oracle {
  hc::activation_fake_quant_options o;
  bool seen = false;
  double lo = 0, hi = 0;
  double scale = 1;
  long zp = 0;

  void observe(const std::vector<float>& x) {
    double mn = x[0], mx = x[0];
    for (const float v : x) {
      mn = std::min(mn, double{v});
      mx = std::max(mx, double{v});
    }
    if (!seen) {
      lo = mn;
      hi = mx;
      seen = true;
    } else if (o.observer == hc::fake_quant_observer::minmax) {
      lo = std::min(lo, mn);
      hi = std::max(hi, mx);
    } else {
      const double c = o.averaging_constant;
      lo += c * (mn - lo);
      hi += c * (mx - hi);
    }
    const double l = std::min(lo, 0.0), h = std::max(hi, 0.0);
    const double qmin = o.quant_min, qmax = o.quant_max;
    const double eps = std::numeric_limits<float>::epsilon();
    if (o.scheme == hc::fake_quant_scheme::symmetric) {
      scale = std::max(std::max(-l, h) / ((qmax - qmin) / 2), eps);
      zp = 0;
    } else {
      scale = std::max((h - l) / (qmax - qmin), eps);
      zp = static_cast<long>(std::clamp(qmin - std::nearbyint(l / scale), qmin, qmax));
    }
  }
  /// l / scale (whose rounding gives the zero point) for the tie test.
  [[nodiscard]] double zero_point_argument() const { return std::min(lo, 0.0) / scale; }
};

/// Distance of t from the nearest half-integer k + 0.5.
double tie_distance(double t) {
  return std::fabs(t - std::floor(t) - 0.5);
}

struct fq_ref {
  double y;
  bool pass;
};
/// The fake-quantized value and mask of x with (scale, zp), in double.
fq_ref fake_quant_double(double x, double scale, long zp, long qmin, long qmax) {
  const double q = static_cast<double>(zp) + std::nearbyint(x / scale);
  const double c = std::clamp(q, static_cast<double>(qmin), static_cast<double>(qmax));
  return {(c - static_cast<double>(zp)) * scale,
          q >= static_cast<double>(qmin) && q <= static_cast<double>(qmax)};
}

const std::vector<hc::activation_fake_quant_options>& option_sets() {
  static const std::vector<hc::activation_fake_quant_options> sets = {
      hc::quint8_affine_activations(),
      hc::quint8_affine_activations(hc::fake_quant_observer::minmax),
      hc::qint8_symmetric_activations(),
      {.averaging_constant = 0.25f, .quant_min = -128, .quant_max = 127},  // qint8 affine
      {.observer = hc::fake_quant_observer::minmax,
       .scheme = hc::fake_quant_scheme::symmetric,
       .quant_min = -127,
       .quant_max = 127},
  };
  return sets;
}

}  // namespace

BOOST_AUTO_TEST_CASE(qparams_against_double_formulas_and_by_hand) {
  const std::vector<hc::quant_range> ranges = {
      {0, 0},   {0, 1},          {-1, 0},         {-0.3f, 2.7f},     {2, 5},
      {-5, -2}, {-1e-9f, 1e-9f}, {-3.1e5f, 7.2f}, {-0.001f, 1234.5f}};
  for (std::size_t k = 0; k < option_sets().size(); ++k) {
    const auto& o = option_sets()[k];
    for (const hc::quant_range r : ranges) {
      BOOST_TEST_CONTEXT("options " << k << ", range [" << r.lo << ", " << r.hi << "]") {
        oracle d{o};
        d.observe({r.lo, r.hi});  // one batch: the range is the batch's min and max
        const hc::affine_params p = hc::fake_quant_qparams(r, o);
        BOOST_TEST(std::fabs(p.scale - d.scale) <= 2e-7 * d.scale);
        if (tie_distance(d.zero_point_argument()) > 1e-4) {
          BOOST_TEST(p.zero_point == d.zp);
        } else {
          BOOST_TEST(std::abs(p.zero_point - d.zp) <= 1);
        }
        BOOST_TEST(p.zero_point >= o.quant_min);
        BOOST_TEST(p.zero_point <= o.quant_max);
      }
    }
  }
  const auto q8 = hc::quint8_affine_activations();
  const auto s8 = hc::qint8_symmetric_activations();
  const float eps = std::numeric_limits<float>::epsilon();
  BOOST_TEST(hc::fake_quant_qparams({0, 255}, q8).scale == 1.0f);
  BOOST_TEST(hc::fake_quant_qparams({0, 255}, q8).zero_point == 0);
  BOOST_TEST(hc::fake_quant_qparams({-255, 0}, q8).zero_point == 255);
  BOOST_TEST(hc::fake_quant_qparams({-1, 254}, q8).zero_point == 1);
  BOOST_TEST(hc::fake_quant_qparams({2, 5}, q8).scale == 5.0f / 255.0f);  // widened to [0, 5]
  BOOST_TEST(hc::fake_quant_qparams({2, 5}, q8).zero_point == 0);
  BOOST_TEST(hc::fake_quant_qparams({-5, -2}, q8).zero_point == 255);
  BOOST_TEST(hc::fake_quant_qparams({0, 0}, q8).scale == eps);  // torch's eps clamp
  BOOST_TEST(hc::fake_quant_qparams({0, 0}, q8).zero_point == 0);
  BOOST_TEST(hc::fake_quant_qparams({-127.5f, 1}, s8).scale == 1.0f);
  BOOST_TEST(hc::fake_quant_qparams({-1, 255}, s8).scale == 2.0f);
  BOOST_TEST(hc::fake_quant_qparams({-1, 255}, s8).zero_point == 0);
  // -0.5 / (255 / 255) rounds half to even: zero point 0 - round(-0.5) = 0; -1.5 gives 2.
  BOOST_TEST(hc::fake_quant_qparams({-0.5f, 254.5f}, q8).zero_point == 0);
  BOOST_TEST(hc::fake_quant_qparams({-1.5f, 253.5f}, q8).zero_point == 2);
}

BOOST_AUTO_TEST_CASE(batch_sequence_against_double_oracle) {
  const auto batches = batch_sequence(60, 17);
  for (std::size_t k = 0; k < option_sets().size(); ++k) {
    const auto& o = option_sets()[k];
    hc::activation_fake_quant fq(o);
    BOOST_TEST(fq.scale() == 1.0f);  // torch's initial buffers
    BOOST_TEST(fq.zero_point() == 0);
    oracle d{o};
    std::size_t values = 0, near_ties = 0, clipped_total = 0;
    for (std::size_t b = 0; b < batches.size(); ++b) {
      BOOST_TEST_CONTEXT("options " << k << ", batch " << b) {
        const std::vector<float>& x = batches[b];
        const hc::quant_range before = fq.observed_range();
        std::vector<float> y(x.size());
        fq.forward(x, y);
        d.observe(x);
        const hc::quant_range r = fq.observed_range();
        if (b == 0) {  // the first batch sets the range exactly
          BOOST_TEST(r.lo == *std::min_element(x.begin(), x.end()));
          BOOST_TEST(r.hi == *std::max_element(x.begin(), x.end()));
        } else if (o.observer == hc::fake_quant_observer::moving_average_minmax) {
          // the float update torch makes, bit for bit
          const float c = o.averaging_constant;
          const float mn = *std::min_element(x.begin(), x.end());
          const float mx = *std::max_element(x.begin(), x.end());
          BOOST_TEST(r.lo == before.lo + c * (mn - before.lo));
          BOOST_TEST(r.hi == before.hi + c * (mx - before.hi));
        }
        const double width = std::max(d.hi - d.lo, 1e-6);
        BOOST_TEST(std::fabs(r.lo - d.lo) <= 1e-5 * width);
        BOOST_TEST(std::fabs(r.hi - d.hi) <= 1e-5 * width);
        BOOST_TEST(std::fabs(fq.scale() - d.scale) <= 1e-5 * d.scale);
        if (tie_distance(d.zero_point_argument()) > 1e-3) {
          BOOST_TEST(fq.zero_point() == d.zp);
        } else {
          BOOST_TEST(std::abs(fq.zero_point() - d.zp) <= 1);
        }
        BOOST_TEST(fq.qparams().scale == hc::fake_quant_qparams(r, o).scale);
        BOOST_TEST(fq.qparams().zero_point == hc::fake_quant_qparams(r, o).zero_point);
        // the values and the mask with hone's parameters, in double
        const double s = fq.scale();
        std::size_t clipped = 0;
        std::vector<float> g(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) g[i] = 1.0f + static_cast<float>(i % 5);
        std::vector<float> gx(x.size());
        fq.backward(g, gx);
        for (std::size_t i = 0; i < x.size(); ++i) {
          const fq_ref e = fake_quant_double(x[i], s, fq.zero_point(), o.quant_min, o.quant_max);
          clipped += e.pass ? 0 : 1;
          if (tie_distance(double{x[i]} / s) > 1e-5) {
            BOOST_TEST(double{y[i]} == e.y, boost::test_tools::tolerance(1e-6));
            BOOST_TEST(fq.passes(i) == e.pass);
          } else {
            ++near_ties;
            BOOST_TEST(std::fabs(double{y[i]} - e.y) <= s * (1 + 1e-6));
          }
          BOOST_TEST(gx[i] == (fq.passes(i) ? g[i] : 0.0f));
        }
        values += x.size();
        clipped_total += fq.clipped();
        BOOST_TEST(fq.clipped() == clipped);
        BOOST_TEST(fq.mask_size() == x.size());
      }
    }
    BOOST_TEST(fq.observations() == batches.size());
    BOOST_TEST(near_ties * 1000 < values);
    if (o.observer == hc::fake_quant_observer::moving_average_minmax) {
      BOOST_TEST(clipped_total > 0);  // outliers past the moving range clip: the mask matters
    } else {
      BOOST_TEST(clipped_total == 0u);  // the running min-max always covers the batch
    }
  }
}

BOOST_AUTO_TEST_CASE(ties_and_boundaries_by_hand) {
  {  // quint8, scale 1, zero point 0 (range [0, 255]), frozen
    hc::activation_fake_quant fq(hc::quint8_affine_activations(hc::fake_quant_observer::minmax));
    std::vector<float> calib = {0.0f, 255.0f};
    fq.forward(calib);
    BOOST_TEST(fq.scale() == 1.0f);
    BOOST_TEST(fq.zero_point() == 0);
    fq.disable_observer();
    std::vector<float> x = {2.5f, 3.5f, -0.5f, -0.6f, 255.4f, 255.5f, 254.5f, 300.0f, -7.0f};
    const std::vector<float> want = {2, 4, 0, 0, 255, 255, 254, 255, 0};
    const std::vector<bool> pass = {true, true, true, false, true, false, true, false, false};
    fq.forward(x);
    std::vector<float> g(x.size(), 3.0f);
    fq.backward(g);
    for (std::size_t i = 0; i < x.size(); ++i) {
      BOOST_TEST_CONTEXT("value " << i) {
        BOOST_TEST(x[i] == want[i]);
        BOOST_TEST(!std::signbit(x[i]));  // -0.5 rounds to -0, and gives +0 as torch
        BOOST_TEST(fq.passes(i) == pass[i]);
        BOOST_TEST(g[i] == (pass[i] ? 3.0f : 0.0f));
      }
    }
    BOOST_TEST(fq.clipped() == 4u);
    BOOST_TEST(fq.mask_words()[0] == 0b001010111u);
  }
  {  // zero point 1: [-1, 254]
    hc::activation_fake_quant fq(hc::quint8_affine_activations(hc::fake_quant_observer::minmax));
    std::vector<float> calib = {-1.0f, 254.0f};
    fq.forward(calib);
    BOOST_TEST(fq.zero_point() == 1);
    fq.disable_observer();
    std::vector<float> x = {-1.4f, -1.5f, -1.6f, 254.5f, 254.6f};
    fq.forward(x);
    BOOST_TEST(x == (std::vector<float>{-1, -1, -1, 254, 254}), boost::test_tools::per_element());
    // q = 1 + round_half_even(x): 0, -1 (-1.5 rounds to -2), -1, 255 (254.5 rounds to 254), 256
    BOOST_TEST(fq.mask_words()[0] == 0b01001u);
  }
  {  // qint8 symmetric, scale 1 (max |x| = 127.5), zero point 0
    hc::activation_fake_quant fq(hc::qint8_symmetric_activations(hc::fake_quant_observer::minmax));
    std::vector<float> calib = {-127.5f, 3.0f};
    fq.forward(calib);
    BOOST_TEST(fq.scale() == 1.0f);
    BOOST_TEST(fq.zero_point() == 0);
    fq.disable_observer();
    std::vector<float> x = {127.4f, 127.5f, 126.5f, -128.4f, -128.5f, -128.6f, -0.2f};
    fq.forward(x);
    BOOST_TEST(x == (std::vector<float>{127, 127, 126, -128, -128, -128, 0}),
               boost::test_tools::per_element());
    BOOST_TEST(!std::signbit(x[6]));
    BOOST_TEST(fq.mask_words()[0] == 0b1011101u);
  }
}

BOOST_AUTO_TEST_CASE(switches_freeze_and_bypass) {
  hc::activation_fake_quant fq;
  BOOST_TEST(fq.observer_enabled());
  BOOST_TEST(fq.fake_quant_enabled());
  const auto batches = batch_sequence(8, 5);
  for (const auto& b : batches) {
    std::vector<float> x = b;
    fq.forward(x);
  }
  const hc::quant_range r = fq.observed_range();
  const hc::affine_params p = fq.qparams();
  // observer off: the range and the parameters stay; values outside are clipped
  fq.disable_observer();
  std::vector<float> wide = normal(100, 9, 0.0f, 50.0f);
  std::vector<float> y(wide.size());
  fq.forward(wide, y);
  BOOST_TEST(fq.observations() == batches.size());
  BOOST_TEST(fq.observed_range().lo == r.lo);
  BOOST_TEST(fq.observed_range().hi == r.hi);
  BOOST_TEST(fq.scale() == p.scale);
  BOOST_TEST(fq.zero_point() == p.zero_point);
  BOOST_TEST(fq.clipped() > 50u);
  const float top = (255.0f - static_cast<float>(p.zero_point)) * p.scale;
  BOOST_TEST(*std::max_element(y.begin(), y.end()) == top);
  // fake quantization off: y = x, every gradient passes; the observer (back on) still observes
  fq.enable_observer();
  fq.disable_fake_quant();
  BOOST_TEST(!fq.fake_quant_enabled());
  std::vector<float> x = normal(70, 10, 0.0f, 3.0f);
  y.assign(x.size(), 0.0f);
  fq.forward(x, y);
  BOOST_TEST(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  BOOST_TEST(fq.clipped() == 0u);
  BOOST_TEST(fq.mask_words()[1] == (std::uint64_t{1} << 6) - 1);  // no bits past 70
  std::vector<float> g(x.size(), 2.0f);
  fq.backward(g);
  BOOST_TEST(std::all_of(g.begin(), g.end(), [](float v) { return v == 2.0f; }));
  BOOST_TEST(fq.observations() == batches.size() + 1);
  BOOST_TEST(fq.observed_range().lo != r.lo);
  // back on: quantizes with the parameters of the range observed meanwhile
  fq.enable_fake_quant();
  fq.disable_observer();
  fq.forward(x, y);
  BOOST_TEST(fq.qparams().scale == hc::fake_quant_qparams(fq.observed_range(), fq.options()).scale);
  BOOST_TEST(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0);
}

BOOST_AUTO_TEST_CASE(in_place_equals_out_of_place) {
  for (const auto& o : option_sets()) {
    hc::activation_fake_quant a(o), b(o);
    for (const auto& x : batch_sequence(12, 23)) {
      std::vector<float> y(x.size()), z = x;
      a.forward(x, y);
      b.forward(z);
      BOOST_TEST(std::memcmp(y.data(), z.data(), y.size() * sizeof(float)) == 0);
      std::vector<float> g = normal(x.size(), 3), gx(x.size());
      a.backward(g, gx);
      b.backward(g);
      BOOST_TEST(std::memcmp(g.data(), gx.data(), g.size() * sizeof(float)) == 0);
      BOOST_TEST(std::equal(a.mask_words().begin(), a.mask_words().end(), b.mask_words().begin(),
                            b.mask_words().end()));
    }
    hc::activation_fake_quant c = a;  // copies are independent
    std::vector<float> x = normal(10, 4, 0.0f, 100.0f);
    c.forward(x);
    BOOST_TEST(c.observations() == a.observations() + 1);
  }
}

namespace {

/// y [m, out] = x [m, in] W^T + b in double, rounded once.
std::vector<float> linear_double(const std::vector<float>& x, std::size_t m,
                                 const std::vector<float>& w, std::size_t out, std::size_t in,
                                 const std::vector<float>& b,
                                 std::vector<double>* abs_sum = nullptr) {
  std::vector<float> y(m * out);
  if (abs_sum) abs_sum->assign(m * out, 0.0);
  for (std::size_t r = 0; r < m; ++r) {
    for (std::size_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : double{b[o]}, a = std::fabs(s);
      for (std::size_t k = 0; k < in; ++k) {
        const double t = double{x[r * in + k]} * double{w[o * in + k]};
        s += t;
        a += std::fabs(t);
      }
      y[r * out + o] = static_cast<float>(s);
      if (abs_sum) (*abs_sum)[r * out + o] = a;
    }
  }
  return y;
}

/// The static layer converted from fq, run on x [m, in], against the float forward on the
/// fake-quantized x with the fake-quantized weights: the activation codes exactly, the outputs
/// within float rounding of the sums.
void check_conversion(const hc::activation_fake_quant& fq_in, const std::vector<float>& w,
                      std::size_t out, std::size_t in, const std::vector<float>& b,
                      const std::vector<float>& x, std::size_t m) {
  hc::activation_fake_quant fq = fq_in;  // the forward below must not move the learned range
  fq.disable_observer();
  hc::ptq_linear l = hc::convert_to_static_int8("fc", w, out, in, b, fq);
  const hc::affine_params a = l.activation();
  BOOST_TEST(a.scale == fq.scale());
  BOOST_TEST(a.zero_point == fq.zero_point() - fq.options().quant_min);
  std::vector<float> y(m * out);
  l.forward(x, m, y);
  std::vector<float> xq(x.size());
  fq.forward(x, xq);
  BOOST_TEST(fq.clipped() > 0u);  // the test batch reaches past the learned range
  std::vector<float> wq(w.size());
  hc::fake_quantize(w, out, in, hc::quant_granularity::per_channel, wq);
  std::vector<double> bound;
  const std::vector<float> want = linear_double(xq, m, wq, out, in, b, &bound);
  const auto codes = l.last_activations();
  const std::size_t kp = codes.size() / m;
  for (std::size_t r = 0; r < m; ++r) {
    for (std::size_t k = 0; k < in; ++k) {
      const double q = std::nearbyint(double{xq[r * in + k]} / double{fq.scale()});
      BOOST_TEST(static_cast<double>(codes[r * kp + k]) - a.zero_point == q);
    }
    for (std::size_t o = 0; o < out; ++o) {
      const std::size_t i = r * out + o;
      BOOST_TEST(std::fabs(double{y[i]} - double{want[i]}) <= 1e-6 * bound[i] + 1e-30);
    }
  }
  // the overload taking the weights' codes is the same layer
  hc::ptq_linear l2 = hc::convert_to_static_int8(
      "fc", hc::quantize_weights(w, out, in, hc::quant_granularity::per_channel), b, fq);
  std::vector<float> y2(m * out);
  l2.forward(x, m, y2);
  BOOST_TEST(std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)) == 0);
}

}  // namespace

BOOST_AUTO_TEST_CASE(conversion_to_the_static_int8_layer) {
  const std::size_t in = 24, out = 5, m = 9;
  const std::vector<float> w = normal(out * in, 41, 0.0f, 0.3f), b = normal(out, 42);
  std::vector<float> x = normal(m * in, 43, 0.2f, 3.0f);  // wider than the training batches
  for (std::size_t k = 0; k < option_sets().size(); ++k) {
    const auto& o = option_sets()[k];
    BOOST_TEST_CONTEXT("options " << k) {
      hc::activation_fake_quant fq(o);
      for (const auto& bt : batch_sequence(20, 44)) {
        std::vector<float> v = bt;
        fq.forward(v);
      }
      if (o.quant_max - o.quant_min != 255) {
        BOOST_TEST(has(hone_test::error_of<hone::config_error>(
                           [&] { (void)hc::convert_to_static_int8("fc", w, out, in, b, fq); }),
                       "the static int8 layer reads 256 codes"));
        continue;
      }
      check_conversion(fq, w, out, in, b, x, m);
    }
  }
}

BOOST_AUTO_TEST_CASE(qat_loop_through_the_straight_through_backward) {
  // x [rows, 6] -> fc1 (6 -> 12) -> ReLU -> activation fake quant -> fc2 (12 -> 1), plain SGD on
  // a teacher's targets; the observer is frozen for the last 100 steps; then fc2 becomes a static
  // int8 layer reading the learned activation scale.
  const std::size_t in = 6, hidden = 12, rows = 32, steps = 400;
  std::vector<float> w1 = normal(hidden * in, 1, 0.0f, 0.4f), b1(hidden, 0.05f);
  std::vector<float> w2 = normal(hidden, 2, 0.0f, 0.3f), b2(1, 0.0f);
  const std::vector<float> teacher = normal(in, 3);
  const auto target = [&](const float* x) {
    float t = 0;
    for (std::size_t k = 0; k < in; ++k) t += teacher[k] * x[k];
    return std::max(t, 0.0f) + 0.5f * x[0];
  };
  hc::activation_fake_quant fq;
  std::vector<float> h(rows * hidden), hq(rows * hidden), dh(rows * hidden);
  std::vector<double> losses;
  std::size_t clipped = 0;
  const float lr = 0.05f;
  for (std::size_t step = 0; step < steps; ++step) {
    if (step == 300) fq.disable_observer();
    const std::vector<float> x = normal(rows * in, 1000 + static_cast<unsigned>(step));
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t j = 0; j < hidden; ++j) {
        float s = b1[j];
        for (std::size_t k = 0; k < in; ++k) s += w1[j * in + k] * x[r * in + k];
        h[r * hidden + j] = std::max(s, 0.0f);
      }
    }
    fq.forward(h, hq);
    clipped += fq.clipped();
    double loss = 0;
    std::vector<float> gw2(hidden, 0.0f);
    float gb2 = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      float yhat = b2[0];
      for (std::size_t j = 0; j < hidden; ++j) yhat += w2[j] * hq[r * hidden + j];
      const float e = yhat - target(&x[r * in]);
      loss += double{e} * e / rows;
      const float dy = 2.0f * e / static_cast<float>(rows);
      gb2 += dy;
      for (std::size_t j = 0; j < hidden; ++j) {
        gw2[j] += dy * hq[r * hidden + j];
        dh[r * hidden + j] = dy * w2[j];
      }
    }
    losses.push_back(loss);
    fq.backward(dh);  // straight-through, zero where clipped
    std::vector<float> gw1(hidden * in, 0.0f), gb1(hidden, 0.0f);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t j = 0; j < hidden; ++j) {
        const float d = h[r * hidden + j] > 0.0f ? dh[r * hidden + j] : 0.0f;
        gb1[j] += d;
        for (std::size_t k = 0; k < in; ++k) gw1[j * in + k] += d * x[r * in + k];
      }
    }
    for (std::size_t i = 0; i < w1.size(); ++i) w1[i] -= lr * gw1[i];
    for (std::size_t j = 0; j < hidden; ++j) b1[j] -= lr * gb1[j];
    for (std::size_t j = 0; j < hidden; ++j) w2[j] -= lr * gw2[j];
    b2[0] -= lr * gb2;
  }
  double first = 0, last = 0;
  for (std::size_t i = 0; i < 20; ++i) {
    first += losses[i];
    last += losses[steps - 1 - i];
  }
  BOOST_TEST_MESSAGE("QAT loop: mean loss " << first / 20 << " -> " << last / 20 << ", clipped "
                                            << clipped << ", scale " << fq.scale()
                                            << ", zero point " << fq.zero_point());
  BOOST_TEST(last < 0.1 * first);
  BOOST_TEST(clipped > 0u);
  BOOST_TEST(fq.observations() == 300u);
  BOOST_TEST(fq.zero_point() == 0);  // ReLU outputs: the range starts at 0
  // fc2 as the static int8 layer on a batch of the trained fc1's outputs, scaled past the range
  const std::vector<float> x = normal(rows * in, 7);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < hidden; ++j) {
      float s = b1[j];
      for (std::size_t k = 0; k < in; ++k) s += w1[j * in + k] * x[r * in + k];
      h[r * hidden + j] = 1.5f * std::max(s, 0.0f);
    }
  }
  check_conversion(fq, w2, 1, hidden, b2, h, rows);
}

BOOST_AUTO_TEST_CASE(errors_are_sentences) {
  hc::activation_fake_quant fq;
  std::vector<float> x = {1.0f, 2.0f, 3.0f}, y(2);
  BOOST_TEST(
      has(hone_test::error_of<hone::config_error>([&] { fq.backward(x); }), "no forward has run"));
  BOOST_TEST(has(hone_test::error_of<hone::config_error>([&] { fq.forward(std::span<float>()); }),
                 "the input is empty"));
  BOOST_TEST(has(hone_test::error_of<hone::config_error>([&] { fq.forward(x, y); }),
                 "the input holds 3 values but the output 2; they must be equal"));
  BOOST_TEST(has(hone_test::error_of<hone::config_error>([&] {
                   fq.forward(std::span<const float>(x).first(2), std::span<float>(x).subspan(1));
                 }),
                 "overlaps the input"));
  x[2] = std::numeric_limits<float>::quiet_NaN();
  const std::string nan = hone_test::error_of<hone::config_error>([&] { fq.forward(x); });
  BOOST_TEST(has(nan, "activation_fake_quant::forward: the value at index 2 is NaN"));
  x[2] = -std::numeric_limits<float>::infinity();
  BOOST_TEST(
      has(hone_test::error_of<hone::config_error>([&] { fq.forward(x); }), "index 2 is infinite"));
  BOOST_TEST(fq.observations() == 0u);  // a refused batch changes nothing
  BOOST_TEST(
      has(hone_test::error_of<hone::config_error>([&] { (void)hc::static_activation_params(fq); }),
          "has observed no batch"));
  x[2] = 3.0f;
  fq.forward(x);
  std::vector<float> g(4, 1.0f);
  BOOST_TEST(has(hone_test::error_of<hone::config_error>([&] { fq.backward(g); }),
                 "the last forward had 3"));
  BOOST_TEST(has(hone_test::error_of<hone::config_error>([&] {
                   fq.backward(std::span<const float>(g).first(3), std::span<float>(g).subspan(1));
                 }),
                 "overlaps the output gradient"));
  std::vector<float> huge = {-3e38f, 3e38f};
  hc::activation_fake_quant fresh;
  BOOST_TEST(has(hone_test::error_of<hone::config_error>([&] { fresh.forward(huge); }),
                 "too wide for a finite float scale"));
  BOOST_TEST(fresh.observations() == 0u);  // the observer forgot the refused batch
  BOOST_TEST(fresh.observed_range().hi == 0.0f);
  BOOST_TEST(has(hone_test::error_of<hone::config_error>(
                     [] { hc::activation_fake_quant f({.quant_min = 5, .quant_max = 5}); }),
                 "-32768 <= quant_min < quant_max <= 65535"));
  BOOST_TEST(has(hone_test::error_of<hone::config_error>([] {
                   hc::activation_fake_quant f({.scheme = hc::fake_quant_scheme::symmetric});
                 }),
                 "needs a signed code range"));
  BOOST_TEST(has(hone_test::error_of<hone::config_error>(
                     [] { hc::activation_fake_quant f({.averaging_constant = 0.0f}); }),
                 "the averaging constant is 0.000000; it must lie in (0, 1]"));
  BOOST_TEST(has(hone_test::error_of<hone::config_error>([] {
                   (void)hc::fake_quant_qparams({1.0f, -1.0f}, {});
                 }),
                 "not a finite range with lo <= hi"));
}
