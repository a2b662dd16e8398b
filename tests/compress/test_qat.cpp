// hone::compress quantization-aware training: fake_quantize against quantize_weights + dequantize
// (the same bits, per channel and per tensor, zero rows, in place); the trainer policy
// fake_quant_training against an oracle written here: plain SGD on fp32 master weights whose
// gradient is taken at the fake-quantized point (the straight-through estimator), step by step,
// with the model's weights equal to the fake-quantized master bit for bit (fp32 and bf16 working
// weights), biases left in full precision, begin_step, skipped steps, and the sentences for a
// zero-copy fp32 model and bad input.
#define BOOST_TEST_MODULE hone_compress_qat
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <hone/checkpoint.hpp>
#include <hone/compress/prune_checkpoint.hpp>
#include <hone/compress/qat.hpp>
#include <hone/train.hpp>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace hc = hone::compress;

namespace {

struct mbatch {
  std::vector<float> x;  // rows * in
  std::vector<float> y;  // rows * out
  std::size_t count() const { return y.size(); }
};

/// y = A x + c for a fixed A, c; x ~ N(0, 1).
mbatch make_mbatch(std::size_t rows, std::size_t in, std::size_t out, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0, 1);
  mbatch b{std::vector<float>(rows * in), std::vector<float>(rows * out)};
  for (auto& v : b.x) v = n(rng);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t o = 0; o < out; ++o) {
      float y = 0.1f * static_cast<float>(o);
      for (std::size_t i = 0; i < in; ++i) {
        y += 0.05f * static_cast<float>((o * 7 + i * 3) % 11) * b.x[r * in + i];
      }
      b.y[r * out + o] = y;
    }
  }
  return b;
}

/// The gradient of the mean squared error of y = W x + b at (w, bias), in fp32, the order fixed.
void mse_gradient(const mbatch& bt, std::size_t in, std::size_t out, const float* w,
                  const float* bias, float* gw, float* gb, float* loss) {
  const std::size_t rows = bt.y.size() / out;
  std::fill(gw, gw + in * out, 0.0f);
  std::fill(gb, gb + out, 0.0f);
  float l = 0;
  const float inv = 1.0f / static_cast<float>(rows * out);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t o = 0; o < out; ++o) {
      float pred = bias[o];
      for (std::size_t i = 0; i < in; ++i) pred += w[o * in + i] * bt.x[r * in + i];
      const float e = pred - bt.y[r * out + o];
      l += e * e * inv;
      for (std::size_t i = 0; i < in; ++i) gw[o * in + i] += 2 * e * bt.x[r * in + i] * inv;
      gb[o] += 2 * e * inv;
    }
  }
  *loss = l;
}

/// A linear layer [out, in] + bias [out] in working type T, tensors in separate vectors.
template <class T>
struct dense {
  std::size_t in, out;
  std::vector<T> w, gw, b, gb;
  float inject = 0;  // non-zero: written into gw[0] (an overflow for fp16)
  dense(std::size_t i, std::size_t o) : in(i), out(o), w(i * o), gw(i * o), b(o), gb(o) {
    for (std::size_t k = 0; k < w.size(); ++k) {
      w[k] = T(0.03f * static_cast<float>(static_cast<int>((k * 37) % 19) - 9));
    }
    for (std::size_t k = 0; k < out; ++k) b[k] = T(0.01f * static_cast<float>(k));
  }
  std::vector<hone::parameter<T>> parameters() {
    return {{"fc.weight", {out, in}, w, gw}, {"fc.bias", {out}, b, gb}};
  }
  float forward_backward(const mbatch& bt, float scale) {
    std::vector<float> wf(w.size()), bf(out), g(w.size()), gbf(out);
    for (std::size_t k = 0; k < w.size(); ++k) wf[k] = static_cast<float>(w[k]);
    for (std::size_t k = 0; k < out; ++k) bf[k] = static_cast<float>(b[k]);
    float loss = 0;
    mse_gradient(bt, in, out, wf.data(), bf.data(), g.data(), gbf.data(), &loss);
    for (std::size_t k = 0; k < w.size(); ++k) gw[k] = T(g[k] * scale);
    for (std::size_t k = 0; k < out; ++k) gb[k] = T(gbf[k] * scale);
    if (inject != 0) gw[0] = T(inject);
    return loss;
  }
};

