// Tests of the checkpoint format layer: JSON, dtypes and conversions, safetensors writer and
// reader (the reference implementation's own byte vectors), the export dtype, arenas and
// parameters, compressed tensor files (round trips and the ratio on weight-like data), the
// MANIFEST, state.json, directory verification, file I/O errors, and the regression corpus.
#define BOOST_TEST_MODULE hone_checkpoint
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <hone/checkpoint/compress.hpp>
#include <hone/checkpoint/dtype.hpp>
#include <hone/checkpoint/file_io.hpp>
#include <hone/checkpoint/hash.hpp>
#include <hone/checkpoint/json.hpp>
#include <hone/checkpoint/manifest.hpp>
#include <hone/checkpoint/safetensors.hpp>
#include <hone/checkpoint/state.hpp>
#include <hone/checkpoint/tensor_file.hpp>
#include <hone/checkpoint/verify.hpp>
#include <hone/core/arena.hpp>
#include <hone/core/model.hpp>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"
#include "readers.hpp"

namespace ck = hone::checkpoint;
namespace fs = std::filesystem;
using bytes = std::vector<std::byte>;

namespace {

using temp_dir = hone_test::temp_dir;

bytes text_bytes(std::string_view s) {
  bytes b(s.size());
  if (!s.empty()) std::memcpy(b.data(), s.data(), s.size());
  return b;
}

/// A safetensors file from a header text and data bytes.
bytes st_file(std::string_view header, const bytes& data = {}) {
  bytes b(8);
  for (int i = 0; i < 8; ++i)
    b[static_cast<std::size_t>(i)] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xff);
  const bytes h = text_bytes(header);
  b.insert(b.end(), h.begin(), h.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

bytes float_bytes(std::initializer_list<float> v) {
  bytes b(v.size() * 4);
  std::memcpy(b.data(), std::data(v), b.size());
  return b;
}

/// Asserts that `f` throws hone::checkpoint_error whose message contains every fragment.
template <class F>
void expect_checkpoint_error(F&& f, std::initializer_list<std::string_view> fragments) {
  try {
    f();
    BOOST_ERROR("no checkpoint_error thrown");
  } catch (const hone::checkpoint_error& e) {
    const std::string msg = e.what();
    for (auto frag : fragments) {
      BOOST_TEST(msg.find(frag) != std::string::npos, "'" << msg << "' lacks '" << frag << "'");
    }
  }
}

template <class T>
std::vector<T> pattern(std::size_t n, unsigned seed) {
  std::vector<T> v(n);
  auto* p = reinterpret_cast<unsigned char*>(v.data());
  std::mt19937 rng(seed);
  for (std::size_t i = 0; i < n * sizeof(T); ++i) p[i] = static_cast<unsigned char>(rng());
  return v;
}

}  // namespace

// ---- hashes
// --------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(hash_known_answers_and_streaming) {
  // xxHash's published values for the empty input (xxh128sum / xxh64sum -H3 of an empty file).
  BOOST_TEST(ck::hash128({}).hex() == "99aa06d3014798d86001c324468d497f");
  BOOST_TEST(ck::hex64(ck::hash64({})) == "2d06800538d394c2");
  const auto data = pattern<std::uint8_t>(100000, 1);
  const auto all = std::as_bytes(std::span(data));
  ck::hasher h;
  for (std::size_t i = 0; i < all.size(); i += 777)
    h.update(all.subspan(i, std::min<std::size_t>(777, all.size() - i)));
  BOOST_TEST((h.digest() == ck::hash128(all)));
  const auto d = ck::hash128(all);
  BOOST_TEST((ck::digest128::from_hex(d.hex()).value() == d));
  BOOST_TEST(!ck::digest128::from_hex(std::string(32, 'A')).has_value());
  BOOST_TEST(!ck::digest128::from_hex("00").has_value());
  BOOST_TEST(ck::parse_hex64(ck::hex64(0x0123456789abcdefull)).value() == 0x0123456789abcdefull);
}

// ---- JSON
// ----------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(json_round_trip_and_exact_numbers) {
  const std::string text =
      R"({"a":[1,-2,3.5,1e-7,18446744073709551615,-9223372036854775808],"b":{"c":null,"d":true,)"
      R"("e":"x\"\\\/\b\f\n\r\t\u0001\u00e9\ud83d\ude00"},"f":[]})";
  const auto v = ck::json::parse(text);
  BOOST_TEST(v.at("a").as_array()[4].as_u64() == std::numeric_limits<std::uint64_t>::max());
  BOOST_TEST(v.at("a").as_array()[5].as_i64() == std::numeric_limits<std::int64_t>::min());
  BOOST_TEST(v.at("a").as_array()[2].as_double() == 3.5);
  BOOST_TEST(v.at("b").at("e").as_string() == "x\"\\/\b\f\n\r\t\x01\xc3\xa9\xf0\x9f\x98\x80");
  const auto again = ck::json::parse(v.dump());
  BOOST_TEST((again == v));
  BOOST_TEST((ck::json::parse(v.dump(2)) == v));
  // Floats and doubles are written in their shortest exact form.
  for (float f : {0.1f, 3.0517578e-05f, 65536.0f, 1.17549435e-38f, std::nextafter(1.0f, 2.0f),
                  3.4028235e38f}) {
    const auto w = ck::json::parse(ck::json::value(f).dump());
    BOOST_TEST(w.as_float() == f);
  }
  for (double d : {0.1, 1e300, 5e-324, -2.5})
    BOOST_TEST(ck::json::parse(ck::json::value(d).dump()).as_double() == d);
  BOOST_CHECK_THROW(ck::json::value(std::nan("")), hone::config_error);
  BOOST_CHECK_THROW((void)ck::json::value(std::string("\xff")).dump(), hone::config_error);
  // Integers must be written as integers for as_u64 (the safetensors reference rejects 8.0).
  BOOST_CHECK_THROW((void)ck::json::parse("8.0").as_u64(), hone::checkpoint_error);
  BOOST_CHECK_THROW((void)ck::json::parse("1e3").as_u64(), hone::checkpoint_error);
  BOOST_CHECK_THROW((void)ck::json::parse("-1").as_u64(), hone::checkpoint_error);
  BOOST_CHECK_THROW((void)ck::json::parse("18446744073709551616").as_u64(), hone::checkpoint_error);
  BOOST_CHECK_THROW((void)ck::json::parse("1e39").as_float(), hone::checkpoint_error);
  BOOST_CHECK_THROW((void)ck::json::parse("\"x\"").as_u64(), hone::checkpoint_error);
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
    BOOST_CHECK_THROW((void)ck::json::parse(s, "t"), hone::checkpoint_error);
  }
  BOOST_CHECK_NO_THROW((void)ck::json::parse(std::string(64, '[') + std::string(64, ']')));
  BOOST_CHECK_NO_THROW((void)ck::json::parse(" \t\r\n{} \n"));
  expect_checkpoint_error([] { (void)ck::json::parse("{\"k\":1,\"k\":2}", "f.json"); },
                          {"'f.json'", "duplicate key \"k\""});
}

