// tests/io/io_helpers.hpp: helpers shared by the tests of hone's io layer.
#pragma once

#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <initializer_list>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <hone/core/error.hpp>

#include "../support/temp_dir.hpp"

namespace io_test {

using bytes = std::vector<std::byte>;
using temp_dir = hone_test::temp_dir;

/// Asserts that `f` throws hone::checkpoint_error (io::format_error derives from it) whose message
/// contains every fragment.
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

/// n pseudo-random values of T (every byte drawn from mt19937 seeded with `seed`).
template <class T>
std::vector<T> pattern(std::size_t n, unsigned seed) {
  std::vector<T> v(n);
  auto* p = reinterpret_cast<unsigned char*>(v.data());
  std::mt19937 rng(seed);
  for (std::size_t i = 0; i < n * sizeof(T); ++i) p[i] = static_cast<unsigned char>(rng());
  return v;
}

}  // namespace io_test
