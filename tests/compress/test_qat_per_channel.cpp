// hone::compress per-channel fake quantization of activations (qat_activations_per_channel.hpp)
// against a scalar float32 oracle written here from torch's formulas (PerChannelMinMaxObserver /
// MovingAveragePerChannelMinMaxObserver, _calculate_qparams, the CPU kernel of
// fake_quantize_per_channel_affine), BIT FOR BIT: per-channel ranges, scales, zero points, every
// forward value and mask bit, backward, over sequences of batches with the switches toggled, for
// both observers, both schemes, [rows, channels] and [outer, channels, inner] layouts; one channel
// against the per-tensor activation_fake_quant; hand-computed ties; torch's fresh buffers; the
// huge-value clamp; state() / restore(); the checkpoint in torch's per-channel state_dict layout
// (names, dtypes, shapes, fresh shapes [1] / [0]), a torch-written file, a mixed per-tensor and
// per-channel file, all-or-nothing restores; every error sentence. The comparison with torch
// itself is compress_qat_per_channel_interop (qat_per_channel_interop.py).
#define BOOST_TEST_MODULE hone_compress_qat_per_channel
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <hone/checkpoint.hpp>
#include <hone/compress/qat_activations.hpp>
#include <hone/compress/qat_activations_per_channel.hpp>
#include <hone/compress/qat_checkpoint.hpp>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../support/error_text.hpp"
#include "../support/temp_dir.hpp"

namespace hc = hone::compress;
namespace ck = hone::checkpoint;

namespace {

bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

bool has(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

/// Forwards a batch given as a list (in place, the result dropped).
template <class Q>
void feed(Q& q, std::vector<float> v) {
  q.forward(v);
}

/// One step: an activation [outer, channels, inner] and the switches before it.
struct step {
  std::vector<float> x;
  std::size_t inner = 1;
  bool observe = true, fake_quant = true;
};

/// Training-like batches for `channels` channels: each channel its own mean and spread (ReLU-like
/// channels, drifting ones, an outlier now and then); the observer frozen at 12 (with wider
/// batches: clipping), fake quantization off at 15, both on again at 17.
std::vector<step> sequence(std::size_t channels, std::size_t inner, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<step> s;
  for (std::size_t b = 0; b < 22; ++b) {
    const std::size_t outer = b == 2 ? 1 : 1 + (b * 37) % 45;
    std::vector<float> x(outer * channels * inner);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::size_t c = (i / inner) % channels;
      std::normal_distribution<float> d(
          0.3f * static_cast<float>(c % 4) - 0.4f + 0.05f * static_cast<float>(b % 5),
          0.2f + 0.3f * static_cast<float>((c + b) % 5));
      float v = d(rng);
      if (c % 3 == 1) v = std::max(v, 0.0f);  // a channel after a ReLU
      if (b >= 12 && b < 17) v *= 3.0f;
      x[i] = v;
    }
    if (b % 7 == 3) x[x.size() / 2] = 30.0f;
    if (b % 9 == 4) x[0] = -12.0f;
    step st{std::move(x), inner};
    st.observe = !(b >= 12 && b < 17);
    st.fake_quant = !(b == 15 || b == 16);
    s.push_back(std::move(st));
  }
  return s;
}

/// torch's per-channel FakeQuantize in float32, written from torch's source: the observer
/// (aminmax per channel; the moving average lo + c * (min - lo) or the running min / max),
/// _calculate_qparams and the fake_quantize_per_channel_affine CPU kernel.
struct oracle {
  hc::activation_fake_quant_options o;
  std::size_t channels;
  std::vector<float> lo, hi, scale{1.0f};
  std::vector<std::int32_t> zp{0};

  void qparams() {
    const float qmin = static_cast<float>(o.quant_min), qmax = static_cast<float>(o.quant_max);
    const float eps = std::numeric_limits<float>::epsilon();
    scale.assign(channels, 0.0f);
    zp.assign(channels, 0);
    for (std::size_t c = 0; c < channels; ++c) {
      const float l = std::min(lo[c], 0.0f), h = std::max(hi[c], 0.0f);
      if (o.scheme == hc::fake_quant_scheme::symmetric) {
        const float half = static_cast<float>(static_cast<double>(o.quant_max - o.quant_min) / 2);
        scale[c] = std::max(std::max(-l, h) / half, eps);
      } else {
        volatile float d = h - l;  // separate float operations, as torch's tensor ops
        scale[c] = std::max(d / (qmax - qmin), eps);
        const auto r = static_cast<std::int64_t>(std::nearbyint(l / scale[c]));
        zp[c] = static_cast<std::int32_t>(
            std::clamp<std::int64_t>(o.quant_min - r, o.quant_min, o.quant_max));
      }
    }
  }

