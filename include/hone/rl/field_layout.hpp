// hone/rl/field_layout.hpp: how a transition's fields are described on disk, shared by the two
// ways a replay buffer persists (hone/rl/replay_io.hpp and hone/rl/mmap_storage.hpp).
//
// A field is saved as a tensor of its element's safetensors dtype (bool -> BOOL, float -> F32,
// std::int32_t -> I32, hone::bfloat16 -> BF16, ...) and its shape; an element type with no dtype
// (a user's trivially copyable struct) is saved as U8 with one more dimension, sizeof(element).
// replay_fields<T>() lists the fields that way (name, dtype, per-item shape), in order; a saved
// buffer keeps that list so that loading it into a buffer of another transition type is a
// sentence, not garbage. transition_signature<T>() is a 64-bit hash of the same list (XXH3-64 of
// its text), kept in an mmap_storage file's header for the same check.
//
// record_layout<T, Aligned> places a transition's fields in one record (array of structures), in
// declaration order: with Aligned = false they touch (no padding: an mmap_storage file record,
// Transition::bytes bytes); with Aligned = true each field starts at a multiple of its element's
// alignment and the record size is a multiple of the largest one, as a C struct of the fields
// would be (hone::packed_storage's in-memory records). pack/unpack copy a record to and from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/io/dtype.hpp"
#include "hone/io/hash.hpp"
#include "hone/rl/transition.hpp"

HONE_NAMESPACE_BEGIN

/// One field of a transition as it is saved.
struct replay_field_desc {
  std::string name;
  io::dtype type = io::dtype::u8;
  std::vector<std::uint64_t> shape;  ///< per item (the saved tensor is [capacity, shape...])

  friend bool operator==(const replay_field_desc&, const replay_field_desc&) = default;

  /// "obs F32 [4]" (for messages).
  [[nodiscard]] std::string text() const {
    std::string s = name + " " + std::string(io::dtype_name(type)) + " [";
    for (std::size_t i = 0; i < shape.size(); ++i) {
      if (i > 0) s += ", ";
      s += std::to_string(shape[i]);
    }
    return s + "]";
  }
};

namespace detail {
/// Whether element type E has a safetensors dtype of its own (else it is saved as bytes).
template <class E>
inline constexpr bool has_tensor_dtype_v =
    std::is_same_v<std::remove_cv_t<E>, bool> || std::is_same_v<std::remove_cv_t<E>, float> ||
    std::is_same_v<std::remove_cv_t<E>, double> || std::is_same_v<std::remove_cv_t<E>, bfloat16> ||
    std::is_same_v<std::remove_cv_t<E>, half> || std::is_same_v<std::remove_cv_t<E>, std::byte> ||
    (std::is_integral_v<E> &&
     (sizeof(E) == 1 || sizeof(E) == 2 || sizeof(E) == 4 || sizeof(E) == 8));

template <class F>
replay_field_desc field_desc() {
  using E = typename F::element_type;
  replay_field_desc d;
  d.name = std::string(F::name.view());
  for (const std::size_t n : F::shape) d.shape.push_back(n);
  if (d.shape.empty() && F::count != 1) d.shape.push_back(F::count);
  if constexpr (has_tensor_dtype_v<E>) {
    d.type = io::dtype_of<E>;
  } else {
    d.type = io::dtype::u8;
    d.shape.push_back(sizeof(E));
  }
  return d;
}
}  // namespace detail

/// The fields of Transition as saved (see the top of this file), in declaration order.
template <transition_type Transition>
[[nodiscard]] std::vector<replay_field_desc> replay_fields() {
  std::vector<replay_field_desc> out;
  Transition::for_each_field([&](auto i) {
    out.push_back(detail::field_desc<typename Transition::template field_at<i>>());
  });
  return out;
}

/// "obs F32 [4], action I32 [], ..." for a field list.
[[nodiscard]] inline std::string replay_fields_text(const std::vector<replay_field_desc>& fields) {
  std::string s;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) s += ", ";
    s += fields[i].text();
  }
  return s;
}

/// A 64-bit hash of Transition's saved field list (never 0).
template <transition_type Transition>
[[nodiscard]] std::uint64_t transition_signature() {
  const std::string text = replay_fields_text(replay_fields<Transition>());
  const std::uint64_t h = io::hash64(std::as_bytes(std::span(text.data(), text.size())));
  return h == 0 ? 1 : h;
}

/// The place of each field of Transition in one packed record (see the top of this file).
template <transition_type Transition, bool Aligned>
struct record_layout {
  /// Alignment of the record: the largest element alignment with Aligned, else 1.
  static constexpr std::size_t alignment = [] {
    std::size_t a = 1;
    if constexpr (Aligned) {
      Transition::for_each_field([&](auto i) {
        using E = typename Transition::template field_at<i>::element_type;
        a = alignof(E) > a ? alignof(E) : a;
      });
    }
    return a;
  }();

  /// Byte offset of field I in a record.
  template <std::size_t I>
  [[nodiscard]] static constexpr std::size_t offset() noexcept {
    std::size_t o = 0;
    Transition::for_each_field([&](auto j) {
      using F = typename Transition::template field_at<j>;
      if constexpr (j <= I) {
        if constexpr (Aligned) {
          constexpr std::size_t a = alignof(typename F::element_type);
          o = (o + a - 1) / a * a;
        }
        if constexpr (j < I) o += F::bytes;
      }
    });
    return o;
  }

  /// Bytes of one record: the end of the last field, rounded up to `alignment`.
  static constexpr std::size_t bytes = [] {
    constexpr std::size_t last = Transition::field_count - 1;
    constexpr std::size_t end = offset<last>() + Transition::template field_at<last>::bytes;
    return (end + alignment - 1) / alignment * alignment;
  }();

  /// Copies a record's fields into the record at `out`.
  static void pack(const typename Transition::record& rec, std::byte* out) noexcept {
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      std::memcpy(out + offset<i>(), Transition::template elements<i>(rec), F::bytes);
    });
  }
  /// Copies the record at `in` into a record's fields.
  static void unpack(const std::byte* in, typename Transition::record& rec) noexcept {
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      std::memcpy(Transition::template elements<i>(rec), in + offset<i>(), F::bytes);
    });
  }
};

HONE_NAMESPACE_END