/// fake quantization through the int8 matrix (quant.hpp), the reference.
std::vector<float> through_int8(const std::vector<float>& w, std::size_t rows, std::size_t cols,
                                hc::quant_granularity g) {
  const auto q = hc::quantize_weights(w, rows, cols, g);
  std::vector<float> out(w.size());
  hc::dequantize(q, out);
  return out;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

std::vector<float> master_of(std::span<const float> all, std::size_t offset, std::size_t n) {
  return {all.begin() + static_cast<long>(offset), all.begin() + static_cast<long>(offset + n)};
}

}  // namespace

BOOST_AUTO_TEST_CASE(fake_quantize_is_quantize_then_dequantize) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0, 2);
  for (const auto g : {hc::quant_granularity::per_channel, hc::quant_granularity::per_tensor}) {
    for (const auto& [rows, cols] :
         {std::pair<std::size_t, std::size_t>{1, 1}, {3, 17}, {16, 64}, {7, 1}, {0, 5}, {4, 0}}) {
      std::vector<float> w(rows * cols);
      for (auto& v : w) v = n(rng);
      if (rows > 2)
        std::fill(w.begin() + static_cast<long>(cols), w.begin() + static_cast<long>(2 * cols),
                  0.0f);
      std::vector<float> out(w.size(), -1.0f);
      hc::fake_quantize(w, rows, cols, g, out);
      BOOST_TEST_CONTEXT("rows " << rows << " cols " << cols << " per_tensor "
                                 << (g == hc::quant_granularity::per_tensor)) {
        BOOST_TEST(same_bits(out, through_int8(w, rows, cols, g)));
        std::vector<float> in_place = w;
        hc::fake_quantize(in_place, rows, cols, g, in_place);
        BOOST_TEST(same_bits(in_place, out));
      }
    }
  }
  std::vector<float> w{1.0f, std::numeric_limits<float>::quiet_NaN()}, out(2);
  BOOST_CHECK_EXCEPTION(hc::fake_quantize(w, 1, 2, hc::quant_granularity::per_channel, out),
                        hone::config_error, [](const std::exception& e) {
                          return std::string(e.what()).find("index 1 (row 0, column 1) is NaN") !=
                                 std::string::npos;
                        });
  BOOST_CHECK_THROW(hc::fake_quantize(w, 2, 2, hc::quant_granularity::per_channel, out),
                    hone::config_error);
}

