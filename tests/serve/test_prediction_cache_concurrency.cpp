// hone::serve::prediction_cache from several threads at once (label concurrency: CI runs it under
// ThreadSanitizer with no suppression): get, put, get_or_compute and version changes on shared
// inputs, with and without the disk tier, under a budget small enough to evict all the time.
// Every output served must be the one its (version, input) defines: the output is a function of
// both, so a stale or crossed entry shows as a wrong value.
#define BOOST_TEST_MODULE hone_serve_prediction_cache_concurrency
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <hone/serve/prediction_cache.hpp>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../support/temp_dir.hpp"

namespace hs = hone::serve;

namespace {

/// The model: output = f(version, input id); independent of the cache.
std::uint64_t model(std::uint64_t version, std::uint64_t id) {
  return id * 1'000'003u + version * 7919u + 1;
}

std::string input_of(std::uint64_t id) {
  std::string s(64, '\0');
  std::memcpy(s.data(), &id, 8);
  return s;
}

/// Only 8 keys for 64 inputs: all threads contend for the same keys and every lookup of
/// another input must be caught by the input comparison.
struct half_colliding_hash {
  hs::prediction_key operator()(std::uint64_t version,
                                std::span<const std::byte> input) const noexcept {
    const hs::prediction_key k = hs::xxh3_prediction_hash{}(version, input);
    return {k.lo % 8, 0};  // 8 keys in all, one shard
  }
};

template <class Cache>
void hammer(Cache& c, int threads, int steps, bool change_versions) {
  std::atomic<std::uint64_t> wrong{0}, hits{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
      for (int i = 0; i < steps; ++i) {
        const std::uint64_t id = rng() % 64;
        const std::string in = input_of(id);
        const auto b = std::as_bytes(std::span(in.data(), in.size()));
        const std::uint64_t v = c.model_version();
        switch (rng() % 8) {
          case 0:
          case 1:
          case 2:
            c.put(v, b, model(v, id));
            break;
          case 3: {
            // The model computes with the version the cache hands it; the answer is that of a
            // version between the one read before the call and the one after it (thread 0 may
            // advance it several times meanwhile).
            const std::uint64_t got =
                c.get_or_compute(b, [&](std::uint64_t ver) { return model(ver, id); });
            const std::uint64_t after = c.model_version();
            bool ok = false;
            for (std::uint64_t w = v; w <= after && !ok; ++w) ok = got == model(w, id);
            if (!ok) ++wrong;
            break;
          }
          case 4:
            if (change_versions && t == 0 && rng() % 64 == 0) c.advance_model_version();
            (void)c.stats();
            break;
          default:
            if (auto r = c.get(v, b)) {
              ++hits;
              if (*r != model(v, id)) ++wrong;
            }
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  BOOST_TEST(wrong.load() == 0u);
  BOOST_TEST(hits.load() > 0u);
  const auto s = c.stats();
  BOOST_TEST(s.ram_bytes <= c.options().ram_budget_bytes);
  BOOST_TEST(s.hits >= hits.load());
}

}  // namespace

BOOST_AUTO_TEST_CASE(threads_share_a_ram_cache) {
  hs::prediction_cache_options o;
  o.shards = 4;
  o.ram_budget_bytes = 4 * 16 * (64 + 8 + hs::prediction_entry_overhead);  // 16 of 64 per shard
  hs::prediction_cache<std::uint64_t> c(o);
  hammer(c, 4, 20000, true);
  BOOST_TEST(c.stats().evictions > 0u);
}

BOOST_AUTO_TEST_CASE(threads_share_a_cache_whose_keys_collide) {
  hs::prediction_cache_options o;
  o.shards = 2;
  o.ram_budget_bytes = 2 * 24 * (64 + 8 + hs::prediction_entry_overhead);
  hs::prediction_cache<std::uint64_t, half_colliding_hash> c(o);
  hammer(c, 4, 20000, true);
  BOOST_TEST(c.stats().collisions > 0u);
}

BOOST_AUTO_TEST_CASE(threads_share_a_cache_with_a_disk_tier) {
  hone_test::temp_dir dir("pc-conc");
  hs::prediction_cache_options o;
  o.shards = 2;
  o.ram_budget_bytes = 2 * 8 * (64 + 8 + hs::prediction_entry_overhead);
  o.disk_directory = dir.path;
  o.disk_budget_bytes = 40 * 100;
  hs::prediction_cache<std::uint64_t> c(o);
  hammer(c, 3, 3000, true);
  const auto s = c.stats();
  BOOST_TEST(s.disk_writes > 0u);
  BOOST_TEST(s.disk_hits > 0u);
  // Nothing damages files here: a damaged count would be a race in the tier (it was one: a load
  // whose open found no file, because another thread's load or eviction had just removed it, asked
  // afterwards whether the name existed while a store was renaming a new file into place, and
  // counted the vanished file as damage).
  BOOST_TEST(s.damaged == 0u);
  BOOST_TEST(s.disk_bytes <= o.disk_budget_bytes);
}

// The race above made as likely as possible: one shard whose budget holds one entry, so every put
// spills the entry before it and every disk hit removes its file and spills another; four threads
// on four inputs remove and write the same few names all the time. Before the fix about one load
// in two thousand found its file gone and counted it as damage (15-20 per run in Release).
BOOST_AUTO_TEST_CASE(files_replaced_while_read_are_misses_not_damage) {
  hone_test::temp_dir dir("pc-replace");
  hs::prediction_cache_options o;
  o.shards = 1;
  o.ram_budget_bytes = 64 + 8 + hs::prediction_entry_overhead;  // one entry
  o.disk_directory = dir.path;
  o.disk_budget_bytes = std::uint64_t{1} << 20;
  hs::prediction_cache<std::uint64_t> c(o);
  std::atomic<std::uint64_t> wrong{0}, hits{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 101);
      for (int i = 0; i < 6000; ++i) {
        const std::uint64_t id = rng() % 4;
        const std::string in = input_of(id);
        const auto b = std::as_bytes(std::span(in.data(), in.size()));
        if (rng() % 2 == 0) {
          c.put(0, b, model(0, id));
        } else if (auto r = c.get(0, b)) {
          ++hits;
          if (*r != model(0, id)) ++wrong;
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  const auto s = c.stats();
  BOOST_TEST(wrong.load() == 0u);
  BOOST_TEST(hits.load() > 0u);
  BOOST_TEST(s.disk_hits > 1000u);
  BOOST_TEST(s.disk_write_errors == 0u);
  BOOST_TEST(s.damaged == 0u);
}
