// The host half of test_pinned_odr: a file compiled without the CUDA runtime (g++ or clang, the
// hone target only), linked into the same program as a .cu file. Its pinned_host_space is the very
// same definition as the .cu file's; allocations cross between the two files in both directions.
#include <cstddef>
#include <hone/core/space.hpp>

#include "test_pinned_odr.hpp"

static_assert(!HONE_HAS_CUDA_RUNTIME,
              "test_pinned_odr_host.cpp must be compiled without the CUDA runtime (link hone::hone "
              "only, not hone::cuda), or it does not test what it is for.");

namespace pinned_odr::host {
using traits = hone::space_traits<hone::pinned_host_space>;
void* allocate(std::size_t bytes) {
  return traits::allocate(bytes);
}
void deallocate(void* p, std::size_t bytes) noexcept {
  traits::deallocate(p, bytes);
}
bool pinned() noexcept {
  return traits::pinned();
}
bool page_locked(const void* p) noexcept {
  return traits::page_locked(p);
}
const char* name() noexcept {
  return traits::name;
}
}  // namespace pinned_odr::host