// ---- dtypes
// ----------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(dtype_names_sizes_and_types) {
  for (ck::dtype t : ck::all_dtypes) {
    BOOST_TEST((ck::dtype_from_name(ck::dtype_name(t)) == t));
    BOOST_TEST((ck::dtype_size(t) == 1 || ck::dtype_size(t) == 2 || ck::dtype_size(t) == 4 ||
                ck::dtype_size(t) == 8));
  }
  BOOST_TEST(!ck::dtype_from_name("f32").has_value());
  BOOST_TEST(!ck::dtype_from_name("F4").has_value());
  static_assert(
      ck::dtype_of<float> == ck::dtype::f32 && ck::dtype_of<hone::bfloat16> == ck::dtype::bf16 &&
      ck::dtype_of<hone::half> == ck::dtype::f16 && ck::dtype_of<double> == ck::dtype::f64 &&
      ck::dtype_of<std::int64_t> == ck::dtype::i64 && ck::dtype_of<long long> == ck::dtype::i64 &&
      ck::dtype_of<std::uint8_t> == ck::dtype::u8 && ck::dtype_of<bool> == ck::dtype::boolean &&
      ck::dtype_of<const std::int32_t> == ck::dtype::i32);
}

BOOST_AUTO_TEST_CASE(float_conversions_match_hone_numeric_types) {
  std::vector<float> src = pattern<float>(4096, 2);
  for (float& f : src) {
    if (!std::isfinite(f)) f = 1.5f;
  }
  src.push_back(std::numeric_limits<float>::infinity());
  src.push_back(std::numeric_limits<float>::quiet_NaN());
  std::vector<hone::bfloat16> bf(src.size());
  ck::convert(std::as_bytes(std::span(src)), ck::dtype::f32, std::as_writable_bytes(std::span(bf)),
              ck::dtype::bf16);
  std::vector<hone::half> hf(src.size());
  ck::convert(std::as_bytes(std::span(src)), ck::dtype::f32, std::as_writable_bytes(std::span(hf)),
              ck::dtype::f16);
  for (std::size_t i = 0; i < src.size(); ++i) {
    BOOST_TEST(bf[i].bits() == hone::bfloat16(src[i]).bits());
    BOOST_TEST(hf[i].bits() == hone::half(src[i]).bits());
  }
  std::vector<float> back(src.size());
  ck::convert(std::as_bytes(std::span(bf)), ck::dtype::bf16,
              std::as_writable_bytes(std::span(back)), ck::dtype::f32);
  for (std::size_t i = 0; i + 1 < src.size(); ++i) BOOST_TEST(back[i] == static_cast<float>(bf[i]));
  std::vector<double> d(src.size());
  ck::convert(std::as_bytes(std::span(src)), ck::dtype::f32, std::as_writable_bytes(std::span(d)),
              ck::dtype::f64);
  for (std::size_t i = 0; i + 1 < src.size(); ++i) BOOST_TEST(d[i] == static_cast<double>(src[i]));
  std::vector<std::int32_t> ints(4);
  BOOST_CHECK_THROW(ck::convert(std::as_bytes(std::span(ints)), ck::dtype::i32,
                                std::as_writable_bytes(std::span(back).first(4)), ck::dtype::f32),
                    hone::config_error);
  BOOST_CHECK_THROW(ck::convert(std::as_bytes(std::span(src)), ck::dtype::f32,
                                std::as_writable_bytes(std::span(bf).first(3)), ck::dtype::bf16),
                    hone::config_error);
}

// ---- safetensors: the reference implementation's byte vectors ----------------------------------

BOOST_AUTO_TEST_CASE(safetensors_bytes_match_the_reference_implementation) {
  // safetensors/src/tensor.rs, test_serialization: "attn.0" F32 [1, 2, 3] = 0..5.
  const auto data = float_bytes({0, 1, 2, 3, 4, 5});
  ck::tensor_writer w;
  w.add("attn.0", ck::dtype::f32, {1, 2, 3}, data);
  const bytes expected1 =
      st_file(R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})", data);
  BOOST_TEST((expected1[0] == std::byte{64}));
  BOOST_TEST((w.to_bytes() == expected1));
  // test_empty: no tensors -> "{}" padded to 8; with metadata {"framework":"pt"} -> 40 bytes.
  BOOST_TEST((ck::tensor_writer().to_bytes() == st_file("{}      ")));
  ck::tensor_writer m;
  m.set_metadata("framework", "pt");
  BOOST_TEST((m.to_bytes() == st_file(R"({"__metadata__":{"framework":"pt"}}     )")));
  // test_serialization_forced_alignement: "attn0" F32 [1, 1, 2, 3]: 7 spaces of padding.
  ck::tensor_writer a;
  a.add("attn0", ck::dtype::f32, {1, 1, 2, 3}, data);
  const bytes expected2 =
      st_file(R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}}       )", data);
  BOOST_TEST((a.to_bytes() == expected2));
  const auto f = ck::safetensors_file::view(expected2, "aligned");
  BOOST_TEST(f.header().data_offset() % 8 == 0);
  BOOST_TEST(f.at("attn0").shape == (ck::shape_type{1, 1, 2, 3}));
}

