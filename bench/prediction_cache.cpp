// bench_prediction_cache: hone::serve::prediction_cache's hit latency, throughput and miss+put cost
// on 1 KB inputs (docs/serve.md, "Prediction cache"; docs/benchmarks.md, "Prediction cache").
//
// pc_hit_1KB/<impl>: one lookup of a cached 1 KB input (1024 distinct inputs, visited in a fixed
// shuffled order, all in RAM), the output a 64-byte std::array<float, 16> copied out. Time per
// lookup.
//   hone:      prediction_cache::get (XXH3-128 of version and input, the shard's lock, the index,
//              the full comparison of the 1 KB input, the copy of the output).
//   limit:     only XXH3-128 of the 1 KB input and a memcmp against its stored copy: the work no
//              confirmed hit can skip (no lock, no index, no output).
//   std_map:   what one writes by hand: std::unordered_map<std::string, Output> under one
//              std::mutex, looked up with a std::string_view of the input (std::hash over the
//              1 KB, then the string comparison).
// pc_hit_1KB_threads<T>/hone: T threads each looking up 200 000 cached inputs (their own order)
// in one shared cache; the counter gets_per_s is the total over the threads.
// pc_miss_put_1KB/<impl>: a lookup that misses and the put of the new entry, in a cache held at
// its budget (every put evicts one entry: the steady state of a cache whose inputs do not
// repeat). hone: get + put; std_map: find + emplace + erase of the oldest (FIFO), under a mutex.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <hone/serve/prediction_cache.hpp>
#include <mutex>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "support/harness.hpp"

