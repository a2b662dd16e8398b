// LoRA on the user's linear layers: forward and backward against an independent double-precision
// oracle (with and without dropout, with and without bias), PEFT's initialization, merge/unmerge
// restoring the base bit for bit, the model concept with only the adapters as parameters, the
// sentences of bad input, and fine-tuning the adapters with hone's trainer and AdamW.
#define BOOST_TEST_MODULE hone_lora
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <hone/compress/lora.hpp>
#include <hone/train/trainer.hpp>
#include <random>
#include <string>
#include <vector>

namespace hc = hone::compress;

namespace {

std::vector<float> random_vector(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// The user's storage of one linear layer.
struct user_linear {
  std::size_t out, in;
  std::vector<float> w, b;
  user_linear(std::size_t o, std::size_t i, bool bias, unsigned seed)
      : out(o),
        in(i),
        w(random_vector(o * i, seed, 0.3f)),
        b(bias ? random_vector(o, seed + 1000) : std::vector<float>{}) {}
  hc::linear_ref ref(std::string name) { return {std::move(name), w, b, out, in}; }
};

// ---- the oracle: the formulas in double, written out element by element ----
struct oracle_result {
  std::vector<double> y, dA, dB, dx;
};
oracle_result oracle(const user_linear& L, std::span<const float> A, std::span<const float> B,
                     std::size_t r, double s, std::span<const float> x, std::span<const float> dy,
                     std::size_t rows, const std::vector<std::uint8_t>& keep, double p) {
  const std::size_t in = L.in, out = L.out;
  auto u = [&](std::size_t n, std::size_t c) {
    const double v = x[n * in + c];
    if (keep.empty()) return v;
    return keep[n * in + c] ? v / (1.0 - p) : 0.0;
  };
  oracle_result R;
  R.y.assign(rows * out, 0.0);
  R.dA.assign(r * in, 0.0);
  R.dB.assign(out * r, 0.0);
  R.dx.assign(rows * in, 0.0);
  for (std::size_t n = 0; n < rows; ++n) {
    std::vector<double> h(r, 0.0), dh(r, 0.0);
    for (std::size_t k = 0; k < r; ++k)
      for (std::size_t c = 0; c < in; ++c) h[k] += u(n, c) * A[k * in + c];
    for (std::size_t o = 0; o < out; ++o) {
      double v = L.b.empty() ? 0.0 : L.b[o];
      for (std::size_t c = 0; c < in; ++c) v += double(x[n * in + c]) * L.w[o * in + c];
      for (std::size_t k = 0; k < r; ++k) v += s * h[k] * B[o * r + k];
      R.y[n * out + o] = v;
    }
    // dL/dy = dy: dB[o,k] = s sum_n dy[n,o] h[n,k]; dh[k] = s sum_o dy[n,o] B[o,k]
    for (std::size_t o = 0; o < out; ++o)
      for (std::size_t k = 0; k < r; ++k) {
        R.dB[o * r + k] += s * dy[n * out + o] * h[k];
        dh[k] += s * dy[n * out + o] * B[o * r + k];
      }
    for (std::size_t k = 0; k < r; ++k)
      for (std::size_t c = 0; c < in; ++c) R.dA[k * in + c] += dh[k] * u(n, c);
    for (std::size_t c = 0; c < in; ++c) {
      double v = 0.0;
      for (std::size_t o = 0; o < out; ++o) v += double(dy[n * out + o]) * L.w[o * in + c];
      double a = 0.0;
      for (std::size_t k = 0; k < r; ++k) a += dh[k] * A[k * in + c];
      if (!keep.empty()) a = keep[n * in + c] ? a / (1.0 - p) : 0.0;
      R.dx[n * in + c] = v + a;
    }
  }
  return R;
}

template <class V>
double max_rel_error(std::span<const float> got, const V& want) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  // Relative to the largest magnitude: float sums of a few dozen terms against double sums.
  double worst = 0.0, scale = 1e-30;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return worst / scale;
}

void check_against_oracle(bool bias, float dropout, bool rslora) {
  const std::size_t rows = 7, in = 13, out = 9, r = 4;
  user_linear L(out, in, bias, 11);
  hc::lora_model m({L.ref("enc.fc")},
                   {.r = r, .alpha = 6.0f, .dropout = dropout, .use_rslora = rslora, .seed = 5});
  const auto Bv = random_vector(out * r, 12, 0.5f);  // as if trained: B = 0 would hide bugs
  std::copy(Bv.begin(), Bv.end(), m.lora_B(0).begin());
  const auto x = random_vector(rows * in, 13);
  const auto dy = random_vector(rows * out, 14);
  std::vector<float> y(rows * out), dx(rows * in);
  hc::lora_tape tape;
  m.train();
  m.zero_grad();
  m.forward(0, x, rows, y, &tape);
  m.backward(0, x, dy, rows, tape, dx);
  if (dropout > 0.0f) {
    BOOST_REQUIRE_EQUAL(tape.keep.size(), rows * in);
  } else {
    BOOST_TEST(tape.keep.empty());
  }
  const double s = rslora ? 6.0 / std::sqrt(double(r)) : 6.0 / double(r);
  BOOST_TEST(m.scaling() == float(s), boost::test_tools::tolerance(1e-6f));
  const auto R = oracle(L, m.lora_A(0), m.lora_B(0), r, s, x, dy, rows, tape.keep, dropout);
  BOOST_TEST(max_rel_error(y, R.y) < 1e-5);
  BOOST_TEST(max_rel_error(m.grad_A(0), R.dA) < 1e-5);
  BOOST_TEST(max_rel_error(m.grad_B(0), R.dB) < 1e-5);
  BOOST_TEST(max_rel_error(dx, R.dx) < 1e-5);
  // backward accumulates: a second call doubles the gradients.
  m.backward(0, x, dy, rows, tape);
  std::vector<double> twice(R.dA.size());
  for (std::size_t i = 0; i < twice.size(); ++i) twice[i] = 2 * R.dA[i];
  BOOST_TEST(max_rel_error(m.grad_A(0), twice) < 1e-5);
  // Evaluation mode: no dropout; the oracle without a mask.
  m.eval();
  hc::lora_tape t2;
  m.forward(0, x, rows, y, &t2);
  BOOST_TEST(t2.keep.empty());
  const auto E = oracle(L, m.lora_A(0), m.lora_B(0), r, s, x, dy, rows, {}, 0.0);
  BOOST_TEST(max_rel_error(y, E.y) < 1e-5);
}

}  // namespace

