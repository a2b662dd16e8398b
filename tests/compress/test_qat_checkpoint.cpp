// hone::compress activation fake quantizers through checkpoints (qat_checkpoint.hpp, and the state
// API of qat_activations.hpp): QAT-like sequences saved mid-way (in memory, through a plain
// safetensors file, the compressed format and a trainer checkpoint directory), restored into fresh
// quantizers, and continued: every later forward value, mask, scale, zero point and observer range
// equal bit for bit to the uninterrupted run (both observers, both schemes, switches toggled
// before the save, a quantizer that has seen nothing); the file's torch layout (names, dtypes,
// shapes, values, +inf / -inf before the first batch) and a torch-written file without hone's
// metadata. The refusals: test_qat_checkpoint_refusals.cpp. The interop with torch itself is
// compress_qat_checkpoint_interop (qat_checkpoint_interop.py).
#define BOOST_TEST_MODULE hone_compress_qat_checkpoint
#include <hone/train.hpp>

#include "../support/linear_model.hpp"
#include "qat_checkpoint_support.hpp"

namespace {

/// y = b + w2 . fq(relu(W1 x)) with mean squared error: an MLP whose hidden activations go
/// through a fake quantizer, trained by hone::trainer.
struct qat_mlp {
  std::size_t in, hidden;
  std::vector<float> w1, g1, w2, g2, b, gb;
  hc::activation_fake_quant fq;
  qat_mlp(std::size_t i, std::size_t h, hc::activation_fake_quant_options o)
      : in(i), hidden(h), w1(i * h), g1(i * h), w2(h), g2(h), b(1), gb(1), fq(o) {
    std::mt19937 rng(11);
    std::normal_distribution<float> n(0.0f, 0.4f);
    for (auto& v : w1) v = n(rng);
    for (auto& v : w2) v = n(rng);
    b[0] = 0.1f;
  }
  std::vector<hone::parameter<float>> parameters() {
    return {{"fc1.weight", {hidden, in}, w1, g1},
            {"fc2.weight", {hidden}, w2, g2},
            {"fc2.bias", {1}, b, gb}};
  }
  float forward_backward(const batch& bt, float scale) {
    const std::size_t rows = bt.y.size();
    std::vector<float> pre(rows * hidden), h(rows * hidden);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t j = 0; j < hidden; ++j) {
        float s = 0.0f;
        for (std::size_t c = 0; c < in; ++c) s += w1[j * in + c] * bt.x[r * in + c];
        pre[r * hidden + j] = s;
        h[r * hidden + j] = std::max(s, 0.0f);
      }
    }
    fq.forward(h);  // in place: the fake-quantized hidden activations
    std::vector<float> gh(rows * hidden);
    std::fill(g1.begin(), g1.end(), 0.0f);
    std::fill(g2.begin(), g2.end(), 0.0f);
    float loss = 0.0f, gbias = 0.0f;
    const auto n = static_cast<float>(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      float pred = b[0];
      for (std::size_t j = 0; j < hidden; ++j) pred += w2[j] * h[r * hidden + j];
      const float e = pred - bt.y[r];
      loss += e * e / n;
      gbias += 2.0f * e / n;
      for (std::size_t j = 0; j < hidden; ++j) {
        g2[j] += 2.0f * e * h[r * hidden + j] / n;
        gh[r * hidden + j] = 2.0f * e * w2[j] / n;
      }
    }
    fq.backward(gh);  // straight through, zero where clipped
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t j = 0; j < hidden; ++j) {
        const float g = pre[r * hidden + j] > 0.0f ? gh[r * hidden + j] : 0.0f;
        for (std::size_t c = 0; c < in; ++c) g1[j * in + c] += g * bt.x[r * in + c];
      }
    }
    for (auto& g : g1) g *= scale;
    for (auto& g : g2) g *= scale;
    gb[0] = gbias * scale;
    return loss;
  }
};

}  // namespace

// ---- (a) a resumed quantizer continues bit for bit ----------------------------------------------

