// hone/rl/replay_io.hpp: saving a whole replay buffer (data, priorities, RNG, positions) into a
// directory atomically, and loading it back so that the buffer continues exactly as the saved
// one would have (the same add/sample/update sequence gives bit-identical batches, keys and
// weights):
//
//   hone::save_replay_buffer(buffer, "run/replay");   // run/replay appears, or is replaced, whole
//   ...
//   hone::load_replay_buffer(buffer, "run/replay");   // validated first; unchanged on error
//
// Directory (hone's checkpoint format, hone/checkpoint/verify.hpp; `hone-ckpt verify` reads it):
//   columns.safetensors     one tensor per transition field, named like the field, shape
//                           [capacity, field shape...], the field's dtype (hone/rl/
//                           field_layout.hpp); row s is slot s, also slots never written (zeros)
//   priorities.safetensors  prioritized buffers: "priorities", F32 [capacity], the stored (p^alpha)
//                           priority of every slot, 0 for empty slots
//   state.json              a hone-state file (hone/checkpoint/state.hpp): "step" = items ever
//                           added, and under "data" {"kind": "hone-replay-buffer", "version": 1,
//                           "capacity", "written", "sample_calls", "max_priority", "sampler"
//                           ("uniform" or "prioritized"), "rng" (the four xoshiro256++ words),
//                           "fields": [{"name", "dtype", "shape"}, ...]}
//   MANIFEST                size and XXH3-128 of each file above; written last
//
// Atomicity. The files go into a temporary sibling (.tmp-NAME-PID), are fsynced, the MANIFEST is
// written, and the directory takes its place in one step: rename(2) when `dir` does not exist,
// renameat2(RENAME_EXCHANGE) when it holds a previous save (then the old one, now at the
// temporary name, is removed), followed by an fsync of the parent. A kill at any moment leaves
// either the previous save or the new one at `dir`, never a mix. On a file system without
// RENAME_EXCHANGE the exchange falls back to two renames (the previous save is moved aside to
// .tmp-old-NAME-PID first); a kill between them leaves no `dir`, and load_replay_buffer then says
// where the previous save is. Temporaries left by killed saves (their process is gone) are removed
// by the next save to the same `dir`; load ignores them. `dir` must be absent, empty or a previous
// save (it has a MANIFEST): anything else is refused rather than replaced.
//
// Loading validates everything before it touches the buffer: the MANIFEST and every file's size
// and hash, state.json, the capacity, the sampler kind (uniform vs prioritized), the field list
// (names, dtypes, shapes, in order), the tensors' dtypes and shapes, the priorities (finite,
// >= 0, at most max_priority, 0 in slots never written) and the positions. Each problem is a
// hone::checkpoint_error naming the file and what is wrong; the buffer is then unchanged.
//
// Rules:
// - n-step windows. Steps pending in the buffer's own n-step window are not items yet and are not
//   saved: save_replay_buffer refuses (config_error) while pending() > 0; save at an episode
//   boundary (the window is empty after a terminated or truncated step) or flush() first. Windows
//   of writer() objects belong to their threads and are neither saved nor touched. Loading
//   likewise requires the buffer's own window to be empty.
// - many_writers. The save runs under the buffer's lock once the writes in flight are published
//   (hone::replay_buffer::with_snapshot): writers that start meanwhile wait, so the saved data is a
//   consistent snapshot and nothing in flight is lost or half-saved. Loading needs the writers
//   stopped: it refuses (config_error) while a write is in flight.
// - Storages: both in-memory storages save to the same file, and a save of either loads into
//   either (hone::ring_storage <-> hone::packed_storage). Columns (ring_storage) are written
//   straight from the storage's arrays (for_each_array) and read back into them. Packed records
//   (packed_storage) have no per-field arrays: the save gathers each field out of the records
//   into the tensor writer's reused staging buffer of about 1 MiB (whole items; one item of
//   the largest field if that is larger), writes it and gathers the next piece, so its temporary
//   memory is that buffer, not a copy of the data; the load scatters each tensor from the mapped
//   file into the records (a compressed columns file, which save never writes, costs one
//   tensor's size of staging). A buffer on hone::mmap_storage is its own file on disk and is not
//   saved this way (a compile error).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "hone/checkpoint/directory.hpp"
#include "hone/checkpoint/manifest.hpp"
#include "hone/checkpoint/safetensors.hpp"
#include "hone/checkpoint/state.hpp"
#include "hone/checkpoint/tensor_file.hpp"
#include "hone/checkpoint/verify.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/directory.hpp"
#include "hone/io/dtype.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/json.hpp"
#include "hone/rl/field_layout.hpp"
#include "hone/rl/replay_buffer.hpp"

