// bench_line_index: building the record index of a text, CSV and JSON Lines file of 10,000,000
// lines (hone::data::line_dataset, hone/data/line_dataset.hpp) against counting the same file's
// newlines.
//
// line_index_10M_text:  10M lines of word-like text, 10 to 89 bytes each (505 MB)
// line_index_10M_csv:   the same 10M rows as CSV: `id,"text, with a comma and ""quotes""",label`
//                       (every row has a quoted field; the index must track the quotes; 684 MB)
// line_index_10M_jsonl: the same 10M rows as JSON Lines: {"id":..,"text":"..","label":..}
//                       (844 MB)
//
// The files are written once under build/bench/line-index-data/ (HONE_BENCH_LINE_INDEX_DIR
// overrides; each is a pure function of the line number). One iteration opens the file from
// the page cache and builds its index in memory:
//   hone       line_dataset(path, format, {.policy = rebuild, .save_index = false, .threads = 1}):
//              the mapping, the stamp (fstat, XXH3-128 of the first and last 64 KiB), the data
//              extents and the chunked scan (4 MiB chunks; the newline block scan for text and
//              JSON Lines, detail/line_scan.hpp, the quote-aware block scan for CSV,
//              detail/csv_scan.hpp: the best kernel this CPU runs, AVX-512, AVX2 or SSE2), then
//              the offsets gathered into one array
//   hone_t2    the same with threads = 2
//   hone_scalar the same as hone with the scan forced to its scalar kernel
//              (hone::scoped_isa(isa::scalar)): one memchr per line for text and JSON Lines, the
//              byte loop for CSV; the loops the vector kernels replaced
//   limit      the file mapped the same way (io::mapped_file) and its '\n' bytes counted with a
//              memchr loop on one thread: what any newline index has to do at least, without
//              storing an offset
//   limit_t2   the same on two std::threads, each counting one half
//   limit_count, limit_count_t2: the newlines counted with std::count over the bytes (a
//              vectorized compare-and-add, no call per line: faster than memchr when lines are
//              short); the best limit row of a workload is its ceiling
// The value is GB/s of file bytes; counters: records_per_s, records, and index_bytes_per_record
// (the size of the saved index file, <file>.hidx, written once, over the record count).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <hone/core/isa.hpp>
#include <hone/data/line_dataset.hpp>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/harness.hpp"

