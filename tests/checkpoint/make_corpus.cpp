// tests/checkpoint/make_corpus.cpp: generates the committed regression corpus of malformed
// checkpoint files (tests/checkpoint/corpus/) and the valid seeds of the fuzz target
// (tests/checkpoint/seeds/). Every corpus file must be rejected with hone::checkpoint_error and
// every seed accepted; this program checks both before it writes anything.
//
//   cmake --build <build> --target checkpoint_make_corpus
//   <build>/tests/checkpoint/checkpoint_make_corpus tests/checkpoint
//
// Deterministic: running it again rewrites the same bytes.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "readers.hpp"

namespace {

namespace ck = hone::checkpoint;
namespace io = hone::io;
namespace fs = std::filesystem;
using bytes = std::vector<std::byte>;
using hone_test::input_kind;

bytes to_bytes(std::string_view s) {
  bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

void put_u64(bytes& b, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i)
    b[at + static_cast<std::size_t>(i)] = static_cast<std::byte>(v >> (8 * i));
}
std::uint64_t get_u64(const bytes& b, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | static_cast<std::uint64_t>(b[at + static_cast<std::size_t>(i)]);
  return v;
}

/// A safetensors file from a header text (unpadded) and data bytes.
bytes st(std::string_view header, std::size_t data_bytes = 0, std::uint8_t fill = 0x3c) {
  bytes b(8);
  put_u64(b, 0, header.size());
  const bytes h = to_bytes(header);
  b.insert(b.end(), h.begin(), h.end());
  b.insert(b.end(), data_bytes, static_cast<std::byte>(fill));
  return b;
}

struct hct_parts {
  bytes head;  // prelude + chunk data
  std::string index;
};
hct_parts split_hct(const bytes& f) {
  const std::size_t t = f.size() - 32;
  const std::uint64_t off = get_u64(f, t);
  const std::uint64_t len = get_u64(f, t + 8);
  return {bytes(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(off)),
          std::string(reinterpret_cast<const char*>(f.data()) + off, len)};
}
/// Reassembles a compressed file with a correct trailer (index offset, length and hash), so that
/// damage inside the index reaches the index validation.
bytes join_hct(const hct_parts& p) {
  bytes f = p.head;
  const bytes idx = to_bytes(p.index);
  f.insert(f.end(), idx.begin(), idx.end());
  bytes trailer(32);
  put_u64(trailer, 0, p.head.size());
  put_u64(trailer, 8, idx.size());
  put_u64(trailer, 16, io::hash64(idx));
  std::memcpy(trailer.data() + 24, ck::compressed_end_magic.data(), 8);
  f.insert(f.end(), trailer.begin(), trailer.end());
  return f;
}
std::string replace_once(std::string s, std::string_view from, std::string_view to) {
  const auto pos = s.find(from);
  if (pos == std::string::npos) {
    throw std::runtime_error("make_corpus: '" + std::string(from) + "' not in '" + s + "'");
  }
  return s.replace(pos, from.size(), to);
}

struct generator {
  fs::path root;
  int failures = 0;
  std::map<std::string, bytes> corpus, seeds;

  static input_kind kind(const std::string& name) { return *hone_test::kind_of(name); }

  void bad(const std::string& name, const bytes& b) {
    try {
      (void)hone_test::read_fully(kind(name), b);
      std::fprintf(stderr, "corpus file %s is ACCEPTED by the reader\n", name.c_str());
      ++failures;
    } catch (const hone::checkpoint_error&) {
    }
    corpus[name] = b;
  }
  void good(const std::string& name, const bytes& b) {
    try {
      (void)hone_test::read_fully(kind(name), b);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "seed %s is rejected: %s\n", name.c_str(), e.what());
      ++failures;
    }
    seeds[name] = b;
  }
};

// ---- valid files -------------------------------------------------------------------------------
struct valid_files {
  std::vector<float> f32{1.0f, -2.5f, 0.125f, 3.0e-3f};
  std::vector<hone::bfloat16> bf16{hone::bfloat16(0.5f), hone::bfloat16(-1.0f),
                                   hone::bfloat16(2.0f)};
  std::vector<std::int64_t> i64{-7};
  std::vector<std::uint8_t> u8{1, 2, 3, 4, 5};
  std::vector<float> big;  // for the compressed seed: repetitive, so chunks compress
  std::vector<float> none;

