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
// Early stopping (hone/train/early_stopping.hpp) resumes too: capture_early_stopping() adds its
// state to state.json ("early_stopping") and, with a best_weights_keeper, the snapshot of the best
// weights to best.safetensors (one U8 tensor "best_weights": the keeper's bytes; a separate file,
// so model.safetensors stays the current weights, loadable as they are); restore_early_stopping()
// puts both back. For a trainer with the early-stopping role (hone::early_stopping_policy),
// capture() and restore() call them by themselves.
//
// content_policy::full saves the fp32 master weights as F32 (unless trainer_save_options::
// export_weights with weights_dtype says otherwise), the optimizer state (optimizer.safetensors,
// one tensor per state arena and parameter: "exp_avg.fc1.weight") and state.json with the step, the
// loss scaler's state and the schedule position ({"step": N}: hone's schedules are functions of the
// step). With F32 weights, restore() followed by the same steps is bitwise identical to never
// stopping (CPU). content_policy::weights_only saves the weights in the model's working dtype (or
// weights_dtype) and state.json.
//
// A ZeRO trainer (hone::zero<1|2>, hone/dist/zero.hpp) holds one shard of the optimizer state per
// rank: capture() is then collective (every rank calls it; it all-gathers each state tensor's
// shards into whole tensors, and one rank writes the snapshot), and the checkpoint is the one an
// unsharded trainer writes. restore() reads the whole tensors on every rank and keeps its shard,
// so a checkpoint of N ranks resumes on any number of ranks (docs/dist.md, "ZeRO").
//
// restore() also reads a sharded checkpoint (hone/checkpoint/sharded.hpp, save_sharded: every
// rank wrote its own part of the optimizer state, indexed by shards.json): a ZeRO trainer reads
// only the parts that overlap its shard, any other trainer reads every part; any number of ranks.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "hone/checkpoint/shard_index.hpp"
#include "hone/checkpoint/state.hpp"
#include "hone/checkpoint/tensor_file.hpp"
#include "hone/checkpoint/verify.hpp"
#include "hone/checkpoint/writer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/model.hpp"
#include "hone/core/space.hpp"
#include "hone/dist/zero.hpp"
#include "hone/io/dtype.hpp"
#include "hone/io/json.hpp"
#include "hone/train/early_stopping.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// How capture() saves a trainer.
struct trainer_save_options {
  content_policy content = content_policy::full;
  const shape_map* shapes = nullptr;  // tensor shapes by parameter name (default: 1-D)
  // The weights' stored dtype when `export_weights`; otherwise F32 (full: the fp32 master
  // weights, what bitwise resume needs) or the model's working dtype (weights_only).
  bool export_weights = false;
  io::dtype weights_dtype = io::dtype::f32;
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

/// How restore() loads a trainer.
struct trainer_restore_options {
  bool verify = true;  // verify the directory (MANIFEST, sizes, hashes) first
  // Restore tensors whose stored shape differs from the model's parameter shape element by
  // element (same element count). Off: such a restore is refused, naming the tensor, both shapes
  // and the file. A tensor stored 1-D (saved without shapes) always restores element by element.
  bool flat = false;
};

namespace detail {
/// The model's parameter shapes that describe its tensors (a shape whose element count is the
/// parameter's; an empty or inconsistent shape is left out, so such a tensor is saved 1-D).
template <class Trainer>
[[nodiscard]] shape_map model_shapes(Trainer& t) {
  shape_map out;
  for (auto&& p : model_traits<typename Trainer::model_type>::parameters(t.model())) {
    shape_type s(std::ranges::begin(p.shape), std::ranges::end(p.shape));
    if (s.empty()) continue;
    std::uint64_t n = 1;
    for (const auto d : s) n *= d;
    if (n == static_cast<std::uint64_t>(p.value.size()))
      out.insert_or_assign(std::string(p.name), s);
  }
  return out;
}

/// Refuses a stored tensor whose shape differs from the model's (unless 1-D: saved flat).
inline void check_stored_shape(const tensor_file& f, const std::string& tensor,
                               const shape_map& shapes, const std::string& param,
                               const std::filesystem::path& dir) {
  const auto it = shapes.find(param);
  const tensor_info* info = f.find(tensor);
  if (it == shapes.end() || info == nullptr || info->shape.size() <= 1) return;
  if (info->shape == it->second) return;
  throw checkpoint_error("hone::checkpoint::restore: tensor '" + tensor + "' in checkpoint '" +
                         dir.string() + "' has shape " + shape_string(info->shape) +
                         " but the model's parameter '" + param + "' has shape " +
                         shape_string(it->second) +
                         "; restore into a model with the same shapes, or pass "
                         "trainer_restore_options{.flat = true} to restore element by element");
}

inline shape_type shape_of(const trainer_save_options& o, std::string_view name,
                           std::uint64_t count) {
  if (o.shapes != nullptr) {
    if (const auto it = o.shapes->find(name); it != o.shapes->end()) return it->second;
  }
  return shape_type{count};
}
}  // namespace detail

namespace detail {
/// Whether Trainer has the offload role (Trainer::offloaded; false when it has no such member).
template <class Trainer>
inline constexpr bool offloaded_trainer_v = [] {
  if constexpr (requires { Trainer::offloaded; }) {
    return static_cast<bool>(Trainer::offloaded);
  } else {
    return false;
  }
}();

/// Whether a trainer shards its optimizer state over ranks (hone::zero): capture() all-gathers the
/// shards into whole tensors, restore() keeps this rank's piece of them.
template <class Trainer>
inline constexpr bool sharded_trainer_v = [] {
  if constexpr (requires { Trainer::sharded; }) {
    return static_cast<bool>(Trainer::sharded);
  } else {
    return false;
  }
}();

/// Whether a trainer's master weights and optimizer state are device memory: a CUDA trainer
/// without the offload role (with it, they are the offload engine's host memory).
template <class Trainer>
inline constexpr bool device_state_trainer_v =
    std::is_same_v<typename Trainer::space_type, cuda_space> && !offloaded_trainer_v<Trainer>;

/// How capture() records a trainer's tensors into a snapshot: host memory here (the snapshot
/// copies the spans), device memory in hone/checkpoint/cuda/snapshot.cuh (staged through pinned
/// host memory on the trainer's stream), which specializes it for OnDevice = true.
template <bool OnDevice>
class trainer_stager {
  static_assert(!OnDevice,
                "hone::checkpoint::capture: this trainer's weights live on a CUDA device; include "
                "hone/checkpoint/cuda/snapshot.cuh (from a .cu file), which stages them through "
                "pinned host memory.");

