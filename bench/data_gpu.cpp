// bench/data_gpu.cpp (bench_data_gpu): the loader's batches staged to the GPU by
// hone::data::cuda_stager (hone/data/cuda/staging.hpp), in samples per second, against the copy
// ceiling of the same bytes. Host C++ on the CUDA runtime (no kernels); without a CUDA device it
// prints a skip message and exits 0.
//
// staging_samples_per_s_2k:  32768 records of 2 KiB (1024 uint16 tokens), batches of 64
// staging_samples_per_s_64k: 1024 records of 64 KiB (32768 uint16 tokens), batches of 64
//
// The corpus is bench_loader's (bench/loader.cpp): one Megatron .bin/.idx pair of fixed-length
// records (token j of record i = (i * width + j) mod 65536), written once under
// $HONE_BENCH_LOADER_DIR when set (bench_loader's build/bench/loader-data/ holds the same files),
// else under <temp directory>/hone_bench_data_gpu/ (the GPU bundle runs away from the source
// tree), and read from the page cache through hone::data::megatron_dataset<uint16_t>. One
// iteration is one epoch in a shuffled order (a new permutation each epoch): 512 (2k) or 16 (64k)
// batches of 64 rows, 64 MiB in all, each batch copied to the device on a non-blocking stream and
// followed on that stream by the trivial consumer, a cudaMemsetAsync of the batch's first byte;
// the iteration ends with cudaStreamSynchronize, so its time covers every copy. The value is GB/s
// of record bytes (bytes_per_iter = the epoch's bytes); the counter samples_per_s is records per
// second. Objects (loader, stager, buffers, stream) are built once per run, before one untimed
// warm-up epoch.
//   hone        a loader (loader_options{threads = 1, prefetch = 4}) collating into
//               hone::data::pinned_batch (page-locked; collate = memcpy of the record into its
//               row), staged by cuda_stager (2 device buffers, its default): copies overlap the
//               loader's threads assembling the next batches
//   hone_t2     threads = 2 (the program raises oneTBB's worker limit as bench_loader does)
//   limit       cudaMemcpyAsync of the same bytes per batch from a ring of 5 pre-filled
//               page-locked buffers (the loader's prefetch + 1) into 2 device buffers, no loader:
//               the host-to-device link's ceiling (PCIe, or NVLink-C2C on a Grace Hopper)
//   pageable    the same copies from 5 pre-filled pageable buffers (std::vector): what a user
//               without page-locked batches gets, for scale
#include <cuda_runtime_api.h>
#include <oneapi/tbb/global_control.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <hone/core/space.hpp>
#include <hone/data.hpp>
#include <hone/data/cuda/staging.hpp>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "support/gpu_host.hpp"
#include "support/harness.hpp"
#include "support/loader_corpus.hpp"

