// hone-ckpt: inspect, verify, convert and compare hone checkpoints.
//
//   hone-ckpt info DIR                          tensors (dtype, shape, bytes) and state.json
//   hone-ckpt verify DIR                        exit 0 when valid; 1 and a one-line reason if not
//   hone-ckpt convert DIR --to safetensors OUT  a checkpoint with plain safetensors files
//   hone-ckpt convert DIR --to bf16 OUT         ... with every float tensor stored as BF16
//   hone-ckpt convert DIR --to file OUT         one safetensors file OUT of every tensor, whole
//   hone-ckpt diff A B                          max |a - b| per tensor
//
// DIR may also be a run's root (holding step-N directories): the newest valid checkpoint is used.
// A sharded checkpoint (hone/checkpoint/sharded.hpp: one optimizer part file per rank and
// shards.json) is read as one: info lists its logical tensors and parts, verify checks every part
// against the one MANIFEST and the index, convert --to safetensors|bf16 writes an ordinary
// (consolidated) checkpoint with optimizer.safetensors of whole tensors, --to file one file.
// Exit status: 0 done, 1 invalid checkpoint or runtime error, 2 usage error.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <hone/checkpoint/directory.hpp>
#include <hone/checkpoint/shard_index.hpp>
#include <hone/checkpoint/state.hpp>
#include <hone/checkpoint/tensor_file.hpp>
#include <hone/checkpoint/tensor_writer.hpp>
#include <hone/checkpoint/verify.hpp>
#include <hone/core/error.hpp>
#include <hone/io/directory.hpp>
#include <hone/io/dtype.hpp>
#include <hone/io/file_io.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fs = std::filesystem;
namespace ck = hone::checkpoint;
namespace io = hone::io;

namespace {

constexpr const char* usage_text =
    "usage: hone-ckpt info DIR\n"
    "       hone-ckpt verify DIR\n"
    "       hone-ckpt convert DIR --to safetensors|bf16|file OUT\n"
    "       hone-ckpt diff A B\n"
    "DIR is a checkpoint directory, or a run's root holding step-N checkpoints (the newest valid\n"
    "one is used); it may be sharded (one optimizer part per rank). --to file writes one\n"
    "safetensors file OUT holding every tensor whole (weights, then optimizer state).\n"
    "Exit status: 0 done, 1 invalid checkpoint or error, 2 usage error.\n";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "hone-ckpt: %s\n%s", why.c_str(), usage_text);
  std::exit(2);
}

/// A checkpoint directory: DIR itself, or the newest valid step-N under it.
fs::path resolve(const fs::path& dir) {
  if (!fs::is_directory(dir))
    throw hone::io_error("hone-ckpt: '" + dir.string() + "' is not a directory");
  if (fs::exists(dir / ck::files::manifest) || ck::list_checkpoints(dir).empty()) return dir;
  const auto c = ck::newest_valid(dir);
  if (!c)
    throw hone::checkpoint_error("hone-ckpt: no valid checkpoint under '" + dir.string() + "'");
  return c->path;
}

/// The tensor files of a checkpoint, by their plain name (weights, optimizer), in either format.
struct tensor_files {
  std::vector<std::pair<std::string, ck::tensor_file>> files;  // (plain name, file)
};
tensor_files open_tensor_files(const fs::path& dir) {
  tensor_files out;
  const std::pair<std::string_view, std::string_view> kinds[] = {
      {ck::files::weights, ck::files::weights_compressed},
      {ck::files::optimizer, ck::files::optimizer_compressed}};
  for (const auto& [plain, packed] : kinds) {
    if (fs::exists(dir / plain)) {
      out.files.emplace_back(std::string(plain), ck::tensor_file::open(dir / plain));
    } else if (fs::exists(dir / packed)) {
      out.files.emplace_back(std::string(plain), ck::tensor_file::open(dir / packed));
    }
  }
  return out;
}

/// A sharded checkpoint's optimizer state (nothing for an ordinary checkpoint).
std::optional<ck::sharded_reader> open_shards(const fs::path& dir) {
  if (!ck::is_sharded_checkpoint(dir)) return std::nullopt;
  return ck::sharded_reader(dir, ck::shard_index::read(dir / ck::files::shard_index));
}

/// A tensor read whole, stored as `stored`, for a tensor_writer (which borrows the bytes).
struct whole_tensor {
  std::string name;
  io::dtype stored;
  ck::shape_type shape;
  std::vector<std::byte> bytes;
};

