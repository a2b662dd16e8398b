// bench_feature_cache: hone::data::feature_cache (hone/data/feature_cache.hpp) hits from the RAM
// tier, spills to and promotions from the disk tier, against the bare work of each (memcpy,
// zstd) on the same bytes, and cachetools beside the hits (bench/peers/cachetools_features.py).
//
// The features: 4096 keys (uint64), feature k an array of float32 holding 8-bit pixel values /
// 255 along a random walk (a decoded image row: compressible, as real features often are);
// compute(out) copies it from a table made once (a cheap stand-in for the transform). Every
// lookup's feature is copied by the consumer into a row of a 64-row batch buffer (what a collate
// function does with it). One iteration looks up the 4096 keys once, in a fixed shuffled order
// (fc_hit_*) or in key order (fc_spill_*, fc_promote_*).
//
// fc_hit_256B, fc_hit_16KB: features of 64 and 4096 floats, all resident (RAM budget twice their
// bytes, 8 shards, no disk tier): every lookup is a RAM hit. An iteration of fc_hit_256B makes 64
// passes over the order (64 MiB of features, as one pass of fc_hit_16KB), so that starting the
// second thread of the _t2 rows (about 0.1 ms) stays small against it.
//   hone     get_or_compute on one thread
//   hone_t2  two std::threads sharing the cache, each looking up half of the order
//   limit    the same features copied from the table in the same order (memcpy, no lookup)
//   limit_t2 the same on two std::threads
//   memcpy_scattered  not a limit: the same copies from 4096 separately allocated arrays (one
//            std::vector<float> per feature, the layout the cache's entries have), no lookup: it
//            separates the cost of the lookup from that of reading scattered allocations
// fc_spill_16KB: RAM budget 1/8 of the features, disk tier (zstd level 1) in a new directory
// under /tmp with a 1 GiB budget; each iteration asks a new transform version, so every lookup
// is a miss (the old version's RAM or disk entry dropped as stale), computes the feature and
// inserts it, evicting the least recent entry, which is compressed and appended to the spill
// file (one spill per lookup; a full file compacts in place).
//   hone     get_or_compute
//   limit    the same copy from the table plus ZSTD_compressCCtx (level 1) of the feature into a
//            reused buffer: the compression every spill needs, without the file, the checksum
//            or the bookkeeping
// fc_promote_16KB: the same cache with every feature on disk at one version; looked up in key
// order, the RAM tier (1/8 of them) never holds the next key, so every lookup is a disk hit: a
// pread of the record, its header and key checked, ZSTD_decompress, XXH3-64 of the bytes, the
// promotion to RAM and the eviction of the least recent entry (already on disk: nothing written).
//   hone     get_or_compute
//   limit    ZSTD_decompressDCtx of the same features' level-1 frames (kept in memory) straight
//            into the batch row: the decompression a promotion needs, nothing else
// The value is GB/s of feature bytes looked up; counters: lookups_per_s, and for the disk rows
// compress_ratio (feature bytes over spill file bytes, records' headers and keys included, for all
// 4096 features spilled once at level 1) and spills_per_lookup / disk_hits_per_lookup.
#include <stdlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <hone/data/feature_cache.hpp>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/harness.hpp"