 public:
  template <class Trainer>
  trainer_stager(Trainer& /*t*/, snapshot& s) noexcept : s_(&s) {}
  void add_weights(const std::string& name, shape_type shape, std::span<const float> master,
                   io::dtype stored) {
    s_->add(files::weights, name, std::move(shape), master, stored);
  }
  template <class Arena>
  void add_state(const std::string& prefix, const Arena& a, const trainer_save_options& o) {
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto& slot = a.layout()[i];
      s_->add(files::optimizer, prefix + slot.name, shape_of(o, slot.name, slot.count), a.view(i));
    }
  }
  void finish() noexcept {}

 private:
  snapshot* s_;
};

/// How restore() loads a trainer's tensors: host memory here, device memory in
/// hone/checkpoint/cuda/snapshot.cuh (OnDevice = true).
template <bool OnDevice>
class trainer_loader {
  static_assert(!OnDevice,
                "hone::checkpoint::restore: this trainer's weights live on a CUDA device; include "
                "hone/checkpoint/cuda/snapshot.cuh (from a .cu file), which stages them through "
                "pinned host memory.");

 public:
  template <class Trainer>
  explicit trainer_loader(Trainer& /*t*/) noexcept {}
  static void load_weights(const tensor_file& f, const std::string& name, std::span<float> out) {
    f.read_into(name, out);
  }
  template <class Arena>
  static void load_state(const tensor_file& f, Arena& a, const std::string& prefix) {
    (void)load_arena(f, a, prefix);
  }
  void finish() noexcept {}
};

/// What a trainer restore reads from a checkpoint directory (verified first unless `verify` is
/// false): state.json, the weights file and the optimizer file when saved, each plain or
/// compressed.
struct trainer_files {
  training_state state;
  tensor_file weights;
  std::optional<tensor_file> optimizer;
  std::optional<sharded_reader> shards;  // a sharded checkpoint's optimizer state
};
inline trainer_files open_trainer_files(const std::filesystem::path& dir, bool verify) {
  if (verify) verify_directory(dir, true).require_ok(dir.string());
  const auto open_tensors = [&](std::string_view plain,
                                std::string_view packed) -> std::optional<tensor_file> {
    if (std::filesystem::exists(dir / plain)) return tensor_file::open(dir / plain);
    if (std::filesystem::exists(dir / packed)) return tensor_file::open(dir / packed);
    return std::nullopt;
  };
  auto weights = open_tensors(files::weights, files::weights_compressed);
  if (!weights) {
    throw checkpoint_error("hone: checkpoint '" + dir.string() + "' has no " +
                           std::string(files::weights));
  }
  auto optimizer = open_tensors(files::optimizer, files::optimizer_compressed);
  std::optional<sharded_reader> shards;
  if (!optimizer && is_sharded_checkpoint(dir)) {
    shards.emplace(dir, shard_index::read(dir / files::shard_index));
  }
  return {read_state(dir / files::state), std::move(*weights), std::move(optimizer),
          std::move(shards)};
}

/// Refuses a sharded checkpoint's logical tensor whose shape differs from the model's (as
/// check_stored_shape).
inline void check_sharded_shape(const sharded_reader& r, const std::string& tensor,
                                const shape_map& shapes, const std::string& param) {
  const auto it = shapes.find(param);
  const sharded_tensor* t = r.index().find(tensor);
  if (it == shapes.end() || t == nullptr || t->shape.size() <= 1 || t->shape == it->second) return;
  throw checkpoint_error("hone::checkpoint::restore: tensor '" + tensor +
                         "' in sharded checkpoint '" + r.directory().string() + "' has shape " +
                         shape_string(t->shape) + " but the model's parameter '" + param +
                         "' has shape " + shape_string(it->second) +
                         "; restore into a model with the same shapes, or pass "
                         "trainer_restore_options{.flat = true} to restore element by element");
}
}  // namespace detail

