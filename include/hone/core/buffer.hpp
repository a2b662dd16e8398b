// hone/core/buffer.hpp: hone::buffer<T, Space>, an owning, aligned, uninitialized array in one
// memory space (host: 64-byte aligned; pinned host: page-locked when CUDA is present; cuda: device
// memory). Move-only. Views are std::span on the host and hone::device_span on the device.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "hone/core/config.hpp"
#include "hone/core/device_span.hpp"
#include "hone/core/error.hpp"
#include "hone/core/space.hpp"

HONE_NAMESPACE_BEGIN

template <class T, class Space = host_space>
class buffer {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "hone::buffer holds raw, uninitialized storage that is copied with memcpy and "
                "cudaMemcpy: its element type must be trivially copyable and trivially "
                "destructible (use float, hone::bfloat16, a POD struct, ...).");
  static_assert(memory_space<Space>,
                "hone::buffer: Space is not a memory space; specialize hone::space_traits.");

 public:
  using value_type = T;
  using space_type = Space;
  static constexpr bool host_accessible = space_traits<Space>::host_accessible;
  using view_type = span_for<T, host_accessible>;
  using const_view_type = span_for<const T, host_accessible>;

  buffer() noexcept = default;
  /// Allocates `count` elements, uninitialized. Throws allocation_error when memory is short and
  /// config_error when count * sizeof(T) overflows.
  explicit buffer(std::size_t count) : size_(count) {
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      throw config_error("hone::buffer: " + std::to_string(count) +
                         " elements overflow the addressable size; the count is probably a "
                         "negative number converted to size_t");
    }
    data_ = static_cast<T*>(space_traits<Space>::allocate(count * sizeof(T)));
  }
  /// Allocates `count` elements, each set to `value` (host-accessible spaces only).
  buffer(std::size_t count, const T& value) requires host_accessible : buffer(count) {
    std::fill_n(data_, size_, value);
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  buffer(buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  buffer& operator=(buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~buffer() { release(); }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  [[nodiscard]] view_type view() noexcept { return view_type(data_, size_); }
  [[nodiscard]] const_view_type view() const noexcept { return const_view_type(data_, size_); }

  T& operator[](std::size_t i) noexcept requires host_accessible { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept requires host_accessible { return data_[i]; }
  T* begin() noexcept requires host_accessible { return data_; }
  T* end() noexcept requires host_accessible { return data_ + size_; }
  const T* begin() const noexcept requires host_accessible { return data_; }
  const T* end() const noexcept requires host_accessible { return data_ + size_; }

 private:
  void release() noexcept {
    space_traits<Space>::deallocate(data_, size_ * sizeof(T));
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

HONE_NAMESPACE_END
