// The disk tier of hone::serve::prediction_cache: entries evicted from RAM are written as files and
// read back (and moved back to RAM) on a RAM miss; the disk budget; the files a previous cache left
// are found again; a corpus of damaged entry files (every truncation, every flipped byte of one
// file, wrong magic, another version, another input, garbage, an empty file, a header with huge
// sizes and a recomputed checksum) each gives a miss, never a wrong output, and is removed and
// counted (a valid entry of another input under a colliding name is kept and counted as a
// collision).
#define BOOST_TEST_MODULE hone_serve_prediction_cache_disk
#include <boost/test/unit_test.hpp>

#include "test_clock.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <hone/serve/prediction_cache.hpp>
#include <span>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"

namespace hs = hone::serve;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

std::span<const std::byte> bytes(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

std::vector<char> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void write_file(const fs::path& p, const std::vector<char>& data) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

/// RAM for one entry of `input_bytes` + 8-byte output per shard, one shard: every second put
/// spills the first entry to disk.
hs::prediction_cache_options one_in_ram(const fs::path& dir, std::size_t input_bytes) {
  hs::prediction_cache_options o;
  o.shards = 1;
  o.ram_budget_bytes = input_bytes + 8 + hs::prediction_entry_overhead;
  o.disk_directory = dir;
  return o;
}

std::string input_of(int i, std::size_t n = 300) {
  std::string s(n, '\0');
  for (std::size_t j = 0; j < n; ++j) s[j] = static_cast<char>((i * 131 + j * 7) % 251);
  return s;
}

using cache_t = hs::prediction_cache<std::uint64_t>;

/// A cache whose entry for input_of(0) (output 1000) is on disk; returns that file's path.
fs::path spill_one(cache_t& c) {
  BOOST_REQUIRE(c.put(c.model_version(), bytes(input_of(0)), 1000));
  BOOST_REQUIRE(c.put(c.model_version(), bytes(input_of(1)), 1001));  // evicts 0 to disk
  const fs::path p = c.disk_path(c.model_version(), bytes(input_of(0)));
  BOOST_REQUIRE(fs::exists(p));
  return p;
}

}  // namespace

BOOST_AUTO_TEST_CASE(evicted_entries_are_read_back_from_disk) {
  hone_test::temp_dir dir("pc-disk");
  cache_t c(one_in_ram(dir.path, 300));
  for (int i = 0; i < 20; ++i) BOOST_TEST(c.put(0, bytes(input_of(i)), 1000u + i));
  auto s = c.stats();
  BOOST_TEST(s.evictions == 19u);
  BOOST_TEST(s.disk_writes == 19u);
  BOOST_TEST(s.disk_files == 19u);
  for (int i = 0; i < 20; ++i) {
    BOOST_TEST(c.get(bytes(input_of(i))).value() == 1000u + i);
  }
  s = c.stats();
  BOOST_TEST(s.hits == 20u);
  // every lookup reads from disk: the one held in RAM (19) was spilled by the first read back
  BOOST_TEST(s.disk_hits == 20u);
  BOOST_TEST(s.misses == 0u);
  BOOST_TEST(!c.get(bytes(input_of(99))).has_value());
  BOOST_TEST(c.stats().misses == 1u);
}

BOOST_AUTO_TEST_CASE(the_disk_budget_removes_the_oldest_files) {
  hone_test::temp_dir dir("pc-budget");
  auto o = one_in_ram(dir.path, 4000);
  {
    cache_t probe(o);  // measure one file's size
    probe.put(0, bytes(input_of(0, 4000)), 0);
    probe.put(0, bytes(input_of(1, 4000)), 1);
  }
  std::uint64_t file_size = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) file_size = e.file_size();
  BOOST_REQUIRE(file_size > 0);
  BOOST_TEST(file_size < 4000u);  // zstd compressed the repetitive input
  fs::remove_all(dir.path);
  fs::create_directories(dir.path);
  o.disk_budget_bytes = 3 * file_size;
  cache_t c(o);
  for (int i = 0; i < 10; ++i) c.put(0, bytes(input_of(i, 4000)), i);
  const auto s = c.stats();
  BOOST_TEST(s.disk_bytes <= o.disk_budget_bytes);
  BOOST_TEST(s.disk_files == 3u);
  BOOST_TEST(s.disk_evictions == 6u);
  // the newest three spilled (6, 7, 8) are there; 9 is in RAM; the oldest are gone
  for (int i = 6; i < 10; ++i) BOOST_TEST(c.get(bytes(input_of(i, 4000))).value() == unsigned(i));
  for (int i = 0; i < 6; ++i) BOOST_TEST(!c.get(bytes(input_of(i, 4000))).has_value());
}