static_assert(hone::model<hc::lora_model>);

BOOST_AUTO_TEST_CASE(forward_backward_match_the_double_oracle) {
  check_against_oracle(true, 0.0f, false);
  check_against_oracle(false, 0.0f, false);
  check_against_oracle(true, 0.0f, true);
}

BOOST_AUTO_TEST_CASE(dropout_matches_the_oracle_with_the_drawn_mask) {
  check_against_oracle(true, 0.3f, false);
  check_against_oracle(false, 0.5f, true);
}

BOOST_AUTO_TEST_CASE(dropout_masks_are_seeded_and_drop_at_rate_p) {
  user_linear L(4, 200, false, 1);
  const auto x = random_vector(50 * 200, 2);
  std::vector<float> y(50 * 4);
  auto masks = [&](std::uint64_t seed) {
    hc::lora_model m({L.ref("fc")}, {.r = 2, .alpha = 2, .dropout = 0.25f, .seed = seed});
    hc::lora_tape t1, t2;
    m.forward(0, x, 50, y, &t1);
    m.forward(0, x, 50, y, &t2);
    return std::pair{t1.keep, t2.keep};
  };
  const auto [a1, a2] = masks(9);
  const auto [b1, b2] = masks(9);
  const auto [c1, c2] = masks(10);
  BOOST_TEST(a1 == b1);  // same seed, same masks
  BOOST_TEST(a2 == b2);
  BOOST_TEST(a1 != a2);  // a fresh mask per call
  BOOST_TEST(a1 != c1);  // another seed, other masks
  double dropped = 0;
  for (auto k : a1) dropped += k == 0;
  dropped /= double(a1.size());
  // 10,000 Bernoulli(0.25) draws: standard deviation 0.0043.
  BOOST_TEST(std::abs(dropped - 0.25) < 0.02);
}

