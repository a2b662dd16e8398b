// hone/checkpoint/shard_index.hpp: the index of a sharded checkpoint (shards.json) and the reader
// of its optimizer state. hone/checkpoint/sharded.hpp writes such checkpoints (every rank of a
// ZeRO trainer writes its own shard); restore() (trainer_checkpoint.hpp), verify_directory() and
// hone-ckpt read them through this header, which needs no communicator.
//
// A sharded checkpoint directory holds
//   model.safetensors                      the whole fp32 master weights (rank 0)
//   state.json                             the training state (rank 0)
//   optimizer-00000-of-00002.safetensors   rank 0's pieces of the optimizer state (.hct when
//   optimizer-00001-of-00002.safetensors   compressed), rank 1's pieces, ...
//   shards.json                            this index: every logical tensor whole and its parts
//   MANIFEST                               size and XXH3-128 of every file above (one, rank 0)
//
// shards.json:
//   {"format": "hone-shards", "version": 1, "world_size": 2,
//    "files": ["optimizer-00000-of-00002.safetensors", "optimizer-00001-of-00002.safetensors"],
//    "tensors": [{"name": "exp_avg.layer1.weight", "dtype": "F32", "shape": [8, 6],
//                 "parts": [{"file": "optimizer-00000-of-00002.safetensors",
//                            "offset": 0, "count": 48}]}, ...]}
// A part is elements [offset, offset + count) of the whole tensor (row-major), stored in its file
// as a 1-D tensor named as the whole tensor; the parts of a tensor are in order and cover it
// exactly once. Each part file also carries its own index in its "__metadata__" ("hone.shard":
// rank, world size and, per piece, its offset and the whole tensor's element count).
//
//   const auto idx = ck::shard_index::read(dir / ck::files::shard_index);
//   ck::sharded_reader r(dir, idx);
//   r.read_range("exp_avg.layer1.weight", 16, out);   // elements [16, 16 + out.size()) of it
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hone/checkpoint/manifest.hpp"
#include "hone/checkpoint/safetensors.hpp"
#include "hone/checkpoint/tensor_file.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/dtype.hpp"
#include "hone/io/error.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/json.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

namespace files {
/// The index of a sharded checkpoint's optimizer state.
inline constexpr std::string_view shard_index = "shards.json";
}  // namespace files

/// The "format" field of shards.json and its version.
inline constexpr std::string_view shard_index_format = "hone-shards";
inline constexpr std::uint64_t shard_index_version = 1;
/// The largest shards.json a reader accepts.
inline constexpr std::uint64_t max_shard_index_bytes = std::uint64_t{64} << 20;

/// The name of rank `rank`'s optimizer-state file among `world_size` ranks:
/// "optimizer-00001-of-00004.safetensors" (".hct" when compressed).
[[nodiscard]] inline std::string shard_file_name(int rank, int world_size, bool compressed) {
  HONE_REQUIRE(world_size >= 1 && rank >= 0 && rank < world_size,
               "hone::checkpoint::shard_file_name: rank " + std::to_string(rank) + " of " +
                   std::to_string(world_size) + "; a rank must be in [0, world_size)");
  char buf[64];
  std::snprintf(buf, sizeof(buf), "optimizer-%05d-of-%05d.%s", rank, world_size,
                compressed ? "hct" : "safetensors");
  return buf;
}

/// One part of a logical tensor: elements [offset, offset + count) of it, in file `file`.
struct shard_part {
  std::string file;
  std::uint64_t offset = 0;
  std::uint64_t count = 0;
  friend bool operator==(const shard_part&, const shard_part&) = default;
};

/// A logical (whole) tensor of a sharded checkpoint and its parts, in element order.
struct sharded_tensor {
  std::string name;
  io::dtype type = io::dtype::f32;
  shape_type shape;
  std::vector<shard_part> parts;
  [[nodiscard]] std::uint64_t elements() const noexcept {
    std::uint64_t n = 1;
    for (const auto d : shape) n *= d;
    return n;
  }
  friend bool operator==(const sharded_tensor&, const sharded_tensor&) = default;
};

/// The contents of shards.json.
class shard_index {
 public:
  std::uint64_t world_size = 0;
  std::vector<std::string> files;  // the part files, rank order
  std::vector<sharded_tensor> tensors;

