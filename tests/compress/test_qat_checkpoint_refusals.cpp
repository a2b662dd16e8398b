// hone::compress activation fake quantizers through checkpoints, the refusals: states a quantizer
// cannot be in (activation_fake_quant::restore) and files that are not a quantizer's
// (read_fake_quants, restore_fake_quants), each with its sentence and the quantizers unchanged.
// The resumed runs and the layout: test_qat_checkpoint.cpp.
#define BOOST_TEST_MODULE hone_compress_qat_checkpoint_refusals
#include "qat_checkpoint_support.hpp"

// ---- (b) refusals
// --------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(restore_refuses_states_a_quantizer_cannot_be_in) {
  const std::vector<step> steps = sequence(9);
  hc::activation_fake_quant trained;
  for (std::size_t i = 0; i < 5; ++i) run(trained, steps[i]);
  const hc::activation_fake_quant_state good = trained.state();
  const auto refused = [&](hc::activation_fake_quant_options into,
                           const std::function<void(hc::activation_fake_quant_state&)>& damage,
                           std::initializer_list<const char*> parts) {
    hc::activation_fake_quant q(into);
    run(q, steps[7]);
    const hc::activation_fake_quant_state before = q.state();
    const std::vector<std::uint64_t> mask(q.mask_words().begin(), q.mask_words().end());
    hc::activation_fake_quant_state s = good;
    s.options = into;  // unless damage changes them
    damage(s);
    std::string m;
    try {
      q.restore(s);
    } catch (const hone::config_error& e) {
      m = e.what();
    }
    expect_contains(m, parts);
    expect_contains(m, {"hone::compress::activation_fake_quant::restore: "});
    expect_same_state(q.state(), before);  // unchanged, the mask too
    BOOST_TEST(std::ranges::equal(q.mask_words(), mask));
  };
  const hc::activation_fake_quant_options def{};
  // options that differ: each field
  refused(
      def, [](auto& s) { s.options.observer = hc::fake_quant_observer::minmax; },
      {"saved by a quantizer with min-max observer, affine, codes [0, 255]",
       "this one has moving-average min-max observer (averaging constant 0.00999999978), affine, "
       "codes [0, 255]",
       "construct the quantizer with the options it was trained with"});
  refused(def, [](auto& s) { s.options.averaging_constant = 0.02f; },
          {"averaging constant 0.0199999996", "this one has"});
  refused(hc::qint8_symmetric_activations(),
          [](auto& s) { s.options.scheme = hc::fake_quant_scheme::affine; },
          {"affine, codes [-128, 127], but this one has", "symmetric"});
  refused(def, [](auto& s) { s.options.quant_max = 127; }, {"codes [0, 127], but this one has"});
  refused(def, [](auto& s) { s.options.quant_min = -1; }, {"codes [-1, 255]"});
  // the averaging constant does not matter to the min-max observer
  {
    hc::activation_fake_quant q(hc::quint8_affine_activations(hc::fake_quant_observer::minmax));
    hc::activation_fake_quant_state s = good;
    s.options = q.options();
    s.options.averaging_constant = 0.5f;
    q.restore(s);
    BOOST_TEST(q.observations() == 5u);
  }
  // the values
  refused(def, [](auto& s) { s.qparams.scale = std::numeric_limits<float>::quiet_NaN(); },
          {"the scale is nan", "finite and positive"});
  refused(def, [](auto& s) { s.qparams.scale = std::numeric_limits<float>::infinity(); },
          {"the scale is inf"});
  refused(def, [](auto& s) { s.qparams.scale = 0.0f; }, {"the scale is 0;"});
  refused(def, [](auto& s) { s.qparams.scale = -0.25f; }, {"the scale is -0.25;"});
  refused(def, [](auto& s) { s.qparams.zero_point = 256; },
          {"the zero point 256 lies outside the codes [0, 255]"});
  refused(def, [](auto& s) { s.qparams.zero_point = -1; },
          {"the zero point -1 lies outside the codes [0, 255]"});
  refused(hc::qint8_symmetric_activations(), [](auto& s) { s.qparams.zero_point = 3; },
          {"the zero point is 3, but the symmetric scheme's is 0"});
  refused(def,
          [](auto& s) {
            s.range = {2.0f, 1.0f};
          },
          {"the observer's range [2, 1] is not finite with lo <= hi"});
  refused(def, [](auto& s) { s.range.hi = std::numeric_limits<float>::infinity(); },
          {"is not finite with lo <= hi"});
  refused(def, [](auto& s) { s.range.lo = std::numeric_limits<float>::quiet_NaN(); }, {"[nan, "});
  refused(def, [](auto& s) { s.observations = 0; },
          {"the observer has seen a batch but the observations count is 0"});
  refused(def,
          [](auto& s) {
            s.seen = false;
            s.observations = 3;
          },
          {"the observations count is 3 but the observer has seen no batch"});
  // the observers' own restore
  hc::minmax_observer mm;
  BOOST_TEST(message_of([&] {
               mm.restore(true, {2.0f, 1.0f});
             }).find("hone::compress::minmax_observer::restore: the range [") != std::string::npos);
  hc::moving_average_minmax_observer ma;
  BOOST_TEST(message_of([&] {
               ma.restore(true, {0.0f, std::numeric_limits<float>::quiet_NaN()});
             }).find("must be finite with lo <= hi") != std::string::npos);
  ma.restore(true, {-1.0f, 2.0f});
  BOOST_TEST(ma.seen());
  ma.restore(false, {5.0f, -5.0f});  // not seen: the range is ignored
  BOOST_TEST(!ma.seen());
  BOOST_TEST(ma.range().lo == 0.0f);
  mm.restore(true, {-1.0f, 2.0f});
  mm.observe(std::vector<float>{3.0f});
  BOOST_TEST(mm.range().lo == -1.0f);
  BOOST_TEST(mm.range().hi == 3.0f);
  mm.restore(false, {});
  mm.observe(std::vector<float>{3.0f});
  BOOST_TEST(mm.range().lo == 3.0f);  // started afresh
}

