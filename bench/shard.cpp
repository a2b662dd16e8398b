// bench_shard: reading random records from hone record shards (hone/data/shard.hpp) against plain
// ZSTD_decompress of the same frames.
//
// shard_random_record: 1,000,000 records of 64 to 447 bytes (about 256 MB; word-like text
// drawn from a 4096-word vocabulary, so zstd has something to do) packed by shard_writer into
// 64 KiB frames (zstd level 3) and 256 MiB shards, written once under build/bench/shard-data/
// (HONE_BENCH_SHARD_DIR overrides). One iteration reads 4096 records at uniformly random indices
// (the same sequence every iteration), touching each record's bytes.
//   hone     shard_dataset::get(i, record): the frame's compressed checksum (XXH3-64), zstd,
//            the decoded checksum and the record table check, then a view of the record
//   zstd     the same frames, located with the same index, decoded by ZSTD_decompressDCtx into a
//            reused buffer and the record cut from the frame's table: no checks (the floor
//            hone's reader sits on)
// Both keep the last decoded frame (a hit is rare at random: about 1 in 4000 frames). The value
// is GB/s of record bytes read; the counter records_per_s is records per second. Memory and page
// cache: the shards are mapped; after the first pass they are in the page cache.
#include <zstd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <hone/data/shard.hpp>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/harness.hpp"

namespace {

namespace data = hone::data;
namespace fs = std::filesystem;

constexpr std::size_t corpus_records = 1'000'000;
constexpr std::size_t reads_per_iter = 4096;

fs::path data_dir() {
  if (const char* d = std::getenv("HONE_BENCH_SHARD_DIR")) return d;
  return fs::path(HONE_BENCH_SOURCE_DIR) / ".." / "build" / "bench" / "shard-data";
}

/// Record i of the corpus (a pure function of i).
std::string record(std::size_t i, const std::vector<std::string>& vocab) {
  std::mt19937_64 rng(i);
  const std::size_t len = 64 + rng() % 384;
  std::string s;
  while (s.size() < len) {
    s += vocab[rng() % vocab.size()];
    s += ' ';
  }
  s.resize(len);
  return s;
}

struct corpus {
  std::vector<fs::path> paths;
  std::unique_ptr<data::shard_dataset> ds;
  std::vector<std::uint64_t> order;  // the random indices, and their records' total bytes:
  std::uint64_t bytes = 0;
};

corpus& the_corpus() {
  static corpus c = [] {
    corpus out;
    const fs::path dir = data_dir() / "v1";
    auto paths = fs::exists(dir) ? data::list_shards(dir, "bench") : std::vector<fs::path>{};
    if (paths.empty()) {
      fs::create_directories(dir);
      std::vector<std::string> vocab;
      std::mt19937_64 rng(42);
      for (int w = 0; w < 4096; ++w) {
        std::string word(2 + rng() % 9, 'a');
        for (auto& ch : word) ch = static_cast<char>('a' + rng() % 26);
        vocab.push_back(word);
      }
      data::shard_writer w(dir, "bench");
      for (std::size_t i = 0; i < corpus_records; ++i) w.add(record(i, vocab));
      (void)w.finish();
      paths = data::list_shards(dir, "bench");
    }
    out.paths = paths;
    out.ds = std::make_unique<data::shard_dataset>(paths);
    std::mt19937_64 rng(7);
    data::shard_record r;
    for (std::size_t k = 0; k < reads_per_iter; ++k) {
      out.order.push_back(rng() % out.ds->size());
      out.ds->get(static_cast<std::size_t>(out.order.back()), r);
      out.bytes += r.size();
    }
    return out;
  }();
  return c;
}

void report(benchmark::State& state, const corpus& c) {
  hone_bench::report_bytes(state, static_cast<std::size_t>(c.bytes));
  state.counters["records_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * reads_per_iter, benchmark::Counter::kIsRate);
}

void run_hone(benchmark::State& state) {
  corpus& c = the_corpus();
  data::shard_record r;
  std::uint64_t sum = 0, bytes = 0;
  for (auto _ : state) {
    for (const std::uint64_t i : c.order) {
      c.ds->get(static_cast<std::size_t>(i), r);
      const auto v = r.view();
      sum += v.empty() ? 0 : static_cast<unsigned char>(v[v.size() / 2]);
      bytes += v.size();
    }
  }
  benchmark::DoNotOptimize(sum);
  if (bytes != state.iterations() * c.bytes) state.SkipWithError("records of another size");
  report(state, c);
}

/// The plain reader: the same frames found through the same index, ZSTD_decompressDCtx, the
/// record cut from the table; nothing checked.
void run_zstd(benchmark::State& state) {
  corpus& c = the_corpus();
  struct shard {
    hone::io::mapped_file map;
    std::vector<data::shard_frame_info> frames;
    std::uint64_t first = 0;
  };
  std::vector<shard> shards;
  for (std::size_t s = 0; s < c.paths.size(); ++s) {
    shard sh{hone::io::mapped_file(c.paths[s]), {}, 0};
    const auto f = c.ds->shards()[s].frames();
    sh.frames.assign(f.begin(), f.end());
    sh.first = shards.empty() ? 0 : shards.back().first + c.ds->shards()[s - 1].size();
    shards.push_back(std::move(sh));
  }
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> dctx(ZSTD_createDCtx(), &ZSTD_freeDCtx);
  std::vector<std::byte> frame;
  std::size_t cached_shard = SIZE_MAX, cached_frame = SIZE_MAX;
  std::uint64_t sum = 0, bytes = 0;
  for (auto _ : state) {
    for (const std::uint64_t i : c.order) {
      const auto sit =
          std::upper_bound(shards.begin(), shards.end(), i,
                           [](std::uint64_t v, const shard& s) { return v < s.first; });
      const auto s = static_cast<std::size_t>(sit - shards.begin()) - 1;
      const std::uint64_t local = i - shards[s].first;
      const auto& fr = shards[s].frames;
      const auto fit = std::upper_bound(
          fr.begin(), fr.end(), local,
          [](std::uint64_t v, const data::shard_frame_info& e) { return v < e.first_record; });
      const auto f = static_cast<std::size_t>(fit - fr.begin()) - 1;
      const auto& e = fr[f];
      if (s != cached_shard || f != cached_frame) {
        frame.resize(static_cast<std::size_t>(e.decoded_bytes));
        const std::size_t n = ZSTD_decompressDCtx(dctx.get(), frame.data(), frame.size(),
                                                  shards[s].map.bytes().data() + e.offset,
                                                  static_cast<std::size_t>(e.compressed_bytes));
        if (ZSTD_isError(n)) {
          state.SkipWithError("zstd failed");
          return;
        }
        cached_shard = s;
        cached_frame = f;
      }
      const std::size_t k = static_cast<std::size_t>(local - e.first_record);
      const std::size_t table = 8 * static_cast<std::size_t>(e.records);
      const std::uint64_t begin =
          k == 0 ? 0 : data::detail::shard_get64(frame.data() + 8 * (k - 1));
      const std::uint64_t end = data::detail::shard_get64(frame.data() + 8 * k);
      const auto* p = reinterpret_cast<const unsigned char*>(frame.data() + table);
      sum += end == begin ? 0 : p[begin + (end - begin) / 2];
      bytes += end - begin;
    }
  }
  benchmark::DoNotOptimize(sum);
  if (bytes != state.iterations() * c.bytes) state.SkipWithError("records of another size");
  report(state, c);
}

bool register_benchmarks() {
  hone_bench::add("shard_random_record", "hone", run_hone);
  hone_bench::add("shard_random_record", "zstd", run_zstd);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
