// hone/xtensor/adapt.hpp: xtensor views of hone's host memory, without a copy.
//
//   #include <hone/xtensor/adapt.hpp>           // CMake: link hone::xtensor
//   namespace hx = hone::xtensor;
//
//   auto w = hx::adapt(arena, "fc1.weight", {784, 256});   // xt::xtensor_adaptor, rank 2
//   auto b = hx::adapt(arena.view("fc1.bias"));             // rank 1 (any contiguous lvalue range)
//   auto v = hx::value<2>(param);  auto g = hx::grad(param);  // a parameter's shape (fixed or not)
//   auto obs = hx::column<"obs">(batch);                    // replay batch: {rows, 4} for float[4]
//   auto is = hx::weights(batch);                           // {rows} importance weights
//   w += 0.5f;  // writes the arena
//
// Each function returns an xt::xtensor_adaptor (a fixed rank: a shape given as {d0, d1, ...} or
// std::array) or an xt::xarray_adaptor (a rank known at run time: a std::vector shape, a
// parameter's `shape`) over the same memory, row-major whatever XTENSOR_DEFAULT_LAYOUT says.
// Writing through a view writes hone's memory; a view of const memory is read-only. A view does not
// own what it shows: it is valid while the arena, buffer, model or batch is alive and not resized
// (replay_batch::resize beyond its capacity moves the columns). Only host-accessible memory can be
// viewed (host_space, pinned_host_space); a device view is a compile error that says so. A shape
// whose dimensions do not multiply to the memory's size is a hone::config_error.
//
// The element type is the memory's: float, double, integers, bool, and hone::bfloat16 / hone::half
// for storage (convert with xt::cast<float>(view) before arithmetic).
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <iterator>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>
#include <xtensor/xadapt.hpp>

#include "hone/core/arena.hpp"
#include "hone/core/config.hpp"
#include "hone/core/device_span.hpp"
#include "hone/core/error.hpp"
#include "hone/core/model.hpp"
#include "hone/core/space.hpp"
#include "hone/rl/batch.hpp"
#include "hone/rl/transition.hpp"