// The trainer with fake_quant_training and plain SGD against the oracle: master_{t+1} = master_t -
// lr * grad(fq(W_t), b_t), the model's weight = fq(master) and its bias = master after each step.
BOOST_AUTO_TEST_CASE(sgd_with_fake_quant_follows_the_straight_through_oracle) {
  for (const auto g : {hc::quant_granularity::per_channel, hc::quant_granularity::per_tensor}) {
    BOOST_TEST_CONTEXT("per_tensor " << (g == hc::quant_granularity::per_tensor)) {
      const std::size_t in = 12, out = 5;
      dense<float> net(in, out);
      const float lr = 0.05f;
      hone::trainer t(net, hone::sgd{}, hone::constant_lr{.base_lr = lr},
                      hc::fake_quant_training({.granularity = g}));
      const std::vector<float> initial = net.w;
      t.weight_constraint().apply(t);  // the first forward already sees the int8 model
      const auto& layout = t.layout();
      const std::size_t ow = layout[layout.find("fc.weight")].offset;
      const std::size_t ob = layout[layout.find("fc.bias")].offset;
      std::vector<float> mw = master_of(t.master_weights(), ow, in * out);
      std::vector<float> mb = master_of(t.master_weights(), ob, out);
      BOOST_TEST(same_bits(mw, initial));  // apply() leaves the master as it is
      BOOST_TEST(same_bits(net.w, through_int8(mw, out, in, g)));
      BOOST_TEST(!same_bits(net.w, mw));
      for (int s = 0; s < 20; ++s) {
        const mbatch bt = make_mbatch(8, in, out, static_cast<unsigned>(100 + s));
        // The oracle: the gradient at the fake-quantized weights, applied to the fp32 master.
        const auto fq = through_int8(mw, out, in, g);
        std::vector<float> gw(mw.size()), gb(out);
        float loss = 0;
        mse_gradient(bt, in, out, fq.data(), mb.data(), gw.data(), gb.data(), &loss);
        for (std::size_t k = 0; k < mw.size(); ++k) mw[k] -= lr * gw[k];
        for (std::size_t k = 0; k < out; ++k) mb[k] -= lr * gb[k];
        const auto r = t.step(bt);
        BOOST_TEST_CONTEXT("step " << s) {
          BOOST_TEST(r.loss == loss, boost::test_tools::tolerance(1e-6f));
          const auto master = t.master_weights();
          const auto tw = master_of(master, ow, mw.size());
          const auto tb = master_of(master, ob, out);
          for (std::size_t k = 0; k < mw.size(); ++k) {
            BOOST_TEST(tw[k] == mw[k], boost::test_tools::tolerance(1e-5f));
          }
          for (std::size_t k = 0; k < out; ++k) {
            BOOST_TEST(tb[k] == mb[k], boost::test_tools::tolerance(1e-5f));
          }
          // The model holds fq(its own master), bit for bit; the bias is not quantized.
          BOOST_TEST(same_bits(net.w, through_int8(tw, out, in, g)));
          BOOST_TEST(same_bits(net.b, tb));
          // The master is not quantized: some weight lies off the int8 grid.
          BOOST_TEST(!same_bits(tw, through_int8(tw, out, in, g)));
        }
      }
      BOOST_TEST(
          (t.weight_constraint().quantized_tensors() == std::vector<std::string>{"fc.weight"}));
    }
  }
}

BOOST_AUTO_TEST_CASE(bf16_working_weights_and_begin_step) {
  const std::size_t in = 16, out = 6;
  dense<hone::bfloat16> net(in, out);
  hone::trainer t(net, hone::bf16_mixed{}, hone::adamw{0.01f},
                  hc::fake_quant_training({.begin_step = 3}));
  const auto& layout = t.layout();
  const std::size_t ow = layout[layout.find("fc.weight")].offset;
  for (int s = 0; s < 8; ++s) {
    t.step(make_mbatch(8, in, out, static_cast<unsigned>(7 + s)));
    const auto tw = master_of(t.master_weights(), ow, in * out);
    std::vector<hone::bfloat16> want(in * out);
    const auto fq = through_int8(tw, out, in, hc::quant_granularity::per_channel);
    for (std::size_t k = 0; k < want.size(); ++k) {
      want[k] = hone::bfloat16(t.steps_done() >= 3 ? fq[k] : tw[k]);
    }
    BOOST_TEST_CONTEXT("step " << t.steps_done()) {
      BOOST_TEST(same_bits(net.w, want));
    }
  }
}

// A skipped step (an fp16 overflow) leaves everything as it was, the model's quantized weights
// included.
BOOST_AUTO_TEST_CASE(a_skipped_step_changes_nothing) {
  const std::size_t in = 8, out = 3;
  dense<hone::half> net(in, out);
  hone::trainer t(net, hone::fp16_mixed<>{}, hone::adamw{0.01f}, hc::fake_quant_training{});
  t.step(make_mbatch(8, in, out, 1));
  const std::vector<hone::half> before = net.w;
  const std::vector<float> master(t.master_weights().begin(), t.master_weights().end());
  net.inject = std::numeric_limits<float>::infinity();
  const auto r = t.step(make_mbatch(8, in, out, 2));
  BOOST_TEST(r.skipped);
  BOOST_TEST(same_bits(net.w, before));
  BOOST_TEST(
      same_bits(std::vector<float>(t.master_weights().begin(), t.master_weights().end()), master));
}

