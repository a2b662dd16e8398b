// Tests of hone/data/feature_cache.hpp: the RAM tier against a reference LRU model written here
// (the same hits, misses, evictions and resident keys after every lookup, the byte budget never
// exceeded), spills and promotions returning the exact bytes (and the spill file read back by a
// reader written here from the documented record layout with plain ZSTD_decompress), version
// bumps never serving the old feature, no single-bit flip (two bits of every byte) and no
// truncation of a spilled record ever serving wrong bytes, the disk budget (first in, first out,
// compaction reclaiming dropped records, records larger than the budget), a failing write turning
// the disk tier off, the refusals' sentences, and loader threads sharing one cache (label
// concurrency: TSan in CI).
#define BOOST_TEST_MODULE hone_data_feature_cache
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <hone/data/feature_cache.hpp>
#include <hone/io/file_io.hpp>
#include <hone/io/hash.hpp>
#include <list>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../support/temp_dir.hpp"

namespace data = hone::data;
namespace fs = std::filesystem;
using cache_t = data::feature_cache<std::uint64_t, float>;

namespace {

/// The oracle feature of (key, version): `n` floats of random bits (incompressible unless
/// `compressible`, then small integers), a pure function of its arguments.
std::vector<float> feature_of(std::uint64_t key, std::uint64_t version, std::size_t n,
                              bool compressible = false) {
  std::mt19937_64 g(key * 1000003u + version * 7919u + n);
  std::vector<float> v(n);
  for (auto& x : v) {
    const auto bits =
        compressible ? static_cast<std::uint32_t>(g() % 4) << 23 : static_cast<std::uint32_t>(g());
    std::memcpy(&x, &bits, 4);
  }
  return v;
}

bool same_bytes(std::span<const float> a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), b.size() * sizeof(float)) == 0;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_whole(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::uint64_t get64(const std::string& s, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}
std::uint32_t get32(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

struct parsed_record {
  std::uint64_t key, version;
  std::vector<float> feature;
};
/// The spill file read from the layout in docs/data.md alone (little-endian fields, a u64 key).
std::vector<parsed_record> parse_spill(const std::string& f) {
  std::vector<parsed_record> out;
  std::size_t at = 0;
  while (at < f.size()) {
    BOOST_REQUIRE_GE(f.size() - at, 56u);
    BOOST_REQUIRE(f.compare(at, 8, "HONEFC1L") == 0);
    parsed_record r;
    r.version = get64(f, at + 8);
    const std::uint64_t count = get64(f, at + 16);
    BOOST_REQUIRE_EQUAL(get32(f, at + 24), 4u);
    BOOST_REQUIRE_EQUAL(get32(f, at + 28), 8u);
    const std::uint64_t frame = get64(f, at + 32);
    const std::uint64_t hash = get64(f, at + 40);
    r.key = get64(f, at + 48);
    BOOST_REQUIRE_LE(at + 56 + frame, f.size());
    r.feature.resize(count);
    const std::size_t n = ZSTD_decompress(r.feature.data(), count * 4, f.data() + at + 56, frame);
    BOOST_REQUIRE(!ZSTD_isError(n));
    BOOST_REQUIRE_EQUAL(n, count * 4);
    BOOST_REQUIRE_EQUAL(XXH3_64bits(r.feature.data(), n), hash);
    out.push_back(std::move(r));
    at += 56 + frame;
  }
  return out;
}

template <class E>
auto says(std::string text) {
  return [text](const E& e) {
    const bool ok = std::string(e.what()).find(text) != std::string::npos;
    if (!ok) BOOST_TEST_MESSAGE("message was: " << e.what());
    return ok;
  };
}

}  // namespace

BOOST_AUTO_TEST_CASE(ram_tier_follows_a_reference_lru) {
  constexpr std::size_t budget = 4000;
  cache_t c({.ram_bytes = budget, .shards = 1});
  // The reference: keys most recent first, with their bytes.
  std::list<std::pair<std::uint64_t, std::size_t>> model;
  std::uint64_t hits = 0, misses = 0, evictions = 0;
  auto size_of = [](std::uint64_t k) -> std::size_t { return 5 + (k * 7) % 60; };
  std::mt19937_64 g(3);
  for (int step = 0; step < 3000; ++step) {
    const std::uint64_t k = (g() % 2 == 0) ? g() % 8 : g() % 40;
    bool computed = false;
    auto f = c.get_or_compute(k, 1, [&](std::vector<float>& out) {
      computed = true;
      out = feature_of(k, 1, size_of(k));
    });
    BOOST_REQUIRE(same_bytes(f, feature_of(k, 1, size_of(k))));
    auto it = std::find_if(model.begin(), model.end(), [&](const auto& e) { return e.first == k; });
    BOOST_REQUIRE_EQUAL(computed, it == model.end());
    if (it != model.end()) {
      ++hits;
      model.splice(model.begin(), model, it);
    } else {
      ++misses;
      model.emplace_front(k, size_of(k) * sizeof(float));
    }
    std::size_t bytes = 0;
    for (const auto& e : model) bytes += e.second;
    while (bytes > budget) {
      bytes -= model.back().second;
      model.pop_back();
      ++evictions;
    }
    const auto s = c.stats();
    BOOST_REQUIRE_EQUAL(s.ram_hits, hits);
    BOOST_REQUIRE_EQUAL(s.misses, misses);
    BOOST_REQUIRE_EQUAL(s.evictions, evictions);
    BOOST_REQUIRE_EQUAL(s.ram_bytes, bytes);
    BOOST_REQUIRE_LE(s.ram_bytes, budget);
    BOOST_REQUIRE_EQUAL(s.ram_entries, model.size());
    for (std::uint64_t key = 0; key < 40; ++key) {
      const bool in_model =
          std::any_of(model.begin(), model.end(), [&](const auto& e) { return e.first == key; });
      BOOST_REQUIRE_EQUAL(c.in_ram(key, 1), in_model);
    }
  }
  const auto s = c.stats();
  BOOST_TEST(s.disk_hits == 0u);
  BOOST_TEST(s.spills == 0u);
  BOOST_TEST(s.hit_rate() == static_cast<double>(hits) / 3000.0);
  BOOST_TEST(evictions > 100u);
  BOOST_TEST_MESSAGE("RAM-only hit rate on the skewed walk: " << s.hit_rate());
}

BOOST_AUTO_TEST_CASE(sharded_ram_tier_stays_within_budget) {
  constexpr std::size_t budget = 8000;
  cache_t c({.ram_bytes = budget, .shards = 4});
  BOOST_TEST(c.shard_ram_bytes() == 2000u);
  std::mt19937_64 g(5);
  for (int i = 0; i < 2000; ++i) {
    const std::uint64_t k = g() % 100;
    auto f =
        c.get_or_compute(k, 7, [&](std::vector<float>& out) { out = feature_of(k, 7, 10 + k); });
    BOOST_REQUIRE(same_bytes(f, feature_of(k, 7, 10 + k)));
    BOOST_REQUIRE_LE(c.stats().ram_bytes, budget);
  }
  const auto s = c.stats();
  BOOST_TEST(s.lookups() == 2000u);
  BOOST_TEST(s.ram_hits > 0u);
}

BOOST_AUTO_TEST_CASE(spill_and_promote_return_the_exact_bytes) {
  hone_test::temp_dir dir("fcache");
  // RAM holds about 1/8 of the features; the rest goes to disk and comes back.
  cache_t c({.ram_bytes = 3000, .disk_dir = dir.path, .disk_bytes = 1 << 20, .shards = 1});
  auto n_of = [](std::uint64_t k) -> std::size_t { return 16 + (k * 37) % 185; };
  std::size_t computed = 0;
  for (std::uint64_t k = 0; k < 50; ++k) {
    auto f = c.get_or_compute(k, 3, [&](std::vector<float>& out) {
      ++computed;
      out = feature_of(k, 3, n_of(k));
    });
    BOOST_REQUIRE(same_bytes(f, feature_of(k, 3, n_of(k))));
  }
  BOOST_TEST(computed == 50u);
  auto s = c.stats();
  BOOST_TEST(s.spills == s.evictions);
  BOOST_TEST(s.disk_entries == s.spills);
  BOOST_TEST(s.disk_entries + s.ram_entries == 50u);
  BOOST_TEST(fs::file_size(c.spill_path()) == s.disk_bytes);
  // The spill file, read by the test's own reader: every record is its key's feature.
  const auto records = parse_spill(read_file(c.spill_path()));
  BOOST_TEST(records.size() == s.spills);
  for (const auto& r : records) {
    BOOST_TEST(r.version == 3u);
    BOOST_TEST(same_bytes(r.feature, feature_of(r.key, 3, n_of(r.key))));
    BOOST_TEST(c.on_disk(r.key, 3));
  }
  // Every feature again, in a shuffled order: nothing is computed, every byte is the same.
  std::vector<std::uint64_t> order(50);
  for (std::uint64_t k = 0; k < 50; ++k) order[k] = k;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(9));
  for (std::uint64_t k : order) {
    const bool was_in_ram = c.in_ram(k, 3);
    const auto before = c.stats();
    auto f = c.get_or_compute(k, 3, [&](std::vector<float>& out) {
      ++computed;
      out = feature_of(k, 3, n_of(k));
    });
    BOOST_REQUIRE(same_bytes(f, feature_of(k, 3, n_of(k))));
    const auto after = c.stats();
    BOOST_REQUIRE_EQUAL(after.ram_hits - before.ram_hits, was_in_ram ? 1u : 0u);
    BOOST_REQUIRE_EQUAL(after.disk_hits - before.disk_hits, was_in_ram ? 0u : 1u);
    BOOST_REQUIRE(c.in_ram(k, 3));  // promoted
  }
  BOOST_TEST(computed == 50u);
  s = c.stats();
  BOOST_TEST(s.disk_hits > 30u);
  BOOST_TEST(s.corrupt == 0u);
  BOOST_TEST(s.hit_rate() == 0.5);
  // A promoted entry keeps its record, so evicting it again writes nothing: each key was written
  // at most once, and every record written is still served.
  BOOST_TEST(s.spills <= 50u);
  BOOST_TEST(s.spills == s.disk_entries);
  BOOST_TEST(parse_spill(read_file(c.spill_path())).size() == s.spills);
  // Compressible features take far less room on disk than in RAM.
  hone_test::temp_dir dir2("fcache");
  cache_t z({.ram_bytes = 4096, .disk_dir = dir2.path, .disk_bytes = 1 << 20, .shards = 1});
  for (std::uint64_t k = 0; k < 2; ++k) {
    z.get_or_compute(k, 1, [&](std::vector<float>& out) { out = feature_of(k, 1, 1024, true); });
  }
  BOOST_TEST(z.stats().spills == 1u);
  BOOST_TEST(z.stats().disk_bytes < 1024u * 4u / 2u);
  auto back = z.get_or_compute(0, 1, [](std::vector<float>&) { BOOST_FAIL("recomputed"); });
  BOOST_TEST(same_bytes(back, feature_of(0, 1, 1024, true)));
}