BOOST_AUTO_TEST_CASE(init_is_peft_kaiming_uniform_a_and_zero_b) {
  const std::size_t in = 400, out = 30, r = 16;
  user_linear L(out, in, true, 3), L2(out, 64, true, 4);
  hc::lora_model m({L.ref("a"), L2.ref("b")}, {.r = r, .alpha = 32, .seed = 77});
  const double bound = 1.0 / std::sqrt(double(in));
  double sum = 0, sq = 0, mx = 0;
  for (float a : m.lora_A(0)) {
    BOOST_REQUIRE(std::abs(a) <= bound);
    sum += a;
    sq += double(a) * a;
    mx = std::max(mx, double(std::abs(a)));
  }
  const double n = double(r * in);
  BOOST_TEST(std::abs(sum / n) < 0.05 * bound);
  // Var of U(-b, b) is b^2 / 3.
  BOOST_TEST(std::abs(sq / n / (bound * bound / 3.0) - 1.0) < 0.05);
  BOOST_TEST(mx > 0.99 * bound);
  for (float a : m.lora_A(1)) BOOST_REQUIRE(std::abs(a) <= 1.0 / 8.0);
  for (float b : m.lora_B(0)) BOOST_REQUIRE(b == 0.0f);
  for (float b : m.lora_B(1)) BOOST_REQUIRE(b == 0.0f);
  // A fresh model from the same seed has the same A; another seed does not.
  hc::lora_model same({L.ref("a"), L2.ref("b")}, {.r = r, .alpha = 32, .seed = 77});
  hc::lora_model other({L.ref("a"), L2.ref("b")}, {.r = r, .alpha = 32, .seed = 78});
  BOOST_TEST(same_bits(m.lora_A(1), same.lora_A(1)));
  BOOST_TEST(!same_bits(m.lora_A(1), other.lora_A(1)));
  // With B = 0 the adapted layer computes the base layer exactly.
  const auto x = random_vector(3 * in, 5);
  std::vector<float> y(3 * out);
  m.eval();
  m.forward(0, x, 3, y);
  const auto R =
      oracle(L, m.lora_A(0), m.lora_B(0), r, 2.0, x, std::vector<float>(3 * out), 3, {}, 0.0);
  BOOST_TEST(max_rel_error(y, R.y) < 1e-5);
}

BOOST_AUTO_TEST_CASE(parameters_are_the_adapters_only) {
  user_linear L1(5, 6, true, 1), L2(4, 5, false, 2);
  hc::lora_model m({L1.ref("fc1"), L2.ref("block.proj")}, {.r = 3, .alpha = 6});
  const auto p = m.parameters();
  BOOST_REQUIRE_EQUAL(p.size(), 4u);
  BOOST_TEST(p[0].name == "fc1.lora_A.weight");
  BOOST_TEST(p[1].name == "fc1.lora_B.weight");
  BOOST_TEST(p[2].name == "block.proj.lora_A.weight");
  BOOST_TEST(p[3].name == "block.proj.lora_B.weight");
  BOOST_TEST((p[0].shape == std::vector<std::size_t>{3, 6}));
  BOOST_TEST((p[3].shape == std::vector<std::size_t>{4, 3}));
  for (const auto& q : p) {
    // No view touches the user's base weights or biases.
    for (const auto* base : {&L1.w, &L1.b, &L2.w}) {
      const float* lo = base->data();
      const float* hi = base->data() + base->size();
      BOOST_TEST((q.value.data() + q.value.size() <= lo || q.value.data() >= hi));
    }
    BOOST_TEST(
        (q.value.data() >= m.adapters().all().data() &&
         q.value.data() + q.value.size() <= m.adapters().all().data() + m.adapters().all().size()));
  }
}

