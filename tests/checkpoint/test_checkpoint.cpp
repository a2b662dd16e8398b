// Tests of the checkpoint directory files: the MANIFEST, directory verification, state.json, and
// the regression corpus of malformed files (every reader rejects each with a checkpoint_error).
// The other checkpoint format tests: test_safetensors.cpp, test_compress.cpp; the file-format
// building blocks (JSON, hashes, dtypes, file I/O): tests/io.
#define BOOST_TEST_MODULE hone_checkpoint
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
#include <hone/checkpoint/manifest.hpp>
#include <hone/checkpoint/safetensors.hpp>
#include <hone/checkpoint/state.hpp>
#include <hone/checkpoint/tensor_file.hpp>
#include <hone/checkpoint/verify.hpp>
#include <hone/io/file_io.hpp>
#include <hone/io/json.hpp>

#include "readers.hpp"

#include "format_helpers.hpp"

namespace ck = hone::checkpoint;
namespace io = hone::io;
namespace fs = std::filesystem;
using namespace ckpt_test;

// ---- MANIFEST
// ------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(manifest_round_trip_and_strictness) {
  ck::manifest m;
  m.add("state.json", {12, io::hash128(text_bytes("x"))});
  m.add("model.safetensors", {123456789012ull, io::hash128(text_bytes("y"))});
  m.add("optimizer.hct", {0, io::hash128({})});
  BOOST_TEST(m.entries()[0].name == "model.safetensors");  // sorted
  const std::string text = m.to_string();
  BOOST_TEST(text.rfind("hone-manifest 1 xxh3-128\n", 0) == 0u);
  BOOST_TEST(text.find(io::hash128(text_bytes("y")).hex() + " 123456789012 model.safetensors\n") !=
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
  // Damaged bytes are quoted escaped: an escape sequence in a corrupted MANIFEST never reaches the
  // user's terminal raw.
  const std::string hostile = "hone-manifest 9 \x1b[2J\x07\xff\n";
  try {
    (void)ck::manifest::parse(hostile, "M");
    BOOST_ERROR("no checkpoint_error thrown");
  } catch (const hone::checkpoint_error& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find("\\x1b[2J\\x07\\xff") != std::string::npos, msg);
    BOOST_TEST(std::none_of(msg.begin(), msg.end(),
                            [](char c) { return static_cast<unsigned char>(c) < 0x20; }));
  }
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
  io::sync_directory(dir.path);

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
