// hone/data/loader.hpp: batches from a dataset, assembled ahead of the consumer by oneTBB threads.
//
//   hone::data::line_dataset ds("train.txt");
//   struct rows { std::vector<char> bytes = std::vector<char>(64 * 2048); };   // reused buffer
//   auto collate = [](rows& b, std::size_t row, std::string_view rec) {
//     std::memcpy(b.bytes.data() + row * 2048, rec.data(), std::min<std::size_t>(rec.size(),
//     2048));
//   };
//   hone::data::loader ld(ds, rows{}, collate, {.batch_size = 64, .threads = 2, .seed = 7},
//                         hone::data::shuffled_sampler{});
//   while (auto* b = ld.next()) train_on(b->data, b->info.rows);   // nullptr: the epoch ended
//
// How it works. One dataset object is shared by every thread (threads, not processes: no copy of
// the dataset per worker). The loader owns prefetch + 1 batches, copies of the caller's
// prototype, reused for the whole run. It keeps `prefetch` batches scheduled ahead of the one the
// consumer holds; each is filled by one task in the loader's oneTBB arena of `threads` threads:
// for every row, the sample is read (get(i), or get(i, buffer) into a buffer the batch slot owns)
// and handed to collate(batch, row, sample), then the optional transform runs on the whole batch.
// When the consumer asks for a batch that no thread has started, it fills it itself, so
// threads = 0 reads synchronously on the consumer's thread. Scheduling runs on across the end of an
// epoch (the workers stay, and the next epoch's first batches are prefetched); next() returns
// nullptr once at each epoch's end.
//
// Reproducibility. A batch's content is a function of the sampler's epoch order, the batch's place
// in it and the seed: never of the thread that filled it or when. The transform's generator
// (batch_info::rng) is keyed by (seed, epoch, the epoch position of the batch's first sample).
// So any thread count and prefetch depth give bitwise the same batches, and a run restored from
// state() (loader_state.hpp) continues with the batches the uninterrupted run would have had (with
// the same batch size; a distributed run also with another world size, dealing out the rest).
//
// The last batch: `last_batch::keep` delivers it short, `drop` leaves it unread, `pad` fills
// every short batch (the last one, or one that lost skipped records) up to batch_size by repeating
// its own rows 0, 1, ... in order; info.rows counts the real rows either way.
//
// Bad records. When get() or collate throws for a sample, `on_bad_record::stop` (the default)
// makes next() throw a sample_error at that batch, in order (the batches before it are delivered),
// naming the sample, its epoch position and, for datasets with offset(i) and path() such as
// line_dataset, the file and byte offset; the loader stays failed (next() throws again).
// `on_bad_record::skip` leaves the record out of its batch, counts it (skipped(),
// loader_state::skipped, info.skipped) and keeps the first 64 (skipped_records()). A batch whose
// records were all skipped is not delivered.
#pragma once

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/data/dataset.hpp"
#include "hone/data/loader_state.hpp"
#include "hone/data/sampler.hpp"
#include "hone/profile/zone.hpp"
#include "hone/rl/rng.hpp"

HONE_NAMESPACE_BEGIN
namespace data {

/// What happens to an epoch's last batch when it is short (header comment).
enum class last_batch { keep, drop, pad };

/// What a sample that cannot be read or collated does (header comment).
enum class on_bad_record { stop, skip };

struct loader_options {
  std::size_t batch_size = 1;  // rows per batch (>= 1)
  std::size_t threads = 1;     // oneTBB threads filling batches (at most oneTBB's worker
                               // limit); 0: the consumer fills them
  std::size_t prefetch = 2;    // batches scheduled ahead of the consumer's (>= 1)
  std::uint64_t seed = 0;      // the seed of the sampler and of batch transforms
  last_batch last = last_batch::keep;
  on_bad_record bad_records = on_bad_record::stop;
};

/// Where a batch sits and what it holds.
struct batch_info {
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  std::uint64_t index = 0;  // first_position / (batch_size * world): its place in the epoch
  std::uint64_t first_position = 0;        // the epoch position of its first sample
  std::size_t rows = 0;                    // real rows (samples read)
  std::size_t padded_rows = 0;             // rows written, padding included (batch_size with pad)
  std::size_t skipped = 0;                 // bad records left out of it (on_bad_record::skip)
  std::span<const std::uint64_t> indices;  // each real row's sample index