namespace {

namespace hs = hone::serve;
using output = std::array<float, 16>;
constexpr std::size_t input_bytes = 1024;
constexpr std::size_t n_inputs = 1024;

struct data {
  std::vector<std::string> inputs;
  std::vector<output> outputs;
  std::vector<std::uint32_t> order;
};

const data& corpus() {
  static const data d = [] {
    data r;
    std::mt19937_64 rng(42);
    for (std::size_t i = 0; i < n_inputs; ++i) {
      std::string s(input_bytes, '\0');
      for (auto& c : s) c = static_cast<char>(rng());
      r.inputs.push_back(std::move(s));
      output o{};
      for (auto& x : o) x = static_cast<float>(rng() % 1000) / 7.0f;
      r.outputs.push_back(o);
    }
    r.order.resize(n_inputs);
    std::iota(r.order.begin(), r.order.end(), 0u);
    std::shuffle(r.order.begin(), r.order.end(), rng);
    return r;
  }();
  return d;
}

std::span<const std::byte> bytes(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

hs::prediction_cache<output>& filled_cache() {
  static hs::prediction_cache<output> c({.ram_budget_bytes = std::size_t{64} << 20});
  static const bool filled = [] {
    const data& d = corpus();
    for (std::size_t i = 0; i < n_inputs; ++i) c.put(0, bytes(d.inputs[i]), d.outputs[i]);
    return true;
  }();
  (void)filled;
  return c;
}

void hit_hone(benchmark::State& state) {
  const data& d = corpus();
  auto& c = filled_cache();
  std::size_t i = 0;
  float sum = 0;
  for (auto _ : state) {
    const auto r = c.get(bytes(d.inputs[d.order[i++ & (n_inputs - 1)]]));
    if (!r) {
      state.SkipWithError("a cached input missed");
      break;
    }
    sum += (*r)[0];
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

void hit_limit(benchmark::State& state) {
  const data& d = corpus();
  static const std::vector<std::string> stored = corpus().inputs;
  std::size_t i = 0;
  std::uint64_t acc = 0;
  for (auto _ : state) {
    const std::uint32_t k = d.order[i++ & (n_inputs - 1)];
    const std::string& in = d.inputs[k];
    const XXH128_hash_t h = XXH3_128bits_withSeed(in.data(), in.size(), 0);
    acc +=
        h.low64 + static_cast<std::uint64_t>(std::memcmp(stored[k].data(), in.data(), in.size()));
  }
  benchmark::DoNotOptimize(acc);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

struct std_map_cache {
  std::mutex m;
  std::unordered_map<std::string, output> map;
};

void hit_std_map(benchmark::State& state) {
  const data& d = corpus();
  static std_map_cache c;
  static const bool filled = [] {
    for (std::size_t i = 0; i < n_inputs; ++i)
      c.map.emplace(corpus().inputs[i], corpus().outputs[i]);
    return true;
  }();
  (void)filled;
  std::size_t i = 0;
  float sum = 0;
  for (auto _ : state) {
    const std::string& in = d.inputs[d.order[i++ & (n_inputs - 1)]];
    output o;
    {
      const std::lock_guard lock(c.m);
      const auto it = c.map.find(in);
      if (it == c.map.end()) {
        state.SkipWithError("a cached input missed");
        break;
      }
      o = it->second;
    }
    sum += o[0];
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

void hit_threads(benchmark::State& state, int threads) {
  const data& d = corpus();
  auto& c = filled_cache();
  constexpr std::size_t per_thread = 200000;
  double seconds = 0;
  for (auto _ : state) {
    std::atomic<int> ready{0};
    std::atomic<std::uint64_t> missed{0};
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        ready.fetch_add(1);
        float sum = 0;
        for (std::size_t i = 0; i < per_thread; ++i) {
          const auto r = c.get(bytes(
              d.inputs[d.order[(i * 7 + static_cast<std::size_t>(t) * 331) & (n_inputs - 1)]]));
          if (r)
            sum += (*r)[0];
          else
            missed.fetch_add(1);
        }
        benchmark::DoNotOptimize(sum);
      });
    }
    for (auto& th : ts) th.join();
    const auto t1 = std::chrono::steady_clock::now();
    seconds += std::chrono::duration<double>(t1 - t0).count();
    if (missed.load() != 0) state.SkipWithError("a cached input missed");
  }
  const double gets = static_cast<double>(state.iterations()) * threads * per_thread;
  state.counters["gets_per_s"] = gets / seconds;
  state.counters["ns_per_get_per_thread"] = seconds * 1e9 * threads / gets;
  state.counters["threads"] = threads;
}

/// Inputs that never repeat: the corpus input with a counter in its first 8 bytes.
struct fresh_inputs {
  std::string buf = corpus().inputs[0];
  std::uint64_t n = 0;
  const std::string& next() {
    ++n;
    std::memcpy(buf.data(), &n, 8);
    return buf;
  }
};

constexpr std::size_t held_entries = 4096;

void miss_put_hone(benchmark::State& state) {
  hs::prediction_cache<output> c(
      {.ram_budget_bytes = 16 * (held_entries / 16) *
                           (input_bytes + sizeof(output) + hs::prediction_entry_overhead)});
  fresh_inputs in;
  const output o = corpus().outputs[0];
  for (std::size_t i = 0; i < 2 * held_entries; ++i) c.put(0, bytes(in.next()), o);  // at budget
  for (auto _ : state) {
    const std::string& x = in.next();
    if (c.get(bytes(x))) {
      state.SkipWithError("a new input hit");
      break;
    }
    c.put(0, bytes(x), o);
  }
  const auto s = c.stats();
  state.counters["evictions_per_put"] =
      static_cast<double>(s.evictions) / static_cast<double>(s.puts);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

void miss_put_std_map(benchmark::State& state) {
  std::mutex m;
  std::unordered_map<std::string, output> map;
  std::deque<std::string> fifo;
  fresh_inputs in;
  const output o = corpus().outputs[0];
  auto put = [&](const std::string& x) {
    map.emplace(x, o);
    fifo.push_back(x);
    if (fifo.size() > held_entries) {
      map.erase(fifo.front());
      fifo.pop_front();
    }
  };
  for (std::size_t i = 0; i < 2 * held_entries; ++i) put(in.next());
  for (auto _ : state) {
    const std::string& x = in.next();
    const std::lock_guard lock(m);
    if (map.find(x) != map.end()) {
      state.SkipWithError("a new input hit");
      break;
    }
    put(x);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

bool register_benchmarks() {
  auto ns = [](benchmark::internal::Benchmark* b) { b->Unit(benchmark::kNanosecond); };
  ns(hone_bench::register_named("pc_hit_1KB/hone", hit_hone));
  ns(hone_bench::register_named("pc_hit_1KB/limit", hit_limit));
  ns(hone_bench::register_named("pc_hit_1KB/std_map", hit_std_map));
  for (const int t : {1, 2}) {
    hone_bench::register_named("pc_hit_1KB_threads" + std::to_string(t) + "/hone",
                               [t](benchmark::State& s) { hit_threads(s, t); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  ns(hone_bench::register_named("pc_miss_put_1KB/hone", miss_put_hone));
  ns(hone_bench::register_named("pc_miss_put_1KB/std_map", miss_put_std_map));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
