// hone/rl/replay_buffer.hpp: hone::replay_buffer<Transition, Policies...>, a replay buffer
// composed at compile time from a storage, a sampler, a concurrency policy and a returns policy
// (any order; each role has a default), around the user's transition type:
//
//   using step = hone::transition<hone::field<"obs", float, 4>, hone::field<"action", int>,
//                                 hone::field<"reward", float>, hone::field<"next_obs", float, 4>,
//                                 hone::field<"terminated", bool>, hone::field<"truncated", bool>>;
//   hone::replay_buffer<step, hone::prioritized<>> buffer(1 << 20);  // packed, PER, 1 thread
//   buffer.add(record);                                  // one environment step
//   hone::replay_batch<step> batch;
//   buffer.sample(256, batch);                           // columns + keys + weights
//   buffer.update_priorities(batch.keys(), td_errors);   // stale keys are ignored
//
// Roles (hone/rl/roles.hpp):   storage      hone::auto_storage (default: hone::packed_storage
//                                           for records of at most 2048 bytes, else
//                                           hone::ring_storage), hone::ring_storage,
//                                           hone::packed_storage, hone::mmap_storage
//                              sampler      hone::uniform (default), hone::prioritized<Arity>
//                              concurrency  hone::single_thread (default), hone::many_writers
//                              returns      hone::one_step (default), hone::n_step<N>
//
// Keys. Every stored item has a sequence number (the count of items stored before it). A sample
// returns it as the item's key, and update_priorities applies a priority only when the slot
// still holds that very item: an update that arrives after its slot was overwritten is ignored
// (ape-x #7), whatever the timing.
//
// Storage construction. A storage policy that carries settings (hone::mmap_storage: a path and
// ring options) constructs its storage as S(capacity, policy); others as S(capacity). A
// persistent storage (S::persistent, hone/rl/mmap_storage.hpp) may hold items when the buffer is
// constructed: the buffer then starts at its live_end() (the next key) and publishes the items
// [live_begin(), live_end()); slots of older keys are never sampled (see mmap_storage.hpp).
// Saving a whole in-memory buffer: hone/rl/replay_io.hpp (with_snapshot below).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/profile/zone.hpp"
#include "hone/rl/auto_storage.hpp"
#include "hone/rl/batch.hpp"
#include "hone/rl/concurrency.hpp"
#include "hone/rl/n_step.hpp"
#include "hone/rl/packed_storage.hpp"
#include "hone/rl/prioritized_sampler.hpp"
#include "hone/rl/ring_storage.hpp"
#include "hone/rl/rng.hpp"
#include "hone/rl/roles.hpp"
#include "hone/rl/transition.hpp"
#include "hone/rl/uniform_sampler.hpp"

HONE_NAMESPACE_BEGIN

/// Everything a saved buffer needs besides its columns and priorities: positions, the RNG and the
/// sampler's counters. See replay_buffer::state() and restore().
namespace detail {
template <class S>
concept persistent_replay_storage = requires {
  { S::persistent } -> std::convertible_to<bool>;
}
&&S::persistent;

// Whether storage S keeps one array per field (for_each_array: hone::ring_storage's columns).
struct column_probe {
  void operator()(std::string_view, std::span<std::byte>) const noexcept {}
};
template <class S>
concept column_replay_storage = requires(S& s) {
  s.for_each_array(column_probe{});
};
// Whether storage S copies one field of a run of slots out and in (every in-memory storage).
template <class S>
concept field_copy_replay_storage = requires(S& s, const S& cs, std::size_t n,
                                             std::span<std::byte> out,
                                             std::span<const std::byte> in) {
  cs.read_field(n, n, out);
  s.write_field(n, n, in);
};
}  // namespace detail

struct replay_state {
  std::uint64_t written = 0;       ///< items stored so far (the next item's key)
  std::uint64_t sample_calls = 0;  ///< sample() calls (the beta schedule's step)
  float max_priority = 1.0f;       ///< the prioritized sampler's running maximum
  replay_rng::state_type rng{};    ///< the sampling RNG
};

template <transition_type Transition, class... Policies>
class replay_buffer {
  static_assert(detail::check_replay_policies<Policies...>());

  template <class Role, class Default>
  using pick = typename detail::pick_impl<Role, Default, Policies...>::type;