  /// The batch's own generator: a pure function of (seed, epoch, first_position, stream), the
  /// same whatever thread fills the batch and in a resumed run.
  [[nodiscard]] replay_rng rng(std::uint64_t stream = 0) const noexcept {
    return replay_rng(
        detail::key(detail::key(seed, detail::stream_batch, epoch, first_position), stream));
  }
};

/// A batch as next() hands it out: the caller's batch type, filled, and where it sits. Valid until
/// the next call of next(); the loader reuses its storage.
template <class Batch>
struct loaded_batch {
  Batch data;
  batch_info info;
};

namespace detail {
/// The sample type a dataset hands to collate, and the buffer a batch slot keeps for it: the view
/// form when the dataset has one (no copy), else the buffer form.
template <class D, bool View = dataset_has_view_get<D>, bool Buffer = dataset_has_buffer_get<D>>
struct sample_access {
  using sample = const void*;  // not a dataset: check_dataset's sentence has been given
  struct buffer {};
};
template <class D, bool Buffer>
struct sample_access<D, true, Buffer> {
  using sample = decltype(std::declval<const D&>().get(std::size_t{}));
  struct buffer {};
};
template <class D>
struct sample_access<D, false, true> {
  using sample = const typename D::buffer_type&;
  using buffer = typename D::buffer_type;
};
}  // namespace detail

/// A collate function for Batch and a dataset's sample: `collate(batch, row, sample)` callable
/// through a const reference (several threads call it at once, on different batches).
template <class C, class Batch, class Sample>
concept collate_function = std::invocable<const C&, Batch&, std::size_t, Sample>;

/// Fails to compile with a sentence when C cannot collate D's samples into Batch; true otherwise.
template <class C, class Batch, class D>
consteval bool check_collate() {
  using sample = typename detail::sample_access<D>::sample;
  static_assert(collate_function<C, Batch, sample>,
                "hone::data::loader: the collate function cannot be called as "
                "collate(Batch& batch, std::size_t row, Sample sample) through a const reference, "
                "where Sample is what the dataset's get(i) returns (or a const reference to its "
                "buffer_type). Take those three arguments, and make operator() const: several "
                "threads call it at once.");
  return collate_function<C, Batch, sample>;
}

/// Batches of D assembled by oneTBB threads in the order of Sampler (header comment). Not movable:
/// its tasks refer to it.
template <class D, class Batch, class Collate, class Sampler = sequential_sampler>
class loader {
  static_assert(check_dataset<D>());
  static_assert(check_sampler<Sampler>());
  static_assert(std::copy_constructible<Batch>,
                "hone::data::loader: the batch type must be copy-constructible: the loader copies "
                "the prototype you pass into each of its prefetch + 1 reused batches");

  using access = detail::sample_access<D>;

 public:
  using batch_type = Batch;
  using transform_type = std::function<void(Batch&, const batch_info&)>;

  /// Reads `ds` (which must outlive the loader) into copies of `prototype` through `collate`.
  loader(const D& ds, Batch prototype, Collate collate, loader_options options = {},
         Sampler sampler = {})
      : ds_(ds), collate_(std::move(collate)), options_(options), sampler_(std::move(sampler)) {
    static_assert(check_collate<Collate, Batch, D>());
    if (options_.batch_size == 0 || options_.prefetch == 0) {
      throw config_error("hone::data::loader: batch_size is " +
                         std::to_string(options_.batch_size) + " and prefetch is " +
                         std::to_string(options_.prefetch) + "; both must be at least 1");
    }
    slots_.reserve(options_.prefetch + 1);
    for (std::size_t i = 0; i <= options_.prefetch; ++i) {
      slots_.push_back(std::make_unique<slot>(prototype));
      slots_.back()->indices.resize(options_.batch_size);
      free_.push_back(i);
    }
    state_.seed = options_.seed;
    state_.dataset_size = ds_.size();
    state_.sampler = std::string(sampler_.name());
    if (options_.threads > 0) {
      // oneTBB starts at most max_allowed_parallelism - 1 workers (the hardware threads minus
      // one unless a tbb::global_control says otherwise): asking for more only prints a warning.
      const std::size_t limit =
          tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
      const std::size_t workers = std::min(options_.threads, limit > 1 ? limit - 1 : 1);
      arena_.emplace(static_cast<int>(workers), 0);
    }
  }

  loader(const loader&) = delete;
  loader& operator=(const loader&) = delete;

  ~loader() {
    std::unique_lock lock(mutex_);
    cancel_.store(true, std::memory_order_relaxed);
    for (auto& s : slots_) {
      if (s->state == slot_state::queued) s->state = slot_state::idle;
    }
    done_.wait(lock, [&] { return pending_ == 0; });
  }

