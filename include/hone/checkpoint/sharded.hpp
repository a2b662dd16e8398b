// hone/checkpoint/sharded.hpp: sharded checkpoints, every rank writing its own part of the
// optimizer state, over any hone::dist::communicator (no MPI include here).
//
//   hone::dist::mpi_comm comm;
//   hone::trainer t(model, hone::adamw{}, hone::zero<2>(comm));
//   ...
//   ck::save_sharded(t, comm, "ckpt", step, {.extra = extra_state});   // every rank calls it
//   ...                                                                // later, any world size:
//   auto c = ck::newest_valid("ckpt");
//   ck::training_state st = ck::restore(t, c->path);                   // this rank's shard only
//
// What save_sharded does (collective: every rank calls it with the same root and step):
//  1. rank 0 creates the temporary step directory (ROOT/.tmp-step-N-PID, PID rank 0's) and
//     broadcasts its name;
//  2. every rank writes its pieces of the optimizer state into optimizer-RRRRR-of-NNNNN.safetensors
//     (compressed: .hct) there: rank r's shard of the flat arena, [r S, (r + 1) S) as
//     hone::dist::shard_of cuts it, i.e. what a hone::zero trainer holds; a trainer without ZeRO
//     (e.g. hone::data_parallel, whose ranks hold the same state) writes the same pieces of its
//     whole state, so the writing is spread over the ranks. Rank 0 also writes model.safetensors
//     (the fp32 master weights, identical on every rank), state.json and shards.json, the index of
//     every logical tensor whole and of its parts (shard_index.hpp);
//  3. the ranks all-gather whether each succeeded and the size and XXH3-128 of each part file;
//  4. when all did, rank 0 writes ONE MANIFEST listing every file (so the set is verified as one:
//     no part can be missing, short or damaged unnoticed), renames the directory into place
//     (ROOT/step-N, the atomic commit of pending_checkpoint), applies the retention policy, and
//     broadcasts the outcome. When a rank failed, rank 0 removes the temporary directory and every
//     rank throws checkpoint_error naming the ranks that failed: no checkpoint of that step
//     appears. A rank that dies makes the others' collectives fail (hone::dist_error, after the
//     communicator's timeout, never a hang): rank 0's temporary directory is then removed as its
//     error unwinds, or, if rank 0 died, left as a .tmp- directory that is never a checkpoint
//     (clean_leftovers removes it). Should the last broadcast fail after rank 0 committed, the
//     checkpoint on disk is complete and valid (its MANIFEST covers every part); the ranks whose
//     broadcast failed throw hone::dist_error all the same.
//
// Shared file system: every rank writes into the directory rank 0 created, and rank 0 hashes
// nothing of theirs (each rank hashes its own file as it writes it), but the rename that commits
// the checkpoint must see every rank's file: ROOT must be one directory on a file system that all
// ranks mount (NFS, Lustre, GPFS, or one machine's disk). Call clean_leftovers (or construct a
// checkpoint_writer) on rank 0 only: a temporary's owner is rank 0's PID, which other machines
// cannot see.
//
// A sharded checkpoint restores at any world size (restore() in trainer_checkpoint.hpp reads only
// the parts that overlap a ZeRO rank's shard; a trainer without ZeRO reads them all), verifies
// with verify_directory / newest_valid like any checkpoint, and hone-ckpt reads, verifies and
// converts it (`hone-ckpt convert DIR --to file OUT.safetensors`: one file of whole tensors).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/checkpoint/directory.hpp"
#include "hone/checkpoint/retention.hpp"
#include "hone/checkpoint/shard_index.hpp"
#include "hone/checkpoint/state.hpp"
#include "hone/checkpoint/tensor_file.hpp"
#include "hone/checkpoint/tensor_writer.hpp"
#include "hone/checkpoint/trainer_checkpoint.hpp"
#include "hone/checkpoint/verify.hpp"
#include "hone/checkpoint/writer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/dist/communicator.hpp"
#include "hone/dist/zero.hpp"
#include "hone/io/directory.hpp"
#include "hone/io/dtype.hpp"
#include "hone/io/json.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// How save_sharded() saves.
struct sharded_save_options {
  training_state extra{};             // rng, data and metadata for state.json (as capture's)
  const shape_map* shapes = nullptr;  // tensor shapes by parameter name (default: the model's)
  std::optional<compression_options> compression{};  // none: plain safetensors files
  bool sync = true;                                  // fsync files and directories
  std::optional<retention_policy> retention{};       // applied by rank 0 after the commit
};