  /// The tensor called `name`, or nullptr.
  [[nodiscard]] const sharded_tensor* find(std::string_view name) const noexcept {
    for (const auto& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }

  /// The JSON text.
  [[nodiscard]] std::string to_json() const {
    namespace json = io::json;
    json::value o = json::value::object();
    o.set("format", std::string(shard_index_format));
    o.set("version", shard_index_version);
    o.set("world_size", world_size);
    json::value fs = json::value::array();
    for (const auto& f : files) fs.push_back(f);
    o.set("files", std::move(fs));
    json::value ts = json::value::array();
    for (const auto& t : tensors) {
      json::value e = json::value::object();
      e.set("name", t.name);
      e.set("dtype", std::string(io::dtype_name(t.type)));
      json::value sh = json::value::array();
      for (const auto d : t.shape) sh.push_back(d);
      e.set("shape", std::move(sh));
      json::value ps = json::value::array();
      for (const auto& p : t.parts) {
        json::value q = json::value::object();
        q.set("file", p.file);
        q.set("offset", p.offset);
        q.set("count", p.count);
        ps.push_back(std::move(q));
      }
      e.set("parts", std::move(ps));
      ts.push_back(std::move(e));
    }
    o.set("tensors", std::move(ts));
    return o.dump(1) + "\n";
  }

  /// Writes shards.json at `path` (fsynced when `sync`); returns its size and hash.
  io::file_digest write(const std::filesystem::path& path, bool sync = true) const {
    return io::write_file(path, to_json(), sync);
  }

  /// Parses shards.json text and checks it (check()); `context` (the path) starts every error.
  [[nodiscard]] static shard_index parse(std::string_view text, std::string_view context) {
    const std::string where = "hone: '" + std::string(context) + "': ";
    shard_index idx;
    try {
      const io::json::value v = io::json::parse(text, context);
      if (!v.is_object()) throw checkpoint_error("the index is not a JSON object");
      const auto& format = field(v, "format");
      if (!format.is_string() || format.as_string() != shard_index_format) {
        throw checkpoint_error("\"format\" is not \"" + std::string(shard_index_format) + "\"");
      }
      if (field(v, "version").as_u64() != shard_index_version) {
        throw checkpoint_error("unsupported version " + field(v, "version").dump() +
                               " (this hone reads version " + std::to_string(shard_index_version) +
                               ")");
      }
      idx.world_size = field(v, "world_size").as_u64();
      for (const auto& f : field(v, "files").as_array()) idx.files.push_back(f.as_string());
      for (const auto& t : field(v, "tensors").as_array()) {
        sharded_tensor st;
        st.name = field(t, "name").as_string();
        const auto type = io::dtype_from_name(field(t, "dtype").as_string());
        if (!type) {
          throw checkpoint_error("tensor '" + st.name + "' has an unknown dtype \"" +
                                 field(t, "dtype").as_string() + "\"");
        }
        st.type = *type;
        for (const auto& d : field(t, "shape").as_array()) st.shape.push_back(d.as_u64());
        for (const auto& p : field(t, "parts").as_array()) {
          st.parts.push_back({field(p, "file").as_string(), field(p, "offset").as_u64(),
                              field(p, "count").as_u64()});
        }
        idx.tensors.push_back(std::move(st));
      }
    } catch (const error& e) {
      const std::string what = e.what();
      if (what.starts_with("hone: '")) throw checkpoint_error(what);
      throw checkpoint_error(where + what);
    }
    const auto problems = idx.check();
    if (!problems.empty()) throw checkpoint_error(where + problems.front());
    return idx;
  }

  /// Reads and parses shards.json at `path`.
  [[nodiscard]] static shard_index read(const std::filesystem::path& path) {
    return parse(io::read_small_file(path, max_shard_index_bytes), path.string());
  }

  /// The index's own consistency, one sentence per problem: a world size of at least one with
  /// one file per rank, valid and distinct file names, and every tensor's parts in order, each in
  /// one of the files, covering the tensor exactly once.
  [[nodiscard]] std::vector<std::string> check() const {
    std::vector<std::string> problems;
    if (world_size == 0) problems.push_back("the world size is 0; a checkpoint has 1 rank or more");
    if (files.size() != world_size) {
      problems.push_back("the index lists " + std::to_string(files.size()) +
                         " part files for a world size of " + std::to_string(world_size) +
                         "; every rank writes one");
    }
    for (std::size_t i = 0; i < files.size(); ++i) {
      if (!is_valid_manifest_name(files[i])) {
        problems.push_back("part file name \"" + io::escaped(files[i], 64) + "\" is not valid");
      }
      for (std::size_t j = 0; j < i; ++j) {
        if (files[j] == files[i])
          problems.push_back("part file '" + files[i] + "' is listed twice");
      }
    }
    for (const auto& t : tensors) {
      std::uint64_t at = 0;
      bool in_order = true;
      for (const auto& p : t.parts) {
        if (std::find(files.begin(), files.end(), p.file) == files.end()) {
          problems.push_back("a part of tensor '" + t.name + "' is in '" + p.file +
                             "', which is not one of the index's part files");
        }
        if (p.offset != at || p.count == 0) {
          problems.push_back("the parts of tensor '" + t.name +
                             "' do not cover it in order: " + "a part starts at element " +
                             std::to_string(p.offset) + " (count " + std::to_string(p.count) +
                             "), the previous one ended at " + std::to_string(at));
          in_order = false;
          break;
        }
        at += p.count;
      }
      if (in_order && at != t.elements()) {
        problems.push_back("the parts of tensor '" + t.name + "' cover " + std::to_string(at) +
                           " of its " + std::to_string(t.elements()) + " elements (shape " +
                           shape_string(t.shape) + "): a part is missing");
      }
    }
    return problems;
  }

  /// Checks the index against the checkpoint's MANIFEST and part files in `dir`: every part file
  /// is listed in the MANIFEST, and (when `open_parts`) holds each of its pieces as a tensor of
  /// the part's element count. One sentence per problem naming the rank and file.
  [[nodiscard]] std::vector<std::string> check_against(const manifest& m,
                                                       const std::filesystem::path& dir,
                                                       bool open_parts = true) const {
    std::vector<std::string> problems = check();
    if (!problems.empty()) return problems;
    for (std::size_t r = 0; r < files.size(); ++r) {
      const std::string rank = "rank " + std::to_string(r) + " of " + std::to_string(world_size);
      if (m.find(files[r]) == nullptr) {
        problems.push_back("the part file '" + files[r] + "' of " + rank +
                           " is not listed in the MANIFEST: the checkpoint is missing that "
                           "rank's part of the optimizer state");
        continue;
      }
      if (!open_parts) continue;
      try {
        const tensor_file f = tensor_file::open(dir / files[r]);
        for (const auto& t : tensors) {
          for (const auto& p : t.parts) {
            if (p.file != files[r]) continue;
            const tensor_info* info = f.find(t.name);
            if (info == nullptr || info->elements() != p.count) {
              problems.push_back("'" + (dir / files[r]).string() + "' (" + rank + ") " +
                                 (info == nullptr
                                      ? "has no piece of tensor '" + t.name + "'"
                                      : "holds " + std::to_string(info->elements()) +
                                            " elements of tensor '" + t.name +
                                            "', the index says " + std::to_string(p.count)));
            }
          }
        }
      } catch (const error& e) {
        problems.push_back(e.what());
      }
    }
    return problems;
  }

 private:
  static const io::json::value& field(const io::json::value& o, std::string_view name) {
    const io::json::value* v = o.find(name);
    if (v == nullptr) throw checkpoint_error("the field \"" + std::string(name) + "\" is missing");
    return *v;
  }
};

/// Whether the checkpoint directory `dir` is sharded (holds shards.json).
[[nodiscard]] inline bool is_sharded_checkpoint(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::exists(dir / files::shard_index, ec);
}

/// Reads element ranges of a sharded checkpoint's logical tensors, opening only the part files
/// that overlap the ranges asked for (each once).
class sharded_reader {
 public:
  sharded_reader(std::filesystem::path dir, shard_index index)
      : dir_(std::move(dir)), index_(std::move(index)) {}