namespace {

namespace data = hone::data;
namespace fs = std::filesystem;

constexpr std::size_t keys = 4096;
constexpr std::size_t batch_rows = 64;

using cache_t = data::feature_cache<std::uint64_t, float>;

/// The feature table: keys x width floats, and a fixed shuffled order of the keys.
struct table {
  std::size_t width = 0;
  std::vector<float> values;
  std::vector<std::uint64_t> order;
  [[nodiscard]] const float* feature(std::uint64_t k) const { return values.data() + k * width; }
  [[nodiscard]] std::size_t feature_bytes() const { return width * sizeof(float); }
};

table make_table(std::size_t width) {
  table t;
  t.width = width;
  t.values.resize(keys * width);
  std::mt19937_64 rng(width);
  for (std::size_t k = 0; k < keys; ++k) {
    int pixel = static_cast<int>(rng() % 256);
    for (std::size_t j = 0; j < width; ++j) {
      pixel = std::clamp(pixel + static_cast<int>(rng() % 7) - 3, 0, 255);
      t.values[k * width + j] = static_cast<float>(pixel) / 255.0f;
    }
  }
  t.order.resize(keys);
  std::iota(t.order.begin(), t.order.end(), std::uint64_t{0});
  std::shuffle(t.order.begin(), t.order.end(), rng);
  return t;
}

const table& table_of(std::size_t width) {
  static std::vector<std::pair<std::size_t, std::unique_ptr<table>>> all;
  for (auto& [w, t] : all) {
    if (w == width) return *t;
  }
  all.emplace_back(width, std::make_unique<table>(make_table(width)));
  return *all.back().second;
}

auto compute_of(const table& t, std::uint64_t k) {
  return [&t, k](std::vector<float>& out) { out.assign(t.feature(k), t.feature(k) + t.width); };
}

/// Passes over the order per iteration of a hit workload: 64 MiB of features in all.
std::size_t passes_of(const table& t) {
  return std::max<std::size_t>(1, (std::size_t{64} << 20) / (keys * t.feature_bytes()));
}

void report(benchmark::State& state, const table& t, std::size_t threads, std::size_t passes = 1) {
  hone_bench::report_bytes(state, passes * keys * t.feature_bytes());
  state.counters["threads"] = static_cast<double>(threads);
  state.counters["lookups_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(passes * keys),
      benchmark::Counter::kIsRate);
}

/// Runs part(t) for t in [0, threads): on this thread alone, or on `threads` std::threads.
template <class Part>
void on_threads(std::size_t threads, Part part) {
  if (threads == 1) {
    part(0);
    return;
  }
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(part, t);
  part(0);
  for (auto& th : pool) th.join();
}

// ---- RAM hits ---------------------------------------------------------------------------------

void run_hit_hone(benchmark::State& state, std::size_t width, std::size_t threads) {
  const table& t = table_of(width);
  static std::vector<std::pair<std::size_t, std::unique_ptr<cache_t>>> caches;
  cache_t* cache = nullptr;
  for (auto& [w, c] : caches) {
    if (w == width) cache = c.get();
  }
  if (cache == nullptr) {
    caches.emplace_back(width, std::make_unique<cache_t>(data::feature_cache_options{
                                   .ram_bytes = 2 * keys * t.feature_bytes()}));
    cache = caches.back().second.get();
    for (std::uint64_t k = 0; k < keys; ++k) (void)cache->get_or_compute(k, 1, compute_of(t, k));
  }
  std::vector<std::vector<float>> rows(threads, std::vector<float>(batch_rows * t.width));
  const std::size_t passes = passes_of(t);
  const auto before = cache->stats();
  for (auto _ : state) {
    on_threads(threads, [&](std::size_t th) {
      float* buf = rows[th].data();
      for (std::size_t p = 0; p < passes; ++p) {
        for (std::size_t i = th; i < keys; i += threads) {
          const std::uint64_t k = t.order[i];
          const data::feature_ref<float> f = cache->get_or_compute(k, 1, compute_of(t, k));
          std::memcpy(buf + (i % batch_rows) * t.width, f.span().data(), t.feature_bytes());
        }
        benchmark::DoNotOptimize(buf);
        benchmark::ClobberMemory();
      }
    });
  }
  const auto after = cache->stats();
  if (after.misses != before.misses || after.evictions != before.evictions) {
    state.SkipWithError("a lookup missed: the features should all be resident");
  }
  report(state, t, threads, passes);
}

/// Copies of the same features in the same order from `source(k)`, no lookup.
template <class Source>
void run_hit_copies(benchmark::State& state, const table& t, std::size_t threads, Source source) {
  std::vector<std::vector<float>> rows(threads, std::vector<float>(batch_rows * t.width));
  const std::size_t passes = passes_of(t);
  for (auto _ : state) {
    on_threads(threads, [&](std::size_t th) {
      float* buf = rows[th].data();
      for (std::size_t p = 0; p < passes; ++p) {
        for (std::size_t i = th; i < keys; i += threads) {
          std::memcpy(buf + (i % batch_rows) * t.width, source(t.order[i]), t.feature_bytes());
        }
        benchmark::DoNotOptimize(buf);
        benchmark::ClobberMemory();
      }
    });
  }
  report(state, t, threads, passes);
}

void run_hit_limit(benchmark::State& state, std::size_t width, std::size_t threads) {
  const table& t = table_of(width);
  run_hit_copies(state, t, threads, [&t](std::uint64_t k) { return t.feature(k); });
}

void run_hit_scattered(benchmark::State& state, std::size_t width) {
  const table& t = table_of(width);
  // Allocated one after another, as the cache's entries were (each compute fills a new vector).
  std::vector<std::vector<float>> features;
  features.reserve(keys);
  for (std::uint64_t k = 0; k < keys; ++k) {
    features.emplace_back(t.feature(k), t.feature(k) + t.width);
  }
  run_hit_copies(state, t, 1, [&features](std::uint64_t k) { return features[k].data(); });
}

// ---- the disk tier ----------------------------------------------------------------------------

constexpr std::size_t disk_width = 4096;  // 16 KiB features

/// A new directory under /tmp for one cache's spill file (removed at exit).
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::string templ = (fs::temp_directory_path() / "hone-bench-fc-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) {
      throw std::runtime_error("bench_feature_cache: cannot create a directory under " +
                               fs::temp_directory_path().string());
    }
    path = templ;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

struct disk_setup {
  temp_dir dir;
  std::unique_ptr<cache_t> cache;
  std::uint64_t version = 1;
};

std::unique_ptr<disk_setup> make_disk_cache(const table& t) {
  auto s = std::make_unique<disk_setup>();
  s->cache = std::make_unique<cache_t>(
      data::feature_cache_options{.ram_bytes = keys / 8 * t.feature_bytes(),
                                  .disk_dir = s->dir.path,
                                  .disk_bytes = std::uint64_t{1} << 30,
                                  .zstd_level = 1});
  return s;
}

/// Feature bytes over spill file bytes with every feature spilled once (a fresh cache whose RAM
/// holds one feature: each insert spills the previous one).
double compress_ratio(const table& t) {
  static double ratio = [&t] {
    temp_dir dir;
    cache_t c({.ram_bytes = t.feature_bytes(),
               .disk_dir = dir.path,
               .disk_bytes = std::uint64_t{1} << 30,
               .zstd_level = 1,
               .shards = 1});
    // Key `keys` (the features of key 0 again) pushes the last real key out to disk.
    for (std::uint64_t k = 0; k <= keys; ++k) {
      (void)c.get_or_compute(k, 1, compute_of(t, k % keys));
    }
    const auto s = c.stats();
    return static_cast<double>(s.spills * t.feature_bytes()) / static_cast<double>(s.disk_bytes);
  }();
  return ratio;
}

void report_disk(benchmark::State& state, const table& t, const cache_t& cache,
                 const data::feature_cache_stats& before, const data::feature_cache_stats& after) {
  report(state, t, 1);
  const double lookups = static_cast<double>(state.iterations()) * static_cast<double>(keys);
  state.counters["compress_ratio"] = compress_ratio(t);
  state.counters["spills_per_lookup"] = static_cast<double>(after.spills - before.spills) / lookups;
  state.counters["disk_hits_per_lookup"] =
      static_cast<double>(after.disk_hits - before.disk_hits) / lookups;
  if (after.disk_errors != 0) {
    const std::string why = "the disk tier failed: " + cache.disk_error();
    state.SkipWithError(why.c_str());
  }
}

void run_spill_hone(benchmark::State& state) {
  const table& t = table_of(disk_width);
  static std::unique_ptr<disk_setup> s = make_disk_cache(t);
  std::vector<float> row(batch_rows * t.width);
  const auto before = s->cache->stats();
  for (auto _ : state) {
    const std::uint64_t v = ++s->version;
    for (std::uint64_t k = 0; k < keys; ++k) {
      const auto f = s->cache->get_or_compute(k, v, compute_of(t, k));
      std::memcpy(row.data() + (k % batch_rows) * t.width, f.span().data(), t.feature_bytes());
    }
    benchmark::DoNotOptimize(row.data());
    benchmark::ClobberMemory();
  }
  report_disk(state, t, *s->cache, before, s->cache->stats());
}

struct cctx_deleter {
  void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); }
};
struct dctx_deleter {
  void operator()(ZSTD_DCtx* c) const noexcept { ZSTD_freeDCtx(c); }
};