namespace {

namespace data = hone::data;
namespace fs = std::filesystem;

constexpr std::size_t batch_rows = 64;
constexpr std::size_t prefetch = 4;
constexpr std::size_t host_ring = prefetch + 1;  // the loader's reused pinned batches
constexpr std::size_t device_ring = 2;           // cuda_stager's default

struct corpus_spec {
  const char* workload;
  std::size_t records;
  std::size_t width;  // uint16 tokens per record
};
constexpr corpus_spec corpora[] = {{"staging_samples_per_s_2k", 32768, 1024},
                                   {"staging_samples_per_s_64k", 1024, 32768}};

fs::path data_dir() {
  if (const char* d = std::getenv("HONE_BENCH_LOADER_DIR")) return d;
  return fs::temp_directory_path() / "hone_bench_data_gpu";
}

/// The corpus of `c` (bench_loader's file names and contents), written once.
fs::path corpus(const corpus_spec& c) {
  return hone_bench::loader_corpus(data_dir(), c.records, c.width);
}

using dataset_t = data::megatron_dataset<std::uint16_t>;

/// The opened corpus of `c`, kept for the whole program (one per corpus).
const dataset_t& dataset_of(const corpus_spec& c) {
  static std::vector<std::unique_ptr<dataset_t>> all(std::size(corpora));
  auto& d = all[static_cast<std::size_t>(&c - corpora)];
  if (!d) d = std::make_unique<dataset_t>(corpus(c));
  return *d;
}

/// Record i into row `row` of the batch's field 0.
struct collate_tokens {
  void operator()(data::pinned_batch& b, std::size_t row,
                  std::span<const std::uint16_t> rec) const {
    std::memcpy(b.row<std::uint16_t>(0, row).data(), rec.data(), rec.size_bytes());
  }
};

using loader_t =
    data::loader<dataset_t, data::pinned_batch, collate_tokens, data::shuffled_sampler>;

data::batch_layout make_layout(const corpus_spec& c) {
  data::batch_layout l(batch_rows);
  l.add<std::uint16_t>("tokens", c.width);
  return l;
}

/// A non-blocking stream for one run.
struct stream_holder {
  cudaStream_t s = nullptr;
  stream_holder() { HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~stream_holder() { (void)cudaStreamDestroy(s); }
  stream_holder(const stream_holder&) = delete;
  stream_holder& operator=(const stream_holder&) = delete;
};

void report(benchmark::State& state, const corpus_spec& c, std::size_t threads) {
  hone_bench::report_bytes(state, c.records * c.width * 2);
  state.counters["threads"] = static_cast<double>(threads);
  state.counters["batch_bytes"] = static_cast<double>(batch_rows * c.width * 2);
  state.counters["samples_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(c.records),
                         benchmark::Counter::kIsRate);
}

/// Runs `body(state)`, turning an exception (a CUDA error, a corpus that cannot be written) into
/// the row's error message instead of ending the program.
template <class Body>
void guarded(benchmark::State& state, Body&& body) {
  try {
    body(state);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void run_hone(benchmark::State& state, const corpus_spec& c, std::size_t threads) {
  const dataset_t& ds = dataset_of(c);
  const stream_holder stream;
  const data::batch_layout layout = make_layout(c);
  loader_t ld(ds, data::pinned_batch(layout), collate_tokens{},
              data::loader_options{
                  .batch_size = batch_rows, .threads = threads, .prefetch = prefetch, .seed = 1});
  data::cuda_stager<loader_t> stage(ld, layout, stream.s);
  std::uint64_t samples = 0;
  const auto epoch = [&] {
    while (const data::device_batch* b = stage.next()) {
      HONE_CUDA_CHECK(cudaMemsetAsync(b->data(), 0, 1, stream.s));  // the step, in stream order
      samples += b->info.rows;
    }
    HONE_CUDA_CHECK(cudaStreamSynchronize(stream.s));
  };
  epoch();  // warm-up: the corpus in the page cache, the pinned batches touched
  samples = 0;
  for (auto _ : state) epoch();
  if (samples != state.iterations() * c.records) {
    state.SkipWithError("an epoch lost samples");
    return;
  }
  report(state, c, threads);
}

/// The limit rows: the epoch's bytes copied batch by batch from `host_ring` pre-filled host
/// buffers (page-locked or pageable) into `device_ring` device buffers, no loader.
void run_copy(benchmark::State& state, const corpus_spec& c, bool page_locked) {
  const dataset_t& ds = dataset_of(c);
  const stream_holder stream;
  const std::size_t row_bytes = c.width * 2;
  const std::size_t batch_bytes = batch_rows * row_bytes;
  const std::size_t batches = (c.records + batch_rows - 1) / batch_rows;
  std::vector<hone::buffer<std::byte, hone::pinned_host_space>> pinned;
  std::vector<std::vector<std::byte>> pageable;
  std::vector<const std::byte*> src;
  for (std::size_t k = 0; k < host_ring; ++k) {
    std::byte* p = nullptr;
    if (page_locked) {
      pinned.emplace_back(batch_bytes);
      p = pinned.back().data();
    } else {
      pageable.emplace_back(batch_bytes);
      p = pageable.back().data();
    }
    for (std::size_t r = 0; r < batch_rows; ++r) {  // batch k's records, as the loader would
      const auto rec = ds.get((k * batch_rows + r) % c.records);
      std::memcpy(p + r * row_bytes, rec.data(), rec.size_bytes());
    }
    src.push_back(p);
  }
  std::vector<hone::buffer<std::byte, hone::cuda_space>> dst;
  for (std::size_t k = 0; k < device_ring; ++k) dst.emplace_back(batch_bytes);
  std::uint64_t samples = 0;
  const auto epoch = [&] {
    for (std::size_t b = 0; b < batches; ++b) {
      const std::size_t rows = std::min(batch_rows, c.records - b * batch_rows);
      std::byte* d = dst[b % device_ring].data();
      HONE_CUDA_CHECK(cudaMemcpyAsync(d, src[b % host_ring], rows * row_bytes,
                                      cudaMemcpyHostToDevice, stream.s));
      HONE_CUDA_CHECK(cudaMemsetAsync(d, 0, 1, stream.s));
      samples += rows;
    }
    HONE_CUDA_CHECK(cudaStreamSynchronize(stream.s));
  };
  epoch();
  samples = 0;
  for (auto _ : state) epoch();
  if (samples != state.iterations() * c.records) {
    state.SkipWithError("an epoch lost samples");
    return;
  }
  report(state, c, 1);
}

bool register_benchmarks() {
  if (!hone_bench::device_present("bench_data_gpu")) return false;
  if (!hone::space_traits<hone::pinned_host_space>::pinned()) {
    std::fprintf(stderr,
                 "bench_data_gpu: pinned_host_space is not page-locked in this program, so the "
                 "staging rows would measure pageable copies; build it with the hone::cuda "
                 "target\n");
    std::exit(1);
  }
  // Let the loader start two oneTBB workers whatever the core count (as bench_loader does);
  // --hone_threads still lowers it.
  static tbb::global_control workers(tbb::global_control::max_allowed_parallelism, 3);
  for (const corpus_spec& c : corpora) {
    hone_bench::add(c.workload, "hone", [&c](benchmark::State& s) {
      guarded(s, [&c](benchmark::State& st) { run_hone(st, c, 1); });
    });
    hone_bench::add(c.workload, "hone_t2", [&c](benchmark::State& s) {
      guarded(s, [&c](benchmark::State& st) { run_hone(st, c, 2); });
    });
    hone_bench::add(c.workload, "limit", [&c](benchmark::State& s) {
      guarded(s, [&c](benchmark::State& st) { run_copy(st, c, true); });
    });
    hone_bench::add(c.workload, "pageable", [&c](benchmark::State& s) {
      guarded(s, [&c](benchmark::State& st) { run_copy(st, c, false); });
    });
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
