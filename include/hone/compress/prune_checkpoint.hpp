// hone/compress/prune_checkpoint.hpp: the pruning masks of a trainer with
// hone::compress::magnitude_pruning in its checkpoints, so that a resumed run keeps the same pruned
// weights and continues the schedule from the same level.
//
//   w.save(step, [&](ck::snapshot& s) {
//     ck::capture(t, s);
//     hone::compress::capture_pruning(t, s);    // masks.safetensors
//   });
//   ...
//   ck::restore(t, dir);
//   hone::compress::restore_pruning(t, dir);
//
// masks.safetensors holds one U8 tensor per prunable slot of the trainer's layout, named after it
// (1 kept, 0 pruned), and the level the masks were pruned to in its metadata ("pruning_level",
// printed with 17 significant digits, so it reads back exactly).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "hone/checkpoint/tensor_file.hpp"
#include "hone/checkpoint/writer.hpp"
#include "hone/compress/prune.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/train/policies.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

/// The file of a checkpoint that holds the pruning masks.
inline constexpr std::string_view pruning_masks_file = "masks.safetensors";

/// Adds the trainer's pruning masks and level to snapshot `s` (masks.safetensors). Before the first
/// update the masks are built on the trainer's layout (nothing pruned) so that the file is
/// complete.
template <class Trainer>
void capture_pruning(Trainer& t, checkpoint::snapshot& s) {
  magnitude_pruning& p = constraint_of<magnitude_pruning>(t.weight_constraint());
  if (p.masks().empty()) p.restore(mask_arena(t.layout(), p.options().prunable), p.level());
  const mask_arena& m = p.masks();
  const arena_layout& layout = m.layout();
  for (std::size_t i = 0; i < layout.size(); ++i) {
    if (!m.prunable(i)) continue;
    const std::span<const std::uint8_t> keep = m.tensor(i);
    s.add(pruning_masks_file, layout[i].name, {keep.size()}, keep);
  }
  char level[32];
  std::snprintf(level, sizeof level, "%.17g", p.level());
  s.set_metadata(pruning_masks_file, "pruning_level", level);
}

/// Restores the masks and level saved by capture_pruning from checkpoint directory `dir`, and
/// zeroes the pruned master weights (publishing them to the model: collective with hone::zero's
/// sharded master weights, so every rank calls it). Throws hone::checkpoint_error
/// when the file is missing or does not match the trainer's prunable tensors (naming the tensor).
template <class Trainer>
void restore_pruning(Trainer& t, const std::filesystem::path& dir) {
  magnitude_pruning& p = constraint_of<magnitude_pruning>(t.weight_constraint());
  const std::filesystem::path path = dir / pruning_masks_file;
  const std::string where = "hone::compress::restore_pruning: " + path.string() + ": ";
  if (!std::filesystem::exists(path)) {
    throw checkpoint_error(where +
                           "no such file; the checkpoint was saved without capture_pruning().");
  }
  const checkpoint::tensor_file f = checkpoint::tensor_file::open(path);
  mask_arena m(t.layout(), p.options().prunable);
  const arena_layout& layout = m.layout();
  for (std::size_t i = 0; i < layout.size(); ++i) {
    if (!m.prunable(i)) continue;
    const checkpoint::tensor_info* info = f.find(layout[i].name);
    if (info == nullptr || info->type != io::dtype::u8 || info->size_bytes() != layout[i].count) {
      throw checkpoint_error(where + "the mask of tensor '" + layout[i].name +
                             "' is missing or not " + std::to_string(layout[i].count) +
                             " U8 values; restore with the same model and prunable predicate.");
    }
    const std::span<std::uint8_t> keep = m.tensor(i);
    f.read(*info, std::as_writable_bytes(keep));
    for (std::uint8_t& k : keep) {
      if (k > 1) {
        throw checkpoint_error(where + "the mask of tensor '" + layout[i].name +
                               "' holds a value other than 0 and 1.");
      }
    }
  }
  const auto it = f.metadata().find("pruning_level");
  if (it == f.metadata().end()) {
    throw checkpoint_error(where + "the metadata has no pruning_level.");
  }
  char* end = nullptr;
  const double level = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end != '\0' || !(level >= 0.0 && level <= 1.0)) {
    throw checkpoint_error(where + "pruning_level '" + it->second +
                           "' is not a sparsity in [0, 1].");
  }
  p.restore(std::move(m), level);
  p.masks().apply(t.master_weights(), t.master_weights_offset());
  if (!t.zero_copy()) t.publish_weights();
}

}  // namespace compress
HONE_NAMESPACE_END
