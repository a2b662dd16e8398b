// Tests of hone/io/dtype.hpp: names, sizes, the dtype of C++ types, and the float conversions
// (which must match hone::bfloat16 and hone::half bit for bit).
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <vector>

#include <hone/core/bfloat16.hpp>
#include <hone/core/half.hpp>
#include <hone/io/dtype.hpp>

#include "io_helpers.hpp"

namespace io = hone::io;
namespace fs = std::filesystem;
using namespace io_test;

// ---- dtypes
// ----------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(dtype_names_sizes_and_types) {
  for (io::dtype t : io::all_dtypes) {
    BOOST_TEST((io::dtype_from_name(io::dtype_name(t)) == t));
    BOOST_TEST((io::dtype_size(t) == 1 || io::dtype_size(t) == 2 || io::dtype_size(t) == 4 ||
                io::dtype_size(t) == 8));
  }
  BOOST_TEST(!io::dtype_from_name("f32").has_value());
  BOOST_TEST(!io::dtype_from_name("F4").has_value());
  static_assert(
      io::dtype_of<float> == io::dtype::f32 && io::dtype_of<hone::bfloat16> == io::dtype::bf16 &&
      io::dtype_of<hone::half> == io::dtype::f16 && io::dtype_of<double> == io::dtype::f64 &&
      io::dtype_of<std::int64_t> == io::dtype::i64 && io::dtype_of<long long> == io::dtype::i64 &&
      io::dtype_of<std::uint8_t> == io::dtype::u8 && io::dtype_of<bool> == io::dtype::boolean &&
      io::dtype_of<const std::int32_t> == io::dtype::i32);
}

BOOST_AUTO_TEST_CASE(float_conversions_match_hone_numeric_types) {
  std::vector<float> src = pattern<float>(4096, 2);
  for (float& f : src) {
    if (!std::isfinite(f)) f = 1.5f;
  }
  src.push_back(std::numeric_limits<float>::infinity());
  src.push_back(std::numeric_limits<float>::quiet_NaN());
  std::vector<hone::bfloat16> bf(src.size());
  io::convert(std::as_bytes(std::span(src)), io::dtype::f32, std::as_writable_bytes(std::span(bf)),
              io::dtype::bf16);
  std::vector<hone::half> hf(src.size());
  io::convert(std::as_bytes(std::span(src)), io::dtype::f32, std::as_writable_bytes(std::span(hf)),
              io::dtype::f16);
  for (std::size_t i = 0; i < src.size(); ++i) {
    BOOST_TEST(bf[i].bits() == hone::bfloat16(src[i]).bits());
    BOOST_TEST(hf[i].bits() == hone::half(src[i]).bits());
  }
  std::vector<float> back(src.size());
  io::convert(std::as_bytes(std::span(bf)), io::dtype::bf16,
              std::as_writable_bytes(std::span(back)), io::dtype::f32);
  for (std::size_t i = 0; i + 1 < src.size(); ++i) BOOST_TEST(back[i] == static_cast<float>(bf[i]));
  std::vector<double> d(src.size());
  io::convert(std::as_bytes(std::span(src)), io::dtype::f32, std::as_writable_bytes(std::span(d)),
              io::dtype::f64);
  for (std::size_t i = 0; i + 1 < src.size(); ++i) BOOST_TEST(d[i] == static_cast<double>(src[i]));
  std::vector<std::int32_t> ints(4);
  BOOST_CHECK_THROW(io::convert(std::as_bytes(std::span(ints)), io::dtype::i32,
                                std::as_writable_bytes(std::span(back).first(4)), io::dtype::f32),
                    hone::config_error);
  BOOST_CHECK_THROW(io::convert(std::as_bytes(std::span(src)), io::dtype::f32,
                                std::as_writable_bytes(std::span(bf).first(3)), io::dtype::bf16),
                    hone::config_error);
}