HONE_NAMESPACE_BEGIN

/// The file names of a saved replay buffer.
namespace replay_files {
inline constexpr std::string_view columns = "columns.safetensors";
inline constexpr std::string_view priorities = "priorities.safetensors";
inline constexpr std::string_view state = "state.json";
}  // namespace replay_files

/// The "kind" and "version" under state.json's "data" of a saved replay buffer.
inline constexpr std::string_view replay_save_kind = "hone-replay-buffer";
inline constexpr std::uint64_t replay_save_version = 1;

namespace detail {

template <class Buffer>
inline constexpr bool replay_saveable_v = !Buffer::persistent;

inline std::string replay_dir_name(const std::filesystem::path& dir) {
  std::filesystem::path d = dir;
  if (!d.has_filename()) d = d.parent_path();  // "run/replay/" -> "run/replay"
  return d.filename().string();
}
inline std::filesystem::path replay_parent(const std::filesystem::path& dir) {
  std::filesystem::path d = dir;
  if (!d.has_filename()) d = d.parent_path();
  return d.parent_path().empty() ? std::filesystem::path(".") : d.parent_path();
}

// Removes .tmp-NAME-PID and .tmp-old-NAME-PID siblings of `dir` whose process is gone.
inline void clean_replay_leftovers(const std::filesystem::path& dir) {
  const std::filesystem::path parent = replay_parent(dir);
  const std::string name = replay_dir_name(dir);
  const std::string fresh = std::string(io::temp_prefix) + name + "-";
  const std::string old = std::string(io::temp_prefix) + "old-" + name + "-";
  std::vector<std::filesystem::path> victims;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(parent, ec)) {
    const std::string n = e.path().filename().string();
    const std::size_t prefix =
        n.starts_with(fresh) ? fresh.size() : (n.starts_with(old) ? old.size() : 0);
    if (prefix == 0) continue;
    const std::string_view pid_text = std::string_view(n).substr(prefix);
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string_view::npos) {
      continue;  // the temporary of another directory whose name starts the same way
    }
    if (io::temp_owner_alive(n)) continue;  // a live save of another process
    victims.push_back(e.path());
  }
  for (const auto& v : victims) io::remove_tree(v);
  if (!victims.empty()) io::sync_directory(parent);
}

[[noreturn]] inline void replay_load_fail(const std::filesystem::path& file,
                                          const std::string& what) {
  throw checkpoint_error("hone::load_replay_buffer: '" + file.string() + "': " + what);
}

// What state.json says, parsed and checked against nothing yet.
struct replay_saved_state {
  std::uint64_t capacity = 0;
  std::string sampler;
  replay_state state;
  std::vector<replay_field_desc> fields;
};

inline io::json::value field_list_json(const std::vector<replay_field_desc>& fields) {
  namespace json = io::json;
  json::value list = json::value::array();
  for (const auto& f : fields) {
    json::value o = json::value::object();
    o.set("name", json::value(f.name));
    o.set("dtype", json::value(io::dtype_name(f.type)));
    json::value shape = json::value::array();
    for (const std::uint64_t n : f.shape) shape.push_back(json::value(n));
    o.set("shape", std::move(shape));
    list.push_back(std::move(o));
  }
  return list;
}