namespace detail {
/// What a hone::zero trainer with sharded master weights holds only a shard of, gathered whole
/// for a checkpoint (empty otherwise: capture reads the trainer's own arrays).
struct gathered_weights {
  std::vector<float> master;  // the fp32 master weights
  std::vector<float> best;    // early stopping's kept best weights (when it has a snapshot)
};

template <class Trainer>
void capture_with(Trainer& t, snapshot& s, const training_state& extra,
                  const trainer_save_options& o, const gathered_weights& gathered);

/// Whether a trainer has the early-stopping role (Trainer::stops_early).
template <class Trainer>
inline constexpr bool early_stopping_trainer_v = requires {
  requires static_cast<bool>(Trainer::stops_early);
};

/// The whole master weights (and kept best weights) of a hone::zero trainer whose master weights
/// are sharded, every rank's shard all-gathered (collective: every rank calls it; every rank must
/// hold a best-weights snapshot or none), else nothing.
template <class Trainer>
gathered_weights gather_sharded(Trainer& t) {
  gathered_weights g;
  if constexpr (sharded_trainer_v<Trainer>) {
    if (t.master_weights_sharded()) {
      g.master = dist::gather_master_weights(t);
      if constexpr (early_stopping_trainer_v<Trainer>) {
        const auto& keeper = t.early_stopper().keeper();
        if (t.early_stopper().keeps_best_weights() && keeper.has_snapshot()) {
          const auto bytes = keeper.snapshot_bytes();  // this rank's shard of the best weights
          std::vector<float> mine(bytes.size() / sizeof(float));
          std::memcpy(mine.data(), bytes.data(), mine.size() * sizeof(float));
          g.best.assign(t.layout().total(), 0.0f);
          t.gradient_reduction().gather(std::span<const float>(mine), std::span<float>(g.best));
        }
      }
    }
  }
  (void)t;
  return g;
}

/// capture_early_stopping with the best weights' bytes given (`weights`: whether they are saved).
inline void capture_early_stopping_bytes(const early_stopping& es, snapshot& s, bool weights,
                                         std::span<const std::byte> best);
/// restore_early_stopping into a keeper of bytes [offset, offset + keeper->bytes()) of the saved
/// best weights, which hold `whole` bytes (a hone::zero rank's shard of them).
inline void restore_early_stopping_slice(early_stopping& es, const std::filesystem::path& dir,
                                         const training_state& st, best_weights_keeper* keeper,
                                         std::size_t offset, std::size_t whole);
}  // namespace detail