BOOST_AUTO_TEST_CASE(spill_file_is_removed_with_its_cache) {
  hone_test::temp_dir dir("fcache");
  fs::path p;
  {
    cache_t c({.ram_bytes = 64, .disk_dir = dir.path, .disk_bytes = 4096, .shards = 1});
    p = c.spill_path();
    BOOST_TEST(p.parent_path() == dir.path);
    BOOST_TEST(p.extension() == ".hfc");
    BOOST_TEST(fs::exists(p));
  }
  BOOST_TEST(!fs::exists(p));
  BOOST_TEST(fs::is_empty(dir.path));
}

BOOST_AUTO_TEST_CASE(a_version_bump_never_serves_the_old_feature) {
  // RAM only.
  cache_t c({.ram_bytes = 1 << 16, .shards = 2});
  int computed = 0;
  auto get = [&](cache_t& cache, std::uint64_t k, std::uint64_t v) {
    return cache.get_or_compute(k, v, [&](std::vector<float>& out) {
      ++computed;
      out = feature_of(k, v, 32);
    });
  };
  BOOST_TEST(same_bytes(get(c, 5, 1), feature_of(5, 1, 32)));
  BOOST_TEST(same_bytes(get(c, 5, 2), feature_of(5, 2, 32)));
  BOOST_TEST(computed == 2);
  BOOST_TEST(c.stats().stale == 1u);
  BOOST_TEST(c.stats().misses == 2u);
  BOOST_TEST(!c.in_ram(5, 1));
  BOOST_TEST(same_bytes(get(c, 5, 2), feature_of(5, 2, 32)));  // a hit at the new version
  BOOST_TEST(computed == 2);
  BOOST_TEST(same_bytes(get(c, 5, 1), feature_of(5, 1, 32)));  // back: stale again
  BOOST_TEST(computed == 3);
  BOOST_TEST(c.stats().stale == 2u);
  BOOST_TEST(c.stats().ram_hits == 1u);

  // With the old version on disk.
  hone_test::temp_dir dir("fcache");
  cache_t d({.ram_bytes = 32 * 4, .disk_dir = dir.path, .disk_bytes = 1 << 16, .shards = 1});
  computed = 0;
  get(d, 1, 10);
  get(d, 2, 10);  // evicts 1@10 to disk
  BOOST_TEST(d.on_disk(1, 10));
  BOOST_TEST(same_bytes(get(d, 1, 11), feature_of(1, 11, 32)));
  BOOST_TEST(computed == 3);
  BOOST_TEST(d.stats().stale == 1u);
  BOOST_TEST(d.stats().disk_hits == 0u);
  BOOST_TEST(!d.on_disk(1, 10));  // dropped
  get(d, 2, 10);                  // from disk; evicts 1@11 to disk
  BOOST_TEST(d.stats().disk_hits == 1u);
  BOOST_TEST(d.on_disk(1, 11));
  BOOST_TEST(same_bytes(get(d, 1, 11), feature_of(1, 11, 32)));
  BOOST_TEST(d.stats().disk_hits == 2u);
  BOOST_TEST(computed == 3);
  // Asking the old version again never finds the new record as a hit either.
  get(d, 2, 10);
  BOOST_TEST(same_bytes(get(d, 1, 10), feature_of(1, 10, 32)));
  BOOST_TEST(computed == 4);
  BOOST_TEST(d.stats().stale == 2u);
}

