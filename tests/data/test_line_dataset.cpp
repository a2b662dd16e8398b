// Tests of hone/data/line_dataset.hpp: the record rules of text, CSV and JSON Lines (last line
// without a newline, empty lines, BOM, invalid UTF-8, CRLF, empty file), the parallel index
// against the sequential reference on random and adversarial inputs (many chunk sizes, quotes
// straddling chunk boundaries, several thread counts), the saved index (reused, rebuilt when
// stale, refused under require_valid), CSV field splitting, a sparse file past 4 GiB, and each
// kernel of the vectorized CSV scan (scalar, SSE2, AVX2, AVX-512: those this CPU runs) against
// the scalar loop at every alignment, and each kernel of the text / JSON Lines block scan against
// the memchr loop (and a byte loop) at every alignment, the index under each forced target.
#define BOOST_TEST_MODULE hone_data_lines
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <hone/core/isa.hpp>
#include <hone/data/detail/csv_scan.hpp>
#include <hone/data/line_dataset.hpp>
#include <hone/io/file_io.hpp>

#include "../support/temp_dir.hpp"

namespace data = hone::data;
namespace io = hone::io;
namespace fs = std::filesystem;
using data::line_format;

namespace {

std::vector<std::string> records_of(const fs::path& p, line_format f,
                                    data::line_dataset_options opt = {}) {
  data::line_dataset ds(p, f, opt);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < ds.size(); ++i) out.emplace_back(ds.get(i));
  return out;
}

std::vector<std::string> records_of(const hone_test::temp_dir& d, std::string_view content,
                                    line_format f) {
  const fs::path p = d / "f.txt";
  io::write_file(p, content, false);
  fs::remove(p.string() + ".hidx");
  return records_of(p, f);
}

using strings = std::vector<std::string>;

// The whole-extent parallel index for a string.
std::vector<std::uint64_t> par(line_format f, std::string_view s, std::size_t chunk,
                               std::size_t threads) {
  return data::build_line_index(f, s, {{0, s.size()}}, chunk, threads);
}

}  // namespace

// The options take designated initializers of any subset under -Wextra -Werror (a member without
// a default initializer made {.save_index = false} a -Wmissing-field-initializers error).
[[maybe_unused]] static const hone::data::line_dataset_options designated_subset{.save_index =
                                                                                     false};

BOOST_AUTO_TEST_CASE(text_record_rules) {
  hone_test::temp_dir d("data-lines");
  BOOST_TEST(records_of(d, "", line_format::text) == strings{});
  BOOST_TEST(records_of(d, "a", line_format::text) == strings{"a"});
  BOOST_TEST(records_of(d, "a\n", line_format::text) == strings{"a"});
  BOOST_TEST(records_of(d, "a\nb", line_format::text) == (strings{"a", "b"}));
  BOOST_TEST(records_of(d, "\n", line_format::text) == strings{""});
  BOOST_TEST(records_of(d, "a\n\n\nb\n", line_format::text) == (strings{"a", "", "", "b"}));
  BOOST_TEST(records_of(d, "a\r\nb\r\n\r\nc", line_format::text) == (strings{"a", "b", "", "c"}));
  BOOST_TEST(records_of(d, "\xEF\xBB\xBFhead\nx", line_format::text) == (strings{"head", "x"}));
  BOOST_TEST(records_of(d, "\xEF\xBB\xBF", line_format::text) == strings{});
  // Invalid UTF-8 and NUL bytes come back as they are.
  const std::string bad("\xff\xfe\x00z\xc3\n\x80", 7);
  BOOST_TEST(records_of(d, bad, line_format::text) ==
             (strings{std::string("\xff\xfe\x00z\xc3", 5), "\x80"}));
  // A lone '\r' inside a line is kept; only the one before '\n' goes.
  BOOST_TEST(records_of(d, "a\rb\r\r\n", line_format::text) == strings{"a\rb\r"});
}

