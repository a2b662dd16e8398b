// hone/data/pinned_batch.hpp: a loader batch made of fixed-width fields in one block of pinned
// host memory, so that the loader's collate writes straight into page-locked memory and the CUDA
// stager (hone/data/cuda/staging.hpp) copies it to the device with no extra host copy.
//
//   hone::data::batch_layout layout(64);              // rows per batch: the loader's batch_size
//   layout.add<std::int32_t>("tokens", 2048)          // 2048 int32 per row
//         .add<float>("weight", 1);                   // one float per row
//   auto collate = [](hone::data::pinned_batch& b, std::size_t row, std::span<const int> rec) {
//     auto t = b.row<std::int32_t>(0, row);           // field 0, row `row`: 2048 elements
//     std::copy(rec.begin(), rec.end(), t.begin());
//     b.row<float>(1, row)[0] = 1.0f;
//   };
//   hone::data::loader ld(ds, hone::data::pinned_batch(layout), collate, {.batch_size = 64});
//
// Layout. Field k holds rows() * row_elements elements of element_bytes each, row-major (row r
// starts at element r * row_elements); the fields sit one after the other in one allocation, each
// at an offset that is a multiple of field_alignment (256 bytes, so any element type is aligned
// on the host and on the device). A field of 0 elements per row is allowed (it has no bytes).
//
// Memory. The block is allocated in pinned_host_space: page-locked (cudaHostAlloc) in a program
// that contains a CUDA translation unit including hone (hone/core/space.hpp says when), ordinary
// 64-byte aligned memory otherwise, so a pinned_batch also works in a host-only program. The
// loader copies its prototype into each of its prefetch + 1 reused batches: a copy allocates its
// own block (and copies the bytes), so every loader slot is a pinned buffer of its own.
//
// Threads: different pinned_batch objects may be written by different threads at once (the
// loader's workers each fill their own); row() and field() only read the layout.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/space.hpp"

HONE_NAMESPACE_BEGIN
namespace data {

/// One field of a batch_layout: row_elements elements of element_bytes each per row, at byte
/// `offset` of the batch's block.
struct batch_field {
  std::string name;
  std::size_t element_bytes = 0;
  std::size_t element_alignment = 1;
  std::size_t row_elements = 0;
  std::size_t offset = 0;

  [[nodiscard]] std::size_t row_bytes() const noexcept { return element_bytes * row_elements; }
  friend bool operator==(const batch_field&, const batch_field&) = default;
};

/// The rows and fields of a pinned_batch (header comment).
class batch_layout {
 public:
  /// Each field's offset is a multiple of this (bytes).
  static constexpr std::size_t field_alignment = 256;

  /// A layout of `rows` rows per batch (at least 1: the loader's batch_size).
  explicit batch_layout(std::size_t rows) : rows_(rows) {
    HONE_REQUIRE(rows >= 1,
                 "hone::data::batch_layout: rows is 0; a batch holds at least one row "
                 "(pass the loader's batch_size)");
  }

  /// Adds a field of `per_row` elements of T per row (0 allowed). Names are unique.
  template <class T>
  batch_layout& add(std::string name, std::size_t per_row) {
    static_assert(std::is_trivially_copyable_v<T> && !std::is_const_v<T>,
                  "hone::data::batch_layout::add<T>: a batch field is copied to the device with "
                  "cudaMemcpy, so T must be a non-const trivially copyable type (float, int32_t, "
                  "hone::bfloat16, a POD struct)");
    static_assert(alignof(T) <= field_alignment,
                  "hone::data::batch_layout::add<T>: T's alignment is larger than the 256 bytes a "
                  "field is aligned to");
    for (const auto& f : fields_) {
      HONE_REQUIRE(f.name != name, "hone::data::batch_layout: a field named '" + name +
                                       "' was already added; give each field its own name");
    }
    const std::size_t max = std::numeric_limits<std::size_t>::max();
    const std::size_t begin = (bytes_ + field_alignment - 1) / field_alignment * field_alignment;
    HONE_REQUIRE(per_row <= max / sizeof(T) / rows_ && begin >= bytes_ &&
                     begin <= max - per_row * sizeof(T) * rows_,
                 "hone::data::batch_layout: the field '" + name + "' of " +
                     std::to_string(per_row) + " elements of " + std::to_string(sizeof(T)) +
                     " bytes per row, " + std::to_string(rows_) +
                     " rows, overflows the addressable size; the count is probably a negative "
                     "number converted to size_t");
    fields_.push_back({std::move(name), sizeof(T), alignof(T), per_row, begin});
    bytes_ = begin + per_row * sizeof(T) * rows_;
    return *this;
  }