/// Every tensor of one tensor file, in file order, as `bf16` asks.
void read_file_tensors(const ck::tensor_file& f, bool bf16, std::vector<whole_tensor>& out);

/// The whole optimizer tensors of a sharded checkpoint, in index order, as `bf16` asks.
void read_sharded_tensors(ck::sharded_reader& r, bool bf16, std::vector<whole_tensor>& out);

std::string human_bytes(std::uint64_t b) {
  char buf[64];
  if (b >= (std::uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(b) / (1 << 30));
  } else if (b >= (std::uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(b) / (1 << 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof(buf), "%.2f KiB", static_cast<double>(b) / 1024);
  } else {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(b));
  }
  return buf;
}

int cmd_info(const fs::path& arg) {
  const fs::path dir = resolve(arg);
  std::printf("checkpoint %s\n", dir.string().c_str());
  for (const auto& [name, f] : open_tensor_files(dir).files) {
    std::uint64_t total = 0;
    for (const auto& t : f.tensors()) total += t.size_bytes();
    std::printf("%s (%s, %zu tensors, %s of data, file %s)\n", name.c_str(),
                f.format() == ck::tensor_format::compressed ? "compressed" : "safetensors",
                f.tensors().size(), human_bytes(total).c_str(), human_bytes(f.file_size()).c_str());
    for (const auto& t : f.tensors()) {
      std::string stored;
      if (const ck::compressed_file* c = f.compressed()) {
        stored = " (" + std::string(ck::encoding_name(c->transform(t))) + ", " +
                 human_bytes(c->stored_bytes(t)) + " stored)";
      }
      std::printf("  %-40s %-5s %-18s %s%s\n", t.name.c_str(),
                  std::string(io::dtype_name(t.type)).c_str(), ck::shape_string(t.shape).c_str(),
                  human_bytes(t.size_bytes()).c_str(), stored.c_str());
    }
  }
  if (auto shards = open_shards(dir)) {
    const ck::shard_index& idx = shards->index();
    std::printf("optimizer state sharded over %llu ranks (%s, %zu tensors)\n",
                static_cast<unsigned long long>(idx.world_size),
                std::string(ck::files::shard_index).c_str(), idx.tensors.size());
    for (std::size_t r = 0; r < idx.files.size(); ++r) {
      const ck::tensor_file f = ck::tensor_file::open(dir / idx.files[r]);
      std::printf("  rank %zu: %s (%zu pieces, file %s)\n", r, idx.files[r].c_str(),
                  f.tensors().size(), human_bytes(f.file_size()).c_str());
    }
    for (const auto& t : idx.tensors) {
      std::string parts;
      for (const auto& p : t.parts) {
        const auto rank = std::find(idx.files.begin(), idx.files.end(), p.file) - idx.files.begin();
        parts += (parts.empty() ? "" : " ") + std::string("r") + std::to_string(rank) + "[" +
                 std::to_string(p.offset) + "+" + std::to_string(p.count) + "]";
      }
      std::printf("  %-40s %-5s %-18s %s\n", t.name.c_str(),
                  std::string(io::dtype_name(t.type)).c_str(), ck::shape_string(t.shape).c_str(),
                  parts.c_str());
    }
  }
  if (fs::exists(dir / ck::files::state)) {
    const ck::training_state s = ck::read_state(dir / ck::files::state);
    std::printf("state: step %llu\n", static_cast<unsigned long long>(s.step));
    if (s.loss_scale) {
      std::printf(
          "  loss scale %g (growth tracker %d, hysteresis tracker %d, skipped steps %llu)\n",
          static_cast<double>(s.loss_scale->scale), s.loss_scale->growth_tracker,
          s.loss_scale->hysteresis_tracker,
          static_cast<unsigned long long>(s.loss_scale->skipped_steps));
    }
    std::printf("  schedule %s\n  data %s\n", s.schedule.dump().c_str(), s.data.dump().c_str());
    for (const auto& [k, v] : s.rng) {
      std::printf("  rng %s (%zu characters of engine state)\n", k.c_str(), v.size());
    }
    for (const auto& [k, v] : s.metadata) std::printf("  metadata %s = %s\n", k.c_str(), v.c_str());
  }
  return 0;
}