BOOST_AUTO_TEST_CASE(jsonl_skips_empty_lines_and_parses_on_request) {
  hone_test::temp_dir d("data-jsonl");
  const fs::path p = d / "f.jsonl";
  io::write_file(p, "\xEF\xBB\xBF{\"a\":1}\r\n\r\n\n[2,3]\n{oops}", false);
  data::line_dataset ds(p, line_format::jsonl);
  BOOST_TEST(ds.size() == 3U);
  BOOST_TEST(ds.get(0) == "{\"a\":1}");
  BOOST_TEST(ds.get(1) == "[2,3]");
  BOOST_TEST(ds.json(0).at("a").as_u64() == 1U);
  BOOST_TEST(ds.offset(2) == 21U);
  try {
    (void)ds.json(2);
    BOOST_FAIL("record 2 is not JSON");
  } catch (const io::format_error& e) {
    const std::string m = e.what();
    BOOST_TEST(m.find("record 2 at byte 21") != std::string::npos, m);
  }
  BOOST_CHECK_THROW((void)ds.get(3), hone::config_error);
}

BOOST_AUTO_TEST_CASE(csv_records_and_fields) {
  hone_test::temp_dir d("data-csv");
  const std::string csv =
      "id,text\r\n"
      "1,\"hello, world\"\r\n"
      "\r\n"
      "2,\"line one\r\nline two\"\r\n"
      "3,\"say \"\"hi\"\"\"\n"
      "4,\"\"\n"
      "5,,\"\n\"";
  const fs::path p = d / "f.csv";
  io::write_file(p, csv, false);
  data::line_dataset ds(p, line_format::csv);
  BOOST_TEST(ds.size() == 6U);
  BOOST_TEST(ds.get(2) == "2,\"line one\r\nline two\"");
  std::string buf;
  std::vector<std::string_view> f;
  ds.fields(1, buf, f);
  BOOST_TEST(f.size() == 2U);
  BOOST_TEST(f[1] == "hello, world");
  ds.fields(2, buf, f);
  BOOST_TEST(f[1] == "line one\r\nline two");
  ds.fields(3, buf, f);
  BOOST_TEST(f[1] == "say \"hi\"");
  ds.fields(4, buf, f);
  BOOST_TEST(f.size() == 2U);
  BOOST_TEST(f[1] == "");
  ds.fields(5, buf, f);
  BOOST_TEST(f.size() == 3U);
  BOOST_TEST(f[1] == "");
  BOOST_TEST(f[2] == "\n");
  // A quote mid-field (not RFC 4180) still flips the state: one field "ab,c".
  data::csv_split("a\"b,c\",d", buf, f);
  BOOST_TEST(f.size() == 2U);
  BOOST_TEST(f[0] == "ab,c");
  BOOST_TEST(f[1] == "d");
  // A file that ends inside quotes is refused with a sentence.
  const fs::path q = d / "open.csv";
  io::write_file(q, "a,\"never closed\nb,c\n", false);
  try {
    data::line_dataset bad(q, line_format::csv);
    BOOST_FAIL("an unterminated quote must be refused");
  } catch (const io::format_error& e) {
    BOOST_TEST(std::string(e.what()).find("ends inside a quoted field") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(parallel_index_matches_sequential_reference) {
  std::mt19937_64 rng(12345);
  // Alphabets that make quotes, newlines and CRLF dense, so chunk boundaries fall inside quoted
  // fields, between the two quotes of "", and between '\r' and '\n'.
  const std::string alphabets[] = {"\"\n", "\"\n\r,a", "a\n", "\n", "\"\"\n,x\r", "ab,\"\n\n"};
  int compared = 0;
  for (int round = 0; round < 300; ++round) {
    const std::string& alpha = alphabets[static_cast<std::size_t>(round) % std::size(alphabets)];
    const std::size_t n = rng() % 400;
    std::string s;
    if (round % 7 == 0) s = "\xEF\xBB\xBF";
    for (std::size_t i = 0; i < n; ++i) s += alpha[rng() % alpha.size()];
    for (line_format f : {line_format::text, line_format::csv, line_format::jsonl}) {
      bool quoted = false;
      for (char c : s) quoted = quoted != (c == '"' && f == line_format::csv);
      const auto ref = data::detail::sequential_index(f, s);
      for (std::size_t chunk : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{5},
                                std::size_t{16}, std::size_t{97}, std::size_t{1} << 20}) {
        if (quoted) {
          BOOST_CHECK_THROW((void)par(f, s, chunk, 2), io::format_error);
          continue;
        }
        const auto got = par(f, s, chunk, 1 + round % 3);
        BOOST_TEST(got == ref, "format " << data::format_name(f) << " chunk " << chunk
                                         << " input size " << s.size());
        ++compared;
      }
    }
  }
  BOOST_TEST(compared > 1000);
  // A hand-made straddle: the quoted newline is at every position relative to the chunk edges.
  const std::string s = "a,\"x\ny\"\"z\"\nb,\"\n\"\n";
  const auto ref = data::detail::sequential_index(line_format::csv, s);
  BOOST_TEST(ref == (std::vector<std::uint64_t>{0, 11}));
  for (std::size_t chunk = 1; chunk <= s.size(); ++chunk) {
    BOOST_TEST(par(line_format::csv, s, chunk, 4) == ref, "chunk " << chunk);
  }
}

BOOST_AUTO_TEST_CASE(threads_give_the_same_index_file) {
  hone_test::temp_dir d("data-threads");
  std::mt19937_64 rng(7);
  std::string s;
  for (int i = 0; i < 20000; ++i) {
    s += std::to_string(rng() % 1000) + ",\"q" + ((rng() % 4 == 0) ? "\n" : "") + "\"";
    s += (rng() % 5 == 0) ? "\r\n" : "\n";
  }
  const fs::path p = d / "big.csv";
  io::write_file(p, s, false);
  data::line_dataset_options one;
  one.threads = 1;
  one.chunk_bytes = 4096;
  one.index_path = d / "one.hidx";
  data::line_dataset a(p, line_format::csv, one);
  data::line_dataset_options many = one;
  many.threads = 4;
  many.chunk_bytes = 333;
  many.index_path = d / "many.hidx";
  data::line_dataset b(p, line_format::csv, many);
  BOOST_TEST(a.size() == 20000U);
  BOOST_TEST(std::vector<std::uint64_t>(a.offsets().begin(), a.offsets().end()) ==
             std::vector<std::uint64_t>(b.offsets().begin(), b.offsets().end()));
  BOOST_TEST((io::hash_file(*one.index_path) == io::hash_file(*many.index_path)));
  BOOST_TEST(a.offsets().size() * 8 + 80 == fs::file_size(*one.index_path));  // 8 bytes a record
}

BOOST_AUTO_TEST_CASE(saved_index_is_reused_rebuilt_or_refused) {
  hone_test::temp_dir d("data-stale");
  const fs::path p = d / "f.txt";
  io::write_file(p, "one\ntwo\nthree\n", false);
  {
    data::line_dataset ds(p, line_format::text);
    BOOST_TEST(ds.index_rebuilt());
    BOOST_TEST(fs::exists(p.string() + ".hidx"));
  }
  {
    data::line_dataset_options o;
    o.policy = data::index_policy::require_valid;
    data::line_dataset ds(p, line_format::text, o);
    BOOST_TEST(!ds.index_rebuilt());
    BOOST_TEST(ds.size() == 3U);
    BOOST_TEST(ds.get(2) == "three");
  }
  // Another format is not served by this index.
  BOOST_TEST(data::line_dataset(p, line_format::jsonl).index_rebuilt());
  // The same size, a different content and mtime: stale.
  io::write_file(p, "uno\ndos\ntres\n", false);  // rebuilt as text, then changed
  data::line_dataset_options req;
  req.policy = data::index_policy::require_valid;
  data::line_dataset(p, line_format::text);  // index for the current content
  io::write_file(p, "ONE\nTWO\nTHREE\n\n", false);
  try {
    data::line_dataset ds(p, line_format::text, req);
    BOOST_FAIL("a stale index must be refused under require_valid");
  } catch (const io::format_error& e) {
    const std::string m = e.what();
    BOOST_TEST(m.find("size changed from 13 to 15") != std::string::npos, m);
  }
  {
    data::line_dataset ds(p, line_format::text);
    BOOST_TEST(ds.index_rebuilt());
    BOOST_TEST(ds.size() == 4U);
    BOOST_TEST(ds.get(2) == "THREE");
  }
  // Same size, same mtime (restored), different head: caught by the content hash.
  const auto t = fs::last_write_time(p);
  io::write_file(p, "one\nTWO\nTHREE\n\n", false);
  fs::last_write_time(p, t);
  try {
    data::line_dataset ds(p, line_format::text, req);
    BOOST_FAIL("a changed content must be refused");
  } catch (const io::format_error& e) {
    BOOST_TEST(std::string(e.what()).find("content") != std::string::npos, e.what());
  }
  // A damaged index file is rebuilt, or refused with a sentence.
  data::line_dataset(p, line_format::text);
  {
    io::output_file out(p.string() + ".hidx", io::create_mode::truncate);
    out.write("HONEHIDX");
    out.close();
  }
  BOOST_CHECK_THROW(data::line_dataset(p, line_format::text, req), io::format_error);
  BOOST_TEST(data::line_dataset(p, line_format::text).index_rebuilt());
  BOOST_TEST(!data::line_dataset(p, line_format::text).index_rebuilt());
  // A flipped offset byte breaks the checksum.
  {
    const fs::path ip = p.string() + ".hidx";
    const int fd = ::open(ip.c_str(), O_WRONLY);
    BOOST_REQUIRE(fd >= 0);
    const char x = 9;
    BOOST_REQUIRE(::pwrite(fd, &x, 1, 64 + 8) == 1);
    ::close(fd);
  }
  try {
    data::line_dataset ds(p, line_format::text, req);
    BOOST_FAIL("a damaged index must be refused");
  } catch (const io::format_error& e) {
    BOOST_TEST(std::string(e.what()).find("checksum") != std::string::npos, e.what());
  }
  // No index at all under require_valid; save_index = false leaves none behind.
  fs::remove(p.string() + ".hidx");
  BOOST_CHECK_THROW(data::line_dataset(p, line_format::text, req), io::format_error);
  data::line_dataset_options nosave;
  nosave.save_index = false;
  BOOST_TEST(data::line_dataset(p, line_format::text, nosave).size() == 4U);
  BOOST_TEST(!fs::exists(p.string() + ".hidx"));
}

BOOST_AUTO_TEST_CASE(sparse_file_past_4_gib) {
  hone_test::temp_dir d("data-sparse");
  const fs::path p = d / "sparse.txt";
  const std::uint64_t hole = (std::uint64_t{1} << 32) + 12345;
  const std::string tail = "\nalpha\nbeta\r\ngamma";
  {
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    BOOST_REQUIRE(fd >= 0);
    BOOST_REQUIRE(::ftruncate(fd, static_cast<off_t>(hole)) == 0);
    BOOST_REQUIRE(::pwrite(fd, tail.data(), tail.size(), static_cast<off_t>(hole)) ==
                  static_cast<ssize_t>(tail.size()));
    ::close(fd);
  }
  {
    // Where the file system cannot report holes (no SEEK_DATA), the scan would read 4 GiB of zero
    // pages: too slow for a unit test, so it is skipped there with a message.
    const io::input_file in(p);
    const auto extents = data::detail::data_extents(in.native_handle(), in.size());
    if (extents.empty() || extents.front().first == 0) {
      BOOST_TEST_MESSAGE("skipped: the temp directory's file system does not report holes");
      return;
    }
    BOOST_TEST(extents.front().first >= (std::uint64_t{1} << 32) - 4096);
  }
  const auto t0 = std::chrono::steady_clock::now();
  data::line_dataset ds(p, line_format::text);
  BOOST_TEST(ds.size() == 4U);  // the zero bytes before the first '\n' are record 0
  BOOST_TEST(ds.offset(0) == 0U);
  BOOST_TEST(ds.offset(1) == hole + 1);
  BOOST_TEST(ds.offset(3) == hole + 13);
  BOOST_TEST(ds.get(1) == "alpha");
  BOOST_TEST(ds.get(2) == "beta");
  BOOST_TEST(ds.get(3) == "gamma");
  // The saved index holds the offsets past 4 GiB, and is reused.
  data::line_dataset_options req;
  req.policy = data::index_policy::require_valid;
  data::line_dataset again(p, line_format::text, req);
  BOOST_TEST(again.offset(3) == hole + 13);
  BOOST_TEST(again.get(3) == "gamma");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE("sparse 4 GiB file indexed twice in " << secs << " s");
}

// ---- the vectorized CSV scan (hone/data/detail/csv_scan.hpp): every kernel this CPU runs against
//      the scalar loop, at every alignment of the start pointer, on random CSV with quoted
//      newlines, doubled quotes, empty lines, CRLF and stray quotes, and on ranges that begin or
//      end inside a quoted field; the whole index under each forced target against the sequential
//      reference ----

namespace {

constexpr hone::isa every_isa[] = {hone::isa::scalar, hone::isa::sse2, hone::isa::avx2,
                                   hone::isa::avx512, hone::isa::neon};

/// The CSV kernels this CPU and build run.
std::vector<hone::isa> csv_kernels() {
  std::vector<hone::isa> out;
  for (hone::isa t : every_isa) {
    if (data::detail::csv_scan_supported(t)) out.push_back(t);
  }
  return out;
}

/// About `n` bytes of CSV (cut to exactly n, so a quote may be left open): plain and quoted
/// fields, quoted fields holding '\n', "\r\n", "" and ',', records ending in '\n' or "\r\n",
/// empty lines (also "\r\n" ones), a stray '"' now and then. `dense` draws single bytes from
/// "\"\n\r,a" instead.
std::string random_csv(std::mt19937_64& rng, std::size_t n, bool dense) {
  std::string s;
  if (dense) {
    const std::string_view alpha = "\"\n\r,a";
    for (std::size_t i = 0; i < n; ++i) s += alpha[rng() % alpha.size()];
    return s;
  }
  while (s.size() < n) {
    switch (rng() % 8) {
      case 0:
      case 1:
        s.append(1 + rng() % 12, static_cast<char>('a' + rng() % 26));
        break;
      case 2:
        s += ',';
        break;
      case 3: {  // a quoted field, sometimes longer than a 64-byte block
        s += '"';
        const std::size_t parts = 1 + rng() % ((rng() % 4 == 0) ? 40 : 6);
        for (std::size_t k = 0; k < parts; ++k) {
          const char* inner[] = {"x", "text", ",", "\n", "\r\n", "\"\"", "\n\n", "  "};
          s += inner[rng() % std::size(inner)];
        }
        s += '"';
        break;
      }
      case 4:
      case 5:
        s += (rng() % 3 == 0) ? "\r\n" : "\n";
        break;
      case 6:
        s += (rng() % 2 == 0) ? "\n\n" : "\r\n\r\n";
        break;
      default:
        if (rng() % 4 == 0) s += '"';  // a stray quote: the rest flips
        break;
    }
  }
  s.resize(n);
  return s;
}

struct csv_result {
  std::vector<std::uint64_t> starts[2];
  bool odd = false;
  bool operator==(const csv_result& o) const {
    return starts[0] == o.starts[0] && starts[1] == o.starts[1] && odd == o.odd;
  }
};

csv_result csv_scan_with(hone::isa t, std::string_view s, std::uint64_t b, std::uint64_t e) {
  csv_result r;
  r.odd = data::detail::csv_scan(t, s, b, e, r.starts);
  return r;
}

/// `s` copied to `offset` bytes past a 64-byte boundary (the view stays valid while `store` does).
std::string_view placed(std::vector<char>& store, std::string_view s, std::size_t offset) {
  store.assign(s.size() + 128, '#');
  const auto addr = reinterpret_cast<std::uintptr_t>(store.data());
  char* p = store.data() + ((64 - addr % 64) % 64) + offset;
  std::copy(s.begin(), s.end(), p);
  return {p, s.size()};
}

/// The inputs both scan tests compare their kernels on: every length 0..300 (`make(n, dense)`)
/// at every alignment 0..63 of its first byte, the whole input and three random ranges (which
/// begin and end anywhere); then inputs of several KB, sparse and dense, at every alignment, the
/// whole and one random range, and `cuts(s)` for the test's own ranges of each.
template <class Make, class Check, class Cuts>
void sweep_inputs(std::mt19937_64& rng, std::vector<char>& store, const Make& make,
                  const Check& check, const Cuts& cuts) {
  for (std::size_t n = 0; n <= 300; ++n) {
    const std::string s = make(n, n % 5 == 4);
    for (std::size_t offset = 0; offset < 64; ++offset) {
      const std::string_view v = placed(store, s, offset);
      check(v, 0, n, "a random input");
      for (int k = 0; k < 3 && n > 0; ++k) {
        const std::uint64_t b = rng() % n;
        check(v, b, b + rng() % (n - b + 1), "a random range");
      }
    }
  }
  for (std::size_t n :
       {std::size_t{2048}, std::size_t{4099}, std::size_t{7777}, std::size_t{9000}}) {
    for (bool dense : {false, true}) {
      const std::string s = make(n, dense);
      for (std::size_t offset = 0; offset < 64; ++offset) {
        const std::string_view v = placed(store, s, offset);
        check(v, 0, n, "a long input");
        const std::uint64_t b = rng() % n;
        check(v, b, b + rng() % (n - b + 1), "a long range");
      }
      cuts(s);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(csv_scan_kernels_match_the_scalar_loop) {
  const auto kernels = csv_kernels();
  std::string names;
  for (hone::isa t : kernels) names += std::string(hone::to_string(t)) + " ";
  BOOST_TEST_MESSAGE("CSV scan kernels on this CPU: " << names);
#if defined(HONE_DETAIL_CSV_SSE2)
  BOOST_TEST(kernels.size() >= 2U);  // x86-64: at least scalar and sse2
#endif
  BOOST_CHECK_THROW((void)csv_scan_with(hone::isa::neon, "a\nb", 0, 3), hone::config_error);

  std::mt19937_64 rng(2718);
  std::vector<char> store;
  long compared = 0;
  auto check = [&](std::string_view s, std::uint64_t b, std::uint64_t e, const char* what) {
    const csv_result ref = csv_scan_with(hone::isa::scalar, s, b, e);
    for (hone::isa t : kernels) {
      if (t == hone::isa::scalar) continue;
      const csv_result got = csv_scan_with(t, s, b, e);
      if (!(got == ref)) {
        BOOST_ERROR("kernel " << hone::to_string(t) << " differs from the scalar loop on " << what
                              << " of " << s.size() << " bytes at "
                              << static_cast<const void*>(s.data()) << ", range [" << b << ", " << e
                              << ")");
      }
      ++compared;
    }
  };
  // Random ranges begin and end anywhere, inside quoted fields too; the long inputs have quoted
  // fields spanning many blocks and are also cut at every quote.
  sweep_inputs(
      rng, store, [&](std::size_t n, bool dense) { return random_csv(rng, n, dense); }, check,
      [&](const std::string& s) {
        for (std::size_t q = 0; q < s.size(); ++q) {
          if (s[q] == '"') {
            check(s, q + 1, s.size(), "a range starting inside a quote");
            check(s, 0, q, "a range ending at a quote");
          }
        }
      });
  // Exactly sized heap copies: no kernel reads past the input (AddressSanitizer in CI).
  for (std::size_t n = 1; n <= 200; n += 7) {
    const std::string s = random_csv(rng, n, false);
    const std::vector<char> exact(s.begin(), s.end());
    check({exact.data(), exact.size()}, 0, n, "an exact-size copy");
  }
  // A quoted field of 10 blocks full of newlines: only the carried quote state hides them.
  std::string longq = "id,\"";
  for (int i = 0; i < 320; ++i) longq += "x\n";
  longq += "\"\nnext,row\n";
  const csv_result ref = csv_scan_with(hone::isa::scalar, longq, 0, longq.size());
  BOOST_TEST(ref.starts[0] == std::vector<std::uint64_t>{longq.size() - 9});
  BOOST_TEST(!ref.odd);
  for (hone::isa t : kernels) {
    BOOST_TEST((csv_scan_with(t, longq, 0, longq.size()) == ref), hone::to_string(t));
  }
  if (kernels.size() > 1) BOOST_TEST(compared > 100000);
}

BOOST_AUTO_TEST_CASE(csv_index_under_each_forced_target) {
  std::mt19937_64 rng(31415);
  for (hone::isa t : every_isa) {
    if (!hone::isa_supported(t)) continue;
    const hone::scoped_isa forced(t);
    const hone::isa kernel = data::detail::csv_scan_kernel(t);
    BOOST_TEST_MESSAGE("target " << hone::to_string(t) << ": CSV kernel "
                                 << hone::to_string(kernel));
    BOOST_TEST(data::detail::csv_scan_supported(kernel));
    if (t == hone::isa::scalar) BOOST_TEST((kernel == hone::isa::scalar));
    for (int round = 0; round < 60; ++round) {
      std::string s = random_csv(rng, rng() % ((round % 6 == 0) ? 6000 : 300), round % 4 == 3);
      if (round % 9 == 0) s = "\xEF\xBB\xBF" + s;
      bool quoted = false;
      for (char c : s) quoted = quoted != (c == '"');
      const auto ref = data::detail::sequential_index(line_format::csv, s);
      for (std::size_t chunk : {std::size_t{1}, std::size_t{7}, std::size_t{63}, std::size_t{64},
                                std::size_t{65}, std::size_t{200}, std::size_t{1} << 20}) {
        if (quoted) {
          // The "ends inside a quoted field" refusal, from every kernel.
          BOOST_CHECK_THROW((void)par(line_format::csv, s, chunk, 2), io::format_error);
          continue;
        }
        BOOST_TEST(par(line_format::csv, s, chunk, 1 + round % 2) == ref,
                   "target " << hone::to_string(t) << " chunk " << chunk << " size " << s.size());
      }
    }
  }
}

// ---- the text and JSON Lines block scan (hone/data/detail/line_scan.hpp): every kernel this CPU
//      runs against the memchr loop and a byte loop, at every alignment of the start pointer, on
//      random lines with empty lines, whitespace-only lines, CRLF, lone '\r' and no trailing
//      newline, on ranges that begin and end anywhere; the whole index under each forced target
//      against the sequential reference ----

namespace {

/// The line kernels this CPU and build run.
std::vector<hone::isa> line_kernels() {
  std::vector<hone::isa> out;
  for (hone::isa t : every_isa) {
    if (data::detail::line_scan_supported(t)) out.push_back(t);
  }
  return out;
}

/// About `n` bytes of lines (cut to exactly n, so the last line may have no '\n'): JSON-like and
/// word lines of 0 to ~150 bytes, ending in '\n' or "\r\n", empty lines ("\n", "\r\n"),
/// whitespace-only lines, a lone '\r' now and then. `dense` draws single bytes from "\n\r a{".
std::string random_lines(std::mt19937_64& rng, std::size_t n, bool dense) {
  std::string s;
  if (dense) {
    const std::string_view alpha = "\n\r a{";
    for (std::size_t i = 0; i < n; ++i) s += alpha[rng() % alpha.size()];
    return s;
  }
  while (s.size() < n) {
    switch (rng() % 6) {
      case 0:
      case 1:
        s += "{\"k\":\"";
        s.append(rng() % ((rng() % 8 == 0) ? 150 : 20), static_cast<char>('a' + rng() % 26));
        s += "\"}";
        break;
      case 2:
        s.append(rng() % 4, ' ');  // whitespace-only when nothing else comes before the '\n'
        s += (rng() % 2 == 0) ? "\t" : "";
        break;
      case 3:
        s += (rng() % 3 == 0) ? "\r\n" : "\n";
        break;
      case 4:
        s += (rng() % 2 == 0) ? "\n\n" : "\r\n\r\n";
        break;
      default:
        s += (rng() % 4 == 0) ? "\r" : "x";
        break;
    }
  }
  s.resize(n);
  return s;
}

std::vector<std::uint64_t> line_scan_with(hone::isa t, bool skip_empty, std::string_view s,
                                          std::uint64_t b, std::uint64_t e) {
  std::vector<std::uint64_t> out;
  data::detail::line_scan(t, skip_empty, s, b, e, out);
  return out;
}

/// The byte-loop reference of line_scan (independent of the memchr loop).
std::vector<std::uint64_t> line_scan_bytes(bool skip_empty, std::string_view s, std::uint64_t b,
                                           std::uint64_t e) {
  std::vector<std::uint64_t> out;
  for (std::uint64_t q = b; q < e; ++q) {
    if (s[q] != '\n' || q + 1 >= s.size()) continue;
    const std::uint64_t p = q + 1;
    const bool empty = s[p] == '\n' || (s[p] == '\r' && (p + 1 == s.size() || s[p + 1] == '\n'));
    if (!(skip_empty && empty)) out.push_back(p);
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(line_scan_kernels_match_the_memchr_loop) {
  const auto kernels = line_kernels();
  std::string names;
  for (hone::isa t : kernels) names += std::string(hone::to_string(t)) + " ";
  BOOST_TEST_MESSAGE("line scan kernels on this CPU: " << names);
#if defined(HONE_DETAIL_LINE_SSE2)
  BOOST_TEST(kernels.size() >= 2U);  // x86-64: at least scalar and sse2
#endif
  BOOST_CHECK_THROW((void)line_scan_with(hone::isa::neon, false, "a\nb", 0, 3), hone::config_error);

  // The rules on small cases (text keeps empty lines, JSON Lines skips "\n" and "\r\n" ones but
  // not whitespace-only ones; no start at the end of the file).
  const std::string_view rules = "a\n\n\r\n  \n\t\nb\r\n\n\r";
  const std::vector<std::uint64_t> text_ref{2, 3, 5, 8, 10, 13, 14};
  const std::vector<std::uint64_t> jsonl_ref{5, 8, 10};
  for (hone::isa t : kernels) {
    BOOST_TEST(line_scan_with(t, false, rules, 0, rules.size()) == text_ref, hone::to_string(t));
    BOOST_TEST(line_scan_with(t, true, rules, 0, rules.size()) == jsonl_ref, hone::to_string(t));
    BOOST_TEST(line_scan_with(t, false, "ab\n", 0, 3).empty(), hone::to_string(t));
  }

  std::mt19937_64 rng(1618);
  std::vector<char> store;
  long compared = 0;
  auto check = [&](std::string_view s, std::uint64_t b, std::uint64_t e, const char* what) {
    for (bool skip_empty : {false, true}) {
      const auto ref = line_scan_with(hone::isa::scalar, skip_empty, s, b, e);
      if (ref != line_scan_bytes(skip_empty, s, b, e)) {
        BOOST_ERROR("the memchr loop differs from the byte loop on " << what);
      }
      for (hone::isa t : kernels) {
        if (t == hone::isa::scalar) continue;
        if (line_scan_with(t, skip_empty, s, b, e) != ref) {
          BOOST_ERROR("kernel " << hone::to_string(t) << (skip_empty ? " (jsonl)" : " (text)")
                                << " differs from the memchr loop on " << what << " of " << s.size()
                                << " bytes at " << static_cast<const void*>(s.data()) << ", range ["
                                << b << ", " << e << ")");
        }
        ++compared;
      }
    }
  };
  // The long inputs have blocks with many '\n' and blocks with none, and are also cut just before
  // and just after '\n's.
  sweep_inputs(
      rng, store, [&](std::size_t n, bool dense) { return random_lines(rng, n, dense); }, check,
      [&](const std::string& s) {
        for (std::size_t q = 0; q < s.size(); q += 1 + rng() % 16) {
          if (s[q] == '\n') {
            check(s, 0, q, "a range ending before a newline");
            check(s, 0, q + 1, "a range ending after a newline");
          }
        }
      });
  // Only newlines (64 starts per block), and a 10-block line with none.
  const std::string newlines(1000, '\n');
  check(newlines, 0, newlines.size(), "a file of newlines");
  check(newlines, 3, 700, "a range of newlines");
  const std::string one_line = std::string(640, 'x') + "\n" + std::string(10, 'y');
  check(one_line, 0, one_line.size(), "one long line");
  // Exactly sized heap copies, with and without a last '\n': no kernel reads past the input
  // (AddressSanitizer in CI).
  for (std::size_t n = 1; n <= 260; n += 3) {
    std::string s = random_lines(rng, n, n % 2 == 0);
    if (n % 3 == 0) s.back() = '\n';
    if (n % 3 == 1) s.back() = '\r';
    const std::vector<char> exact(s.begin(), s.end());
    const std::string_view v(exact.data(), exact.size());
    check(v, 0, n, "an exact-size copy");
    check(v, n / 2, n, "the second half of an exact-size copy");
  }
  if (kernels.size() > 1) BOOST_TEST(compared > 100000);
}

BOOST_AUTO_TEST_CASE(text_and_jsonl_index_under_each_forced_target) {
  std::mt19937_64 rng(27182);
  for (hone::isa t : every_isa) {
    if (!hone::isa_supported(t)) continue;
    const hone::scoped_isa forced(t);
    for (line_format f : {line_format::text, line_format::jsonl}) {
      const hone::isa kernel = data::detail::scan_kernel(f, t);
      BOOST_TEST_MESSAGE("target " << hone::to_string(t) << ": " << data::format_name(f)
                                   << " kernel " << hone::to_string(kernel));
      BOOST_TEST(data::detail::line_scan_supported(kernel));
      if (t == hone::isa::scalar) BOOST_TEST((kernel == hone::isa::scalar));
      for (int round = 0; round < 60; ++round) {
        std::string s = random_lines(rng, rng() % ((round % 6 == 0) ? 6000 : 300), round % 4 == 3);
        if (round % 9 == 0) s = "\xEF\xBB\xBF" + s;
        if (round % 7 == 0) s = "\n\r\n" + s;  // empty first lines
        const auto ref = data::detail::sequential_index(f, s);
        for (std::size_t chunk : {std::size_t{1}, std::size_t{7}, std::size_t{63}, std::size_t{64},
                                  std::size_t{65}, std::size_t{200}, std::size_t{1} << 20}) {
          BOOST_TEST(par(f, s, chunk, 1 + round % 2) == ref,
                     "target " << hone::to_string(t) << " " << data::format_name(f) << " chunk "
                               << chunk << " size " << s.size());
        }
      }
    }
  }
}
