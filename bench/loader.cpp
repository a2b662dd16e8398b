// bench_loader: hone::data::loader's samples per second from the page cache, against PyTorch's
// DataLoader over the same file (bench/peers/torch_loader.py) and the memcpy limit.
//
// loader_samples_per_s_2k:  32768 records of 2 KiB (1024 uint16 tokens), batches of 64
// loader_samples_per_s_64k: 1024 records of 64 KiB (32768 uint16 tokens), batches of 64
//
// The records are one Megatron .bin/.idx corpus (hone::data::megatron_writer; fixed-length
// sequences, token j of record i = (i * width + j) mod 65536) written once under
// build/bench/loader-data/ (HONE_BENCH_LOADER_DIR overrides) and read through
// hone::data::megatron_dataset<uint16_t> (get(i): a span into the mapped .bin). The peer maps the
// same .bin with numpy.memmap. One iteration is one epoch in a shuffled order (a new permutation
// each epoch): every record copied once into a batch row of 64 (collate = memcpy), the consumer
// touching each batch; the loader object stays across iterations (persistent threads and
// buffers). The value is GB/s of record bytes (bytes_per_iter = the epoch's bytes); the counter
// samples_per_s is records per second.
//   hone        loader_options{threads = 1, prefetch = 4}: one oneTBB worker; the consumer also
//               fills a batch when none is ready (loader.hpp), so up to two threads copy
//   hone_t2     threads = 2 (the program raises oneTBB's worker limit to 2 with a global_control)
//   limit       one thread copying the same records in the same order into one batch buffer
//   limit_t2    two std::threads doing so, each for half of the batches
#include <oneapi/tbb/global_control.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <hone/data.hpp>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/harness.hpp"

