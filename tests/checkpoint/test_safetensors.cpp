// Tests of safetensors files: the writer and reader against the reference implementation's own
// byte vectors, every dtype, the readers' messages, the writer's checks, the export dtype, and
// arenas and model parameters saved and loaded.
#define BOOST_TEST_MODULE hone_checkpoint_safetensors
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <hone/checkpoint/compress.hpp>
#include <hone/checkpoint/safetensors.hpp>
#include <hone/checkpoint/tensor_file.hpp>
#include <hone/core/arena.hpp>
#include <hone/core/bfloat16.hpp>
#include <hone/core/model.hpp>
#include <hone/io/dtype.hpp>
#include <hone/io/file_io.hpp>

#include "format_helpers.hpp"

namespace ck = hone::checkpoint;
namespace io = hone::io;
namespace fs = std::filesystem;
using namespace ckpt_test;

// ---- safetensors: the reference implementation's byte vectors ----------------------------------

BOOST_AUTO_TEST_CASE(safetensors_bytes_match_the_reference_implementation) {
  // safetensors/src/tensor.rs, test_serialization: "attn.0" F32 [1, 2, 3] = 0..5.
  const auto data = float_bytes({0, 1, 2, 3, 4, 5});
  ck::tensor_writer w;
  w.add("attn.0", io::dtype::f32, {1, 2, 3}, data);
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
  a.add("attn0", io::dtype::f32, {1, 1, 2, 3}, data);
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
  for (io::dtype t : io::all_dtypes) {
    const std::size_t n = 15 * io::dtype_size(t);
    store.push_back(pattern<std::uint8_t>(n, static_cast<unsigned>(t) + 10));
    if (t == io::dtype::boolean) {
      for (auto& b : store.back()) b &= 1;
    }
    w.add(std::string(io::dtype_name(t)), t, {3, 5}, std::as_bytes(std::span(store.back())));
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
  BOOST_TEST((d == io::hash_file(dir / "all.safetensors")));  // hashed as written
  {
    // A tensor larger than one write block (detail::hash_io_bytes): hashed block by block.
    ck::tensor_writer plain;
    const std::vector<float> big = pattern<float>(300000, 3);
    static_assert(300000 * sizeof(float) > 2 * io::hash_io_bytes);
    plain.add("big", {300000}, big);
    const auto dp = plain.write(dir / "plain.safetensors");
    BOOST_TEST((dp == io::hash_file(dir / "plain.safetensors")));
    const bytes mem = plain.to_bytes();
    BOOST_TEST((dp == io::file_digest{mem.size(), io::hash128(mem)}));
  }
  {
    // With a dtype conversion the file is hashed inline, as written through the staging buffer.
    ck::tensor_writer conv;
    const std::vector<float> big = pattern<float>(300000, 4);  // more than one staging buffer
    conv.add("big", {300000}, big, io::dtype::bf16);
    conv.add("scalar", {}, scalar);
    const auto dc = conv.write(dir / "conv.safetensors");
    BOOST_TEST((dc == io::hash_file(dir / "conv.safetensors")));
    const bytes mem = conv.to_bytes();
    BOOST_TEST((dc == io::file_digest{mem.size(), io::hash128(mem)}));
  }
  {
    // A file of tensor_writer::background_hash_bytes or more: hashed on a second thread behind
    // the writes (in pieces of background_hash_piece), with the header and a converted tensor's
    // staging chunks hashed in between, in file order. The same digest as hashing the file.
    ck::tensor_writer large;
    constexpr std::size_t n = ck::tensor_writer::background_hash_bytes / sizeof(float) + 12345;
    static_assert(n * sizeof(float) > 2 * ck::tensor_writer::background_hash_piece);
    const std::vector<float> big = pattern<float>(n, 5);
    const std::vector<float> conv = pattern<float>(300000, 6);
    large.add("big", {n}, big);
    large.add("conv", {300000}, conv, io::dtype::bf16);
    large.add("scalar", {}, scalar);
    BOOST_TEST(large.file_size() >= ck::tensor_writer::background_hash_bytes);
    const auto dl = large.write(dir / "large.safetensors");
    BOOST_TEST(dl.size == large.file_size());
    BOOST_TEST((dl == io::hash_file(dir / "large.safetensors")));
    const bytes mem = large.to_bytes();
    BOOST_TEST((dl == io::file_digest{mem.size(), io::hash128(mem)}));
    fs::remove(dir / "large.safetensors");
  }
  for (const bool mapped : {true, false}) {
    const bytes mem = w.to_bytes();
    const auto f = mapped ? ck::safetensors_file::open(dir / "all.safetensors")
                          : ck::safetensors_file::view(mem, "mem");
    BOOST_TEST(f.tensors().size() == io::all_dtypes.size() + 2);
    BOOST_TEST(f.metadata().at("unicode") == "\xc3\xa9\xe2\x82\xac");
    for (std::size_t i = 0; i < io::all_dtypes.size(); ++i) {
      const io::dtype t = io::all_dtypes[i];
      const ck::tensor_info& info = f.at(io::dtype_name(t));
      BOOST_TEST((info.type == t));
      BOOST_TEST(info.shape == (ck::shape_type{3, 5}));
      BOOST_TEST(info.begin % io::dtype_size(t) == 0);  // aligned: largest element size first
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
  BOOST_TEST(h.tensors.size() == io::all_dtypes.size() + 2);
  BOOST_TEST(h.data_offset() + h.data_bytes() == d.size);
}

BOOST_AUTO_TEST_CASE(large_tensors_of_an_opened_file_read_as_from_the_bytes) {
  // A file opened from disk reads tensors of at least pread_min_bytes with pread, smaller ones and
  // conversions from the mapping: every route gives the bytes the in-memory reader (view) gives,
  // at every offset (an F16 tensor first puts the F32 ones at offsets that are not multiples of 8).
  temp_dir dir;
  constexpr std::size_t big_n = ck::safetensors_file::pread_min_bytes / sizeof(float) + 3;
  const std::vector<float> big = pattern<float>(big_n, 21);
  const std::vector<float> at_min = pattern<float>(ck::safetensors_file::pread_min_bytes / 4, 22);
  const std::vector<float> small = pattern<float>(7, 23);
  const std::vector<std::uint16_t> half_bits = pattern<std::uint16_t>(5, 24);
  ck::tensor_writer w;
  w.add("odd", io::dtype::f16, {5}, std::as_bytes(std::span(half_bits)));
  w.add("big", {big_n}, big);
  w.add("at_min", {at_min.size()}, at_min);
  w.add("small", {7}, small);
  const fs::path path = dir / "mixed.safetensors";
  (void)w.write(path);
  const ck::safetensors_file f = ck::safetensors_file::open(path);
  const bytes mem = w.to_bytes();  // the same file, in memory
  const ck::safetensors_file v = ck::safetensors_file::view(mem, "memory");
  for (const char* name : {"big", "at_min", "small"}) {
    const ck::tensor_info& t = f.at(name);
    std::vector<float> from_file(static_cast<std::size_t>(t.elements()), -1.0f);
    std::vector<float> from_view(from_file.size(), -2.0f);
    f.read(t, std::as_writable_bytes(std::span(from_file)));
    v.read(v.at(name), std::as_writable_bytes(std::span(from_view)));
    // Random bit patterns (NaNs among them): compare bytes, not floats.
    BOOST_TEST(std::memcmp(from_file.data(), from_view.data(), from_file.size() * 4) == 0, name);
  }
  {
    std::vector<float> whole(big_n);
    f.read(f.at("big"), std::as_writable_bytes(std::span(whole)));
    BOOST_TEST(std::memcmp(whole.data(), big.data(), big_n * 4) == 0);
  }
  // A conversion of a large tensor still goes through the mapping, with the same result.
  std::vector<hone::bfloat16> as_bf16(big_n);
  f.read(f.at("big"), std::as_writable_bytes(std::span(as_bf16)), io::dtype::bf16);
  for (std::size_t i = 0; i < big_n; i += 997) {
    if (std::isnan(big[i])) continue;
    BOOST_TEST(as_bf16[i].bits() == hone::bfloat16(big[i]).bits());
  }
  // A destination of the wrong size is refused before anything is read.
  std::vector<float> short_out(big_n - 1);
  BOOST_CHECK_THROW(f.read(f.at("big"), std::as_writable_bytes(std::span(short_out))),
                    hone::config_error);
}

BOOST_AUTO_TEST_CASE(gathered_tensors_write_the_bytes_of_contiguous_ones) {
  // A gathered tensor (rows produced by a callback, as a replay buffer's packed records are) is
  // written byte for byte like the same tensor added from contiguous memory: plain and compressed,
  // rows larger than the 1 MiB piece and smaller, and read_stored's unaligned ranges.
  temp_dir dir;
  const std::vector<float> rows_small = pattern<float>(3000 * 7, 31);  // 28-byte rows
  const std::vector<float> rows_big = pattern<float>(3 * 300000, 32);  // rows of 1.2 MB
  const std::vector<std::uint16_t> halves = pattern<std::uint16_t>(50 * 3, 33);
  // The compressed writer gathers on several threads: counters are atomic, and the size check is
  // recorded and asserted afterwards (Boost.Test's assertions are not thread-safe).
  std::atomic<std::size_t> calls{0}, bad_sizes{0};
  auto gather_from = [&calls, &bad_sizes](std::span<const std::byte> src, std::uint64_t row_bytes) {
    return [src, row_bytes, &calls, &bad_sizes](std::uint64_t first, std::uint64_t rows,
                                                std::span<std::byte> out) {
      ++calls;
      if (out.size() != rows * row_bytes || (first + rows) * row_bytes > src.size()) {
        ++bad_sizes;
        return;
      }
      std::memcpy(out.data(), src.data() + first * row_bytes, out.size());
    };
  };
  ck::tensor_writer contiguous, gathered;
  contiguous.add("small", {3000, 7}, rows_small);
  contiguous.add("big", {3, 300000}, rows_big);
  contiguous.add("half", io::dtype::f16, {50, 3}, std::as_bytes(std::span(halves)));
  gathered.add_gathered("small", io::dtype::f32, {3000, 7},
                        gather_from(std::as_bytes(std::span(rows_small)), 28));
  gathered.add_gathered("big", io::dtype::f32, {3, 300000},
                        gather_from(std::as_bytes(std::span(rows_big)), 1200000));
  gathered.add_gathered("half", io::dtype::f16, {50, 3},
                        gather_from(std::as_bytes(std::span(halves)), 6));
  BOOST_TEST(gathered.file_size() == contiguous.file_size());
  const bytes want = contiguous.to_bytes();
  BOOST_TEST((gathered.to_bytes() == want));
  BOOST_TEST(calls > 3u);  // several pieces of the small-row tensor
  BOOST_TEST(bad_sizes == 0u);
  const auto d = gathered.write(dir / "g.safetensors");
  BOOST_TEST((d == contiguous.write(dir / "c.safetensors")));
  // Compressed: the compressed writer reads chunks at offsets that are not row boundaries.
  const auto gc = ck::write_compressed(gathered, dir / "g.hcz", {});
  const auto cc = ck::write_compressed(contiguous, dir / "c.hcz", {});
  BOOST_TEST((gc == cc));
  // read_stored of an unaligned range (inside a row, across rows).
  std::vector<std::byte> a(100), b(100);
  for (const std::uint64_t off : {0u, 4u, 24u, 28u, 1000u}) {
    gathered.read_stored(0, off, a);  // "small" is entries()[0]
    contiguous.read_stored(0, off, b);
    BOOST_TEST((a == b), "offset " << off);
  }
  BOOST_TEST(bad_sizes == 0u);  // no call asked for rows outside the tensor, or a wrong size
  // The checks of add(), and the gather function's own.
  BOOST_CHECK_THROW(gathered.add_gathered("small", io::dtype::f32, {1}, gather_from({}, 4)),
                    hone::config_error);
  BOOST_CHECK_THROW(gathered.add_gathered("none", io::dtype::f32, {2}, {}), hone::config_error);
  BOOST_CHECK_THROW(gathered.add_gathered("scalar", io::dtype::f32, {}, gather_from({}, 4)),
                    hone::config_error);
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
  BOOST_CHECK_THROW(w.add("i", {6}, ints, io::dtype::f32), hone::config_error);
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
  w.add_arena(master, io::dtype::bf16, "model.", shapes);
  const auto d = ck::write_tensors(w, dir / "model.safetensors");
  BOOST_TEST(d.size == w.file_size());

  const auto f = ck::tensor_file::open(dir / "model.safetensors");
  BOOST_TEST((f.format() == ck::tensor_format::safetensors));
  const ck::tensor_info& t = f.at("model.fc1.weight");
  BOOST_TEST((t.type == io::dtype::bf16));
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

BOOST_AUTO_TEST_CASE(readers_name_missing_and_empty_files) {
  temp_dir dir;
  BOOST_CHECK_THROW((void)ck::safetensors_file::open(dir / "nope.safetensors"), hone::io_error);
  // An empty file maps to an empty view and is a checkpoint_error as safetensors.
  io::write_file(dir / "empty.safetensors", "");
  expect_checkpoint_error([&] { (void)ck::tensor_file::open(dir / "empty.safetensors"); },
                          {"empty.safetensors", "0 bytes"});
}
