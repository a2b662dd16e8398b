// Tests of hone::buffer, hone::arena, hone::device_span and the error kinds.
#define BOOST_TEST_MODULE hone_core_memory
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <hone/core/arena.hpp>
#include <hone/core/buffer.hpp>
#include <hone/core/device_span.hpp>
#include <hone/core/error.hpp>
#include <limits>
#include <numeric>
#include <string>
#include <string_view>
#include <type_traits>

namespace {
struct pod {
  float a;
  int b;
};
bool aligned64(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 64 == 0;
}
}  // namespace

static_assert(hone::memory_space<hone::host_space>);
static_assert(hone::memory_space<hone::pinned_host_space>);
static_assert(!std::is_copy_constructible_v<hone::buffer<float>>);
static_assert(std::is_nothrow_move_constructible_v<hone::buffer<float>>);
static_assert(std::is_same_v<hone::buffer<float>::view_type, std::span<float>>);
static_assert(std::is_trivially_copyable_v<hone::device_span<float>>);

BOOST_AUTO_TEST_CASE(buffer_allocates_aligned_and_views) {
  for (std::size_t n : {1u, 3u, 17u, 1000u, 65537u}) {
    hone::buffer<float> b(n);
    BOOST_TEST(b.size() == n);
    BOOST_TEST(b.size_bytes() == n * sizeof(float));
    BOOST_TEST(aligned64(b.data()));
    std::iota(b.begin(), b.end(), 0.0f);
    auto v = b.view();
    BOOST_TEST(v.size() == n);
    BOOST_TEST(v[n - 1] == static_cast<float>(n - 1));
  }
  hone::buffer<pod> p(5, pod{1.5f, 7});
  BOOST_TEST(p[4].b == 7);
  BOOST_TEST(p[0].a == 1.5f);
}

BOOST_AUTO_TEST_CASE(buffer_empty_and_move) {
  hone::buffer<double> e;
  BOOST_TEST(e.empty());
  BOOST_TEST(e.data() == nullptr);
  hone::buffer<double> z(0);
  BOOST_TEST(z.empty());

  hone::buffer<int> a(10, 3);
  int* raw = a.data();
  hone::buffer<int> b(std::move(a));
  BOOST_TEST(b.data() == raw);
  BOOST_TEST(a.empty());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  hone::buffer<int> c(4, 1);
  c = std::move(b);
  BOOST_TEST(c.data() == raw);
  BOOST_TEST(c.size() == 10u);
  BOOST_TEST(c[9] == 3);
}