BOOST_AUTO_TEST_CASE(a_new_cache_finds_the_files_of_a_previous_one) {
  hone_test::temp_dir dir("pc-reopen");
  {
    cache_t c(one_in_ram(dir.path, 300));
    spill_one(c);
  }
  // a temporary of a writer that is gone (pid 999999999 cannot exist) is removed on start
  write_file(dir.path / ".tmp-0-x.hpc-999999999", {'x'});
  // files that are not entries are left alone
  write_file(dir.path / "notes.txt", {'n'});
  cache_t c(one_in_ram(dir.path, 300));
  BOOST_TEST(c.stats().disk_files == 1u);
  BOOST_TEST(c.get(bytes(input_of(0))).value() == 1000u);
  BOOST_TEST(!fs::exists(dir.path / ".tmp-0-x.hpc-999999999"));
  BOOST_TEST(fs::exists(dir.path / "notes.txt"));
}

BOOST_AUTO_TEST_CASE(a_new_version_removes_and_never_serves_old_files) {
  hone_test::temp_dir dir("pc-version");
  cache_t c(one_in_ram(dir.path, 300));
  const fs::path p = spill_one(c);
  c.advance_model_version();
  BOOST_TEST(!fs::exists(p));
  BOOST_TEST(!c.get(bytes(input_of(0))).has_value());
  BOOST_TEST(c.stats().disk_files == 0u);
  BOOST_TEST(c.stats().disk_evictions == 1u);
}

BOOST_AUTO_TEST_CASE(every_truncation_and_every_flipped_byte_is_a_miss) {
  hone_test::temp_dir dir("pc-damage");
  const std::string in = input_of(0);
  std::vector<char> good;
  {
    cache_t c(one_in_ram(dir.path, 300));
    good = read_file(spill_one(c));
  }
  BOOST_REQUIRE(good.size() > 64u);
  std::uint64_t cases = 0;
  auto check_damaged = [&](const std::vector<char>& file) {
    fs::remove_all(dir.path);
    fs::create_directories(dir.path);
    cache_t c(one_in_ram(dir.path, 300));
    const fs::path p = c.disk_path(0, bytes(in));
    write_file(p, file);
    cache_t c2(one_in_ram(dir.path, 300));  // indexes the damaged file
    BOOST_TEST_REQUIRE(!c2.get(bytes(in)).has_value());
    const auto s = c2.stats();
    BOOST_TEST_REQUIRE(s.damaged == 1u);
    BOOST_TEST_REQUIRE(s.misses == 1u);
    BOOST_TEST_REQUIRE(!fs::exists(p));
    ++cases;
  };
  for (std::size_t n = 0; n < good.size(); ++n) {
    check_damaged(std::vector<char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)));
  }
  for (std::size_t i = 0; i < good.size(); ++i) {
    std::vector<char> bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    check_damaged(bad);
  }
  // trailing bytes, garbage, a file of another format
  std::vector<char> longer = good;
  longer.push_back('\0');
  check_damaged(longer);
  check_damaged(std::vector<char>(good.size(), 'z'));
  std::vector<char> other(good.size(), '\0');
  std::memcpy(other.data(), "\x89HDF\r\n\x1a\n", 8);
  check_damaged(other);
  BOOST_TEST(cases == 2 * good.size() + 3);
}

namespace {
/// Recomputes a file's trailing XXH3-64 (so a deliberate change passes the checksum and must be
/// caught by the checks after it).
void reseal(std::vector<char>& f) {
  const std::size_t body = f.size() - 8;
  const std::uint64_t h = XXH3_64bits(f.data(), body);
  std::memcpy(f.data() + body, &h, 8);
}
}  // namespace

BOOST_AUTO_TEST_CASE(sealed_but_wrong_files_are_misses) {
  hone_test::temp_dir dir("pc-sealed");
  const std::string in = input_of(0);
  std::vector<char> good;
  {
    cache_t c(one_in_ram(dir.path, 300));
    good = read_file(spill_one(c));
  }
  struct variant {
    const char* what;
    std::size_t offset;
    std::uint64_t value;
    bool damaged;  // false: a valid entry of another input (a collision), kept
  };
  const variant variants[] = {
      {"another version", 8, 7, true},
      {"an input size other than the query's", 24, 299, false},
      {"an output size that does not add up", 32, 9, true},
      {"a huge input size", 24, std::uint64_t{1} << 40, true},
      {"a frame size beyond the file", 40, 1 << 20, true},
  };
  for (const auto& v : variants) {
    BOOST_TEST_CONTEXT(v.what) {
      fs::remove_all(dir.path);
      fs::create_directories(dir.path);
      std::vector<char> bad = good;
      std::memcpy(bad.data() + v.offset, &v.value, 8);
      reseal(bad);
      {
        cache_t c(one_in_ram(dir.path, 300));
        write_file(c.disk_path(0, bytes(in)), bad);
      }
      cache_t c(one_in_ram(dir.path, 300));
      BOOST_TEST(!c.get(bytes(in)).has_value());
      const auto s = c.stats();
      BOOST_TEST(s.damaged == (v.damaged ? 1u : 0u));
      BOOST_TEST(s.collisions == (v.damaged ? 0u : 1u));
    }
  }
}

