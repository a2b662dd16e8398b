// Tests of hone/data/shard.hpp: records written by shard_writer read back by shard_file and
// shard_dataset, and the same files parsed by an independent reader written here from the layout
// in docs/data.md (plain ZSTD_decompress per frame, its own little-endian parsing); the frame and
// shard cutting rules; random access decoding at most one frame; the empty set; and a damaged-shard
// corpus (every truncation, every single-bit flip, a foreign file, hand-made index and footer
// damage) refused with io::format_error sentences naming the file and the frame; four threads
// sharing one dataset, and hone's loader over it on oneTBB threads.
#define BOOST_TEST_MODULE hone_data_shard
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <hone/data/dataset.hpp>
#include <hone/data/loader.hpp>
#include <hone/data/sampler.hpp>
#include <hone/data/shard.hpp>
#include <hone/io/file_io.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../support/error_text.hpp"
#include "../support/temp_dir.hpp"

namespace data = hone::data;
namespace io = hone::io;
namespace fs = std::filesystem;

static_assert(data::check_dataset<data::shard_file>());
static_assert(data::check_dataset<data::shard_dataset>());

namespace {

std::string read_all(const fs::path& p) {
  return io::read_small_file(p, 64u << 20);
}

std::uint64_t le64(const std::string& s, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

/// The reference reader: records of one shard file, from the documented layout alone. Also
/// returns the record count of every frame.
std::vector<std::string> oracle_read(const std::string& f,
                                     std::vector<std::size_t>* frame_records = nullptr) {
  BOOST_REQUIRE_GE(f.size(), 72u);
  BOOST_REQUIRE(f.compare(0, 8, std::string("\x89HRS\r\n\x1a\n", 8)) == 0);
  BOOST_REQUIRE(f.compare(f.size() - 8, 8, "HRS-END\n") == 0);
  const std::size_t footer = f.size() - 56;
  const std::uint64_t index = le64(f, footer + 8), frames = le64(f, footer + 16);
  BOOST_REQUIRE_EQUAL(index + 56 * frames, footer);
  std::vector<std::string> out;
  for (std::uint64_t k = 0; k < frames; ++k) {
    const std::size_t e = index + 56 * k;
    const std::uint64_t off = le64(f, e), csize = le64(f, e + 8), dsize = le64(f, e + 16),
                        n = le64(f, e + 32);
    std::string dec(dsize, '\0');
    const std::size_t r = ZSTD_decompress(dec.data(), dec.size(), f.data() + off, csize);
    BOOST_REQUIRE(!ZSTD_isError(r));
    BOOST_REQUIRE_EQUAL(r, dsize);
    std::uint64_t begin = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint64_t end = le64(dec, 8 * i);
      out.push_back(dec.substr(8 * n + begin, end - begin));
      begin = end;
    }
    if (frame_records != nullptr) frame_records->push_back(n);
  }
  BOOST_REQUIRE_EQUAL(out.size(), le64(f, footer + 24));
  return out;
}

std::string random_record(std::mt19937_64& rng, std::size_t n) {
  std::string s(n, '\0');
  // Half the records compressible text, half random bytes (zstd stores those raw).
  const bool text = rng() % 2 == 0;
  for (auto& c : s) c = static_cast<char>(text ? 'a' + rng() % 4 : rng() % 256);
  return s;
}

/// Reads every record of `ds` in order through one shard_record.
template <class D>
std::vector<std::string> read_all_records(const D& ds) {
  std::vector<std::string> out;
  data::shard_record r;
  for (std::size_t i = 0; i < ds.size(); ++i) {
    ds.get(i, r);
    out.emplace_back(r.view());
  }
  return out;
}

/// A small shard in memory: 40 records over frames of at most 64 bytes.
std::string small_shard(const hone_test::temp_dir& d, std::vector<std::string>* records = nullptr) {
  data::shard_options opt;
  opt.frame_bytes = 64;
  data::shard_writer w(d.path, "small", opt);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 40; ++i) {
    const std::string r = random_record(rng, rng() % 40);
    w.add(r);
    if (records != nullptr) records->push_back(r);
  }
  const auto shards = w.finish();
  BOOST_REQUIRE_EQUAL(shards.size(), 1u);
  return read_all(shards[0].path);
}

}  // namespace