 public:
  using transition_type = Transition;
  using record_type = typename Transition::record;
  using batch_type = replay_batch<Transition>;
  using storage_policy = pick<roles::replay_storage, auto_storage>;
  using sampler_policy = pick<roles::replay_sampler, uniform>;
  using concurrency_policy = pick<roles::replay_concurrency, single_thread>;
  using returns_policy = pick<roles::replay_returns, one_step>;
  using storage_type = typename storage_policy::template storage_type<Transition>;
  using sampler_type = typename sampler_policy::sampler_type;
  using window_type = typename returns_policy::template window_type<Transition>;

  static constexpr bool concurrent = concurrency_policy::concurrent;
  static constexpr bool is_prioritized = sampler_type::is_prioritized;
  /// Whether add() keeps per-stream state (n-step windows).
  static constexpr bool windowed = !std::is_same_v<window_type, one_step_window<Transition>>;
  /// Whether the storage keeps one array per field (hone::ring_storage), so that
  /// for_each_column() works; a storage of packed records (hone::packed_storage) does not.
  static constexpr bool has_columns = detail::column_replay_storage<storage_type>;
  /// Whether the storage outlives the process (hone::mmap_storage): reopened on construction.
  static constexpr bool persistent = detail::persistent_replay_storage<storage_type>;
  static_assert(!(concurrent && persistent),
                "hone::replay_buffer: hone::mmap_storage appends records in sequence order from "
                "one thread; use it with hone::single_thread (the default), not "
                "hone::many_writers.");

  /// A buffer of `capacity` items with every policy default-configured.
  explicit replay_buffer(std::size_t capacity) requires(sizeof...(Policies) > 0)
      : replay_buffer(capacity, Policies{}...) {}

  /// A buffer of `capacity` items; the policies carry their settings, in the order of the
  /// template arguments: replay_buffer<step, hone::prioritized<>, hone::n_step<3>>
  /// buffer(1 << 20, hone::prioritized<>{.alpha = 0.7}, hone::n_step<3>{.gamma = 0.99}).
  explicit replay_buffer(std::size_t capacity, const Policies&... policies)
      : capacity_(capacity),
        storage_(make_storage(capacity,
                              hone::policy_of<roles::replay_storage, auto_storage>(policies...))),
        sampler_(capacity, hone::policy_of<roles::replay_sampler, uniform>(policies...)),
        returns_(hone::policy_of<roles::replay_returns, one_step>(policies...)),
        window_(returns_) {
    if constexpr (concurrent) {
      tags_ = buffer<std::uint64_t>(capacity, empty_tag);
    }
    if constexpr (persistent) reopen();
  }

  replay_buffer(const replay_buffer&) = delete;
  replay_buffer& operator=(const replay_buffer&) = delete;

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// Items that can be sampled now.
  [[nodiscard]] std::size_t size() const {
    std::lock_guard lock(mutex_);
    if constexpr (concurrent) {
      return ready_;
    } else if constexpr (persistent) {
      return static_cast<std::size_t>(std::min<std::uint64_t>(written_ - live_begin_, capacity_));
    } else {
      return static_cast<std::size_t>(std::min<std::uint64_t>(written_, capacity_));
    }
  }
  [[nodiscard]] bool empty() const { return size() == 0; }
  /// Items stored so far, overwritten ones included: the key the next item gets (under
  /// many_writers, writes in progress count too).
  [[nodiscard]] std::uint64_t total_added() const {
    std::lock_guard lock(mutex_);
    return written_;
  }

  /// Reseeds the sampling RNG (learner thread).
  void seed(std::uint64_t s) {
    std::lock_guard lock(mutex_);
    rng_.seed(s);
  }

  // ---- adding ------------------------------------------------------------------------------

  /// Adds one environment step. With one_step it is stored as it is (thread-safe under
  /// many_writers); with n_step<N> it goes through the buffer's own window (one stream; under
  /// many_writers use a writer() per thread instead).
  void add(const record_type& r) {
    static_assert(!(concurrent && windowed),
                  "hone::replay_buffer::add: with hone::many_writers and hone::n_step, each "
                  "thread (each environment) needs its own n-step window: auto w = "
                  "buffer.writer(); w.add(step);");
    if constexpr (windowed) {
      window_.push(r, [this](const record_type& x) { store(x); });
    } else {
      store(r);
    }
  }

