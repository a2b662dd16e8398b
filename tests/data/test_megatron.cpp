// Tests of hone/data/megatron.hpp: the .idx bytes against the published layout written out by
// hand, round trips of every dtype with documents, and damaged pairs (every truncation of the
// .idx, a truncated .bin, bad magic, version, dtype, lengths, pointers, document indices) refused
// with sentences.
#define BOOST_TEST_MODULE hone_data_megatron
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <hone/data/megatron.hpp>
#include <hone/io/file_io.hpp>

#include "../support/temp_dir.hpp"

namespace data = hone::data;
namespace io = hone::io;
namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& p) {
  return io::read_small_file(p, 1U << 20);
}

template <class V>
void put(std::string& s, V v) {
  char b[sizeof(V)];
  std::memcpy(b, &v, sizeof(V));
  s.append(b, sizeof(V));
}

// Writes {1,2,3} {4} | {5,6} as int32 (two documents); returns the prefix.
fs::path write_sample(const hone_test::temp_dir& d) {
  const fs::path prefix = d / "sample";
  data::megatron_writer<std::int32_t> w(prefix);
  const std::int32_t a[] = {1, 2, 3}, b[] = {4}, c[] = {5, 6};
  w.add_item(a);
  w.add_item(b);
  w.end_document();
  w.add_item(c);
  w.end_document();
  w.finalize();
  return prefix;
}