BOOST_AUTO_TEST_CASE(round_trip_sizes_around_the_frame_size) {
  hone_test::temp_dir d("shard");
  data::shard_options opt;
  opt.frame_bytes = 256;
  std::vector<std::string> records;
  std::mt19937_64 rng(1);
  const std::size_t sizes[] = {0, 0, 1, 255, 256, 257, 1000, 0, 3, 2000, 17, 128, 129, 0};
  for (const std::size_t n : sizes) records.push_back(random_record(rng, n));
  for (int i = 0; i < 300; ++i) records.push_back(random_record(rng, rng() % 300));
  data::shard_writer w(d.path, "rt", opt);
  for (const auto& r : records) w.add(r);
  BOOST_TEST(w.records() == records.size());
  const auto shards = w.finish();
  BOOST_REQUIRE_EQUAL(shards.size(), 1u);
  BOOST_TEST(shards[0].path == d / "rt-00000.hshard");
  BOOST_TEST(!fs::exists(d / "rt-00000.hshard.tmp"));
  const std::string bytes = read_all(shards[0].path);
  BOOST_TEST(shards[0].bytes == bytes.size());

  // The independent reader sees the same records; the frames follow the cutting rule.
  std::vector<std::size_t> per_frame;
  BOOST_TEST(oracle_read(bytes, &per_frame) == records, boost::test_tools::per_element());
  BOOST_TEST(per_frame.size() == shards[0].frames);
  std::size_t at = 0;
  for (const std::size_t n : per_frame) {
    // A frame's fill: its records and 8 bytes of record table each.
    std::size_t total = 0;
    for (std::size_t k = 0; k < n; ++k) total += records[at + k].size() + 8;
    if (n > 1) BOOST_TEST(total <= opt.frame_bytes);  // several records fit the frame
    for (std::size_t k = 0; k < n; ++k) {
      if (records[at + k].size() + 8 > opt.frame_bytes) BOOST_TEST(n == 1u);  // alone
    }
    // The frame was closed because the next record did not fit or it was full.
    if (at + n < records.size()) {
      BOOST_TEST(
          (total >= opt.frame_bytes || total + records[at + n].size() + 8 > opt.frame_bytes));
    }
    at += n;
  }

  // hone's reader agrees, through the file and through view().
  const auto f = data::shard_file::open(shards[0].path);
  BOOST_TEST(f.size() == records.size());
  BOOST_TEST(read_all_records(f) == records, boost::test_tools::per_element());
  const auto v = data::shard_file::view(std::as_bytes(std::span(bytes.data(), bytes.size())), "x");
  BOOST_TEST(read_all_records(v) == records, boost::test_tools::per_element());
  f.verify();
}

BOOST_AUTO_TEST_CASE(many_shards_and_random_access) {
  hone_test::temp_dir d("shard");
  data::shard_options opt;
  opt.frame_bytes = 512;
  opt.shard_bytes = 4096;
  std::vector<std::string> records;
  std::mt19937_64 rng(2);
  data::shard_writer w(d.path, "many", opt);
  for (int i = 0; i < 3000; ++i) {
    records.push_back(random_record(rng, rng() % 100));
    w.add(records.back());
  }
  // 1000 empty records: the record table alone fills frames (at most 64 entries of 8 bytes each).
  for (int i = 0; i < 1000; ++i) {
    records.emplace_back();
    w.add(records.back());
  }
  // One record larger than a shard: its frame gets a shard of its own.
  records.push_back(random_record(rng, 9000));
  w.add(records.back());
  for (int i = 0; i < 50; ++i) {
    records.push_back(random_record(rng, rng() % 100));
    w.add(records.back());
  }
  const auto written = w.finish();
  BOOST_TEST_REQUIRE(written.size() > 10u);
  const auto paths = data::list_shards(d.path, "many");
  BOOST_REQUIRE_EQUAL(paths.size(), written.size());
  std::vector<std::string> oracle;
  for (std::size_t s = 0; s < paths.size(); ++s) {
    BOOST_TEST(paths[s] == written[s].path);
    const std::string bytes = read_all(paths[s]);
    if (written[s].frames > 1) BOOST_TEST(bytes.size() <= opt.shard_bytes);
    std::vector<std::size_t> per_frame;
    for (auto& r : oracle_read(bytes, &per_frame)) oracle.push_back(std::move(r));
    for (const std::size_t n : per_frame) BOOST_TEST(n <= opt.frame_bytes / 8);
  }
  BOOST_TEST(oracle == records, boost::test_tools::per_element());

  const data::shard_dataset ds(paths);
  BOOST_TEST(ds.size() == records.size());
  BOOST_TEST(read_all_records(ds) == records, boost::test_tools::per_element());
  // Random access: each get decodes at most one frame; the cache saves repeats.
  data::shard_record r;
  std::uniform_int_distribution<std::size_t> pick(0, records.size() - 1);
  std::uint64_t gets = 0;
  for (int k = 0; k < 2000; ++k) {
    const std::size_t i = pick(rng);
    const auto before = r.frames_decoded();
    ds.get(i, r);
    ++gets;
    BOOST_TEST(r.frames_decoded() - before <= 1u);
    BOOST_REQUIRE(r.view() == records[i]);
    ds.get(i, r);  // the same frame again: no decoding
    BOOST_TEST(r.frames_decoded() - before <= 1u);
  }
  BOOST_TEST(r.frames_decoded() <= gets);
  // A sequential pass decodes each frame exactly once.
  data::shard_record seq;
  std::uint64_t frames = 0;
  for (const auto& s : written) frames += s.frames;
  for (std::size_t i = 0; i < ds.size(); ++i) ds.get(i, seq);
  BOOST_TEST(seq.frames_decoded() == frames);
  // A copy of a record keeps its bytes.
  ds.get(5, r);
  const data::shard_record copy = r;
  BOOST_TEST(copy.view() == records[5]);
  const auto [shard, local] = ds.locate(records.size() - 1);
  BOOST_TEST(shard == paths.size() - 1);
  BOOST_TEST(local == ds.shards()[shard].size() - 1);
}

