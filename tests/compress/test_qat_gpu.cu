// GPU test (label gpu) of quantization-aware training on the GPU (hone/compress/cuda/qat.cuh):
// fake_quantize_async against the host's fake_quantize, bit for bit (fp32 out, in place, and cast
// to bf16 and fp16; per channel and per tensor; zero rows, subnormal and large values, a row
// longer than a block, many short rows, an empty shape); NaN and infinities flagged per slot;
// the CUDA trainer with fake_quant_training: after every step the model's device weights are the
// host fake quantization of the device master weights, bit for bit (fp32 and bf16 working
// weights, begin_step, the bias left in full precision), the master weights track a host trainer
// with the same policy, and a NaN master weight is reported with the tensor's name and step.
// Exits 77 (skipped) when no CUDA device is present.
#define BOOST_TEST_MODULE hone_compress_qat_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <hone/compress/cuda/qat.cuh>
#include <hone/compress/qat.hpp>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <hone/core/cuda/math_mode.cuh>
#include <hone/train/cuda/trainer.cuh>
#include <hone/train/trainer.hpp>
#include <iomanip>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../support/error_text.hpp"
#include "../support/gpu.hpp"

namespace hc = hone::compress;

namespace {

struct gpu_fixture {
  gpu_fixture() {
    hone::test::skip_without_gpu();
    hone::require_ieee_device_math("tests/compress/test_qat_gpu.cu");  // it compares bits
  }
};
BOOST_TEST_GLOBAL_FIXTURE(gpu_fixture);

template <class T>
std::vector<T> download(const T* p, std::size_t n) {
  std::vector<T> h(n);
  if (n > 0) HONE_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

template <class T>
void upload(T* p, const std::vector<T>& h) {
  if (!h.empty()) {
    HONE_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
}

/// "" when a and b hold the same bits, else where they first differ (a check prints it).
template <class T>
std::string bit_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) {
    return "sizes " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      std::ostringstream o;
      o << std::setprecision(9) << "first difference at " << i << ": " << static_cast<float>(a[i])
        << " and " << static_cast<float>(b[i]);
      return o.str();
    }
  }
  return "";
}

/// Rows of N(0, 1) values times a per-row magnitude from 1e-30 to 1e30; row 1 is zero, row 2
/// holds subnormals.
std::vector<float> weights(std::size_t rows, std::size_t cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> w(rows * cols);
  for (std::size_t r = 0; r < rows; ++r) {
    const float mag = std::pow(10.0f, static_cast<float>(static_cast<int>(r % 13) * 5 - 30));
    for (std::size_t c = 0; c < cols; ++c) {
      float v = n(rng) * mag;
      if (r == 1) v = 0.0f;
      if (r == 2) v = n(rng) * 1e-39f;
      w[r * cols + c] = v;
    }
  }
  return w;
}

/// The host oracle: fake_quantize (qat.hpp), cast to T.
template <class T>
std::vector<T> host_fake_quant(const std::vector<float>& w, std::size_t rows, std::size_t cols,
                               hc::quant_granularity g) {
  std::vector<float> fq(w.size());
  hc::fake_quantize(w, rows, cols, g, fq);
  std::vector<T> out(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) out[i] = static_cast<T>(fq[i]);
  return out;
}

template <class T>
void check_against_host(std::size_t rows, std::size_t cols, hc::quant_granularity g) {
  const auto w = weights(rows, cols, static_cast<unsigned>(rows * 31 + cols));
  hone::buffer<float, hone::cuda_space> dw(w.size());
  hone::buffer<T, hone::cuda_space> dout(w.size());
  upload(dw.data(), w);
  hc::fake_quant_workspace ws(2);
  ws.clear_flags(nullptr);
  hc::fake_quantize_async<T>({dw.data(), w.size()}, rows, cols, g, {dout.data(), w.size()}, nullptr,
                             ws, 1);
  ws.read_flags(nullptr);
  HONE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  BOOST_TEST(
      bit_difference(download(dout.data(), w.size()), host_fake_quant<T>(w, rows, cols, g)) == "");
  BOOST_TEST(ws.host_flags()[0] == 0);
  BOOST_TEST(ws.host_flags()[1] == 0);
}

}  // namespace

