// LoRA adapters in PEFT's files: the tensor names, shapes, dtype and metadata of
// adapter_model.safetensors and the fields of adapter_config.json as peft 0.21's save_pretrained
// writes them (read back with hone's safetensors reader and JSON parser); the round trip; dtype
// conversion on load; and a sentence for every file hone refuses. The files of peft itself are
// tested by peft_interop.py.
#define BOOST_TEST_MODULE hone_lora_io
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <hone/compress/lora_io.hpp>
#include <random>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"

namespace hc = hone::compress;
namespace json = hone::io::json;

namespace {

std::vector<float> random_vector(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.5f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// Two layers of a user's model, fc1 [5, 6] with bias and block.proj [4, 5] without.
struct two_layers {
  std::vector<float> w1 = random_vector(30, 1), b1 = random_vector(5, 2), w2 = random_vector(20, 3);
  std::vector<hc::linear_ref> refs() {
    return {{"fc1", w1, b1, 5, 6}, {"block.proj", w2, {}, 4, 5}};
  }
};

hc::lora_model trained(two_layers& t, hc::lora_options o) {
  hc::lora_model m(t.refs(), o);
  for (std::size_t i = 0; i < m.size(); ++i) {
    const auto b = random_vector(m.lora_B(i).size(), 10 + unsigned(i));
    std::copy(b.begin(), b.end(), m.lora_B(i).begin());
  }
  return m;
}

json::value read_json(const std::filesystem::path& p) {
  return json::parse(hone::io::read_small_file(p, 1 << 20), p.string());
}

template <class F>
void refused_with(F&& f, const std::string& text) {
  try {
    f();
  } catch (const hone::error& e) {
    BOOST_TEST_INFO(e.what());
    BOOST_TEST(std::string(e.what()).find(text) != std::string::npos);
    return;
  }
  BOOST_FAIL("not refused: expected a message with '" + text + "'");
}

}  // namespace

BOOST_AUTO_TEST_CASE(saved_files_have_peft_names_and_fields) {
  hone_test::temp_dir dir("lora-io");
  two_layers t;
  const auto m = trained(t, {.r = 2, .alpha = 4, .dropout = 0.1f, .seed = 3});
  hc::save_lora(m, dir.path, {.task_type = "", .base_model_name_or_path = "my-net"});

  const auto st = hone::checkpoint::safetensors_file::open(dir / "adapter_model.safetensors");
  BOOST_TEST(st.tensors().size() == 4u);
  BOOST_TEST(st.metadata().at("format") == "pt");
  const struct {
    const char* key;
    std::vector<std::uint64_t> shape;
    std::span<const float> data;
  } want[] = {{"base_model.model.fc1.lora_A.weight", {2, 6}, m.lora_A(0)},
              {"base_model.model.fc1.lora_B.weight", {5, 2}, m.lora_B(0)},
              {"base_model.model.block.proj.lora_A.weight", {2, 5}, m.lora_A(1)},
              {"base_model.model.block.proj.lora_B.weight", {4, 2}, m.lora_B(1)}};
  for (const auto& w : want) {
    const auto* info = st.find(w.key);
    BOOST_REQUIRE_MESSAGE(info != nullptr, w.key);
    BOOST_TEST((info->type == hone::io::dtype::f32));
    BOOST_TEST((info->shape == w.shape));
    const auto bytes = st.data(*info);
    BOOST_TEST(std::memcmp(bytes.data(), w.data.data(), w.data.size_bytes()) == 0);
  }

  const json::value c = read_json(dir / "adapter_config.json");
  BOOST_TEST(c.at("peft_type").as_string() == "LORA");
  BOOST_TEST(c.at("r").as_u64() == 2u);
  BOOST_TEST(c.at("lora_alpha").as_double() == 4.0);
  BOOST_TEST(c.at("lora_dropout").as_float() == 0.1f);
  BOOST_TEST(c.at("bias").as_string() == "none");
  BOOST_TEST(c.at("fan_in_fan_out").as_bool() == false);
  BOOST_TEST(c.at("use_rslora").as_bool() == false);
  BOOST_TEST(c.at("use_dora").as_bool() == false);
  BOOST_TEST(c.at("task_type").is_null());
  BOOST_TEST(c.at("modules_to_save").is_null());
  BOOST_TEST(c.at("base_model_name_or_path").as_string() == "my-net");
  BOOST_TEST(c.at("rank_pattern").is_object());
  BOOST_TEST(c.at("rank_pattern").size() == 0u);
  const auto& targets = c.at("target_modules").as_array();
  BOOST_REQUIRE_EQUAL(targets.size(), 2u);
  BOOST_TEST(targets[0].as_string() == "fc1");
  BOOST_TEST(targets[1].as_string() == "block.proj");
}

BOOST_AUTO_TEST_CASE(load_round_trips_bit_for_bit_and_takes_the_config) {
  hone_test::temp_dir dir("lora-io");
  two_layers t;
  const auto saved =
      trained(t, {.r = 3, .alpha = 5.5f, .dropout = 0.2f, .use_rslora = true, .seed = 4});
  hc::save_lora(saved, dir.path, {.task_type = "CAUSAL_LM", .base_model_name_or_path = ""});
  const json::value written = read_json(dir / "adapter_config.json");
  BOOST_TEST(written.at("task_type").as_string() == "CAUSAL_LM");

  hc::lora_model other(t.refs(), {.r = 3, .alpha = 1, .seed = 99});
  hc::load_lora(other, dir.path);
  for (std::size_t i = 0; i < 2; ++i) {
    BOOST_TEST(same_bits(other.lora_A(i), saved.lora_A(i)));
    BOOST_TEST(same_bits(other.lora_B(i), saved.lora_B(i)));
  }
  BOOST_TEST(other.options().alpha == 5.5f);
  BOOST_TEST(other.options().dropout == 0.2f);
  BOOST_TEST(other.options().use_rslora);
  BOOST_TEST(other.scaling() == saved.scaling());

  const auto cfg = hc::read_lora_config(dir.path);
  BOOST_TEST(cfg.options.r == 3u);
  BOOST_TEST(cfg.task_type == "CAUSAL_LM");
  BOOST_TEST(cfg.target_modules.size() == 2u);

  auto fresh = hc::lora_model_from_pretrained(t.refs(), dir.path);
  BOOST_TEST(fresh.rank() == 3u);
  BOOST_TEST(same_bits(fresh.lora_B(1), saved.lora_B(1)));
}

BOOST_AUTO_TEST_CASE(half_precision_files_are_converted_on_load) {
  hone_test::temp_dir dir("lora-io");
  two_layers t;
  const auto m = trained(t, {.r = 2, .alpha = 2});
  hc::save_lora(m, dir.path);
  // Rewrite the tensors as BF16, as a model saved in bfloat16 by peft would be.
  hone::checkpoint::tensor_writer w;
  w.add("base_model.model.fc1.lora_A.weight", {2, 6}, m.lora_A(0), hone::io::dtype::bf16);
  w.add("base_model.model.fc1.lora_B.weight", {5, 2}, m.lora_B(0), hone::io::dtype::bf16);
  w.add("base_model.model.block.proj.lora_A.weight", {2, 5}, m.lora_A(1), hone::io::dtype::bf16);
  w.add("base_model.model.block.proj.lora_B.weight", {4, 2}, m.lora_B(1), hone::io::dtype::bf16);
  w.write(dir / "adapter_model.safetensors");
  hc::lora_model loaded(t.refs(), {.r = 2, .alpha = 2, .seed = 8});
  hc::load_lora(loaded, dir.path);
  for (std::size_t i = 0; i < 2; ++i) {
    for (std::size_t k = 0; k < m.lora_A(i).size(); ++k) {
      const float want = float(hone::bfloat16(m.lora_A(i)[k]));
      BOOST_REQUIRE(loaded.lora_A(i)[k] == want);
    }
    for (std::size_t k = 0; k < m.lora_B(i).size(); ++k) {
      BOOST_REQUIRE(loaded.lora_B(i)[k] == float(hone::bfloat16(m.lora_B(i)[k])));
    }
  }
}

BOOST_AUTO_TEST_CASE(unsupported_or_mismatched_files_are_refused_with_a_sentence) {
  hone_test::temp_dir dir("lora-io");
  two_layers t;
  const auto m = trained(t, {.r = 2, .alpha = 2});
  hc::save_lora(m, dir.path);
  const auto config = dir / "adapter_config.json";
  const json::value original = read_json(config);
  const auto with = [&](const std::string& key, json::value v) {
    json::value c = original;
    c.set(key, std::move(v));
    hone::io::write_file(config, c.dump(2));
  };
  hc::lora_model target(t.refs(), {.r = 2, .alpha = 2});
  const auto load = [&] { hc::load_lora(target, dir.path); };

  with("peft_type", "IA3");
  refused_with(load, "peft_type is IA3, not \"LORA\"");
  with("use_dora", true);
  refused_with(load, "use_dora is true (DoRA); hone's LoRA does not implement it");
  with("bias", "all");
  refused_with(load, "bias is \"all\"");
  with("fan_in_fan_out", true);
  refused_with(load, "fan_in_fan_out is true");
  json::value pattern = json::value::object();
  pattern.set("fc1", 4);
  with("rank_pattern", pattern);
  refused_with(load, "rank_pattern is set");
  json::value keep = json::value::array();
  keep.push_back("classifier");
  with("modules_to_save", keep);
  refused_with(load, "modules_to_save is set");
  with("r", 4);
  refused_with(load, "r is 4 but the model's rank is 2");
  with("r", 0);
  refused_with(load, "r is 0");
  with("lora_dropout", 1.5);
  refused_with(load, "lora_dropout 1.5 is outside [0, 1)");
  hone::io::write_file(config, std::string("{\"peft_type\": \"LORA\", \"r\": 2"));
  refused_with(load, "adapter_config.json': not valid JSON");
  hone::io::write_file(config, original.dump(2));
  load();  // the original loads

  // A model whose layers the file does not cover, or covers with other shapes.
  std::vector<float> w3(30);
  hc::lora_model renamed({{"fc1", t.w1, t.b1, 5, 6}, {"head", w3, {}, 5, 6}}, {.r = 2});
  refused_with([&] { hc::load_lora(renamed, dir.path); },
               "has no tensor 'base_model.model.head.lora_A.weight' for layer 'head'");
  std::vector<float> w4(24);
  hc::lora_model reshaped({{"fc1", t.w1, t.b1, 5, 6}, {"block.proj", w4, {}, 4, 6}}, {.r = 2});
  refused_with([&] { hc::load_lora(reshaped, dir.path); },
               "tensor 'base_model.model.block.proj.lora_A.weight' has shape [2, 5], but layer "
               "'block.proj' needs [2, 6]");
  hc::lora_model fewer({{"fc1", t.w1, t.b1, 5, 6}}, {.r = 2, .seed = 17});
  const std::vector<float> fewer_a(fewer.lora_A(0).begin(), fewer.lora_A(0).end());
  refused_with([&] { hc::load_lora(fewer, dir.path); },
               "has the tensor 'base_model.model.block.proj.lora_A.weight', which no layer of the "
               "model takes");
  // A refused file leaves the model's adapters as they were (fc1's tensors were fine).
  BOOST_TEST(same_bits(fewer.lora_A(0), fewer_a));
  target.merge();
  refused_with(load, "unmerge() before loading");
  target.unmerge();
  std::filesystem::remove(dir / "adapter_model.safetensors");
  refused_with(load, "adapter_model.safetensors");
}