namespace {
/// A cache whose spill file holds exactly one record, of key 1 (key 2 sits in RAM).
struct one_spilled {
  explicit one_spilled(const fs::path& dir)
      : cache({.ram_bytes = 64 * 4, .disk_dir = dir, .disk_bytes = 1 << 16, .shards = 1}) {
    get(1);
    get(2);
    BOOST_REQUIRE(cache.on_disk(1, 4));
    BOOST_REQUIRE(!cache.in_ram(1, 4));
  }
  static std::vector<float> want(std::uint64_t k) { return feature_of(k, 4, 64, true); }
  data::feature_ref<float> get(std::uint64_t k) {
    return cache.get_or_compute(k, 4, [&](std::vector<float>& out) {
      ++computed;
      out = want(k);
    });
  }
  cache_t cache;
  int computed = 0;
};
}  // namespace

BOOST_AUTO_TEST_CASE(a_damaged_or_truncated_record_is_never_served) {
  hone_test::temp_dir dir("fcache");
  std::string pristine;
  {
    one_spilled o(dir.path);
    pristine = read_file(o.cache.spill_path());
  }
  const std::size_t size = pristine.size();
  BOOST_TEST_MESSAGE("one record: " << size << " bytes");
  BOOST_REQUIRE_GT(size, 56u);
  std::size_t detected = 0, served_intact = 0;
  for (std::size_t i = 0; i < size; ++i) {
    for (int bit : {0, 5}) {
      one_spilled o(dir.path);
      std::string damaged = read_file(o.cache.spill_path());
      BOOST_REQUIRE(damaged == pristine);
      damaged[i] = static_cast<char>(damaged[i] ^ (1 << bit));
      write_whole(o.cache.spill_path(), damaged);
      const int before = o.computed;
      auto f = o.get(1);
      BOOST_REQUIRE(same_bytes(f, one_spilled::want(1)));  // never the damaged bytes
      const auto s = o.cache.stats();
      if (o.computed > before) {
        BOOST_REQUIRE_EQUAL(s.corrupt, 1u);
        BOOST_REQUIRE_EQUAL(s.misses, 3u);
        BOOST_REQUIRE(!o.cache.on_disk(1, 4));  // dropped
        BOOST_REQUIRE(o.cache.in_ram(1, 4));    // recomputed
        ++detected;
      } else {
        // A bit the decoder does not use (padding of an entropy-coded stream, slack in a table
        // description) leaves the decoded bytes intact: they matched the checksum and were served.
        // Every bit of the header and the key is checked.
        BOOST_REQUIRE_GE(i, 56u);
        BOOST_REQUIRE_EQUAL(s.disk_hits, 1u);
        ++served_intact;
        BOOST_TEST_MESSAGE("intact after flipping bit " << bit << " of byte " << i);
      }
    }
  }
  BOOST_TEST_MESSAGE("bit flips detected: " << detected
                                            << ", intact and served: " << served_intact);
  BOOST_TEST(detected + served_intact == 2 * size);
  BOOST_TEST(served_intact * 20 < detected);  // a few bits of the frame at most
  for (std::size_t len = 0; len < size; ++len) {
    one_spilled o(dir.path);
    fs::resize_file(o.cache.spill_path(), len);
    auto f = o.get(1);
    BOOST_REQUIRE(same_bytes(f, one_spilled::want(1)));
    BOOST_REQUIRE_EQUAL(o.computed, 3);
    BOOST_REQUIRE_EQUAL(o.cache.stats().corrupt, 1u);
    BOOST_REQUIRE_EQUAL(o.cache.stats().disk_hits, 0u);
  }
  // A record of another cache (same layout, another key) copied over this one is refused.
  {
    one_spilled a(dir.path);
    one_spilled b(dir.path);
    b.get(3);  // b now also spilled key 2 after its key 1
    const std::string theirs = read_file(b.cache.spill_path());
    const auto recs = parse_spill(theirs);
    BOOST_REQUIRE_EQUAL(recs.size(), 2u);
    BOOST_REQUIRE_EQUAL(recs[1].key, 2u);
    // Put b's (valid) record of key 2 where a's record of key 1 is.
    write_whole(a.cache.spill_path(), theirs.substr(pristine.size()));
    auto f = a.get(1);
    BOOST_TEST(same_bytes(f, one_spilled::want(1)));
    BOOST_TEST(a.cache.stats().corrupt == 1u);
    BOOST_TEST(a.computed == 3);
  }
}