int cmd_verify(const fs::path& arg) {
  if (!fs::is_directory(arg)) {
    std::printf("invalid: '%s' is not a directory\n", arg.string().c_str());
    return 1;
  }
  const fs::path dir = resolve(arg);
  const ck::verify_report r = ck::verify_directory(dir, true);
  if (!r.ok()) {
    std::string reason = r.problems.front();
    std::replace(reason.begin(), reason.end(), '\n', ' ');
    std::printf("invalid: %s\n", reason.c_str());
    return 1;
  }
  std::string sharded;
  if (ck::is_sharded_checkpoint(dir)) {
    sharded = ", optimizer state sharded over " +
              std::to_string(ck::shard_index::read(dir / ck::files::shard_index).world_size) +
              " ranks";
  }
  std::printf("ok: %s (%zu files, %s hashed%s)\n", dir.string().c_str(), r.files_checked,
              human_bytes(r.bytes_hashed).c_str(), sharded.c_str());
  return 0;
}

bool is_float(io::dtype t) {
  return t == io::dtype::f16 || t == io::dtype::bf16 || t == io::dtype::f32 || t == io::dtype::f64;
}

void read_file_tensors(const ck::tensor_file& f, bool bf16, std::vector<whole_tensor>& out) {
  std::vector<ck::tensor_info> order(f.tensors().begin(), f.tensors().end());
  std::sort(order.begin(), order.end(),
            [](const ck::tensor_info& a, const ck::tensor_info& b) { return a.begin < b.begin; });
  for (const auto& t : order) {
    const io::dtype stored = bf16 && is_float(t.type) ? io::dtype::bf16 : t.type;
    whole_tensor& w = out.emplace_back(whole_tensor{t.name, stored, t.shape, {}});
    w.bytes.resize(static_cast<std::size_t>(t.elements() * io::dtype_size(stored)));
    f.read(t, w.bytes, stored);
  }
}

void read_sharded_tensors(ck::sharded_reader& r, bool bf16, std::vector<whole_tensor>& out) {
  for (const auto& t : r.index().tensors) {
    if (t.type != io::dtype::f32) {
      throw hone::checkpoint_error(
          "hone-ckpt: tensor '" + t.name + "' of sharded checkpoint '" + r.directory().string() +
          "' is " + std::string(io::dtype_name(t.type)) + "; this hone-ckpt merges F32 parts only");
    }
    const std::vector<float> v = r.read_whole(t.name);
    const io::dtype stored = bf16 ? io::dtype::bf16 : io::dtype::f32;
    whole_tensor& w = out.emplace_back(whole_tensor{t.name, stored, t.shape, {}});
    w.bytes.resize(v.size() * io::dtype_size(stored));
    io::convert(std::as_bytes(std::span<const float>(v)), io::dtype::f32, w.bytes, stored);
  }
}

/// One safetensors file `out` holding every tensor of the checkpoint `dir` whole: the weights,
/// then the optimizer state (merged from its parts when sharded).
int convert_to_file(const fs::path& dir, const fs::path& out) {
  std::vector<whole_tensor> all;
  for (const auto& [name, f] : open_tensor_files(dir).files) read_file_tensors(f, false, all);
  if (auto shards = open_shards(dir)) read_sharded_tensors(*shards, false, all);
  ck::tensor_writer w;
  w.set_order(ck::tensor_order::as_added);
  for (const auto& t : all) w.add(t.name, t.stored, t.shape, t.bytes);
  w.set_metadata("format", "pt");
  const fs::path parent = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  const fs::path temp = hone::io::temp_sibling(out);
  (void)w.write(temp);
  hone::io::rename_path(temp, out);
  hone::io::sync_directory(parent);
  std::printf("wrote %s (%zu tensors, whole)\n", out.string().c_str(), all.size());
  return 0;
}

int cmd_convert(const fs::path& arg, std::string_view to, const fs::path& out) {
  const bool bf16 = to == "bf16";
  const fs::path dir = resolve(arg);
  ck::verify_directory(dir, true).require_ok(dir.string());
  if (fs::exists(out)) throw hone::io_error("hone-ckpt: '" + out.string() + "' already exists");
  if (to == "file") return convert_to_file(dir, out);
  ck::pending_checkpoint pc(out);
  auto shards = open_shards(dir);
  auto tensor_files = open_tensor_files(dir).files;
  const auto write_one = [&](const std::string& name, const std::vector<whole_tensor>& ts,
                             const ck::metadata_map& metadata) {
    ck::tensor_writer w;
    w.set_order(ck::tensor_order::as_added);
    for (const auto& t : ts) w.add(t.name, t.stored, t.shape, t.bytes);
    for (const auto& [k, v] : metadata) w.set_metadata(k, v);
    pc.add(name, w.write(pc.file(name)));
  };
  for (const auto& [name, f] : tensor_files) {
    std::vector<whole_tensor> ts;
    read_file_tensors(f, bf16, ts);
    write_one(name, ts, f.metadata());
  }
  if (shards) {  // the parts merged into whole tensors: an ordinary checkpoint
    std::vector<whole_tensor> ts;
    read_sharded_tensors(*shards, bf16, ts);
    write_one(std::string(ck::files::optimizer), ts, {});
  }
  if (fs::exists(dir / ck::files::state)) {
    pc.add(std::string(ck::files::state),
           io::write_file(pc.file(ck::files::state),
                          io::read_small_file(dir / ck::files::state, ck::max_state_bytes)));
  }
  pc.commit();
  std::printf("wrote %s (%s)\n", out.string().c_str(),
              bf16 ? "float tensors as BF16" : "plain safetensors");
  return 0;
}

