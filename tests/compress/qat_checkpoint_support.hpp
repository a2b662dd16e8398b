// Shared by the tests of activation fake quantizers through checkpoints (test_qat_checkpoint.cpp,
// test_qat_checkpoint_refusals.cpp): QAT-like sequences of batches and switches, bit-for-bit
// comparisons of quantizers and states, the option sets and save points, and files built tensor by
// tensor (torch-written and damaged ones).
#pragma once

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <hone/checkpoint.hpp>
#include <hone/checkpoint/compressed_writer.hpp>
#include <hone/compress/qat_activations.hpp>
#include <hone/compress/qat_checkpoint.hpp>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"

namespace hc = hone::compress;
namespace ck = hone::checkpoint;

namespace qat_ckpt_test {

std::vector<float> normal(std::size_t n, unsigned seed, float mean = 0.0f, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// One step of a QAT-like sequence: the batch, and the switches set before it (-1: as they are).
struct step {
  std::vector<float> x;
  int observe = -1, fake_quant = -1;
};

/// Mixed-sign, ReLU-like and drifting batches with outliers; the observer frozen at step 14, fake
/// quantization off at 17 and on again at 19, the observer on again at 21. The switches change
/// at the start of a step and stay as they are after, so a save between two steps carries them.
std::vector<step> sequence(unsigned seed) {
  std::vector<step> s;
  for (std::size_t b = 0; b < 26; ++b) {
    const std::size_t n = b == 2 ? 1 : 1 + (b * 197) % 900;
    std::vector<float> v =
        normal(n, seed + static_cast<unsigned>(b), 0.25f * static_cast<float>(b % 5) - 0.4f,
               0.4f + 0.3f * static_cast<float>(b % 7));
    if (b % 3 == 1) {
      for (auto& x : v) x = std::max(x, 0.0f);
    }
    if (b % 11 == 5) v[n / 2] = 21.0f;
    if (b % 13 == 8) v[0] = -15.0f;
    if (b >= 14 && b < 21) {  // wider batches while the range is frozen: clipping
      for (auto& x : v) x *= 3.0f;
    }
    step st{std::move(v)};
    if (b == 14) st.observe = 0;
    if (b == 17) st.fake_quant = 0;
    if (b == 19) st.fake_quant = 1;
    if (b == 21) st.observe = 1;
    s.push_back(std::move(st));
  }
  return s;
}

bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

/// Runs one step and returns the forward's output.
std::vector<float> run(hc::activation_fake_quant& fq, const step& s) {
  if (s.observe >= 0) fq.enable_observer(s.observe == 1);
  if (s.fake_quant >= 0) fq.enable_fake_quant(s.fake_quant == 1);
  std::vector<float> y(s.x.size());
  fq.forward(s.x, y);
  return y;
}

/// Every field of two states, bit for bit.
void expect_same_state(const hc::activation_fake_quant_state& a,
                       const hc::activation_fake_quant_state& b) {
  BOOST_TEST(a.seen == b.seen);
  BOOST_TEST(same_bits(a.range.lo, b.range.lo));
  BOOST_TEST(same_bits(a.range.hi, b.range.hi));
  BOOST_TEST(same_bits(a.qparams.scale, b.qparams.scale));
  BOOST_TEST(a.qparams.zero_point == b.qparams.zero_point);
  BOOST_TEST(a.observations == b.observations);
  BOOST_TEST(a.observer_enabled == b.observer_enabled);
  BOOST_TEST(a.fake_quant_enabled == b.fake_quant_enabled);
  BOOST_TEST((a.options.observer == b.options.observer));
  BOOST_TEST((a.options.scheme == b.options.scheme));
  BOOST_TEST(a.options.quant_min == b.options.quant_min);
  BOOST_TEST(a.options.quant_max == b.options.quant_max);
  BOOST_TEST(same_bits(a.options.averaging_constant, b.options.averaging_constant));
}

/// Continues the uninterrupted quantizer `a` and the restored `b` over steps [from, end): every
/// output value, mask word, clipped count and the state after each step, bit for bit.
void continue_both(hc::activation_fake_quant& a, hc::activation_fake_quant& b,
                   const std::vector<step>& steps, std::size_t from) {
  expect_same_state(a.state(), b.state());
  for (std::size_t k = from; k < steps.size(); ++k) {
    BOOST_TEST_CONTEXT("step " << k) {
      const std::vector<float> ya = run(a, steps[k]);
      const std::vector<float> yb = run(b, steps[k]);
      std::size_t differ = 0;
      for (std::size_t i = 0; i < ya.size(); ++i) differ += same_bits(ya[i], yb[i]) ? 0 : 1;
      BOOST_TEST(differ == 0u);
      BOOST_TEST(std::ranges::equal(a.mask_words(), b.mask_words()));
      BOOST_TEST(a.clipped() == b.clipped());
      expect_same_state(a.state(), b.state());
      std::vector<float> ga(ya.size(), 1.5f), gb(ya.size(), 1.5f);
      a.backward(ga);
      b.backward(gb);
      BOOST_TEST(std::ranges::equal(ga, gb));
    }
  }
}

const std::vector<std::pair<std::string, hc::activation_fake_quant_options>>& option_sets() {
  static const std::vector<std::pair<std::string, hc::activation_fake_quant_options>> sets = {
      {"quint8 affine, moving average", hc::quint8_affine_activations()},
      {"quint8 affine, min-max", hc::quint8_affine_activations(hc::fake_quant_observer::minmax)},
      {"qint8 symmetric, moving average", hc::qint8_symmetric_activations()},
      {"qint8 symmetric, min-max",
       hc::qint8_symmetric_activations(hc::fake_quant_observer::minmax)},
      {"qint8 affine, moving average 0.25",
       {.averaging_constant = 0.25f, .quant_min = -128, .quant_max = 127}},
  };
  return sets;
}

/// The save points (steps run before the save): nothing seen, one batch, mid-way, the observer
/// frozen (its switch goes off at the start of step 14), fake quantization off (17 and 18), both
/// back on, near the end. switches_saved_without_a_forward_since covers a switch changed just
/// before the save.
constexpr std::size_t save_points[] = {0, 1, 3, 9, 15, 18, 20, 24};

/// A restore route: from one quantizer's state into another, through memory or a file.
using route = std::function<void(const hc::activation_fake_quant& from,
                                 hc::activation_fake_quant& to, const std::string& name)>;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const hone::error& e) {
    return e.what();
  }
  return "no error";
}