  /// Observes (when on) and fake-quantizes (when on) x; returns y and the mask.
  std::vector<float> run(const step& s, std::vector<bool>& mask) {
    const std::size_t n = s.x.size(), in = s.inner;
    if (s.observe) {
      std::vector<float> mn(channels, std::numeric_limits<float>::infinity());
      std::vector<float> mx(channels, -std::numeric_limits<float>::infinity());
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t c = (i / in) % channels;
        if (s.x[i] < mn[c]) mn[c] = s.x[i];
        if (s.x[i] > mx[c]) mx[c] = s.x[i];
      }
      if (lo.empty()) {
        lo = mn;
        hi = mx;
      } else {
        for (std::size_t c = 0; c < channels; ++c) {
          if (o.observer == hc::fake_quant_observer::minmax) {
            lo[c] = std::min(lo[c], mn[c]);
            hi[c] = std::max(hi[c], mx[c]);
          } else {
            volatile float dl = o.averaging_constant * (mn[c] - lo[c]);
            volatile float dh = o.averaging_constant * (mx[c] - hi[c]);
            lo[c] = lo[c] + dl;
            hi[c] = hi[c] + dh;
          }
        }
      }
      qparams();
    }
    std::vector<float> y(s.x);
    mask.assign(n, true);
    if (!s.fake_quant) return y;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t c = (i / in) % channels;
      const float inv = 1.0f / scale[c];
      const float q = static_cast<float>(zp[c]) + std::nearbyint(s.x[i] * inv);
      const auto qi = static_cast<std::int64_t>(q);  // |q| < 2^63 here
      mask[i] = o.quant_min <= qi && qi <= o.quant_max;
      const double cl = std::fmin(std::fmax(static_cast<double>(qi), o.quant_min), o.quant_max);
      y[i] = static_cast<float>((cl - zp[c]) * static_cast<double>(scale[c]));
    }
    return y;
  }
};

const std::vector<std::pair<std::string, hc::activation_fake_quant_options>>& option_sets() {
  static const std::vector<std::pair<std::string, hc::activation_fake_quant_options>> sets = {
      {"quint8 affine, moving average", hc::quint8_affine_activations()},
      {"quint8 affine, min-max", hc::quint8_affine_activations(hc::fake_quant_observer::minmax)},
      {"qint8 symmetric, moving average", hc::qint8_symmetric_activations()},
      {"qint8 symmetric, min-max",
       hc::qint8_symmetric_activations(hc::fake_quant_observer::minmax)},
      {"qint8 affine, moving average 0.25",
       {.averaging_constant = 0.25f, .quant_min = -128, .quant_max = 127}},
      {"restricted symmetric -127..127",
       {.observer = hc::fake_quant_observer::minmax,
        .scheme = hc::fake_quant_scheme::symmetric,
        .quant_min = -127,
        .quant_max = 127}},
  };
  return sets;
}

/// Runs one step through fq (switches, forward, backward of a nonzero gradient).
std::vector<float> run(hc::activation_fake_quant_per_channel& fq, const step& s,
                       std::vector<float>* grad = nullptr) {
  fq.enable_observer(s.observe);
  fq.enable_fake_quant(s.fake_quant);
  std::vector<float> y(s.x.size());
  fq.forward(s.x, y, s.inner);
  if (grad != nullptr) {
    grad->assign(s.x.size(), 0.0f);
    for (std::size_t i = 0; i < grad->size(); ++i) (*grad)[i] = 0.5f + 0.001f * (i % 1000);
    fq.backward(*grad);
  }
  return y;
}

