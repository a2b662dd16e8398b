// Tests of hone/io/json.hpp: exact round trips of numbers and strings, and the strict parser's
// refusals (each a hone::io::format_error naming the context).
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <hone/io/error.hpp>
#include <hone/io/json.hpp>

#include "io_helpers.hpp"

namespace io = hone::io;
namespace fs = std::filesystem;
using namespace io_test;

// ---- JSON
// ----------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(json_round_trip_and_exact_numbers) {
  const std::string text =
      R"({"a":[1,-2,3.5,1e-7,18446744073709551615,-9223372036854775808],"b":{"c":null,"d":true,)"
      R"("e":"x\"\\\/\b\f\n\r\t\u0001\u00e9\ud83d\ude00"},"f":[]})";
  const auto v = io::json::parse(text);
  BOOST_TEST(v.at("a").as_array()[4].as_u64() == std::numeric_limits<std::uint64_t>::max());
  BOOST_TEST(v.at("a").as_array()[5].as_i64() == std::numeric_limits<std::int64_t>::min());
  BOOST_TEST(v.at("a").as_array()[2].as_double() == 3.5);
  BOOST_TEST(v.at("b").at("e").as_string() == "x\"\\/\b\f\n\r\t\x01\xc3\xa9\xf0\x9f\x98\x80");
  const auto again = io::json::parse(v.dump());
  BOOST_TEST((again == v));
  BOOST_TEST((io::json::parse(v.dump(2)) == v));
  // Floats and doubles are written in their shortest exact form.
  for (float f : {0.1f, 3.0517578e-05f, 65536.0f, 1.17549435e-38f, std::nextafter(1.0f, 2.0f),
                  3.4028235e38f}) {
    const auto w = io::json::parse(io::json::value(f).dump());
    BOOST_TEST(w.as_float() == f);
  }
  for (double d : {0.1, 1e300, 5e-324, -2.5})
    BOOST_TEST(io::json::parse(io::json::value(d).dump()).as_double() == d);
  BOOST_CHECK_THROW(io::json::value(std::nan("")), hone::config_error);
  BOOST_CHECK_THROW((void)io::json::value(std::string("\xff")).dump(), hone::config_error);
  // Integers must be written as integers for as_u64 (the safetensors reference rejects 8.0).
  BOOST_CHECK_THROW((void)io::json::parse("8.0").as_u64(), hone::checkpoint_error);
  BOOST_CHECK_THROW((void)io::json::parse("1e3").as_u64(), hone::checkpoint_error);
  BOOST_CHECK_THROW((void)io::json::parse("-1").as_u64(), hone::checkpoint_error);
  BOOST_CHECK_THROW((void)io::json::parse("18446744073709551616").as_u64(), hone::checkpoint_error);
  BOOST_CHECK_THROW((void)io::json::parse("1e39").as_float(), hone::checkpoint_error);
  BOOST_CHECK_THROW((void)io::json::parse("\"x\"").as_u64(), hone::checkpoint_error);
}

BOOST_AUTO_TEST_CASE(json_rejects_what_it_must) {
  const std::vector<std::string> bad = {"",
                                        " ",
                                        "{",
                                        "}",
                                        "[1,]",
                                        "{\"a\":1,}",
                                        "{\"a\" 1}",
                                        "{a:1}",
                                        "01",
                                        "1.",
                                        ".5",
                                        "-",
                                        "1e",
                                        "+1",
                                        "NaN",
                                        "Infinity",
                                        "tru",
                                        "nul",
                                        "\"abc",
                                        "\"\\x\"",
                                        "\"\\u12\"",
                                        "\"\\ud800\"",
                                        "\"\\udc00\"",
                                        "\"\\ud800\\u0041\"",
                                        "\"a\tb\"",
                                        "\"\xc0\xaf\"",
                                        "\"\xed\xa0\x80\"",
                                        "\"\xf4\x90\x80\x80\"",
                                        "\"\xe2\x82\"",
                                        "{\"a\":1,\"a\":2}",
                                        "[1] x",
                                        std::string("[1]\0", 4),
                                        "{\"a\":1}{",
                                        "// c\n1",
                                        "'a'",
                                        std::string(65, '[') + std::string(65, ']')};
  for (const auto& s : bad) {
    BOOST_TEST_INFO_SCOPE("input: " << s);
    BOOST_CHECK_THROW((void)io::json::parse(s, "t"), hone::checkpoint_error);
  }
  BOOST_CHECK_NO_THROW((void)io::json::parse(std::string(64, '[') + std::string(64, ']')));
  BOOST_CHECK_NO_THROW((void)io::json::parse(" \t\r\n{} \n"));
  expect_checkpoint_error([] { (void)io::json::parse("{\"k\":1,\"k\":2}", "f.json"); },
                          {"'f.json'", "duplicate key \"k\""});
}