HONE_NAMESPACE_BEGIN
namespace xtensor {

/// The view of N dimensions over T that the functions below return for a fixed rank.
template <class T, std::size_t N>
using tensor_view = decltype(::xt::adapt<::xt::layout_type::row_major>(
    std::declval<T*>(), std::size_t{}, ::xt::no_ownership(),
    std::declval<const std::array<std::size_t, N>&>()));

/// The view over T whose rank is known at run time (a std::vector shape, a parameter's shape).
template <class T>
using array_view = decltype(::xt::adapt<::xt::layout_type::row_major>(
    std::declval<T*>(), std::size_t{}, ::xt::no_ownership(),
    std::declval<const std::vector<std::size_t>&>()));

namespace detail {

template <class R>
inline constexpr bool is_device_span_v = false;
template <class T>
inline constexpr bool is_device_span_v<device_span<T>> = true;

/// Host memory a view may alias: a contiguous, sized range that outlives the call (an lvalue, or a
/// borrowed view such as std::span), not a device_span.
template <class R>
concept viewable_range = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
    std::ranges::borrowed_range<R> && !is_device_span_v<std::remove_cvref_t<R>>;

template <class Shape>
std::string shape_text(const Shape& shape) {
  std::string s = "{";
  for (auto it = std::begin(shape); it != std::end(shape); ++it) {
    if (it != std::begin(shape)) s += ", ";
    s += std::to_string(*it);
  }
  return s + "}";
}

template <class Shape>
std::size_t shape_size(const Shape& shape) {
  std::size_t n = 1;
  for (const auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

// Throws config_error when the shape does not cover `size` elements; what() names the memory
// (called only then).
template <class Shape, class What>
void check_shape(const Shape& shape, std::size_t size, const What& what) {
  if (shape_size(shape) != size) {
    throw config_error("hone::xtensor: the shape " + shape_text(shape) + " has " +
                       std::to_string(shape_size(shape)) + " elements, but " + what() + " holds " +
                       std::to_string(size) +
                       "; give a shape whose dimensions multiply to its size");
  }
}
inline std::string memory_text() {
  return "the memory";
}

template <class P>
auto describe(const P& p, const char* which) {
  return [&p, which] {
    return "the " + std::string(which) + " of parameter '" + std::string(std::string_view(p.name)) +
           "'";
  };
}

// The pointer goes in as a prvalue: xt::adapt keeps an lvalue pointer by reference (a view that
// would dangle once `data` goes out of scope), an rvalue by value.
template <class T, class Shape>
auto view(T* data, std::size_t size, const Shape& shape) {
  return ::xt::adapt<::xt::layout_type::row_major>(static_cast<T*>(data), size,
                                                   ::xt::no_ownership(), shape);
}

template <std::size_t N>
std::array<std::size_t, N> to_array(const std::size_t (&shape)[N]) {
  std::array<std::size_t, N> a{};
  for (std::size_t i = 0; i < N; ++i) a[i] = shape[i];
  return a;
}

template <class Space>
consteval void require_host_space() {
  static_assert(space_traits<Space>::host_accessible,
                "hone::xtensor: xtensor views need host-accessible memory, and this arena lives "
                "in a device space. Copy it to a host buffer first, or keep it in host_space or "
                "pinned_host_space.");
}

// Element type of a parameter-like record's value view.
template <class P>
using param_element_t = std::remove_pointer_t<decltype(std::declval<const P&>().value.data())>;

template <class P>
consteval void require_host_parameter() {
  static_assert(!is_device_span_v<std::remove_cvref_t<decltype(std::declval<const P&>().value)>>,
                "hone::xtensor::value/grad: this parameter's views are hone::device_span (device "
                "memory), which xtensor cannot read on the host. Copy the tensor to a host buffer "
                "first, or adapt a host model's parameters.");
}

template <class P, class View>
auto param_view(const P& p, const View& v, const char* which) {
  require_host_parameter<P>();
  std::vector<std::size_t> shape;
  for (const auto d : p.shape) shape.push_back(static_cast<std::size_t>(d));
  check_shape(shape, v.size(), describe(p, which));
  return view(v.data(), v.size(), shape);
}

template <std::size_t N, class P, class View>
auto param_view_fixed(const P& p, const View& v, const char* which) {
  require_host_parameter<P>();
  const auto rank = static_cast<std::size_t>(std::ranges::distance(p.shape));
  if (rank != N) {
    throw config_error("hone::xtensor::" + std::string(which) + "<" + std::to_string(N) +
                       ">: parameter '" + std::string(std::string_view(p.name)) + "' has rank " +
                       std::to_string(rank) + " (shape " + shape_text(p.shape) +
                       "); ask for that rank, or call " + which + "(p) for a run-time rank");
  }
  std::array<std::size_t, N> shape{};
  std::size_t i = 0;
  for (const auto d : p.shape) shape[i++] = static_cast<std::size_t>(d);
  check_shape(shape, v.size(), describe(p, which));
  return view(v.data(), v.size(), shape);
}

}  // namespace detail

// ---- spans, buffers, any contiguous host range
// ---------------------------------------------------

/// A rank-1 view of a contiguous host range (std::span, a host hone::buffer, an arena view, a
/// std::vector lvalue): shape {size}.
template <detail::viewable_range R>
auto adapt(R&& r) {
  const std::size_t n = std::ranges::size(r);
  return detail::view(std::ranges::data(r), n, std::array<std::size_t, 1>{n});
}

/// A view of rank N with the given shape, e.g. adapt(span, {rows, cols}).
template <detail::viewable_range R, std::size_t N>
auto adapt(R&& r, const std::size_t (&shape)[N]) {
  const std::size_t n = std::ranges::size(r);
  const auto s = detail::to_array(shape);
  detail::check_shape(s, n, detail::memory_text);
  return detail::view(std::ranges::data(r), n, s);
}
template <detail::viewable_range R, std::size_t N>
auto adapt(R&& r, const std::array<std::size_t, N>& shape) {
  const std::size_t n = std::ranges::size(r);
  detail::check_shape(shape, n, detail::memory_text);
  return detail::view(std::ranges::data(r), n, shape);
}
/// A view whose rank is the shape's length (known at run time).
template <detail::viewable_range R>
auto adapt(R&& r, const std::vector<std::size_t>& shape) {
  const std::size_t n = std::ranges::size(r);
  detail::check_shape(shape, n, detail::memory_text);
  return detail::view(std::ranges::data(r), n, shape);
}

/// Device memory cannot be viewed on the host.
template <class T, class... Shape>
void adapt(device_span<T>, Shape&&...) {
  static_assert(sizeof(T) == 0,
                "hone::xtensor::adapt: a hone::device_span views device memory, which xtensor "
                "cannot read on the host. Copy it to a host buffer first.");
}

// ---- arenas ------------------------------------------------------------------------------------

/// The whole arena, padding included: rank 1, shape {layout().total()}.
template <class T, class Space>
auto adapt(arena<T, Space>& a) {
  detail::require_host_space<Space>();
  return adapt(a.all());
}
template <class T, class Space>
auto adapt(const arena<T, Space>& a) {
  detail::require_host_space<Space>();
  return adapt(a.all());
}

/// One slot of an arena (by index or name), rank 1 or with a shape: adapt(a, "fc1.weight", {k, n}).
template <class T, class Space, class Key, class... Shape>
requires(std::integral<Key> || std::convertible_to<const Key&, std::string_view>) auto adapt(
    arena<T, Space>& a, const Key& slot, Shape&&... shape) {
  detail::require_host_space<Space>();
  if constexpr (std::integral<Key>) {
    return adapt(a.view(static_cast<std::size_t>(slot)), std::forward<Shape>(shape)...);
  } else {
    return adapt(a.view(std::string_view(slot)), std::forward<Shape>(shape)...);
  }
}
template <class T, class Space, class Key, class... Shape>
requires(std::integral<Key> || std::convertible_to<const Key&, std::string_view>) auto adapt(
    const arena<T, Space>& a, const Key& slot, Shape&&... shape) {
  detail::require_host_space<Space>();
  if constexpr (std::integral<Key>) {
    return adapt(a.view(static_cast<std::size_t>(slot)), std::forward<Shape>(shape)...);
  } else {
    return adapt(a.view(std::string_view(slot)), std::forward<Shape>(shape)...);
  }
}
// Braced shapes cannot go through the forwarding pack above: adapt(a, "w", {k, n}).
template <class T, class Space, class Key, std::size_t N>
requires(std::integral<Key> || std::convertible_to<const Key&, std::string_view>) auto adapt(
    arena<T, Space>& a, const Key& slot, const std::size_t (&shape)[N]) {
  return adapt(a, slot, detail::to_array(shape));
}
template <class T, class Space, class Key, std::size_t N>
requires(std::integral<Key> || std::convertible_to<const Key&, std::string_view>) auto adapt(
    const arena<T, Space>& a, const Key& slot, const std::size_t (&shape)[N]) {
  return adapt(a, slot, detail::to_array(shape));
}

// ---- parameters --------------------------------------------------------------------------------

/// A parameter's value with its shape, rank known at run time (hone::parameter or any record of
/// the model concept: name, shape, value, grad).
template <parameter_like P>
auto value(const P& p) {
  return detail::param_view(p, p.value, "value");
}
/// The same with a fixed rank N (faster indexing); throws config_error if the rank differs.
template <std::size_t N, parameter_like P>
auto value(const P& p) {
  return detail::param_view_fixed<N>(p, p.value, "value");
}
/// A parameter's gradient with its shape.
template <parameter_like P>
auto grad(const P& p) {
  return detail::param_view(p, p.grad, "grad");
}
template <std::size_t N, parameter_like P>
auto grad(const P& p) {
  return detail::param_view_fixed<N>(p, p.grad, "grad");
}

// ---- replay batches ----------------------------------------------------------------------------

/// The column of field Name: shape {rows, field shape...} (a scalar field: {rows}; a member<>
/// array: {rows, elements}).
template <fixed_string Name, class Transition>
auto column(replay_batch<Transition>& b) {
  constexpr std::size_t i = Transition::template index_of<Name>();
  using F = typename Transition::template field_at<i>;
  std::array<std::size_t, 1 + F::shape.size()> shape{};
  shape[0] = b.size();
  for (std::size_t d = 0; d < F::shape.size(); ++d) shape[d + 1] = F::shape[d];
  const auto col = b.template column<i>();
  return detail::view(col.data(), col.size(), shape);
}
template <fixed_string Name, class Transition>
auto column(const replay_batch<Transition>& b) {
  constexpr std::size_t i = Transition::template index_of<Name>();
  using F = typename Transition::template field_at<i>;
  std::array<std::size_t, 1 + F::shape.size()> shape{};
  shape[0] = b.size();
  for (std::size_t d = 0; d < F::shape.size(); ++d) shape[d + 1] = F::shape[d];
  const auto col = b.template column<i>();
  return detail::view(col.data(), col.size(), shape);
}

/// Importance-sampling weight of each row: shape {rows}.
template <class Transition>
auto weights(replay_batch<Transition>& b) {
  return adapt(b.weights());
}
template <class Transition>
auto weights(const replay_batch<Transition>& b) {
  return adapt(b.weights());
}
/// The key of each row (pass them back with new priorities): shape {rows}.
template <class Transition>
auto keys(replay_batch<Transition>& b) {
  return adapt(b.keys());
}
template <class Transition>
auto keys(const replay_batch<Transition>& b) {
  return adapt(b.keys());
}

}  // namespace xtensor
HONE_NAMESPACE_END