void expect_same_state(const hc::activation_fake_quant_per_channel_state& a,
                       const hc::activation_fake_quant_per_channel_state& b) {
  const auto bits = [](const std::vector<float>& u, const std::vector<float>& v) {
    return std::ranges::equal(u, v, same_bits);
  };
  BOOST_TEST(bits(a.min_val, b.min_val));
  BOOST_TEST(bits(a.max_val, b.max_val));
  BOOST_TEST(bits(a.scale, b.scale));
  BOOST_TEST((a.zero_point == b.zero_point));
  BOOST_TEST(a.observations == b.observations);
  BOOST_TEST(a.observer_enabled == b.observer_enabled);
  BOOST_TEST(a.fake_quant_enabled == b.fake_quant_enabled);
  BOOST_TEST(a.channels == b.channels);
}

}  // namespace

// ---- (a) against the float32 oracle, bit for bit ------------------------------------------------

BOOST_AUTO_TEST_CASE(sequences_against_the_float_oracle_bit_for_bit) {
  unsigned seed = 10;
  std::size_t clipped = 0;
  for (const auto& [label, o] : option_sets()) {
    for (const auto& [channels, inner] :
         {std::pair<std::size_t, std::size_t>{1, 1}, {5, 1}, {16, 1}, {3, 7}, {8, 4}}) {
      BOOST_TEST_CONTEXT(label << ", " << channels << " channels, inner " << inner) {
        hc::activation_fake_quant_per_channel fq(channels, o);
        oracle ref{o, channels, {}, {}};
        for (const step& s : sequence(channels, inner, seed++)) {
          std::vector<bool> mask;
          const std::vector<float> want = ref.run(s, mask);
          std::vector<float> grad;
          const std::vector<float> y = run(fq, s, &grad);
          std::size_t bad_y = 0, bad_mask = 0, bad_grad = 0;
          for (std::size_t i = 0; i < y.size(); ++i) {
            bad_y += same_bits(y[i], want[i]) ? 0 : 1;
            bad_mask += fq.passes(i) == mask[i] ? 0 : 1;
            const float g = mask[i] ? 0.5f + 0.001f * (i % 1000) : 0.0f;
            bad_grad += same_bits(grad[i], g) ? 0 : 1;
            clipped += mask[i] ? 0 : 1;
          }
          BOOST_TEST(bad_y == 0u);
          BOOST_TEST(bad_mask == 0u);
          BOOST_TEST(bad_grad == 0u);
          BOOST_TEST(std::ranges::equal(fq.min_vals(), ref.lo, same_bits));
          BOOST_TEST(std::ranges::equal(fq.max_vals(), ref.hi, same_bits));
          BOOST_TEST(std::ranges::equal(fq.scales(), ref.scale, same_bits));
          BOOST_TEST(std::ranges::equal(fq.zero_points(), ref.zp));
        }
        BOOST_TEST(fq.observations() == 17u);
      }
    }
  }
  BOOST_TEST(clipped > 1000u);  // the mask is exercised
}

