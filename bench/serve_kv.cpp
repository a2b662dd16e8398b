// bench_serve_kv: hone::serve's paged KV cache (kv_block_pool, kv_cache).
//
// kv_block_alloc_free/hone: a pool of 4096 blocks; one iteration allocates 1024 blocks and frees
//   them. Counter ns_per_block: (allocate + release) per block.
// kv_seq_block/hone: one iteration starts an empty sequence, appends one token (which takes a
//   block and writes 1 head x 8 floats of K and V) and frees the sequence (the partial block goes
//   back to the free list). Counter ns_per_block: the whole cycle, per block.
// kv_prefix_lookup/hone_b16: a cached 2048-token prompt (128 blocks of 16 tokens); one iteration
//   looks the whole prompt up (lookup(): the chained XXH3-128 of every block, the hash table, the
//   token comparison). Counter ns_per_token.
// kv_waste/<distribution>: 2000 sequences with lengths drawn from the distribution (max length
//   2048, blocks of 16 tokens), appended through the cache; counters waste_pct_paged (slots held
//   but not filled / slots held) and waste_pct_contiguous (the same for one buffer of the max
//   length per sequence). Distributions: uniform (lengths uniform in [1, 2048]) and lognormal
//   (median 300, sigma 1, clipped to [1, 2048]); seed 1.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <hone/serve.hpp>
#include <random>
#include <vector>

#include "support/harness.hpp"

namespace {

namespace hs = hone::serve;

void alloc_free(benchmark::State& state) {
  hs::kv_block_pool<float> pool({16, 1, 8}, 4096);
  std::vector<hs::kv_block_id> ids(1024);
  for (auto _ : state) {
    for (auto& id : ids) id = pool.allocate();
    benchmark::DoNotOptimize(ids.data());
    for (const auto id : ids) pool.release(id);
    benchmark::ClobberMemory();
  }
  state.counters["ns_per_block"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 1024,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void seq_block(benchmark::State& state) {
  hs::kv_cache<float> c({16, 1, 8}, 64);
  const std::vector<float> k(8, 1.0f), v(8, 2.0f);
  hs::kv_token t = 0;
  for (auto _ : state) {
    const auto s = c.add_sequence().seq;
    c.append(s, t++, k, v);
    c.free_sequence(s);
  }
  state.counters["ns_per_block"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void prefix_lookup(benchmark::State& state) {
  constexpr std::size_t tokens = 2048;
  hs::kv_cache<float> c({16, 1, 8}, 256);
  std::vector<hs::kv_token> prompt(tokens);
  std::mt19937 rng(1);
  for (auto& t : prompt) t = static_cast<hs::kv_token>(rng() % 32000);
  const auto s = c.add_sequence().seq;
  const std::vector<float> k(tokens * 8, 1.0f), v(tokens * 8, 2.0f);
  c.append(s, prompt, k, v);
  std::size_t found = 0;
  for (auto _ : state) {
    found = c.lookup(prompt);
    benchmark::DoNotOptimize(found);
  }
  if (found != tokens) state.SkipWithError("the cached prompt was not found");
  state.counters["ns_per_token"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * tokens,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void waste(benchmark::State& state, bool lognormal) {
  constexpr std::size_t seqs = 2000, max_len = 2048, bt = 16;
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<std::size_t> uni(1, max_len);
  std::lognormal_distribution<double> logn(std::log(300.0), 1.0);
  std::vector<std::size_t> lens(seqs);
  std::size_t total = 0;
  for (auto& n : lens) {
    n = lognormal
            ? std::clamp<std::size_t>(static_cast<std::size_t>(std::llround(logn(rng))), 1, max_len)
            : uni(rng);
    total += n;
  }
  double paged = 0, contiguous = 0;
  for (auto _ : state) {
    hs::kv_cache<float> c({bt, 1, 1}, (total + seqs * bt) / bt);
    for (const std::size_t n : lens) {
      const auto s = c.add_sequence().seq;
      std::vector<hs::kv_token> toks(n);
      for (std::size_t i = 0; i < n; ++i) toks[i] = static_cast<hs::kv_token>(rng() % 32000);
      const std::vector<float> k(n, 0.5f), v(n, 0.25f);
      c.append(s, toks, k, v);
    }
    const double held = static_cast<double>(c.used_blocks() * bt);
    paged = 100.0 * (held - static_cast<double>(total)) / held;
    const double cont = static_cast<double>(seqs * max_len);
    contiguous = 100.0 * (cont - static_cast<double>(total)) / cont;
  }
  state.counters["waste_pct_paged"] = paged;
  state.counters["waste_pct_contiguous"] = contiguous;
  state.counters["mean_len"] = static_cast<double>(total) / seqs;
}

bool register_benchmarks() {
  hone_bench::add("kv_block_alloc_free", "hone", alloc_free);
  hone_bench::add("kv_seq_block", "hone", seq_block);
  hone_bench::add("kv_prefix_lookup", "hone_b16", prefix_lookup);
  hone_bench::register_named("kv_waste/uniform", [](benchmark::State& s) {
    waste(s, false);
  })->Iterations(1);
  hone_bench::register_named("kv_waste/lognormal", [](benchmark::State& s) {
    waste(s, true);
  })->Iterations(1);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