void run_spill_limit(benchmark::State& state) {
  const table& t = table_of(disk_width);
  std::unique_ptr<ZSTD_CCtx, cctx_deleter> cctx(ZSTD_createCCtx());
  std::vector<float> row(batch_rows * t.width), feature;
  std::vector<char> frame(ZSTD_compressBound(t.feature_bytes()));
  std::size_t total = 0;
  for (auto _ : state) {
    for (std::uint64_t k = 0; k < keys; ++k) {
      feature.assign(t.feature(k), t.feature(k) + t.width);  // the compute
      const std::size_t n = ZSTD_compressCCtx(cctx.get(), frame.data(), frame.size(),
                                              feature.data(), t.feature_bytes(), 1);
      if (ZSTD_isError(n)) {
        state.SkipWithError("zstd failed");
        return;
      }
      total += n;
      std::memcpy(row.data() + (k % batch_rows) * t.width, feature.data(), t.feature_bytes());
    }
    benchmark::DoNotOptimize(row.data());
    benchmark::ClobberMemory();
  }
  benchmark::DoNotOptimize(total);
  report(state, t, 1);
}

void run_promote_hone(benchmark::State& state) {
  const table& t = table_of(disk_width);
  static std::unique_ptr<disk_setup> s = [&t] {
    auto d = make_disk_cache(t);
    // Two passes in key order: after them every feature has a record on disk.
    for (int pass = 0; pass < 2; ++pass) {
      for (std::uint64_t k = 0; k < keys; ++k) {
        (void)d->cache->get_or_compute(k, 1, compute_of(t, k));
      }
    }
    return d;
  }();
  std::vector<float> row(batch_rows * t.width);
  const auto before = s->cache->stats();
  for (auto _ : state) {
    for (std::uint64_t k = 0; k < keys; ++k) {
      const auto f = s->cache->get_or_compute(k, 1, compute_of(t, k));
      std::memcpy(row.data() + (k % batch_rows) * t.width, f.span().data(), t.feature_bytes());
    }
    benchmark::DoNotOptimize(row.data());
    benchmark::ClobberMemory();
  }
  const auto after = s->cache->stats();
  if (after.misses != before.misses) state.SkipWithError("a lookup missed both tiers");
  report_disk(state, t, *s->cache, before, after);
}

