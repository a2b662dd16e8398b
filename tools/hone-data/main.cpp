// hone-data: pack, inspect, verify and print hone record shards (hone/data/shard.hpp).
//
//   hone-data pack FILE OUTDIR [--name N] [--format text|jsonl|csv] [--frame-bytes B]
//                  [--shard-bytes B] [--level L]    one record per line (jsonl: each line must be
//                                                   valid JSON; csv: per RFC 4180 record) into
//                                                   OUTDIR/N-00000.hshard, ...
//   hone-data info SHARDS...                        records, frames, sizes and ratio per shard
//   hone-data verify SHARDS...                      decodes every frame and checks every checksum
//   hone-data cat SHARDS... [--records I:J]         records I to J-1 (all by default), one a line
//
// SHARDS are shard files or directories (every *.hshard in them, in name order); records are
// numbered across them in the order given. Exit status: 0 done, 1 damaged shard or runtime error
// (verify prints "invalid: " and the reason), 2 usage error.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <hone/core/error.hpp>
#include <hone/data/line_dataset.hpp>
#include <hone/data/shard.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fs = std::filesystem;
namespace data = hone::data;

namespace {

constexpr const char* usage_text =
    "usage: hone-data pack FILE OUTDIR [--name N] [--format text|jsonl|csv] [--frame-bytes B]\n"
    "                      [--shard-bytes B] [--level L]\n"
    "       hone-data info SHARDS...\n"
    "       hone-data verify SHARDS...\n"
    "       hone-data cat SHARDS... [--records I:J]\n"
    "pack writes one record per line of FILE (per CSV record with --format csv; with --format\n"
    "jsonl each line must be valid JSON) to OUTDIR/N-00000.hshard, ... (N: FILE's stem).\n"
    "SHARDS are .hshard files or directories holding them. cat prints records I to J-1, each\n"
    "followed by a newline. Exit status: 0 done, 1 damaged shard or error, 2 usage error.\n";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "hone-data: %s\n%s", why.c_str(), usage_text);
  std::exit(2);
}