inline replay_saved_state parse_replay_state(const std::filesystem::path& path) {
  namespace json = io::json;
  const checkpoint::training_state ts = checkpoint::read_state(path);
  const json::value& d = ts.data;
  replay_saved_state out;
  try {
    const json::value* kind = d.find("kind");
    if (kind == nullptr || !kind->is_string() || kind->as_string() != replay_save_kind) {
      replay_load_fail(path, "is not a saved replay buffer (its \"data\" has no \"kind\": \"" +
                                 std::string(replay_save_kind) + "\")");
    }
    const std::uint64_t version = d.at("version").as_u64();
    if (version != replay_save_version) {
      replay_load_fail(path, "is a replay buffer save of version " + std::to_string(version) +
                                 "; this hone reads version " +
                                 std::to_string(replay_save_version));
    }
    out.capacity = d.at("capacity").as_u64();
    out.sampler = d.at("sampler").as_string();
    out.state.written = d.at("written").as_u64();
    out.state.sample_calls = d.at("sample_calls").as_u64();
    out.state.max_priority = d.at("max_priority").as_float();
    const auto& rng = d.at("rng").as_array();
    if (rng.size() != out.state.rng.size()) {
      replay_load_fail(path, "\"rng\" must hold " + std::to_string(out.state.rng.size()) +
                                 " words, not " + std::to_string(rng.size()));
    }
    for (std::size_t i = 0; i < rng.size(); ++i) out.state.rng[i] = rng[i].as_u64();
    for (const auto& f : d.at("fields").as_array()) {
      replay_field_desc fd;
      fd.name = f.at("name").as_string();
      const auto t = io::dtype_from_name(f.at("dtype").as_string());
      if (!t) replay_load_fail(path, "field \"" + fd.name + "\" has an unknown dtype");
      fd.type = *t;
      for (const auto& n : f.at("shape").as_array()) fd.shape.push_back(n.as_u64());
      out.fields.push_back(std::move(fd));
    }
  } catch (const checkpoint_error& e) {
    const std::string what = e.what();
    if (what.starts_with("hone::load_replay_buffer")) throw;
    replay_load_fail(path, "its replay buffer state is malformed: " + what);
  } catch (const config_error& e) {  // a JSON value of the wrong kind
    replay_load_fail(path, std::string("its replay buffer state is malformed: ") + e.what());
  }
  if (ts.step != out.state.written) {
    replay_load_fail(path, "\"step\" (" + std::to_string(ts.step) + ") and \"written\" (" +
                               std::to_string(out.state.written) + ") disagree");
  }
  return out;
}

// Writes columns.safetensors of a buffer whose storage has no per-field arrays: byte for byte the
// file the column path writes (a checkpoint::tensor_writer with the fields added in order), each
// field added with add_gathered, so the writer gathers its rows out of the records through
// Buffer::read_field into its own staging buffer (about 1 MiB of whole rows) while it writes.
// Returns its size and XXH3-128.
template <class Buffer>
io::file_digest write_gathered_columns(const Buffer& buffer,
                                       const std::vector<replay_field_desc>& fields,
                                       const std::filesystem::path& path) {
  const std::uint64_t capacity = buffer.capacity();
  checkpoint::tensor_writer columns;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const replay_field_desc& f = fields[i];
    checkpoint::shape_type shape{capacity};
    shape.insert(shape.end(), f.shape.begin(), f.shape.end());
    columns.add_gathered(
        f.name, f.type, std::move(shape),
        [&buffer, i](std::uint64_t first, std::uint64_t, std::span<std::byte> out) {
          buffer.read_field(i, static_cast<std::size_t>(first), out);
        });
  }
  return checkpoint::write_tensors(columns, path);
}

// Moves the finished temporary directory into place (see the top of this file): the checkpoint
// commit, which exchanges it atomically with a previous save.
inline void commit_replay_dir(checkpoint::pending_checkpoint& pending,
                              const std::filesystem::path& /*dir*/) {
  pending.commit();
}

}  // namespace detail

