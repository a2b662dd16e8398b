// hone/checkpoint/retention.hpp: which checkpoints of a run to keep.
//
//   ck::retention_policy keep{.keep_last = 3, .best_metric = "val_loss", .keep_best = 1};
//   ck::apply_retention(root, keep);   // after a commit (checkpoint_writer does this itself)
//
// Keeps the newest `keep_last` committed checkpoints, plus the `keep_best` ones with the best
// value of a metric stored in state.json's metadata (metadata[best_metric], a decimal number).
// The newest checkpoint that verifies is never deleted, whatever the policy says (rotation must
// not delete every checkpoint: transformers PR #25136), and a checkpoint is deleted by renaming
// it to a temporary name first and fsyncing the root before anything inside is removed, so a
// crash or power loss mid-deletion never leaves a half-deleted directory that looks committed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "hone/checkpoint/directory.hpp"
#include "hone/checkpoint/state.hpp"
#include "hone/checkpoint/verify.hpp"
#include "hone/core/config.hpp"
#include "hone/io/directory.hpp"
#include "hone/io/file_io.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// What to keep. The default keeps everything.
struct retention_policy {
  std::size_t keep_last = 0;                 // the newest N checkpoints; 0: keep all
  std::optional<std::string> best_metric{};  // a key of state.json's metadata holding a number
  bool higher_is_better = false;             // e.g. true for accuracy, false for a loss
  std::size_t keep_best = 1;                 // how many best checkpoints to keep besides
};

namespace detail {
inline std::optional<double> read_metric(const std::filesystem::path& dir, const std::string& key) {
  try {
    const training_state s = read_state(dir / files::state);
    const auto it = s.metadata.find(key);
    if (it == s.metadata.end()) return std::nullopt;
    char* end = nullptr;
    const double v = std::strtod(it->second.c_str(), &end);
    if (end == it->second.c_str() || *end != '\0' || !std::isfinite(v)) return std::nullopt;
    return v;
  } catch (const error&) {
    return std::nullopt;
  }
}
}  // namespace detail

/// The checkpoints under `root` that `policy` would delete now (oldest first); never the newest
/// that verifies (MANIFEST sizes and hashes). `known_valid`: the step of a checkpoint the caller
/// just committed; when it is the newest, it is not hashed again.
[[nodiscard]] inline std::vector<checkpoint_entry> retention_victims(
    const std::filesystem::path& root, const retention_policy& policy,
    std::optional<std::uint64_t> known_valid = std::nullopt) {
  const auto all = list_checkpoints(root);
  if (policy.keep_last == 0 || all.size() <= policy.keep_last) return {};
  std::set<std::uint64_t> keep;
  for (std::size_t i = all.size() - policy.keep_last; i < all.size(); ++i) keep.insert(all[i].step);
  if (policy.best_metric && policy.keep_best > 0) {
    std::vector<std::pair<double, std::uint64_t>> scored;
    for (const auto& c : all) {
      if (const auto m = detail::read_metric(c.path, *policy.best_metric)) {
        scored.emplace_back(policy.higher_is_better ? -*m : *m, c.step);
      }
    }
    std::sort(scored.begin(), scored.end());
    for (std::size_t i = 0; i < scored.size() && i < policy.keep_best; ++i) {
      keep.insert(scored[i].second);
    }
  }
  if (known_valid && all.back().step == *known_valid) {
    keep.insert(*known_valid);
  } else if (const auto newest = newest_valid(root, false)) {
    keep.insert(newest->step);
  }
  std::vector<checkpoint_entry> out;
  for (const auto& c : all) {
    if (!keep.contains(c.step)) out.push_back(c);
  }
  return out;
}

/// Deletes what retention_victims() names; returns the deleted paths. Call it only after a
/// commit (checkpoint_writer does).
inline std::vector<std::filesystem::path> apply_retention(
    const std::filesystem::path& root, const retention_policy& policy,
    std::optional<std::uint64_t> known_valid = std::nullopt) {
  std::vector<std::filesystem::path> deleted;
  std::vector<std::filesystem::path> doomed;
  for (const auto& v : retention_victims(root, policy, known_valid)) {
    doomed.push_back(io::temp_sibling(v.path, "del-"));
    io::rename_path(v.path, doomed.back());
    deleted.push_back(v.path);
  }
  if (deleted.empty()) return deleted;
  // The renames must be durable before any file inside is unlinked: otherwise a power loss may
  // keep the unlinks and lose the rename, leaving a half-deleted step-N that looks committed.
  io::sync_directory(root);
  for (const auto& d : doomed) io::remove_tree(d);
  io::sync_directory(root);
  return deleted;
}

}  // namespace checkpoint
HONE_NAMESPACE_END
