// hone/rl/ring_storage.hpp: the in-memory ring. One column per field (structure of arrays): field
// `obs` of slot s is at obs_column[s * count], so a sampled batch is gathered field by field, and
// every column is one 64-byte aligned allocation (saved with one contiguous write). Which slot the
// next transition goes to, and which item a slot holds, is the replay buffer's business (it keeps
// the write sequence); this class only moves bytes.
//
// Storage interface (what hone::replay_buffer asks of a storage, so other storages can plug in):
//   explicit S(std::size_t capacity)
//   capacity(), write(slot, record), write_rows(slot, batch, row, n), read(slot, record&),
//   prefetch(slots), gather(slots, batch), read_field(field, first, out) and write_field(field,
//   first, in) (one field of a run of slots, for hone::save_replay_buffer/load_replay_buffer), and,
//   for a storage that keeps one array per field, for_each_array(f(name, std::span<std::byte>))
//   (hone::replay_buffer::for_each_column; the save then writes the arrays without a copy).
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <string_view>
#include <tuple>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/rl/batch.hpp"
#include "hone/rl/roles.hpp"
#include "hone/rl/sum_tree.hpp"  // HONE_PREFETCH, detail::advise_huge_pages
#include "hone/rl/transition.hpp"

HONE_NAMESPACE_BEGIN

template <transition_type Transition>
class ring_columns;

/// Storage policy: the in-memory ring of columns (hone::ring_columns).
struct ring_storage {
  using role = roles::replay_storage;
  template <class Transition>
  using storage_type = ring_columns<Transition>;
};

template <transition_type Transition>
class ring_columns {
 public:
  using transition_type = Transition;
  using record_type = typename Transition::record;
  using batch_type = replay_batch<Transition>;

  explicit ring_columns(std::size_t capacity) : capacity_(capacity) {
    HONE_REQUIRE(capacity > 0, "hone::ring_storage: the capacity must be positive");
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      auto& col = std::get<i>(columns_);
      col = std::remove_reference_t<decltype(col)>(capacity * F::count);
      detail::advise_huge_pages(col.data(), col.size_bytes());  // random rows: fewer TLB misses
      std::memset(static_cast<void*>(col.data()), 0, col.size_bytes());  // first touch
    });
  }

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

  /// Copies a record into slot s.
  void write(std::size_t s, const record_type& rec) noexcept {
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      std::memcpy(std::get<i>(columns_).data() + s * F::count,
                  Transition::template elements<i>(rec), F::bytes);
    });
  }

  /// Copies rows [row, row + n) of a batch into slots [s, s + n) (no wrap: s + n <= capacity).
  void write_rows(std::size_t s, const batch_type& src, std::size_t row, std::size_t n) noexcept {
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      std::memcpy(std::get<i>(columns_).data() + s * F::count,
                  src.template column<i>().data() + row * F::count, n * F::bytes);
    });
  }

  /// Copies slot s into a record.
  void read(std::size_t s, record_type& rec) const noexcept {
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      std::memcpy(Transition::template elements<i>(rec),
                  std::get<i>(columns_).data() + s * F::count, F::bytes);
    });
  }

  /// Starts loading the rows of `slots` into the cache (every line of every field): called
  /// before gather() with work in between, the random reads overlap that work.
  void prefetch(std::span<const std::size_t> slots) const noexcept {
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      const auto* col = reinterpret_cast<const char*>(std::get<i>(columns_).data());
      for (std::size_t r = 0; r < slots.size(); ++r) {
        const char* p = col + slots[r] * F::bytes;
        for (std::size_t b = 0; b < F::bytes; b += 64) HONE_PREFETCH(p + b);
        // A row may end in the next line unless its size divides the 64-byte lines the
        // (64-byte aligned) column is cut into.
        if constexpr (F::bytes % 64 != 0 && (F::bytes > 64 || 64 % F::bytes != 0)) {
          HONE_PREFETCH(p + F::bytes - 1);
        }
      }
    });
  }

  /// Copies slots[r] into row r of `out` for every r (out.size() >= slots.size()), field by field.
  void gather(std::span<const std::size_t> slots, batch_type& out) const noexcept {
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      using E = typename F::element_type;
      const E* col = std::get<i>(columns_).data();
      E* dst = out.template column<i>().data();
      for (std::size_t r = 0; r < slots.size(); ++r) {
        std::memcpy(dst + r * F::count, col + slots[r] * F::count, F::bytes);
      }
    });
  }

  /// Copies field `field` (its index in declaration order) of slots [first, first + n) into
  /// `out`, n = out.size() / the field's bytes: the rows as they lie in the column.
  void read_field(std::size_t field, std::size_t first, std::span<std::byte> out) const noexcept {
    Transition::for_each_field([&](auto i) {
      if (i != field) return;
      const auto& col = std::get<i>(columns_);
      std::memcpy(out.data(),
                  reinterpret_cast<const std::byte*>(col.data()) +
                      first * Transition::template field_at<i>::bytes,
                  out.size());
    });
  }
  /// Copies `in` (rows of field `field`, as read_field gives them) into slots [first, first + n).
  void write_field(std::size_t field, std::size_t first, std::span<const std::byte> in) noexcept {
    Transition::for_each_field([&](auto i) {
      if (i != field) return;
      auto& col = std::get<i>(columns_);
      std::memcpy(reinterpret_cast<std::byte*>(col.data()) +
                      first * Transition::template field_at<i>::bytes,
                  in.data(), in.size());
    });
  }

  /// The column of field Name (capacity() * count elements).
  template <fixed_string Name>
  [[nodiscard]] auto column() noexcept {
    constexpr std::size_t i = Transition::template index_of<Name>();
    using E = typename Transition::template field_at<i>::element_type;
    auto& col = std::get<i>(columns_);
    return std::span<E>(col.data(), col.size());
  }
  template <fixed_string Name>
  [[nodiscard]] auto column() const noexcept {
    constexpr std::size_t i = Transition::template index_of<Name>();
    using E = typename Transition::template field_at<i>::element_type;
    const auto& col = std::get<i>(columns_);
    return std::span<const E>(col.data(), col.size());
  }

  /// f(name, bytes) for every column: what a checkpoint saves (and restores in place).
  template <class F>
  void for_each_array(F&& f) {
    Transition::for_each_field([&](auto i) {
      using Fd = typename Transition::template field_at<i>;
      auto& col = std::get<i>(columns_);
      f(std::string_view(Fd::name.view()),
        std::span<std::byte>(reinterpret_cast<std::byte*>(col.data()), col.size_bytes()));
    });
  }

 private:
  template <class... Fields>
  static auto column_tuple(std::tuple<Fields...>*)
      -> std::tuple<buffer<typename Fields::element_type>...>;
  using columns_type = decltype(column_tuple(static_cast<typename Transition::fields*>(nullptr)));

  std::size_t capacity_;
  columns_type columns_;
};

HONE_NAMESPACE_END