void expect_contains(const std::string& m, std::initializer_list<const char*> parts) {
  BOOST_TEST_CONTEXT(m) {
    for (const char* p : parts) BOOST_TEST(m.find(p) != std::string::npos, p);
  }
}

// ---- files as tensors and metadata, to build torch-written and damaged files ----

struct raw_tensor {
  std::string key;
  hone::io::dtype type;
  ck::shape_type shape;
  std::vector<std::byte> bytes;
};

struct raw_file {
  std::vector<raw_tensor> tensors;
  std::map<std::string, std::string> metadata;

  template <class T>
  void set(const std::string& key, ck::shape_type shape, std::vector<T> v) {
    erase(key);
    std::vector<std::byte> b(v.size() * sizeof(T));
    if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
    tensors.push_back({key, hone::io::dtype_of<T>, std::move(shape), std::move(b)});
  }
  void erase(const std::string& key) {
    std::erase_if(tensors, [&](const raw_tensor& t) { return t.key == key; });
  }
  [[nodiscard]] std::vector<std::byte> bytes() const {
    ck::tensor_writer w;
    for (const raw_tensor& t : tensors) w.add(t.key, t.type, t.shape, t.bytes);
    for (const auto& [k, v] : metadata) w.set_metadata(k, v);
    return w.to_bytes();
  }
};

raw_file raw_of(const ck::tensor_file& f) {
  raw_file r;
  for (const ck::tensor_info& t : f.tensors()) {
    std::vector<std::byte> b(static_cast<std::size_t>(t.size_bytes()));
    f.read(t, b);
    r.tensors.push_back({t.name, t.type, t.shape, std::move(b)});
  }
  for (const auto& [k, v] : f.metadata()) r.metadata[k] = v;
  return r;
}

/// The file of quantizers `q` written by fake_quant_tensors into memory.
std::vector<std::byte> file_bytes(std::initializer_list<hc::named_fake_quant> q) {
  const hc::fake_quant_tensors t(q);
  ck::tensor_writer w;
  t.add_to(w);
  return w.to_bytes();
}

/// torch's FakeQuantize state_dict under prefix `name` as safetensors.torch.save_file writes it:
/// the seven tensors, no metadata.
raw_file torch_file(const std::string& name, std::uint8_t fq_on, std::uint8_t obs_on, float scale,
                    std::int32_t zp, float lo, float hi) {
  const auto key = [&](const char* k) { return name.empty() ? std::string(k) : name + "." + k; };
  raw_file r;
  r.set(key("fake_quant_enabled"), {1}, std::vector<std::uint8_t>{fq_on});
  r.set(key("observer_enabled"), {1}, std::vector<std::uint8_t>{obs_on});
  r.set(key("scale"), {1}, std::vector<float>{scale});
  r.set(key("zero_point"), {1}, std::vector<std::int32_t>{zp});
  r.set(key("activation_post_process.eps"), {1},
        std::vector<float>{std::numeric_limits<float>::epsilon()});
  r.set(key("activation_post_process.min_val"), {}, std::vector<float>{lo});
  r.set(key("activation_post_process.max_val"), {}, std::vector<float>{hi});
  return r;
}
}  // namespace qat_ckpt_test

using namespace qat_ckpt_test;