  valid_files() {
    big.resize(600);
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 7) * 0.25f;
  }
  ck::tensor_writer writer() const {
    ck::tensor_writer w;
    w.add("a", {2, 2}, f32);
    w.add("b", {3}, bf16);
    w.add("c", {1}, i64);
    w.add("d", {5}, u8);
    w.add("e", {0, 3}, none);
    w.set_metadata("format", "pt");
    return w;
  }
  ck::tensor_writer compressible_writer() const {
    ck::tensor_writer w = writer();
    w.add("big", {600}, big);
    return w;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <tests/checkpoint directory>\n", argv[0]);
    return 2;
  }
  generator g;
  g.root = fs::path(argv[1]);
  const valid_files v;

  // ---- seeds (valid) ---------------------------------------------------------------------------
  const bytes valid_st = v.writer().to_bytes();
  g.good("valid.safetensors", valid_st);
  const bytes valid_hct =
      ck::compressed_bytes(v.compressible_writer(), {.level = 1, .chunk_bytes = 512});
  g.good("valid.hct", valid_hct);
  // The float split encodings (F32 "a" and "big", BF16 "b") for the fuzzer to mutate.
  const bytes split_hct_file = ck::compressed_bytes(
      v.compressible_writer(),
      {.level = 1, .chunk_bytes = 512, .transform = ck::chunk_transform::split_delta});
  g.good("valid-split.hct", split_hct_file);
  // What the version 1 writer produced for the same tensors (byte-identical: version 2 only
  // added the split encodings and the version number).
  bytes valid_v1 = ck::compressed_bytes(
      v.compressible_writer(),
      {.level = 1, .chunk_bytes = 512, .transform = ck::chunk_transform::shuffle});
  valid_v1[8] = std::byte{1};
  g.good("valid-v1.hct", valid_v1);
  ck::manifest m;
  m.add("model.safetensors", io::file_digest{valid_st.size(), io::hash128(valid_st)});
  m.add("state.json", io::file_digest{12, io::hash128(to_bytes("hello"))});
  const std::string valid_manifest = m.to_string();
  g.good("valid.manifest", to_bytes(valid_manifest));
  ck::training_state s;
  s.step = 1200;
  s.loss_scale = hone::loss_scale_state{32768.0f, 17, 1, 3};
  s.schedule.set("step", 1200);
  s.data.set("epoch", 2);
  s.data.set("index", 4096);
  s.rng["numpy"] = "12345 67890";
  s.metadata["run"] = "demo";
  const std::string valid_state = ck::to_json(s);
  g.good("valid.json", to_bytes(valid_state));
  g.good("plain-py.safetensors",  // the exact bytes of Python safetensors' own test vector
         st(R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})", 24, 0));
  g.good("whitespace.safetensors",
         st(R"(  {"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}   )", 2));
  g.good("empty.safetensors", st("{}      "));
  g.good("null-metadata.safetensors", st(R"({"__metadata__":null})"));

  // ---- safetensors: lengths and truncation -----------------------------------------------------
  g.bad("st-empty.safetensors", {});
  g.bad("st-7-bytes.safetensors", bytes(valid_st.begin(), valid_st.begin() + 7));
  {
    bytes b = valid_st;
    put_u64(b, 0, 0x8000000000000000ull);
    g.bad("st-huge-header-length.safetensors", b);
    put_u64(b, 0, ck::max_header_bytes + 1);
    g.bad("st-header-over-limit.safetensors", b);
    put_u64(b, 0, b.size());  // one past the end of the file
    g.bad("st-header-past-eof.safetensors", b);
    put_u64(b, 0, 0);
    g.bad("st-header-zero.safetensors", b);
  }
  g.bad("st-truncated-header.safetensors", bytes(valid_st.begin(), valid_st.begin() + 40));
  g.bad("st-truncated-data.safetensors", bytes(valid_st.begin(), valid_st.end() - 3));
  {
    bytes b = valid_st;
    b.push_back(std::byte{0});
    g.bad("st-trailing-byte.safetensors", b);
  }
  // ---- safetensors: JSON -----------------------------------------------------------------------
  {
    bytes b = valid_st;
    b[8] = std::byte{'['};  // the header's first '{'
    g.bad("st-flipped-brace.safetensors", b);
    b = valid_st;
    b[8 + 2] ^= std::byte{0x80};  // inside the first key: invalid UTF-8
    g.bad("st-flipped-utf8.safetensors", b);
    b = valid_st;
    b[8 + get_u64(b, 0) - 1] = std::byte{'\0'};  // last header byte (padding or '}')
    g.bad("st-nul-padding.safetensors", b);
  }
  g.bad("st-not-object.safetensors", st("[]"));
  g.bad("st-string-root.safetensors", st(R"("x")"));
  g.bad("st-trailing-comma.safetensors",
        st(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},})", 2));
  g.bad("st-comment.safetensors",
        st(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}} // c)", 2));
  g.bad("st-deep-nesting.safetensors", st(std::string(1000, '[') + std::string(1000, ']')));
  g.bad("st-control-char.safetensors",
        st("{\"x\ty\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2));
  g.bad("st-lone-surrogate.safetensors",
        st(R"({"\ud800":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2));
  g.bad("st-overlong-utf8.safetensors",
        st("{\"\xc0\xaf\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2));
  g.bad(
      "st-duplicate-tensor.safetensors",
      st(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"x":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
         4));
  g.bad("st-duplicate-field.safetensors",
        st(R"({"x":{"dtype":"U8","dtype":"I8","shape":[2],"data_offsets":[0,2]}})", 2));
  g.bad("st-leading-zero.safetensors",
        st(R"({"x":{"dtype":"U8","shape":[02],"data_offsets":[0,2]}})", 2));
  // ---- safetensors: fields ---------------------------------------------------------------------
  g.bad("st-unknown-dtype.safetensors",
        st(R"({"x":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8));
  g.bad("st-lowercase-dtype.safetensors",
        st(R"({"x":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", 8));
  g.bad("st-sub-byte-dtype.safetensors",
        st(R"({"x":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", 1));
  g.bad("st-missing-dtype.safetensors", st(R"({"x":{"shape":[2],"data_offsets":[0,2]}})", 2));
  g.bad("st-missing-shape.safetensors", st(R"({"x":{"dtype":"U8","data_offsets":[0,2]}})", 2));
  g.bad("st-missing-offsets.safetensors", st(R"({"x":{"dtype":"U8","shape":[2]}})", 2));
  g.bad("st-tensor-not-object.safetensors", st(R"({"x":[1,2]})"));
  g.bad("st-shape-negative.safetensors",
        st(R"({"x":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", 2));
  g.bad("st-shape-float.safetensors",
        st(R"({"x":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}})", 2));
  g.bad("st-shape-2pow64.safetensors",
        st(R"({"x":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,2]}})", 2));
  g.bad("st-shape-overflow.safetensors",
        st(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}})"));
  g.bad("st-shape-mismatch.safetensors",
        st(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
  g.bad("st-offsets-three.safetensors",
        st(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2,2]}})", 2));
  g.bad("st-offsets-float.safetensors",
        st(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2.0]}})", 2));
  g.bad("st-offsets-exponent.safetensors",
        st(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2e0]}})", 2));
  g.bad("st-offsets-reversed.safetensors",
        st(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[2,0]}})", 2));
  g.bad(
      "st-offsets-huge.safetensors",
      st(R"({"x":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,18446744073709551615]}})",
         2));
  g.bad("st-offsets-out-of-range.safetensors",
        st(R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 2));
  g.bad(
      "st-offsets-overlap.safetensors",
      st(R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"y":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
         6));
  g.bad(
      "st-offsets-same.safetensors",
      st(R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"y":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
         4));
  g.bad(
      "st-offsets-gap.safetensors",
      st(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"y":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
         6));
  g.bad("st-offsets-not-at-zero.safetensors",
        st(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4));
  g.bad("st-metadata-number.safetensors", st(R"({"__metadata__":{"a":1}})"));
  g.bad("st-metadata-array.safetensors", st(R"({"__metadata__":["a"]})"));

  // ---- compressed tensor files -----------------------------------------------------------------
  g.bad("hct-truncated-half.hct",
        bytes(valid_hct.begin(),
              valid_hct.begin() + static_cast<std::ptrdiff_t>(valid_hct.size() / 2)));
  g.bad("hct-truncated-trailer.hct", bytes(valid_hct.begin(), valid_hct.end() - 1));
  g.bad("hct-prelude-only.hct", bytes(valid_hct.begin(), valid_hct.begin() + 16));
  {
    bytes b = valid_hct;
    b[1] = std::byte{'X'};
    g.bad("hct-bad-magic.hct", b);
    b = valid_hct;
    b[8] = std::byte{3};
    g.bad("hct-version-3.hct", b);
    b = valid_hct;
    b[8] = std::byte{0};
    g.bad("hct-version-0.hct", b);
    b = split_hct_file;
    b[8] = std::byte{1};
    g.bad("hct-v1-split-encoding.hct", b);
    b = valid_hct;
    b[12] = std::byte{1};
    g.bad("hct-flags.hct", b);
    b = valid_hct;
    b[b.size() - 1] = std::byte{'X'};
    g.bad("hct-bad-end-magic.hct", b);
    b = valid_hct;
    put_u64(b, b.size() - 32, 3);
    g.bad("hct-index-offset-low.hct", b);
    b = valid_hct;
    put_u64(b, b.size() - 32, 0xffffffffffffff00ull);
    g.bad("hct-index-offset-huge.hct", b);
    b = valid_hct;
    put_u64(b, b.size() - 24, 0xffffffffffffff00ull);
    g.bad("hct-index-length-huge.hct", b);
    b = valid_hct;
    b[get_u64(b, b.size() - 32) + 3] ^= std::byte{0x01};  // inside the index
    g.bad("hct-index-flipped.hct", b);
    b = valid_hct;
    b[40] ^= std::byte{0x55};  // inside chunk data
    g.bad("hct-chunk-flipped.hct", b);
  }
  const hct_parts parts = split_hct(valid_hct);
  // Locate the first chunk of "big" in the index: "big":{...,"chunks":[[512,<stored>,"<hash>"],...
  const std::string big_key = "\"big\":{\"dtype\":\"F32\",\"shape\":[600],\"data_offsets\":[";
  const auto big_pos = parts.index.find(big_key);
  const auto chunks_pos = parts.index.find("\"chunks\":[[", big_pos);
  const auto first_end = parts.index.find(']', chunks_pos + 11);
  const std::string first_chunk =
      parts.index.substr(chunks_pos + 10, first_end - (chunks_pos + 10) + 1);
  const auto c1 = first_chunk.find(',');
  const auto c2 = first_chunk.find(',', c1 + 1);
  const std::string raw = first_chunk.substr(1, c1 - 1);
  const std::string stored = first_chunk.substr(c1 + 1, c2 - c1 - 1);
  const std::string hash = first_chunk.substr(c2 + 2, 16);
  const auto edit = [&](std::string_view from, std::string_view to) {
    hct_parts p = parts;
    p.index = replace_once(p.index, from, to);
    return join_hct(p);
  };
  g.bad("hct-encoding-unknown.hct", edit("\"shuffle-zstd\"", "\"lz4\""));
  g.bad("hct-encoding-missing.hct", edit(",\"encoding\":\"shuffle-zstd\"", ""));
  g.bad("hct-encoding-number.hct", edit("\"encoding\":\"shuffle-zstd\"", "\"encoding\":2"));
  {
    // A split encoding on an I64 tensor ("c").
    hct_parts p = parts;
    const auto c_pos = p.index.find("\"c\":{\"dtype\":\"I64\"");
    const auto enc_pos = p.index.find("\"shuffle-zstd\"", c_pos);
    if (c_pos == std::string::npos || enc_pos == std::string::npos) {
      throw std::runtime_error("make_corpus: tensor c's encoding not found in the index");
    }
    p.index.replace(enc_pos, 14, "\"split-zstd\"");
    g.bad("hct-split-on-i64.hct", join_hct(p));
  }
  g.bad("hct-chunks-missing.hct",
        edit(",\"chunks\":[" + first_chunk, ",\"chunkz\":[" + first_chunk));
  g.bad("hct-chunk-raw-not-element.hct",
        edit(first_chunk,
             "[" + std::to_string(std::stoul(raw) - 2) + "," + stored + ",\"" + hash + "\"]"));
  g.bad("hct-chunk-raw-zero.hct", edit(first_chunk, "[0," + stored + ",\"" + hash + "\"]"));
  g.bad("hct-chunk-raw-huge.hct",
        edit(first_chunk, "[1099511627776," + stored + ",\"" + hash + "\"]"));
  g.bad("hct-chunk-stored-over-raw.hct",
        edit(first_chunk,
             "[" + raw + "," + std::to_string(std::stoul(raw) + 1) + ",\"" + hash + "\"]"));
  g.bad("hct-chunk-stored-zero.hct", edit(first_chunk, "[" + raw + ",0,\"" + hash + "\"]"));
  g.bad("hct-chunk-stored-shifted.hct",
        edit(first_chunk,
             "[" + raw + "," + std::to_string(std::stoul(stored) - 1) + ",\"" + hash + "\"]"));
  g.bad("hct-chunk-hash-wrong.hct",
        edit(first_chunk, "[" + raw + "," + stored + ",\"0123456789abcdef\"]"));
  g.bad("hct-chunk-hash-upper.hct",
        edit(first_chunk, "[" + raw + "," + stored + ",\"" + std::string(16, 'A') + "\"]"));
  g.bad("hct-chunk-two-fields.hct", edit(first_chunk, "[" + raw + "," + stored + "]"));
  g.bad("hct-chunks-short.hct", edit("\"chunks\":[" + first_chunk + ",", "\"chunks\":["));
  {
    // Move "big" 4 bytes earlier: it overlaps the tensor before it.
    const auto begin_pos = big_pos + big_key.size();
    const auto comma = parts.index.find(',', begin_pos);
    const auto close = parts.index.find(']', comma);
    const std::uint64_t begin = std::stoull(parts.index.substr(begin_pos, comma - begin_pos));
    const std::uint64_t end = std::stoull(parts.index.substr(comma + 1, close - comma - 1));
    g.bad("hct-offsets-overlap.hct",
          edit(big_key + std::to_string(begin) + "," + std::to_string(end) + "]",
               big_key + std::to_string(begin - 4) + "," + std::to_string(end - 4) + "]"));
  }
  {
    hct_parts p = parts;
    p.head.push_back(std::byte{0});  // chunk data nobody owns
    g.bad("hct-unowned-chunk-data.hct", join_hct(p));
  }

  // ---- MANIFEST --------------------------------------------------------------------------------
  const std::string line1 = valid_manifest.substr(0, valid_manifest.find('\n') + 1);
  const std::string body = valid_manifest.substr(0, valid_manifest.find("end "));
  const auto resign = [](const std::string& without_end) {
    return without_end + "end " + io::hash128(to_bytes(without_end)).hex() + "\n";
  };
  g.bad("manifest-empty.manifest", {});
  g.bad("manifest-header-only.manifest", to_bytes(line1));
  g.bad("manifest-wrong-header.manifest", to_bytes(resign("hone-manifest 1 sha256\n")));
  g.bad("manifest-version-2.manifest", to_bytes(resign("hone-manifest 2 xxh3-128\n")));
  g.bad("manifest-not-manifest.manifest", to_bytes("hello world\n"));
  g.bad("manifest-truncated.manifest",
        to_bytes(valid_manifest.substr(0, valid_manifest.size() - 10)));
  g.bad("manifest-no-final-newline.manifest",
        to_bytes(valid_manifest.substr(0, valid_manifest.size() - 1)));
  g.bad("manifest-edited-size.manifest", to_bytes(replace_once(valid_manifest, " 12 ", " 13 ")));
  g.bad("manifest-trailing-bytes.manifest", to_bytes(valid_manifest + "x"));
  g.bad("manifest-crlf.manifest", to_bytes(resign(replace_once(body, "\n", "\r\n"))));
  const std::string h32(32, 'a');
  g.bad("manifest-unsorted.manifest", to_bytes(resign(line1 + h32 + " 1 b\n" + h32 + " 1 a\n")));
  g.bad("manifest-duplicate.manifest", to_bytes(resign(line1 + h32 + " 1 a\n" + h32 + " 1 a\n")));
  g.bad("manifest-path-traversal.manifest", to_bytes(resign(line1 + h32 + " 1 ../x\n")));
  g.bad("manifest-slash.manifest", to_bytes(resign(line1 + h32 + " 1 a/b\n")));
  g.bad("manifest-hidden-name.manifest", to_bytes(resign(line1 + h32 + " 1 .x\n")));
  g.bad("manifest-self.manifest", to_bytes(resign(line1 + h32 + " 1 MANIFEST\n")));
  g.bad("manifest-empty-name.manifest", to_bytes(resign(line1 + h32 + " 1 \n")));
  g.bad("manifest-upper-hash.manifest", to_bytes(resign(line1 + std::string(32, 'A') + " 1 a\n")));
  g.bad("manifest-short-hash.manifest", to_bytes(resign(line1 + std::string(31, 'a') + " 1 a\n")));
  g.bad("manifest-size-leading-zero.manifest", to_bytes(resign(line1 + h32 + " 01 a\n")));
  g.bad("manifest-size-negative.manifest", to_bytes(resign(line1 + h32 + " -1 a\n")));
  g.bad("manifest-size-2pow64.manifest",
        to_bytes(resign(line1 + h32 + " 18446744073709551616 a\n")));
  g.bad("manifest-double-space.manifest", to_bytes(resign(line1 + h32 + "  1 a\n")));
  g.bad("manifest-end-bad-hex.manifest", to_bytes(body + "end xyz\n"));

  // ---- state.json ------------------------------------------------------------------------------
  const auto state_edit = [&](std::string_view from, std::string_view to) {
    return to_bytes(replace_once(valid_state, from, to));
  };
  g.bad("state-empty.json", {});
  g.bad("state-array.json", to_bytes("[]"));
  g.bad("state-truncated.json", to_bytes(valid_state.substr(0, valid_state.size() / 2)));
  g.bad("state-wrong-format.json", state_edit("\"hone-state\"", "\"other\""));
  g.bad("state-version-2.json", state_edit("\"version\": 1", "\"version\": 2"));
  g.bad("state-version-string.json", state_edit("\"version\": 1", "\"version\": \"1\""));
  g.bad("state-missing-step.json", state_edit("\"step\": 1200,", ""));
  g.bad("state-step-negative.json", state_edit("\"step\": 1200", "\"step\": -1"));
  g.bad("state-step-float.json", state_edit("\"step\": 1200", "\"step\": 1200.5"));
  g.bad("state-unknown-field.json", state_edit("\"step\": 1200", "\"step\": 1200, \"epoch\": 3"));
  g.bad("state-duplicate-step.json",
        state_edit("\"step\": 1200", "\"step\": 1200, \"step\": 1201"));
  g.bad("state-scale-overflow.json", state_edit("\"scale\": 32768", "\"scale\": 1e39"));
  g.bad("state-scale-zero.json", state_edit("\"scale\": 32768", "\"scale\": 0"));
  g.bad("state-scale-negative.json", state_edit("\"scale\": 32768", "\"scale\": -2"));
  g.bad("state-growth-overflow.json",
        state_edit("\"growth_tracker\": 17", "\"growth_tracker\": 2147483648"));
  g.bad("state-loss-scale-extra.json",
        state_edit("\"growth_tracker\": 17", "\"growth_tracker\": 17, \"x\": 1"));
  g.bad("state-loss-scale-missing.json", state_edit("\"growth_tracker\": 17,", ""));
  g.bad("state-rng-number.json", state_edit("\"12345 67890\"", "12345"));
  g.bad("state-metadata-array.json", state_edit("\"metadata\": {", "\"metadata\": [{"));
  const std::string head = R"({"format":"hone-state","version":1,"step":1,)";
  g.bad("state-schedule-string.json", to_bytes(head + R"("schedule":"x"})"));
  g.bad("state-data-array.json", to_bytes(head + R"("data":[]})"));
  g.bad("state-loss-scale-string.json", to_bytes(head + R"("loss_scale":"x"})"));
  g.bad("state-rng-array.json", to_bytes(head + R"("rng":["a"]})"));
  g.good("minimal.json", to_bytes(head + R"("loss_scale":null})"));
  g.bad("state-nan.json", state_edit("\"scale\": 32768", "\"scale\": NaN"));

  if (g.failures != 0) {
    std::fprintf(stderr, "%d generated files do not behave as intended; nothing written\n",
                 g.failures);
    return 1;
  }
  for (const auto& [dir, files] : {std::pair{"corpus", &g.corpus}, std::pair{"seeds", &g.seeds}}) {
    const fs::path d = g.root / dir;
    fs::create_directories(d);
    for (const auto& e : fs::directory_iterator(d)) fs::remove(e.path());
    std::size_t total = 0;
    for (const auto& [name, content] : *files) {
      std::ofstream out(d / name, std::ios::binary);
      out.write(reinterpret_cast<const char*>(content.data()),
                static_cast<std::streamsize>(content.size()));
      total += content.size();
    }
    std::printf("%s: %zu files, %zu bytes\n", d.c_str(), files->size(), total);
  }
  return 0;
}
