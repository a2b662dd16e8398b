// hone/rl/mmap_storage.hpp: the disk-backed ring (hone::mmap_ring) as a replay buffer's storage,
// for buffers larger than RAM that continue after a restart:
//
//   hone::replay_buffer<step, hone::mmap_storage, hone::prioritized<>> buffer(
//       1 << 26, hone::mmap_storage{.path = "replay.ring", .options = {.commit_every = 4096}},
//       hone::prioritized<>{});
//   buffer.add(record);     // packed into the file's next record
//   buffer.commit();        // optional: what is added so far survives a kill
//
// Records. Slot s of the buffer is slot s of the ring file; a record is the transition's fields
// packed in declaration order with no padding (Transition::bytes bytes: field i at the sum of the
// sizes of the fields before it), so the file does not depend on the compiler's struct layout.
// The file's header keeps a 64-bit signature of the transition's field list (names, dtypes,
// shapes; hone/rl/field_layout.hpp) in the ring's user tag: reopening the file with another
// transition type, another capacity or another record size is a hone::checkpoint_error, as is
// any damage the ring detects (the ring's open() never crashes on a bad file).
//
// Reopening. Constructing a buffer on an existing file continues it: the buffer's write position
// (total_added(), the next key) is the ring's end, and the items of the ring's last commit,
// sequence numbers [begin, end), are published to the sampler. Those need not fill the ring nor
// start at slot 0: the ring drops a block of its oldest records early when it wraps, and a kill
// loses what was added after the last commit, so the slots of sequences [end - capacity, begin)
// hold evicted or half-written bytes. The buffer remembers begin (its first live key) and never
// samples those slots: a prioritized sampler never gets them (priority 0), the uniform sampler
// rejects them, size() counts only live items and a key below begin is not contains()-ed. Each
// write after the reopen turns one such slot live again (slot = sequence % capacity), so after
// capacity - size() adds the buffer is full as usual.
//
// Priorities on reopen. The ring stores transitions, not priorities: a reopened prioritized
// buffer puts every live item at the policy's initial_priority (the running maximum of a fresh
// buffer, 1 by default), exactly like new items; the beta schedule and the sampling RNG start
// afresh too (seed() it). Save priorities and RNG with the buffer checkpoint of replay_io.hpp if
// they matter; an mmap_storage buffer itself is not saved that way (its file is its checkpoint).
//
// Durability. Items reach the file at each ring commit: every options.commit_every adds (1024 by
// default), when the ring wraps, on buffer.commit() and when the buffer is destroyed. After a
// kill the file holds exactly the last commit (see mmap_ring.hpp). Steps pending in an n-step
// window are not items yet: call flush() before shutting down if they must be kept.
//
// Limits: single_thread only (the ring appends in sequence order from one thread; a buffer with
// hone::many_writers and mmap_storage does not compile). add_batch of more than capacity rows
// writes every row (the ring keeps the last capacity), unlike the in-memory ring which skips the
// rows that would be overwritten at once.
//
// Storage interface: the one of hone/rl/ring_storage.hpp, constructed as S(capacity, policy),
// plus live_begin()/live_end() (what the file held when it was opened) and commit(). for_each_array
// yields one array, "records": the ring's record area (capacity * Transition::bytes bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/hash.hpp"
#include "hone/rl/batch.hpp"
#include "hone/rl/field_layout.hpp"
#include "hone/rl/mmap_ring.hpp"
#include "hone/rl/roles.hpp"
#include "hone/rl/sum_tree.hpp"  // HONE_PREFETCH
#include "hone/rl/transition.hpp"

HONE_NAMESPACE_BEGIN

template <transition_type Transition>
class mmap_records;

/// Storage policy: transitions in a memory-mapped ring file (hone::mmap_ring) at `path`, created
/// when missing, continued when it exists (see the top of this header).
struct mmap_storage {
  using role = roles::replay_storage;
  template <class Transition>
  using storage_type = mmap_records<Transition>;

  std::filesystem::path path;   ///< the ring file
  mmap_ring_options options{};  ///< commit_every, evict_block, sync, preallocate
};

/// The storage of hone::mmap_storage: a replay buffer's slots as the records of an mmap_ring.
template <transition_type Transition>
class mmap_records {
 public:
  using transition_type = Transition;
  using record_type = typename Transition::record;
  using batch_type = replay_batch<Transition>;
  /// The buffer reopens from this storage (hone::replay_buffer reads live_begin()/live_end()).
  static constexpr bool persistent = true;
  /// The file's records: the fields packed with no padding (hone/rl/field_layout.hpp).
  using layout = record_layout<Transition, false>;
  /// Bytes of one packed record.
  static constexpr std::size_t record_bytes = Transition::bytes;
  static_assert(layout::bytes == record_bytes);

  mmap_records(std::size_t capacity, const mmap_storage& policy)
      : ring_(open_ring(capacity, policy)), live_begin_(ring_.oldest()), live_end_(ring_.end()) {}

