// Tests of hone compressed tensor files: the byte transforms (shuffle, float split) against
// independent references, round trips of every dtype and back to safetensors, the automatic
// transform choice, version 1 files, damage detection, and the ratio on weight-like data.
#define BOOST_TEST_MODULE hone_checkpoint_compress
#include <boost/test/unit_test.hpp>

#include <algorithm>
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
#include <hone/io/dtype.hpp>
#include <hone/io/file_io.hpp>
#include <hone/io/hash.hpp>

#include "format_helpers.hpp"
#include "readers.hpp"

namespace ck = hone::checkpoint;
namespace io = hone::io;
namespace fs = std::filesystem;
using namespace ckpt_test;

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
  for (io::dtype t : io::all_dtypes) {
    const std::size_t n = 1000 * io::dtype_size(t);
    auto v = pattern<std::uint8_t>(n, static_cast<unsigned>(t));
    for (std::size_t i = 0; i < n; ++i) {
      if ((i / 64) % 2 == 0) v[i] = static_cast<std::uint8_t>(i % 3);  // half compressible
    }
    if (t == io::dtype::boolean) {
      for (auto& b : v) b &= 1;
    }
    store.push_back(std::move(v));
    w.add(std::string(io::dtype_name(t)), t, {10, 100}, std::as_bytes(std::span(store.back())));
  }
  const std::vector<float> f32 = pattern<float>(3000, 99);
  w.add("exported", {3000}, std::span(f32), io::dtype::bf16);  // conversion inside the pipeline
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
        const bool splits = t.type == io::dtype::f32 || t.type == io::dtype::bf16;
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
