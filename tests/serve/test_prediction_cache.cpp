// hone::serve::prediction_cache, single-threaded: hits confirmed by the full input (a hash policy
// that collides on purpose), versions, TTL with a test clock, CLOCK eviction step by step, the
// byte budget, a random workload against a std::map oracle, option checks, and the cache in front
// of a model served by the dynamic batcher. The disk tier:
// tests/serve/test_prediction_cache_disk.cpp.
#define BOOST_TEST_MODULE hone_serve_prediction_cache
#include <boost/test/unit_test.hpp>

#include "test_clock.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <hone/serve/batcher.hpp>
#include <hone/serve/prediction_cache.hpp>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace hs = hone::serve;
using namespace std::chrono_literals;

namespace {

/// Every input of the same length gets the same key: every lookup of another input of that
/// length finds a stored entry whose key matches and whose input does not.
struct colliding_hash {
  hs::prediction_key operator()(std::uint64_t version,
                                std::span<const std::byte> input) const noexcept {
    return {input.size(), version};
  }
};

std::span<const std::byte> bytes(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

using cache_t = hs::prediction_cache<std::string>;

hs::prediction_cache_options small(std::size_t entries, std::size_t entry_bytes) {
  hs::prediction_cache_options o;
  o.shards = 1;
  o.ram_budget_bytes = entries * (entry_bytes + hs::prediction_entry_overhead);
  return o;
}

}  // namespace

BOOST_AUTO_TEST_CASE(hit_after_put_miss_before_and_for_other_inputs) {
  cache_t c;
  const std::string a = "input a", b = "input b";
  BOOST_TEST(!c.get(bytes(a)).has_value());
  BOOST_TEST(c.put(c.model_version(), bytes(a), std::string("output of a")));
  BOOST_TEST(c.get(bytes(a)).value() == "output of a");
  BOOST_TEST(!c.get(bytes(b)).has_value());
  const auto s = c.stats();
  BOOST_TEST(s.hits == 1u);
  BOOST_TEST(s.misses == 2u);
  BOOST_TEST(s.puts == 1u);
  BOOST_TEST(s.entries == 1u);
  BOOST_TEST(s.ram_bytes == a.size() + 11 + hs::prediction_entry_overhead);
}

BOOST_AUTO_TEST_CASE(the_default_key_is_xxh3_128_of_the_input_seeded_with_the_version) {
  const std::string in(1024, 'x');
  const auto k = hs::xxh3_prediction_hash{}(7, bytes(in));
  const XXH128_hash_t ref = XXH3_128bits_withSeed(in.data(), in.size(), 7);
  BOOST_TEST(k.lo == ref.low64);
  BOOST_TEST(k.hi == ref.high64);
  BOOST_TEST(!(hs::xxh3_prediction_hash{}(8, bytes(in)) == k));
}

BOOST_AUTO_TEST_CASE(a_colliding_hash_never_serves_another_inputs_output) {
  hs::prediction_cache<std::string, colliding_hash> c;
  const std::string a = "aaaa", b = "bbbb";  // same length: same key
  BOOST_TEST(c.put(0, bytes(a), std::string("A")));
  BOOST_TEST(!c.get(bytes(b)).has_value());  // the key matches, the input does not
  BOOST_TEST(c.stats().collisions == 1u);
  BOOST_TEST(c.get(bytes(a)).value() == "A");
  // b's put replaces a's entry under the shared key (one more collision), and is served for b only
  BOOST_TEST(c.put(0, bytes(b), std::string("B")));
  BOOST_TEST(c.stats().collisions == 2u);
  BOOST_TEST(c.get(bytes(b)).value() == "B");
  BOOST_TEST(!c.get(bytes(a)).has_value());
  BOOST_TEST(c.stats().collisions == 3u);
  BOOST_TEST(c.stats().entries == 1u);
  // an input that differs in its last byte only
  const std::string b2 = "bbbc";
  BOOST_TEST(!c.get(bytes(b2)).has_value());
  BOOST_TEST(c.stats().collisions == 4u);
}

BOOST_AUTO_TEST_CASE(a_new_model_version_never_serves_older_entries) {
  cache_t c({.model_version = 3});
  const std::string a = "a";
  BOOST_TEST(c.put(3, bytes(a), std::string("v3")));
  BOOST_TEST(c.get(bytes(a)).value() == "v3");
  BOOST_TEST(c.advance_model_version() == 4u);
  BOOST_TEST(!c.get(bytes(a)).has_value());
  BOOST_TEST(!c.get(3, bytes(a)).has_value());  // asking for the old version explicitly: no
  BOOST_TEST(c.stats().stale == 1u);            // removed when the version changed
  BOOST_TEST(c.stats().entries == 0u);
  // an output computed with the old weights and stored after the change is refused
  BOOST_TEST(!c.put(3, bytes(a), std::string("late v3")));
  BOOST_TEST(c.stats().rejected_puts == 1u);
  BOOST_TEST(!c.get(bytes(a)).has_value());
  BOOST_TEST(c.put(4, bytes(a), std::string("v4")));
  BOOST_TEST(c.get(bytes(a)).value() == "v4");
  BOOST_CHECK_THROW(c.set_model_version(4), hone::config_error);
  BOOST_CHECK_THROW(c.set_model_version(2), hone::config_error);
  c.set_model_version(10);
  BOOST_TEST(c.model_version() == 10u);
  BOOST_TEST(!c.get(bytes(a)).has_value());
}

BOOST_AUTO_TEST_CASE(an_old_version_entry_under_a_colliding_key_is_not_served) {
  // The key ignores the version here, so only the stored version keeps v0's output from v1.
  struct version_blind {
    hs::prediction_key operator()(std::uint64_t, std::span<const std::byte> in) const noexcept {
      return {in.size(), 0};
    }
  };
  hs::prediction_cache<std::string, version_blind> c;
  const std::string a = "a";
  BOOST_TEST(c.put(0, bytes(a), std::string("v0")));
  // bypass set_model_version's removal: a put racing with the change could leave such an entry
  c.advance_model_version();
  BOOST_TEST(c.put(1, bytes(a), std::string("v1")));
  BOOST_TEST(c.get(bytes(a)).value() == "v1");
}

BOOST_AUTO_TEST_CASE(ttl_expires_entries_at_exactly_the_ttl) {
  test_clock::t = {};
  hs::prediction_cache<int, hs::xxh3_prediction_hash, test_clock> c({.ttl = 1000ns});
  const std::string a = "a";
  BOOST_TEST(c.put(0, bytes(a), 42));
  test_clock::advance(999ns);
  BOOST_TEST(c.get(bytes(a)).value() == 42);
  test_clock::advance(1ns);
  BOOST_TEST(!c.get(bytes(a)).has_value());
  BOOST_TEST(c.stats().expired == 1u);
  BOOST_TEST(c.stats().entries == 0u);
  // a put restarts the TTL
  BOOST_TEST(c.put(0, bytes(a), 43));
  test_clock::advance(500ns);
  BOOST_TEST(c.put(0, bytes(a), 44));
  test_clock::advance(900ns);
  BOOST_TEST(c.get(bytes(a)).value() == 44);
}

BOOST_AUTO_TEST_CASE(clock_eviction_step_by_step) {
  // Four entries fit; inputs of 1 byte and int outputs: every entry is charged the same.
  auto o = small(4, 1 + sizeof(int));
  hs::prediction_cache<int> c(o);
  const std::string A = "A", B = "B", C = "C", D = "D", E = "E", F = "F", G = "G";
  for (const auto* k : {&A, &B, &C, &D}) BOOST_TEST(c.put(0, bytes(*k), (*k)[0]));
  BOOST_TEST(c.stats().evictions == 0u);
  BOOST_TEST(c.get(bytes(A)).has_value());  // referenced
  BOOST_TEST(c.get(bytes(C)).has_value());  // referenced
  // E is stored first (slot 4), then the hand (at slot 0) clears A's bit and takes B (slot 1).
  BOOST_TEST(c.put(0, bytes(E), 'E'));
  BOOST_TEST(c.stats().entries == 4u);
  BOOST_TEST(!c.get(bytes(B)).has_value());  // a miss changes no bit
  // F takes B's free slot; the hand (at slot 2) clears C's bit and takes D (slot 3).
  BOOST_TEST(c.put(0, bytes(F), 'F'));
  BOOST_TEST(!c.get(bytes(D)).has_value());
  // G takes D's slot; the hand (at slot 4) finds E, never looked up since it was stored: E goes,
  // before A and C, whose bits the hand has cleared but which it has not reached again.
  BOOST_TEST(c.put(0, bytes(G), 'G'));
  BOOST_TEST(!c.get(bytes(E)).has_value());
  BOOST_TEST(c.get(bytes(A)).value() == 'A');
  BOOST_TEST(c.get(bytes(C)).value() == 'C');
  BOOST_TEST(c.get(bytes(F)).value() == 'F');
  BOOST_TEST(c.get(bytes(G)).value() == 'G');
  BOOST_TEST(c.stats().evictions == 3u);
  BOOST_TEST(c.stats().entries == 4u);
}

BOOST_AUTO_TEST_CASE(the_byte_budget_holds_and_an_oversized_entry_is_refused) {
  hs::prediction_cache_options o;
  o.shards = 4;
  o.ram_budget_bytes = 4 * 4096;
  hs::prediction_cache<std::vector<float>> c(o);
  std::mt19937 rng(1);
  for (int i = 0; i < 2000; ++i) {
    const std::string in = "req" + std::to_string(i);
    std::vector<float> out(rng() % 200, static_cast<float>(i));
    c.put(0, bytes(in), out);
    BOOST_TEST_REQUIRE(c.stats().ram_bytes <= o.ram_budget_bytes);
  }
  const std::string big = "big";
  BOOST_TEST(!c.put(0, bytes(big), std::vector<float>(1024)));  // 4096 + overhead > 4096
  BOOST_TEST(!c.get(bytes(big)).has_value());
}

BOOST_AUTO_TEST_CASE(a_random_workload_agrees_with_a_map_oracle) {
  // The oracle: the last output put for each (version, input). Every hit must equal it; entries
  // may be missing (evicted), never wrong. A small budget keeps eviction busy.
  hs::prediction_cache_options o;
  o.shards = 2;
  o.ram_budget_bytes = 40 * (8 + 8 + hs::prediction_entry_overhead);
  hs::prediction_cache<std::uint64_t, colliding_hash> c(o);  // collisions everywhere too
  std::map<std::pair<std::uint64_t, std::string>, std::uint64_t> oracle;
  std::mt19937_64 rng(7);
  std::uint64_t hits = 0, served = 0;
  for (int step = 0; step < 200000; ++step) {
    const std::uint64_t v = c.model_version();
    std::string in(8, '\0');
    const std::uint64_t id = rng() % 100;
    std::memcpy(in.data(), &id, 8);
    if (rng() % 1000 == 0) {
      c.advance_model_version();
      continue;
    }
    if (rng() % 3 == 0) {
      const std::uint64_t out = rng();
      c.put(v, bytes(in), out);
      oracle[{v, in}] = out;
    } else if (auto r = c.get(bytes(in))) {
      ++hits;
      const auto it = oracle.find({c.model_version(), in});
      BOOST_TEST_REQUIRE((it != oracle.end() && it->second == *r));
      ++served;
    }
  }
  BOOST_TEST(hits > 1000u);  // the test exercised hits, not only misses
  BOOST_TEST(served == hits);
  BOOST_TEST(c.stats().collisions > 0u);
}

BOOST_AUTO_TEST_CASE(get_or_compute_runs_the_model_once_per_input) {
  cache_t c;
  int calls = 0;
  const std::string a = "a";
  for (int i = 0; i < 5; ++i) {
    BOOST_TEST(c.get_or_compute(bytes(a), [&] {
      ++calls;
      return std::string("out");
    }) == "out");
  }
  BOOST_TEST(calls == 1);
  // A compute that takes the version gets the one its output is cached under.
  c.advance_model_version();
  std::uint64_t seen = 0;
  BOOST_TEST(c.get_or_compute(bytes(a), [&](std::uint64_t ver) {
    seen = ver;
    return std::string("v") + std::to_string(ver);
  }) == "v" + std::to_string(c.model_version()));
  BOOST_TEST(seen == c.model_version());
  BOOST_TEST(c.get(c.model_version(), bytes(a)).value() == "v" + std::to_string(seen));
}

BOOST_AUTO_TEST_CASE(bad_options_are_refused_with_a_sentence) {
  BOOST_CHECK_EXCEPTION(cache_t({.shards = 3}), hone::config_error, [](const auto& e) {
    return std::string(e.what()).find("power of two") != std::string::npos;
  });
  BOOST_CHECK_EXCEPTION(cache_t({.ram_budget_bytes = 100}), hone::config_error, [](const auto& e) {
    return std::string(e.what()).find("raise the budget") != std::string::npos;
  });
  BOOST_CHECK_THROW(cache_t({.ttl = -1ns}), hone::config_error);
}

// The concepts, checked here; the sentences in cf_serve_prediction_cache_*.
struct no_codec {
  std::vector<int> v;
  no_codec() = default;
  no_codec(const no_codec&) = default;
  ~no_codec() {}
};
static_assert(hs::cacheable_output<int>);
static_assert(hs::cacheable_output<std::vector<float>>);
static_assert(hs::cacheable_output<std::string>);
static_assert(!hs::cacheable_output<no_codec>);
static_assert(hs::prediction_hasher<hs::xxh3_prediction_hash>);
static_assert(hs::prediction_hasher<colliding_hash>);
static_assert(!hs::prediction_hasher<int>);

// ---------------------------------------------------------------------------------------------
// In front of the dynamic batcher

namespace {
/// Squares each request and records the batches it saw.
struct square_model {
  std::vector<std::vector<int>> batches;
  std::vector<long> infer(std::span<const int> batch) {
    batches.emplace_back(batch.begin(), batch.end());
    std::vector<long> out;
    for (int x : batch) out.push_back(static_cast<long>(x) * x);
    return out;
  }
};
struct int_bytes {
  std::span<const std::byte> operator()(const int& x) const noexcept {
    return std::as_bytes(std::span(&x, 1));
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(cached_requests_skip_the_model_behind_the_batcher) {
  square_model m;
  hs::prediction_cache<long> cache;
  using wrapped = hs::cached_model<square_model, int, int_bytes>;
  static_assert(hs::check_batch_model<wrapped, int>());
  wrapped w(m, cache, {});
  hs::dynamic_batcher<wrapped, int> b(w, {.max_batch_size = 4, .mode = hs::dispatch_mode::manual});
  auto run = [&](std::vector<int> reqs) {
    std::vector<hs::request_handle<long>> hs_;
    for (int r : reqs) hs_.push_back(b.submit(r));
    while (b.queued() > 0) b.poll();
    std::vector<long> out;
    for (auto& h : hs_) out.push_back(h.get());
    return out;
  };
  BOOST_TEST((run({1, 2, 3, 4}) == std::vector<long>{1, 4, 9, 16}));
  BOOST_TEST((m.batches.back() == std::vector<int>{1, 2, 3, 4}));
  BOOST_TEST((run({3, 5, 1, 6}) == std::vector<long>{9, 25, 1, 36}));
  BOOST_TEST((m.batches.back() == std::vector<int>{5, 6}));  // 3 and 1 came from the cache
  const std::size_t batches = m.batches.size();
  BOOST_TEST((run({4, 3, 2, 1}) == std::vector<long>{16, 9, 4, 1}));
  BOOST_TEST(m.batches.size() == batches);  // all cached: the model did not run
  // new weights: everything runs again
  cache.advance_model_version();
  BOOST_TEST((run({1, 2}) == std::vector<long>{1, 4}));
  BOOST_TEST((m.batches.back() == std::vector<int>{1, 2}));
  // the pattern that skips the queue too: look up before submitting
  const int x = 5;
  BOOST_TEST(!cache.get(int_bytes{}(x)).has_value());  // 5 was cached at the old version only
  run({5});
  BOOST_TEST(cache.get(int_bytes{}(x)).value() == 25);
}