/// dense<float> with both tensors in one arena laid out as the trainer's (zero-copy fp32).
struct bound_dense {
  hone::arena_layout layout{sizeof(float)};
  hone::arena<float> values, grads;
  dense<float> net{4, 2};
  bound_dense() {
    layout.add("fc.weight", 8);
    layout.add("fc.bias", 2);
    values = hone::arena<float>(layout);
    grads = hone::arena<float>(layout);
  }
  std::vector<hone::parameter<float>> parameters() {
    return {{"fc.weight", {2, 4}, values.view(0), grads.view(0)},
            {"fc.bias", {2}, values.view(1), grads.view(1)}};
  }
  float forward_backward(const mbatch&, float) { return 0.0f; }
};

BOOST_AUTO_TEST_CASE(a_zero_copy_fp32_model_and_bad_options_are_sentences) {
  bound_dense m;
  hone::trainer t(m, hone::sgd{}, hc::fake_quant_training{});
  BOOST_TEST(t.zero_copy());
  BOOST_CHECK_EXCEPTION(t.weight_constraint().apply(t), hone::config_error,
                        [](const std::exception& e) {
                          return std::string(e.what()).find(
                                     "the model's fp32 weights are the trainer's master weights") !=
                                 std::string::npos;
                        });
  BOOST_CHECK_EXCEPTION(hc::fake_quant_training({.quantized = {}}), hone::config_error,
                        [](const std::exception& e) {
                          return std::string(e.what()).find("the `quantized` predicate is empty") !=
                                 std::string::npos;
                        });
}

// Pruning then QAT in one role (hone::weight_constraints): the model holds the fake-quantized
// masked master (pruned weights stay exactly zero), the master keeps its fp32 values where kept,
// and the pruning policy is reachable for checkpoints (constraint_of, capture_pruning).
BOOST_AUTO_TEST_CASE(pruning_then_fake_quant_in_one_role) {
  const std::size_t in = 16, out = 8;
  dense<hone::bfloat16> net(in, out);
  hc::magnitude_pruning_options po;
  po.schedule = {.initial = 0.0, .target = 0.5, .begin_step = 2, .every = 2, .prunings = 2};
  hone::trainer t(net, hone::bf16_mixed{}, hone::adamw{0.02f},
                  hone::weight_constraints(hc::magnitude_pruning(po), hc::fake_quant_training{}));
  const auto& layout = t.layout();
  const std::size_t ow = layout[layout.find("fc.weight")].offset;
  for (int s = 0; s < 8; ++s) {
    t.step(make_mbatch(8, in, out, static_cast<unsigned>(30 + s)));
    const auto tw = master_of(t.master_weights(), ow, in * out);
    const auto fq = through_int8(tw, out, in, hc::quant_granularity::per_channel);
    std::vector<hone::bfloat16> want(in * out);
    for (std::size_t k = 0; k < want.size(); ++k) want[k] = hone::bfloat16(fq[k]);
    BOOST_TEST_CONTEXT("step " << t.steps_done()) {
      BOOST_TEST(same_bits(net.w, want));
      std::size_t zeros = 0;
      for (std::size_t k = 0; k < tw.size(); ++k) {
        if (tw[k] == 0.0f) {
          ++zeros;
          BOOST_TEST(static_cast<float>(net.w[k]) == 0.0f);
        }
      }
      const double level =
          hone::constraint_of<hc::magnitude_pruning>(t.weight_constraint()).level();
      BOOST_TEST(zeros == static_cast<std::size_t>(level * static_cast<double>(in * out)));
    }
  }
  BOOST_TEST(t.weight_constraint().get<0>().level() == 0.5);
  hone::checkpoint::snapshot snap;
  hc::capture_pruning(t, snap);  // finds the pruning part inside the combination
}