  [[nodiscard]] std::size_t capacity() const noexcept { return ring_.capacity(); }

  /// Appends a record; `slot` must be the ring's next slot (the buffer writes in sequence).
  void write(std::size_t s, const record_type& rec) {
    check_next(s);
    ring_.emplace([&](std::span<std::byte> dst) { pack(rec, dst.data()); });
  }

  /// Appends rows [row, row + n) of a batch (slots [s, s + n), in sequence).
  void write_rows(std::size_t s, const batch_type& src, std::size_t row, std::size_t n) {
    check_next(s);
    for (std::size_t k = 0; k < n; ++k) {
      ring_.emplace([&](std::span<std::byte> dst) {
        std::byte* out = dst.data();
        Transition::for_each_field([&](auto i) {
          using F = typename Transition::template field_at<i>;
          std::memcpy(out + offset<i>(), src.template column<i>().data() + (row + k) * F::count,
                      F::bytes);
        });
      });
    }
  }

  /// Copies slot s into a record.
  void read(std::size_t s, record_type& rec) const noexcept {
    layout::unpack(ring_.slot_data(s), rec);
  }

  /// Starts loading the records of `slots` into the cache.
  void prefetch(std::span<const std::size_t> slots) const noexcept {
    for (const std::size_t s : slots) {
      const auto* p = reinterpret_cast<const char*>(ring_.slot_data(s));
      for (std::size_t b = 0; b < record_bytes; b += 64) HONE_PREFETCH(p + b);
      HONE_PREFETCH(p + record_bytes - 1);
    }
  }

  /// Copies slots[r] into row r of `out`, field by field.
  void gather(std::span<const std::size_t> slots, batch_type& out) const noexcept {
    Transition::for_each_field([&](auto i) {
      using F = typename Transition::template field_at<i>;
      auto* dst = reinterpret_cast<std::byte*>(out.template column<i>().data());
      for (std::size_t r = 0; r < slots.size(); ++r) {
        std::memcpy(dst + r * F::bytes, ring_.slot_data(slots[r]) + offset<i>(), F::bytes);
      }
    });
  }

  /// f("records", bytes): the ring's record area (read-only in spirit: writing it bypasses the
  /// ring's commits).
  template <class F>
  void for_each_array(F&& f) {
    f(std::string_view("records"), std::span<std::byte>(const_cast<std::byte*>(ring_.slot_data(0)),
                                                        ring_.capacity() * record_bytes));
  }

  /// Commits the ring: every record written so far survives a kill.
  void commit() { ring_.commit(); }

  /// The first live sequence number and the end when the file was opened (equal for a new file).
  [[nodiscard]] std::uint64_t live_begin() const noexcept { return live_begin_; }
  [[nodiscard]] std::uint64_t live_end() const noexcept { return live_end_; }

  [[nodiscard]] const mmap_ring& ring() const noexcept { return ring_; }

  /// Byte offset of field I in a packed record.
  template <std::size_t I>
  [[nodiscard]] static constexpr std::size_t offset() noexcept {
    return layout::template offset<I>();
  }

 private:
  static mmap_ring open_ring(std::size_t capacity, const mmap_storage& policy) {
    HONE_REQUIRE(!policy.path.empty(),
                 "hone::mmap_storage: the path of the ring file is empty; pass "
                 "hone::mmap_storage{.path = \"replay.ring\"}");
    HONE_REQUIRE(capacity > 0, "hone::mmap_storage: the capacity must be positive");
    const std::uint64_t signature = transition_signature<Transition>();
    if (std::filesystem::exists(policy.path)) {
      mmap_ring r = mmap_ring::open(policy.path, policy.options, record_bytes, capacity);
      if (r.user_tag() == 0 && r.end() == 0) {  // created, killed before its first commit
        r.set_user_tag(signature);
        r.commit();
      }
      if (r.user_tag() != signature) {
        throw checkpoint_error("hone: mmap_storage file '" + policy.path.string() +
                               "' holds records of another transition type (its field signature " +
                               io::hex64(r.user_tag()) + " is not this buffer's " +
                               io::hex64(signature) + ": " +
                               replay_fields_text(replay_fields<Transition>()) +
                               "); open it with the transition it was written with, or use "
                               "another path");
      }
      return r;
    }
    mmap_ring r = mmap_ring::create(policy.path, record_bytes, capacity, policy.options);
    r.set_user_tag(signature);
    r.commit();
    return r;
  }

  void check_next(std::size_t s) const {
    if (s != static_cast<std::size_t>(ring_.end() % ring_.capacity())) {
      throw error("hone::mmap_storage: write to slot " + std::to_string(s) +
                  " but the ring's next slot is " + std::to_string(ring_.end() % ring_.capacity()) +
                  " (the storage appends in sequence; this is a bug in the caller)");
    }
  }

  static void pack(const record_type& rec, std::byte* out) noexcept { layout::pack(rec, out); }

  mmap_ring ring_;
  std::uint64_t live_begin_;
  std::uint64_t live_end_;
};

HONE_NAMESPACE_END