BOOST_AUTO_TEST_CASE(safetensors_round_trip_every_dtype) {
  temp_dir dir;
  ck::tensor_writer w;
  std::vector<std::vector<std::uint8_t>> store;
  for (ck::dtype t : ck::all_dtypes) {
    const std::size_t n = 15 * ck::dtype_size(t);
    store.push_back(pattern<std::uint8_t>(n, static_cast<unsigned>(t) + 10));
    if (t == ck::dtype::boolean) {
      for (auto& b : store.back()) b &= 1;
    }
    w.add(std::string(ck::dtype_name(t)), t, {3, 5}, std::as_bytes(std::span(store.back())));
  }
  const std::vector<float> scalar{7.0f};
  w.add("scalar", {}, scalar);
  const std::vector<double> none;
  w.add("empty", {4, 0, 2}, none);
  w.set_metadata("k", "v");
  w.set_metadata("unicode", "\xc3\xa9\xe2\x82\xac");
  const auto d = w.write(dir / "all.safetensors");
  BOOST_TEST(d.size == fs::file_size(dir / "all.safetensors"));
  BOOST_TEST(d.size == w.file_size());
  BOOST_TEST((d == ck::hash_file(dir / "all.safetensors")));  // hashed as written
  {
    // A tensor larger than one write block (detail::hash_io_bytes): hashed block by block.
    ck::tensor_writer plain;
    const std::vector<float> big = pattern<float>(300000, 3);
    static_assert(300000 * sizeof(float) > 2 * ck::detail::hash_io_bytes);
    plain.add("big", {300000}, big);
    const auto dp = plain.write(dir / "plain.safetensors");
    BOOST_TEST((dp == ck::hash_file(dir / "plain.safetensors")));
    const bytes mem = plain.to_bytes();
    BOOST_TEST((dp == ck::file_digest{mem.size(), ck::hash128(mem)}));
  }
  {
    // With a dtype conversion the file is hashed inline, as written through the staging buffer.
    ck::tensor_writer conv;
    const std::vector<float> big = pattern<float>(300000, 4);  // more than one staging buffer
    conv.add("big", {300000}, big, ck::dtype::bf16);
    conv.add("scalar", {}, scalar);
    const auto dc = conv.write(dir / "conv.safetensors");
    BOOST_TEST((dc == ck::hash_file(dir / "conv.safetensors")));
    const bytes mem = conv.to_bytes();
    BOOST_TEST((dc == ck::file_digest{mem.size(), ck::hash128(mem)}));
  }
  for (const bool mapped : {true, false}) {
    const bytes mem = w.to_bytes();
    const auto f = mapped ? ck::safetensors_file::open(dir / "all.safetensors")
                          : ck::safetensors_file::view(mem, "mem");
    BOOST_TEST(f.tensors().size() == ck::all_dtypes.size() + 2);
    BOOST_TEST(f.metadata().at("unicode") == "\xc3\xa9\xe2\x82\xac");
    for (std::size_t i = 0; i < ck::all_dtypes.size(); ++i) {
      const ck::dtype t = ck::all_dtypes[i];
      const ck::tensor_info& info = f.at(ck::dtype_name(t));
      BOOST_TEST((info.type == t));
      BOOST_TEST(info.shape == (ck::shape_type{3, 5}));
      BOOST_TEST(info.begin % ck::dtype_size(t) == 0);  // aligned: largest element size first
      const auto got = f.data(info);
      BOOST_TEST(std::equal(got.begin(), got.end(), std::as_bytes(std::span(store[i])).begin(),
                            std::as_bytes(std::span(store[i])).end()));
    }
    BOOST_TEST(f.at("scalar").shape.empty());
    BOOST_TEST(f.at("scalar").elements() == 1u);
    BOOST_TEST(f.at("empty").size_bytes() == 0u);
    BOOST_TEST(f.find("nope") == nullptr);
    expect_checkpoint_error([&] { (void)f.at("nope"); }, {"no tensor 'nope'"});
  }
  // Only the header, by two reads.
  const auto h = ck::read_safetensors_header(dir / "all.safetensors");
  BOOST_TEST(h.tensors.size() == ck::all_dtypes.size() + 2);
  BOOST_TEST(h.data_offset() + h.data_bytes() == d.size);
}