void expect_refused(const fs::path& prefix, const std::string& needle) {
  try {
    data::megatron_dataset<std::int32_t> ds(prefix);
    BOOST_ERROR("a damaged pair was accepted; expected: " << needle);
  } catch (const hone::error& e) {
    const std::string m = e.what();
    BOOST_TEST(m.find(needle) != std::string::npos, m);
    BOOST_TEST(m.find("hone: '") == 0U, m);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(idx_bytes_follow_the_published_layout) {
  hone_test::temp_dir d("data-mega");
  const fs::path prefix = write_sample(d);
  std::string want("MMIDIDX\0\0", 9);
  put<std::uint64_t>(want, 1);
  put<std::uint8_t>(want, 4);  // int32
  put<std::uint64_t>(want, 3);
  put<std::uint64_t>(want, 3);
  for (std::int32_t n : {3, 1, 2}) put(want, n);
  for (std::int64_t p : {0, 12, 16}) put(want, p);
  for (std::int64_t k : {0, 2, 3}) put(want, k);
  BOOST_TEST(read_all(prefix.string() + ".idx") == want);
  std::string bin;
  for (std::int32_t v : {1, 2, 3, 4, 5, 6}) put(bin, v);
  BOOST_TEST(read_all(prefix.string() + ".bin") == bin);
  BOOST_TEST(!fs::exists(prefix.string() + ".idx.tmp." + std::to_string(::getpid())));
}

BOOST_AUTO_TEST_CASE(round_trip_with_documents) {
  hone_test::temp_dir d("data-mega-rt");
  const fs::path prefix = write_sample(d);
  data::megatron_dataset<std::int32_t> ds(prefix);
  BOOST_TEST(ds.size() == 3U);
  BOOST_TEST(ds.documents() == 2U);
  BOOST_TEST(std::vector<std::int32_t>(ds[0].begin(), ds[0].end()) ==
             (std::vector<std::int32_t>{1, 2, 3}));
  BOOST_TEST(std::vector<std::int32_t>(ds[2].begin(), ds[2].end()) ==
             (std::vector<std::int32_t>{5, 6}));
  BOOST_TEST(ds.document(0).first == 0U);
  BOOST_TEST(ds.document(0).second == 2U);
  BOOST_TEST(ds.document(1).second == 3U);
  BOOST_CHECK_THROW((void)ds.get(3), hone::config_error);
  BOOST_CHECK_THROW((void)ds.document(2), hone::config_error);
  BOOST_TEST(data::megatron_dtype_code(prefix) == 4);
  // Opened as another element type: a sentence naming both.
  try {
    data::megatron_dataset<std::uint16_t> wrong(prefix);
    BOOST_FAIL("a dtype mismatch must be refused");
  } catch (const hone::config_error& e) {
    BOOST_TEST(std::string(e.what()).find("holds int32 elements, but it was opened as uint16") !=
                   std::string::npos,
               e.what());
  }
}

template <class T>
void round_trip_type(const hone_test::temp_dir& d, std::uint8_t code) {
  const fs::path prefix = d / ("t" + std::to_string(code));
  std::vector<T> tokens;
  for (int i = 0; i < 100; ++i) tokens.push_back(static_cast<T>(i * 3 - 50 * (code % 2)));
  {
    data::megatron_writer<T> w(prefix);
    const std::size_t lengths[] = {10, 0, 40, 50};
    w.add_document(tokens, lengths);
    w.add_item(std::span<const T>(tokens).first(7));  // left open: finalize closes it
    w.finalize();
  }
  BOOST_TEST(data::megatron_dtype_code(prefix) == code);
  data::megatron_dataset<T> ds(prefix);
  BOOST_TEST(ds.size() == 5U);
  BOOST_TEST(ds.documents() == 2U);
  BOOST_TEST(ds[1].size() == 0U);
  BOOST_TEST(ds[3][49] == tokens[99]);
  BOOST_TEST(ds[4][6] == tokens[6]);
}

BOOST_AUTO_TEST_CASE(every_dtype_round_trips) {
  hone_test::temp_dir d("data-mega-types");
  round_trip_type<std::uint8_t>(d, 1);
  round_trip_type<std::int8_t>(d, 2);
  round_trip_type<std::int16_t>(d, 3);
  round_trip_type<std::int32_t>(d, 4);
  round_trip_type<std::int64_t>(d, 5);
  round_trip_type<double>(d, 6);
  round_trip_type<float>(d, 7);
  round_trip_type<std::uint16_t>(d, 8);
}

BOOST_AUTO_TEST_CASE(damaged_pairs_are_refused_with_sentences) {
  hone_test::temp_dir d("data-mega-bad");
  const fs::path prefix = write_sample(d);
  const fs::path idx = prefix.string() + ".idx";
  const fs::path bin = prefix.string() + ".bin";
  const std::string good_idx = read_all(idx);
  const std::string good_bin = read_all(bin);
  auto with_idx = [&](std::string bytes) { io::write_file(idx, bytes, false); };
  auto patched = [&](std::size_t at, auto value) {
    std::string s = good_idx;
    std::memcpy(s.data() + at, &value, sizeof(value));
    return s;
  };
  // Every truncation of the .idx.
  for (std::size_t n = 0; n < good_idx.size(); ++n) {
    with_idx(good_idx.substr(0, n));
    expect_refused(prefix, n < 34 ? "shorter than the 34-byte header" : "sample.idx");
  }
  with_idx(good_idx + "x");
  expect_refused(prefix, "but its header's counts");
  with_idx(good_idx + std::string(3, '\0'));  // one int8 mode per sequence: multimodal
  expect_refused(prefix, "multimodal files with sequence modes are not supported");
  with_idx(std::string("NOTIDXX\0\0", 9) + good_idx.substr(9));
  expect_refused(prefix, "magic bytes");
  with_idx(patched(9, std::uint64_t{2}));
  expect_refused(prefix, "its version is 2");
  with_idx(patched(17, std::uint8_t{9}));
  expect_refused(prefix, "dtype code 9");
  with_idx(patched(18, std::uint64_t{1} << 62));
  expect_refused(prefix, "more than its");
  with_idx(patched(34 + 4, std::int32_t{-1}));
  expect_refused(prefix, "negative length -1");
  with_idx(patched(34 + 4, std::int32_t{4}));  // sequence 1 grows past the .bin's end
  expect_refused(prefix, "reaches past the file's 24 bytes");
  with_idx(patched(34 + 12 + 8, std::int64_t{-4}));
  expect_refused(prefix, "sequence 1 (1 elements at byte -4)");
  with_idx(patched(34 + 12 + 8, std::int64_t{13}));
  expect_refused(prefix, "misaligned");
  with_idx(patched(34 + 12 + 24, std::int64_t{1}));
  expect_refused(prefix, "start with 1 instead of 0");
  with_idx(patched(34 + 12 + 24 + 8, std::int64_t{4}));
  expect_refused(prefix, "out of order or past the 3 sequences");
  with_idx(patched(34 + 12 + 24 + 16, std::int64_t{2}));
  expect_refused(prefix, "last document ends at sequence 2");
  // A truncated .bin under a good .idx.
  with_idx(good_idx);
  io::write_file(bin, good_bin.substr(0, good_bin.size() - 1), false);
  expect_refused(prefix, "sample.bin' is not a valid Megatron indexed dataset: sequence 2");
  io::write_file(bin, good_bin, false);
  BOOST_TEST(data::megatron_dataset<std::int32_t>(prefix).size() == 3U);
}