BOOST_AUTO_TEST_CASE(another_inputs_file_under_this_name_is_a_collision_not_a_hit) {
  // A valid entry copied (or hashed) under another input's name: the stored input differs.
  hone_test::temp_dir dir("pc-foreign");
  cache_t c(one_in_ram(dir.path, 300));
  const fs::path p0 = spill_one(c);  // input 0 -> 1000 on disk
  const std::string other = input_of(42);
  const fs::path p42 = c.disk_path(0, bytes(other));
  fs::copy_file(p0, p42);
  cache_t c2(one_in_ram(dir.path, 300));
  BOOST_TEST(!c2.get(bytes(other)).has_value());
  BOOST_TEST(c2.stats().collisions == 1u);
  BOOST_TEST(c2.get(bytes(input_of(0))).value() == 1000u);
}

namespace {
using late_clock = basic_test_clock<1'000'000>;  // starts at 1 ms
}  // namespace

BOOST_AUTO_TEST_CASE(disk_entries_expire_with_the_ttl) {
  hone_test::temp_dir dir("pc-ttl");
  auto o = one_in_ram(dir.path, 300);
  o.ttl = 1000ns;
  hs::prediction_cache<std::uint64_t, hs::xxh3_prediction_hash, late_clock> c(o);
  c.put(0, bytes(input_of(0)), 1);
  c.put(0, bytes(input_of(1)), 2);  // 0 spilled
  c.put(0, bytes(input_of(2)), 3);  // 1 spilled
  late_clock::t += 999ns;
  BOOST_TEST(c.get(bytes(input_of(0))).value() == 1u);  // from disk, in time
  late_clock::t += 1ns;
  BOOST_TEST(!c.get(bytes(input_of(1))).has_value());  // on disk, expired
  BOOST_TEST(c.stats().expired >= 1u);
  // a file whose expiry is further away than the TTL (a clock that was reset): expired
  late_clock::t = late_clock::time_point{};
  c.put(0, bytes(input_of(3)), 4);
  c.put(0, bytes(input_of(4)), 5);
  BOOST_TEST(!c.get(bytes(input_of(2))).has_value());
}

BOOST_AUTO_TEST_CASE(a_file_of_another_output_type_is_damaged_not_a_hit) {
  // Keys depend on (version, input) only: a cache of 4-byte outputs and one of 8-byte outputs over
  // the same directory find each other's files; the codec's decode refuses the wrong size.
  hone_test::temp_dir dir("pc-type");
  {
    hs::prediction_cache<std::uint32_t> small_outputs(one_in_ram(dir.path, 300));
    small_outputs.put(0, bytes(input_of(0)), 7u);
    small_outputs.put(0, bytes(input_of(1)), 8u);  // 0 spilled: a 4-byte output
  }
  cache_t c(one_in_ram(dir.path, 300));
  BOOST_TEST(c.stats().disk_files == 1u);
  BOOST_TEST(!c.get(bytes(input_of(0))).has_value());
  const auto s = c.stats();
  BOOST_TEST(s.damaged == 1u);
  BOOST_TEST(s.disk_hits == 0u);
  BOOST_TEST(s.hits == 0u);
  BOOST_TEST(s.misses == 1u);
  BOOST_TEST(s.disk_files == 0u);
}

// What a lookup's open(2) finds decides the outcome, not a later look at the name: a file removed
// behind the cache's back is a plain miss (not damage), a directory in the entry's place is a
// damaged entry (removed), and in both cases the lookup answers nothing.
BOOST_AUTO_TEST_CASE(a_vanished_file_is_a_miss_and_a_directory_in_its_place_is_damage) {
  hone_test::temp_dir dir("pc-open");
  cache_t c(one_in_ram(dir.path, 300));
  const fs::path p = spill_one(c);
  fs::remove(p);
  BOOST_TEST(!c.get(bytes(input_of(0))).has_value());
  auto s = c.stats();
  BOOST_TEST(s.damaged == 0u);
  BOOST_TEST(s.misses == 1u);
  BOOST_TEST(s.disk_hits == 0u);

  BOOST_REQUIRE(c.put(c.model_version(), bytes(input_of(0)), 1000));  // spills 1
  const fs::path q = c.disk_path(c.model_version(), bytes(input_of(1)));
  BOOST_REQUIRE(fs::exists(q));
  fs::remove(q);
  fs::create_directory(q);
  BOOST_TEST(!c.get(bytes(input_of(1))).has_value());
  s = c.stats();
  BOOST_TEST(s.damaged == 1u);
  BOOST_TEST(!fs::exists(q));  // an empty directory is removed like the file it replaced
  BOOST_TEST(c.get(bytes(input_of(0))).value() == 1000u);  // RAM, untouched
}