void run_promote_limit(benchmark::State& state) {
  const table& t = table_of(disk_width);
  static const std::vector<std::vector<char>> frames = [&t] {
    std::unique_ptr<ZSTD_CCtx, cctx_deleter> cctx(ZSTD_createCCtx());
    std::vector<std::vector<char>> out(keys);
    for (std::uint64_t k = 0; k < keys; ++k) {
      out[k].resize(ZSTD_compressBound(t.feature_bytes()));
      const std::size_t n = ZSTD_compressCCtx(cctx.get(), out[k].data(), out[k].size(),
                                              t.feature(k), t.feature_bytes(), 1);
      out[k].resize(ZSTD_isError(n) ? 0 : n);
    }
    return out;
  }();
  std::unique_ptr<ZSTD_DCtx, dctx_deleter> dctx(ZSTD_createDCtx());
  std::vector<float> row(batch_rows * t.width);
  for (auto _ : state) {
    for (std::uint64_t k = 0; k < keys; ++k) {
      const std::size_t n =
          ZSTD_decompressDCtx(dctx.get(), row.data() + (k % batch_rows) * t.width,
                              t.feature_bytes(), frames[k].data(), frames[k].size());
      if (n != t.feature_bytes()) {
        state.SkipWithError("zstd failed");
        return;
      }
    }
    benchmark::DoNotOptimize(row.data());
    benchmark::ClobberMemory();
  }
  report(state, t, 1);
}

bool register_benchmarks() {
  for (const auto& [name, width] :
       {std::pair{"fc_hit_256B", std::size_t{64}}, std::pair{"fc_hit_16KB", std::size_t{4096}}}) {
    const std::size_t w = width;
    hone_bench::add(name, "hone", [w](benchmark::State& s) { run_hit_hone(s, w, 1); });
    hone_bench::add(name, "hone_t2", [w](benchmark::State& s) { run_hit_hone(s, w, 2); });
    hone_bench::add(name, "limit", [w](benchmark::State& s) { run_hit_limit(s, w, 1); });
    hone_bench::add(name, "limit_t2", [w](benchmark::State& s) { run_hit_limit(s, w, 2); });
    hone_bench::add(name, "memcpy_scattered",
                    [w](benchmark::State& s) { run_hit_scattered(s, w); });
  }
  hone_bench::add("fc_spill_16KB", "hone", run_spill_hone);
  hone_bench::add("fc_spill_16KB", "limit", run_spill_limit);
  hone_bench::add("fc_promote_16KB", "hone", run_promote_hone);
  hone_bench::add("fc_promote_16KB", "limit", run_promote_limit);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