namespace {

namespace data = hone::data;
namespace fs = std::filesystem;

constexpr std::size_t lines = 10'000'000;

struct format_spec {
  const char* workload;
  const char* file;
  data::line_format format;
};
constexpr format_spec formats[] = {
    {"line_index_10M_text", "lines_10M.txt", data::line_format::text},
    {"line_index_10M_csv", "lines_10M.csv", data::line_format::csv},
    {"line_index_10M_jsonl", "lines_10M.jsonl", data::line_format::jsonl}};

fs::path data_dir() {
  if (const char* d = std::getenv("HONE_BENCH_LINE_INDEX_DIR")) return d;
  return fs::path(HONE_BENCH_SOURCE_DIR) / ".." / "build" / "bench" / "line-index-data";
}

/// The text of line i (10 to 89 bytes of lower-case words; a pure function of i).
void line_text(std::uint64_t i, std::string& out) {
  std::uint64_t x = i * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;  // splitmix64
  auto next = [&x] {
    std::uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  const std::size_t len = 10 + next() % 80;
  out.clear();
  while (out.size() < len) {
    std::uint64_t r = next();
    const std::size_t w = 2 + r % 8;
    for (std::size_t k = 0; k < w; ++k) {
      r /= 26;
      out += static_cast<char>('a' + r % 26);
    }
    out += ' ';
  }
  out.resize(len);
}

/// The file of `f`, written once (under a temporary name, then renamed).
fs::path corpus(const format_spec& f) {
  const fs::path path = data_dir() / f.file;
  if (fs::exists(path)) return path;
  fs::create_directories(data_dir());
  const fs::path tmp = path.string() + ".tmp";
  std::FILE* out = std::fopen(tmp.c_str(), "wb");
  if (out == nullptr) throw std::runtime_error("bench_line_index: cannot write " + tmp.string());
  std::vector<char> buffer(std::size_t{1} << 20);
  std::setvbuf(out, buffer.data(), _IOFBF, buffer.size());
  std::string text, row;
  for (std::uint64_t i = 0; i < lines; ++i) {
    line_text(i, text);
    row.clear();
    if (f.format == data::line_format::text) {
      row = text;
    } else if (f.format == data::line_format::csv) {
      // A quoted field with a comma and an escaped quote in it.
      row = std::to_string(i) + ",\"" + text.substr(0, text.size() / 2) + ", \"\"" +
            text.substr(text.size() / 2) + "\"\"\"," + std::to_string(i % 10);
    } else {
      row = "{\"id\":" + std::to_string(i) + ",\"text\":\"" + text +
            "\",\"label\":" + std::to_string(i % 10) + "}";
    }
    row += '\n';
    std::fwrite(row.data(), 1, row.size(), out);
  }
  if (std::fclose(out) != 0) throw std::runtime_error("bench_line_index: write failed");
  fs::rename(tmp, path);
  return path;
}

struct setup {
  fs::path path;
  std::size_t bytes = 0;
  std::size_t records = 0;
  double index_bytes_per_record = 0;
};

setup& setup_of(const format_spec& f) {
  static std::vector<std::unique_ptr<setup>> all(std::size(formats));
  auto& s = all[static_cast<std::size_t>(&f - formats)];
  if (!s) {
    s = std::make_unique<setup>();
    s->path = corpus(f);
    s->bytes = static_cast<std::size_t>(fs::file_size(s->path));
    // The saved index, once: its size per record.
    const fs::path idx = s->path.string() + ".hidx";
    const data::line_dataset ds(s->path, f.format,
                                {.policy = data::index_policy::rebuild, .index_path = idx});
    s->records = ds.size();
    s->index_bytes_per_record =
        static_cast<double>(fs::file_size(idx)) / static_cast<double>(s->records);
  }
  return *s;
}

void report(benchmark::State& state, const setup& s, std::size_t threads) {
  hone_bench::report_bytes(state, s.bytes);
  state.counters["threads"] = static_cast<double>(threads);
  state.counters["records"] = static_cast<double>(s.records);
  state.counters["index_bytes_per_record"] = s.index_bytes_per_record;
  state.counters["records_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(s.records),
                         benchmark::Counter::kIsRate);
}

void run_hone(benchmark::State& state, const format_spec& f, std::size_t threads,
              bool scalar = false) {
  setup& s = setup_of(f);
  std::optional<hone::scoped_isa> forced;
  if (scalar) forced.emplace(hone::isa::scalar);
  std::size_t n = 0;
  for (auto _ : state) {
    const data::line_dataset ds(
        s.path, f.format,
        {.policy = data::index_policy::rebuild, .save_index = false, .threads = threads});
    n = ds.size();
    benchmark::DoNotOptimize(n);
  }
  if (n != s.records) state.SkipWithError("the index has another record count");
  report(state, s, threads);
}

/// Newlines of [p, p + n): a memchr loop, or std::count.
std::size_t count_newlines(const char* p, std::size_t n, bool use_memchr) {
  if (!use_memchr) return static_cast<std::size_t>(std::count(p, p + n, '\n'));
  std::size_t count = 0;
  const char* end = p + n;
  while (p < end) {
    const void* hit = std::memchr(p, '\n', static_cast<std::size_t>(end - p));
    if (hit == nullptr) break;
    ++count;
    p = static_cast<const char*>(hit) + 1;
  }
  return count;
}

void run_limit(benchmark::State& state, const format_spec& f, std::size_t threads,
               bool use_memchr) {
  setup& s = setup_of(f);
  std::size_t newlines = 0;
  for (auto _ : state) {
    const hone::io::mapped_file map(s.path);
    const auto bytes = map.bytes();
    const char* p = reinterpret_cast<const char*>(bytes.data());
    if (threads == 1) {
      newlines = count_newlines(p, bytes.size(), use_memchr);
    } else {
      std::vector<std::size_t> counts(threads);
      std::vector<std::thread> pool;
      const std::size_t part = (bytes.size() + threads - 1) / threads;
      for (std::size_t t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          const std::size_t b = std::min(bytes.size(), t * part);
          const std::size_t e = std::min(bytes.size(), b + part);
          counts[t] = count_newlines(p + b, e - b, use_memchr);
        });
      }
      for (auto& th : pool) th.join();
      newlines = 0;
      for (const std::size_t c : counts) newlines += c;
    }
    benchmark::DoNotOptimize(newlines);
  }
  if (newlines != lines) state.SkipWithError("another newline count");
  report(state, s, threads);
}

bool register_benchmarks() {
  for (const format_spec& f : formats) {
    hone_bench::add(f.workload, "hone", [&f](benchmark::State& s) { run_hone(s, f, 1); });
    hone_bench::add(f.workload, "hone_t2", [&f](benchmark::State& s) { run_hone(s, f, 2); });
    hone_bench::add(f.workload, "hone_scalar",
                    [&f](benchmark::State& s) { run_hone(s, f, 1, true); });
    hone_bench::add(f.workload, "limit", [&f](benchmark::State& s) { run_limit(s, f, 1, true); });
    hone_bench::add(f.workload, "limit_t2",
                    [&f](benchmark::State& s) { run_limit(s, f, 2, true); });
    hone_bench::add(f.workload, "limit_count",
                    [&f](benchmark::State& s) { run_limit(s, f, 1, false); });
    hone_bench::add(f.workload, "limit_count_t2",
                    [&f](benchmark::State& s) { run_limit(s, f, 2, false); });
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
