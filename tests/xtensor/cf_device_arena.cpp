// Must not compile: an xtensor view of an arena in a space the host cannot read.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <hone/core/arena.hpp>
#include <hone/xtensor/adapt.hpp>

struct far_space {};  // stands for device memory: not host-accessible
template <>
struct hone::space_traits<far_space> {
  static constexpr bool host_accessible = false;
  static void* allocate(std::size_t bytes) { return std::malloc(bytes); }
  static void deallocate(void* p, std::size_t) noexcept { std::free(p); }
  static void zero(void* p, std::size_t bytes) { std::memset(p, 0, bytes); }
};

int main() {
  hone::arena_layout layout(sizeof(float));
  layout.add("w", 4);
  hone::arena<float, far_space> a(layout);
  auto v = hone::xtensor::adapt(a, "w");
  return static_cast<int>(v.size());
}