  /// Adds the rows of a batch in order (rows are consecutive steps of one stream when n-step
  /// returns are on). One-step buffers copy whole column ranges.
  void add_batch(const batch_type& b) {
    static_assert(!(concurrent && windowed),
                  "hone::replay_buffer::add_batch: with hone::many_writers and hone::n_step, add "
                  "through one writer() per thread.");
    HONE_ZONE("hone.replay.add_batch");
    if constexpr (windowed) {
      for (std::size_t r = 0; r < b.size(); ++r) add(b.row(r));
    } else {
      store_rows(b);
    }
  }

  /// Steps held in the buffer's own n-step window (not stored items yet; 0 with one_step).
  [[nodiscard]] std::size_t pending() const noexcept { return window_.pending(); }

  /// Persistent storage (hone::mmap_storage): makes every item stored so far survive a kill of
  /// the process (a ring commit; also done every commit_every adds, on wrap and on destruction).
  void commit() requires persistent {
    std::lock_guard lock(mutex_);
    storage_.commit();
  }

  /// Emits the steps pending in the buffer's own n-step window (end of data collection).
  void flush() {
    static_assert(!concurrent || !windowed, "hone::replay_buffer::flush: flush each writer().");
    window_.flush([this](const record_type& x) { store(x); });
  }

  /// A writer: one stream of steps (one actor thread, one environment) with its own n-step
  /// window. Under many_writers any number of writers add concurrently. The writer must not
  /// outlive the buffer.
  class writer_type {
   public:
    void add(const record_type& r) {
      window_.push(r, [this](const record_type& x) { buffer_->store(x); });
    }
    void add_batch(const batch_type& b) {
      if constexpr (windowed) {
        for (std::size_t r = 0; r < b.size(); ++r) add(b.row(r));
      } else {
        buffer_->store_rows(b);
      }
    }
    /// Emits the pending steps (this stream stops in mid-episode).
    void flush() {
      window_.flush([this](const record_type& x) { buffer_->store(x); });
    }
    /// Drops the pending steps (the environment was reset without a final step).
    void reset() noexcept { window_.reset(); }
    [[nodiscard]] std::size_t pending() const noexcept { return window_.pending(); }

   private:
    friend class replay_buffer;
    explicit writer_type(replay_buffer& b) : buffer_(&b), window_(b.returns_) {}
    replay_buffer* buffer_;
    window_type window_;
  };
  [[nodiscard]] writer_type writer() { return writer_type(*this); }

  // ---- learning ----------------------------------------------------------------------------

  /// Draws n items into `out` (resized to n): the columns, the keys and the importance weights.
  /// Throws hone::error when nothing can be sampled (empty buffer, all priorities 0).
  std::size_t sample(std::size_t n, batch_type& out) {
    HONE_ZONE("hone.replay.sample");
    out.resize(n);
    if (n == 0) return 0;
    std::lock_guard lock(mutex_);
    const auto filled = static_cast<std::size_t>(std::min<std::uint64_t>(written_, capacity_));
    if constexpr (concurrent) {
      if (ready_ == 0) {
        throw error("hone::replay_buffer::sample: no transition is stored yet; add first");
      }
    }
    sampler_.sample(
        filled, rng_, out.slots(), out.weights(), [this](std::size_t s) { return ready(s); },
        [this](std::span<const std::size_t> s) { storage_.prefetch(s); });
    const std::span<const std::size_t> slots = out.slots();
    std::span<std::uint64_t> keys = out.keys();
    for (std::size_t r = 0; r < n; ++r) keys[r] = key_of(slots[r]);
    storage_.gather(slots, out);
    return n;
  }

