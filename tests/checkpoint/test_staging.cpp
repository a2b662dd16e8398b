// The snapshot's staging extension points that device sources (hone/checkpoint/cuda/snapshot.cuh)
// build on, checked on the host: add_uninitialized() places tensors where add() would and the
// files hold what the caller wrote there; reserve() makes room so that later adds do not move the
// buffer; spare() is the room past the tensors; set_allocator() moves the contents to another
// allocator (a counting one here) and the writer keeps that allocator and the same buffer from
// save to save; bad shapes and file names are refused.
#define BOOST_TEST_MODULE hone_checkpoint_staging
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <hone/checkpoint/writer.hpp>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"

namespace fs = std::filesystem;
namespace ck = hone::checkpoint;
namespace io = hone::io;

namespace {
using temp_root = hone_test::temp_dir;

/// An allocator that counts its live allocations (host memory underneath).
struct counting {
  static inline int live = 0;
  static inline int total = 0;
  static void* allocate(std::size_t n) {
    if (n == 0) return nullptr;
    ++live;
    ++total;
    return hone::space_traits<hone::host_space>::allocate(n);
  }
  static void deallocate(void* p, std::size_t n) noexcept {
    if (p == nullptr) return;
    --live;
    hone::space_traits<hone::host_space>::deallocate(p, n);
  }
  static ck::staging_allocator allocator() { return {&allocate, &deallocate, false}; }
};

std::vector<float> ramp(std::size_t n, float start) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + 0.25f * static_cast<float>(i);
  return v;
}

std::vector<float> read_f32(const fs::path& file, const std::string& name) {
  return ck::tensor_file::open(file).read_as<float>(name);
}
}  // namespace

BOOST_AUTO_TEST_CASE(add_uninitialized_reserve_and_spare) {
  ck::snapshot s;
  const std::vector<float> a = ramp(3, 1.0f);
  s.add(ck::files::weights, "a", {3}, a);  // 12 bytes: the next tensor starts at 64
  BOOST_TEST(s.bytes() == 12u);
  BOOST_TEST(ck::snapshot::aligned(12) == 64u);
  BOOST_TEST(ck::snapshot::aligned(64) == 64u);
  BOOST_TEST(ck::snapshot::aligned(0) == 0u);

  s.reserve(ck::snapshot::aligned(40) + ck::snapshot::aligned(8) + 100);
  const std::byte* base = s.staging_data();
  const std::size_t capacity = s.capacity();
  BOOST_TEST(capacity >= 64u + 64u + 64u + 100u);
  const std::span<std::byte> b =
      s.add_uninitialized(ck::files::weights, "b", io::dtype::f32, {2, 5}, 40);
  BOOST_TEST(static_cast<const void*>(b.data()) == static_cast<const void*>(base + 64));
  BOOST_TEST(b.size() == 40u);
  const std::span<std::byte> c =
      s.add_uninitialized(ck::files::optimizer, "c", io::dtype::i64, {1}, 8);
  BOOST_TEST(static_cast<const void*>(c.data()) == static_cast<const void*>(base + 128));
  BOOST_TEST(s.staging_data() == base);  // reserved: not moved
  BOOST_TEST(s.capacity() == capacity);
  BOOST_TEST(s.bytes() == 136u);
  const std::span<std::byte> spare = s.spare();
  BOOST_TEST(static_cast<const void*>(spare.data()) == static_cast<const void*>(base + 192));
  BOOST_TEST(spare.size() == capacity - 192);
  BOOST_TEST(spare.size() >= 100u);

  const std::vector<float> bv = ramp(10, -3.0f);
  std::memcpy(b.data(), bv.data(), 40);
  const std::int64_t cv = -1234567890123;
  std::memcpy(c.data(), &cv, 8);
  temp_root root;
  const fs::path dir =
      ck::write_snapshot(root.path, 7, s, {.compression = std::nullopt, .sync = false});
  BOOST_TEST(read_f32(dir / ck::files::weights, "a") == a);
  BOOST_TEST(read_f32(dir / ck::files::weights, "b") == bv);
  const ck::tensor_file f = ck::tensor_file::open(dir / ck::files::weights);
  BOOST_TEST((f.at("b").shape == ck::shape_type{2, 5}));
  const auto ci = ck::tensor_file::open(dir / ck::files::optimizer).read_as<std::int64_t>("c");
  BOOST_TEST(ci.size() == 1u);
  BOOST_TEST(ci.at(0) == cv);
}

