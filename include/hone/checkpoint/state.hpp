// hone/checkpoint/state.hpp: state.json, everything besides tensors that a resumed run needs to
// continue exactly where the saved one stopped: the step, the loss scaler, the schedule position,
// every random generator, the data position, and the user's own metadata (resume is not bitwise
// identical when RNG or data position are missing: tt-metal #47949, transformers #17032).
//
//   {
//     "format": "hone-state",
//     "version": 1,
//     "step": 1200,
//     "loss_scale": {"scale": 32768, "growth_tracker": 17, "hysteresis_tracker": 1,
//                    "skipped_steps": 3},
//     "schedule": {...},
//     "rng": {"dropout": "<engine state>", ...},
//     "data": {...},
//     "metadata": {"run": "abc", ...},
//     "early_stopping": {...}
//   }
//
// "format", "version" and "step" are required; "loss_scale" is absent or null without a scaler;
// "schedule" and "data" are free JSON objects owned by the schedule and the data loader; "rng" and
// "metadata" map names to strings; "early_stopping" (optional) is an object written by
// trainer_checkpoint.hpp's capture_early_stopping(). Numbers round-trip exactly (the scale is
// written in the shortest form that reads back as the same float). Unknown top-level fields are
// refused: a state this hone does not fully understand is not silently half-restored.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <locale>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "hone/checkpoint/file_io.hpp"
#include "hone/checkpoint/json.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/error.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/json.hpp"
#include "hone/precision/loss_scale.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// The "format" field of state.json.
inline constexpr std::string_view state_format = "hone-state";
/// The version this header writes and reads.
inline constexpr std::uint64_t state_version = 1;
/// The largest state.json a reader accepts.
inline constexpr std::uint64_t max_state_bytes = std::uint64_t{64} << 20;

/// The non-tensor state of a training run.
struct training_state {
  std::uint64_t step = 0;                                // optimizer steps completed
  std::optional<loss_scale_state> loss_scale;            // the scaler's state, if there is a scaler
  io::json::value schedule = io::json::value::object();  // schedule position (free object)
  std::map<std::string, std::string, std::less<>> rng;   // every RNG: name -> engine state text
  io::json::value data = io::json::value::object();      // data position (free object)
  std::map<std::string, std::string, std::less<>> metadata;  // user metadata
  io::json::value early_stopping;  // null, or the early-stopping state (capture_early_stopping)

  friend bool operator==(const training_state&, const training_state&) = default;
};

/// The text form of a standard random engine's state (operator<<), for training_state::rng.
template <class Engine>
[[nodiscard]] std::string rng_state(const Engine& engine) {
  std::ostringstream out;
  out.imbue(std::locale::classic());
  out << engine;
  return out.str();
}

/// Restores `engine` from rng_state()'s text; checkpoint_error naming `what` if the text is not a
/// state of this engine type (the engine is unchanged then).
template <class Engine>
void restore_rng(Engine& engine, std::string_view text, std::string_view what) {
  std::istringstream in{std::string(text)};
  in.imbue(std::locale::classic());
  Engine restored;
  in >> restored;
  if (in.fail()) {
    throw checkpoint_error("hone: the state of random engine '" + std::string(what) +
                           "' does not parse as a state of this engine type");
  }
  in >> std::ws;
  if (!in.eof()) {
    throw checkpoint_error("hone: the state of random engine '" + std::string(what) +
                           "' has extra text after it; it belongs to another engine type");
  }
  engine = restored;
}

/// state.json text for `s` (pretty-printed, ends with a newline).
[[nodiscard]] inline std::string to_json(const training_state& s) {
  io::json::value root = io::json::value::object();
  root.set("format", io::json::value(state_format));
  root.set("version", state_version);
  root.set("step", s.step);
  if (s.loss_scale) {
    HONE_REQUIRE(std::isfinite(s.loss_scale->scale) && s.loss_scale->scale > 0.0f,
                 "hone::checkpoint::to_json: the loss scale must be finite and positive");
    io::json::value ls = io::json::value::object();
    ls.set("scale", s.loss_scale->scale);
    ls.set("growth_tracker", s.loss_scale->growth_tracker);
    ls.set("hysteresis_tracker", s.loss_scale->hysteresis_tracker);
    ls.set("skipped_steps", s.loss_scale->skipped_steps);
    root.set("loss_scale", std::move(ls));
  }
  HONE_REQUIRE(
      s.schedule.is_object() && s.data.is_object(),
      "hone::checkpoint::to_json: training_state::schedule and ::data must be JSON objects");
  root.set("schedule", s.schedule);
  io::json::value rng = io::json::value::object();
  for (const auto& [k, v] : s.rng) rng.set(k, io::json::value(v));
  root.set("rng", std::move(rng));
  root.set("data", s.data);
  io::json::value meta = io::json::value::object();
  for (const auto& [k, v] : s.metadata) meta.set(k, io::json::value(v));
  root.set("metadata", std::move(meta));
  if (!s.early_stopping.is_null()) {
    HONE_REQUIRE(
        s.early_stopping.is_object(),
        "hone::checkpoint::to_json: training_state::early_stopping must be null or an object");
    root.set("early_stopping", s.early_stopping);
  }
  std::string out = root.dump(2);
  out += '\n';
  return out;
}

