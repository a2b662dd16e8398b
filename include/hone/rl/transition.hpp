// hone/rl/transition.hpp: the compile-time description of a replay buffer's transition type.
//
// A transition is a list of named fields, each with an element type and a shape:
//
//   using step = hone::transition<hone::field<"obs", float, 4>,        // float[4]
//                                 hone::field<"action", std::int32_t>, // scalar
//                                 hone::field<"reward", float>,
//                                 hone::field<"next_obs", float, 4>,
//                                 hone::field<"terminated", bool>,
//                                 hone::field<"truncated", bool>>;
//   step::record r;                       // generated aggregate: one member per field
//   hone::get<"obs">(r) = {0.1f, 0.2f, 0.3f, 0.4f};   // std::array<float, 4>&
//   hone::get<"reward">(r) = 1.0f;                   // float&
//
// or over the user's own struct, naming its members (then `record` is that struct):
//
//   struct my_step { float obs[4]; int action; float reward; float next_obs[4]; bool done; };
//   using step = hone::transition<hone::member<"obs", &my_step::obs>, ...>;
//
// A replay storage keeps one column (structure of arrays) per field; samples come back as
// columns too (hone::replay_batch). Names are compile-time strings, so a misspelt name is a
// compile error that says so, and every lookup is resolved at compile time.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN

/// A string usable as a template argument: hone::field<"obs", float, 4>.
template <std::size_t N>
struct fixed_string {
  char chars[N]{};
  consteval fixed_string(const char (&s)[N]) {  // NOLINT: implicit on purpose ("obs" literals)
    for (std::size_t i = 0; i < N; ++i) chars[i] = s[i];
  }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return N - 1; }
  [[nodiscard]] constexpr std::string_view view() const noexcept { return {chars, N - 1}; }
  [[nodiscard]] constexpr const char* c_str() const noexcept { return chars; }
};

template <std::size_t N, std::size_t M>
constexpr bool operator==(const fixed_string<N>& a, const fixed_string<M>& b) noexcept {
  return a.view() == b.view();
}

namespace detail {
// Element type and element count of a member's type: scalars, C arrays (any rank) and
// std::array (one level) are understood.
template <class M>
struct member_shape {
  using element_type = M;
  static constexpr std::size_t count = 1;
  static constexpr std::size_t rank = 0;
};
template <class T, std::size_t N>
struct member_shape<T[N]> {
  using element_type = typename member_shape<T>::element_type;
  static constexpr std::size_t count = N * member_shape<T>::count;
  static constexpr std::size_t rank = 1 + member_shape<T>::rank;
};
template <class T, std::size_t N>
struct member_shape<std::array<T, N>> {
  using element_type = T;
  static constexpr std::size_t count = N;
  static constexpr std::size_t rank = 1;
};

template <class P>
struct member_pointer_traits {
  static_assert(sizeof(P) == 0,
                "hone::member<Name, Ptr>: Ptr must be a pointer to a data member, e.g. "
                "hone::member<\"obs\", &my_step::obs>.");
};
template <class C, class M>
struct member_pointer_traits<M C::*> {
  using class_type = C;
  using member_type = M;
};

template <class T>
inline constexpr bool storable_element_v =
    std::is_trivially_copyable_v<T> && !std::is_reference_v<T> && !std::is_pointer_v<T> &&
    !std::is_array_v<T> && std::is_default_constructible_v<T>;
}  // namespace detail

/// A field of a generated transition: a name, an element type and a shape (none for a scalar).
/// The record member is `T` for a scalar and `std::array<T, product of Shape>` otherwise (the
/// shape is kept for the user; storage is flat, row-major).
template <fixed_string Name, class T, std::size_t... Shape>
struct field {
  static_assert(Name.size() > 0, "hone::field: the field name must not be empty.");
  static_assert(detail::storable_element_v<T>,
                "hone::field<Name, T, ...>: T must be a trivially copyable value type (float, "
                "std::int32_t, bool, a POD struct); pointers, references and arrays are not "
                "allowed (give an array's extents as the shape: hone::field<\"obs\", float, 84, "
                "84>).");
  static_assert(((Shape > 0) && ...),
                "hone::field<Name, T, Shape...>: every dimension of the shape must be positive.");
  static constexpr auto name = Name;
  using element_type = T;
  static constexpr std::array<std::size_t, sizeof...(Shape)> shape{Shape...};
  static constexpr std::size_t rank = sizeof...(Shape);
  /// Elements per transition.
  static constexpr std::size_t count = (std::size_t{1} * ... * Shape);
  static constexpr std::size_t bytes = count * sizeof(T);
  /// The member type in a generated record.
  using value_type = std::conditional_t<rank == 0, T, std::array<T, count>>;
  static constexpr bool is_member = false;
};

