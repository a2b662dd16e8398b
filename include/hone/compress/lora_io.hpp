// hone/compress/lora_io.hpp: LoRA adapters in PEFT's files, so that `peft` loads hone's adapters
// onto the matching PyTorch module (PeftModel.from_pretrained) and hone loads the adapters PEFT's
// save_pretrained wrote.
//
//   <dir>/adapter_model.safetensors   "base_model.model.<module path>.lora_A.weight" [r, in]
//                                     "base_model.model.<module path>.lora_B.weight" [out, r]
//                                     (F32 from hone; F16, BF16, F32 or F64 read), metadata
//                                     {"format": "pt"} as PEFT writes it
//   <dir>/adapter_config.json         LoraConfig: peft_type "LORA", r, lora_alpha, lora_dropout,
//                                     target_modules (the module paths), bias "none",
//                                     fan_in_fan_out false, use_rslora, use_dora false, ...
//
// Reading refuses, with a sentence, what hone does not implement instead of loading something
// that would compute other outputs than PEFT: DoRA, rank_pattern / alpha_pattern, bias other than
// "none", fan_in_fan_out, modules_to_save, lora_bias, layer_replication, target_parameters, and
// tensors other than lora_A/lora_B weights.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hone/checkpoint/safetensors.hpp"
#include "hone/compress/lora.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/json.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

inline constexpr std::string_view lora_weights_file = "adapter_model.safetensors";
inline constexpr std::string_view lora_config_file = "adapter_config.json";
/// The prefix PEFT's PeftModel gives every key of a plain module (PeftModel.base_model.model).
inline constexpr std::string_view peft_key_prefix = "base_model.model.";

/// What save_lora writes besides the adapters.
struct lora_save_options {
  /// PEFT's task_type ("CAUSAL_LM", ...), or empty for null (a plain module).
  std::string task_type;
  /// base_model_name_or_path, or empty for null.
  std::string base_model_name_or_path;
};

/// The fields of an adapter_config.json that hone uses.
struct lora_file_config {
  lora_options options;  // r, alpha (lora_alpha), dropout (lora_dropout), use_rslora
  std::vector<std::string> target_modules;  // as written (a string pattern becomes one entry)
  std::string task_type;                    // empty when null
};

namespace detail {

inline std::string lora_key(std::string_view module, std::string_view which) {
  return std::string(peft_key_prefix) + std::string(module) + "." + std::string(which) + ".weight";
}

[[noreturn]] inline void lora_fail(const std::filesystem::path& file, const std::string& what) {
  throw checkpoint_error("hone::compress: '" + file.string() + "': " + what);
}

inline bool lora_null_or_empty(const io::json::value* v) {
  return v == nullptr || v->is_null() || ((v->is_array() || v->is_object()) && v->size() == 0);
}

}  // namespace detail

/// Writes the adapters of `model` into directory `dir` (created if needed) as PEFT's
/// adapter_model.safetensors + adapter_config.json. Merged layers are saved too (the adapters are
/// unchanged by a merge).
inline void save_lora(const lora_model& model, const std::filesystem::path& dir,
                      const lora_save_options& options = {}) {
  std::filesystem::create_directories(dir);
  checkpoint::tensor_writer w;
  w.set_metadata("format", "pt");
  const lora_options& o = model.options();
  io::json::value targets = io::json::value::array();
  for (std::size_t i = 0; i < model.size(); ++i) {
    const linear_ref& l = model.layer(i);
    w.add(detail::lora_key(l.name, "lora_A"), {o.r, l.in_features}, model.lora_A(i));
    w.add(detail::lora_key(l.name, "lora_B"), {l.out_features, o.r}, model.lora_B(i));
    targets.push_back(l.name);
  }
  w.write(dir / lora_weights_file);

  const auto string_or_null = [](const std::string& s) {
    return s.empty() ? io::json::value() : io::json::value(s);
  };
  io::json::value c = io::json::value::object();
  c.set("alpha_pattern", io::json::value::object());
  c.set("base_model_name_or_path", string_or_null(options.base_model_name_or_path));
  c.set("bias", "none");
  c.set("fan_in_fan_out", false);
  c.set("inference_mode", true);
  c.set("init_lora_weights", true);
  c.set("layer_replication", nullptr);
  c.set("layers_pattern", nullptr);
  c.set("layers_to_transform", nullptr);
  c.set("lora_alpha", o.alpha);
  c.set("lora_bias", false);
  c.set("lora_dropout", o.dropout);
  c.set("modules_to_save", nullptr);
  c.set("peft_type", "LORA");
  c.set("r", o.r);
  c.set("rank_pattern", io::json::value::object());
  c.set("revision", nullptr);
  c.set("target_modules", std::move(targets));
  c.set("task_type", string_or_null(options.task_type));
  c.set("use_dora", false);
  c.set("use_rslora", o.use_rslora);
  io::write_file(dir / lora_config_file, c.dump(2) + "\n");
}