BOOST_AUTO_TEST_CASE(safetensors_reader_messages_name_file_tensor_and_field) {
  const auto data8 = bytes(8, std::byte{0});
  expect_checkpoint_error(
      [&] {
        (void)ck::safetensors_file::view(
            st_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8),
            "m.safetensors");
      },
      {"'m.safetensors'", "tensor 'w'", "shape [3] of F32 needs 12 bytes", "span 8"});
  expect_checkpoint_error(
      [&] {
        (void)ck::safetensors_file::view(
            st_file(
                R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                bytes(6)),
            "m");
      },
      {"tensor 'b'", "overlaps tensor 'a'"});
  expect_checkpoint_error(
      [&] {
        (void)ck::safetensors_file::view(
            st_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", bytes(3)), "m");
      },
      {"1 bytes follow the last tensor"});
  expect_checkpoint_error(
      [&] {
        (void)ck::safetensors_file::view(
            st_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", bytes(2)), "m");
      },
      {"truncated"});
  expect_checkpoint_error(
      [&] {
        (void)ck::safetensors_file::view(
            st_file(R"({"a":{"dtype":"Q8","shape":[4],"data_offsets":[0,4]}})", bytes(4)), "m");
      },
      {"unknown dtype 'Q8'"});
  expect_checkpoint_error(
      [&] {
        (void)ck::safetensors_file::view(
            st_file(R"({"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", bytes(2)), "m");
      },
      {"sub-byte dtype F4"});
  bytes huge = st_file("{}");
  huge[7] = std::byte{0x7f};
  expect_checkpoint_error([&] { (void)ck::safetensors_file::view(huge, "m"); },
                          {"exceeds the 100000000-byte limit"});
  expect_checkpoint_error([&] { (void)ck::safetensors_file::view(bytes(5), "m"); },
                          {"shorter than the 8-byte header length"});
  // Unknown fields inside a tensor entry are ignored, as the reference does.
  BOOST_CHECK_NO_THROW((void)ck::safetensors_file::view(
      st_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":[1]}})", bytes(2)), "m"));
}

BOOST_AUTO_TEST_CASE(writer_rejects_bad_tensors) {
  ck::tensor_writer w;
  std::vector<float> v(6);
  BOOST_CHECK_THROW(w.add("", {6}, v), hone::config_error);
  BOOST_CHECK_THROW(w.add("__metadata__", {6}, v), hone::config_error);
  BOOST_CHECK_THROW(w.add("bad\xff", {6}, v), hone::config_error);
  BOOST_CHECK_THROW(w.add("w", {5}, v), hone::config_error);
  BOOST_CHECK_THROW(w.add("w", {std::uint64_t{1} << 62, 8}, v), hone::config_error);
  std::vector<std::int32_t> ints(6);
  BOOST_CHECK_THROW(w.add("i", {6}, ints, ck::dtype::f32), hone::config_error);
  w.add("w", {2, 3}, v);
  BOOST_CHECK_THROW(w.add("w", {6}, v), hone::config_error);
  BOOST_CHECK_THROW(w.set_metadata("k", "\xff"), hone::config_error);
}

// ---- export dtype, arenas and parameters
// ---------------------------------------------------------

BOOST_AUTO_TEST_CASE(export_fp32_master_weights_as_bf16_and_load_back) {
  temp_dir dir;
  hone::arena_layout layout(sizeof(float));
  layout.add("fc1.weight", 6);
  layout.add("fc1.bias", 3);
  layout.add("fc2.weight", 1001);
  hone::arena<float> master(layout);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (float& x : master.all()) x = normal(rng);
  const ck::shape_map shapes{{"fc1.weight", {3, 2}}, {"fc2.weight", {7, 143}}};

  ck::tensor_writer w;
  w.add_arena(master, ck::dtype::bf16, "model.", shapes);
  const auto d = ck::write_tensors(w, dir / "model.safetensors");
  BOOST_TEST(d.size == w.file_size());

  const auto f = ck::tensor_file::open(dir / "model.safetensors");
  BOOST_TEST((f.format() == ck::tensor_format::safetensors));
  const ck::tensor_info& t = f.at("model.fc1.weight");
  BOOST_TEST((t.type == ck::dtype::bf16));
  BOOST_TEST(t.shape == (ck::shape_type{3, 2}));
  BOOST_TEST(f.at("model.fc1.bias").shape == (ck::shape_type{3}));
  // Stored bits are hone::bfloat16's round-to-nearest-even of each master weight.
  const auto stored = f.plain()->data(f.at("model.fc2.weight"));
  const auto src = master.view("fc2.weight");
  for (std::size_t i = 0; i < src.size(); ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, stored.data() + 2 * i, 2);
    BOOST_TEST(bits == hone::bfloat16(src[i]).bits());
  }
  // Loading converts back to F32 (exactly the bf16 values).
  hone::arena<float> loaded(layout);
  BOOST_TEST(ck::load_arena(f, loaded, "model.") == 3u);
  for (std::size_t s = 0; s < layout.size(); ++s) {
    const auto a = master.view(s);
    const auto b = loaded.view(s);
    for (std::size_t i = 0; i < a.size(); ++i)
      BOOST_TEST(b[i] == static_cast<float>(hone::bfloat16(a[i])));
  }
  // The export halves the data.
  ck::tensor_writer full;
  full.add_arena(master);
  BOOST_TEST(full.layout().back().end == 2 * w.layout().back().end);
  // Missing tensors and wrong sizes are named.
  hone::arena_layout other(sizeof(float));
  other.add("fc1.weight", 5);
  hone::arena<float> wrong(other);
  expect_checkpoint_error([&] { (void)ck::load_arena(f, wrong, "model."); },
                          {"tensor 'model.fc1.weight' has 6 elements", "destination 5"});
  expect_checkpoint_error([&] { (void)ck::load_arena(f, wrong, "x."); },
                          {"has no tensor 'x.fc1.weight'"});
  const auto i64 = std::vector<std::int64_t>{1, 2, 3};
  ck::tensor_writer iw;
  iw.add("step", {3}, i64);
  const bytes ib = iw.to_bytes();
  const auto itf = ck::tensor_file::view(ib, "ints");
  std::vector<float> out(3);
  expect_checkpoint_error([&] { itf.read_into("step", std::span<float>(out)); },
                          {"I64, which cannot be read as F32"});
  BOOST_TEST((itf.read_as<std::int64_t>("step") == i64));
}

BOOST_AUTO_TEST_CASE(model_parameters_save_and_load) {
  std::vector<float> w1(12), g1(12), b1(4), g2(4);
  std::iota(w1.begin(), w1.end(), 1.0f);
  std::iota(b1.begin(), b1.end(), -2.0f);
  std::vector<hone::parameter<float>> params{{"w", {3, 4}, w1, g1}, {"b", {4}, b1, g2}};
  ck::tensor_writer w;
  w.add_parameters(params, std::nullopt, "net.");
  const bytes file = w.to_bytes();
  const auto f = ck::tensor_file::view(file, "params");
  std::vector<float> w2(12), b2(4), gg(12), gb(4);
  std::vector<hone::parameter<float>> into{{"w", {3, 4}, w2, gg}, {"b", {4}, b2, gb}};
  BOOST_TEST(ck::load_parameters(f, into, "net.") == 2u);
  BOOST_TEST(w2 == w1);
  BOOST_TEST(b2 == b1);
  std::vector<hone::parameter<float>> wrong{{"w", {4, 3}, w2, gg}};
  expect_checkpoint_error([&] { (void)ck::load_parameters(f, wrong, "net."); },
                          {"shape [3, 4]", "parameter has [4, 3]"});
}

// ---- compressed tensor files
// ---------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(shuffle_is_a_byte_plane_transpose) {
  const auto in = pattern<std::uint8_t>(4 * 10, 4);
  bytes shuffled(in.size()), back(in.size());
  ck::shuffle_bytes(std::as_bytes(std::span(in)), 4, shuffled);
  for (std::size_t i = 0; i < 10; ++i) {
    for (std::size_t j = 0; j < 4; ++j)
      BOOST_TEST((shuffled[j * 10 + i] == static_cast<std::byte>(in[i * 4 + j])));
  }
  ck::unshuffle_bytes(shuffled, 4, back);
  BOOST_TEST(std::equal(back.begin(), back.end(), std::as_bytes(std::span(in)).begin()));
  BOOST_CHECK_THROW(
      ck::shuffle_bytes(std::as_bytes(std::span(in)).first(7), 4, std::span(shuffled).first(7)),
      hone::config_error);
  // The input and output must not overlap (the vector loops assume it).
  BOOST_CHECK_THROW(ck::shuffle_bytes(std::span<const std::byte>(shuffled).first(8), 4,
                                      std::span(shuffled).subspan(4, 8)),
                    hone::config_error);
}

BOOST_AUTO_TEST_CASE(shuffle_every_element_size_and_length) {
  // Each element size has its own loop (1, 2, 4, 8 fixed, others generic), vectorized with a
  // scalar remainder: lengths around vector widths, against the definition.
  std::mt19937 rng(3);
  for (const std::size_t item : {1, 2, 3, 4, 8}) {
    for (const std::size_t n : {1, 2, 3, 15, 16, 17, 31, 33, 64, 1000}) {
      bytes in(n * item), shuffled(n * item), back(n * item);
      for (auto& b : in) b = static_cast<std::byte>(rng());
      ck::shuffle_bytes(in, item, shuffled);
      bool same = true;
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = 0; j < item; ++j)
          same = same && shuffled[j * n + i] == in[i * item + j];
      }
      BOOST_TEST(same, "item " << item << ", " << n << " elements");
      ck::unshuffle_bytes(shuffled, item, back);
      BOOST_TEST((back == in), "item " << item << ", " << n << " elements");
    }
  }
}