// Early stopping's state in a checkpoint (defined below; capture() and restore() call them for a
// trainer with the early-stopping role).
inline void capture_early_stopping(const early_stopping& es, snapshot& s,
                                   const best_weights_keeper* keeper = nullptr);
inline void restore_early_stopping(early_stopping& es, const std::filesystem::path& dir,
                                   const training_state& st, best_weights_keeper* keeper = nullptr);

/// Copies a trainer's state into `s`: weights (and, for content_policy::full, optimizer state),
/// plus state.json from `extra` (its rng, data and metadata are kept; step, loss_scale and
/// schedule are the trainer's). The same function serves host and CUDA trainers (the latter with
/// hone/checkpoint/cuda/snapshot.cuh included, from a .cu file): the files are the same, so a
/// checkpoint of one restores into the other.
template <class Trainer>
void capture(Trainer& t, snapshot& s, const training_state& extra = {},
             const trainer_save_options& o = {}) {
  // Shapes: the caller's, else the model's own parameter shapes.
  shape_map own_shapes;
  trainer_save_options options = o;
  if (options.shapes == nullptr) {
    own_shapes = detail::model_shapes(t);
    options.shapes = &own_shapes;
  }
  // hone::zero with sharded master weights: the ranks' shards gathered (collective)
  const detail::gathered_weights whole = detail::gather_sharded(t);
  detail::capture_with(t, s, extra, options, whole);
}