BOOST_AUTO_TEST_CASE(merge_then_unmerge_restores_the_base_bit_for_bit) {
  const std::size_t in = 33, out = 17, r = 8, rows = 5;
  user_linear L(out, in, true, 21), L2(in, out, false, 22);
  const auto w0 = L.w, w20 = L2.w;
  hc::lora_model m({L.ref("up"), L2.ref("down")}, {.r = r, .alpha = 24, .seed = 3});
  for (std::size_t i = 0; i < 2; ++i) {
    const auto B = random_vector(m.lora_B(i).size(), 30 + unsigned(i), 0.7f);
    std::copy(B.begin(), B.end(), m.lora_B(i).begin());
  }
  const auto x = random_vector(rows * in, 23);
  std::vector<float> y_adapted(rows * out), y_merged(rows * out);
  m.eval();
  m.forward(0, x, rows, y_adapted);
  const auto R =
      oracle(L, m.lora_A(0), m.lora_B(0), r, 3.0, x, std::vector<float>(rows * out), rows, {}, 0.0);
  BOOST_TEST(max_rel_error(y_adapted, R.y) < 1e-5);
  m.merge();
  BOOST_TEST(m.merged(0));
  BOOST_TEST(m.merged(1));
  // The merged weight against W + s B A in double: one rounding of the sum, plus one of the delta.
  const double s = 3.0;
  std::size_t changed = 0;
  for (std::size_t o = 0; o < out; ++o) {
    for (std::size_t c = 0; c < in; ++c) {
      double d = 0;
      for (std::size_t k = 0; k < r; ++k)
        d += double(m.lora_B(0)[o * r + k]) * m.lora_A(0)[k * in + c];
      const double want = double(w0[o * in + c]) + s * d;
      BOOST_REQUIRE(std::abs(L.w[o * in + c] - want) <= 2e-7 * (std::abs(want) + std::abs(s * d)));
      changed += L.w[o * in + c] != w0[o * in + c];
    }
  }
  BOOST_TEST(changed > out * in / 2);
  // Merged forward (base path only) equals the adapted forward up to rounding.
  m.forward(0, x, rows, y_merged);
  double worst = 0;
  for (std::size_t i = 0; i < y_merged.size(); ++i)
    worst = std::max(
        worst, double(std::abs(y_merged[i] - y_adapted[i])) / (1e-3 + std::abs(y_adapted[i])));
  BOOST_TEST(worst < 1e-4);
  m.unmerge();
  BOOST_TEST(!m.merged(0));
  BOOST_TEST(same_bits(L.w, w0));
  BOOST_TEST(same_bits(L2.w, w20));
  // Subtracting the delta, as peft's unmerge does, does not give the base back here.
  std::vector<float> subtracted(L.w.size());
  m.merge(0);
  for (std::size_t o = 0; o < out; ++o)
    for (std::size_t c = 0; c < in; ++c) {
      double d = 0;
      for (std::size_t k = 0; k < r; ++k)
        d += double(m.lora_B(0)[o * r + k]) * m.lora_A(0)[k * in + c];
      subtracted[o * in + c] = L.w[o * in + c] - float(s * d);
    }
  BOOST_TEST(!same_bits(subtracted, w0));
  m.unmerge(0);
  BOOST_TEST(same_bits(L.w, w0));
  // The unmerged forward computes the same bits as before the merge.
  std::vector<float> y_again(rows * out);
  m.forward(0, x, rows, y_again);
  BOOST_TEST(same_bits(y_again, y_adapted));
}

BOOST_AUTO_TEST_CASE(merge_misuse_is_refused_with_a_sentence) {
  user_linear L(3, 4, true, 1);
  hc::lora_model m({L.ref("fc")}, {.r = 2, .alpha = 2});
  std::fill(m.lora_B(0).begin(), m.lora_B(0).end(), 0.5f);
  BOOST_CHECK_THROW(m.unmerge(0), hone::config_error);
  m.merge();
  BOOST_CHECK_EXCEPTION(m.merge(0), hone::config_error, [](const hone::config_error& e) {
    return std::string(e.what()).find("'fc' is already merged") != std::string::npos;
  });
  const auto x = random_vector(4, 1);
  std::vector<float> y(3);
  hc::lora_tape t;
  m.forward(0, x, 1, y, &t);
  BOOST_CHECK_EXCEPTION(
      m.backward(0, x, y, 1, t), hone::config_error, [](const hone::config_error& e) {
        return std::string(e.what()).find("unmerge() before training") != std::string::npos;
      });
  BOOST_CHECK_THROW(m.reset_parameters(1), hone::config_error);
  // The user changed W while merged: unmerge refuses to discard that, forget_merge keeps it.
  L.w[2] += 1.0f;
  BOOST_CHECK_EXCEPTION(m.unmerge(), hone::config_error, [](const hone::config_error& e) {
    return std::string(e.what()).find("changed after merge()") != std::string::npos;
  });
  const auto kept = L.w;
  m.forget_merge(0);
  BOOST_TEST(!m.merged(0));
  BOOST_TEST(same_bits(L.w, kept));
}