BOOST_AUTO_TEST_CASE(compressed_round_trip_every_dtype_and_back_to_safetensors) {
  temp_dir dir;
  ck::tensor_writer w;
  std::vector<std::vector<std::uint8_t>> store;
  for (ck::dtype t : ck::all_dtypes) {
    const std::size_t n = 1000 * ck::dtype_size(t);
    auto v = pattern<std::uint8_t>(n, static_cast<unsigned>(t));
    for (std::size_t i = 0; i < n; ++i) {
      if ((i / 64) % 2 == 0) v[i] = static_cast<std::uint8_t>(i % 3);  // half compressible
    }
    if (t == ck::dtype::boolean) {
      for (auto& b : v) b &= 1;
    }
    store.push_back(std::move(v));
    w.add(std::string(ck::dtype_name(t)), t, {10, 100}, std::as_bytes(std::span(store.back())));
  }
  const std::vector<float> f32 = pattern<float>(3000, 99);
  w.add("exported", {3000}, std::span(f32), ck::dtype::bf16);  // conversion inside the pipeline
  const std::vector<float> none;
  w.add("empty", {0}, none);
  w.set_metadata("framework", "hone");
  const bytes plain = w.to_bytes();
  const std::optional<ck::chunk_transform> transforms[] = {
      std::nullopt, ck::chunk_transform::shuffle, ck::chunk_transform::split,
      ck::chunk_transform::split_delta};
  for (const auto transform : transforms)
    for (const std::size_t chunk : {std::size_t{64}, std::size_t{1000}, std::size_t{1} << 20}) {
      const ck::compression_options opt{.level = 1, .chunk_bytes = chunk, .transform = transform};
      const bytes packed = ck::compressed_bytes(w, opt);
      const auto c = ck::compressed_file::view(packed, "mem.hct");
      BOOST_TEST(c.version() == 2u);
      for (const auto& t : c.tensors()) {
        // A forced transform applies to F32 and BF16; everything else is shuffled.
        const bool splits = t.type == ck::dtype::f32 || t.type == ck::dtype::bf16;
        if (transform && splits) BOOST_TEST((c.transform(t) == *transform), t.name);
        if (!splits) BOOST_TEST((c.transform(t) == ck::chunk_transform::shuffle), t.name);
      }
      BOOST_TEST(c.metadata().at("framework") == "hone");
      BOOST_TEST(c.tensors().size() == w.size());
      c.verify();
      // Tensor by tensor, and as a whole plain file (byte-identical to the plain writer).
      const auto p = ck::safetensors_file::view(plain, "plain");
      for (const auto& t : p.tensors()) {
        bytes got(static_cast<std::size_t>(t.size_bytes()));
        c.read(c.at(t.name), got);
        const auto want = p.data(t);
        BOOST_TEST(std::equal(got.begin(), got.end(), want.begin(), want.end()), t.name);
        BOOST_TEST((c.at(t.name) == t));
      }
      struct sink {
        bytes b;
        void write(std::span<const std::byte> s) { b.insert(b.end(), s.begin(), s.end()); }
      } s;
      ck::decompress_to(c, s);
      BOOST_TEST((s.b == plain));
      // Some chunks were stored raw (the random halves at small chunk sizes), others compressed.
      std::size_t raw = 0, packed_chunks = 0;
      for (const auto& t : c.tensors()) {
        for (const auto& ch : c.chunks(t))
          (ch.stored_bytes == ch.raw_bytes ? raw : packed_chunks)++;
      }
      BOOST_TEST(packed_chunks > 0u);
      if (chunk == 64) BOOST_TEST(raw > 0u);
    }
  // Through files, with the converters of the hone-ckpt tool.
  const auto dp = w.write(dir / "a.safetensors");
  const auto dc = ck::compress_safetensors(dir / "a.safetensors", dir / "a.hct", {.level = 3});
  const auto dd = ck::decompress_to_safetensors(dir / "a.hct", dir / "b.safetensors");
  BOOST_TEST((dd == dp));  // byte-identical round trip
  BOOST_TEST(dc.size < dp.size);
  const auto tf = ck::tensor_file::open(dir / "a.hct");
  BOOST_TEST((tf.format() == ck::tensor_format::compressed));
  tf.verify();
  // BF16 stored, read as F32 through the compressed path.
  const auto as_f32 = tf.read_as<float>("exported");
  for (std::size_t i = 0; i < f32.size(); ++i) {
    if (!std::isnan(f32[i])) BOOST_TEST(as_f32[i] == static_cast<float>(hone::bfloat16(f32[i])));
  }
  // write_tensors chooses the format.
  const auto dw = ck::write_tensors(w, dir / "c.hct", {.compression = ck::compression_options{}});
  BOOST_TEST((ck::tensor_file::open(dir / "c.hct").format() == ck::tensor_format::compressed));
  BOOST_TEST(dw.size == fs::file_size(dir / "c.hct"));
  BOOST_CHECK_THROW((void)ck::compressed_bytes(w, {.level = 1000}), hone::config_error);
  BOOST_CHECK_THROW((void)ck::compressed_bytes(w, {.level = 1, .chunk_bytes = 0}),
                    hone::config_error);
}

namespace {
/// The float split of one element, computed from the IEEE fields (an independent reference for
/// transform_bytes): exponent (or its delta), sign | top 7 mantissa bits, then the mantissa's
/// remaining bytes, high first.
std::vector<std::uint8_t> reference_split(std::span<const std::uint32_t> bits, bool f32,
                                          bool delta) {
  const std::size_t n = bits.size(), item = f32 ? 4 : 2;
  std::vector<std::uint8_t> out(n * item);
  unsigned prev = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t x = bits[i];
    const unsigned sign = f32 ? x >> 31 : (x >> 15) & 1;
    const unsigned exponent = f32 ? (x >> 23) & 0xff : (x >> 7) & 0xff;
    const std::uint32_t mantissa = f32 ? x & 0x7fffff : x & 0x7f;
    out[i] = static_cast<std::uint8_t>(delta ? (exponent + 256 - prev) % 256 : exponent);
    prev = exponent;
    out[n + i] = static_cast<std::uint8_t>(sign * 128 + (f32 ? mantissa >> 16 : mantissa));
    if (f32) {
      out[2 * n + i] = static_cast<std::uint8_t>((mantissa >> 8) % 256);
      out[3 * n + i] = static_cast<std::uint8_t>(mantissa % 256);
    }
  }
  return out;
}