  /// Sets the priorities of the items named by `keys` from raw values (|TD error|; the sampler
  /// applies epsilon and alpha). Keys whose slot was overwritten since they were sampled are
  /// ignored. Returns how many were applied. Throws config_error (applying none) for a negative,
  /// NaN or infinite value or mismatched lengths.
  std::size_t update_priorities(std::span<const std::uint64_t> keys,
                                std::span<const float> priorities) requires is_prioritized {
    HONE_ZONE("hone.replay.update_priorities");
    HONE_REQUIRE(keys.size() == priorities.size(),
                 "hone::replay_buffer::update_priorities: " + std::to_string(keys.size()) +
                     " keys but " + std::to_string(priorities.size()) + " priorities");
    for (std::size_t k = 0; k < priorities.size(); ++k) {
      if (!(priorities[k] >= 0.0f) || !std::isfinite(priorities[k])) {
        throw config_error("hone::replay_buffer::update_priorities: priority " + std::to_string(k) +
                           " is " + std::to_string(priorities[k]) +
                           "; priorities must be finite and >= 0 (pass |TD error|)");
      }
    }
    constexpr std::size_t chunk = 512;
    std::size_t slots[chunk];
    float values[chunk];
    std::size_t applied = 0;
    std::lock_guard lock(mutex_);
    for (std::size_t begin = 0; begin < keys.size(); begin += chunk) {
      const std::size_t m = std::min(chunk, keys.size() - begin);
      std::size_t kept = 0;
      for (std::size_t k = 0; k < m; ++k) {
        const std::uint64_t key = keys[begin + k];
        if (!current(key)) continue;
        slots[kept] = recent_slot(key);
        values[kept] = priorities[begin + k];
        ++kept;
      }
      sampler_.update(std::span<const std::size_t>(slots, kept),
                      std::span<const float>(values, kept));
      applied += kept;
    }
    return applied;
  }

  /// Whether `key` still names a stored item (its slot has not been rewritten since).
  [[nodiscard]] bool contains(std::uint64_t key) const {
    std::lock_guard lock(mutex_);
    return current(key);
  }

  // ---- saving and restoring (for hone's checkpoint writer; no writer may run meanwhile) -------

  /// Positions, RNG and sampler counters.
  [[nodiscard]] replay_state state() const {
    std::lock_guard lock(mutex_);
    return state_unlocked();
  }
  /// Calls f(state()) with the buffer locked once no write is in flight (many_writers: writers
  /// that have not reserved their sequence numbers yet wait until f returns, and every sequence
  /// number reserved below state().written is published first, so slot s holds the key
  /// state().written - 1 - ((state().written - 1 - s) mod capacity)). f may call priorities() and
  /// for_each_column() (they take no lock), not the locking members. A consistent snapshot for
  /// hone::save_replay_buffer.
  template <class F>
  void with_snapshot(F&& f) {
    std::unique_lock lock(mutex_);
    if constexpr (concurrent) {
      ++snapshots_;  // new reservations wait (so the writes in flight can only drain)
      struct release_writers {
        replay_buffer* b;
        ~release_writers() {
          if (--b->snapshots_ == 0 && b->waiting_ > 0) b->cond_.notify_all();
        }
      } guard{this};
      if (published_ != written_) {
        ++waiting_;
        cond_.wait(lock, [&] { return published_ == written_; });
        --waiting_;
      }
      std::forward<F>(f)(state_unlocked());
    } else {
      std::forward<F>(f)(state_unlocked());
    }
  }
  /// many_writers: sequence numbers reserved but not yet published, whether their writer is
  /// copying or still waiting for its slot (0 for single_thread).
  [[nodiscard]] std::size_t writes_in_flight() const {
    std::lock_guard lock(mutex_);
    if constexpr (concurrent) {
      return static_cast<std::size_t>(written_ - published_);
    } else {
      return 0;
    }
  }

 private:
  [[nodiscard]] replay_state state_unlocked() const {
    replay_state s;
    s.written = written_;
    s.rng = rng_.state();
    if constexpr (is_prioritized) {
      s.sample_calls = sampler_.steps();
      s.max_priority = sampler_.max_priority();
    }
    return s;
  }

