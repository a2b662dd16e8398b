// hone/rl/packed_storage.hpp: the in-memory ring of packed records (array of structures), the
// other in-memory storage next to hone::ring_storage's columns:
//
//   hone::replay_buffer<step, hone::packed_storage, hone::prioritized<>> buffer(1 << 20);
//
// Slot s is one record at records[s * stride]: the transition's fields in declaration order, each
// at a multiple of its element's alignment, the stride a multiple of the largest alignment (a C
// struct of the fields: hone::record_layout<T, true> in hone/rl/field_layout.hpp; CartPole's 42
// bytes take 44). The records are one 64-byte aligned allocation, advised to transparent huge
// pages and touched (zeroed) at construction, like ring_storage's columns. prefetch() requests
// each sampled record's line(s) and gather() copies each record's fields into the batch columns,
// record by record. Batches, keys and weights are bit-identical to a ring_storage buffer's for the
// same adds and seeds (the sampler does not see the storage).
//
// Which in-memory storage (hone::auto_storage, the default, picks packed_storage for records of
// at most 2048 bytes and ring_storage beyond; naming either overrides it):
// - packed_storage for transitions sampled at random (prioritized or uniform replay of vector
//   observations): a sampled item costs its record's lines (1 or 2 for CartPole), where the
//   columns cost at least one per field (6 for CartPole). sample(256) from 2^20 CartPole items:
//   see docs/benchmarks.md ("Replay buffers").
// - ring_storage for large fields (images, long vectors: a field of many lines costs about the
//   same misses in either layout, and the columns copy it as one run) and for work that reads one
//   field over many items (a column is contiguous; replay_buffer::for_each_column needs columns
//   and does not compile with packed records: a static_assert says so).
// Both save and load with hone::save_replay_buffer/load_replay_buffer in one format (one tensor
// per field): a packed buffer's save gathers each field out of the records through read_field()
// into a reused staging buffer of at most 1 MiB, its load scatters each tensor back with
// write_field(); a save of either storage loads into the other (hone/rl/replay_io.hpp).
//
// Storage interface: the one of hone/rl/ring_storage.hpp (S(capacity), write, write_rows, read,
// prefetch, gather, read_field, write_field), but not for_each_array; records() gives the raw
// records.
#pragma once

#include <cstddef>
#include <cstring>
#include <limits>
#include <span>
#include <string>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/rl/batch.hpp"
#include "hone/rl/field_layout.hpp"
#include "hone/rl/roles.hpp"
#include "hone/rl/sum_tree.hpp"  // HONE_PREFETCH, detail::advise_huge_pages
#include "hone/rl/transition.hpp"

HONE_NAMESPACE_BEGIN

template <transition_type Transition>
class packed_records;

/// Storage policy: the in-memory ring of packed records (hone::packed_records).
struct packed_storage {
  using role = roles::replay_storage;
  template <class Transition>
  using storage_type = packed_records<Transition>;
};

/// The storage of hone::packed_storage (see the top of this header).
template <transition_type Transition>
class packed_records {
 public:
  using transition_type = Transition;
  using record_type = typename Transition::record;
  using batch_type = replay_batch<Transition>;
  /// Where the fields lie in a record.
  using layout = record_layout<Transition, true>;
  /// Bytes from one record to the next.
  static constexpr std::size_t stride = layout::bytes;
  /// Bytes of a record that hold data (the end of its last field; the rest is padding).
  static constexpr std::size_t data_bytes =
      layout::template offset<Transition::field_count - 1>() +
      Transition::template field_at<Transition::field_count - 1>::bytes;

  explicit packed_records(std::size_t capacity) : capacity_(capacity) {
    HONE_REQUIRE(capacity > 0, "hone::packed_storage: the capacity must be positive");
    HONE_REQUIRE(capacity <= std::numeric_limits<std::size_t>::max() / stride,
                 "hone::packed_storage: a capacity of " + std::to_string(capacity) +
                     " records of " + std::to_string(stride) +
                     " bytes overflows the addressable size; the capacity is probably a negative "
                     "number converted to size_t");
    records_ = buffer<std::byte>(capacity * stride);
    detail::advise_huge_pages(records_.data(), records_.size_bytes());  // random records
    std::memset(records_.data(), 0, records_.size_bytes());             // first touch
  }

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

