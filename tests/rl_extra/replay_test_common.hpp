// Shared by test_replay_io.cpp and test_mmap_storage.cpp: a transition whose every record is a
// known function of its key (so any stored or sampled row can be checked byte for byte), batch
// comparison, a temporary directory, and error capture.
#pragma once

#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <hone/rl/batch.hpp>
#include <hone/rl/transition.hpp>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"

namespace replay_test {

namespace fs = std::filesystem;

using step = hone::transition<hone::field<"obs", float, 4>, hone::field<"action", std::int32_t>,
                              hone::field<"reward", float>, hone::field<"next_obs", float, 4>,
                              hone::field<"terminated", bool>, hone::field<"truncated", bool>,
                              hone::field<"discount", float>>;
using record = step::record;

/// The record whose key (sequence number) is `key`: every field derived from it.
inline record record_for(std::uint64_t key) {
  record r{};
  for (int i = 0; i < 4; ++i) {
    hone::get<"obs">(r)[static_cast<std::size_t>(i)] = static_cast<float>(key * 4 + i);
    hone::get<"next_obs">(r)[static_cast<std::size_t>(i)] = static_cast<float>(key * 4 + i) + 0.25f;
  }
  hone::get<"action">(r) = static_cast<std::int32_t>(key % 1000003);
  hone::get<"reward">(r) = static_cast<float>(key) * 0.5f;
  hone::get<"terminated">(r) = key % 7 == 3;
  hone::get<"truncated">(r) = false;
  hone::get<"discount">(r) = 0.99f;
  return r;
}

/// Whether two records hold the same bytes in every field (padding ignored).
inline bool same_record(const record& a, const record& b) {
  bool same = true;
  step::for_each_field([&](auto i) {
    using F = typename step::template field_at<i>;
    same = same &&
           std::memcmp(step::template elements<i>(a), step::template elements<i>(b), F::bytes) == 0;
  });
  return same;
}

/// Whether row r of a batch is the record of its key.
template <class Batch>
bool row_matches_key(const Batch& b, std::size_t r) {
  return same_record(b.row(r), record_for(b.keys()[r]));
}

/// Whether two batches of transition type T are identical: every column byte, every key, every
/// weight bit.
template <class T = step, class Batch>
bool same_batch(const Batch& a, const Batch& b) {
  if (a.size() != b.size()) return false;
  bool same = true;
  T::for_each_field([&](auto i) {
    const auto ca = a.template column<i>();
    const auto cb = b.template column<i>();
    same = same && std::memcmp(ca.data(), cb.data(), ca.size_bytes()) == 0;
  });
  same = same && std::memcmp(a.keys().data(), b.keys().data(), a.keys().size_bytes()) == 0;
  same = same && std::memcmp(a.weights().data(), b.weights().data(), a.weights().size_bytes()) == 0;
  return same;
}

using hone_test::temp_dir;

/// "checkpoint_error: <message>" / "config_error: ..." / "io_error: ..." / "no error".
template <class F>
std::string error_text(F&& f) {
  try {
    f();
  } catch (const hone::checkpoint_error& e) {
    return std::string("checkpoint_error: ") + e.what();
  } catch (const hone::config_error& e) {
    return std::string("config_error: ") + e.what();
  } catch (const hone::io_error& e) {
    return std::string("io_error: ") + e.what();
  }
  return "no error";
}

inline bool contains_text(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// Overwrites bytes of a file at `offset`.
inline void poke(const fs::path& p, std::uint64_t offset, const std::vector<char>& bytes) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
/// Flips every bit of the byte at `offset`.
inline void flip_byte(const fs::path& p, std::uint64_t offset) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(~c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

}  // namespace replay_test
