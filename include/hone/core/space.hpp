// hone/core/space.hpp: memory spaces and the traits that allocate in them.
//
// A space is an empty tag type. space_traits<Space> says whether its memory is reachable from the
// host and how to allocate it. Third-party spaces plug in by specializing space_traits (mp-units
// style); the primary template stops compilation with a sentence instead of failing deep inside.
#pragma once

#include <atomic>
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
/// Page-locked host memory for fast, asynchronous host<->device copies: cudaHostAlloc when the
/// program contains a translation unit that includes hone/core/cuda/space.hpp (any .cu file using
/// hone, or a .cpp file built with the hone::cuda target), ordinary 64-byte aligned memory
/// otherwise. One definition in every translation unit; the choice is made at run time (see
/// space_traits<pinned_host_space> below).
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

HONE_NAMESPACE_BEGIN
namespace detail {
/// Where pinned_host_space allocations come from. `allocate` (bytes > 0) throws allocation_error
/// and returns memory aligned to at least host_alignment; `deallocate` frees what it returned.
struct pinned_host_backend {
  void* (*allocate)(std::size_t bytes);
  void (*deallocate)(void* p) noexcept;
  bool page_locked;
  const char* name;
};
inline void* pageable_allocate(std::size_t bytes) {
  return aligned_host_allocate(bytes);
}
inline void pageable_deallocate(void* p) noexcept {
  aligned_host_deallocate(p);
}
/// The backend until a CUDA translation unit installs its own: pageable, 64-byte aligned.
inline constexpr pinned_host_backend pageable_pinned_backend{
    &pageable_allocate, &pageable_deallocate, false, "pageable (no CUDA runtime)"};
/// The backend of new pinned_host_space allocations (constant-initialized, so it is valid during
/// every static initialization).
inline std::atomic<const pinned_host_backend*> pinned_backend{&pageable_pinned_backend};

/// Makes `b` (which must live for the whole program) the backend of later pinned_host_space
/// allocations; allocations made before keep theirs. Returns true (for use as an initializer).
inline bool install_pinned_host_backend(const pinned_host_backend& b) noexcept {
  pinned_backend.store(&b, std::memory_order_release);
  return true;
}
}  // namespace detail

/// pinned_host_space has this one definition in every translation unit, with or without CUDA, so
/// that memory allocated in one file and freed in another is always freed by the function that
/// allocated it (a definition that changed with HONE_HAS_CUDA_RUNTIME would break the one
/// definition rule, and the linker would pair cudaHostAlloc with operator delete or the reverse).
/// Allocations go through the installed backend: cudaHostAlloc once a translation unit including
/// hone/core/cuda/space.hpp has been initialized (it installs the CUDA backend during static
/// initialization), 64-byte aligned pageable memory before that and in programs without CUDA.
/// Each allocation records its backend in a 64-byte header in front of the memory it returns,
/// and deallocate() hands it back to that backend, whatever was installed since.
template <>
struct space_traits<pinned_host_space> {
  static constexpr bool host_accessible = true;
  static constexpr const char* name = "pinned host";
  /// Bytes in front of each allocation (keeps the returned memory host_alignment aligned).
  static constexpr std::size_t header_bytes = host_alignment;

  /// Whether new allocations are page-locked (a CUDA backend is installed).
  [[nodiscard]] static bool pinned() noexcept { return backend().page_locked; }
  /// The backend of new allocations.
  [[nodiscard]] static const detail::pinned_host_backend& backend() noexcept {
    return *detail::pinned_backend.load(std::memory_order_acquire);
  }
  /// The backend that allocated `p` (a non-null result of allocate()).
  [[nodiscard]] static const detail::pinned_host_backend& backend_of(const void* p) noexcept {
    const detail::pinned_host_backend* b = nullptr;
    std::memcpy(&b, static_cast<const std::byte*>(p) - header_bytes, sizeof(b));
    return *b;
  }
  /// Whether the allocation `p` (a non-null result of allocate()) is page-locked.
  [[nodiscard]] static bool page_locked(const void* p) noexcept {
    return backend_of(p).page_locked;
  }

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    if (bytes > std::size_t(-1) - header_bytes) {
      throw allocation_error("hone: " + std::to_string(bytes) +
                                 " bytes of pinned host memory cannot be addressed; the size is "
                                 "probably a negative number converted to size_t",
                             bytes);
    }
    const detail::pinned_host_backend* b = &backend();
    auto* base = static_cast<std::byte*>(b->allocate(bytes + header_bytes));
    std::memcpy(base, &b, sizeof(b));
    return base + header_bytes;
  }
  static void deallocate(void* p, std::size_t /*bytes*/) noexcept {
    if (p == nullptr) return;
    backend_of(p).deallocate(static_cast<std::byte*>(p) - header_bytes);
  }
  static void zero(void* p, std::size_t bytes) {
    if (bytes != 0) std::memset(p, 0, bytes);
  }
};
HONE_NAMESPACE_END

// With the CUDA runtime: space_traits<cuda_space>, and the CUDA backend of pinned_host_space.
#if HONE_HAS_CUDA_RUNTIME
#include "hone/core/cuda/space.hpp"
#endif