 public:
  /// The stored priority of every slot (prioritized sampler; 0 for empty slots).
  [[nodiscard]] std::span<const float> priorities() const requires is_prioritized {
    return sampler_.tree().leaves();
  }
  /// f(name, std::span<std::byte>) for every column of the storage: a checkpoint reads the bytes
  /// to save them and writes them back to restore. Only for a storage with one array per field
  /// (has_columns: hone::ring_storage); read_field()/write_field() work with every in-memory
  /// storage.
  template <class F>
  void for_each_column(F&& f) {
    static_assert(has_columns,
                  "hone::replay_buffer::for_each_column: this buffer's storage keeps each "
                  "transition in one packed record (hone::packed_storage, which the default "
                  "hone::auto_storage picks for transitions of at most 2048 bytes), so it has no "
                  "per-field columns; name hone::ring_storage among the buffer's policies "
                  "(hone::replay_buffer<T, hone::ring_storage, ...>) to get columns, or copy a "
                  "field out and in with read_field()/write_field(), which every in-memory storage "
                  "supports.");
    if constexpr (has_columns) storage_.for_each_array(std::forward<F>(f));
  }
  /// Copies field `field` (its index in declaration order) of slots [first, first + n) into `out`,
  /// n = out.size() / the field's bytes per item: the rows one after the other, as a
  /// hone::ring_storage column holds them, whatever the in-memory storage (what
  /// hone::save_replay_buffer writes). Takes no lock, like priorities(): call it in with_snapshot's
  /// f or with the writers stopped. config_error for a field or slot range out of bounds, or a
  /// size that is not whole items.
  void read_field(std::size_t field, std::size_t first, std::span<std::byte> out)
      const requires detail::field_copy_replay_storage<storage_type> {
    check_field_range("read_field", field, first, out.size());
    if (!out.empty()) storage_.read_field(field, first, out);
  }
  /// Copies `in` (items of field `field`, as read_field() gives them) into slots
  /// [first, first + n): what hone::load_replay_buffer does before restore(). Takes no lock; no
  /// writer may run meanwhile. config_error as for read_field().
  void write_field(std::size_t field, std::size_t first, std::span<const std::byte> in) requires
      detail::field_copy_replay_storage<storage_type> {
    check_field_range("write_field", field, first, in.size());
    if (!in.empty()) storage_.write_field(field, first, in);
  }
  /// Bytes per item of field `field` (declaration order); 0 past the last field.
  [[nodiscard]] static constexpr std::size_t field_bytes(std::size_t field) noexcept {
    std::size_t bytes = 0;
    Transition::for_each_field([&](auto i) {
      if (i == field) bytes = Transition::template field_at<i>::bytes;
    });
    return bytes;
  }
  /// Restores positions, RNG and priorities after the columns were written back
  /// (for_each_column). Every stored item is published; the sum tree is rebuilt in O(N).
  void restore(const replay_state& s,
               std::span<const float> priorities = {}) requires(!persistent) {
    std::lock_guard lock(mutex_);
    written_ = s.written;
    head_ = static_cast<std::size_t>(written_ % capacity_);
    rng_.set_state(s.rng);
    if constexpr (is_prioritized) {
      HONE_REQUIRE(priorities.size() == capacity_,
                   "hone::replay_buffer::restore: a prioritized buffer needs its " +
                       std::to_string(capacity_) + " priorities");
      sampler_.restore(priorities, s.max_priority, s.sample_calls);
    }
    if constexpr (concurrent) {
      published_ = written_;
      ready_ = 0;
      for (std::size_t slot = 0; slot < capacity_; ++slot) {
        if (slot < written_) {
          tags_[slot] = key_from_position(slot);
          ++ready_;
        } else {
          tags_[slot] = empty_tag;
        }
      }
    }
  }

  [[nodiscard]] const storage_type& storage() const noexcept { return storage_; }
  [[nodiscard]] const sampler_type& sampler() const noexcept { return sampler_; }
  [[nodiscard]] const returns_policy& returns() const noexcept { return returns_; }

 private:
  static constexpr std::uint64_t empty_tag = ~std::uint64_t{0};
  static constexpr std::uint64_t busy_tag = ~std::uint64_t{0} - 1;

  void check_field_range(const char* what, std::size_t field, std::size_t first,
                         std::size_t bytes) const {
    const std::size_t item = field_bytes(field);
    if (item == 0 || bytes % item != 0 || first > capacity_ || bytes / item > capacity_ - first) {
      throw config_error(
          std::string("hone::replay_buffer::") + what + ": field " + std::to_string(field) +
          (item == 0 ? " does not exist (the transition has " +
                           std::to_string(Transition::field_count) + " fields)"
                     : ", slots from " + std::to_string(first) + ", " + std::to_string(bytes) +
                           " bytes: the bytes must be whole items of " + std::to_string(item) +
                           " and the slots within the capacity " + std::to_string(capacity_)));
    }
  }