BOOST_AUTO_TEST_CASE(files_that_are_refused) {
  hone_test::temp_dir dir("compress_qat_ckpt_bad");
  const std::vector<step> steps = sequence(21);
  hc::activation_fake_quant trained,
      other(hc::quint8_affine_activations(hc::fake_quant_observer::minmax));
  for (std::size_t i = 0; i < 5; ++i) {
    run(trained, steps[i]);
    run(other, steps[i + 3]);
  }
  const std::vector<std::byte> good_bytes = file_bytes({{"fc1.act", trained}, {"fc2.act", other}});
  const raw_file good = raw_of(ck::tensor_file::view(good_bytes, "good.safetensors"));

  // restores into two quantizers from `r`; a refusal changes neither
  const auto refused = [&](const raw_file& r, std::initializer_list<const char*> parts,
                           hc::activation_fake_quant_options o1 = {}) {
    hc::activation_fake_quant q1(o1), q2(other.options());
    run(q1, steps[9]);
    run(q2, steps[10]);
    const auto s1 = q1.state(), s2 = q2.state();
    const std::vector<std::byte> bytes = r.bytes();
    std::string m;
    try {
      hc::read_fake_quants(ck::tensor_file::view(bytes, "bad.safetensors"),
                           {{"fc1.act", q1}, {"fc2.act", q2}});
    } catch (const hone::checkpoint_error& e) {
      m = e.what();
    }
    expect_contains(m, parts);
    expect_contains(m, {"hone: 'bad.safetensors': "});
    expect_same_state(q1.state(), s1);
    expect_same_state(q2.state(), s2);
  };
  {  // the good file restores both
    hc::activation_fake_quant q1, q2(other.options());
    hc::read_fake_quants(ck::tensor_file::view(good_bytes, "good.safetensors"),
                         {{"fc1.act", q1}, {"fc2.act", q2}});
    expect_same_state(q1.state(), trained.state());
    expect_same_state(q2.state(), other.state());
  }
  // missing tensors, each named (the second quantizer's: all or nothing)
  for (const char* key : {"fc1.act.scale", "fc1.act.zero_point", "fc2.act.fake_quant_enabled",
                          "fc2.act.observer_enabled", "fc2.act.activation_post_process.min_val",
                          "fc2.act.activation_post_process.max_val"}) {
    raw_file r = good;
    r.erase(key);
    const std::string want = "tensor '" + std::string(key) + "' is missing";
    refused(r, {want.c_str(),
                "while others of the quantizer are there; the file is damaged or "
                "not a FakeQuantize's state_dict."});
  }
  {  // a name that is not in the file
    hc::activation_fake_quant q;
    const std::string m = message_of([&] {
      hc::read_fake_quants(ck::tensor_file::view(good_bytes, "good.safetensors"), {{"fc3", q}});
    });
    expect_contains(m, {"fake quantizer 'fc3': tensor 'fc3.fake_quant_enabled' is missing; the "
                        "file holds no such quantizer (is it saved under another name?)."});
    const std::string m2 = message_of([&] {
      hc::read_fake_quants(ck::tensor_file::view(good_bytes, "good.safetensors"), {{"", q}});
    });
    expect_contains(m2,
                    {"the fake quantizer without prefix: tensor 'fake_quant_enabled' is missing"});
  }
  // wrong dtypes and shapes
  {
    raw_file r = good;
    r.set("fc1.act.scale", {1}, std::vector<double>{0.5});
    refused(r, {"tensor 'fc1.act.scale' is F64 of shape [1], but torch's FakeQuantize stores it "
                "as F32 of shape [1]."});
  }
  {
    raw_file r = good;
    r.set("fc1.act.zero_point", {1}, std::vector<std::int64_t>{3});
    refused(r, {"tensor 'fc1.act.zero_point' is I64 of shape [1]", "as I32 of shape [1]"});
  }
  {
    raw_file r = good;
    r.set("fc2.act.observer_enabled", {1}, std::vector<std::int8_t>{1});
    refused(r, {"tensor 'fc2.act.observer_enabled' is I8 of shape [1]", "as U8 of shape [1]"});
  }
  {
    raw_file r = good;
    r.set("fc1.act.activation_post_process.min_val", {1}, std::vector<float>{-1.0f});
    refused(r, {"tensor 'fc1.act.activation_post_process.min_val' is F32 of shape [1]",
                "as F32 of shape []"});
  }
  {
    raw_file r = good;
    r.set("fc1.act.scale", {}, std::vector<float>{0.5f});
    refused(r, {"tensor 'fc1.act.scale' is F32 of shape []", "as F32 of shape [1]"});
  }
  {
    raw_file r = good;
    r.set("fc1.act.activation_post_process.eps", {2}, std::vector<float>{1e-7f, 1e-7f});
    refused(r, {"tensor 'fc1.act.activation_post_process.eps' is F32 of shape [2]"});
  }
  // values
  {
    raw_file r = good;
    r.set("fc1.act.fake_quant_enabled", {1}, std::vector<std::uint8_t>{2});
    refused(r, {"tensor 'fc1.act.fake_quant_enabled' holds 2; a switch is 0 (off) or 1 (on)."});
  }
  {
    raw_file r = good;
    r.set("fc2.act.activation_post_process.eps", {1}, std::vector<float>{1e-5f});
    refused(
        r,
        {"fake quantizer 'fc2.act': tensor 'fc2.act.activation_post_process.eps' is 9.99999975e-06",
         "float32's epsilon 1.1920929e-07"});
  }
  {
    raw_file r = good;
    r.set("fc1.act.scale", {1}, std::vector<float>{std::numeric_limits<float>::quiet_NaN()});
    refused(r, {"fake quantizer 'fc1.act': the scale is nan; a quantizer's scale is finite and "
                "positive"});
  }
  {
    raw_file r = good;
    r.set("fc2.act.zero_point", {1}, std::vector<std::int32_t>{300});
    refused(r, {"fake quantizer 'fc2.act': the zero point 300 lies outside the codes [0, 255]"});
  }
  {
    raw_file r = good;
    r.set("fc1.act.activation_post_process.max_val", {}, std::vector<float>{-50.0f});
    refused(r, {"the observer's range [", ", -50] is not finite with lo <= hi"});
  }
  {  // min_val = +inf with a finite max_val: torch's "fresh" test fails, and the range is not one
    raw_file r = good;
    r.set("fc1.act.activation_post_process.min_val", {},
          std::vector<float>{std::numeric_limits<float>::infinity()});
    refused(r, {"the observer's range [inf, "});
  }
  // options that differ from the file's
  refused(good,
          {"fake quantizer 'fc1.act': the state was saved by a quantizer with "
           "moving-average min-max observer (averaging constant 0.00999999978), affine, "
           "codes [0, 255], but this one has min-max observer, affine, codes [0, 255]"},
          hc::quint8_affine_activations(hc::fake_quant_observer::minmax));
  refused(good,
          {"but this one has moving-average min-max observer (averaging constant 0.00999999978), "
           "symmetric, codes [-128, 127]"},
          hc::qint8_symmetric_activations());
  // hone's metadata
  {
    raw_file r = good;
    r.metadata["fc1.act.hone.observer"] = "histogram";
    refused(r, {"the metadata fc1.act.hone.observer is 'histogram'; it is "
                "'moving_average_minmax' or 'minmax'."});
  }
  {
    raw_file r = good;
    r.metadata.erase("fc2.act.hone.qscheme");
    refused(r, {"the metadata has fc2.act.hone.observations but no fc2.act.hone.qscheme; the "
                "file is damaged"});
  }
  {
    raw_file r = good;
    r.metadata["fc1.act.hone.observations"] = "-3";
    refused(r, {"the metadata fc1.act.hone.observations is '-3', not a count of batches."});
  }
  {
    raw_file r = good;
    r.metadata["fc1.act.hone.observations"] = "0";
    refused(r, {"the observer has seen a batch but the observations count is 0"});
  }
  {
    raw_file r = good;
    r.metadata["fc1.act.hone.quant_max"] = "12x";
    refused(r, {"the metadata fc1.act.hone.quant_max is '12x', not an integer."});
  }
  {
    raw_file r = good;
    r.metadata["fc1.act.hone.quant_min"] = "300";
    refused(r, {"the metadata's codes [300, 255] are not a code range"});
  }
  {
    raw_file r = good;
    r.metadata["fc1.act.hone.averaging_constant"] = "fast";
    refused(r, {"the metadata fc1.act.hone.averaging_constant is 'fast', not a number."});
  }
  {
    raw_file r = good;
    r.metadata["fc1.act.hone.qscheme"] = "per_channel_affine";
    refused(r, {"the metadata fc1.act.hone.qscheme is 'per_channel_affine'"});
  }
  // a name given twice
  {
    hc::activation_fake_quant q1, q2;
    std::string m;
    try {
      hc::read_fake_quants(ck::tensor_file::view(good_bytes, "good.safetensors"),
                           {{"fc1.act", q1}, {"fc1.act", q2}});
    } catch (const hone::config_error& e) {
      m = e.what();
    }
    expect_contains(m, {"hone::compress::read_fake_quants: two quantizers are named 'fc1.act'"});
    hc::fake_quant_tensors t;
    t.add("x", q1);
    expect_contains(message_of([&] { t.add("x", q2); }),
                    {"fake_quant_tensors::add: two quantizers are named 'x'"});
  }
  // a damaged file: the tensor file reader's checkpoint_error (truncated, then garbage)
  {
    std::vector<std::byte> cut(good_bytes.begin(), good_bytes.end() - 9);
    std::string m;
    try {
      (void)ck::tensor_file::view(cut, "cut.safetensors");
    } catch (const hone::checkpoint_error& e) {
      m = e.what();
    }
    expect_contains(m, {"hone: 'cut.safetensors': ", "truncated"});
    // the same through a checkpoint directory
    std::filesystem::create_directories(dir.path);
    {
      std::ofstream f(dir / std::string(hc::fake_quant_file), std::ios::binary);
      f.write(reinterpret_cast<const char*>(cut.data()), static_cast<std::streamsize>(cut.size()));
    }
    hc::activation_fake_quant q;
    const auto before = q.state();
    std::string m2;
    try {
      hc::restore_fake_quants(dir.path, {{"fc1.act", q}});
    } catch (const hone::checkpoint_error& e) {
      m2 = e.what();
    }
    expect_contains(m2, {"quantizers.safetensors", "truncated"});
    expect_same_state(q.state(), before);
    std::vector<std::byte> garbage(good_bytes.size(), std::byte{0x7b});
    std::string m3;
    try {
      (void)ck::tensor_file::view(garbage, "garbage.safetensors");
    } catch (const hone::checkpoint_error& e) {
      m3 = e.what();
    }
    expect_contains(m3, {"hone: 'garbage.safetensors': "});
  }
}