namespace detail {
/// A rank's outcome of step 2, as doubles for the communicator: ok flag, the part file's size in
/// two 32-bit halves, its XXH3-128 in four 32-bit words.
inline constexpr std::size_t shard_record_size = 7;

inline std::array<double, shard_record_size> encode_shard_record(bool ok,
                                                                 const io::file_digest& d) {
  std::array<double, shard_record_size> r{};
  r[0] = ok ? 1.0 : 0.0;
  r[1] = static_cast<double>(d.size >> 32);
  r[2] = static_cast<double>(d.size & 0xffffffffu);
  for (std::size_t w = 0; w < 4; ++w) {
    std::uint32_t v = 0;
    for (std::size_t b = 0; b < 4; ++b) v = (v << 8) | d.hash.bytes[w * 4 + b];
    r[3 + w] = static_cast<double>(v);
  }
  return r;
}

inline io::file_digest decode_shard_record(std::span<const double> r) {
  io::file_digest d;
  d.size = (static_cast<std::uint64_t>(r[1]) << 32) | static_cast<std::uint64_t>(r[2]);
  for (std::size_t w = 0; w < 4; ++w) {
    auto v = static_cast<std::uint32_t>(r[3 + w]);
    for (std::size_t b = 4; b-- > 0;) {
      d.hash.bytes[w * 4 + b] = static_cast<std::uint8_t>(v & 0xffu);
      v >>= 8;
    }
  }
  return d;
}

/// The longest temporary directory name rank 0 broadcasts.
inline constexpr std::size_t max_shard_temp_name = 255;

/// The index of a sharded checkpoint of `layout` over `ranks` ranks (every rank computes the
/// same): each slot's tensor and the pieces of it that each rank's shard holds.
template <class Names>
shard_index make_shard_index(const arena_layout& layout, const Names& state_names, int ranks,
                             bool compressed, const shape_map& shapes) {
  shard_index idx;
  idx.world_size = static_cast<std::uint64_t>(ranks);
  for (int r = 0; r < ranks; ++r) idx.files.push_back(shard_file_name(r, ranks, compressed));
  for (const std::string& state : state_names) {
    for (std::size_t s = 0; s < layout.size(); ++s) {
      const auto& slot = layout[s];
      sharded_tensor t;
      t.name = state + "." + slot.name;
      t.type = io::dtype::f32;
      const auto it = shapes.find(slot.name);
      t.shape = it != shapes.end() ? it->second : shape_type{slot.count};
      for (int r = 0; r < ranks; ++r) {
        const dist::shard_range c = dist::shard_of(layout.total(), r, ranks);
        const std::size_t a = std::max(c.offset, slot.offset);
        const std::size_t b = std::min(c.offset + c.count, slot.offset + slot.count);
        if (a >= b) continue;
        t.parts.push_back({idx.files[static_cast<std::size_t>(r)], a - slot.offset, b - a});
      }
      idx.tensors.push_back(std::move(t));
    }
  }
  return idx;
}

}  // namespace detail