BOOST_AUTO_TEST_CASE(disk_budget_first_in_first_out_with_compaction) {
  // Measure one record's size (incompressible features of 100 floats all have the same size).
  std::uint64_t rec = 0;
  {
    hone_test::temp_dir probe("fcache");
    cache_t c({.ram_bytes = 400, .disk_dir = probe.path, .disk_bytes = 1 << 20, .shards = 1});
    for (std::uint64_t k = 0; k < 2; ++k) {
      c.get_or_compute(k, 1, [&](std::vector<float>& out) { out = feature_of(k, 1, 100); });
    }
    rec = c.stats().disk_bytes;
  }
  BOOST_TEST_MESSAGE("record bytes: " << rec);
  BOOST_REQUIRE_GT(rec, 400u);

  hone_test::temp_dir dir("fcache");
  const std::uint64_t budget = 8 * rec + rec / 2;
  cache_t c({.ram_bytes = 400, .disk_dir = dir.path, .disk_bytes = budget, .shards = 1});
  auto get = [&](std::uint64_t k, std::uint64_t v = 1) {
    return c.get_or_compute(k, v, [&](std::vector<float>& out) { out = feature_of(k, v, 100); });
  };
  // Keys 0..59 one after the other: key k - 1 is spilled when k is computed.
  for (std::uint64_t k = 0; k < 60; ++k) {
    get(k);
    const auto s = c.stats();
    BOOST_REQUIRE_LE(s.disk_bytes, budget);
    BOOST_REQUIRE_EQUAL(fs::file_size(c.spill_path()), s.disk_bytes);
    BOOST_REQUIRE_EQUAL(s.disk_bytes, s.disk_entries * rec);  // nothing dropped stays
    // What is on disk is the most recent spills, without a gap (oldest dropped first).
    std::vector<std::uint64_t> on;
    for (std::uint64_t j = 0; j < k; ++j) {
      if (c.on_disk(j, 1)) on.push_back(j);
    }
    BOOST_REQUIRE_EQUAL(on.size(), s.disk_entries);
    if (!on.empty()) {
      BOOST_REQUIRE_EQUAL(on.back(), k - 1);
      BOOST_REQUIRE_EQUAL(on.front(), k - on.size());
    }
  }
  auto s = c.stats();
  BOOST_TEST(s.compactions > 0u);
  BOOST_TEST(s.disk_evictions == 59u - s.disk_entries);
  // After a compaction the file holds at most 3/4 of the budget (plus the new record).
  BOOST_TEST(s.disk_entries >= 3u);
  // Every record on disk reads back exact.
  for (std::uint64_t k = 0; k < 59; ++k) {
    if (!c.on_disk(k, 1)) continue;
    const auto before = c.stats().disk_hits;
    BOOST_TEST(same_bytes(get(k), feature_of(k, 1, 100)));
    BOOST_TEST(c.stats().disk_hits == before + 1u);
  }

  // Dropped records are reclaimed first: make the records on disk stale one by one (each lookup
  // drops one record and spills another), so the file fills with dead bytes; the compaction that
  // follows frees them without dropping any live record.
  c.clear();
  c.reset_stats();
  BOOST_TEST(c.stats().disk_bytes == 0u);
  for (std::uint64_t k = 0; k < 6; ++k) get(k);  // 0..4 on disk, 5 in RAM
  BOOST_TEST(c.stats().disk_entries == 5u);
  for (std::uint64_t k = 0; k < 5; ++k) get(k, 2);
  // Spills of 5@1, 0@2, 1@2 append (8 records of 8.5); 2@2 finds 3 dead records and 4 live ones:
  // compaction keeps the 4, the 5th appends; 3@2 appends after the dead record of 4@1.
  s = c.stats();
  BOOST_TEST(s.stale == 5u);
  BOOST_TEST(s.compactions == 1u);
  BOOST_TEST(s.disk_evictions == 0u);
  BOOST_TEST(s.disk_entries == 5u);  // 5@1 and 0..3@2
  BOOST_TEST(s.disk_bytes == 6u * rec);
  BOOST_TEST(c.on_disk(5, 1));
  for (std::uint64_t k = 0; k < 4; ++k) BOOST_TEST(c.on_disk(k, 2));

  // A record larger than the whole disk budget is not written; a feature larger than the RAM
  // budget is handed back without being kept.
  c.reset_stats();
  const std::size_t big = static_cast<std::size_t>(budget / 4 + 10);
  auto f =
      c.get_or_compute(100, 1, [&](std::vector<float>& out) { out = feature_of(100, 1, big); });
  BOOST_TEST(same_bytes(f, feature_of(100, 1, big)));
  s = c.stats();
  BOOST_TEST(s.oversized == 1u);
  BOOST_TEST(s.spill_skipped == 1u);
  BOOST_TEST(!c.in_ram(100, 1));
  BOOST_TEST(!c.on_disk(100, 1));
  BOOST_TEST(s.disk_bytes <= budget);
  // An oversized feature that fits the disk goes there.
  auto m =
      c.get_or_compute(101, 1, [&](std::vector<float>& out) { out = feature_of(101, 1, 300); });
  BOOST_TEST(same_bytes(m, feature_of(101, 1, 300)));
  BOOST_TEST(c.on_disk(101, 1));
  BOOST_TEST(!c.in_ram(101, 1));
  BOOST_TEST(c.stats().ram_bytes <= 400u);
}