BOOST_AUTO_TEST_CASE(bad_input_names_what_is_wrong) {
  user_linear L(3, 4, true, 1);
  auto throws_with = [](auto&& f, const std::string& text) {
    try {
      f();
    } catch (const hone::config_error& e) {
      BOOST_TEST_INFO(e.what());
      BOOST_TEST(std::string(e.what()).find(text) != std::string::npos);
      return;
    }
    BOOST_FAIL("no config_error for: " + text);
  };
  throws_with([&] { hc::lora_model({}, {}); }, "no layers given");
  throws_with([&] { hc::lora_model({L.ref("fc")}, {.r = 0}); }, "rank r is 0");
  throws_with([&] { hc::lora_model({L.ref("fc")}, {.r = 1, .dropout = 1.0f}); }, "outside [0, 1)");
  throws_with(
      [&] {
        hc::lora_model({L.ref("fc"), L.ref("fc")}, {.r = 1});
      },
      "same name as layer 0");
  throws_with(
      [&] {
        hc::lora_model({{"fc", L.w, L.b, 4, 4}}, {.r = 1});
      },
      "the weight view has 12 elements, but [out, in] = [4, 4] needs 16");
  throws_with(
      [&] {
        hc::lora_model({{"fc", L.w, std::span<const float>(L.b).first(2), 3, 4}}, {.r = 1});
      },
      "the bias view has 2 elements");
  hc::lora_model m({L.ref("fc")}, {.r = 2});
  std::vector<float> x(8), y(5);
  throws_with([&] { m.forward(0, x, 2, y); }, "y has 5 elements, but 2 rows of 3 need 6");
  throws_with([&] { m.forward(1, x, 2, y); }, "layer index 1 is out of range");
  throws_with([&] { (void)m.index("nope"); }, "no adapted layer named 'nope'");
  hc::lora_tape t;
  y.resize(6);
  m.forward(0, x, 2, y, &t);
  throws_with([&] { m.backward(0, x, y, 1, t); }, "x has 8 elements, but 1 rows of 4 need 4");
  throws_with([&] { m.set_options({.r = 3}); }, "build a new lora_model for another rank");
}

// ---- fine-tuning the adapters with hone's trainer ----
namespace {

struct reg_batch {
  std::vector<float> x, y;  // rows * in, rows * out
  std::size_t rows = 0;
  std::size_t count() const { return rows; }
};

// The user's model: x -> fc1 -> tanh -> fc2, mean squared error. Its trainable parameters are the
// adapters only (lora.parameters()).
struct adapted_mlp {
  static constexpr std::size_t in = 8, hidden = 16, out = 4;
  user_linear fc1{hidden, in, true, 41}, fc2{out, hidden, true, 42};
  hc::lora_model lora;
  hc::lora_tape t1, t2;
  explicit adapted_mlp(float dropout)
      : lora({fc1.ref("fc1"), fc2.ref("fc2")},
             {.r = 4, .alpha = 8, .dropout = dropout, .seed = 7}) {}
  std::vector<hone::parameter<float>> parameters() { return lora.parameters(); }
  float forward_backward(const reg_batch& b, float scale) {
    const std::size_t n = b.rows;
    std::vector<float> z(n * hidden), a(n * hidden), y(n * out), dy(n * out), da(n * hidden);
    lora.zero_grad();
    lora.forward(0, b.x, n, z, &t1);
    for (std::size_t i = 0; i < z.size(); ++i) a[i] = std::tanh(z[i]);
    lora.forward(1, a, n, y, &t2);
    double loss = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      const float d = y[i] - b.y[i];
      loss += double(d) * d;
      dy[i] = scale * 2.0f * d / float(y.size());
    }
    lora.backward(1, a, dy, n, t2, da);
    for (std::size_t i = 0; i < da.size(); ++i) da[i] *= 1.0f - a[i] * a[i];
    lora.backward(0, b.x, da, n, t1);
    return float(loss / double(y.size()));
  }
  std::vector<float> predict(const std::vector<float>& x, std::size_t n) {
    std::vector<float> z(n * hidden), y(n * out);
    lora.forward(0, x, n, z);
    for (auto& v : z) v = std::tanh(v);
    lora.forward(1, z, n, y);
    return y;
  }
};
static_assert(hone::trainable<adapted_mlp, reg_batch>);

