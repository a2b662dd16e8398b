// Tests of hone/io/file_io.hpp: errors that name the path and the cause, the digest that
// output_file computes while writing, and the descriptor-level functions.
#include <boost/test/unit_test.hpp>

#include <fcntl.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <hone/io/error.hpp>
#include <hone/io/file_io.hpp>
#include <hone/io/hash.hpp>

#include "io_helpers.hpp"

namespace io = hone::io;
namespace fs = std::filesystem;
using namespace io_test;

// ---- file I/O
// ------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(io_errors_name_the_path_and_the_cause) {
  if (fs::exists("/dev/full")) {
    io::output_file out("/dev/full");
    const bytes block(1 << 16);
    try {
      out.write(block);
      BOOST_ERROR("writing to /dev/full did not fail");
    } catch (const hone::io_error& e) {
      const std::string msg = e.what();
      BOOST_TEST(msg.find("'/dev/full'") != std::string::npos, msg);
      BOOST_TEST(msg.find("disk full") != std::string::npos, msg);
    }
  }
  temp_dir dir;
  try {
    io::output_file out(dir / "missing-dir" / "x");
    BOOST_ERROR("creating a file in a missing directory did not fail");
  } catch (const hone::io_error& e) {
    BOOST_TEST(std::string(e.what()).find("missing-dir/x'") != std::string::npos, e.what());
  }
  io::write_file(dir / "f", "hello");
  io::rename_path(dir / "f", dir / "g");
  io::rename_path(dir / "g", dir / "f");
  BOOST_CHECK_THROW(io::rename_path(dir / "absent", dir / "h"), hone::io_error);
  BOOST_CHECK_THROW(io::output_file(dir / "f", io::create_mode::exclusive), hone::io_error);
  const io::input_file in(dir / "f");
  bytes b(10);
  expect_checkpoint_error([&] { in.read_at(0, b); }, {"is truncated"});
  BOOST_CHECK_THROW(io::read_small_file(dir / "f", 4), hone::checkpoint_error);
  BOOST_TEST(io::read_small_file(dir / "f", 5) == "hello");
  BOOST_CHECK_THROW(io::input_file(dir.path), hone::io_error);  // a directory
}

BOOST_AUTO_TEST_CASE(output_file_digest_is_the_file_hash) {
  temp_dir dir;
  // More than one hashing block (io::hash_io_bytes), written in uneven pieces.
  const auto data = pattern<std::uint8_t>(2 * io::hash_io_bytes + 12345, 7);
  const auto all = std::as_bytes(std::span(data));
  io::output_file out(dir / "a");
  for (std::size_t i = 0; i < all.size(); i += 300001) {
    out.write(all.subspan(i, std::min<std::size_t>(300001, all.size() - i)));
  }
  out.sync();
  const io::file_digest written = out.close();
  BOOST_TEST(written.size == all.size());
  BOOST_TEST((written.hash == io::hash128(all)));
  BOOST_TEST((io::hash_file(dir / "a") == written));
  BOOST_TEST(!out.is_open());
  // Without hashing the size is still counted and the hash is left zero.
  io::output_file unhashed(dir / "b", io::create_mode::truncate, io::write_hashing::off);
  unhashed.write(all);
  const io::file_digest d = unhashed.close();
  BOOST_TEST(d.size == all.size());
  BOOST_TEST((d.hash == io::digest128{}));
  BOOST_TEST((io::hash_file(dir / "b") == written));
  // mapped_file sees the same bytes; an empty file maps to an empty view.
  const io::mapped_file m(dir / "b");
  BOOST_TEST(m.size() == all.size());
  BOOST_TEST(std::equal(m.bytes().begin(), m.bytes().end(), all.begin(), all.end()));
  // read_at copies any range inside the file with pread (the same bytes) and refuses a range
  // that leaves the file, naming it.
  {
    std::vector<std::byte> part(all.size() / 3 + 1);
    const std::uint64_t at = all.size() - part.size();
    m.read_at(at, part);
    BOOST_TEST(std::equal(part.begin(), part.end(), all.begin() + static_cast<std::ptrdiff_t>(at)));
    m.read_at(all.size(), std::span<std::byte>{});  // empty range at the end: fine
    BOOST_CHECK_EXCEPTION(m.read_at(at + 1, part), hone::config_error, [&](const auto& e) {
      const std::string what = e.what();
      return what.find("outside") != std::string::npos &&
             what.find((dir / "b").string()) != std::string::npos;
    });
  }
  BOOST_TEST((io::write_file(dir / "empty", "") == io::file_digest{0, io::hash128({})}));
  BOOST_TEST(io::mapped_file(dir / "empty").bytes().empty());
}

