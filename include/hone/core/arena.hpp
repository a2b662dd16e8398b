// hone/core/arena.hpp: flat arenas. Master weights, gradients and optimizer state live in one
// allocation per dtype and space; each tensor is a view at an aligned offset. A fused kernel can
// then sweep the whole arena in one pass, and a checkpoint writes it with one contiguous write.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN

/// The placement of named slots inside an arena, computed before anything is allocated.
/// Every slot starts on a host_alignment (64-byte) boundary when sizeof(T) divides 64.
class arena_layout {
 public:
  struct slot {
    std::string name;
    std::size_t offset;  // in elements
    std::size_t count;   // in elements
  };

  explicit arena_layout(std::size_t element_size) : align_(alignment_for(element_size)) {
    HONE_REQUIRE(element_size > 0, "hone::arena_layout: element size must be positive");
  }

  /// Appends a slot of `count` elements and returns its index. Names must be unique.
  std::size_t add(std::string name, std::size_t count) {
    for (const auto& s : slots_) {
      HONE_REQUIRE(s.name != name, "hone::arena_layout: slot name '" + name +
                                       "' is used twice; every tensor needs a distinct name");
    }
    const std::size_t offset = (total_ + align_ - 1) / align_ * align_;
    slots_.push_back({std::move(name), offset, count});
    total_ = offset + count;
    return slots_.size() - 1;
  }

  [[nodiscard]] std::size_t size() const noexcept { return slots_.size(); }
  [[nodiscard]] const slot& operator[](std::size_t i) const { return slots_.at(i); }
  /// Elements spanned by the arena, padding included.
  [[nodiscard]] std::size_t total() const noexcept { return total_; }
  /// Index of the slot called `name`; throws config_error naming it when absent.
  [[nodiscard]] std::size_t find(std::string_view name) const {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].name == name) return i;
    }
    throw config_error("hone::arena_layout: no slot named '" + std::string(name) + "'");
  }
  [[nodiscard]] const std::vector<slot>& slots() const noexcept { return slots_; }

 private:
  static constexpr std::size_t alignment_for(std::size_t element_size) noexcept {
    return (element_size != 0 && host_alignment % element_size == 0) ? host_alignment / element_size
                                                                     : 1;
  }
  std::size_t align_;
  std::size_t total_ = 0;
  std::vector<slot> slots_;
};

/// One allocation holding every slot of a layout. Padding between slots is zero, so a flat pass
/// over all() (a norm, a cast) sees only the slots' values and zeros.
template <class T, class Space = host_space>
class arena {
 public:
  using view_type = typename buffer<T, Space>::view_type;
  using const_view_type = typename buffer<T, Space>::const_view_type;

  arena() = default;
  explicit arena(arena_layout layout) : layout_(std::move(layout)), storage_(layout_.total()) {
    space_traits<Space>::zero(storage_.data(), storage_.size_bytes());
  }

  [[nodiscard]] const arena_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] std::size_t size() const noexcept { return layout_.size(); }

  [[nodiscard]] view_type view(std::size_t i) {
    const auto& s = layout_[i];
    return view_type(storage_.data() + s.offset, s.count);
  }
  [[nodiscard]] const_view_type view(std::size_t i) const {
    const auto& s = layout_[i];
    return const_view_type(storage_.data() + s.offset, s.count);
  }
  [[nodiscard]] view_type view(std::string_view name) { return view(layout_.find(name)); }
  [[nodiscard]] const_view_type view(std::string_view name) const {
    return view(layout_.find(name));
  }
  /// The whole arena, padding included.
  [[nodiscard]] view_type all() noexcept { return storage_.view(); }
  [[nodiscard]] const_view_type all() const noexcept { return storage_.view(); }

 private:
  arena_layout layout_{sizeof(T)};
  buffer<T, Space> storage_;
};

HONE_NAMESPACE_END