std::uint64_t parse_count(std::string_view option, std::string_view text) {
  std::uint64_t v = 0;
  if (text.empty() || text.size() > 18)
    usage(std::string(option) + " takes a number, got '" + std::string(text) + "'");
  for (const char c : text) {
    if (c < '0' || c > '9') {
      usage(std::string(option) + " takes a number, got '" + std::string(text) + "'");
    }
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return v;
}

/// The shard files named by the arguments (files as they are, directories expanded).
std::vector<fs::path> shard_paths(const std::vector<std::string>& args) {
  std::vector<fs::path> out;
  for (const auto& a : args) {
    if (fs::is_directory(a)) {
      std::vector<fs::path> found;
      for (const auto& e : fs::directory_iterator(a)) {
        if (e.is_regular_file() && e.path().extension() == data::shard_suffix) {
          found.push_back(e.path());
        }
      }
      if (found.empty()) {
        throw hone::io_error("directory '" + a + "' holds no " + std::string(data::shard_suffix) +
                             " files");
      }
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else {
      out.emplace_back(a);
    }
  }
  return out;
}

std::string ratio(std::uint64_t decoded, std::uint64_t stored) {
  if (stored == 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f",
                static_cast<double>(decoded) / static_cast<double>(stored));
  return buf;
}

int cmd_pack(const std::vector<std::string>& args) {
  if (args.size() < 2) usage("pack takes FILE OUTDIR");
  const fs::path input = args[0], outdir = args[1];
  std::string name = input.stem().string();
  data::line_format format = data::line_format::text;
  data::shard_options opt;
  for (std::size_t i = 2; i < args.size(); i += 2) {
    const std::string& o = args[i];
    if (i + 1 >= args.size()) usage(o + " needs a value");
    const std::string& v = args[i + 1];
    if (o == "--name") {
      name = v;
    } else if (o == "--format") {
      if (v == "text") {
        format = data::line_format::text;
      } else if (v == "jsonl") {
        format = data::line_format::jsonl;
      } else if (v == "csv") {
        format = data::line_format::csv;
      } else {
        usage("--format must be text, jsonl or csv, got '" + v + "'");
      }
    } else if (o == "--frame-bytes") {
      opt.frame_bytes = static_cast<std::size_t>(parse_count(o, v));
    } else if (o == "--shard-bytes") {
      opt.shard_bytes = parse_count(o, v);
    } else if (o == "--level") {
      opt.level = static_cast<int>(parse_count(o, v));
    } else {
      usage("unknown pack option '" + o + "'");
    }
  }
  fs::create_directories(outdir);
  if (!data::list_shards(outdir, name).empty()) {
    throw hone::io_error("'" + outdir.string() + "' already holds shards named '" + name + "-*" +
                         std::string(data::shard_suffix) +
                         "'; remove them or choose another --name");
  }
  data::line_dataset_options lopt;
  lopt.save_index = false;  // leave the input's directory as it was
  const data::line_dataset ds(input, format, lopt);
  data::shard_writer w(outdir, name, opt);
  for (std::size_t i = 0; i < ds.size(); ++i) {
    if (format == data::line_format::jsonl) (void)ds.json(i);  // refuses a bad line, naming it
    w.add(ds.get(i));
  }
  const auto shards = w.finish();
  std::uint64_t bytes = 0, frames = 0;
  for (const auto& s : shards) {
    bytes += s.bytes;
    frames += s.frames;
  }
  std::printf("packed %zu records from '%s' into %zu shards (%llu frames, %llu bytes) in '%s'\n",
              ds.size(), input.string().c_str(), shards.size(),
              static_cast<unsigned long long>(frames), static_cast<unsigned long long>(bytes),
              outdir.string().c_str());
  return 0;
}

int cmd_info(const std::vector<std::string>& args) {
  if (args.empty()) usage("info takes one or more shard files or directories");
  std::uint64_t records = 0, frames = 0, stored = 0, decoded = 0;
  const auto paths = shard_paths(args);
  for (const auto& p : paths) {
    const auto f = data::shard_file::open(p);
    std::uint64_t d = 0, largest = 0;
    for (const auto& e : f.frames()) {
      d += e.decoded_bytes;
      largest = std::max(largest, e.decoded_bytes);
    }
    std::printf("%s: %zu records, %zu frames (largest %llu bytes decoded), %llu bytes, ratio %s\n",
                p.string().c_str(), f.size(), f.frames().size(),
                static_cast<unsigned long long>(largest),
                static_cast<unsigned long long>(f.file_size()), ratio(d, f.file_size()).c_str());
    records += f.size();
    frames += f.frames().size();
    stored += f.file_size();
    decoded += d;
  }
  std::printf("total: %zu shards, %llu records, %llu frames, %llu bytes, ratio %s\n", paths.size(),
              static_cast<unsigned long long>(records), static_cast<unsigned long long>(frames),
              static_cast<unsigned long long>(stored), ratio(decoded, stored).c_str());
  return 0;
}

int cmd_verify(const std::vector<std::string>& args) {
  if (args.empty()) usage("verify takes one or more shard files or directories");
  std::uint64_t records = 0, frames = 0;
  const auto paths = shard_paths(args);
  for (const auto& p : paths) {
    const auto f = data::shard_file::open(p);
    f.verify();
    records += f.size();
    frames += f.frames().size();
  }
  std::printf("ok: %zu shards, %llu records, %llu frames verified\n", paths.size(),
              static_cast<unsigned long long>(records), static_cast<unsigned long long>(frames));
  return 0;
}

int cmd_cat(std::vector<std::string> args) {
  std::optional<std::pair<std::uint64_t, std::uint64_t>> range;
  for (std::size_t i = 0; i < args.size();) {
    if (args[i] != "--records") {
      ++i;
      continue;
    }
    if (i + 1 >= args.size()) usage("--records needs I:J");
    const std::string& v = args[i + 1];
    const auto colon = v.find(':');
    if (colon == std::string::npos)
      usage("--records takes I:J (records I to J-1), got '" + v + "'");
    range.emplace(parse_count("--records", v.substr(0, colon)),
                  parse_count("--records", v.substr(colon + 1)));
    args.erase(args.begin() + static_cast<std::ptrdiff_t>(i),
               args.begin() + static_cast<std::ptrdiff_t>(i + 2));
  }
  if (args.empty()) usage("cat takes one or more shard files or directories");
  const data::shard_dataset ds(shard_paths(args));
  const auto [lo, hi] = range.value_or(std::pair<std::uint64_t, std::uint64_t>{0, ds.size()});
  if (lo > hi || hi > ds.size()) {
    throw hone::config_error("--records " + std::to_string(lo) + ":" + std::to_string(hi) +
                             " is not a range within the " + std::to_string(ds.size()) +
                             " records of these shards");
  }
  data::shard_record r;
  for (std::uint64_t i = lo; i < hi; ++i) {
    ds.get(static_cast<std::size_t>(i), r);
    const auto b = r.view();
    std::fwrite(b.data(), 1, b.size(), stdout);
    std::fputc('\n', stdout);
  }
  if (std::fflush(stdout) != 0) throw hone::io_error("cannot write to standard output");
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
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (cmd == "pack") return cmd_pack(args);
    if (cmd == "info") return cmd_info(args);
    if (cmd == "verify") return cmd_verify(args);
    if (cmd == "cat") return cmd_cat(args);
    usage("unknown command '" + std::string(cmd) + "'");
  } catch (const std::exception& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    if (cmd == "verify") {
      std::printf("invalid: %s\n", msg.c_str());
    } else {
      std::fprintf(stderr, "hone-data: %s\n", msg.c_str());
    }
    return 1;
  }
}