BOOST_AUTO_TEST_CASE(a_failing_write_turns_the_disk_tier_off) {
  hone_test::temp_dir dir("fcache");
  cache_t c({.ram_bytes = 400, .disk_dir = dir.path, .disk_bytes = 1 << 20, .shards = 1});
  const fs::path spill = c.spill_path();
  // A file size limit makes the spill file's writes fail (EFBIG) once it reaches 2000 bytes.
  struct rlimit old {};
  BOOST_REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  if (old.rlim_max != RLIM_INFINITY && old.rlim_max < 2000) {
    BOOST_TEST_MESSAGE("skipped: the hard file size limit is below 2000 bytes");
    return;
  }
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 2000;
  BOOST_REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::vector<data::feature_ref<float>> kept;
  for (std::uint64_t k = 0; k < 20; ++k) {
    kept.push_back(
        c.get_or_compute(k, 1, [&](std::vector<float>& out) { out = feature_of(k, 1, 100); }));
  }
  BOOST_REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
  ::signal(SIGXFSZ, old_handler);
  const auto s = c.stats();
  BOOST_TEST(!c.disk_enabled());
  BOOST_TEST(s.disk_errors == 1u);
  BOOST_TEST(s.disk_bytes == 0u);
  BOOST_TEST(s.disk_entries == 0u);
  BOOST_TEST(s.spills >= 3u);
  BOOST_TEST(!fs::exists(spill));
  BOOST_TEST_MESSAGE("disk_error(): " << c.disk_error());
  BOOST_TEST(c.disk_error().find(spill.string()) != std::string::npos);
  BOOST_TEST(c.disk_error().find("RAM only") != std::string::npos);
  // The cache goes on in RAM: every feature is still right, the ones held are unchanged.
  for (std::uint64_t k = 0; k < 20; ++k) {
    BOOST_TEST(same_bytes(kept[k], feature_of(k, 1, 100)));
    auto f = c.get_or_compute(k, 1, [&](std::vector<float>& out) { out = feature_of(k, 1, 100); });
    BOOST_TEST(same_bytes(f, feature_of(k, 1, 100)));
  }
  BOOST_TEST(c.stats().ram_bytes <= 400u);
  BOOST_TEST(c.stats().disk_hits == 0u);
}