  /// A transform run on every batch after collate, on the filling thread (several threads may
  /// run it at once, on different batches); its generator is info.rng(). Set it before the first
  /// next().
  void set_transform(transform_type t) {
    require_not_started("set_transform");
    transform_ = std::move(t);
  }

  /// Continues from a saved state (seed, epoch, position, skipped count). Call it before the first
  /// next(). config_error when the state belongs to another dataset size, sampler or generator.
  void restore(const loader_state& s) {
    require_not_started("restore");
    const auto refuse = [&](const std::string& what) {
      throw config_error("hone::data::loader::restore: " + what);
    };
    if (s.rng != sampler_rng_name) {
      refuse("the state was written with the generator '" + s.rng + "', this loader uses '" +
             std::string(sampler_rng_name) + "'; resume with the hone version that wrote it");
    }
    if (s.sampler != sampler_.name()) {
      refuse("the state was written by a '" + s.sampler + "' sampler, this loader has a '" +
             std::string(sampler_.name()) + "' one; resume with the same sampler");
    }
    if (s.dataset_size != ds_.size()) {
      refuse("the state is for a dataset of " + std::to_string(s.dataset_size) +
             " samples, this one has " + std::to_string(ds_.size()) +
             "; resume with the same dataset");
    }
    state_ = s;
  }

  /// The next batch, or nullptr once when the epoch ends (the following call starts the next
  /// epoch). Throws the sample_error of a bad record under on_bad_record::stop.
  loaded_batch<Batch>* next() {
    HONE_ZONE("hone.data.next");  // what the consumer waits for its batch (the loader wait)
    if (failure_) std::rethrow_exception(failure_);
    if (!started_) seed_for_workers_ = state_.seed;
    started_ = true;
    if (current_) {
      free_.push_back(*current_);
      current_.reset();
    }
    if (!cursor_) cursor_ = make_plan(state_.epoch, state_.position);
    fill_queue();
    for (;;) {
      if (queue_.empty()) {  // every batch of this epoch (and the next) was delivered
        ++state_.epoch;
        state_.position = 0;
        return nullptr;
      }
      const std::size_t s = queue_.front();
      slot& sl = *slots_[s];
      if (sl.source->epoch != state_.epoch) {  // the front already belongs to the next epoch
        state_.epoch = sl.source->epoch;
        state_.position = sl.source->slice.begin;
        return nullptr;
      }
      wait_ready(s);
      queue_.pop_front();
      if (sl.error) {
        failure_ = sl.error;
        free_.push_back(s);
        std::rethrow_exception(failure_);
      }
      const std::uint64_t end =
          std::min<std::uint64_t>((sl.k + 1) * options_.batch_size, sl.source->slice.count);
      state_.position = sl.source->slice.position_after(end);
      state_.skipped += sl.out.info.skipped;
      skipped_ += sl.out.info.skipped;
      for (auto& r : sl.skips) {
        if (skip_log_.size() < max_skip_log) skip_log_.push_back(std::move(r));
      }
      sl.skips.clear();
      if (sl.out.info.rows == 0) {  // all its records were skipped
        free_.push_back(s);
        fill_queue();
        continue;
      }
      current_ = s;
      return &sl.out;
    }
  }

  /// The state to save: the batches next() has returned count as consumed.
  [[nodiscard]] loader_state state() const { return state_; }
  [[nodiscard]] const loader_options& options() const noexcept { return options_; }
  [[nodiscard]] const Sampler& sampler() const noexcept { return sampler_; }
  /// Bad records skipped by this loader object (loader_state::skipped also counts a restored
  /// run's), and the first max_skip_log of them.
  [[nodiscard]] std::uint64_t skipped() const noexcept { return skipped_; }
  [[nodiscard]] const std::vector<skipped_record>& skipped_records() const noexcept {
    return skip_log_;
  }
  static constexpr std::size_t max_skip_log = 64;

 private:
  // An epoch's order and this rank's share of it, from the position the epoch was entered at.
  struct plan {
    std::uint64_t epoch = 0;
    std::vector<std::uint64_t> order;
    rank_slice slice;
    std::uint64_t batches = 0;
  };
  enum class slot_state { idle, queued, running, ready };
  struct slot {
    explicit slot(const Batch& prototype) : out{prototype, {}} {}
    loaded_batch<Batch> out;
    std::vector<std::uint64_t> indices;
    typename access::buffer buffer;
    std::shared_ptr<const plan> source;  // the plan the batch comes from
    std::uint64_t k = 0;                 // the batch's number in it
    slot_state state = slot_state::idle;
    std::exception_ptr error;
    std::vector<skipped_record> skips;
  };