/// Both split transforms of the elements `bits` (F32, or BF16 in the low halves) against
/// reference_split, and their inverses back to the input.
void check_splits(std::span<const std::uint32_t> bits, bool f32) {
  const std::size_t item = f32 ? 4 : 2;
  bytes in(bits.size() * item);
  for (std::size_t i = 0; i < bits.size(); ++i) {
    for (std::size_t k = 0; k < item; ++k) {
      in[i * item + k] = static_cast<std::byte>((bits[i] >> (8 * k)) & 0xff);
    }
  }
  for (const auto t : {ck::chunk_transform::split, ck::chunk_transform::split_delta}) {
    bytes moved(in.size()), back(in.size());
    ck::transform_bytes(t, in, item, moved);
    const auto want = reference_split(bits, f32, t == ck::chunk_transform::split_delta);
    BOOST_TEST(std::equal(moved.begin(), moved.end(), std::as_bytes(std::span(want)).begin()),
               ck::encoding_name(t) << (f32 ? " F32, " : " BF16, ") << bits.size() << " elements");
    ck::untransform_bytes(t, moved, item, back);
    BOOST_TEST((back == in), ck::encoding_name(t)
                                 << (f32 ? " F32, " : " BF16, ") << bits.size() << " elements");
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(float_split_matches_the_ieee_fields_and_inverts) {
  std::mt19937 rng(7);
  std::vector<std::uint32_t> f32_bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                         0x7fc00001u, 0x00000001u, 0x807fffffu, 0x3f800000u,
                                         0xbf7fffffu, 0x7f7fffffu};
  for (int i = 0; i < 5000; ++i) f32_bits.push_back(rng());
  for (int i = 0; i < 2000; ++i) {  // runs of similar magnitudes, as in Adam moments
    f32_bits.push_back(std::bit_cast<std::uint32_t>(
        std::ldexp(1.0f + 0.001f * static_cast<float>(i % 13), -(i / 40) % 30)));
  }
  for (const bool f32 : {true, false}) {
    std::vector<std::uint32_t> bits = f32_bits;
    if (!f32) {
      for (auto& b : bits) b &= 0xffff;  // every BF16 pattern kind: low halves of the above
      for (std::uint32_t b = 0; b < 65536; b += 7) bits.push_back(b);
    }
    check_splits(bits, f32);
  }
  // Short inputs (element 0 is peeled for the delta; the rest is one vector loop and its tail).
  for (const std::size_t n : {1, 2, 3, 17, 33}) {
    for (const bool f32 : {true, false}) {
      std::vector<std::uint32_t> bits(n);
      for (auto& b : bits) b = f32 ? rng() : rng() & 0xffff;
      check_splits(bits, f32);
    }
  }
  bytes three(12), out(12);
  BOOST_CHECK_THROW(ck::transform_bytes(ck::chunk_transform::split, three, 3, out),
                    hone::config_error);
  BOOST_CHECK_THROW(ck::transform_bytes(ck::chunk_transform::split_delta,
                                        std::span<const std::byte>(out).first(8), 4,
                                        std::span(out).subspan(4, 8)),
                    hone::config_error);  // overlapping input and output
  BOOST_CHECK_THROW(
      ck::untransform_bytes(ck::chunk_transform::split_delta, three, 8, std::span(out).first(8)),
      hone::config_error);
  BOOST_TEST((ck::transform_of_encoding("split-delta-zstd") == ck::chunk_transform::split_delta));
  BOOST_TEST(!ck::transform_of_encoding("lz4").has_value());
}

BOOST_AUTO_TEST_CASE(automatic_transform_is_the_smallest_on_the_sample) {
  // Floats whose exponent takes a random walk (+-1 or 0 per element; mantissas random), as the
  // slowly varying magnitudes of Adam moments, and weight-like bf16: with a sample covering the
  // whole single-chunk tensor, the automatic choice must produce exactly the smallest of the
  // forced transforms' files.
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(16384);
  int exponent = 100;
  for (auto& x : v) {
    exponent = std::clamp(exponent + static_cast<int>(rng() % 3) - 1, 60, 140);
    x = std::bit_cast<float>((static_cast<std::uint32_t>(exponent) << 23) |
                             (static_cast<std::uint32_t>(rng()) & 0x7fffffu));
  }
  std::vector<hone::bfloat16> w;
  for (int i = 0; i < 32768; ++i) w.emplace_back(0.02f * normal(rng));
  for (const bool adam : {true, false}) {
    ck::tensor_writer tw;
    if (adam) {
      tw.add("v", {v.size()}, v);
    } else {
      tw.add("w", {w.size()}, w);
    }
    const ck::compression_options base{.level = 1, .chunk_bytes = 1 << 20, .sample_bytes = 1 << 20};
    std::size_t best = std::numeric_limits<std::size_t>::max();
    ck::chunk_transform best_t = ck::chunk_transform::shuffle;
    for (const auto t : {ck::chunk_transform::shuffle, ck::chunk_transform::split,
                         ck::chunk_transform::split_delta}) {
      auto o = base;
      o.transform = t;
      const std::size_t size = ck::compressed_bytes(tw, o).size();
      if (size < best) {
        best = size;
        best_t = t;
      }
    }
    const bytes packed = ck::compressed_bytes(tw, base);
    const auto c = ck::compressed_file::view(packed, "auto.hct");
    BOOST_TEST((c.transform(c.tensors()[0]) == best_t));
    BOOST_TEST(packed.size() == best);
    c.verify();
    if (adam) {  // exponent deltas take 3 values: the delta split wins
      BOOST_TEST((best_t == ck::chunk_transform::split_delta));
    }
  }
  BOOST_CHECK_THROW((void)ck::compressed_bytes(ck::tensor_writer{}, {.sample_bytes = 0}),
                    hone::config_error);
}

BOOST_AUTO_TEST_CASE(version_1_files_read_and_split_encodings_need_version_2) {
  // A version 1 file is a version 2 file with only "shuffle-zstd" tensors and version 1 in its
  // prelude (the committed seed seeds/valid-v1.hct was written by the version 1 writer).
  const std::vector<float> v = pattern<float>(3000, 5);
  ck::tensor_writer w;
  w.add("v", {3000}, v);
  bytes f =
      ck::compressed_bytes(w, {.chunk_bytes = 4096, .transform = ck::chunk_transform::shuffle});
  f[8] = std::byte{1};
  const auto c = ck::compressed_file::view(f, "v1.hct");
  BOOST_TEST(c.version() == 1u);
  std::vector<float> got(3000);
  c.read(c.at("v"), std::as_writable_bytes(std::span(got)));
  BOOST_TEST(std::memcmp(got.data(), v.data(), got.size() * sizeof(float)) == 0);
  bytes g = ck::compressed_bytes(w, {.transform = ck::chunk_transform::split});
  g[8] = std::byte{1};
  expect_checkpoint_error([&] { (void)ck::compressed_file::view(g, "v1.hct"); },
                          {"'v1.hct'", "tensor 'v'", "\"shuffle-zstd\" in a version 1 file"});
  g[8] = std::byte{3};
  expect_checkpoint_error([&] { (void)ck::compressed_file::view(g, "v3.hct"); },
                          {"'v3.hct'", "format version 3", "reads versions 1 to 2"});
  // A committed file from the version 1 writer still reads (and its bytes are as written).
  const auto old = hone_test::read_bytes(fs::path(HONE_CHECKPOINT_SEEDS_DIR) / "valid-v1.hct");
  const auto o = ck::compressed_file::view(old, "valid-v1.hct");
  BOOST_TEST(o.version() == 1u);
  o.verify();
  const auto big = ck::tensor_file::view(old, "valid-v1.hct").read_as<float>("big");
  BOOST_REQUIRE(big.size() == 600u);
  for (std::size_t i = 0; i < big.size(); ++i) {
    BOOST_TEST(big[i] == static_cast<float>(i % 7) * 0.25f);
  }
}

BOOST_AUTO_TEST_CASE(compressed_damage_is_found_and_named) {
  std::vector<float> v(5000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 17);
  ck::tensor_writer w;
  w.add("weights", {5000}, v);
  bytes packed = ck::compressed_bytes(w, {.level = 1, .chunk_bytes = 4096});
  packed[100] ^= std::byte{0x10};
  const auto c = ck::compressed_file::view(packed, "model.hct");  // index still intact
  expect_checkpoint_error([&] { c.verify(); },
                          {"'model.hct'", "tensor 'weights' chunk 1: checksum mismatch"});
  bytes truncated = ck::compressed_bytes(w, {});
  truncated.resize(truncated.size() - 5);
  expect_checkpoint_error([&] { (void)ck::compressed_file::view(truncated, "t.hct"); },
                          {"'t.hct'", "end magic"});
}

BOOST_AUTO_TEST_CASE(compression_ratio_on_weight_like_data) {
  // bf16 weights ~ N(0, 0.02) (an initialized or lightly trained layer), and fp32 Adam second
  // moments: v = mean of squared gradients, gradient scales log-normal across parameters.
  const std::size_t n = std::size_t{1} << 21;  // 2 Mi elements: 4 MiB bf16, 8 MiB fp32
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<hone::bfloat16> weights(n);
  for (auto& x : weights) x = hone::bfloat16(0.02f * normal(rng));
  std::vector<float> adam_v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float scale = 1e-3f * std::exp(normal(rng));  // per-parameter gradient scale
    float acc = 0.0f;
    for (int k = 0; k < 4; ++k) {
      const float g = scale * normal(rng);
      acc += g * g;
    }
    adam_v[i] = acc / 4.0f;
  }
  const auto report = [](const char* what, const ck::tensor_writer& w, std::size_t raw_bytes) {
    for (const int level : {1, 3}) {
      const auto t0 = std::chrono::steady_clock::now();
      const bytes packed = ck::compressed_bytes(w, {.level = level});
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // zstd on the unshuffled bytes, for comparison.
      const auto plain = w.to_bytes();
      std::vector<char> out(ZSTD_compressBound(plain.size()));
      const std::size_t z =
          ZSTD_compress(out.data(), out.size(), plain.data(), plain.size(), level);
      std::printf(
          "[checkpoint] %-28s zstd-%d: shuffled %.3fx (%.0f MB/s, all threads), unshuffled %.3fx\n",
          what, level, static_cast<double>(raw_bytes) / static_cast<double>(packed.size()),
          static_cast<double>(raw_bytes) / s / 1e6,
          static_cast<double>(plain.size()) / static_cast<double>(z));
      if (level == 1) {
        const auto c = ck::compressed_file::view(packed, "ratio");
        bytes back(raw_bytes);
        c.read(c.tensors()[0], back);
        const auto want = ck::safetensors_file::view(plain, "p").data(c.tensors()[0]);
        BOOST_TEST(std::equal(back.begin(), back.end(), want.begin(), want.end()));
        BOOST_TEST(packed.size() < raw_bytes);
      }
    }
  };
  ck::tensor_writer wb;
  wb.add("w", {n}, weights);
  report("bf16 weights N(0,0.02)", wb, n * 2);
  ck::tensor_writer wv;
  wv.add("v", {n}, adam_v);
  report("fp32 Adam v (log-normal)", wv, n * 4);
}