namespace detail {
/// capture() with the tensor shapes already decided (o.shapes, or 1-D).
template <class Trainer>
void capture_with(Trainer& t, snapshot& s, const training_state& extra,
                  const trainer_save_options& o, const gathered_weights& gathered) {
  using working = typename Trainer::working_type;
  const bool full = o.content == content_policy::full;
  const io::dtype wdt = o.export_weights ? o.weights_dtype
                        : full           ? io::dtype::f32
                                         : io::dtype_of<working>;
  detail::trainer_stager<detail::device_state_trainer_v<Trainer>> stage(t, s);
  const auto& layout = t.layout();
  const auto add_weights = [&](const auto& master) {
    for (std::size_t i = 0; i < layout.size(); ++i) {
      const auto& slot = layout[i];
      stage.add_weights(slot.name, detail::shape_of(o, slot.name, slot.count),
                        master.subspan(slot.offset, slot.count), wdt);
    }
  };
  bool sharded_master = false;  // hone::zero (host trainers): then the gathered weights
  if constexpr (sharded_trainer_v<Trainer>) {
    sharded_master = t.master_weights_sharded();
    if (sharded_master) {
      HONE_REQUIRE(gathered.master.size() == layout.total(),
                   "hone::checkpoint::capture: internal error: the sharded master weights were "
                   "not gathered");
      add_weights(std::span<const float>(gathered.master));
    }
  }
  if (!sharded_master) add_weights(t.master_weights());
  if (full) {
    if constexpr (sharded_trainer_v<Trainer>) {
      // hone::zero: each state tensor's shards all-gathered into whole tensors (every rank calls
      // capture; the checkpoint is the one an unsharded trainer writes).
      auto& zero = t.gradient_reduction();
      t.optimizer_state().for_each_tensor([&](std::string_view name, const auto& a) {
        std::remove_cvref_t<decltype(a)> whole(layout);
        zero.gather(std::span<const float>(a.all()), whole.all());
        stage.add_state(std::string(name) + ".", whole, o);
      });
    } else {
      t.optimizer_state().for_each_tensor([&](std::string_view name, const auto& a) {
        stage.add_state(std::string(name) + ".", a, o);
      });
    }
  }
  stage.finish();
  s.set_metadata(files::weights, "format", "pt");
  s.state.rng = extra.rng;
  s.state.data = extra.data;
  s.state.metadata = extra.metadata;
  s.state.step = t.steps_done();
  s.state.loss_scale = t.scaler().state();
  io::json::value sched = io::json::value::object();
  sched.set("step", t.steps_done());
  s.state.schedule = std::move(sched);
  if constexpr (early_stopping_trainer_v<Trainer>) {  // the early-stopping role's state
    auto& es = t.early_stopper();
    const bool weights = es.keeps_best_weights() && es.keeper().has_snapshot();
    if (sharded_master && weights) {  // every rank's shard of the best weights, gathered
      capture_early_stopping_bytes(es.monitor(), s, true,
                                   std::as_bytes(std::span<const float>(gathered.best)));
    } else {
      capture_early_stopping_bytes(
          es.monitor(), s, weights,
          weights ? es.keeper().snapshot_bytes() : std::span<const std::byte>());
    }
  }
}
}  // namespace detail

