// tests/core/test_pinned_odr.hpp: what test_pinned_odr_host.cpp (compiled without the CUDA
// runtime) offers test_pinned_odr.cu.
#pragma once

#include <cstddef>

namespace pinned_odr::host {
/// space_traits<pinned_host_space>'s functions, called from a file without the CUDA runtime.
void* allocate(std::size_t bytes);
void deallocate(void* p, std::size_t bytes) noexcept;
bool pinned() noexcept;
bool page_locked(const void* p) noexcept;
const char* name() noexcept;
}  // namespace pinned_odr::host