/// A field that is a data member of the user's own struct: hone::member<"obs", &my_step::obs>.
/// The member may be a scalar, a C array (any rank) or a std::array.
template <fixed_string Name, auto Ptr>
struct member {
  static_assert(Name.size() > 0, "hone::member: the field name must not be empty.");
  using class_type = typename detail::member_pointer_traits<decltype(Ptr)>::class_type;
  using member_type = typename detail::member_pointer_traits<decltype(Ptr)>::member_type;
  using element_type = typename detail::member_shape<member_type>::element_type;
  static_assert(detail::storable_element_v<element_type>,
                "hone::member<Name, Ptr>: the member's element type must be trivially copyable "
                "(float, std::int32_t, bool, a POD struct), not a pointer or reference.");
  static_assert(sizeof(member_type) ==
                    sizeof(element_type) * detail::member_shape<member_type>::count,
                "hone::member<Name, Ptr>: the member's elements must be contiguous.");
  static constexpr auto name = Name;
  static constexpr std::size_t rank = detail::member_shape<member_type>::rank;
  static constexpr std::size_t count = detail::member_shape<member_type>::count;
  static constexpr std::size_t bytes = count * sizeof(element_type);
  static constexpr std::array<std::size_t, (rank == 0 ? 0 : 1)> shape = [] {
    std::array<std::size_t, (rank == 0 ? 0 : 1)> s{};
    if constexpr (rank != 0) s[0] = count;
    return s;
  }();
  using value_type = member_type;
  static constexpr auto pointer = Ptr;
  static constexpr bool is_member = true;
};

namespace detail {
template <class F>
struct is_field_descriptor : std::false_type {};
template <fixed_string Name, class T, std::size_t... Shape>
struct is_field_descriptor<field<Name, T, Shape...>> : std::true_type {};
template <fixed_string Name, auto Ptr>
struct is_field_descriptor<member<Name, Ptr>> : std::true_type {};

template <class... Fields>
consteval bool names_unique() {
  constexpr std::array<std::string_view, sizeof...(Fields)> names{Fields::name.view()...};
  for (std::size_t i = 0; i < names.size(); ++i) {
    for (std::size_t j = i + 1; j < names.size(); ++j) {
      if (names[i] == names[j]) return false;
    }
  }
  return true;
}

template <fixed_string Name, class... Fields>
consteval std::size_t find_field() {
  constexpr std::array<std::string_view, sizeof...(Fields)> names{Fields::name.view()...};
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i] == Name.view()) return i;
  }
  return sizeof...(Fields);
}

/// The record of a transition made of hone::field descriptors: a tuple of the fields' value
/// types, reached by name with hone::get<"name">(record) or record.get<"name">().
template <class... Fields>
struct generated_record {
  std::tuple<typename Fields::value_type...> values{};

  template <fixed_string Name>
  constexpr auto& get() noexcept {
    constexpr std::size_t i = find_field<Name, Fields...>();
    static_assert(i < sizeof...(Fields),
                  "hone::transition: no field has this name (it is spelled out in the "
                  "instantiation below); names are case-sensitive.");
    return std::get<i>(values);
  }
  template <fixed_string Name>
  constexpr const auto& get() const noexcept {
    constexpr std::size_t i = find_field<Name, Fields...>();
    static_assert(i < sizeof...(Fields),
                  "hone::transition: no field has this name (it is spelled out in the "
                  "instantiation below); names are case-sensitive.");
    return std::get<i>(values);
  }
  friend constexpr bool operator==(const generated_record&, const generated_record&) = default;
};