  void require_not_started(const char* what) const {
    if (started_) {
      throw config_error(std::string("hone::data::loader::") + what +
                         " must be called before the first next()");
    }
  }

  [[nodiscard]] std::shared_ptr<const plan> make_plan(std::uint64_t epoch,
                                                      std::uint64_t begin) const {
    auto p = std::make_shared<plan>();
    p->epoch = epoch;
    sampler_.epoch_order(ds_.size(), state_.seed, epoch, p->order);
    p->slice = sampler_slice(sampler_, p->order.size(), begin);
    const std::uint64_t b = options_.batch_size;
    p->batches =
        options_.last == last_batch::drop ? p->slice.count / b : (p->slice.count + b - 1) / b;
    return p;
  }

  // Schedules the next batch of the stream into slot s; false when the stream may not run further
  // ahead (more than one epoch past the consumer's).
  bool schedule(std::size_t s) {
    while (cursor_k_ >= cursor_->batches) {
      if (cursor_->epoch >= state_.epoch + 1) return false;
      cursor_ = make_plan(cursor_->epoch + 1, 0);
      cursor_k_ = 0;
    }
    slot& sl = *slots_[s];
    {
      std::lock_guard lock(mutex_);
      sl.source = cursor_;
      sl.k = cursor_k_++;
      sl.error = nullptr;
      sl.state = slot_state::queued;
      if (arena_) ++pending_;
    }
    queue_.push_back(s);
    if (arena_) arena_->enqueue([this, s] { run_task(s); });
    return true;
  }

  void fill_queue() {
    while (!free_.empty() && schedule(free_.back())) free_.pop_back();
  }

  void run_task(std::size_t s) {
    slot& sl = *slots_[s];
    bool claimed = false;
    {
      std::lock_guard lock(mutex_);
      if (sl.state == slot_state::queued) {
        sl.state = slot_state::running;
        claimed = true;
      } else {
        --pending_;
        done_.notify_all();  // under the lock: the destructor cannot finish before we return
      }
    }
    if (!claimed) return;
    fill(sl);
    std::lock_guard lock(mutex_);
    sl.state = slot_state::ready;
    --pending_;
    done_.notify_all();
  }

  // Waits until slot s is filled, filling queued batches on this thread meanwhile.
  void wait_ready(std::size_t s) {
    std::unique_lock lock(mutex_);
    if (slots_[s]->state == slot_state::ready) return;
    HONE_ZONE("hone.data.wait");  // the batch was not ready: fill queued ones, or wait
    while (slots_[s]->state != slot_state::ready) {
      std::optional<std::size_t> mine;
      for (const std::size_t q : queue_) {
        if (slots_[q]->state == slot_state::queued) {
          mine = q;
          break;
        }
      }
      if (!mine) {
        done_.wait(lock);
        continue;
      }
      slot& sl = *slots_[*mine];
      sl.state = slot_state::running;
      lock.unlock();
      fill(sl);
      lock.lock();
      sl.state = slot_state::ready;
      done_.notify_all();
    }
  }

  // Reads sample `index` into row `row` of `b`.
  void read_row(slot& sl, std::size_t row, std::uint64_t index) const {
    const auto i = static_cast<std::size_t>(index);
    if constexpr (!collate_function<Collate, Batch, typename access::sample>) {
      // check_collate's sentence has been given
    } else if constexpr (dataset_has_view_get<D>) {
      std::invoke(collate_, sl.out.data, row, ds_.get(i));
    } else {
      ds_.get(i, sl.buffer);
      std::invoke(collate_, sl.out.data, row, std::as_const(sl.buffer));
    }
  }

  [[nodiscard]] std::string where(std::uint64_t index, std::uint64_t epoch, std::uint64_t position,
                                  std::optional<std::uint64_t>& offset) const {
    std::string w = "sample " + std::to_string(index) + " (epoch " + std::to_string(epoch) +
                    ", position " + std::to_string(position) + " of the epoch's order";
    if constexpr (requires(const D& d) {
                    { d.offset(std::size_t{}) } -> std::convertible_to<std::uint64_t>;
                    d.path().string();
                  }) {
      if (index < ds_.size()) {
        try {
          offset = ds_.offset(static_cast<std::size_t>(index));
          w += "; the record at byte " + std::to_string(*offset) + " of '" + ds_.path().string() +
               "'";
        } catch (...) {  // no offset to tell: the message goes without it
        }
      }
    }
    return w + ")";
  }