BOOST_AUTO_TEST_CASE(add_uninitialized_refuses_bad_shapes_and_names) {
  ck::snapshot s;
  BOOST_CHECK_THROW((void)s.add_uninitialized(ck::files::weights, "x", io::dtype::f32, {3}, 8),
                    hone::config_error);
  BOOST_CHECK_THROW(
      (void)s.add_uninitialized(ck::files::weights, "x", io::dtype::f32, {1ull << 62, 8}, 8),
      hone::config_error);
  BOOST_CHECK_THROW((void)s.add_uninitialized(ck::files::state, "x", io::dtype::f32, {2}, 8),
                    hone::config_error);
  BOOST_CHECK_THROW((void)s.add_uninitialized("../x.safetensors", "x", io::dtype::f32, {2}, 8),
                    hone::config_error);
  BOOST_TEST(s.bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(set_allocator_keeps_the_contents_and_the_writer_keeps_the_buffer) {
  const int before = counting::live;
  {
    ck::snapshot s;
    BOOST_TEST(s.allocator().allocate == ck::staging_allocator{}.allocate);
    BOOST_TEST(!s.allocator().page_locked);
    const std::vector<float> a = ramp(100, 2.0f);
    s.add(ck::files::weights, "a", {100}, a);
    s.set_allocator(counting::allocator());
    BOOST_TEST(counting::live == before + 1);
    BOOST_TEST(s.allocator().allocate == &counting::allocate);
    const std::byte* moved = s.staging_data();
    s.set_allocator(counting::allocator());  // the same allocator: nothing happens
    BOOST_TEST(s.staging_data() == moved);
    BOOST_TEST(counting::live == before + 1);
    std::vector<float> back(100);
    std::memcpy(back.data(), s.staging_data(), 400);
    BOOST_TEST(back == a);
    // Growing stays with the allocator (the old block is freed).
    const std::vector<float> big = ramp(10000, 0.0f);
    s.add(ck::files::weights, "big", {10000}, big);
    BOOST_TEST(counting::live == before + 1);
    BOOST_TEST(s.allocator().allocate == &counting::allocate);
    temp_root root;
    const fs::path dir =
        ck::write_snapshot(root.path, 1, s, {.compression = std::nullopt, .sync = false});
    BOOST_TEST(read_f32(dir / ck::files::weights, "a") == a);
    BOOST_TEST(read_f32(dir / ck::files::weights, "big") == big);
    // of<Space>() of a host space: its allocation functions; pinned only with the CUDA runtime.
    const auto h = ck::staging_allocator::of<hone::host_space>();
    BOOST_TEST(h.allocate == ck::staging_allocator{}.allocate);
    BOOST_TEST(!h.page_locked);
    const auto p = ck::staging_allocator::of<hone::pinned_host_space>();
    BOOST_TEST(p.page_locked == hone::space_traits<hone::pinned_host_space>::pinned());
    s.set_allocator(p);
    BOOST_TEST(counting::live == before);
    BOOST_TEST(s.allocator().allocate == p.allocate);
  }
  BOOST_TEST(counting::live == before);

  // The writer's snapshot keeps the allocator a save chose, and the same buffer.
  temp_root root;
  ck::checkpoint_writer w({.root = root.path, .async = true, .sync = false});
  const std::byte* first = nullptr;
  const int allocations = counting::total;
  for (std::uint64_t step = 1; step <= 3; ++step) {
    const std::vector<float> v = ramp(5000, static_cast<float>(step));
    BOOST_TEST(w.save(step, [&](ck::snapshot& s) {
      s.set_allocator(counting::allocator());
      s.reserve(ck::snapshot::aligned(v.size() * 4));
      const std::span<std::byte> dst =
          s.add_uninitialized(ck::files::weights, "v", io::dtype::f32, {v.size()}, v.size() * 4);
      std::memcpy(dst.data(), v.data(), dst.size());
      s.state.step = step;
    }));
    w.wait();
    BOOST_TEST(read_f32(*w.last_committed() / ck::files::weights, "v") == v);
    if (step == 1) first = w.staging().staging_data();
    BOOST_TEST(w.staging().staging_data() == first);
  }
  BOOST_TEST(counting::total == allocations + 1);  // one allocation for three saves
}