BOOST_AUTO_TEST_CASE(bad_inputs_are_refused_with_sentences) {
  using hone::config_error;
  using hone::io_error;
  hone_test::temp_dir dir("fcache");
  BOOST_CHECK_EXCEPTION(cache_t({.ram_bytes = 0}), config_error,
                        says<config_error>("ram_bytes is 0"));
  BOOST_CHECK_EXCEPTION(cache_t({.ram_bytes = 100, .shards = 0}), config_error,
                        says<config_error>("shards is 0"));
  BOOST_CHECK_EXCEPTION(cache_t({.ram_bytes = 4, .shards = 8}), config_error,
                        says<config_error>("smaller than the number of shards"));
  BOOST_CHECK_EXCEPTION(cache_t({.ram_bytes = 100, .disk_dir = dir.path}), config_error,
                        says<config_error>("disk_bytes is 0"));
  BOOST_CHECK_EXCEPTION(cache_t({.ram_bytes = 100, .disk_bytes = 100}), config_error,
                        says<config_error>("disk_dir is empty"));
  BOOST_CHECK_EXCEPTION(
      cache_t({.ram_bytes = 100, .disk_dir = dir.path, .disk_bytes = 100, .zstd_level = 1000}),
      config_error, says<config_error>("out of zstd's range"));
  // A directory that cannot be created (below a regular file).
  const fs::path file = dir / "plain-file";
  write_whole(file, "x");
  BOOST_CHECK_EXCEPTION(cache_t({.ram_bytes = 100, .disk_dir = file / "sub", .disk_bytes = 100}),
                        io_error,
                        says<io_error>("disk tier cannot use '" + (file / "sub").string()));
  // An empty feature, and a compute function that throws: nothing is cached.
  cache_t c({.ram_bytes = 1000, .shards = 1});
  BOOST_CHECK_EXCEPTION(c.get_or_compute(1, 1, [](std::vector<float>&) {}), config_error,
                        says<config_error>("left the feature empty"));
  BOOST_CHECK_THROW(
      c.get_or_compute(1, 1, [](std::vector<float>&) { throw std::runtime_error("x"); }),
      std::runtime_error);
  BOOST_TEST(!c.in_ram(1, 1));
  BOOST_TEST(c.stats().ram_entries == 0u);
  auto f = c.get_or_compute(1, 1, [](std::vector<float>& out) { out = {1.f, 2.f}; });
  BOOST_TEST(f.size() == 2u);
  BOOST_TEST(c.stats().misses == 3u);
}