/// Saves the checkpoint of `step` of trainer `t` under `root` as a sharded checkpoint, every rank
/// of `comm` writing its own part of the optimizer state (see the file comment). Collective: every
/// rank calls it with the same root and step. For a hone::zero trainer, `comm` is the trainer's
/// communicator (the same ranks). Returns ROOT/step-N on every rank once it is committed;
/// checkpoint_error (naming the ranks that failed) when a rank could not write its part, and then
/// no checkpoint of `step` appears; hone::dist_error when a collective fails (a rank died).
template <class Trainer, class Comm>
std::filesystem::path save_sharded(Trainer& t, Comm& comm, const std::filesystem::path& root,
                                   std::uint64_t step, const sharded_save_options& o = {}) {
  static_assert(dist::check_communicator<Comm>());
  static_assert(!detail::device_state_trainer_v<Trainer>,
                "hone::checkpoint::save_sharded: this trainer's state lives on a CUDA device; "
                "sharded checkpoints are written from host trainers (hone::zero is host-only). "
                "Use capture() and checkpoint_writer for a CUDA trainer.");
  const int rank = comm.rank(), ranks = comm.size();
  const std::string who = "hone::checkpoint::save_sharded (rank " + std::to_string(rank) + " of " +
                          std::to_string(ranks) + ", step " + std::to_string(step) + ")";
  HONE_REQUIRE(ranks >= 1 && rank >= 0 && rank < ranks,
               who + ": the communicator's rank must be in [0, size()) and size() at least 1");
  HONE_REQUIRE(!root.empty(), who +
                                  ": the root directory is empty; give the run's checkpoint "
                                  "directory (the same path on every rank)");
  const auto& layout = t.layout();
  std::size_t base = 0;  // the arena element of the state arenas' first element
  if constexpr (detail::sharded_trainer_v<Trainer>) {
    auto& own = t.gradient_reduction().communicator();
    HONE_REQUIRE(own.rank() == rank && own.size() == ranks,
                 who + ": the trainer's hone::zero shards over rank " + std::to_string(own.rank()) +
                     " of " + std::to_string(own.size()) +
                     "; pass the trainer's own communicator (the ranks must be the same)");
    base = t.gradient_reduction().shard(layout.total()).offset;
  }
  const dist::shard_range cut = dist::shard_of(layout.total(), rank, ranks);
  // hone::zero with sharded master weights: the ranks' shards gathered (collective) for the
  // weights file that rank 0 writes; 4 bytes per parameter on every rank while the save runs
  const detail::gathered_weights gathered = detail::gather_sharded(t);
  const bool compressed = o.compression.has_value();
  const write_options wo{.compression = o.compression, .sync = o.sync};

  // 1. Rank 0 starts the temporary directory and broadcasts its name.
  std::optional<pending_checkpoint> pc;
  std::array<double, 2 + detail::max_shard_temp_name> start{};
  std::string start_error;
  if (rank == 0) {
    try {
      io::ensure_directory(root);
      pc.emplace(pending_checkpoint::for_step(root, step));
      const std::string name = pc->temp_path().filename().string();
      HONE_REQUIRE(name.size() <= detail::max_shard_temp_name,
                   who + ": the temporary directory's name is too long");
      start[0] = 1.0;
      start[1] = static_cast<double>(name.size());
      for (std::size_t i = 0; i < name.size(); ++i)
        start[2 + i] = static_cast<double>(static_cast<unsigned char>(name[i]));
    } catch (const std::exception& e) {
      start_error = e.what();
      start[0] = 0.0;
    }
  }
  comm.broadcast(std::span<double>(start), 0).wait();
  if (start[0] != 1.0) {
    throw checkpoint_error(
        who + ": rank 0 could not start the checkpoint directory under '" + root.string() + "'" +
        (start_error.empty() ? std::string(" (rank 0's error says why)") : ": " + start_error));
  }
  std::string temp_name(static_cast<std::size_t>(start[1]), '\0');
  for (std::size_t i = 0; i < temp_name.size(); ++i)
    temp_name[i] = static_cast<char>(static_cast<unsigned char>(start[2 + i]));
  const std::filesystem::path temp = root / temp_name;

  // 2. Every rank writes its part; rank 0 also the weights, state.json and the index.
  shape_map own_shapes;
  const shape_map* shapes = o.shapes;
  if (shapes == nullptr) {
    own_shapes = detail::model_shapes(t);
    shapes = &own_shapes;
  }
  std::vector<std::string> state_names;
  t.optimizer_state().for_each_tensor(
      [&](std::string_view name, const auto&) { state_names.emplace_back(name); });
  const shard_index idx = detail::make_shard_index(layout, state_names, ranks, compressed, *shapes);
  const std::string my_file = shard_file_name(rank, ranks, compressed);
  io::file_digest mine{};
  std::string write_error;
  try {
    tensor_writer w;
    w.set_order(tensor_order::as_added);
    io::json::value pieces = io::json::value::object();
    t.optimizer_state().for_each_tensor([&](std::string_view name, const auto& a) {
      const auto all = a.all();
      static_assert(std::is_same_v<std::remove_cvref_t<decltype(all[0])>, float>,
                    "hone::checkpoint::save_sharded: the optimizer's state is not fp32 arenas "
                    "laid out as the parameters (an element-wise optimizer such as hone::adamw "
                    "or hone::sgd); save this trainer with capture() instead.");
      if constexpr (!detail::sharded_trainer_v<Trainer>) {
        HONE_REQUIRE(a.layout().total() == layout.total() && a.layout().size() == layout.size(),
                     who + ": the optimizer's state '" + std::string(name) +
                         "' is not laid out as the parameters; save_sharded cuts element-wise "
                         "state (hone::adamw, hone::sgd): save this trainer with capture()");
      }
      for (std::size_t s = 0; s < layout.size(); ++s) {
        const auto& slot = layout[s];
        const std::size_t lo = std::max(cut.offset, slot.offset);
        const std::size_t hi = std::min(cut.offset + cut.count, slot.offset + slot.count);
        if (lo >= hi) continue;
        const std::string tensor = std::string(name) + "." + slot.name;
        w.add(tensor, shape_type{hi - lo}, all.subspan(lo - base, hi - lo));
        io::json::value p = io::json::value::array();
        p.push_back(static_cast<std::uint64_t>(lo - slot.offset));
        p.push_back(static_cast<std::uint64_t>(slot.count));
        pieces.set(tensor, std::move(p));
      }
    });
    io::json::value meta = io::json::value::object();
    meta.set("rank", static_cast<std::uint64_t>(rank));
    meta.set("world_size", static_cast<std::uint64_t>(ranks));
    meta.set("pieces", std::move(pieces));  // tensor: [offset in the whole tensor, its elements]
    w.set_metadata("hone.shard", meta.dump());
    const std::filesystem::path path = temp / my_file;
    detail::fault_point(path);
    mine = write_tensors(w, path, wo);
    if (rank == 0) {
      snapshot s;  // the weights (fp32 master) and state.json, as capture() writes them
      detail::capture_with(t, s, o.extra,
                           trainer_save_options{.content = content_policy::weights_only,
                                                .shapes = shapes,
                                                .export_weights = true,
                                                .weights_dtype = io::dtype::f32},
                           gathered);
      s.write_into(*pc, wo);
      pc->add(std::string(files::shard_index), idx.write(pc->file(files::shard_index), o.sync));
    }
  } catch (const std::exception& e) {
    write_error = e.what();
  }

  // 3. Every rank's outcome, size and hash.
  const auto rec = detail::encode_shard_record(write_error.empty(), mine);
  std::vector<double> all(detail::shard_record_size * static_cast<std::size_t>(ranks));
  comm.all_gather(std::span<const double>(rec), std::span<double>(all)).wait();
  std::vector<int> failed;
  for (int r = 0; r < ranks; ++r) {
    if (all[static_cast<std::size_t>(r) * detail::shard_record_size] != 1.0) failed.push_back(r);
  }
  if (!failed.empty()) {
    if (pc) pc->abort();
    std::string list;
    for (const int r : failed) list += (list.empty() ? "" : ", ") + std::to_string(r);
    throw checkpoint_error(who + ": the checkpoint of step " + std::to_string(step) +
                           " was not committed: rank" + (failed.size() > 1 ? "s " : " ") + list +
                           " could not write " + (failed.size() > 1 ? "their parts" : "its part") +
                           (write_error.empty() ? std::string(" (their errors say why)")
                                                : "; this rank's error: " + write_error));
  }

  // 4. Rank 0: one MANIFEST for the whole set, the commit, retention; then the outcome.
  std::array<double, 1> committed{1.0};
  std::string commit_error;
  std::filesystem::path final_path = root / step_dir_name(step);
  if (rank == 0) {
    try {
      for (int r = 0; r < ranks; ++r) {
        pc->add(idx.files[static_cast<std::size_t>(r)],
                detail::decode_shard_record(std::span<const double>(
                    all.data() + static_cast<std::size_t>(r) * detail::shard_record_size,
                    detail::shard_record_size)));
      }
      final_path = pc->commit();
    } catch (const std::exception& e) {
      commit_error = e.what();
      committed[0] = 0.0;
      pc->abort();
    }
    if (committed[0] == 1.0 && o.retention) {
      try {
        (void)apply_retention(root, *o.retention, step);
      } catch (const std::exception& e) {
        commit_error = e.what();
        committed[0] = 2.0;  // committed; the older checkpoints could not all be deleted
      }
    }
  }
  comm.broadcast(std::span<double>(committed), 0).wait();
  if (committed[0] == 2.0) {
    throw checkpoint_error(
        who + ": the checkpoint '" + final_path.string() +
        "' was committed, but the retention policy could not delete older "
        "checkpoints" +
        (commit_error.empty() ? std::string(" (rank 0's error says why)") : ": " + commit_error));
  }
  if (committed[0] != 1.0) {
    throw checkpoint_error(
        who + ": rank 0 could not commit the checkpoint under '" + root.string() + "'" +
        (commit_error.empty() ? std::string(" (rank 0's error says why)") : ": " + commit_error));
  }
  return final_path;
}

}  // namespace checkpoint
HONE_NAMESPACE_END