  [[nodiscard]] const shard_index& index() const noexcept { return index_; }
  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_; }

  /// The logical tensor `name`; checkpoint_error naming it and the directory when absent.
  [[nodiscard]] const sharded_tensor& at(std::string_view name) const {
    const sharded_tensor* t = index_.find(name);
    if (t == nullptr) {
      throw checkpoint_error("hone: sharded checkpoint '" + dir_.string() + "' has no tensor '" +
                             std::string(name) + "' (listed in " + std::string(files::shard_index) +
                             ")");
    }
    return *t;
  }

  /// Reads elements [start, start + out.size()) of tensor `name` into `out` (as float), from the
  /// parts that overlap them. checkpoint_error when the range is outside the tensor.
  void read_range(std::string_view name, std::uint64_t start, std::span<float> out) {
    const sharded_tensor& t = at(name);
    const std::uint64_t end = start + out.size();
    if (end > t.elements()) {
      throw checkpoint_error("hone: sharded checkpoint '" + dir_.string() + "': tensor '" + t.name +
                             "' has " + std::to_string(t.elements()) + " elements, elements [" +
                             std::to_string(start) + ", " + std::to_string(end) +
                             ") were asked for");
    }
    for (const auto& p : t.parts) {
      const std::uint64_t a = std::max(start, p.offset), b = std::min(end, p.offset + p.count);
      if (a >= b) continue;
      const tensor_file& f = open(p.file);
      piece_.resize(static_cast<std::size_t>(p.count));
      f.read_into(t.name, std::span<float>(piece_));
      std::copy_n(piece_.begin() + static_cast<std::ptrdiff_t>(a - p.offset), b - a,
                  out.begin() + static_cast<std::ptrdiff_t>(a - start));
    }
  }

  /// Reads the whole tensor `name` (as float).
  [[nodiscard]] std::vector<float> read_whole(std::string_view name) {
    std::vector<float> v(static_cast<std::size_t>(at(name).elements()));
    read_range(name, 0, v);
    return v;
  }

  /// The part files opened so far (what a rank of a resume read).
  [[nodiscard]] std::vector<std::string> opened() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : open_) out.push_back(k);
    return out;
  }

 private:
  const tensor_file& open(const std::string& file) {
    auto it = open_.find(file);
    if (it == open_.end()) {
      it = open_.emplace(file, std::make_unique<tensor_file>(tensor_file::open(dir_ / file))).first;
    }
    return *it->second;
  }

  std::filesystem::path dir_;
  shard_index index_;
  std::map<std::string, std::unique_ptr<tensor_file>, std::less<>> open_;
  std::vector<float> piece_;
};

}  // namespace checkpoint
HONE_NAMESPACE_END
