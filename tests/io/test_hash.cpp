// Tests of hone/io/hash.hpp: XXH3-128 and XXH3-64 against xxHash's published values, streaming,
// and the hexadecimal forms.
#define BOOST_TEST_MODULE hone_io
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include <hone/io/hash.hpp>

#include "io_helpers.hpp"

namespace io = hone::io;
namespace fs = std::filesystem;
using namespace io_test;

// ---- hashes
// --------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(hash_known_answers_and_streaming) {
  // xxHash's published values for the empty input (xxh128sum / xxh64sum -H3 of an empty file).
  BOOST_TEST(io::hash128({}).hex() == "99aa06d3014798d86001c324468d497f");
  BOOST_TEST(io::hex64(io::hash64({})) == "2d06800538d394c2");
  const auto data = pattern<std::uint8_t>(100000, 1);
  const auto all = std::as_bytes(std::span(data));
  io::hasher h;
  for (std::size_t i = 0; i < all.size(); i += 777)
    h.update(all.subspan(i, std::min<std::size_t>(777, all.size() - i)));
  BOOST_TEST((h.digest() == io::hash128(all)));
  const auto d = io::hash128(all);
  BOOST_TEST((io::digest128::from_hex(d.hex()).value() == d));
  BOOST_TEST(!io::digest128::from_hex(std::string(32, 'A')).has_value());
  BOOST_TEST(!io::digest128::from_hex("00").has_value());
  BOOST_TEST(io::parse_hex64(io::hex64(0x0123456789abcdefull)).value() == 0x0123456789abcdefull);
}