BOOST_AUTO_TEST_CASE(one_channel_equals_the_per_tensor_quantizer) {
  // Each channel of a per-channel quantizer is a per-tensor quantizer fed that channel's values.
  for (const auto& [label, o] : option_sets()) {
    BOOST_TEST_CONTEXT(label) {
      const std::size_t channels = 4, inner = 3;
      hc::activation_fake_quant_per_channel pc(channels, o);
      std::vector<hc::activation_fake_quant> pt(channels, hc::activation_fake_quant(o));
      for (const step& s : sequence(channels, inner, 99)) {
        const std::vector<float> y = run(pc, s);
        for (std::size_t c = 0; c < channels; ++c) {
          std::vector<float> xc, yc;
          for (std::size_t i = 0; i < s.x.size(); ++i) {
            if ((i / inner) % channels == c) {
              xc.push_back(s.x[i]);
              yc.push_back(y[i]);
            }
          }
          pt[c].enable_observer(s.observe);
          pt[c].enable_fake_quant(s.fake_quant);
          std::vector<float> want(xc.size());
          pt[c].forward(xc, want);
          BOOST_TEST(std::ranges::equal(yc, want, same_bits));
          BOOST_TEST(same_bits(pc.qparams(c).scale, pt[c].scale()));
          BOOST_TEST(pc.qparams(c).zero_point == pt[c].zero_point());
          BOOST_TEST(same_bits(pc.observed_range(c).lo, pt[c].observed_range().lo));
          BOOST_TEST(same_bits(pc.observed_range(c).hi, pt[c].observed_range().hi));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(ties_and_boundaries_by_hand) {
  // Channel 0: range [0, 255] (scale 1, zero point 0); channel 1: [-1, 254] (scale 1, zp 1).
  hc::activation_fake_quant_per_channel fq(
      2, hc::quint8_affine_activations(hc::fake_quant_observer::minmax));
  feed(fq, {0.0f, -1.0f, 255.0f, 254.0f});
  BOOST_TEST(fq.scales()[0] == 1.0f);
  BOOST_TEST(fq.scales()[1] == 1.0f);
  BOOST_TEST(fq.zero_points()[0] == 0);
  BOOST_TEST(fq.zero_points()[1] == 1);
  fq.disable_observer();
  std::vector<float> x = {2.5f, 2.5f, 3.5f, -1.5f, -0.5f, -1.4f, 255.5f, 254.5f, 254.5f, 254.6f};
  fq.forward(x);
  const std::vector<float> want = {2.0f,  2.0f,   4.0f,   -1.0f,  0.0f,
                                   -1.0f, 255.0f, 254.0f, 254.0f, 254.0f};
  BOOST_TEST(x == want, boost::test_tools::per_element());
  // even columns channel 0, odd channel 1; clipped: -1.5 (ch 1: 1 + (-2) = -1, to code 0: -1),
  // 255.5 (ch 0: 256), 254.6 (ch 1: 1 + 255 = 256); 254.5 stays (ch 1: 1 + 254, half to even)
  const std::vector<bool> pass = {true, true, true, false, true, true, false, true, true, false};
  for (std::size_t i = 0; i < pass.size(); ++i) BOOST_TEST(fq.passes(i) == pass[i], i);
  BOOST_TEST(fq.clipped() == 3u);
}

BOOST_AUTO_TEST_CASE(fresh_buffers_and_huge_values) {
  hc::activation_fake_quant_per_channel fq(3);
  BOOST_TEST(fq.scales().size() == 1u);  // torch's fresh buffers
  BOOST_TEST(fq.zero_points().size() == 1u);
  BOOST_TEST(fq.min_vals().empty());
  BOOST_TEST(!fq.seen());
  BOOST_TEST(fq.qparams(2).scale == 1.0f);
  // fake quantization without scales for 3 channels: refused, as torch refuses it
  fq.disable_observer();
  std::vector<float> x = {0.4f, 1.0f, 2.0f};
  const std::string m = hone_test::error_of<hone::config_error>([&] { fq.forward(x); });
  BOOST_TEST(has(m, "has observed no batch, so it has no per-channel scales"), m);
  fq.disable_fake_quant();
  fq.forward(x);  // a copy
  BOOST_TEST(x[0] == 0.4f);
  // one channel: scale 1, zero point 0, as torch
  hc::activation_fake_quant_per_channel one(1);
  one.disable_observer();
  std::vector<float> v = {0.4f, 2.6f, -3.0f, 300.0f};
  one.forward(v);
  BOOST_TEST(v == (std::vector<float>{0.0f, 3.0f, 0.0f, 255.0f}), boost::test_tools::per_element());
  // huge values clamp to their end of the codes with a zero mask (torch on x86-64 gives
  // quant_min's value for q >= 2^63: the documented divergence)
  hc::activation_fake_quant_per_channel h(2);
  feed(h, {-1.0f, 0.0f, 1.0f, 2.0f});
  h.disable_observer();
  std::vector<float> big = {1e30f, -1e30f, 3e38f, 1e19f};
  h.forward(big);
  BOOST_TEST(same_bits(big[0], (255.0f - static_cast<float>(h.zero_points()[0])) * h.scales()[0]));
  BOOST_TEST(h.zero_points()[1] == 0);  // channel 1's range [0, 2]: quant_min's value is +0
  BOOST_TEST(same_bits(big[1], 0.0f));
  BOOST_TEST(same_bits(big[2], big[0]));
  BOOST_TEST(h.clipped() == 4u);
}

BOOST_AUTO_TEST_CASE(switches_in_place_and_backward) {
  const std::vector<step> steps = sequence(6, 2, 5);
  hc::activation_fake_quant_per_channel a(6), b(6);
  for (const step& s : steps) {
    const std::vector<float> ya = run(a, s);
    b.enable_observer(s.observe);
    b.enable_fake_quant(s.fake_quant);
    std::vector<float> yb = s.x;
    b.forward(yb, s.inner);  // in place
    BOOST_TEST(std::ranges::equal(ya, yb, same_bits));
    BOOST_TEST(std::ranges::equal(a.mask_words(), b.mask_words()));
    if (!s.fake_quant) {
      BOOST_TEST(std::ranges::equal(ya, s.x, same_bits));
      BOOST_TEST(a.clipped() == 0u);
    }
    std::vector<float> g(s.x.size(), 2.0f), gx(s.x.size());
    a.backward(g, gx);
    for (std::size_t i = 0; i < g.size(); ++i) BOOST_TEST(gx[i] == (a.passes(i) ? 2.0f : 0.0f));
  }
  BOOST_TEST(a.observations() == 17u);  // 5 steps with the observer frozen
}

// ---- (b) state and checkpoints ------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(restored_quantizers_continue_bit_for_bit) {
  hone_test::temp_dir dir("compress_qat_pc");
  for (const auto& [label, o] : option_sets()) {
    const std::vector<step> steps = sequence(5, 3, 42);
    for (const std::size_t k : {0u, 1u, 7u, 13u, 16u, 20u}) {
      for (const int route : {0, 1, 2}) {
        BOOST_TEST_CONTEXT(label << ", saved after " << k << ", route " << route) {
          hc::activation_fake_quant_per_channel a(5, o), b(5, o);
          for (std::size_t i = 0; i < k; ++i) run(a, steps[i]);
          run(b, steps[3]);  // a history of its own, replaced
          if (route == 0) {
            b.restore(a.state());
          } else if (route == 1) {
            const hc::fake_quant_tensors t({{"net.act", a}});
            ck::tensor_writer w;
            t.add_to(w);
            const std::vector<std::byte> bytes = w.to_bytes();
            hc::read_fake_quants(ck::tensor_file::view(bytes, "q.safetensors"), {{"net.act", b}});
          } else {  // a checkpoint directory, next to a per-tensor quantizer
            hc::activation_fake_quant pa, pb;
            feed(pa, {0.5f, -1.0f});
            ck::snapshot snap;
            hc::capture_fake_quants(snap, {{"pt", pa}}, {{"", a}});
            const auto path = ck::write_snapshot(dir.path, 100 + k, snap);
            hc::restore_fake_quants(path, {{"pt", pb}}, {{"", b}});
            BOOST_TEST(same_bits(pb.scale(), pa.scale()));
            BOOST_TEST(pb.observations() == 1u);
          }
          BOOST_TEST(b.mask_size() == 0u);
          expect_same_state(a.state(), b.state());
          for (std::size_t i = k; i < steps.size(); ++i) {
            std::vector<float> ga, gb;
            BOOST_TEST(std::ranges::equal(run(a, steps[i], &ga), run(b, steps[i], &gb), same_bits));
            BOOST_TEST(std::ranges::equal(ga, gb, same_bits));
            expect_same_state(a.state(), b.state());
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(the_file_has_torchs_per_channel_layout) {
  hc::activation_fake_quant_per_channel fresh(4), trained(3, hc::qint8_symmetric_activations());
  feed(trained, {-1.0f, 0.5f, 2.0f, 0.25f, -3.0f, 1.0f});
  trained.disable_fake_quant();
  hc::activation_fake_quant pt;
  const hc::fake_quant_tensors t = [&] {
    hc::fake_quant_tensors r({{"fresh", fresh}, {"m.trained", trained}});
    r.add("pt", pt);
    return r;
  }();
  ck::tensor_writer w;
  t.add_to(w);
  const std::vector<std::byte> bytes = w.to_bytes();
  const ck::tensor_file f = ck::tensor_file::view(bytes, "q.safetensors");
  const auto expect = [&](const std::string& k, hone::io::dtype type, ck::shape_type shape) {
    const ck::tensor_info* i = f.find(k);
    BOOST_TEST_REQUIRE(i != nullptr, k);
    BOOST_TEST((i->type == type), k);
    BOOST_TEST((i->shape == shape), k);
  };
  using hone::io::dtype;
  for (const auto& [n, c, r] :
       {std::tuple<std::string, std::size_t, std::size_t>{"fresh", 1, 0}, {"m.trained", 3, 3}}) {
    expect(n + ".fake_quant_enabled", dtype::u8, {1});
    expect(n + ".observer_enabled", dtype::u8, {1});
    expect(n + ".scale", dtype::f32, {c});
    expect(n + ".zero_point", dtype::i32, {c});
    expect(n + ".activation_post_process.eps", dtype::f32, {1});
    expect(n + ".activation_post_process.min_val", dtype::f32, {r});
    expect(n + ".activation_post_process.max_val", dtype::f32, {r});
  }
  expect("pt.activation_post_process.min_val", dtype::f32, {});
  BOOST_TEST(f.tensors().size() == 21u);
  BOOST_TEST(f.metadata().at("fresh.hone.qscheme") == "per_channel_affine");
  BOOST_TEST(f.metadata().at("m.trained.hone.qscheme") == "per_channel_symmetric");
  BOOST_TEST(f.metadata().at("m.trained.hone.channels") == "3");
  BOOST_TEST(f.metadata().at("fresh.hone.channels") == "4");
  BOOST_TEST(f.metadata().at("pt.hone.qscheme") == "per_tensor_affine");
  BOOST_TEST(f.read_as<float>("m.trained.activation_post_process.min_val") ==
                 (std::vector<float>{-1.0f, -3.0f, 1.0f}),
             boost::test_tools::per_element());
  BOOST_TEST(f.read_as<std::uint8_t>("m.trained.fake_quant_enabled")[0] == 0);
  BOOST_TEST(f.read_as<float>("fresh.scale")[0] == 1.0f);
  BOOST_TEST(
      f.read_as<std::int32_t>("m.trained.zero_point") == (std::vector<std::int32_t>{0, 0, 0}),
      boost::test_tools::per_element());
  // a mixed set restores all or nothing
  hc::activation_fake_quant_per_channel fresh2(4), trained2(3, hc::qint8_symmetric_activations());
  hc::activation_fake_quant pt2;
  const hc::named_fake_quant ptn[] = {{"pt", pt2}};
  const hc::named_fake_quant_per_channel pcn[] = {{"fresh", fresh2}, {"m.trained", trained2}};
  hc::read_fake_quants(f, ptn, pcn);
  hc::read_fake_quants(f, {{"pt", pt2}}, {{"fresh", fresh2}});  // the same from two lists
  expect_same_state(trained.state(), trained2.state());
  expect_same_state(fresh.state(), fresh2.state());
  hc::activation_fake_quant_per_channel wrong(5);
  const hc::named_fake_quant_per_channel bad[] = {{"m.trained", trained2}, {"fresh", wrong}};
  trained2.enable_fake_quant();
  const std::string m =
      hone_test::error_of<hone::checkpoint_error>([&] { hc::read_fake_quants(f, {}, bad); });
  BOOST_TEST(has(m, "fake quantizer 'fresh': the state has 4 channels, but this quantizer has 5"),
             m);
  BOOST_TEST(trained2.fake_quant_enabled());  // unchanged: all or nothing
}

BOOST_AUTO_TEST_CASE(a_torch_written_file_restores) {
  // safetensors.torch.save_file of a trained per-channel FakeQuantize's state_dict (no metadata)
  hc::activation_fake_quant_per_channel a(3, hc::quint8_affine_activations());
  const std::vector<step> steps = sequence(3, 1, 8);
  for (std::size_t i = 0; i < 6; ++i) run(a, steps[i]);
  const hc::activation_fake_quant_per_channel_state s = a.state();
  ck::tensor_writer w;
  const std::uint8_t on = 1;
  const float eps = std::numeric_limits<float>::epsilon();
  w.add("act.fake_quant_enabled", hone::io::dtype::u8, {1}, std::as_bytes(std::span(&on, 1)));
  w.add("act.observer_enabled", hone::io::dtype::u8, {1}, std::as_bytes(std::span(&on, 1)));
  w.add("act.scale", {3}, s.scale);
  w.add("act.zero_point", {3}, s.zero_point);
  w.add("act.activation_post_process.eps", hone::io::dtype::f32, {1},
        std::as_bytes(std::span(&eps, 1)));
  w.add("act.activation_post_process.min_val", {3}, s.min_val);
  w.add("act.activation_post_process.max_val", {3}, s.max_val);
  const std::vector<std::byte> bytes = w.to_bytes();
  hc::activation_fake_quant_per_channel b(3);
  hc::read_fake_quants(ck::tensor_file::view(bytes, "torch.safetensors"), {{"act", b}});
  BOOST_TEST(b.observations() == 1u);  // torch stores no count
  for (std::size_t i = 6; i < steps.size(); ++i) {
    BOOST_TEST(std::ranges::equal(run(a, steps[i]), run(b, steps[i]), same_bits));
  }
  // the same file into 4 channels, or as a per-tensor quantizer: sentences
  hc::activation_fake_quant_per_channel four(4);
  const std::string m1 = hone_test::error_of<hone::checkpoint_error>([&] {
    hc::read_fake_quants(ck::tensor_file::view(bytes, "torch.safetensors"), {{"act", four}});
  });
  BOOST_TEST(has(m1, "the observer's min_val has 3 values and max_val 3; both have 0"), m1);
  hc::activation_fake_quant pt;
  const std::string m2 = hone_test::error_of<hone::checkpoint_error>([&] {
    hc::read_fake_quants(ck::tensor_file::view(bytes, "torch.safetensors"), {{"act", pt}});
  });
  BOOST_TEST(has(m2,
                 "tensor 'act.scale' is F32 of shape [3], but torch's FakeQuantize stores it "
                 "as F32 of shape [1]"),
             m2);
}

BOOST_AUTO_TEST_CASE(files_of_the_other_granularity_are_refused) {
  hc::activation_fake_quant pt;
  feed(pt, {1.0f, -2.0f});
  hc::activation_fake_quant_per_channel one(1);
  feed(one, {1.0f, -2.0f});
  ck::tensor_writer w1, w2;
  const hc::fake_quant_tensors t1({{"a", pt}}), t2({{"a", one}});
  t1.add_to(w1);
  t2.add_to(w2);
  const std::vector<std::byte> b1 = w1.to_bytes(), b2 = w2.to_bytes();
  hc::activation_fake_quant_per_channel pc(1);
  const std::string m1 = hone_test::error_of<hone::checkpoint_error>([&] {
    hc::read_fake_quants(ck::tensor_file::view(b1, "pt.safetensors"), {{"a", pc}});
  });
  BOOST_TEST(has(m1,
                 "tensor 'a.activation_post_process.min_val' is F32 of shape [], but torch's "
                 "per-channel FakeQuantize stores it as F32 of shape [channels]"),
             m1);
  hc::activation_fake_quant pt2;
  const std::string m2 = hone_test::error_of<hone::checkpoint_error>([&] {
    hc::read_fake_quants(ck::tensor_file::view(b2, "pc.safetensors"), {{"a", pt2}});
  });
  BOOST_TEST(has(m2,
                 "'a.activation_post_process.min_val' is F32 of shape [1], but torch's "
                 "FakeQuantize stores it as F32 of shape []"),
             m2);
}

// ---- (c) the error sentences --------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(errors_are_sentences) {
  using hone::config_error;
  const auto err = [](auto f) { return hone_test::error_of<config_error>(f); };
  BOOST_TEST(
      has(err([] { hc::activation_fake_quant_per_channel q(0); }), "the channel count is 0"));
  BOOST_TEST(
      has(err([] { hc::activation_fake_quant_per_channel q(2, {.quant_min = 5, .quant_max = 5}); }),
          "they must satisfy -32768 <= quant_min < quant_max"));
  hc::activation_fake_quant_per_channel fq(3);
  std::vector<float> x(6, 1.0f), y(6);
  BOOST_TEST(has(err([&] { fq.forward(std::span<float>()); }), "the input is empty"));
  BOOST_TEST(has(err([&] { fq.forward(x, std::span<float>(y).first(5)); }),
                 "the input holds 6 values but the output 5"));
  BOOST_TEST(has(err([&] { fq.forward(x, y, 0); }), "inner is 0"));
  BOOST_TEST(has(err([&] { fq.forward(std::span<float>(x).first(5)); }),
                 "the input holds 5 values, which is not a whole number of [channels = 3, "
                 "inner = 1] blocks"));
  BOOST_TEST(has(err([&] { fq.forward(x, y, 4); }), "[channels = 3, inner = 4] blocks"));
  std::vector<float> big(12, 1.0f);
  BOOST_TEST(has(err([&] {
                   fq.forward(std::span<const float>(big).first(6),
                              std::span<float>(big).subspan(3, 6));
                 }),
                 "the output overlaps the input"));
  x[4] = std::numeric_limits<float>::quiet_NaN();
  BOOST_TEST(has(err([&] { fq.forward(x); }), "the value at index 4 (row 1, channel 1) is NaN"));
  std::vector<float> z(12, 0.0f);
  z[7] = -std::numeric_limits<float>::infinity();
  BOOST_TEST(has(err([&] { fq.forward(z, 2); }),
                 "the value at index 7 (outer 1, channel 0, position 1) is infinite"));
  BOOST_TEST(fq.observations() == 0u);  // refused forwards change nothing
  BOOST_TEST(has(err([&] {
                   std::vector<float> g(6);
                   fq.backward(g);
                 }),
                 "no forward has run"));
  // a channel whose range is too wide for a finite float scale: named, quantizer unchanged
  std::vector<float> wide = {1.0f, -3e38f, 2.0f, 1.0f, 3e38f, 2.0f};
  const std::string w = err([&] { fq.forward(wide); });
  BOOST_TEST(has(w, "forward: channel 1: hone::compress::fake_quant_qparams: the range"), w);
  BOOST_TEST(has(w, "is too wide for a finite float scale"), w);
  BOOST_TEST(!fq.seen());
  std::vector<float> ok = {1.0f, 2.0f, 3.0f};
  fq.forward(ok);
  BOOST_TEST(has(err([&] {
                   std::vector<float> g(6);
                   fq.backward(g);
                 }),
                 "the gradients hold 6 (output) and 6 (input) values, but the last forward had 3"));
  BOOST_TEST(has(err([&] { (void)fq.qparams(3); }), "channel 3 does not exist"));
  BOOST_TEST(has(err([&] { (void)fq.observed_range(7); }), "channel 7 does not exist"));
  // restore: every inconsistent state is refused, the quantizer unchanged
  const hc::activation_fake_quant_per_channel_state good = fq.state();
  const auto refused = [&](auto change, const char* part) {
    hc::activation_fake_quant_per_channel_state s = good;
    change(s);
    const std::string m = err([&] { fq.restore(s); });
    BOOST_TEST(has(m, part), m);
    expect_same_state(fq.state(), good);
  };
  using state = hc::activation_fake_quant_per_channel_state;
  refused([](state& s) { s.channels = 4; }, "the state has 4 channels, but this quantizer has 3");
  refused([](state& s) { s.options.quant_max = 127; }, "the state was saved by a quantizer with");
  refused([](state& s) { s.min_val.pop_back(); }, "the observer's min_val has 2 values");
  refused([](state& s) { s.scale.pop_back(); }, "the scale has 2 values and the zero point 3");
  refused([](state& s) { s.scale[2] = 0.0f; }, "channel 2: the scale is 0");
  refused([](state& s) { s.zero_point[1] = 300; }, "channel 1: the zero point 300 lies outside");
  refused([](state& s) { s.max_val[0] = -5.0f; }, "channel 0: the observer's range [1, -5]");
  refused([](state& s) { s.observations = 0; }, "the observations count is 0");
  refused(
      [](state& s) {
        s.min_val.clear();
        s.max_val.clear();
      },
      "the observations count is 1 but the observer has seen no batch");
  refused(
      [](state& s) {
        s.min_val.clear();
        s.max_val.clear();
        s.observations = 0;
        s.scale = {1.0f, 1.0f};
        s.zero_point = {0, 0};
      },
      "or 1 (torch's fresh buffers) before the first observed batch");
}