  [[nodiscard]] static std::string message_of(const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return x.what();
    } catch (...) {
      return "an exception that is not a std::exception";
    }
  }

  // Fills slot `sl` with its batch (on a worker or the consumer): never throws, the error stays in
  // the slot.
  void fill(slot& sl) {
    HONE_ZONE("hone.data.batch");  // reading, collating and transforming one batch
    const plan& p = *sl.source;
    const std::uint64_t b = options_.batch_size;
    const std::uint64_t first = sl.k * b;
    const std::uint64_t end = std::min<std::uint64_t>(first + b, p.slice.count);
    batch_info& info = sl.out.info;
    info = batch_info{};
    info.seed = state_seed();
    info.epoch = p.epoch;
    info.first_position = p.slice.position(first);
    info.index = info.first_position / (b * p.slice.world);
    std::size_t rows = 0;
    for (std::uint64_t j = first; j < end; ++j) {
      if (cancel_.load(std::memory_order_relaxed)) return;
      const std::uint64_t position = p.slice.position(j);
      const std::uint64_t index = p.order[p.slice.order_index(j)];
      try {
        if (index >= ds_.size()) {
          throw config_error("the sampler '" + std::string(sampler_.name()) +
                             "' gave sample index " + std::to_string(index) + " for a dataset of " +
                             std::to_string(ds_.size()) + " samples");
        }
        read_row(sl, rows, index);
        sl.indices[rows++] = index;
      } catch (...) {
        const std::string cause = message_of(std::current_exception());
        if (options_.bad_records == on_bad_record::skip) {
          ++info.skipped;
          sl.skips.push_back({index, p.epoch, position, cause});
          continue;
        }
        std::optional<std::uint64_t> offset;
        const std::string w = where(index, p.epoch, position, offset);
        sl.error = std::make_exception_ptr(
            sample_error("hone::data::loader: " + w + " could not be read or collated: " + cause +
                             ". Fix or remove the record, or set loader_options::bad_records = "
                             "hone::data::on_bad_record::skip to skip bad records and count them",
                         index, p.epoch, position, offset));
        return;
      }
    }
    info.rows = rows;
    info.padded_rows = rows;
    info.indices = std::span<const std::uint64_t>(sl.indices.data(), rows);
    if (rows == 0) return;
    try {
      if (options_.last == last_batch::pad) {
        for (std::size_t r = rows; r < b; ++r) read_row(sl, r, sl.indices[(r - rows) % rows]);
        info.padded_rows = static_cast<std::size_t>(b);
      }
      if (transform_) transform_(sl.out.data, info);
    } catch (...) {
      sl.error = std::make_exception_ptr(sample_error(
          "hone::data::loader: batch " + std::to_string(info.index) + " of epoch " +
              std::to_string(p.epoch) + " (first position " + std::to_string(info.first_position) +
              ") failed in padding or the transform: " + message_of(std::current_exception()),
          sl.indices[0], p.epoch, info.first_position, std::nullopt));
    }
  }

  // The seed as fixed before the first next() (restore() may have changed it); read by workers.
  [[nodiscard]] std::uint64_t state_seed() const noexcept { return seed_for_workers_; }

  const D& ds_;
  Collate collate_;
  loader_options options_;
  Sampler sampler_;
  transform_type transform_;

  // Consumer side.
  loader_state state_;
  bool started_ = false;
  std::optional<std::size_t> current_;  // the slot handed out by the last next()
  std::deque<std::size_t> queue_;       // scheduled slots, in stream order
  std::vector<std::size_t> free_;       // idle slots
  std::shared_ptr<const plan> cursor_;  // the plan the next scheduled batch comes from
  std::uint64_t cursor_k_ = 0;
  std::exception_ptr failure_;
  std::uint64_t skipped_ = 0;
  std::vector<skipped_record> skip_log_;
  std::uint64_t seed_for_workers_ = 0;

  // Shared with the workers (slot states under mutex_).
  std::vector<std::unique_ptr<slot>> slots_;
  std::mutex mutex_;
  std::condition_variable done_;
  std::size_t pending_ = 0;  // tasks enqueued and not finished
  std::atomic<bool> cancel_{false};
  std::optional<tbb::task_arena> arena_;  // last: destroyed first, after pending_ reached 0
};

}  // namespace data
HONE_NAMESPACE_END
