// tests/checkpoint/format_helpers.hpp: helpers shared by the checkpoint format tests (byte
// vectors, a hand-made safetensors file, error-message checks, pseudo-random patterns).
#pragma once

#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <hone/core/error.hpp>

#include "../support/temp_dir.hpp"

namespace ckpt_test {

using bytes = std::vector<std::byte>;
using temp_dir = hone_test::temp_dir;

inline bytes text_bytes(std::string_view s) {
  bytes b(s.size());
  if (!s.empty()) std::memcpy(b.data(), s.data(), s.size());
  return b;
}

/// A safetensors file from a header text and data bytes.
inline bytes st_file(std::string_view header, const bytes& data = {}) {
  bytes b(8);
  for (int i = 0; i < 8; ++i)
    b[static_cast<std::size_t>(i)] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xff);
  const bytes h = text_bytes(header);
  b.insert(b.end(), h.begin(), h.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

inline bytes float_bytes(std::initializer_list<float> v) {
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

}  // namespace ckpt_test