/// Restores a trainer from the checkpoint directory `dir` (verified first unless `verify` is
/// false: a damaged checkpoint is refused with checkpoint_error): master weights (published into
/// the model's working weights), optimizer state when the checkpoint has it, the step and the
/// scaler. Returns the state, whose rng, data and metadata the caller restores. Host and CUDA
/// trainers alike (see capture).
template <class Trainer>
training_state restore(Trainer& t, const std::filesystem::path& dir,
                       const trainer_restore_options& ro) {
  detail::trainer_files f = detail::open_trainer_files(dir, ro.verify);
  if (detail::device_state_trainer_v<Trainer> && f.shards) {
    throw checkpoint_error(
        "hone::checkpoint::restore: '" + dir.string() +
        "' is a sharded checkpoint, which restores into host trainers; convert it into an "
        "ordinary one first (hone-ckpt convert DIR --to safetensors OUT) and restore that");
  }
  const auto& layout = t.layout();
  if (!ro.flat) {  // every shape is checked before anything is loaded
    const shape_map shapes = detail::model_shapes(t);
    for (std::size_t i = 0; i < layout.size(); ++i) {
      detail::check_stored_shape(f.weights, layout[i].name, shapes, layout[i].name, dir);
    }
    if (f.optimizer) {
      t.optimizer_state().for_each_tensor([&](std::string_view name, const auto& a) {
        for (std::size_t i = 0; i < a.size(); ++i) {
          const std::string& param = a.layout()[i].name;
          detail::check_stored_shape(*f.optimizer, std::string(name) + "." + param, shapes, param,
                                     dir);
        }
      });
    }
    if (f.shards) {
      t.optimizer_state().for_each_tensor([&](std::string_view name, const auto& a) {
        for (std::size_t i = 0; i < a.size(); ++i) {
          const std::string& param = a.layout()[i].name;
          detail::check_sharded_shape(*f.shards, std::string(name) + "." + param, shapes, param);
        }
      });
    }
  }
  if constexpr (detail::early_stopping_trainer_v<Trainer>) {  // checked before loading weights
    auto& es = t.early_stopper();
    if (f.state.early_stopping.is_object()) {
      // hone::zero with sharded master weights: the keeper holds this rank's shard of them
      std::size_t offset = 0, whole = es.keeper().bytes();
      if constexpr (detail::sharded_trainer_v<Trainer>) {
        if (t.master_weights_sharded()) {
          offset = t.master_weights_offset() * sizeof(float);
          whole = layout.total() * sizeof(float);
        }
      }
      detail::restore_early_stopping_slice(es.monitor(), dir, f.state,
                                           es.keeps_best_weights() ? &es.keeper() : nullptr, offset,
                                           whole);
    } else {  // saved without early stopping: it starts afresh
      es.monitor().reset();
      es.keeper().discard();
    }
  }
  detail::trainer_loader<detail::device_state_trainer_v<Trainer>> load(t);
  // hone::zero with sharded master weights: the whole weights read here, this rank's shard kept
  // and the whole cast into the model (trainer::assign_weights: no collective).
  const auto load_weights = [&](const auto& into) {
    for (std::size_t i = 0; i < layout.size(); ++i) {
      const auto& slot = layout[i];
      load.load_weights(f.weights, slot.name, into.subspan(slot.offset, slot.count));
    }
  };
  [[maybe_unused]] std::vector<float> whole_weights;
  bool via_whole = false;
  if constexpr (detail::sharded_trainer_v<Trainer>) {
    via_whole = t.master_weights_sharded();
    if (via_whole) {
      whole_weights.assign(layout.total(), 0.0f);
      load_weights(std::span<float>(whole_weights));
    }
  }
  if (!via_whole) load_weights(t.master_weights());
  if (f.optimizer) {
    if constexpr (detail::sharded_trainer_v<Trainer>) {
      // hone::zero: the whole tensors read, this rank's shard kept (any number of ranks).
      const auto sh = t.gradient_reduction().shard(layout.total());
      t.optimizer_state().for_each_tensor([&](std::string_view name, auto& a) {
        std::remove_cvref_t<decltype(a)> whole(layout);
        load.load_state(*f.optimizer, whole, std::string(name) + ".");
        const auto part = a.all();
        std::copy_n(whole.all().begin() + static_cast<std::ptrdiff_t>(sh.offset), part.size(),
                    part.begin());
      });
    } else {
      t.optimizer_state().for_each_tensor([&](std::string_view name, auto& a) {
        load.load_state(*f.optimizer, a, std::string(name) + ".");
      });
    }
  } else if (f.shards) {
    // A sharded checkpoint: each piece of this trainer's state arenas (the whole tensors, or with
    // hone::zero this rank's shard of them) read from the parts that overlap it.
    if constexpr (!detail::device_state_trainer_v<Trainer>) {  // (refused above otherwise)
      std::size_t base = 0;  // the arena element of the state arenas' first element
      if constexpr (detail::sharded_trainer_v<Trainer>) {
        base = t.gradient_reduction().shard(layout.total()).offset;
      }
      t.optimizer_state().for_each_tensor([&](std::string_view name, auto& a) {
        for (std::size_t i = 0; i < a.size(); ++i) {
          const auto& piece = a.layout()[i];
          const auto& whole = layout[layout.find(piece.name)];
          const std::string tensor = std::string(name) + "." + piece.name;
          const sharded_tensor& st = f.shards->at(tensor);
          if (st.elements() != whole.count) {
            throw checkpoint_error(
                "hone::checkpoint::restore: tensor '" + tensor + "' in sharded checkpoint '" +
                dir.string() + "' has " + std::to_string(st.elements()) +
                " elements, the model's parameter '" + whole.name + "' has " +
                std::to_string(whole.count) + "; restore into the model that was saved");
          }
          f.shards->read_range(tensor, base + piece.offset - whole.offset, a.view(i));
        }
      });
    }
  }
  if (!via_whole) {
    t.publish_weights();  // on CUDA stream-ordered after the copies
  } else if constexpr (detail::sharded_trainer_v<Trainer>) {
    t.assign_weights(whole_weights);
  }
  load.finish();
  t.set_steps_done(f.state.step);
  if (f.state.loss_scale) t.scaler().load_state(*f.state.loss_scale);
  return f.state;
}