int cmd_diff(const fs::path& a_arg, const fs::path& b_arg) {
  const fs::path a = resolve(a_arg), b = resolve(b_arg);
  const auto fa = open_tensor_files(a), fb = open_tensor_files(b);
  std::printf("%-22s %-40s %s\n", "file", "tensor", "max_abs_diff");
  for (const auto& entry : fa.files) {
    const std::string& name = entry.first;  // not a structured binding: lambdas capture it
    const ck::tensor_file& x = entry.second;
    const auto it = std::find_if(fb.files.begin(), fb.files.end(),
                                 [&](const auto& p) { return p.first == name; });
    if (it == fb.files.end()) {
      std::printf("%-22s only in A\n", name.c_str());
      continue;
    }
    const ck::tensor_file& y = it->second;
    for (const auto& t : x.tensors()) {
      const ck::tensor_info* u = y.find(t.name);
      if (u == nullptr) {
        std::printf("%-22s %-40s only in A\n", name.c_str(), t.name.c_str());
      } else if (u->shape != t.shape) {
        std::printf("%-22s %-40s shapes differ: %s vs %s\n", name.c_str(), t.name.c_str(),
                    ck::shape_string(t.shape).c_str(), ck::shape_string(u->shape).c_str());
      } else if (is_float(t.type) && is_float(u->type)) {
        const auto va = x.read_as<double>(t.name), vb = y.read_as<double>(t.name);
        double m = 0.0;
        for (std::size_t i = 0; i < va.size(); ++i) {
          const double d = std::fabs(va[i] - vb[i]);
          if (std::isnan(d)) {
            m = d;
            break;
          }
          m = std::max(m, d);
        }
        std::printf("%-22s %-40s %.9g\n", name.c_str(), t.name.c_str(), m);
      } else {
        std::vector<std::byte> ba(t.size_bytes()), bb(u->size_bytes());
        x.read(t, ba);
        y.read(*u, bb);
        std::printf("%-22s %-40s %s\n", name.c_str(), t.name.c_str(),
                    t.type == u->type && ba == bb ? "identical" : "differ (not float)");
      }
    }
    for (const auto& u : y.tensors()) {
      if (x.find(u.name) == nullptr)
        std::printf("%-22s %-40s only in B\n", name.c_str(), u.name.c_str());
    }
  }
  for (const auto& entry : fb.files) {
    const std::string& name = entry.first;
    if (std::none_of(fa.files.begin(), fa.files.end(),
                     [&](const auto& p) { return p.first == name; })) {
      std::printf("%-22s only in B\n", name.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage("missing command");
  const std::string_view cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(usage_text, stdout);
    return 0;
  }
  try {
    if (cmd == "info") {
      if (argc != 3) usage("info takes one directory");
      return cmd_info(argv[2]);
    }
    if (cmd == "verify") {
      if (argc != 3) usage("verify takes one directory");
      return cmd_verify(argv[2]);
    }
    if (cmd == "convert") {
      if (argc != 6 || std::string_view(argv[3]) != "--to")
        usage("convert takes DIR --to safetensors|bf16|file OUT");
      const std::string_view to = argv[4];
      if (to != "safetensors" && to != "bf16" && to != "file") {
        usage("--to must be safetensors, bf16 or file, got '" + std::string(to) + "'");
      }
      return cmd_convert(argv[2], to, argv[5]);
    }
    if (cmd == "diff") {
      if (argc != 4) usage("diff takes two directories");
      return cmd_diff(argv[2], argv[3]);
    }
    usage("unknown command '" + std::string(cmd) + "'");
  } catch (const std::exception& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    if (cmd == "verify") {
      std::printf("invalid: %s\n", msg.c_str());
    } else {
      std::fprintf(stderr, "hone-ckpt: %s\n", msg.c_str());
    }
    return 1;
  }
}