/// Saves `buffer` (positions, RNG, sampler state, every column and priority) into directory
/// `dir`, atomically (see the top of this header). io_error when the disk refuses; config_error
/// when `dir` is something other than a previous save, or when the buffer's n-step window holds
/// pending steps.
template <class Buffer>
void save_replay_buffer(Buffer& buffer, const std::filesystem::path& dir) {
  static_assert(detail::replay_saveable_v<Buffer>,
                "hone::save_replay_buffer: this buffer's storage is hone::mmap_storage, which "
                "lives in its own file; call buffer.commit() to make it durable instead.");
  static_assert(
      Buffer::has_columns || detail::field_copy_replay_storage<typename Buffer::storage_type>,
      "hone::save_replay_buffer: this buffer's storage has neither one array per field "
      "(for_each_array) nor read_field/write_field; give it one of them (the storage "
      "interface is listed at the top of hone/rl/ring_storage.hpp).");
  using Transition = typename Buffer::transition_type;
  HONE_REQUIRE(!dir.empty(), "hone::save_replay_buffer: the directory path is empty");
  if (buffer.pending() > 0) {
    throw config_error("hone::save_replay_buffer: the buffer's n-step window holds " +
                       std::to_string(buffer.pending()) +
                       " pending steps, which are not items yet and would not be saved; save at "
                       "an episode boundary (after a terminated or truncated step) or call "
                       "flush() first");
  }
  std::error_code ec;
  if (std::filesystem::exists(dir, ec)) {
    const bool is_dir = std::filesystem::is_directory(dir, ec);
    const bool previous = is_dir && std::filesystem::exists(dir / checkpoint::files::manifest, ec);
    const bool empty = is_dir && std::filesystem::is_empty(dir, ec);
    if (!previous && !empty) {
      throw config_error("hone::save_replay_buffer: '" + dir.string() +
                         "' exists and is not a saved replay buffer (no MANIFEST); choose another "
                         "path or remove it");
    }
  }
  io::ensure_directory(detail::replay_parent(dir));
  detail::clean_replay_leftovers(dir);

  const std::vector<replay_field_desc> fields = replay_fields<Transition>();
  const std::uint64_t capacity = buffer.capacity();
  checkpoint::pending_checkpoint pending(detail::replay_parent(dir) / detail::replay_dir_name(dir));
  buffer.with_snapshot([&](const replay_state& s) {
    if constexpr (Buffer::has_columns) {
      // Columns: the storage's arrays, one per field, in field order, written without a copy.
      checkpoint::tensor_writer columns;
      std::size_t index = 0;
      buffer.for_each_column([&](std::string_view name, std::span<std::byte> bytes) {
        HONE_REQUIRE(
            index < fields.size() && name == fields[index].name,
            "hone::save_replay_buffer: the storage's arrays are not the transition's columns");
        const replay_field_desc& f = fields[index++];
        checkpoint::shape_type shape{capacity};
        shape.insert(shape.end(), f.shape.begin(), f.shape.end());
        columns.add(f.name, f.type, std::move(shape), bytes);
      });
      HONE_REQUIRE(
          index == fields.size(),
          "hone::save_replay_buffer: the storage's arrays are not the transition's columns");
      pending.add(std::string(replay_files::columns),
                  checkpoint::write_tensors(columns, pending.file(replay_files::columns)));
    } else {
      // Packed records: the same file, each field gathered out of the records piece by piece.
      pending.add(
          std::string(replay_files::columns),
          detail::write_gathered_columns(buffer, fields, pending.file(replay_files::columns)));
    }

    if constexpr (Buffer::is_prioritized) {
      checkpoint::tensor_writer pw;
      pw.add("priorities", checkpoint::shape_type{capacity}, buffer.priorities());
      pending.add(std::string(replay_files::priorities),
                  checkpoint::write_tensors(pw, pending.file(replay_files::priorities)));
    }

    namespace json = io::json;
    checkpoint::training_state ts;
    ts.step = s.written;
    json::value d = json::value::object();
    d.set("kind", json::value(replay_save_kind));
    d.set("version", replay_save_version);
    d.set("capacity", capacity);
    d.set("written", s.written);
    d.set("sample_calls", s.sample_calls);
    d.set("max_priority", s.max_priority);
    d.set("sampler", json::value(Buffer::is_prioritized ? "prioritized" : "uniform"));
    json::value rng = json::value::array();
    for (const std::uint64_t w : s.rng) rng.push_back(json::value(w));
    d.set("rng", std::move(rng));
    d.set("fields", detail::field_list_json(fields));
    ts.data = std::move(d);
    pending.add(std::string(replay_files::state),
                checkpoint::write_state(pending.file(replay_files::state), ts));
  });
  detail::commit_replay_dir(pending, dir);
}