  // S(capacity, policy) for storages configured by their policy, S(capacity) for the others.
  template <class P>
  static storage_type make_storage(std::size_t capacity, const P& policy) {
    if constexpr (std::is_constructible_v<storage_type, std::size_t, const P&>) {
      return storage_type(capacity, policy);
    } else {
      return storage_type(capacity);
    }
  }

  // Persistent storage: continue from what the storage holds (see the top of this file).
  void reopen() {
    const std::uint64_t begin = storage_.live_begin();
    const std::uint64_t end = storage_.live_end();
    HONE_REQUIRE(begin <= end && end - begin <= capacity_,
                 "hone::replay_buffer: the storage's live range is inconsistent");
    written_ = end;
    head_ = static_cast<std::size_t>(end % capacity_);
    live_begin_ = begin;
    std::uint64_t seq = begin;
    while (seq < end) {  // publish [begin, end) in runs of consecutive slots
      const auto slot = static_cast<std::size_t>(seq % capacity_);
      const auto run =
          static_cast<std::size_t>(std::min<std::uint64_t>(end - seq, capacity_ - slot));
      sampler_.insert(slot, run);
      seq += run;
    }
  }

  // The key of the item in `slot` when every write up to written_ is published (written_ > 0).
  // head_ (= written_ % capacity_) spares a 64-bit division per item.
  [[nodiscard]] std::uint64_t key_from_position(std::size_t slot) const noexcept {
    const std::size_t last_slot = head_ == 0 ? capacity_ - 1 : head_ - 1;
    const std::size_t back = last_slot >= slot ? last_slot - slot : last_slot + capacity_ - slot;
    return written_ - 1 - back;
  }
  // The slot of a key issued among the last capacity_ writes (1 <= written_ - key <= capacity_).
  [[nodiscard]] std::size_t recent_slot(std::uint64_t key) const noexcept {
    const auto d = static_cast<std::size_t>(written_ - key);
    return head_ >= d ? head_ - d : head_ + capacity_ - d;
  }
  [[nodiscard]] std::uint64_t key_of(std::size_t slot) const noexcept {
    if constexpr (concurrent) {
      return tags_[slot];
    } else {
      return key_from_position(slot);
    }
  }
  // Whether `key` names a stored item. Only the last capacity_ keys issued can (an older key's
  // slot has been claimed again); under many_writers the slot's tag must also be that key (not
  // busy: the item is published).
  [[nodiscard]] bool current(std::uint64_t key) const noexcept {
    const bool recent = key < written_ && written_ - key <= capacity_;
    if constexpr (persistent) {
      return recent && key >= live_begin_;
    } else if constexpr (concurrent) {
      return recent && tags_[recent_slot(key)] == key;
    } else {
      return recent;
    }
  }
  [[nodiscard]] bool ready(std::size_t slot) const {
    if constexpr (concurrent) {
      return tags_[slot] < busy_tag;
    } else if constexpr (persistent) {
      // Slots of keys below live_begin_ (evicted or lost to a kill before a reopen) are not
      // sampled; with no live item at all, sampling is an error rather than an endless loop.
      if (key_from_position(slot) >= live_begin_) return true;
      if (written_ == live_begin_) {
        throw error(
            "hone::replay_buffer::sample: the reopened buffer holds no live item yet; add "
            "first");
      }
      return false;
    } else {
      (void)slot;
      return true;
    }
  }

  // Stores one item (the output of a window).
  void store(const record_type& r) {
    if constexpr (concurrent) {
      const auto [seq, slot] = reserve_one();
      storage_.write(slot, r);
      std::lock_guard lock(mutex_);
      publish(seq, slot);
      if (waiting_ > 0) cond_.notify_all();
    } else {
      const std::size_t slot = head_;
      ++written_;
      head_ = head_ + 1 == capacity_ ? 0 : head_ + 1;
      storage_.write(slot, r);
      sampler_.insert(slot, 1);
    }
  }