  [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::size_t size() const noexcept { return fields_.size(); }
  [[nodiscard]] const std::vector<batch_field>& fields() const noexcept { return fields_; }
  /// Field k; config_error when k is out of range.
  [[nodiscard]] const batch_field& field(std::size_t k) const {
    HONE_REQUIRE(k < fields_.size(), "hone::data::batch_layout: field " + std::to_string(k) +
                                         " does not exist: the layout has " +
                                         std::to_string(fields_.size()) + " fields");
    return fields_[k];
  }
  /// The number of the field called `name`; config_error naming the fields when there is none.
  [[nodiscard]] std::size_t index_of(std::string_view name) const {
    for (std::size_t k = 0; k < fields_.size(); ++k) {
      if (fields_[k].name == name) return k;
    }
    std::string names;
    for (const auto& f : fields_) names += (names.empty() ? "'" : ", '") + f.name + "'";
    throw config_error("hone::data::batch_layout: no field is named '" + std::string(name) +
                       "'; the fields are " + (names.empty() ? std::string("none") : names));
  }
  /// The size of a batch's block: the end of the last field.
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

  friend bool operator==(const batch_layout&, const batch_layout&) = default;

 private:
  std::size_t rows_ = 1;
  std::vector<batch_field> fields_;
  std::size_t bytes_ = 0;
};

namespace detail {
/// Checks that field `f` (number k) can be viewed as elements of T.
template <class T>
void check_field_type(const batch_field& f, std::size_t k, const char* who) {
  HONE_REQUIRE(sizeof(T) == f.element_bytes && alignof(T) <= batch_layout::field_alignment,
               std::string(who) + ": field " + std::to_string(k) + " ('" + f.name +
                   "') holds elements of " + std::to_string(f.element_bytes) +
                   " bytes, read here as a type of " + std::to_string(sizeof(T)) +
                   " bytes; use the type the field was added with");
}
}  // namespace detail

/// A batch in one block of pinned host memory, laid out by a batch_layout (header comment).
class pinned_batch {
 public:
  /// Allocates one block of layout.bytes() pinned bytes, zeroed.
  explicit pinned_batch(batch_layout layout) : layout_(std::move(layout)), block_(layout_.bytes()) {
    space_traits<pinned_host_space>::zero(block_.data(), block_.size_bytes());
  }
  /// A batch of the same layout in a block of its own, holding the same bytes.
  pinned_batch(const pinned_batch& o) : layout_(o.layout_), block_(o.layout_.bytes()) {
    if (block_.size_bytes() != 0) std::memcpy(block_.data(), o.block_.data(), block_.size_bytes());
  }
  pinned_batch& operator=(const pinned_batch& o) {
    if (this != &o) *this = pinned_batch(o);
    return *this;
  }
  pinned_batch(pinned_batch&&) noexcept = default;
  pinned_batch& operator=(pinned_batch&&) noexcept = default;
  ~pinned_batch() = default;

  [[nodiscard]] const batch_layout& layout() const noexcept { return layout_; }
  /// The rows the block holds (the layout's rows).
  [[nodiscard]] std::size_t rows() const noexcept { return layout_.rows(); }
  /// The block: layout().bytes() bytes (nullptr when that is 0).
  [[nodiscard]] std::byte* data() noexcept { return block_.data(); }
  [[nodiscard]] const std::byte* data() const noexcept { return block_.data(); }
  [[nodiscard]] std::size_t bytes() const noexcept { return block_.size_bytes(); }
  /// Whether the block is page-locked (a CUDA backend allocated it); false for an empty block.
  [[nodiscard]] bool page_locked() const noexcept {
    return block_.data() != nullptr && space_traits<pinned_host_space>::page_locked(block_.data());
  }

  /// Field k as rows() * row_elements elements of T (T of the size it was added with).
  template <class T>
  [[nodiscard]] std::span<T> field(std::size_t k) {
    const batch_field& f = layout_.field(k);
    detail::check_field_type<T>(f, k, "hone::data::pinned_batch::field");
    return {reinterpret_cast<T*>(block_.data() + f.offset), f.row_elements * rows()};
  }
  template <class T>
  [[nodiscard]] std::span<const T> field(std::size_t k) const {
    return const_cast<pinned_batch&>(*this).field<T>(k);
  }
  template <class T>
  [[nodiscard]] std::span<T> field(std::string_view name) {
    return field<T>(layout_.index_of(name));
  }
  template <class T>
  [[nodiscard]] std::span<const T> field(std::string_view name) const {
    return field<T>(layout_.index_of(name));
  }

  /// Row r of field k: row_elements elements of T. config_error when r >= rows() (a loader whose
  /// batch_size is larger than the layout's rows).
  template <class T>
  [[nodiscard]] std::span<T> row(std::size_t k, std::size_t r) {
    const batch_field& f = layout_.field(k);
    detail::check_field_type<T>(f, k, "hone::data::pinned_batch::row");
    HONE_REQUIRE(r < rows(), "hone::data::pinned_batch::row: row " + std::to_string(r) +
                                 " does not exist: the batch holds " + std::to_string(rows()) +
                                 " rows; make the layout's rows at least the loader's batch_size");
    return {reinterpret_cast<T*>(block_.data() + f.offset) + r * f.row_elements, f.row_elements};
  }
  template <class T>
  [[nodiscard]] std::span<const T> row(std::size_t k, std::size_t r) const {
    return const_cast<pinned_batch&>(*this).row<T>(k, r);
  }

 private:
  batch_layout layout_;
  buffer<std::byte, pinned_host_space> block_;
};

}  // namespace data
HONE_NAMESPACE_END
