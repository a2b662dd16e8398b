// hone/rl/batch.hpp: hone::replay_batch<Transition>, a batch of transitions as columns (one
// contiguous, 64-byte aligned array per field, rows in order), plus what a sampler says about each
// row: its key (generation-tagged: pass it back with the new priority) and its importance weight.
// The learner reuses one batch for every sample (no allocation once it is large enough); actors
// may fill one and add it whole (hone::replay_buffer::add_batch).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <tuple>
#include <utility>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/rl/transition.hpp"

HONE_NAMESPACE_BEGIN

template <transition_type Transition>
class replay_batch {
 public:
  using transition_type = Transition;
  using record_type = typename Transition::record;

  replay_batch() = default;
  /// A batch of n rows (uninitialized values).
  explicit replay_batch(std::size_t n) { resize(n); }

  /// Sets the number of rows; storage grows when needed and is kept when shrinking.
  void resize(std::size_t n) {
    if (n > capacity_) {
      const std::size_t cap = std::max(n, capacity_ * 2);
      Transition::for_each_field([&](auto i) {
        using F = typename Transition::template field_at<i>;
        auto& col = std::get<i>(columns_);
        std::remove_reference_t<decltype(col)> grown(cap * F::count);
        if (size_ != 0) std::memcpy(grown.data(), col.data(), size_ * F::bytes);
        col = std::move(grown);
      });
      buffer<std::uint64_t> keys(cap);
      buffer<float> weights(cap);
      buffer<std::size_t> slots(cap);
      if (size_ != 0) {
        std::memcpy(keys.data(), keys_.data(), size_ * sizeof(std::uint64_t));
        std::memcpy(weights.data(), weights_.data(), size_ * sizeof(float));
        std::memcpy(slots.data(), slots_.data(), size_ * sizeof(std::size_t));
      }
      keys_ = std::move(keys);
      weights_ = std::move(weights);
      slots_ = std::move(slots);
      capacity_ = cap;
    }
    size_ = n;
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  /// The column of field Name: size() * count elements, row-major (row r at r * count).
  template <fixed_string Name>
  [[nodiscard]] auto get() noexcept {
    constexpr std::size_t i = Transition::template index_of<Name>();
    return column<i>();
  }
  template <fixed_string Name>
  [[nodiscard]] auto get() const noexcept {
    constexpr std::size_t i = Transition::template index_of<Name>();
    return column<i>();
  }
  template <std::size_t I>
  [[nodiscard]] auto column() noexcept {
    using F = typename Transition::template field_at<I>;
    using E = typename F::element_type;
    return std::span<E>(std::get<I>(columns_).data(), size_ * F::count);
  }
  template <std::size_t I>
  [[nodiscard]] auto column() const noexcept {
    using F = typename Transition::template field_at<I>;
    using E = typename F::element_type;
    return std::span<const E>(std::get<I>(columns_).data(), size_ * F::count);
  }

  /// The key of each row: pass it back to update_priorities. A key names one write of one slot,
  /// so an update for a slot overwritten since the sample is recognized and ignored.
  [[nodiscard]] std::span<std::uint64_t> keys() noexcept { return {keys_.data(), size_}; }
  [[nodiscard]] std::span<const std::uint64_t> keys() const noexcept {
    return {keys_.data(), size_};
  }
  /// Importance-sampling weight of each row (1 for the uniform sampler; prioritized: (p_i /
  /// p_min)^-beta, so the largest possible weight is 1).
  [[nodiscard]] std::span<float> weights() noexcept { return {weights_.data(), size_}; }
  [[nodiscard]] std::span<const float> weights() const noexcept { return {weights_.data(), size_}; }
  /// The storage slot of each row (diagnostics; keys are what updates take).
  [[nodiscard]] std::span<std::size_t> slots() noexcept { return {slots_.data(), size_}; }
  [[nodiscard]] std::span<const std::size_t> slots() const noexcept {
    return {slots_.data(), size_};
  }

  /// Row r as a record (copy).
  [[nodiscard]] record_type row(std::size_t r) const {
    record_type out{};
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      std::memcpy(Transition::template elements<i>(out),
                  std::get<i>(columns_).data() + r * F::count, F::bytes);
    });
    return out;
  }
  /// Writes a record into row r.
  void set_row(std::size_t r, const record_type& rec) noexcept {
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      std::memcpy(std::get<i>(columns_).data() + r * F::count,
                  Transition::template elements<i>(rec), F::bytes);
    });
  }

 private:
  template <class... Fields>
  static auto column_tuple(std::tuple<Fields...>*)
      -> std::tuple<buffer<typename Fields::element_type>...>;
  using columns_type = decltype(column_tuple(static_cast<typename Transition::fields*>(nullptr)));

  columns_type columns_;
  buffer<std::uint64_t> keys_;
  buffer<float> weights_;
  buffer<std::size_t> slots_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

HONE_NAMESPACE_END
