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
//
// loader_rss_64k: the resident memory of a process reading the 64 KiB corpus with the loader
// at 1, 2 and 4 threads, beside bench/peers/torch_loader_rss.py (torch's DataLoader with 1, 2, 4
// worker processes). Each iteration starts this program again as a child
// (--hone_loader_rss_child=<threads>): it opens the corpus, reads two shuffled epochs (batches of
// 64 records, prefetch 4, collate = memcpy, as loader_samples_per_s_64k) and reports VmHWM,
// RssAnon and RssFile of /proc/self/status. The time is the child's whole run (start, two
// epochs, exit); the figures are counters (MB = 10^6 bytes):
//   peak_rss_mb  VmHWM, the process's peak resident set
//   rss_anon_mb  RssAnon at the end (heap, batch buffers, thread stacks)
//   rss_file_mb  RssFile at the end (the mapped corpus and the program's code)
//   pss_mb       Pss of /proc/self/smaps_rollup at the end (shared pages divided among the
//                processes that map them: the figure that adds up across torch's processes)
//   batches_mb   the batch buffers the reader owns: (prefetch + 1) x 64 x 64 KiB for the loader
//   hone_t1, hone_t2, hone_t4  loader_options{threads = 1, 2, 4, prefetch = 4} (the child raises
//                oneTBB's worker limit to 4 with a global_control)
//   copy_loop   the same two epochs copied by a plain loop into one batch buffer, no loader:
//               the process, the library and the mapped corpus, the floor of the rows above
#include <oneapi/tbb/global_control.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <hone/data.hpp>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/harness.hpp"
#include "support/loader_corpus.hpp"

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
  return hone_bench::loader_corpus(data_dir(), c.records, c.width);
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

// ---- resident memory (loader_rss_64k) --------------------------------------------------------

constexpr std::size_t rss_prefetch = 4;
constexpr std::size_t rss_epochs = 2;

/// Field `name` of /proc/self/status (VmHWM, RssAnon, ...) or of another /proc/self file in kB,
/// 0 when absent.
double status_kb(std::string_view name, const char* file = "/proc/self/status") {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with(name) && line.size() > name.size() && line[name.size()] == ':') {
      return std::strtod(line.c_str() + name.size() + 1, nullptr);
    }
  }
  return 0;
}

/// The child: two epochs of the 64 KiB corpus with `threads` loader threads (0: the plain copy
/// loop), then "<VmHWM> <RssAnon> <RssFile> <Pss>" in kB on stdout.
int rss_child(std::size_t threads) {
  const corpus_spec& c = corpora[1];
  const data::megatron_dataset<std::uint16_t> ds(corpus(c));
  std::uint64_t sum = 0;
  // Read while the reader (its buffers, threads) is still alive.
  const auto print = [&sum] {
    std::printf("%.0f %.0f %.0f %.0f %llu\n", status_kb("VmHWM"), status_kb("RssAnon"),
                status_kb("RssFile"), status_kb("Pss", "/proc/self/smaps_rollup"),
                static_cast<unsigned long long>(sum % 10));
  };
  if (threads == 0) {
    std::vector<std::uint16_t> buf(batch_rows * c.width);
    std::vector<std::uint64_t> order;
    for (std::uint64_t epoch = 0; epoch < rss_epochs; ++epoch) {
      data::shuffled_sampler{}.epoch_order(c.records, 1, epoch, order);
      for (std::size_t k = 0; k < c.records; ++k) {
        const auto rec = ds.get(static_cast<std::size_t>(order[k]));
        std::memcpy(buf.data() + (k % batch_rows) * c.width, rec.data(), rec.size_bytes());
        if (k % batch_rows == batch_rows - 1) sum += buf[0];
      }
    }
    print();
  } else {
    const tbb::global_control workers(tbb::global_control::max_allowed_parallelism, threads + 1);
    loader_t l(
        ds, rows{std::vector<std::uint16_t>(batch_rows * c.width)}, copy_rows{c.width},
        data::loader_options{
            .batch_size = batch_rows, .threads = threads, .prefetch = rss_prefetch, .seed = 1});
    std::size_t samples = 0;
    while (samples < rss_epochs * c.records) {
      auto* b = l.next();
      if (b == nullptr) continue;  // the end of an epoch
      sum += b->data.tokens[0];
      samples += b->info.rows;
    }
    print();
  }
  return 0;
}

void run_rss(benchmark::State& state, std::size_t threads) {
  const corpus_spec& c = corpora[1];
  (void)corpus(c);  // written before the first child starts
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string command = "'" + self + "' --hone_loader_rss_child=" + std::to_string(threads);
  double hwm = 0, anon = 0, file = 0, pss = 0;
  for (auto _ : state) {
    std::FILE* p = ::popen(command.c_str(), "r");
    if (p == nullptr) {
      state.SkipWithError("could not start the child process");
      return;
    }
    unsigned long long check = 0;
    const int got = std::fscanf(p, "%lf %lf %lf %lf %llu", &hwm, &anon, &file, &pss, &check);
    const int status = ::pclose(p);
    if (got != 5 || status != 0) {
      const std::string why = "the child process failed (run it alone: " + command + ")";
      state.SkipWithError(why.c_str());
      return;
    }
  }
  const double batch_bytes = static_cast<double>(batch_rows * c.width * 2);
  state.counters["threads"] = static_cast<double>(threads);
  state.counters["peak_rss_mb"] = hwm * 1024 / 1e6;
  state.counters["rss_anon_mb"] = anon * 1024 / 1e6;
  state.counters["rss_file_mb"] = file * 1024 / 1e6;
  state.counters["pss_mb"] = pss * 1024 / 1e6;
  state.counters["batches_mb"] =
      (threads == 0 ? 1.0 : static_cast<double>(rss_prefetch + 1)) * batch_bytes / 1e6;
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
  for (const std::size_t t : {1, 2, 4}) {
    hone_bench::add("loader_rss_64k", "hone_t" + std::to_string(t),
                    [t](benchmark::State& s) { run_rss(s, t); });
  }
  hone_bench::add("loader_rss_64k", "copy_loop", [](benchmark::State& s) { run_rss(s, 0); });
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string_view(argv[1]).starts_with("--hone_loader_rss_child=")) {
    return rss_child(static_cast<std::size_t>(std::strtoul(argv[1] + 24, nullptr, 10)));
  }
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