BOOST_AUTO_TEST_CASE(a_feature_ref_outlives_eviction_clear_and_the_cache) {
  data::feature_ref<float> held;
  {
    cache_t c({.ram_bytes = 256, .shards = 1});
    held = c.get_or_compute(1, 1, [](std::vector<float>& out) { out = feature_of(1, 1, 64); });
    c.get_or_compute(2, 1,
                     [](std::vector<float>& out) { out = feature_of(2, 1, 64); });  // evicts 1
    BOOST_TEST(!c.in_ram(1, 1));
    BOOST_TEST(same_bytes(held, feature_of(1, 1, 64)));
    c.clear();
    BOOST_TEST(c.stats().ram_entries == 0u);
    BOOST_TEST(c.stats().misses == 2u);  // clear() keeps the statistics
  }
  BOOST_TEST(same_bytes(held, feature_of(1, 1, 64)));
  BOOST_TEST(held.span().size() == 64u);
  BOOST_TEST(static_cast<bool>(held));
  BOOST_TEST(!data::feature_ref<float>());
}

BOOST_AUTO_TEST_CASE(loader_threads_share_one_cache) {
  hone_test::temp_dir dir("fcache");
  constexpr std::size_t ram = 12000;
  constexpr std::uint64_t disk = 48 << 10;
  cache_t c({.ram_bytes = ram, .disk_dir = dir.path, .disk_bytes = disk, .shards = 4});
  constexpr int threads = 4, per_thread = 4000;
  std::atomic<int> wrong{0}, computed{0};
  std::atomic<bool> done{false};
  auto n_of = [](std::uint64_t k) -> std::size_t { return 8 + (k * 13) % 64; };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 g(static_cast<std::uint64_t>(t) + 100);
      struct held_ref {
        std::uint64_t k, v;
        data::feature_ref<float> f;
      };
      std::vector<held_ref> held;
      for (int i = 0; i < per_thread; ++i) {
        const std::uint64_t k = g() % 300;
        const std::uint64_t v = 1 + static_cast<std::uint64_t>((i / 1000 + t) % 2);
        auto f = c.get_or_compute(k, v, [&](std::vector<float>& out) {
          computed.fetch_add(1);
          out = feature_of(k, v, n_of(k), k % 3 == 0);
        });
        if (!same_bytes(f, feature_of(k, v, n_of(k), k % 3 == 0))) wrong.fetch_add(1);
        if (i % 97 == 0) held.push_back({k, v, f});
      }
      // What a thread held stays intact, whatever the others evicted meanwhile.
      for (const held_ref& h : held) {
        if (!same_bytes(h.f, feature_of(h.k, h.v, n_of(h.k), h.k % 3 == 0))) wrong.fetch_add(1);
      }
    });
  }
  // A reader of the statistics beside them.
  std::thread watcher([&] {
    while (!done.load()) {
      const auto s = c.stats();
      if (s.ram_bytes > ram || s.disk_bytes > disk) wrong.fetch_add(1);
      std::this_thread::yield();
    }
  });
  for (auto& th : pool) th.join();
  done = true;
  watcher.join();
  const auto s = c.stats();
  BOOST_TEST(wrong.load() == 0);
  BOOST_TEST(s.lookups() == static_cast<std::uint64_t>(threads * per_thread));
  BOOST_TEST(s.misses == static_cast<std::uint64_t>(computed.load()));
  BOOST_TEST(s.ram_bytes <= ram);
  BOOST_TEST(s.disk_bytes <= disk);
  BOOST_TEST(s.disk_hits > 0u);
  BOOST_TEST(s.stale > 0u);
  BOOST_TEST(s.corrupt == 0u);
  BOOST_TEST(s.disk_errors == 0u);
  BOOST_TEST(c.disk_enabled());
  BOOST_TEST_MESSAGE("4 threads: ram hits " << s.ram_hits << ", disk hits " << s.disk_hits
                                            << ", misses " << s.misses << ", stale " << s.stale
                                            << ", compactions " << s.compactions << ", hit rate "
                                            << s.hit_rate());
}