BOOST_AUTO_TEST_CASE(resumed_quantizers_continue_bit_for_bit) {
  hone_test::temp_dir dir("compress_qat_ckpt");
  const std::map<std::string, route> routes = {
      {"state() / restore()",
       [](const hc::activation_fake_quant& from, hc::activation_fake_quant& to,
          const std::string&) { to.restore(from.state()); }},
      {"safetensors",
       [](const hc::activation_fake_quant& from, hc::activation_fake_quant& to,
          const std::string& name) {
         hc::fake_quant_tensors t;
         t.add(name, from);
         ck::tensor_writer w;
         t.add_to(w);
         const std::vector<std::byte> bytes = w.to_bytes();
         hc::read_fake_quants(ck::tensor_file::view(bytes, "q.safetensors"), {{name, to}});
       }},
      {"compressed file",
       [&dir](const hc::activation_fake_quant& from, hc::activation_fake_quant& to,
              const std::string& name) {
         hc::fake_quant_tensors t;
         t.add(name, from);
         ck::tensor_writer w;
         t.add_to(w);
         const auto path = dir / "q.hone";
         ck::write_compressed(w, path);
         hc::read_fake_quants(ck::tensor_file::open(path), {{name, to}});
       }},
  };
  unsigned seed = 100;
  for (const auto& [label, o] : option_sets()) {
    const std::vector<step> steps = sequence(seed++);
    for (const auto& [how, restore] : routes) {
      for (const std::size_t k : save_points) {
        for (const std::string name : {"", "model.fc1.act"}) {
          BOOST_TEST_CONTEXT(label << ", " << how << ", saved after " << k << " steps, name '"
                                   << name << "'") {
            hc::activation_fake_quant a(o), b(o);
            for (std::size_t i = 0; i < k; ++i) run(a, steps[i]);
            // b has a history of its own, which the restore replaces
            run(b, steps[25]);
            b.enable_fake_quant(false);
            restore(a, b, name);
            BOOST_TEST(b.mask_size() == 0u);  // the mask is not state
            BOOST_TEST(message_of([&] {
                         std::vector<float> g(3);
                         b.backward(g);
                       }).find("no forward has run") != std::string::npos);
            if (k == 0) {
              BOOST_TEST(!b.state().seen);
              BOOST_TEST(b.observations() == 0u);
            }
            continue_both(a, b, steps, k);
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(switches_saved_without_a_forward_since) {
  // Switches changed just before the save, with no forward after: the restored quantizer has them.
  const std::vector<step> steps = sequence(7);
  for (const int obs : {0, 1}) {
    for (const int fq : {0, 1}) {
      hc::activation_fake_quant a, b;
      for (std::size_t i = 0; i < 6; ++i) run(a, steps[i]);
      a.enable_observer(obs == 1);
      a.enable_fake_quant(fq == 1);
      const std::vector<std::byte> bytes = file_bytes({{"act", a}});
      hc::read_fake_quants(ck::tensor_file::view(bytes, "q.safetensors"), {{"act", b}});
      BOOST_TEST(b.observer_enabled() == (obs == 1));
      BOOST_TEST(b.fake_quant_enabled() == (fq == 1));
      continue_both(a, b, steps, 6);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_file_is_torch_layout) {
  const std::vector<step> steps = sequence(3);
  hc::activation_fake_quant fresh, trained(hc::qint8_symmetric_activations());
  for (std::size_t i = 0; i < 16; ++i) run(trained, steps[i]);
  const std::vector<std::byte> bytes = file_bytes({{"a.b", fresh}, {"c", trained}});
  const ck::tensor_file f = ck::tensor_file::view(bytes, "q.safetensors");
  BOOST_TEST(f.tensors().size() == 14u);
  struct expect {
    const char* key;
    hone::io::dtype type;
    ck::shape_type shape;
  };
  const expect layout[] = {{"fake_quant_enabled", hone::io::dtype::u8, {1}},
                           {"observer_enabled", hone::io::dtype::u8, {1}},
                           {"scale", hone::io::dtype::f32, {1}},
                           {"zero_point", hone::io::dtype::i32, {1}},
                           {"activation_post_process.eps", hone::io::dtype::f32, {1}},
                           {"activation_post_process.min_val", hone::io::dtype::f32, {}},
                           {"activation_post_process.max_val", hone::io::dtype::f32, {}}};
  for (const char* prefix : {"a.b.", "c."}) {
    for (const expect& e : layout) {
      const std::string key = std::string(prefix) + e.key;
      BOOST_TEST_CONTEXT(key) {
        const ck::tensor_info* t = f.find(key);
        BOOST_TEST_REQUIRE(t != nullptr);
        BOOST_TEST((t->type == e.type));
        BOOST_TEST(t->shape == e.shape);
      }
    }
  }
  constexpr float inf = std::numeric_limits<float>::infinity();
  // a fresh quantizer: torch's initial buffers
  BOOST_TEST(f.read_as<std::uint8_t>("a.b.fake_quant_enabled") == std::vector<std::uint8_t>{1});
  BOOST_TEST(f.read_as<std::uint8_t>("a.b.observer_enabled") == std::vector<std::uint8_t>{1});
  BOOST_TEST(f.read_as<float>("a.b.scale") == std::vector<float>{1.0f});
  BOOST_TEST(f.read_as<std::int32_t>("a.b.zero_point") == std::vector<std::int32_t>{0});
  BOOST_TEST(f.read_as<float>("a.b.activation_post_process.eps") ==
             std::vector<float>{std::numeric_limits<float>::epsilon()});
  BOOST_TEST(f.read_as<float>("a.b.activation_post_process.min_val") == std::vector<float>{inf});
  BOOST_TEST(f.read_as<float>("a.b.activation_post_process.max_val") == std::vector<float>{-inf});
  // a trained one (its observer frozen at step 14): its values
  BOOST_TEST(f.read_as<std::uint8_t>("c.observer_enabled") == std::vector<std::uint8_t>{0});
  BOOST_TEST(f.read_as<std::uint8_t>("c.fake_quant_enabled") == std::vector<std::uint8_t>{1});
  BOOST_TEST(same_bits(f.read_as<float>("c.scale")[0], trained.scale()));
  BOOST_TEST(f.read_as<std::int32_t>("c.zero_point")[0] == 0);
  BOOST_TEST(same_bits(f.read_as<float>("c.activation_post_process.min_val")[0],
                       trained.observed_range().lo));
  BOOST_TEST(same_bits(f.read_as<float>("c.activation_post_process.max_val")[0],
                       trained.observed_range().hi));
  // hone's metadata
  const auto& m = f.metadata();
  BOOST_TEST(m.at("a.b.hone.observations") == "0");
  BOOST_TEST(m.at("c.hone.observations") == "14");
  BOOST_TEST(m.at("a.b.hone.observer") == "moving_average_minmax");
  BOOST_TEST(m.at("a.b.hone.qscheme") == "per_tensor_affine");
  BOOST_TEST(m.at("c.hone.qscheme") == "per_tensor_symmetric");
  BOOST_TEST(m.at("c.hone.quant_min") == "-128");
  BOOST_TEST(m.at("c.hone.quant_max") == "127");
  BOOST_TEST(std::strtof(m.at("c.hone.averaging_constant").c_str(), nullptr) == 0.01f);
  // no prefix: a bare FakeQuantize's keys
  const std::vector<std::byte> bare = file_bytes({{"", trained}});
  const ck::tensor_file g = ck::tensor_file::view(bare, "bare.safetensors");
  BOOST_TEST(g.find("scale") != nullptr);
  BOOST_TEST(g.find("activation_post_process.min_val") != nullptr);
  BOOST_TEST(g.metadata().at("hone.observations") == "14");
}

BOOST_AUTO_TEST_CASE(a_torch_written_file_restores) {
  // torch's state_dict has no hone metadata: the options are the quantizer's own, and the
  // observations count is 1 once the observer has seen a batch, else 0.
  for (const auto& [label, o] : option_sets()) {
    BOOST_TEST_CONTEXT(label) {
      const std::vector<step> steps = sequence(40);
      for (const std::size_t k : {std::size_t{0}, std::size_t{5}, std::size_t{16}}) {
        hc::activation_fake_quant a(o), b(o);
        for (std::size_t i = 0; i < k; ++i) run(a, steps[i]);
        const hc::activation_fake_quant_state s = a.state();
        constexpr float inf = std::numeric_limits<float>::infinity();
        const raw_file t = torch_file(
            "fq", s.fake_quant_enabled ? 1 : 0, s.observer_enabled ? 1 : 0, s.qparams.scale,
            s.qparams.zero_point, s.seen ? s.range.lo : inf, s.seen ? s.range.hi : -inf);
        const std::vector<std::byte> bytes = t.bytes();
        hc::read_fake_quants(ck::tensor_file::view(bytes, "torch.safetensors"), {{"fq", b}});
        BOOST_TEST(b.observations() == (k == 0 ? 0u : 1u));
        BOOST_TEST(b.state().seen == (k > 0));
        // the same from here on, but for the count
        hc::activation_fake_quant_state sb = b.state();
        sb.observations = a.observations();
        expect_same_state(a.state(), sb);
        for (std::size_t i = k; i < steps.size(); ++i) {
          const std::vector<float> ya = run(a, steps[i]), yb = run(b, steps[i]);
          BOOST_TEST(std::ranges::equal(ya, yb, [](float x, float y) { return same_bits(x, y); }));
          BOOST_TEST(same_bits(a.scale(), b.scale()));
          BOOST_TEST(a.zero_point() == b.zero_point());
        }
      }
    }
  }
  // eps is optional (torch before version 2 of the observer's state did not save it)
  hc::activation_fake_quant q;
  raw_file t = torch_file("", 1, 0, 0.5f, 3, -1.5f, 2.0f);
  t.erase("activation_post_process.eps");
  const std::vector<std::byte> bytes = t.bytes();
  hc::read_fake_quants(ck::tensor_file::view(bytes, "old.safetensors"), {{"", q}});
  BOOST_TEST(q.scale() == 0.5f);
  BOOST_TEST(q.zero_point() == 3);
  BOOST_TEST(!q.observer_enabled());
  BOOST_TEST(q.observed_range().lo == -1.5f);
  BOOST_TEST(q.observations() == 1u);
}

// ---- (c) through a trainer checkpoint directory ------------------------------------------------

BOOST_AUTO_TEST_CASE(quantizers_travel_in_trainer_checkpoints) {
  hone_test::temp_dir dir("compress_qat_ckpt_trainer");
  for (const auto& [label, o] : option_sets()) {
    BOOST_TEST_CONTEXT(label) {
      qat_mlp a(12, 10, o), b(12, 10, o);
      hone::trainer<qat_mlp, hone::adamw> ta(a, hone::adamw{0.01f});
      for (unsigned s = 1; s <= 8; ++s) ta.step(make_batch(16, 12, s));
      a.fq.disable_observer();  // frozen before the save: the switch travels too
      ck::snapshot snap;
      ck::capture(ta, snap);
      hc::capture_fake_quants(snap, {{"fc1.output", a.fq}});
      const auto path = ck::write_snapshot(dir.path, ta.steps_done(), snap);
      BOOST_TEST(std::filesystem::exists(path / hc::fake_quant_file));
      hone::trainer<qat_mlp, hone::adamw> tb(b, hone::adamw{0.01f});
      ck::restore(tb, path);
      hc::restore_fake_quants(path, {{"fc1.output", b.fq}});
      expect_same_state(a.fq.state(), b.fq.state());
      for (unsigned s = 9; s <= 16; ++s) {
        if (s == 12) {  // the observer on again in both
          a.fq.enable_observer();
          b.fq.enable_observer();
        }
        ta.step(make_batch(16, 12, s));
        tb.step(make_batch(16, 12, s));
        BOOST_TEST_CONTEXT("step " << s) {
          expect_same_state(a.fq.state(), b.fq.state());
          BOOST_TEST(std::ranges::equal(a.fq.mask_words(), b.fq.mask_words()));
        }
      }
      BOOST_TEST(a.w1 == b.w1);
      BOOST_TEST(a.w2 == b.w2);
      BOOST_TEST(a.b == b.b);
      BOOST_TEST(a.fq.observations() == 13u);  // steps 1-8 and 12-16
      // a checkpoint saved without the quantizers is refused with a sentence
      ck::snapshot plain;
      ck::capture(ta, plain);
      const auto p2 = ck::write_snapshot(dir.path, 1000, plain);
      std::string m;
      try {
        hc::restore_fake_quants(p2, {{"fc1.output", b.fq}});
      } catch (const hone::checkpoint_error& e) {
        m = e.what();
      }
      expect_contains(
          m, {"quantizers.safetensors", "no such file", "saved without capture_fake_quants()"});
      std::filesystem::remove_all(p2);
      std::filesystem::remove_all(path);
    }
  }
}