/// restore() with trainer_restore_options{.verify = verify}.
template <class Trainer>
training_state restore(Trainer& t, const std::filesystem::path& dir, bool verify = true) {
  return restore(t, dir, trainer_restore_options{.verify = verify, .flat = false});
}

/// The file of the early-stopping best weights in a checkpoint.
inline constexpr std::string_view early_stopping_best_file = "best.safetensors";

namespace detail {
inline io::json::value es_number(double v) {
  char text[32];
  const auto r = std::to_chars(text, text + sizeof(text), v);
  return io::json::value(std::string(text, r.ptr));  // exact, and "inf"/"nan" survive JSON
}
inline double es_parse_number(const io::json::value& v, std::string_view field) {
  if (v.is_string()) {
    const std::string& t = v.as_string();
    double out = 0.0;
    const auto r = std::from_chars(t.data(), t.data() + t.size(), out);
    if (r.ec == std::errc() && r.ptr == t.data() + t.size()) return out;
  }
  throw checkpoint_error("early_stopping." + std::string(field) +
                         " is not a number written as text");
}
inline io::json::value es_optional(const std::optional<std::uint64_t>& v) {
  return v ? io::json::value(*v) : io::json::value(nullptr);
}
inline const io::json::value& es_field(const io::json::value& o, std::string_view field) {
  const io::json::value* v = o.find(field);
  if (v == nullptr) {
    throw checkpoint_error("early_stopping has no field \"" + std::string(field) + "\"");
  }
  return *v;
}
inline std::optional<std::uint64_t> es_parse_optional(const io::json::value& v) {
  if (v.is_null()) return std::nullopt;
  return v.as_u64();
}
}  // namespace detail

/// Adds early stopping's state to the snapshot's state.json and, when `keeper` has a snapshot,
/// the best weights to best.safetensors. Call it after capture() (which sets the state).
inline void capture_early_stopping(const early_stopping& es, snapshot& s,
                                   const best_weights_keeper* keeper) {
  const bool weights = keeper != nullptr && keeper->has_snapshot();
  detail::capture_early_stopping_bytes(
      es, s, weights, weights ? keeper->snapshot_bytes() : std::span<const std::byte>());
}

inline void detail::capture_early_stopping_bytes(const early_stopping& es, snapshot& s,
                                                 bool weights, std::span<const std::byte> best) {
  const early_stopping_state st = es.state();
  io::json::value o = io::json::value::object();
  o.set("mode", es.options().mode == monitor_mode::min ? "min" : "max");
  o.set("patience", es.options().patience);
  o.set("best", detail::es_number(st.best));
  o.set("best_step", detail::es_optional(st.best_step));
  o.set("stop_step", detail::es_optional(st.stop_step));
  o.set("last", detail::es_number(st.last));
  o.set("wait_count", st.wait_count);
  o.set("stop_wait", st.stop_wait);
  o.set("stop_metric", detail::es_number(st.stop_metric));
  o.set("checks", st.checks);
  o.set("improved", st.improved);
  o.set("reason", to_string(st.reason));
  o.set("best_weights", weights);
  if (weights) {
    s.add_bytes(early_stopping_best_file, "best_weights", io::dtype::u8, io::dtype::u8,
                {best.size()}, best);
  }
  s.state.early_stopping = std::move(o);
}

