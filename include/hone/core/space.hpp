// hone/core/space.hpp: memory spaces and the traits that allocate in them.
//
// A space is an empty tag type. space_traits<Space> says whether its memory is reachable from the
// host and how to allocate it. Third-party spaces plug in by specializing space_traits (mp-units
// style); the primary template stops compilation with a sentence instead of failing deep inside.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <type_traits>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN

/// Pageable host memory, 64-byte aligned (one cache line, one AVX-512 vector).
struct host_space {};
/// Page-locked host memory for fast, asynchronous host<->device copies. Allocated with
/// cudaHostAlloc when the CUDA runtime is part of the build; otherwise it falls back to ordinary
/// 64-byte aligned memory (space_traits<pinned_host_space>::pinned() says which).
struct pinned_host_space {};
/// Device memory of the current CUDA device (cudaMalloc). Usable only with the hone::cuda target.
struct cuda_space {};

/// The alignment, in bytes, of every host allocation hone makes.
inline constexpr std::size_t host_alignment = 64;

template <class Space>
struct space_traits {
  static_assert(sizeof(Space) == 0,
                "hone: no space_traits specialization for this space. Use hone::host_space, "
                "hone::pinned_host_space or hone::cuda_space (the latter needs the hone::cuda "
                "target), or specialize hone::space_traits<YourSpace> with allocate/deallocate.");
};

namespace detail {
inline void* aligned_host_allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = ::operator new (bytes, std::align_val_t{host_alignment}, std::nothrow);
  if (p == nullptr) {
    throw allocation_error("hone: could not allocate " + std::to_string(bytes) +
                               " bytes of host memory; reduce the size or free memory first",
                           bytes);
  }
  return p;
}
inline void aligned_host_deallocate(void* p) noexcept {
  if (p != nullptr) ::operator delete (p, std::align_val_t{host_alignment});
}
}  // namespace detail

template <>
struct space_traits<host_space> {
  static constexpr bool host_accessible = true;
  static constexpr const char* name = "host";
  static void* allocate(std::size_t bytes) { return detail::aligned_host_allocate(bytes); }
  static void deallocate(void* p, std::size_t /*bytes*/) noexcept {
    detail::aligned_host_deallocate(p);
  }
  static void zero(void* p, std::size_t bytes) {
    if (bytes != 0) std::memset(p, 0, bytes);
  }
};

/// A type is a memory space when space_traits describes it completely.
template <class S>
concept memory_space = requires(std::size_t n, void* p) {
  { space_traits<S>::host_accessible } -> std::convertible_to<bool>;
  { space_traits<S>::allocate(n) } -> std::same_as<void*>;
  space_traits<S>::deallocate(p, n);
  space_traits<S>::zero(p, n);
};

template <class S>
inline constexpr bool host_accessible_v = space_traits<S>::host_accessible;

HONE_NAMESPACE_END

#if HONE_HAS_CUDA_RUNTIME
#include "hone/core/cuda/space.hpp"
#else
HONE_NAMESPACE_BEGIN
template <>
struct space_traits<pinned_host_space> {
  static constexpr bool host_accessible = true;
  static constexpr const char* name = "pinned host (fallback: pageable, no CUDA runtime)";
  static constexpr bool pinned() noexcept { return false; }
  static void* allocate(std::size_t bytes) { return detail::aligned_host_allocate(bytes); }
  static void deallocate(void* p, std::size_t /*bytes*/) noexcept {
    detail::aligned_host_deallocate(p);
  }
  static void zero(void* p, std::size_t bytes) {
    if (bytes != 0) std::memset(p, 0, bytes);
  }
};
HONE_NAMESPACE_END
#endif