// The shifted task: targets of the base model with fc1's weight shifted by a rank-2 matrix.
reg_batch make_task(adapted_mlp& base, std::size_t rows, unsigned seed) {
  reg_batch b{random_vector(rows * adapted_mlp::in, seed), {}, rows};
  const auto u = random_vector(adapted_mlp::hidden * 2, 99, 0.6f);
  const auto v = random_vector(2 * adapted_mlp::in, 98, 0.6f);
  std::vector<float> w = base.fc1.w;
  for (std::size_t o = 0; o < adapted_mlp::hidden; ++o)
    for (std::size_t c = 0; c < adapted_mlp::in; ++c)
      w[o * adapted_mlp::in + c] += u[o * 2] * v[c] + u[o * 2 + 1] * v[adapted_mlp::in + c];
  user_linear shifted = base.fc1;
  shifted.w = w;
  hc::lora_model plain({shifted.ref("fc1"), base.fc2.ref("fc2")}, {.r = 1});  // B = 0: the base
  plain.eval();
  std::vector<float> z(rows * adapted_mlp::hidden);
  b.y.resize(rows * adapted_mlp::out);
  plain.forward(0, b.x, rows, z);
  for (auto& x : z) x = std::tanh(x);
  plain.forward(1, z, rows, b.y);
  return b;
}

}  // namespace

BOOST_AUTO_TEST_CASE(trainer_fine_tunes_only_the_adapters) {
  for (const float dropout : {0.0f, 0.1f}) {
    adapted_mlp net(dropout);
    const auto w1 = net.fc1.w, b1 = net.fc1.b, w2 = net.fc2.w, b2 = net.fc2.b;
    const reg_batch train = make_task(net, 256, 1);
    const reg_batch test = make_task(net, 128, 2);
    auto test_loss = [&] {
      net.lora.eval();
      const auto y = net.predict(test.x, test.rows);
      net.lora.train();
      double l = 0;
      for (std::size_t i = 0; i < y.size(); ++i) l += double(y[i] - test.y[i]) * (y[i] - test.y[i]);
      return l / double(y.size());
    };
    const double before = test_loss();
    hone::trainer t(net, hone::adamw{.weight_decay = 0.0f}, hone::constant_lr{.base_lr = 1e-2});
    BOOST_TEST(t.zero_copy());  // the trainer's master weights are the adapters' arena
    BOOST_TEST(t.master_weights().data() == net.lora.adapters().all().data());
    BOOST_TEST(t.layout().size() == 4u);  // lora_A and lora_B of two layers, nothing else
    float first = 0, last = 0;
    for (int step = 0; step < 400; ++step) {
      const auto r = t.step(train);
      if (step == 0) first = r.loss;
      last = r.loss;
    }
    const double after = test_loss();
    BOOST_TEST_MESSAGE("dropout " << dropout << ": train loss " << first << " -> " << last
                                  << ", test loss " << before << " -> " << after);
    BOOST_TEST(last < 0.2f * first);
    BOOST_TEST(after < 0.2 * before);
    BOOST_TEST(same_bits(net.fc1.w, w1));
    BOOST_TEST(same_bits(net.fc1.b, b1));
    BOOST_TEST(same_bits(net.fc2.w, w2));
    BOOST_TEST(same_bits(net.fc2.b, b2));
    // Merging the trained adapters serves the same predictions without the adapter path.
    net.lora.eval();
    const auto y_adapted = net.predict(test.x, test.rows);
    net.lora.merge();
    const auto y_merged = net.predict(test.x, test.rows);
    for (std::size_t i = 0; i < y_merged.size(); ++i)
      BOOST_REQUIRE(std::abs(y_merged[i] - y_adapted[i]) <= 1e-4f * (1 + std::abs(y_adapted[i])));
    net.lora.unmerge();
    BOOST_TEST(same_bits(net.fc1.w, w1));
    BOOST_TEST(same_bits(net.fc2.w, w2));
  }
}