BOOST_AUTO_TEST_CASE(background_hasher_gives_the_hash_of_the_spans_in_order) {
  // Spans queued for the hashing thread (add) and hashed at once after them (add_now) in any mix:
  // the digest is XXH3-128 of their concatenation in call order, as often as it is asked.
  const auto data = pattern<std::uint8_t>(3 * io::hash_io_bytes + 777, 11);
  const auto all = std::as_bytes(std::span(data));
  io::background_hasher h;
  std::size_t at = 0;
  std::size_t piece = 1;
  for (int k = 0; at < all.size(); ++k) {
    const auto s = all.subspan(at, std::min(piece, all.size() - at));
    if (k % 5 == 3) {
      std::vector<std::byte> copy(s.begin(), s.end());  // reused right after: hashed now
      h.add_now(copy);
      std::fill(copy.begin(), copy.end(), std::byte{0});
    } else {
      h.add(s);
    }
    at += s.size();
    piece = piece * 3 + 1;
    if (k == 6) BOOST_TEST((h.digest() == io::hash128(all.first(at))));  // and it goes on
  }
  h.add({});
  h.add_now({});
  BOOST_TEST((h.digest() == io::hash128(all)));
  BOOST_TEST((io::background_hasher().digest() == io::hash128({})));
}

BOOST_AUTO_TEST_CASE(content_errors_are_format_errors_and_checkpoint_errors) {
  static_assert(std::is_base_of_v<hone::checkpoint_error, io::format_error>,
                "io::format_error must stay a checkpoint_error: existing catch sites rely on it");
  temp_dir dir;
  io::write_file(dir / "f", "0123456789");
  BOOST_CHECK_THROW(io::read_small_file(dir / "f", 9), io::format_error);
  std::byte b[4];
  BOOST_CHECK_THROW(io::input_file(dir / "f").read_at(8, b), io::format_error);
  expect_checkpoint_error([&] { (void)io::read_small_file(dir / "f", 9); },
                          {"'" + (dir / "f").string() + "'", "10 bytes", "more than the 9"});
}

BOOST_AUTO_TEST_CASE(descriptor_functions_name_the_path) {
  temp_dir dir;
  try {
    (void)io::open_or_throw(dir / "absent", O_RDONLY, "open for the test");
    BOOST_ERROR("opening a missing file did not fail");
  } catch (const hone::io_error& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find("cannot open for the test '") != std::string::npos, msg);
    BOOST_TEST(msg.find("absent'") != std::string::npos, msg);
  }
  io::unique_fd fd = io::open_or_throw(dir / "g", O_WRONLY | O_CREAT, "create", 0644);
  BOOST_TEST(static_cast<bool>(fd));
  io::fsync_or_throw(fd.get(), dir / "g");
  BOOST_TEST(io::regular_file_size(fd.get(), dir / "g") == 0u);
  io::unique_fd moved = std::move(fd);
  BOOST_TEST(!fd);  // NOLINT(bugprone-use-after-move): a moved-from descriptor is empty
  BOOST_TEST(moved.close() == 0);
  BOOST_TEST(!moved);
  BOOST_TEST(moved.close() == 0);  // closing twice is a no-op
  io::unique_fd d = io::open_or_throw(dir.path, O_RDONLY | O_DIRECTORY, "open");
  BOOST_CHECK_THROW((void)io::regular_file_size(d.get(), dir.path), hone::io_error);
  io::sync_directory(dir.path);
  BOOST_CHECK_THROW(io::sync_directory(dir / "absent"), hone::io_error);
}

BOOST_AUTO_TEST_CASE(exchange_paths_swaps_two_directories_in_one_step) {
  temp_dir d("hone-io-exchange");
  fs::create_directories(d.path / "a");
  fs::create_directories(d.path / "b");
  (void)io::write_file(d.path / "a" / "x", std::string_view("A"), false);
  (void)io::write_file(d.path / "b" / "x", std::string_view("B"), false);
  const bool exchanged = io::exchange_paths(d.path / "a", d.path / "b");
  if (!exchanged) {
    BOOST_TEST_MESSAGE("this file system cannot exchange paths; the fallback is tested elsewhere");
    return;
  }
  BOOST_TEST(io::read_small_file(d.path / "a" / "x", 16) == "B");
  BOOST_TEST(io::read_small_file(d.path / "b" / "x", 16) == "A");
  // A missing side is an io_error naming both paths, and nothing moves.
  try {
    (void)io::exchange_paths(d.path / "a", d.path / "missing");
    BOOST_ERROR("no io_error thrown");
  } catch (const hone::io_error& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find("exchange") != std::string::npos, msg);
    BOOST_TEST(msg.find("missing") != std::string::npos, msg);
  }
  BOOST_TEST(io::read_small_file(d.path / "a" / "x", 16) == "B");
}

BOOST_AUTO_TEST_CASE(escaped_quotes_damaged_bytes_safely) {
  BOOST_TEST(io::escaped("plain text") == "plain text");
  BOOST_TEST(io::escaped(std::string_view("a\"b\\c\n\x1b\x7f\xc3\xa9\0", 11)) ==
             "a\\\"b\\\\c\\x0a\\x1b\\x7f\\xc3\\xa9\\x00");
  BOOST_TEST(io::escaped("abcdef", 3) == "abc...");
  BOOST_TEST(io::escaped("", 3).empty());
}