namespace {

namespace data = hone::data;
namespace fs = std::filesystem;

constexpr std::size_t batch_rows = 64;

struct corpus_spec {
  const char* workload;
  std::size_t records;
  std::size_t width;  // uint16 tokens per record
};
constexpr corpus_spec corpora[] = {{"loader_samples_per_s_2k", 32768, 1024},
                                   {"loader_samples_per_s_64k", 1024, 32768}};

fs::path data_dir() {
  if (const char* d = std::getenv("HONE_BENCH_LOADER_DIR")) return d;
  return fs::path(HONE_BENCH_SOURCE_DIR) / ".." / "build" / "bench" / "loader-data";
}

/// The corpus of `c`, written once (the peer reads the same .bin).
fs::path corpus(const corpus_spec& c) {
  const fs::path prefix =
      data_dir() / ("records_" + std::to_string(c.records) + "x" + std::to_string(c.width));
  if (fs::exists(data::megatron_idx_path(prefix)) && fs::exists(data::megatron_bin_path(prefix)) &&
      fs::file_size(data::megatron_bin_path(prefix)) == c.records * c.width * 2) {
    return prefix;
  }
  fs::create_directories(data_dir());
  data::megatron_writer<std::uint16_t> w(prefix);
  std::vector<std::uint16_t> rec(c.width);
  for (std::size_t i = 0; i < c.records; ++i) {
    for (std::size_t j = 0; j < c.width; ++j) {
      rec[j] = static_cast<std::uint16_t>((i * c.width + j) & 0xffffu);
    }
    w.add_item(rec);
    w.end_document();
  }
  w.finalize();
  return prefix;
}

struct rows {
  std::vector<std::uint16_t> tokens;
};

struct copy_rows {
  std::size_t width;
  void operator()(rows& b, std::size_t row, std::span<const std::uint16_t> rec) const {
    std::memcpy(b.tokens.data() + row * width, rec.data(), rec.size_bytes());
  }
};

using loader_t =
    data::loader<data::megatron_dataset<std::uint16_t>, rows, copy_rows, data::shuffled_sampler>;

struct setup {
  std::unique_ptr<data::megatron_dataset<std::uint16_t>> ds;
  std::size_t width = 0;
  std::size_t bytes = 0;
};

setup& corpus_of(const corpus_spec& c) {
  static std::vector<std::unique_ptr<setup>> all(std::size(corpora));
  auto& s = all[static_cast<std::size_t>(&c - corpora)];
  if (!s) {
    s = std::make_unique<setup>();
    s->ds = std::make_unique<data::megatron_dataset<std::uint16_t>>(corpus(c));
    s->width = c.width;
    s->bytes = c.records * c.width * 2;
  }
  return *s;
}

void report(benchmark::State& state, const corpus_spec& c, std::size_t threads) {
  hone_bench::report_bytes(state, c.records * c.width * 2);
  state.counters["threads"] = static_cast<double>(threads);
  state.counters["samples_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(c.records),
                         benchmark::Counter::kIsRate);
}

void run_hone(benchmark::State& state, const corpus_spec& c, std::size_t threads) {
  setup& s = corpus_of(c);
  static std::vector<std::unique_ptr<loader_t>> loaders(2 * std::size(corpora));
  auto& l = loaders[2 * static_cast<std::size_t>(&c - corpora) + (threads - 1)];
  if (!l) {
    l = std::make_unique<loader_t>(
        *s.ds, rows{std::vector<std::uint16_t>(batch_rows * s.width)}, copy_rows{s.width},
        data::loader_options{
            .batch_size = batch_rows, .threads = threads, .prefetch = 4, .seed = 1});
  }
  std::uint64_t sum = 0, samples = 0;
  for (auto _ : state) {
    while (auto* b = l->next()) {
      sum += b->data.tokens[0];
      samples += b->info.rows;
    }
  }
  benchmark::DoNotOptimize(sum);
  if (samples != state.iterations() * c.records) state.SkipWithError("an epoch lost samples");
  report(state, c, threads);
}

void run_limit(benchmark::State& state, const corpus_spec& c, std::size_t threads) {
  setup& s = corpus_of(c);
  std::vector<std::vector<std::uint16_t>> buffers(threads,
                                                  std::vector<std::uint16_t>(batch_rows * s.width));
  std::vector<std::uint64_t> order;
  std::uint64_t epoch = 0, sum = 0;
  const std::size_t batches = (c.records + batch_rows - 1) / batch_rows;
  for (auto _ : state) {
    data::shuffled_sampler{}.epoch_order(c.records, 1, epoch++, order);
    const auto part = [&](std::size_t t) {
      std::vector<std::uint16_t>& buf = buffers[t];
      for (std::size_t b = t; b < batches; b += threads) {
        const std::size_t end = std::min(c.records, (b + 1) * batch_rows);
        for (std::size_t k = b * batch_rows; k < end; ++k) {
          const auto rec = s.ds->get(static_cast<std::size_t>(order[k]));
          std::memcpy(buf.data() + (k - b * batch_rows) * s.width, rec.data(), rec.size_bytes());
        }
        benchmark::DoNotOptimize(buf.data());
        benchmark::ClobberMemory();
      }
    };
    if (threads == 1) {
      part(0);
    } else {
      std::vector<std::thread> pool;
      for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(part, t);
      part(0);
      for (auto& t : pool) t.join();
    }
    sum += buffers[0][0];
  }
  benchmark::DoNotOptimize(sum);
  report(state, c, threads);
}

bool register_benchmarks() {
  // Let the loader start two oneTBB workers on a 2-core machine (the default limit is one);
  // --hone_threads still lowers it (the smallest max_allowed_parallelism wins).
  static tbb::global_control workers(tbb::global_control::max_allowed_parallelism, 3);
  for (const corpus_spec& c : corpora) {
    hone_bench::add(c.workload, "hone", [&c](benchmark::State& s) { run_hone(s, c, 1); });
    hone_bench::add(c.workload, "hone_t2", [&c](benchmark::State& s) { run_hone(s, c, 2); });
    hone_bench::add(c.workload, "limit", [&c](benchmark::State& s) { run_limit(s, c, 1); });
    hone_bench::add(c.workload, "limit_t2", [&c](benchmark::State& s) { run_limit(s, c, 2); });
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
