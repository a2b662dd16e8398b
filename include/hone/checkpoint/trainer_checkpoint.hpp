// hone/checkpoint/trainer_checkpoint.hpp: saving and restoring a hone::trainer.
//
//   ck::training_state extra;                       // what only the caller knows
//   extra.rng["data"] = ck::rng_state(data_rng);
//   extra.data = ...;                               // e.g. {"epoch": 2, "cursor": 4096}
//   writer.save(step, [&](ck::snapshot& s) { ck::capture(t, s, extra); });
//   ...
//   auto c = ck::newest_valid("ckpt");              // falls back past damaged ones
//   ck::training_state st = ck::restore(t, c->path); // weights, moments, step, scaler
//   ck::restore_rng(data_rng, st.rng.at("data"), "data");
//
// content_policy::full saves the fp32 master weights as F32 (unless trainer_save_options::
// export_weights with weights_dtype says otherwise), the optimizer state (optimizer.safetensors,
// one tensor per state arena and parameter: "exp_avg.fc1.weight") and state.json with the step, the
// loss scaler's state and the schedule position ({"step": N}: hone's schedules are functions of the
// step). With F32 weights, restore() followed by the same steps is bitwise identical to never
// stopping (CPU). content_policy::weights_only saves the weights in the model's working dtype (or
// weights_dtype) and state.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "hone/checkpoint/dtype.hpp"
#include "hone/checkpoint/state.hpp"
#include "hone/checkpoint/tensor_file.hpp"
#include "hone/checkpoint/verify.hpp"
#include "hone/checkpoint/writer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/model.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// How capture() saves a trainer.
struct trainer_save_options {
  content_policy content = content_policy::full;
  const shape_map* shapes = nullptr;  // tensor shapes by parameter name (default: 1-D)
  // The weights' stored dtype when `export_weights`; otherwise F32 (full: the fp32 master
  // weights, what bitwise resume needs) or the model's working dtype (weights_only).
  bool export_weights = false;
  dtype weights_dtype = dtype::f32;
};

/// The shapes of a model's parameters by name, for trainer_save_options::shapes.
template <class Model>
[[nodiscard]] shape_map parameter_shapes(Model& model) {
  shape_map out;
  for (auto&& p : model_traits<Model>::parameters(model)) {
    out.insert_or_assign(std::string(p.name),
                         shape_type(std::ranges::begin(p.shape), std::ranges::end(p.shape)));
  }
  return out;
}

namespace detail {
inline shape_type shape_of(const trainer_save_options& o, std::string_view name,
                           std::uint64_t count) {
  if (o.shapes != nullptr) {
    if (const auto it = o.shapes->find(name); it != o.shapes->end()) return it->second;
  }
  return shape_type{count};
}
}  // namespace detail

/// Copies a trainer's state into `s`: weights (and, for content_policy::full, optimizer state),
/// plus state.json from `extra` (its rng, data and metadata are kept; step, loss_scale and
/// schedule are the trainer's).
template <class Trainer>
void capture(Trainer& t, snapshot& s, const training_state& extra = {},
             const trainer_save_options& o = {}) {
  using working = typename Trainer::working_type;
  const bool full = o.content == content_policy::full;
  const dtype wdt = o.export_weights ? o.weights_dtype : full ? dtype::f32 : dtype_of<working>;
  const std::span<const float> master = t.master_weights();
  const auto& layout = t.layout();
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const auto& slot = layout[i];
    s.add(files::weights, slot.name, detail::shape_of(o, slot.name, slot.count),
          master.subspan(slot.offset, slot.count), wdt);
  }
  s.set_metadata(files::weights, "format", "pt");
  if (full) {
    t.optimizer_state().for_each_tensor([&](std::string_view name, const auto& a) {
      for (std::size_t i = 0; i < a.size(); ++i) {
        const auto& slot = a.layout()[i];
        s.add(files::optimizer, std::string(name) + "." + slot.name,
              detail::shape_of(o, slot.name, slot.count), a.view(i));
      }
    });
  }
  s.state.rng = extra.rng;
  s.state.data = extra.data;
  s.state.metadata = extra.metadata;
  s.state.step = t.steps_done();
  s.state.loss_scale = t.scaler().state();
  json::value sched = json::value::object();
  sched.set("step", t.steps_done());
  s.state.schedule = std::move(sched);
}

/// Restores a trainer from the checkpoint directory `dir` (verified first: a damaged checkpoint
/// is refused with checkpoint_error): master weights (published into the model's working
/// weights), optimizer state when the checkpoint has it, the step and the scaler. Returns the
/// state, whose rng, data and metadata the caller restores.
template <class Trainer>
training_state restore(Trainer& t, const std::filesystem::path& dir, bool verify = true) {
  if (verify) verify_directory(dir, true).require_ok(dir.string());
  const training_state st = read_state(dir / files::state);
  const auto open_tensors = [&](std::string_view plain,
                                std::string_view packed) -> std::optional<tensor_file> {
    if (std::filesystem::exists(dir / plain)) return tensor_file::open(dir / plain);
    if (std::filesystem::exists(dir / packed)) return tensor_file::open(dir / packed);
    return std::nullopt;
  };
  const auto weights = open_tensors(files::weights, files::weights_compressed);
  if (!weights) {
    throw checkpoint_error("hone: checkpoint '" + dir.string() + "' has no " +
                           std::string(files::weights));
  }
  const std::span<float> master = t.master_weights();
  const auto& layout = t.layout();
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const auto& slot = layout[i];
    weights->read_into(slot.name, master.subspan(slot.offset, slot.count));
  }
  t.publish_weights();
  if (const auto opt = open_tensors(files::optimizer, files::optimizer_compressed)) {
    t.optimizer_state().for_each_tensor([&](std::string_view name, auto& a) {
      (void)load_arena(*opt, a, std::string(name) + ".");
    });
  }
  t.set_steps_done(st.step);
  if (st.loss_scale) t.scaler().load_state(*st.loss_scale);
  return st;
}

}  // namespace checkpoint
HONE_NAMESPACE_END