  // Stores the rows of a batch (one-step buffers), whole column ranges at a time.
  void store_rows(const batch_type& b) {
    std::size_t row = 0;
    std::size_t n = b.size();
    if constexpr (!concurrent && !persistent) {
      if (n > capacity_) {  // the first rows would be overwritten by the last ones
        written_ += n - capacity_;
        head_ = static_cast<std::size_t>(written_ % capacity_);
        row = n - capacity_;
        n = capacity_;
      }
    }
    while (n > 0) {
      const std::size_t m = std::min(n, capacity_);
      if constexpr (concurrent) {
        std::uint64_t first;
        {
          std::unique_lock lock(mutex_);
          await_snapshot(lock);
          first = written_;
          written_ += m;
          head_ = static_cast<std::size_t>(written_ % capacity_);
          for (std::uint64_t seq = first; seq < first + m; ++seq) claim(lock, seq);
        }
        copy_rows(first, b, row, m);
        std::lock_guard lock(mutex_);
        for (std::uint64_t seq = first; seq < first + m; ++seq) {
          publish(seq, static_cast<std::size_t>(seq % capacity_));
        }
        if (waiting_ > 0) cond_.notify_all();
      } else {
        const std::uint64_t first = written_;
        written_ += m;
        head_ = static_cast<std::size_t>(written_ % capacity_);
        copy_rows(first, b, row, m);
        std::size_t slot = static_cast<std::size_t>(first % capacity_);
        std::size_t left = m;
        while (left > 0) {
          const std::size_t seg = std::min(left, capacity_ - slot);
          sampler_.insert(slot, seg);
          left -= seg;
          slot = 0;
        }
      }
      row += m;
      n -= m;
    }
  }

  // Copies rows [row, row + m) to the slots of sequence numbers [first, first + m) (may wrap).
  void copy_rows(std::uint64_t first, const batch_type& b, std::size_t row, std::size_t m) {
    std::size_t slot = static_cast<std::size_t>(first % capacity_);
    while (m > 0) {
      const std::size_t seg = std::min(m, capacity_ - slot);
      storage_.write_rows(slot, b, row, seg);
      row += seg;
      m -= seg;
      slot = 0;
    }
  }

  // many_writers: reserve the next sequence number and its slot (marked busy).
  std::pair<std::uint64_t, std::size_t> reserve_one() {
    std::unique_lock lock(mutex_);
    await_snapshot(lock);
    const std::uint64_t seq = written_++;
    head_ = head_ + 1 == capacity_ ? 0 : head_ + 1;
    return {seq, claim(lock, seq)};
  }
  // many_writers, mutex held: a writer about to reserve waits while a snapshot drains the writes
  // in flight (with_snapshot), so a stream of new writes cannot keep it waiting.
  template <class Lock>
  void await_snapshot(Lock& lock) {
    if (snapshots_ > 0) {
      ++waiting_;
      cond_.wait(lock, [&] { return snapshots_ == 0; });
      --waiting_;
    }
  }
  // many_writers, mutex held: waits until the slot of `seq` holds the item one lap older (its
  // writer may still be copying), retires that item and marks the slot busy.
  template <class Lock>
  std::size_t claim(Lock& lock, std::uint64_t seq) {
    const auto slot = static_cast<std::size_t>(seq % capacity_);
    const std::uint64_t previous = seq >= capacity_ ? seq - capacity_ : empty_tag;
    if (tags_[slot] != previous) {
      ++waiting_;
      cond_.wait(lock, [&] { return tags_[slot] == previous; });
      --waiting_;
    }
    if (previous != empty_tag) {
      sampler_.retire(slot);
      --ready_;
    }
    tags_[slot] = busy_tag;
    return slot;
  }
  // many_writers, mutex held: the copy into `slot` is complete.
  void publish(std::uint64_t seq, std::size_t slot) {
    tags_[slot] = seq;
    sampler_.insert(slot, 1);
    ++ready_;
    ++published_;
  }

  std::size_t capacity_;
  storage_type storage_;
  sampler_type sampler_;
  returns_policy returns_;
  window_type window_;
  replay_rng rng_;
  std::uint64_t live_begin_ = 0;  // persistent storage: the first key that may be sampled
  std::uint64_t written_ = 0;
  std::size_t head_ = 0;  // written_ % capacity_: the slot of the next write
  // many_writers only.
  buffer<std::uint64_t> tags_;
  std::size_t ready_ = 0;        // published slots (what size() reports)
  std::uint64_t published_ = 0;  // items published so far: written_ - published_ are in flight
  std::size_t waiting_ = 0;      // threads in cond_.wait
  std::size_t snapshots_ = 0;    // with_snapshot calls holding back new reservations
  mutable typename concurrency_policy::mutex_type mutex_;
  typename concurrency_policy::condition_type cond_;
};

HONE_NAMESPACE_END