BOOST_AUTO_TEST_CASE(empty_sets_and_bad_arguments) {
  hone_test::temp_dir d("shard");
  const data::shard_dataset none;
  BOOST_TEST(none.size() == 0u);
  data::shard_record r;
  BOOST_CHECK_EXCEPTION(none.get(0, r), hone::config_error, [](const hone::config_error& e) {
    return std::string(e.what()).find("record 0 is past the end of the shard set (0 records") !=
           std::string::npos;
  });
  // No records: one valid empty shard.
  data::shard_writer w(d.path, "empty");
  const auto written = w.finish();
  BOOST_REQUIRE_EQUAL(written.size(), 1u);
  BOOST_TEST(written[0].records == 0u);
  const data::shard_dataset ds(data::list_shards(d.path, "empty"));
  BOOST_TEST(ds.size() == 0u);
  BOOST_TEST(oracle_read(read_all(written[0].path)).empty());
  BOOST_TEST(data::list_shards(d.path, "other").empty());
  BOOST_CHECK_THROW(w.add(std::string_view("x")), hone::config_error);
  BOOST_CHECK_EXCEPTION(
      data::shard_writer(d / "missing", "x"), hone::config_error, [](const hone::config_error& e) {
        return std::string(e.what()).find("is not a directory") != std::string::npos;
      });
  data::shard_options opt;
  opt.frame_bytes = 0;
  BOOST_CHECK_THROW(data::shard_writer(d.path, "x", opt), hone::config_error);
  BOOST_CHECK_THROW(data::shard_writer(d.path, "a/b"), hone::config_error);
  // A writer abandoned before finish() leaves no temporary file behind.
  {
    data::shard_writer a(d.path, "abandoned", {.frame_bytes = 8});
    for (int i = 0; i < 10; ++i) a.add(std::string_view("0123456789"));
  }
  for (const auto& e : fs::directory_iterator(d.path)) {
    BOOST_TEST(e.path().filename().string().find("abandoned") == std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(every_truncation_and_every_bit_flip_is_refused) {
  hone_test::temp_dir d("shard");
  std::vector<std::string> records;
  const std::string good = small_shard(d, &records);
  const auto as_bytes = [](const std::string& s) {
    return std::as_bytes(std::span(s.data(), s.size()));
  };
  BOOST_TEST(read_all_records(data::shard_file::view(as_bytes(good), "good")) == records);
  // Every byte is covered by a magic, a compared field or a checksum: any damage is an error,
  // at open or at the latest when the damaged frame is read, and never a wrong record.
  const auto refused = [&](const std::string& bad) {
    try {
      const auto f = data::shard_file::view(as_bytes(bad), "bad.hshard");
      f.verify();
      (void)read_all_records(f);
    } catch (const io::format_error& e) {
      return std::string(e.what()).find("hone: shard 'bad.hshard' ") == 0;
    }
    return false;
  };
  for (std::size_t n = 0; n < good.size(); ++n) {
    BOOST_TEST_CONTEXT("truncated to " << n << " bytes") BOOST_TEST(refused(good.substr(0, n)));
  }
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      BOOST_TEST_CONTEXT("bit " << bit << " of byte " << i) BOOST_TEST(refused(bad));
    }
  }
  BOOST_TEST(refused(good + "x"));  // a byte appended
}

BOOST_AUTO_TEST_CASE(damage_sentences_name_the_file_and_the_frame) {
  hone_test::temp_dir d("shard");
  const std::string good = small_shard(d);
  const auto open_bytes = [](const std::string& s) {
    return data::shard_file::view(std::as_bytes(std::span(s.data(), s.size())), "c.hshard");
  };
  const auto read_everything = [&](const std::string& s) {
    const auto f = open_bytes(s);
    (void)read_all_records(f);
  };
  const std::size_t footer = good.size() - 56;
  const std::uint64_t index = le64(good, footer + 8);
  const std::uint64_t frame1 = le64(good, index + 56);  // offset of frame 1
  const std::uint64_t first1 = le64(good, index + 56 + 24), n1 = le64(good, index + 56 + 32);

  // A flipped bit in frame 1's compressed bytes.
  std::string bad = good;
  bad[frame1 + 2] = static_cast<char>(bad[frame1 + 2] ^ 0x10);
  const std::string frame_name = "frame 1 (records " + std::to_string(first1) + " to " +
                                 std::to_string(first1 + n1 - 1) + ", file offset " +
                                 std::to_string(frame1) + ")";
  BOOST_TEST(hone_test::error_of<io::format_error>([&] { read_everything(bad); }) ==
             "hone: shard 'c.hshard' " + frame_name +
                 " does not match its checksum in the index (the shard is damaged: write it "
                 "again from its source)");
  // Records before the damaged frame still read (the damage is found when frame 1 is decoded).
  {
    const auto f = open_bytes(bad);
    data::shard_record r;
    f.get(0, r);
    BOOST_CHECK_THROW(f.get(first1, r), io::format_error);
    BOOST_TEST(r.frames_decoded() == 1u);
    f.get(0, r);  // the cache was cleared by the failure: frame 0 decodes again, correctly
    BOOST_TEST(r.frames_decoded() == 2u);
  }
  bad = good;
  bad[index + 3] = static_cast<char>(bad[index + 3] ^ 1);
  BOOST_TEST(hone_test::error_of<io::format_error>([&] { (void)open_bytes(bad); }) ==
             "hone: shard 'c.hshard' has a frame index that does not match its checksum in the "
             "footer (the index is damaged)");
  bad = good;
  bad[footer + 24] = static_cast<char>(bad[footer + 24] ^ 4);  // the record count
  BOOST_TEST(hone_test::error_of<io::format_error>([&] { (void)open_bytes(bad); }) ==
             "hone: shard 'c.hshard' has a footer that does not match its checksum (the footer "
             "is damaged)");
  BOOST_TEST(hone_test::error_of<io::format_error>(
                 [&] { (void)open_bytes(good.substr(0, good.size() - 1)); }) ==
             "hone: shard 'c.hshard' does not end with the shard end magic: it is truncated (or "
             "was not fully written)");
  BOOST_TEST(hone_test::error_of<io::format_error>([&] { (void)open_bytes(good.substr(0, 30)); }) ==
             "hone: shard 'c.hshard' is 30 bytes, too short for a record shard (at least 72): it "
             "is truncated");
  BOOST_TEST(hone_test::error_of<io::format_error>(
                 [&] { (void)open_bytes("{\"not\": \"a shard\"}\n"); }) ==
             "hone: shard 'c.hshard' is not a hone record shard: it does not start with the "
             "shard magic bytes (is it another kind of file?)");
  bad = good;
  bad[8] = 2;
  BOOST_TEST(hone_test::error_of<io::format_error>([&] { (void)open_bytes(bad); }) ==
             "hone: shard 'c.hshard' has format version 2 in its header; this hone reads version "
             "1 (written by a newer hone?)");

  // Damage behind valid checksums (a writer bug, or deliberate): the structural checks name it.
  // Re-seals the index and footer checksums after an edit of the index.
  const auto reseal = [&](std::string s) {
    const std::size_t ft = s.size() - 56;
    const std::uint64_t ix = le64(s, ft + 8);
    const auto put = [&](std::size_t at, std::uint64_t v) {
      for (int i = 0; i < 8; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
    };
    put(ft + 32, io::hash64(std::as_bytes(std::span(s.data() + ix, ft - ix))));
    put(ft + 40, io::hash64(std::as_bytes(std::span(s.data() + ft, 40))));
    return s;
  };
  bad = good;
  bad[index + 56 + 24] = static_cast<char>(bad[index + 56 + 24] + 1);  // frame 1's first record
  BOOST_TEST(hone_test::error_of<io::format_error>([&] { (void)open_bytes(reseal(bad)); }) ==
             "hone: shard 'c.hshard' index entry of frame 1 says it starts at record " +
                 std::to_string(first1 + 1) + ", not " + std::to_string(first1) +
                 " (the index is damaged)");
  bad = good;
  bad[index + 56] = static_cast<char>(bad[index + 56] + 1);  // frame 1's offset
  BOOST_TEST(hone_test::error_of<io::format_error>([&] {
               (void)open_bytes(reseal(bad));
             }).find("index entry of frame 1 puts it at offset") != std::string::npos);
  // A frame's decoded checksum changed (and re-sealed): found when the frame is decoded.
  bad = good;
  bad[index + 56 + 48] = static_cast<char>(bad[index + 56 + 48] ^ 1);
  BOOST_TEST(hone_test::error_of<io::format_error>([&] { read_everything(reseal(bad)); }) ==
             "hone: shard 'c.hshard' " + frame_name +
                 " decodes to bytes that do not match their checksum in the index (the shard is "
                 "damaged: write it again from its source)");

  // A shard on disk: the error names its path.
  const fs::path p = d / "small-00000.hshard";
  std::string on_disk = read_all(p);
  on_disk[frame1 + 1] = static_cast<char>(on_disk[frame1 + 1] ^ 0x40);
  io::write_file(p, on_disk);
  const auto f = data::shard_file::open(p);
  BOOST_TEST(hone_test::error_of<io::format_error>([&] {
               f.verify();
             }).find("hone: shard '" + p.string() + "' frame 1 ") == 0);
}

BOOST_AUTO_TEST_CASE(threads_share_one_dataset_each_with_its_own_record) {
  hone_test::temp_dir d("shard");
  data::shard_options opt;
  opt.frame_bytes = 300;
  opt.shard_bytes = 2048;
  std::vector<std::string> records;
  std::mt19937_64 rng(3);
  data::shard_writer w(d.path, "mt", opt);
  for (int i = 0; i < 1500; ++i) {
    records.push_back(random_record(rng, rng() % 120));
    w.add(records.back());
  }
  (void)w.finish();
  const data::shard_dataset ds(data::list_shards(d.path, "mt"));
  BOOST_REQUIRE_EQUAL(ds.size(), records.size());
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 r(100 + static_cast<unsigned>(t));
      data::shard_record rec;
      for (int k = 0; k < 3000; ++k) {
        const std::size_t i = r() % records.size();
        ds.get(i, rec);
        if (rec.view() != records[i]) ++wrong;
      }
    });
  }
  for (auto& t : threads) t.join();
  BOOST_TEST(wrong.load() == 0);

  // Through hone's loader: shuffled batches on two oneTBB threads, each slot with its own record.
  struct rows {
    std::vector<std::string> text = std::vector<std::string>(16);
  };
  const auto collate = [](rows& b, std::size_t row, const data::shard_record& rec) {
    b.text[row].assign(rec.view());
  };
  data::loader ld(ds, rows{}, collate, {.batch_size = 16, .threads = 2, .seed = 5},
                  data::shuffled_sampler{});
  std::vector<int> seen(records.size(), 0);
  while (const auto* b = ld.next()) {
    for (std::size_t k = 0; k < b->info.rows; ++k) {
      const auto i = static_cast<std::size_t>(b->info.indices[k]);
      BOOST_REQUIRE(b->data.text[k] == records[i]);
      ++seen[i];
    }
  }
  BOOST_TEST(std::count(seen.begin(), seen.end(), 1) == static_cast<long>(records.size()));
}
