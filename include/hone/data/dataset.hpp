// hone/data/dataset.hpp: the dataset concept. A user's own dataset type plugs into hone's data
// pipeline with two const members:
//
//   std::size_t size() const;                    the number of samples
//   and either
//   using buffer_type = ...;                     a caller-provided buffer, reused across calls,
//   void get(std::size_t i, buffer_type&) const; that get() fills with sample i
//   or
//   View get(std::size_t i) const;               sample i as a value or view (a span, a
//                                                string_view into a mapping), not void
//
// Both members are const: the loader reads one dataset object from several threads. The datasets
// of this module (line_dataset, megatron_dataset<T>) satisfy it. `static_assert(
// hone::data::check_dataset<MyData>())` says in a sentence which member is missing.
#pragma once

#include <concepts>
#include <cstddef>
#include <type_traits>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace data {

/// `d.size()` on a const dataset, convertible to std::size_t.
template <class D>
concept dataset_has_size = requires(const D& d) {
  { d.size() } -> std::convertible_to<std::size_t>;
};

/// `d.get(i, buffer)` on a const dataset, with `typename D::buffer_type` as the buffer.
template <class D>
concept dataset_has_buffer_get = requires {
  typename D::buffer_type;
}
&&requires(const D& d, std::size_t i, typename D::buffer_type& buffer) {
  d.get(i, buffer);
};

/// `d.get(i)` on a const dataset, returning something (a value or a view).
template <class D>
concept dataset_has_view_get = requires(const D& d, std::size_t i) {
  d.get(i);
  requires !std::is_void_v<decltype(d.get(i))>;
};

/// A dataset: size() and a get() into a caller's buffer or returning a view (header comment).
template <class D>
concept dataset = std::is_object_v<D> && dataset_has_size<D> &&
    (dataset_has_buffer_get<D> || dataset_has_view_get<D>);

/// The result of `get(i)` for a dataset with the view form.
template <dataset D>
requires dataset_has_view_get<D>
using dataset_view_t = decltype(std::declval<const D&>().get(std::size_t{}));

/// Fails to compile with a sentence naming what D lacks; true when D is a dataset. Use it as
/// `static_assert(hone::data::check_dataset<MyData>());`.
template <class D>
consteval bool check_dataset() {
  if constexpr (!std::is_object_v<D>) {
    static_assert(std::is_object_v<D>,
                  "hone::data::dataset: pass the dataset's class type itself, not a reference, "
                  "function or void");
    return false;
  } else if constexpr (!dataset_has_size<D>) {
    static_assert(dataset_has_size<D>,
                  "hone::data::dataset: this type has no const member function size() returning "
                  "the number of samples. Add `std::size_t size() const`.");
    return false;
  } else if constexpr (!dataset_has_buffer_get<D> && !dataset_has_view_get<D>) {
    static_assert(dataset_has_buffer_get<D> || dataset_has_view_get<D>,
                  "hone::data::dataset: this type has no const member function get(i) returning "
                  "sample i, and no get(i, buffer) filling a caller-provided buffer. Add "
                  "`View get(std::size_t i) const` (a value or a view, not void), or "
                  "`using buffer_type = ...;` and `void get(std::size_t i, buffer_type&) const`. "
                  "Both must be const: the loader reads one dataset from several threads.");
    return false;
  } else {
    return true;
  }
}

}  // namespace data
HONE_NAMESPACE_END