// The record type: the user's struct (hone::member) or a generated one (hone::field).
template <bool User, class... Fields>
struct record_of {
  using type = generated_record<Fields...>;
};
template <class First, class... Rest>
struct record_of<true, First, Rest...> {
  using type = typename First::class_type;
};
template <class F, class R>
inline constexpr bool member_of_v = [] {
  if constexpr (F::is_member) {
    return std::is_same_v<typename F::class_type, R>;
  } else {
    return true;
  }
}();
}  // namespace detail

/// A transition type: a compile-time list of hone::field (hone generates the record type) or of
/// hone::member (the record type is the user's struct). Field names must be unique.
template <class... Fields>
struct transition {
  static_assert(sizeof...(Fields) > 0, "hone::transition needs at least one field.");
  static_assert((detail::is_field_descriptor<Fields>::value && ...),
                "hone::transition<Fields...>: every argument must be a hone::field<\"name\", T, "
                "shape...> or a hone::member<\"name\", &Struct::member>.");
  static_assert(detail::names_unique<Fields...>(),
                "hone::transition: two fields have the same name; every field needs a distinct "
                "name.");
  static_assert((Fields::is_member && ...) || (!Fields::is_member && ...),
                "hone::transition: mix of hone::field and hone::member. Use hone::field only (hone "
                "generates the record) or hone::member only (the record is your struct).");

  static constexpr std::size_t field_count = sizeof...(Fields);
  using fields = std::tuple<Fields...>;
  template <std::size_t I>
  using field_at = std::tuple_element_t<I, fields>;

  static constexpr bool user_record = (Fields::is_member && ...);
  using record = typename detail::record_of<user_record, Fields...>::type;
  static_assert((detail::member_of_v<Fields, record> && ...),
                "hone::transition: every hone::member must point into the same struct.");

  /// Bytes of one transition's data (the sum of the fields' sizes, no padding).
  static constexpr std::size_t bytes = (std::size_t{0} + ... + Fields::bytes);

  /// Index of the field called Name, or field_count when there is none.
  template <fixed_string Name>
  static constexpr std::size_t find = detail::find_field<Name, Fields...>();
  template <fixed_string Name>
  static constexpr bool has = find<Name> < field_count;

  /// Index of the field called Name; a compile error naming the problem when there is none.
  template <fixed_string Name>
  static consteval std::size_t index_of() {
    static_assert(has<Name>,
                  "hone::transition: no field has this name (it is spelled out in the "
                  "instantiation below); names are case-sensitive.");
    return find<Name>;
  }

  /// The field's value inside a record, by index.
  template <std::size_t I, class R>
  static constexpr auto& value(R& r) noexcept {
    using F = field_at<I>;
    if constexpr (F::is_member) {
      return r.*(F::pointer);
    } else {
      return std::get<I>(r.values);
    }
  }

  /// Pointer to the first element of field I of a record (the bytes storage copies).
  template <std::size_t I>
  static auto* elements(record& r) noexcept {
    using E = typename field_at<I>::element_type;
    return reinterpret_cast<E*>(&value<I>(r));
  }
  template <std::size_t I>
  static const auto* elements(const record& r) noexcept {
    using E = typename field_at<I>::element_type;
    return reinterpret_cast<const E*>(&value<I>(r));
  }

  /// Calls f(std::integral_constant<std::size_t, I>{}) for every field index.
  template <class F>
  static constexpr void for_each_field(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f(std::integral_constant<std::size_t, I>{}), ...);
    }
    (std::make_index_sequence<field_count>{});
  }
};

namespace detail {
template <class T>
struct is_transition : std::false_type {};
template <class... F>
struct is_transition<transition<F...>> : std::true_type {};
}  // namespace detail

/// True for hone::transition<...> types.
template <class T>
concept transition_type = detail::is_transition<T>::value;

/// The value of field Name in a generated record: hone::get<"obs">(record).
template <fixed_string Name, class... Fields>
constexpr auto& get(detail::generated_record<Fields...>& r) noexcept {
  return r.template get<Name>();
}
template <fixed_string Name, class... Fields>
constexpr const auto& get(const detail::generated_record<Fields...>& r) noexcept {
  return r.template get<Name>();
}

HONE_NAMESPACE_END