/// Reads and checks `dir`/adapter_config.json. checkpoint_error naming the file and the field for
/// anything missing, malformed, or a PEFT feature hone does not implement.
[[nodiscard]] inline lora_file_config read_lora_config(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / lora_config_file;
  const std::string text = io::read_small_file(file, std::uint64_t{16} << 20);
  io::json::value root;
  try {
    root = io::json::parse(text, file.string());
  } catch (const error& e) {
    detail::lora_fail(file, std::string("not valid JSON: ") + e.what());
  }
  if (!root.is_object()) detail::lora_fail(file, "the top level is not a JSON object");
  const auto field = [&](std::string_view key) -> const io::json::value& {
    const io::json::value* v = root.find(key);
    if (v == nullptr) {
      detail::lora_fail(file, "has no \"" + std::string(key) + "\"; it is not a PEFT LoRA config");
    }
    return *v;
  };
  const auto refuse_if = [&](bool cond, const std::string& what) {
    if (cond) detail::lora_fail(file, what + "; hone's LoRA does not implement it");
  };
  lora_file_config cfg;
  const io::json::value& type = field("peft_type");
  if (!type.is_string() || type.as_string() != "LORA") {
    detail::lora_fail(file, "peft_type is " + (type.is_string() ? type.as_string() : type.dump()) +
                                ", not \"LORA\"; hone reads LoRA adapters only");
  }
  const io::json::value& r = field("r");
  std::uint64_t rank = 0;
  try {
    rank = r.as_u64();
  } catch (const error&) {
    detail::lora_fail(file, "r is " + r.dump() + ", not a positive integer");
  }
  if (rank == 0) detail::lora_fail(file, "r is 0; a LoRA rank is at least 1");
  cfg.options.r = static_cast<std::size_t>(rank);
  const io::json::value& alpha = field("lora_alpha");
  if (!alpha.is_number())
    detail::lora_fail(file, "lora_alpha is " + alpha.dump() + ", not a number");
  cfg.options.alpha = alpha.as_float();
  if (const io::json::value* d = root.find("lora_dropout"); d != nullptr && !d->is_null()) {
    if (!d->is_number()) detail::lora_fail(file, "lora_dropout is " + d->dump() + ", not a number");
    cfg.options.dropout = d->as_float();
    if (!(cfg.options.dropout >= 0.0f && cfg.options.dropout < 1.0f)) {
      detail::lora_fail(file, "lora_dropout " + d->dump() + " is outside [0, 1)");
    }
  }
  if (const io::json::value* v = root.find("use_rslora"); v != nullptr && !v->is_null()) {
    if (!v->is_bool()) detail::lora_fail(file, "use_rslora is not true or false");
    cfg.options.use_rslora = v->as_bool();
  }
  if (const io::json::value* v = root.find("target_modules"); v != nullptr) {
    if (v->is_string()) {
      cfg.target_modules.push_back(v->as_string());
    } else if (v->is_array()) {
      for (const auto& t : v->as_array()) {
        if (!t.is_string()) detail::lora_fail(file, "target_modules holds a non-string entry");
        cfg.target_modules.push_back(t.as_string());
      }
    }
  }
  if (const io::json::value* v = root.find("task_type"); v != nullptr && v->is_string()) {
    cfg.task_type = v->as_string();
  }
  const io::json::value* bias = root.find("bias");
  refuse_if(bias != nullptr && !(bias->is_string() && bias->as_string() == "none"),
            "bias is " + (bias ? bias->dump() : std::string()) + " (trained biases)");
  const auto is_true = [&](std::string_view key) {
    const io::json::value* v = root.find(key);
    return v != nullptr && v->is_bool() && v->as_bool();
  };
  refuse_if(is_true("use_dora"), "use_dora is true (DoRA)");
  refuse_if(is_true("fan_in_fan_out"), "fan_in_fan_out is true (Conv1D-style [in, out] weights)");
  refuse_if(is_true("lora_bias"), "lora_bias is true (a bias on lora_B)");
  for (const std::string_view key : {"rank_pattern", "alpha_pattern", "modules_to_save",
                                     "layer_replication", "target_parameters"}) {
    if (const io::json::value* v = root.find(key); !detail::lora_null_or_empty(v)) {
      refuse_if(true, std::string(key) + " is set (" + v->dump() + ")");
    }
  }
  return cfg;
}