// ---- MANIFEST
// ------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(manifest_round_trip_and_strictness) {
  ck::manifest m;
  m.add("state.json", {12, ck::hash128(text_bytes("x"))});
  m.add("model.safetensors", {123456789012ull, ck::hash128(text_bytes("y"))});
  m.add("optimizer.hct", {0, ck::hash128({})});
  BOOST_TEST(m.entries()[0].name == "model.safetensors");  // sorted
  const std::string text = m.to_string();
  BOOST_TEST(text.rfind("hone-manifest 1 xxh3-128\n", 0) == 0u);
  BOOST_TEST(text.find(ck::hash128(text_bytes("y")).hex() + " 123456789012 model.safetensors\n") !=
             std::string::npos);
  const auto back = ck::manifest::parse(text, "MANIFEST");
  BOOST_TEST((back == m));
  BOOST_TEST(back.find("state.json")->size == 12u);
  BOOST_TEST(back.find("nope") == nullptr);
  for (const char* name : {"", ".hidden", "a/b", "..", "MANIFEST", "sp ace", "\xc3\xa9"}) {
    BOOST_CHECK_THROW(m.add(name, {}), hone::config_error);
  }
  std::string edited = text;
  edited[edited.find(" 12 ") + 2] = '3';
  expect_checkpoint_error([&] { (void)ck::manifest::parse(edited, "dir/MANIFEST"); },
                          {"'dir/MANIFEST'", "own checksum"});
  expect_checkpoint_error(
      [&] { (void)ck::manifest::parse(text.substr(0, text.find("end ")), "M"); },
      {"ends before its \"end\" line"});
}

