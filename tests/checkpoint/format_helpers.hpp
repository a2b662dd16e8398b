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

#include "../io/io_helpers.hpp"
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

// Shared with the io tests: checkpoint_error assertions and pseudo-random patterns.
using io_test::expect_checkpoint_error;
using io_test::pattern;

}  // namespace ckpt_test