/// Loads a buffer saved by save_replay_buffer from `dir` into `buffer` (same transition type and
/// capacity, same sampler kind; the policies' settings are the buffer's own). Everything is
/// validated before the buffer is touched: checkpoint_error naming the file and the problem for
/// a missing, damaged or mismatched save; config_error when the buffer's n-step window holds
/// pending steps or (many_writers) a write is in flight. Temporaries next to `dir` are ignored.
template <class Buffer>
void load_replay_buffer(Buffer& buffer, const std::filesystem::path& dir) {
  static_assert(detail::replay_saveable_v<Buffer>,
                "hone::load_replay_buffer: this buffer's storage is hone::mmap_storage, which "
                "reopens from its own file when the buffer is constructed.");
  static_assert(
      Buffer::has_columns || detail::field_copy_replay_storage<typename Buffer::storage_type>,
      "hone::load_replay_buffer: this buffer's storage has neither one array per field "
      "(for_each_array) nor read_field/write_field; give it one of them (the storage "
      "interface is listed at the top of hone/rl/ring_storage.hpp).");
  using Transition = typename Buffer::transition_type;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    std::string hint;
    const std::string old =
        std::string(io::temp_prefix) + "old-" + detail::replay_dir_name(dir) + "-";
    for (const auto& e : std::filesystem::directory_iterator(detail::replay_parent(dir), ec)) {
      if (e.path().filename().string().starts_with(old)) {
        hint = "; a save was interrupted while replacing it: the previous save is '" +
               e.path().string() + "' (rename it to '" + dir.string() + "')";
      }
    }
    throw checkpoint_error("hone::load_replay_buffer: '" + dir.string() +
                           "' is not a directory (no saved replay buffer there)" + hint);
  }
  // 1. Every file against the MANIFEST (size and XXH3-128).
  const checkpoint::verify_report report = checkpoint::verify_directory(dir, /*deep=*/false);
  report.require_ok(dir.string());
  const checkpoint::manifest m = checkpoint::manifest::read(dir / checkpoint::files::manifest);
  for (const std::string_view need : {replay_files::state, replay_files::columns}) {
    if (m.find(need) == nullptr) {
      detail::replay_load_fail(
          dir / checkpoint::files::manifest,
          "does not list " + std::string(need) + " (not a saved replay buffer)");
    }
  }

  // 2. state.json against this buffer.
  const std::filesystem::path state_path = dir / replay_files::state;
  const detail::replay_saved_state saved = detail::parse_replay_state(state_path);
  const std::uint64_t capacity = buffer.capacity();
  if (saved.capacity != capacity) {
    detail::replay_load_fail(state_path, "the saved buffer has capacity " +
                                             std::to_string(saved.capacity) + ", this buffer " +
                                             std::to_string(capacity) +
                                             "; construct the buffer with the saved capacity");
  }
  const std::string_view my_sampler = Buffer::is_prioritized ? "prioritized" : "uniform";
  if (saved.sampler != my_sampler) {
    detail::replay_load_fail(state_path, "the saved buffer has a " + saved.sampler +
                                             " sampler, this buffer a " + std::string(my_sampler) +
                                             " one");
  }
  const std::vector<replay_field_desc> fields = replay_fields<Transition>();
  if (saved.fields != fields) {
    detail::replay_load_fail(
        state_path, "the saved transition has the fields {" + replay_fields_text(saved.fields) +
                        "}, this buffer's {" + replay_fields_text(fields) + "}");
  }
  if (std::all_of(saved.state.rng.begin(), saved.state.rng.end(),
                  [](std::uint64_t w) { return w == 0; })) {
    detail::replay_load_fail(state_path, "the RNG state is all zeros (not a xoshiro256++ state)");
  }
  if (!(saved.state.max_priority > 0.0f) || !std::isfinite(saved.state.max_priority)) {
    detail::replay_load_fail(state_path, "max_priority must be finite and positive");
  }

  // 3. The columns: exactly the fields, with their dtypes and shapes.
  const std::filesystem::path columns_path = dir / replay_files::columns;
  const checkpoint::tensor_file columns = checkpoint::tensor_file::open(columns_path);
  if (columns.tensors().size() != fields.size()) {
    detail::replay_load_fail(columns_path, "holds " + std::to_string(columns.tensors().size()) +
                                               " tensors, the transition has " +
                                               std::to_string(fields.size()) + " fields");
  }
  std::vector<const checkpoint::tensor_info*> tensors;
  for (const auto& f : fields) {
    const checkpoint::tensor_info* t = columns.find(f.name);
    if (t == nullptr) detail::replay_load_fail(columns_path, "has no tensor \"" + f.name + "\"");
    checkpoint::shape_type shape{capacity};
    shape.insert(shape.end(), f.shape.begin(), f.shape.end());
    if (t->type != f.type || t->shape != shape) {
      detail::replay_load_fail(
          columns_path, "tensor \"" + f.name + "\" is " + std::string(io::dtype_name(t->type)) +
                            " " + checkpoint::shape_string(t->shape) + ", expected " +
                            std::string(io::dtype_name(f.type)) + " " +
                            checkpoint::shape_string(shape));
    }
    tensors.push_back(t);
  }

  // 4. The priorities.
  std::vector<float> priorities;
  if constexpr (Buffer::is_prioritized) {
    const std::filesystem::path ppath = dir / replay_files::priorities;
    if (m.find(replay_files::priorities) == nullptr) {
      detail::replay_load_fail(dir / checkpoint::files::manifest,
                               "does not list " + std::string(replay_files::priorities) +
                                   " (a prioritized buffer's save has one)");
    }
    const checkpoint::tensor_file pf = checkpoint::tensor_file::open(ppath);
    const checkpoint::tensor_info* t = pf.find("priorities");
    if (t == nullptr || t->type != io::dtype::f32 || t->shape != checkpoint::shape_type{capacity} ||
        pf.tensors().size() != 1) {
      detail::replay_load_fail(
          ppath, "must hold one tensor \"priorities\", F32 [" + std::to_string(capacity) + "]");
    }
    priorities.resize(static_cast<std::size_t>(capacity));
    pf.read(*t, std::as_writable_bytes(std::span<float>(priorities)));
    const std::uint64_t filled = std::min(saved.state.written, capacity);
    for (std::size_t s = 0; s < priorities.size(); ++s) {
      const float p = priorities[s];
      if (!std::isfinite(p) || p < 0.0f || p > saved.state.max_priority ||
          (s >= filled && p != 0.0f)) {
        detail::replay_load_fail(ppath, "priority " + std::to_string(s) + " is " +
                                            std::to_string(p) +
                                            " (priorities are finite, >= 0, at most max_priority "
                                            "and 0 in slots never written)");
      }
    }
  }

  // 5. The buffer must be quiet.
  if (buffer.pending() > 0) {
    throw config_error("hone::load_replay_buffer: the buffer's n-step window holds " +
                       std::to_string(buffer.pending()) +
                       " pending steps; reset or flush it before loading");
  }
  if (buffer.writes_in_flight() > 0) {
    throw config_error(
        "hone::load_replay_buffer: writes are in flight; stop the writers before "
        "loading");
  }

  // 6. Everything checked: write the columns and restore the state.
  if constexpr (Buffer::has_columns) {
    std::size_t index = 0;
    buffer.for_each_column([&](std::string_view /*name*/, std::span<std::byte> bytes) {
      columns.read(*tensors[index++], bytes);
    });
  } else {
    // Packed records: each tensor scattered into the records, straight from the mapped file (a
    // compressed file, which hone's save does not write, is decompressed one tensor at a time).
    std::vector<std::byte> staging;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      std::span<const std::byte> data;
      if (const checkpoint::safetensors_file* plain = columns.plain()) {
        data = plain->data(*tensors[i]);
      } else {
        staging.resize(static_cast<std::size_t>(tensors[i]->size_bytes()));
        columns.read(*tensors[i], staging);
        data = staging;
      }
      buffer.write_field(i, 0, data);
    }
  }
  buffer.restore(saved.state, std::span<const float>(priorities));
}

HONE_NAMESPACE_END