BOOST_AUTO_TEST_CASE(verify_directory_finds_damage) {
  temp_dir dir;
  std::vector<float> w(1000);
  std::iota(w.begin(), w.end(), 0.0f);
  ck::tensor_writer mw;
  mw.add("w", {1000}, w);
  ck::manifest m;
  m.add(std::string(ck::files::weights), ck::write_tensors(mw, dir.path / ck::files::weights));
  m.add(std::string(ck::files::optimizer_compressed),
        ck::write_tensors(mw, dir.path / ck::files::optimizer_compressed,
                          {.compression = ck::compression_options{}}));
  ck::training_state s;
  s.step = 10;
  m.add(std::string(ck::files::state), ck::write_state(dir.path / ck::files::state, s));
  (void)m.write(dir.path / ck::files::manifest);
  ck::sync_directory(dir.path);

  auto r = ck::verify_directory(dir.path);
  BOOST_TEST(r.ok());
  BOOST_TEST(r.files_checked == 3u);
  BOOST_TEST(r.bytes_hashed == fs::file_size(dir.path / ck::files::weights) +
                                   fs::file_size(dir.path / ck::files::optimizer_compressed) +
                                   fs::file_size(dir.path / ck::files::state));
  BOOST_TEST((ck::verify_file(dir.path / ck::files::optimizer_compressed) ==
              ck::file_kind::compressed_tensors));
  BOOST_TEST((ck::verify_file(dir.path / ck::files::manifest) == ck::file_kind::manifest));

  // Flip one byte of the weights: same size, different hash.
  {
    std::fstream f(dir.path / ck::files::weights, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x42');
  }
  r = ck::verify_directory(dir.path);
  BOOST_TEST(r.problems.size() == 1u);
  BOOST_TEST(r.problems[0].find("model.safetensors' has XXH3-128") != std::string::npos,
             r.problems[0]);
  expect_checkpoint_error([&] { r.require_ok(dir.path.string()); },
                          {"is damaged or incomplete", "model.safetensors"});
  // Truncate the state: the size check reports it before hashing.
  fs::resize_file(dir.path / ck::files::state, 5);
  r = ck::verify_directory(dir.path);
  BOOST_TEST(r.problems.size() == 2u);
  BOOST_TEST(r.problems[1].find("(truncated)") != std::string::npos, r.problems[1]);
  fs::remove(dir.path / ck::files::optimizer_compressed);
  r = ck::verify_directory(dir.path);
  BOOST_TEST(r.problems.size() == 3u);
  fs::remove(dir.path / ck::files::manifest);
  r = ck::verify_directory(dir.path);
  BOOST_TEST(r.problems.size() == 1u);
  BOOST_TEST(r.problems[0].find("incomplete") != std::string::npos);
}

// ---- state.json
// ----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(state_round_trip_is_exact) {
  temp_dir dir;
  std::mt19937 a(123);
  std::mt19937_64 b(456);
  for (int i = 0; i < 1000; ++i) {
    (void)a();
    (void)b();
  }
  ck::training_state s;
  s.step = 18446744073709551615ull;
  s.loss_scale = hone::loss_scale_state{3.0517578e-05f, 1999, 2, 77};
  s.schedule.set("step", 1200);
  s.schedule.set("warmup_done", true);
  s.data.set("epoch", 3);
  s.data.set("order_seed", 42);
  s.data.set("position", 12345678901234ull);
  s.rng["dropout"] = ck::rng_state(a);
  s.rng["shuffle"] = ck::rng_state(b);
  s.metadata["run"] = "exp-7";
  s.metadata["note"] = "quote \" and newline \n and \xc3\xa9";
  ck::write_state(dir / "state.json", s);
  const auto back = ck::read_state(dir / "state.json");
  BOOST_TEST((back == s));
  BOOST_TEST(back.loss_scale->scale == 3.0517578e-05f);
  std::mt19937 a2;
  std::mt19937_64 b2;
  ck::restore_rng(a2, back.rng.at("dropout"), "dropout");
  ck::restore_rng(b2, back.rng.at("shuffle"), "shuffle");
  BOOST_TEST(a2() == a());
  BOOST_TEST(b2() == b());
  // The state of one engine type does not restore another.
  std::minstd_rand other;
  expect_checkpoint_error([&] { ck::restore_rng(other, back.rng.at("dropout"), "dropout"); },
                          {"'dropout'"});
  expect_checkpoint_error([&] { ck::restore_rng(b2, "garbage", "shuffle"); }, {"'shuffle'"});
  // Without a scaler the field is absent and reads back as none.
  ck::training_state plain;
  plain.step = 5;
  const auto text = ck::to_json(plain);
  BOOST_TEST(text.find("loss_scale") == std::string::npos);
  BOOST_TEST(!ck::parse_state(text, "s").loss_scale.has_value());
  expect_checkpoint_error(
      [] {
        (void)ck::parse_state(R"({"format":"hone-state","version":1,"step":1,"lr":0.1})",
                              "st.json");
      },
      {"'st.json'", "unknown field \"lr\""});
  expect_checkpoint_error(
      [] { (void)ck::parse_state(R"({"format":"hone-state","version":2,"step":1})", "st.json"); },
      {"version 2"});
}

// ---- file I/O
// ------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(io_errors_name_the_path_and_the_cause) {
  if (fs::exists("/dev/full")) {
    ck::output_file out("/dev/full");
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
    ck::output_file out(dir / "missing-dir" / "x");
    BOOST_ERROR("creating a file in a missing directory did not fail");
  } catch (const hone::io_error& e) {
    BOOST_TEST(std::string(e.what()).find("missing-dir/x'") != std::string::npos, e.what());
  }
  ck::write_file(dir / "f", "hello");
  ck::rename_path(dir / "f", dir / "g");
  ck::rename_path(dir / "g", dir / "f");
  BOOST_CHECK_THROW(ck::rename_path(dir / "absent", dir / "h"), hone::io_error);
  BOOST_CHECK_THROW(ck::output_file(dir / "f", ck::create_mode::exclusive), hone::io_error);
  const ck::input_file in(dir / "f");
  bytes b(10);
  expect_checkpoint_error([&] { in.read_at(0, b); }, {"is truncated"});
  BOOST_CHECK_THROW(ck::read_small_file(dir / "f", 4), hone::checkpoint_error);
  BOOST_TEST(ck::read_small_file(dir / "f", 5) == "hello");
  BOOST_CHECK_THROW(ck::input_file(dir.path), hone::io_error);  // a directory
  BOOST_CHECK_THROW((void)ck::safetensors_file::open(dir / "nope.safetensors"), hone::io_error);
  // An empty file maps to an empty view and is a checkpoint_error as safetensors.
  ck::write_file(dir / "empty.safetensors", "");
  expect_checkpoint_error([&] { (void)ck::tensor_file::open(dir / "empty.safetensors"); },
                          {"empty.safetensors", "0 bytes"});
}

// ---- the regression corpus
// -----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(every_corpus_file_is_rejected_and_every_seed_accepted) {
  std::size_t corpus = 0, seeds = 0;
  for (const auto& e : fs::directory_iterator(HONE_CHECKPOINT_CORPUS_DIR)) {
    const auto kind = hone_test::kind_of(e.path());
    BOOST_REQUIRE_MESSAGE(kind.has_value(), "unknown corpus file " << e.path());
    const bytes b = hone_test::read_bytes(e.path());
    try {
      (void)hone_test::read_fully(*kind, b);
      BOOST_ERROR("corpus file " << e.path().filename() << " was accepted");
    } catch (const hone::checkpoint_error&) {
      ++corpus;
    } catch (const std::exception& ex) {
      BOOST_ERROR("corpus file " << e.path().filename()
                                 << " threw a non-checkpoint error: " << ex.what());
    }
    // Every reader, on every file: accepted or checkpoint_error, nothing else.
    for (const auto k : {hone_test::input_kind::safetensors, hone_test::input_kind::compressed,
                         hone_test::input_kind::manifest, hone_test::input_kind::state}) {
      try {
        (void)hone_test::read_fully(k, b);
      } catch (const hone::checkpoint_error&) {
      }
    }
  }
  for (const auto& e : fs::directory_iterator(HONE_CHECKPOINT_SEEDS_DIR)) {
    const bytes b = hone_test::read_bytes(e.path());
    BOOST_CHECK_NO_THROW((void)hone_test::read_fully(*hone_test::kind_of(e.path()), b));
    ++seeds;
  }
  BOOST_TEST(corpus >= 100u);
  BOOST_TEST(seeds >= 4u);
}