/// Restores early stopping (and the keeper's snapshot, when one was saved and `keeper` is given)
/// from the checkpoint directory `dir` whose state.json gave `st`. checkpoint_error when the
/// checkpoint has no early-stopping state, when it was saved with another mode or patience, or
/// when the best weights were saved but `keeper` tracks arrays of another size.
inline void restore_early_stopping(early_stopping& es, const std::filesystem::path& dir,
                                   const training_state& st, best_weights_keeper* keeper) {
  detail::restore_early_stopping_slice(es, dir, st, keeper, 0,
                                       keeper != nullptr ? keeper->bytes() : 0);
}

inline void detail::restore_early_stopping_slice(early_stopping& es,
                                                 const std::filesystem::path& dir,
                                                 const training_state& st,
                                                 best_weights_keeper* keeper, std::size_t offset,
                                                 std::size_t whole) {
  const std::string where = "hone: checkpoint '" + dir.string() + "': ";
  if (!st.early_stopping.is_object()) {
    throw checkpoint_error(where +
                           "has no early-stopping state (saved without capture_early_stopping?)");
  }
  const io::json::value& o = st.early_stopping;
  const std::string want_mode = es.options().mode == monitor_mode::min ? "min" : "max";
  early_stopping_state s;
  bool saved_weights = false;
  try {
    const std::string mode = detail::es_field(o, "mode").as_string();
    const std::uint64_t patience = detail::es_field(o, "patience").as_u64();
    if (mode != want_mode || patience != es.options().patience) {
      throw checkpoint_error("it was saved with mode " + mode + " and patience " +
                             std::to_string(patience) + ", this early_stopping has mode " +
                             want_mode + " and patience " + std::to_string(es.options().patience) +
                             "; resume with the same options");
    }
    s.best = detail::es_parse_number(detail::es_field(o, "best"), "best");
    s.best_step = detail::es_parse_optional(detail::es_field(o, "best_step"));
    s.stop_step = detail::es_parse_optional(detail::es_field(o, "stop_step"));
    s.last = detail::es_parse_number(detail::es_field(o, "last"), "last");
    s.wait_count = detail::es_field(o, "wait_count").as_u64();
    s.stop_wait = detail::es_field(o, "stop_wait").as_u64();
    s.stop_metric = detail::es_parse_number(detail::es_field(o, "stop_metric"), "stop_metric");
    s.checks = detail::es_field(o, "checks").as_u64();
    s.improved = detail::es_field(o, "improved").as_bool();
    const auto reason = stop_reason_from_string(detail::es_field(o, "reason").as_string());
    if (!reason) throw checkpoint_error("early_stopping.reason is not a stop reason");
    s.reason = *reason;
    saved_weights = detail::es_field(o, "best_weights").as_bool();
    es.restore(s);
  } catch (const checkpoint_error& e) {
    throw checkpoint_error(where + "early-stopping state: " + e.what());
  } catch (const config_error& e) {
    throw checkpoint_error(where + "early-stopping state: " + e.what());
  }
  if (keeper == nullptr) return;
  if (!saved_weights) {
    keeper->discard();
    return;
  }
  const tensor_file f = tensor_file::open(dir / early_stopping_best_file);
  const tensor_info& t = f.at("best_weights");
  if (t.type != io::dtype::u8 || t.size_bytes() != whole) {
    throw checkpoint_error(where + "the saved best weights have " + std::to_string(t.size_bytes()) +
                           " bytes, the keeper tracks " + std::to_string(whole) +
                           "; track the same arrays as the run that saved them");
  }
  HONE_REQUIRE(offset <= whole && keeper->bytes() <= whole - offset,
               "hone::checkpoint::restore: internal error: the keeper's shard of the best weights "
               "lies outside them");
  std::vector<std::byte> bytes(static_cast<std::size_t>(t.size_bytes()));
  f.read(t, bytes);
  keeper->restore_snapshot(std::span<const std::byte>(bytes).subspan(offset, keeper->bytes()));
}

}  // namespace checkpoint
HONE_NAMESPACE_END