BOOST_AUTO_TEST_CASE(fake_quantize_async_gives_the_host_bits) {
  const std::size_t shapes[][2] = {{13, 1000}, {300, 33}, {1, 70000}, {4096, 3}, {0, 5}, {5, 0}};
  for (const auto g : {hc::quant_granularity::per_channel, hc::quant_granularity::per_tensor}) {
    for (const auto& s : shapes) {
      BOOST_TEST_CONTEXT("[" << s[0] << ", " << s[1] << "] per_tensor "
                             << (g == hc::quant_granularity::per_tensor)) {
        check_against_host<float>(s[0], s[1], g);
        check_against_host<hone::bfloat16>(s[0], s[1], g);
        check_against_host<hone::half>(s[0], s[1], g);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(fake_quantize_async_in_place) {
  const std::size_t rows = 40, cols = 257;
  for (const auto g : {hc::quant_granularity::per_channel, hc::quant_granularity::per_tensor}) {
    const auto w = weights(rows, cols, 5);
    hone::buffer<float, hone::cuda_space> dw(w.size());
    upload(dw.data(), w);
    hc::fake_quant_workspace ws;
    hc::fake_quantize_async<float>({dw.data(), w.size()}, rows, cols, g, {dw.data(), w.size()},
                                   nullptr, ws);
    BOOST_TEST(bit_difference(download(dw.data(), w.size()),
                              host_fake_quant<float>(w, rows, cols, g)) == "");
  }
}

BOOST_AUTO_TEST_CASE(nonfinite_values_set_their_slot_and_bad_calls_are_sentences) {
  for (const auto g : {hc::quant_granularity::per_channel, hc::quant_granularity::per_tensor}) {
    const std::size_t rows = 6, cols = 300;
    auto w = weights(rows, cols, 9);
    auto v = w;
    w[3 * cols + 299] = std::numeric_limits<float>::quiet_NaN();
    v[5 * cols] = -std::numeric_limits<float>::infinity();
    hone::buffer<float, hone::cuda_space> dw(w.size()), dv(v.size()), ok(w.size()), out(w.size());
    upload(dw.data(), w);
    upload(dv.data(), v);
    upload(ok.data(), weights(rows, cols, 10));
    hc::fake_quant_workspace ws(3);
    ws.clear_flags(nullptr);
    hc::fake_quantize_async<float>({ok.data(), w.size()}, rows, cols, g, {out.data(), w.size()},
                                   nullptr, ws, 0);
    hc::fake_quantize_async<float>({dw.data(), w.size()}, rows, cols, g, {out.data(), w.size()},
                                   nullptr, ws, 1);
    hc::fake_quantize_async<float>({dv.data(), w.size()}, rows, cols, g, {out.data(), w.size()},
                                   nullptr, ws, 2);
    ws.read_flags(nullptr);
    HONE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    BOOST_TEST(ws.host_flags()[0] == 0);
    BOOST_TEST(ws.host_flags()[1] == 1);
    BOOST_TEST(ws.host_flags()[2] == 1);
    // The next round starts clean.
    ws.clear_flags(nullptr);
    ws.read_flags(nullptr);
    HONE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    BOOST_TEST(ws.host_flags()[1] == 0);
    const std::string slot = hone_test::error_of<hone::config_error>([&] {
      hc::fake_quantize_async<float>({ok.data(), w.size()}, rows, cols, g, {out.data(), w.size()},
                                     nullptr, ws, 3);
    });
    BOOST_TEST(slot.find("slot 3 is outside the workspace's 3 slots") != std::string::npos, slot);
    const std::string shape = hone_test::error_of<hone::config_error>([&] {
      hc::fake_quantize_async<float>({ok.data(), w.size()}, rows + 1, cols, g,
                                     {out.data(), w.size()}, nullptr, ws, 0);
    });
    BOOST_TEST(shape.find("the weights hold 1800 values") != std::string::npos, shape);
  }
}

namespace {

/// A linear layer [out, in] + bias [out] in working type T in device memory; forward and backward
/// on the host (mean squared error against y = A x + c), in a fixed order.
template <class T>
struct device_dense {
  std::size_t in, out;
  hone::buffer<T, hone::cuda_space> w, gw, b, gb;
  device_dense(std::size_t i, std::size_t o) : in(i), out(o), w(i * o), gw(i * o), b(o), gb(o) {
    std::vector<T> hw(i * o), hb(o);
    for (std::size_t k = 0; k < hw.size(); ++k) {
      hw[k] = T(0.03f * static_cast<float>(static_cast<int>((k * 37) % 19) - 9));
    }
    for (std::size_t k = 0; k < o; ++k) hb[k] = T(0.01f * static_cast<float>(k));
    upload(w.data(), hw);
    upload(b.data(), hb);
  }
  std::vector<hone::parameter<T, hone::cuda_space>> parameters() {
    return {{"fc.weight", {out, in}, {w.data(), in * out}, {gw.data(), in * out}},
            {"fc.bias", {out}, {b.data(), out}, {gb.data(), out}}};
  }
  float forward_backward(unsigned seed, float scale) {
    const auto hw = download(w.data(), in * out);
    const auto hb = download(b.data(), out);
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0, 1);
    const std::size_t rows = 8;
    std::vector<T> g(in * out, T(0.0f)), gbias(out, T(0.0f));
    std::vector<float> gf(in * out, 0.0f), gbf(out, 0.0f), x(in);
    float loss = 0;
    const float inv = 1.0f / static_cast<float>(rows * out);
    for (std::size_t r = 0; r < rows; ++r) {
      for (auto& v : x) v = n(rng);
      for (std::size_t o = 0; o < out; ++o) {
        float y = 0.1f * static_cast<float>(o), pred = static_cast<float>(hb[o]);
        for (std::size_t i = 0; i < in; ++i) {
          y += 0.05f * static_cast<float>((o * 7 + i * 3) % 11) * x[i];
          pred += static_cast<float>(hw[o * in + i]) * x[i];
        }
        const float e = pred - y;
        loss += e * e * inv;
        for (std::size_t i = 0; i < in; ++i) gf[o * in + i] += 2 * e * x[i] * inv;
        gbf[o] += 2 * e * inv;
      }
    }
    for (std::size_t k = 0; k < g.size(); ++k) g[k] = T(gf[k] * scale);
    for (std::size_t k = 0; k < out; ++k) gbias[k] = T(gbf[k] * scale);
    upload(gw.data(), g);
    upload(gb.data(), gbias);
    return loss;
  }
};

/// The same layer in host memory (its forward and backward are device_dense's, on copies).
template <class T>
struct host_dense {
  std::size_t in, out;
  std::vector<T> w, gw, b, gb;
  host_dense(std::size_t i, std::size_t o) : in(i), out(o), w(i * o), gw(i * o), b(o), gb(o) {
    for (std::size_t k = 0; k < w.size(); ++k) {
      w[k] = T(0.03f * static_cast<float>(static_cast<int>((k * 37) % 19) - 9));
    }
    for (std::size_t k = 0; k < o; ++k) b[k] = T(0.01f * static_cast<float>(k));
  }
  std::vector<hone::parameter<T>> parameters() {
    return {{"fc.weight", {out, in}, w, gw}, {"fc.bias", {out}, b, gb}};
  }
  float forward_backward(unsigned seed, float scale) {
    device_dense<T> d(in, out);
    upload(d.w.data(), w);
    upload(d.b.data(), b);
    const float loss = d.forward_backward(seed, scale);
    // Into the bound vectors (the trainer holds their addresses).
    HONE_CUDA_CHECK(
        cudaMemcpy(gw.data(), d.gw.data(), gw.size() * sizeof(T), cudaMemcpyDeviceToHost));
    HONE_CUDA_CHECK(
        cudaMemcpy(gb.data(), d.gb.data(), gb.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return loss;
  }
};

std::vector<float> slice(const std::vector<float>& all, std::size_t offset, std::size_t n) {
  return {all.begin() + static_cast<long>(offset), all.begin() + static_cast<long>(offset + n)};
}

template <class T, class Precision>
void check_trainer(hc::quant_granularity g) {
  const std::size_t in = 40, out = 7;
  device_dense<T> dm(in, out);
  host_dense<T> hm(in, out);
  const hc::fake_quant_options o{.granularity = g, .begin_step = 2};
  hone::trainer dt(dm, Precision{}, hone::adamw{0.01f}, hc::fake_quant_training(o));
  hone::trainer ht(hm, Precision{}, hone::adamw{0.01f}, hc::fake_quant_training(o));
  static_assert(std::is_same_v<typename decltype(dt)::space_type, hone::cuda_space>);
  const auto& layout = dt.layout();
  const std::size_t ow = layout[layout.find("fc.weight")].offset;
  const std::size_t ob = layout[layout.find("fc.bias")].offset;
  const std::size_t total = layout.total();
  for (unsigned s = 0; s < 10; ++s) {
    const auto rd = dt.step(100 + s);
    const auto rh = ht.step(100 + s);
    const auto master = download(dt.master_weights().data(), total);
    const auto mw = slice(master, ow, in * out);
    const auto mb = slice(master, ob, out);
    std::vector<T> want_w(mw.size()), want_b(out);
    const auto fq = host_fake_quant<T>(mw, out, in, g);
    for (std::size_t k = 0; k < mw.size(); ++k) {
      want_w[k] = dt.steps_done() >= 2 ? fq[k] : static_cast<T>(mw[k]);
    }
    for (std::size_t k = 0; k < out; ++k) want_b[k] = static_cast<T>(mb[k]);
    BOOST_TEST_CONTEXT("step " << dt.steps_done()) {
      BOOST_TEST(!rd.skipped);
      BOOST_TEST(bit_difference(download(dm.w.data(), in * out), want_w) == "");
      BOOST_TEST(bit_difference(download(dm.b.data(), out), want_b) == "");
      // The twin takes the same gradients at the same (host) fake-quantized weights, and the
      // device AdamW rounds as the host's: the same losses and master weights to float tolerance.
      BOOST_TEST(rd.loss == rh.loss, boost::test_tools::tolerance(1e-5f));
      const auto hmaster = ht.master_weights();
      for (std::size_t k = 0; k < total; ++k) {
        BOOST_TEST(master[k] == hmaster[k], boost::test_tools::tolerance(1e-5f));
      }
    }
  }
  dt.weight_constraint().check();
  BOOST_TEST((dt.weight_constraint().quantized_tensors() == std::vector<std::string>{"fc.weight"}));
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_cuda_trainer_fake_quantizes_on_the_gpu) {
  for (const auto g : {hc::quant_granularity::per_channel, hc::quant_granularity::per_tensor}) {
    BOOST_TEST_CONTEXT("per_tensor " << (g == hc::quant_granularity::per_tensor)) {
      check_trainer<float, hone::fp32>(g);
      check_trainer<hone::bfloat16, hone::bf16_mixed>(g);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_nan_master_weight_is_reported_with_its_tensor_and_step) {
  const std::size_t in = 16, out = 4;
  device_dense<hone::bfloat16> dm(in, out);
  hone::trainer t(dm, hone::bf16_mixed{}, hone::adamw{0.01f}, hc::fake_quant_training{});
  for (unsigned s = 0; s < 3; ++s) t.step(s);
  const std::size_t ow = t.layout()[t.layout().find("fc.weight")].offset;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  HONE_CUDA_CHECK(
      cudaMemcpy(t.master_weights().data() + ow + 5, &nan, sizeof(float), cudaMemcpyHostToDevice));
  t.weight_constraint().apply(t);  // found on the device, reported by check() (or the next apply)
  const std::string e =
      hone_test::error_of<hone::config_error>([&] { t.weight_constraint().check(); });
  BOOST_TEST(e.find("the master weights of 'fc.weight' held a NaN or infinite value when they "
                    "were fake-quantized after step 3") != std::string::npos,
             e);
  t.weight_constraint().check();  // reported once
}