  /// Copies a record into slot s.
  void write(std::size_t s, const record_type& rec) noexcept {
    layout::pack(rec, records_.data() + s * stride);
  }

  /// Copies rows [row, row + n) of a batch into slots [s, s + n) (no wrap: s + n <= capacity).
  void write_rows(std::size_t s, const batch_type& src, std::size_t row, std::size_t n) noexcept {
    const std::byte* from[Transition::field_count];
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      from[i] =
          reinterpret_cast<const std::byte*>(src.template column<i>().data()) + row * F::bytes;
    });
    std::byte* to = records_.data() + s * stride;
    for (std::size_t k = 0; k < n; ++k, to += stride) {
      Transition::for_each_field([&](auto i) {
        using F = typename Transition::template field_at<i>;
        std::memcpy(to + layout::template offset<i>(), from[i] + k * F::bytes, F::bytes);
      });
    }
  }

  /// Copies slot s into a record.
  void read(std::size_t s, record_type& rec) const noexcept {
    layout::unpack(records_.data() + s * stride, rec);
  }

  /// Starts loading the records of `slots` into the cache (every line holding data): called
  /// before gather() with work in between, the random reads overlap that work.
  void prefetch(std::span<const std::size_t> slots) const noexcept {
    const auto* base = reinterpret_cast<const char*>(records_.data());
    for (const std::size_t s : slots) {
      const char* p = base + s * stride;
      for (std::size_t b = 0; b < data_bytes; b += 64) HONE_PREFETCH(p + b);
      // A record may end in the next line unless the stride divides the 64-byte lines the
      // (64-byte aligned) records are cut into.
      if constexpr (data_bytes % 64 != 0 && (stride > 64 || 64 % stride != 0)) {
        HONE_PREFETCH(p + data_bytes - 1);
      }
    }
  }

  /// Copies slots[r] into row r of `out` for every r (out.size() >= slots.size()), record by
  /// record (each record's line(s) read once).
  void gather(std::span<const std::size_t> slots, batch_type& out) const noexcept {
    std::byte* to[Transition::field_count];
    Transition::for_each_field(
        [&](auto i) { to[i] = reinterpret_cast<std::byte*>(out.template column<i>().data()); });
    const std::byte* base = records_.data();
    for (std::size_t r = 0; r < slots.size(); ++r) {
      const std::byte* rec = base + slots[r] * stride;
      Transition::for_each_field([&](auto i) {
        using F = typename Transition::template field_at<i>;
        std::memcpy(to[i] + r * F::bytes, rec + layout::template offset<i>(), F::bytes);
      });
    }
  }

  /// The records (capacity() * stride bytes; slot s at s * stride, its fields at
  /// layout::offset<i>()).
  [[nodiscard]] std::span<const std::byte> records() const noexcept {
    return std::span<const std::byte>(records_.data(), records_.size_bytes());
  }

  /// Copies field `field` (its index in declaration order) of slots [first, first + n) into
  /// `out`, n = out.size() / the field's bytes, one row after the other (what the column of a
  /// hone::ring_storage holds there): how hone::save_replay_buffer writes one tensor per field.
  void read_field(std::size_t field, std::size_t first, std::span<std::byte> out) const noexcept {
    Transition::for_each_field([&](auto i) {
      if (i != field) return;
      constexpr std::size_t bytes = Transition::template field_at<i>::bytes;
      const std::byte* from = records_.data() + first * stride + layout::template offset<i>();
      for (std::size_t k = 0; k < out.size() / bytes; ++k, from += stride) {
        std::memcpy(out.data() + k * bytes, from, bytes);
      }
    });
  }
  /// Copies `in` (rows of field `field`, as read_field gives them) into slots [first, first + n):
  /// how hone::load_replay_buffer scatters a saved tensor back into the records.
  void write_field(std::size_t field, std::size_t first, std::span<const std::byte> in) noexcept {
    Transition::for_each_field([&](auto i) {
      if (i != field) return;
      constexpr std::size_t bytes = Transition::template field_at<i>::bytes;
      std::byte* to = records_.data() + first * stride + layout::template offset<i>();
      for (std::size_t k = 0; k < in.size() / bytes; ++k, to += stride) {
        std::memcpy(to, in.data() + k * bytes, bytes);
      }
    });
  }

 private:
  std::size_t capacity_;
  buffer<std::byte> records_;
};

HONE_NAMESPACE_END