/// Loads the adapters of `dir` into `model`: every layer of the model must have its lora_A and
/// lora_B there with matching shapes, and the file may hold no other tensors. alpha, dropout and
/// use_rslora are taken from the config; its r must be the model's. Tensors stored as F16, BF16 or
/// F64 are converted to float. checkpoint_error naming the file and the tensor otherwise.
inline void load_lora(lora_model& model, const std::filesystem::path& dir) {
  const lora_file_config cfg = read_lora_config(dir);
  const std::filesystem::path file = dir / lora_weights_file;
  if (cfg.options.r != model.rank()) {
    detail::lora_fail(dir / lora_config_file,
                      "r is " + std::to_string(cfg.options.r) + " but the model's rank is " +
                          std::to_string(model.rank()) +
                          "; build the model with lora_model_from_pretrained or the same r");
  }
  HONE_REQUIRE(!model.any_merged(),
               "hone::compress::load_lora: some layers of the model are "
               "merged; unmerge() before loading other adapters");
  const auto st = checkpoint::safetensors_file::open(file);
  // Everything is checked before the first adapter is overwritten: a refused file leaves the
  // model as it was.
  struct pending {
    const checkpoint::tensor_info* tensor;
    std::span<float> destination;
  };
  std::vector<pending> reads;
  std::set<std::string, std::less<>> expected;
  for (std::size_t i = 0; i < model.size(); ++i) {
    const linear_ref& l = model.layer(i);
    const std::pair<std::string_view, checkpoint::shape_type> parts[] = {
        {"lora_A", {model.rank(), l.in_features}}, {"lora_B", {l.out_features, model.rank()}}};
    for (const auto& [which, shape] : parts) {
      const std::string key = detail::lora_key(l.name, which);
      expected.insert(key);
      const checkpoint::tensor_info* t = st.find(key);
      if (t == nullptr) {
        detail::lora_fail(file, "has no tensor '" + key + "' for layer '" + l.name +
                                    "'; the adapters were trained for other modules (or another "
                                    "module path)");
      }
      if (t->shape != shape) {
        detail::lora_fail(file, "tensor '" + key + "' has shape " +
                                    checkpoint::shape_string(t->shape) + ", but layer '" + l.name +
                                    "' needs " + checkpoint::shape_string(shape));
      }
      if (!io::can_convert(t->type, io::dtype::f32)) {
        detail::lora_fail(file, "tensor '" + key + "' is " + std::string(io::dtype_name(t->type)) +
                                    "; LoRA weights must be F16, BF16, F32 or F64");
      }
      reads.push_back({t, which == "lora_A" ? model.lora_A(i) : model.lora_B(i)});
    }
  }
  for (const auto& t : st.tensors()) {
    if (!expected.contains(t.name)) {
      detail::lora_fail(file, "has the tensor '" + t.name +
                                  "', which no layer of the model takes (hone loads lora_A and "
                                  "lora_B weights of the model's layers only)");
    }
  }
  for (const pending& p : reads) {
    st.read(*p.tensor, std::as_writable_bytes(p.destination), io::dtype::f32);
  }
  lora_options o = model.options();
  o.alpha = cfg.options.alpha;
  o.dropout = cfg.options.dropout;
  o.use_rslora = cfg.options.use_rslora;
  model.set_options(o);
}

/// Builds a lora_model over `layers` with the options of `dir`'s config (the dropout stream seeded
/// with `seed`) and loads its adapters.
[[nodiscard]] inline lora_model lora_model_from_pretrained(std::vector<linear_ref> layers,
                                                           const std::filesystem::path& dir,
                                                           std::uint64_t seed = 0) {
  lora_options o = read_lora_config(dir).options;
  o.seed = seed;
  lora_model m(std::move(layers), o);
  load_lora(m, dir);
  return m;
}

}  // namespace compress
HONE_NAMESPACE_END
