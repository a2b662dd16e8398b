// hone/core/device_span.hpp: a pointer and a length usable in host and device code. On the host,
// std::span is the view type; device_span is what kernels take (std::span is not usable in device
// code with every toolkit) and what views of device memory are.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN

template <class T>
class device_span {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  using size_type = std::size_t;

  constexpr device_span() noexcept = default;
  HONE_HOST_DEVICE constexpr device_span(T* data, std::size_t size) noexcept
      : data_(data), size_(size) {}
  /// A device_span<const T> from a device_span<T>.
  template <class U>
  requires std::is_convertible_v<U (*)[], T (*)[]> HONE_HOST_DEVICE constexpr device_span(
      device_span<U> other) noexcept
      : data_(other.data()), size_(other.size()) {}

  HONE_HOST_DEVICE constexpr T* data() const noexcept { return data_; }
  HONE_HOST_DEVICE constexpr std::size_t size() const noexcept { return size_; }
  HONE_HOST_DEVICE constexpr std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  HONE_HOST_DEVICE constexpr bool empty() const noexcept { return size_ == 0; }
  HONE_HOST_DEVICE constexpr T& operator[](std::size_t i) const noexcept { return data_[i]; }
  HONE_HOST_DEVICE constexpr T* begin() const noexcept { return data_; }
  HONE_HOST_DEVICE constexpr T* end() const noexcept { return data_ + size_; }
  /// Elements [offset, offset + count). The caller guarantees the range is inside the span.
  HONE_HOST_DEVICE constexpr device_span subspan(std::size_t offset,
                                                 std::size_t count) const noexcept {
    return {data_ + offset, count};
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// The view type of a space: std::span for host-accessible memory, device_span otherwise.
template <class T, bool HostAccessible>
using span_for = std::conditional_t<HostAccessible, std::span<T>, device_span<T>>;

HONE_NAMESPACE_END