BOOST_AUTO_TEST_CASE(buffer_rejects_impossible_sizes) {
  // A negative count converted to size_t must be a clear error, not a crash.
  const auto negative = static_cast<std::size_t>(-5);
  BOOST_CHECK_THROW(hone::buffer<float>{negative}, hone::config_error);
  try {
    hone::buffer<float> b(negative);
  } catch (const hone::config_error& e) {
    BOOST_TEST(std::string(e.what()).find("negative") != std::string::npos);
  }
  // More than any machine has: allocation_error carrying the size asked for.
  const std::size_t huge = std::numeric_limits<std::size_t>::max() / 8;
  try {
    hone::buffer<float> b(huge);
    BOOST_FAIL("allocation of " << huge << " floats should fail");
  } catch (const hone::allocation_error& e) {
    BOOST_TEST(e.bytes() == huge * sizeof(float));
    BOOST_TEST(std::string(e.what()).find("host memory") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(pinned_host_buffer_works_without_cuda) {
  hone::buffer<float, hone::pinned_host_space> b(100, 2.0f);
  BOOST_TEST(b[99] == 2.0f);
  BOOST_TEST(aligned64(b.data()));
}

BOOST_AUTO_TEST_CASE(arena_layout_aligns_every_slot) {
  hone::arena_layout layout(sizeof(float));
  const auto w = layout.add("layer0.weight", 33);
  const auto bias = layout.add("layer0.bias", 5);
  const auto w1 = layout.add("layer1.weight", 16);
  BOOST_TEST(layout.size() == 3u);
  BOOST_TEST(layout[w].offset == 0u);
  BOOST_TEST(layout[bias].offset == 48u);  // 33 rounded up to 16 floats (64 bytes)
  BOOST_TEST(layout[w1].offset == 64u);
  BOOST_TEST(layout.total() == 80u);
  BOOST_TEST(layout.find("layer0.bias") == bias);
  BOOST_CHECK_THROW((void)layout.find("nope"), hone::config_error);
  BOOST_CHECK_THROW(layout.add("layer0.bias", 3), hone::config_error);

  hone::arena_layout bytes(3);  // element size not dividing 64: packed, no padding
  bytes.add("a", 5);
  BOOST_TEST(bytes.add("b", 2) == 1u);
  BOOST_TEST(bytes[1].offset == 5u);
}

BOOST_AUTO_TEST_CASE(arena_views_are_disjoint_and_padding_zero) {
  hone::arena_layout layout(sizeof(float));
  layout.add("a", 7);
  layout.add("b", 20);
  layout.add("c", 1);
  hone::arena<float> arena(layout);
  for (std::size_t i = 0; i < arena.size(); ++i) {
    auto v = arena.view(i);
    BOOST_TEST(aligned64(v.data()));
    for (auto& x : v) x = static_cast<float>(i + 1);
  }
  BOOST_TEST(arena.view("b").size() == 20u);
  BOOST_TEST(arena.view("b")[19] == 2.0f);
  // Sum over the whole arena sees only the slots: padding stayed zero.
  float sum = 0;
  for (float x : arena.all()) sum += x;
  BOOST_TEST(sum == 7 * 1.0f + 20 * 2.0f + 1 * 3.0f);
  const auto& carena = arena;
  BOOST_TEST(carena.view(std::size_t{2})[0] == 3.0f);
}

BOOST_AUTO_TEST_CASE(device_span_basics) {
  float data[6] = {0, 1, 2, 3, 4, 5};
  hone::device_span<float> s(data, 6);
  hone::device_span<const float> cs = s;
  BOOST_TEST(cs.size() == 6u);
  BOOST_TEST(cs.size_bytes() == 24u);
  auto sub = s.subspan(2, 3);
  BOOST_TEST(sub[0] == 2.0f);
  BOOST_TEST(sub.size() == 3u);
  float total = 0;
  for (float x : sub) total += x;
  BOOST_TEST(total == 9.0f);
  BOOST_TEST(hone::device_span<int>{}.empty());
}

BOOST_AUTO_TEST_CASE(errors_form_a_hierarchy) {
  BOOST_CHECK_THROW(hone::require(false, "zero batch size"), hone::config_error);
  BOOST_CHECK_NO_THROW(hone::require(true, "never"));
  try {
    hone::require(false, "zero batch size");
  } catch (const hone::error& e) {  // caught by the base
    BOOST_TEST(std::string(e.what()) == "zero batch size");
  }
}

BOOST_AUTO_TEST_CASE(hone_require_builds_its_message_only_on_failure) {
  int built = 0;
  const auto message = [&](int n) {
    ++built;
    return "bad size " + std::to_string(n) + ", " + std::to_string(n + 1);
  };
  BOOST_CHECK_NO_THROW(HONE_REQUIRE(3 > 2, message(1)));
  BOOST_TEST(built == 0);
  try {
    HONE_REQUIRE(2 > 3, message(4));
    BOOST_FAIL("HONE_REQUIRE(false, ...) did not throw");
  } catch (const hone::config_error& e) {
    BOOST_TEST(std::string(e.what()) == "bad size 4, 5");
  }
  BOOST_TEST(built == 1);
  // A literal, a std::string and a std::string_view are all messages; used as one statement.
  if (built == 1)
    HONE_REQUIRE(true, "never");
  else
    HONE_REQUIRE(true, std::string("never"));
  BOOST_CHECK_THROW(HONE_REQUIRE(false, std::string_view("view")), hone::config_error);
}

BOOST_AUTO_TEST_CASE(cuda_error_keeps_its_code) {
  const hone::cuda_error ce("cudaMalloc failed", 2);
  BOOST_TEST(ce.code() == 2);
  const std::runtime_error& base = ce;
  BOOST_TEST(std::string(base.what()) == "cudaMalloc failed");
}
