// hone/checkpoint/verify.hpp: the names of a checkpoint directory's files, and the checks a tool
// (`hone-ckpt verify`) or a careful loader runs: one file by its kind, or a whole directory
// against its MANIFEST.
//
// A checkpoint is a directory holding
//   model.safetensors      the weights (or model.hct, compressed), readable by Python safetensors
//   optimizer.safetensors  optimizer state, when saved in full (or optimizer.hct)
//   state.json             step, loss scaler, schedule, RNGs, data position, user metadata
//   MANIFEST               size and XXH3-128 of every other file; written last
// or, sharded (hone/checkpoint/sharded.hpp: every rank writes its part of the optimizer state),
// optimizer-RRRRR-of-NNNNN.safetensors files and shards.json, their index (shard_index.hpp), in
// place of optimizer.safetensors. verify_directory checks the index against the MANIFEST too.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "hone/checkpoint/compress.hpp"
#include "hone/checkpoint/file_io.hpp"
#include "hone/checkpoint/manifest.hpp"
#include "hone/checkpoint/safetensors.hpp"
#include "hone/checkpoint/shard_index.hpp"
#include "hone/checkpoint/state.hpp"
#include "hone/checkpoint/tensor_file.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/file_io.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// The file names inside a checkpoint directory.
namespace files {
inline constexpr std::string_view weights = "model.safetensors";
inline constexpr std::string_view weights_compressed = "model.hct";
inline constexpr std::string_view optimizer = "optimizer.safetensors";
inline constexpr std::string_view optimizer_compressed = "optimizer.hct";
inline constexpr std::string_view state = "state.json";
inline constexpr std::string_view manifest = "MANIFEST";
}  // namespace files

/// What a checkpoint holds.
enum class content_policy {
  weights_only,  // model weights (for export and inference)
  full,          // weights, optimizer state and training state (for resuming)
};

/// The kinds of files hone reads.
enum class file_kind { manifest, state, safetensors, compressed_tensors, shard_index, unknown };

[[nodiscard]] constexpr std::string_view file_kind_name(file_kind k) noexcept {
  switch (k) {
    case file_kind::manifest:
      return "MANIFEST";
    case file_kind::state:
      return "state";
    case file_kind::safetensors:
      return "safetensors";
    case file_kind::compressed_tensors:
      return "compressed tensors";
    case file_kind::shard_index:
      return "shard index";
    case file_kind::unknown:
      return "unknown";
  }
  return "unknown";
}

/// The kind of the file at `path`: by name (MANIFEST, shards.json, *.json), then by its first bytes
/// (the compressed magic), then by suffix (*.safetensors).
[[nodiscard]] inline file_kind detect_file_kind(const std::filesystem::path& path) {
  const std::string name = path.filename().string();
  if (name == files::manifest) return file_kind::manifest;
  if (name == files::shard_index) return file_kind::shard_index;
  if (path.extension() == ".json") return file_kind::state;
  std::array<std::byte, 8> start{};
  {
    io::input_file in(path);
    if (in.size() >= start.size()) in.read_at(0, start);
  }
  if (is_compressed_tensor_file(start)) return file_kind::compressed_tensors;
  if (path.extension() == ".safetensors") return file_kind::safetensors;
  return file_kind::unknown;
}

/// Checks one file completely by its kind: a MANIFEST parses (with its own checksum), a state
/// parses, a shard index parses and is consistent, a safetensors header validates against the file,
/// a compressed file validates and every chunk decompresses to its hash. checkpoint_error (damage)
/// or io_error (cannot read) otherwise; config_error for a file of unknown kind.
inline file_kind verify_file(const std::filesystem::path& path) {
  const file_kind kind = detect_file_kind(path);
  switch (kind) {
    case file_kind::manifest:
      (void)manifest::read(path);
      break;
    case file_kind::state:
      (void)read_state(path);
      break;
    case file_kind::safetensors:
      (void)safetensors_file::open(path);
      break;
    case file_kind::compressed_tensors:
      compressed_file::open(path).verify();
      break;
    case file_kind::shard_index:
      (void)shard_index::read(path);
      break;
    case file_kind::unknown:
      throw config_error("hone: '" + path.string() +
                         "' is not a file hone knows how to check (expected MANIFEST, *.json, "
                         "*.safetensors or a compressed tensor file)");
  }
  return kind;
}

/// The outcome of verify_directory.
struct verify_report {
  std::vector<std::string> problems;  // one sentence each; empty when the checkpoint is intact
  std::size_t files_checked = 0;
  std::uint64_t bytes_hashed = 0;
  [[nodiscard]] bool ok() const noexcept { return problems.empty(); }
  /// Throws checkpoint_error listing every problem, if any.
  void require_ok(std::string_view dir) const {
    if (ok()) return;
    std::string msg = "hone: checkpoint '" + std::string(dir) + "' is damaged or incomplete:";
    for (const auto& p : problems) msg += "\n  " + p;
    throw checkpoint_error(msg);
  }
};

/// Checks a checkpoint directory: its MANIFEST is intact, every file it lists exists with its
/// size and XXH3-128, and (when `deep`) every listed file passes verify_file. A sharded
/// checkpoint's index (shards.json) must be listed, and every rank's part file it names must be
/// listed in the MANIFEST (and, when `deep`, hold the pieces the index says). Files not in the
/// MANIFEST are ignored. Never throws for damage: every problem is in the report.
[[nodiscard]] inline verify_report verify_directory(const std::filesystem::path& dir,
                                                    bool deep = true) {
  verify_report r;
  const std::filesystem::path mpath = dir / files::manifest;
  manifest m;
  try {
    m = manifest::read(mpath);
  } catch (const error& e) {
    r.problems.push_back(std::string(e.what()) +
                         " (without a valid MANIFEST the checkpoint is incomplete: it was not "
                         "finished, or it was damaged)");
    return r;
  }
  r.problems = check_manifest_files(m, dir, &r.bytes_hashed);
  r.files_checked = m.size();
  std::error_code ec;
  const bool has_index = m.find(files::shard_index) != nullptr;
  if (!has_index && std::filesystem::exists(dir / files::shard_index, ec)) {
    r.problems.push_back("'" + (dir / files::shard_index).string() +
                         "' (the index of a sharded checkpoint) is not listed in the MANIFEST");
  }
  if (has_index && r.problems.empty()) {
    try {
      const shard_index idx = shard_index::read(dir / files::shard_index);
      for (auto& p : idx.check_against(m, dir, deep)) r.problems.push_back(std::move(p));
    } catch (const error& ex) {
      r.problems.push_back(ex.what());
    }
  }
  if (deep && r.problems.empty()) {
    for (const auto& e : m.entries()) {
      const std::filesystem::path p = dir / e.name;
      try {
        if (detect_file_kind(p) != file_kind::unknown) (void)verify_file(p);
      } catch (const error& ex) {
        r.problems.push_back(ex.what());
      }
    }
  }
  return r;
}

}  // namespace checkpoint
HONE_NAMESPACE_END