namespace detail {
[[noreturn]] inline void state_fail(std::string_view context, const std::string& what) {
  throw checkpoint_error("hone: '" + std::string(context) + "': " + what);
}

template <class F>
auto state_field(std::string_view context, std::string_view field, F&& get) -> decltype(get()) {
  try {
    return get();
  } catch (const checkpoint_error& e) {
    state_fail(context, "field \"" + std::string(field) + "\": " + e.what());
  }
}

inline std::int32_t state_i32(const io::json::value& v, std::string_view context,
                              std::string_view field) {
  const std::int64_t x = state_field(context, field, [&] { return v.as_i64(); });
  if (x < std::numeric_limits<std::int32_t>::min() ||
      x > std::numeric_limits<std::int32_t>::max()) {
    state_fail(context, "field \"" + std::string(field) + "\" is out of the 32-bit range");
  }
  return static_cast<std::int32_t>(x);
}

inline std::map<std::string, std::string, std::less<>> string_map(const io::json::value& v,
                                                                  std::string_view context,
                                                                  std::string_view field) {
  if (!v.is_object()) state_fail(context, "field \"" + std::string(field) + "\" must be an object");
  std::map<std::string, std::string, std::less<>> out;
  for (const auto& [k, x] : v.as_object()) {
    if (!x.is_string()) {
      state_fail(context, "field \"" + std::string(field) + "\": entry '" + io::escaped(k, 200) +
                              "' is " + std::string(io::json::kind_name(x.type())) +
                              ", not a string");
    }
    out.emplace(k, x.as_string());
  }
  return out;
}
}  // namespace detail

/// Parses state.json text; `context` (the path) starts every error message.
[[nodiscard]] inline training_state parse_state(std::string_view text, std::string_view context) {
  using detail::state_fail;
  using detail::state_field;
  const io::json::value root = io::json::parse(text, context);
  if (!root.is_object()) state_fail(context, "state.json must hold a JSON object");
  for (const auto& [k, v] : root.as_object()) {
    (void)v;
    if (k != "format" && k != "version" && k != "step" && k != "loss_scale" && k != "schedule" &&
        k != "rng" && k != "data" && k != "metadata" && k != "early_stopping") {
      state_fail(context,
                 "unknown field \"" + io::escaped(k, 200) + "\" (written by a newer hone?)");
    }
  }
  const io::json::value* format = root.find("format");
  if (format == nullptr || !format->is_string() || format->as_string() != state_format) {
    state_fail(context, "not a hone state file (\"format\" must be \"hone-state\")");
  }
  const io::json::value* version = root.find("version");
  if (version == nullptr) state_fail(context, "missing field \"version\"");
  const std::uint64_t ver = state_field(context, "version", [&] { return version->as_u64(); });
  if (ver != state_version) {
    state_fail(context, "state format version " + std::to_string(ver) + "; this hone reads " +
                            std::to_string(state_version));
  }
  training_state s;
  const io::json::value* step = root.find("step");
  if (step == nullptr) state_fail(context, "missing field \"step\"");
  s.step = state_field(context, "step", [&] { return step->as_u64(); });

  if (const io::json::value* ls = root.find("loss_scale"); ls != nullptr && !ls->is_null()) {
    if (!ls->is_object()) state_fail(context, "field \"loss_scale\" must be an object or null");
    for (const auto& [k, v] : ls->as_object()) {
      (void)v;
      if (k != "scale" && k != "growth_tracker" && k != "hysteresis_tracker" &&
          k != "skipped_steps") {
        state_fail(context, "unknown field \"loss_scale." + io::escaped(k, 200) + "\"");
      }
    }
    loss_scale_state l;
    l.scale = state_field(context, "loss_scale.scale", [&] { return ls->at("scale").as_float(); });
    if (!std::isfinite(l.scale) || !(l.scale > 0.0f)) {
      state_fail(context, "field \"loss_scale.scale\" must be finite and positive");
    }
    l.growth_tracker = detail::state_i32(
        state_field(context, "loss_scale",
                    [&]() -> const io::json::value& { return ls->at("growth_tracker"); }),
        context, "loss_scale.growth_tracker");
    l.hysteresis_tracker = detail::state_i32(
        state_field(context, "loss_scale",
                    [&]() -> const io::json::value& { return ls->at("hysteresis_tracker"); }),
        context, "loss_scale.hysteresis_tracker");
    l.skipped_steps = state_field(context, "loss_scale.skipped_steps",
                                  [&] { return ls->at("skipped_steps").as_u64(); });
    s.loss_scale = l;
  }
  if (const io::json::value* v = root.find("schedule")) {
    if (!v->is_object()) state_fail(context, "field \"schedule\" must be an object");
    s.schedule = *v;
  }
  if (const io::json::value* v = root.find("data")) {
    if (!v->is_object()) state_fail(context, "field \"data\" must be an object");
    s.data = *v;
  }
  if (const io::json::value* v = root.find("rng")) s.rng = detail::string_map(*v, context, "rng");
  if (const io::json::value* v = root.find("metadata")) {
    s.metadata = detail::string_map(*v, context, "metadata");
  }
  if (const io::json::value* v = root.find("early_stopping"); v != nullptr && !v->is_null()) {
    if (!v->is_object()) state_fail(context, "field \"early_stopping\" must be an object or null");
    s.early_stopping = *v;
  }
  return s;
}

/// Reads and parses the state.json file at `path`.
[[nodiscard]] inline training_state read_state(const std::filesystem::path& path) {
  return parse_state(io::read_small_file(path, max_state_bytes), path.string());
}

/// Writes state.json at `path` (fsynced when `sync`); returns its size and XXH3-128.
inline io::file_digest write_state(const std::filesystem::path& path, const training_state& s,
                                   bool sync = true) {
  return io::write_file(path, to_json(s), sync);
}

}  // namespace checkpoint
HONE_NAMESPACE_END
