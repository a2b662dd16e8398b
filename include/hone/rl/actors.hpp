// hone/rl/actors.hpp: parallel actors with versioned parameters and a policy-lag bound
// (Sample Factory's max_policy_lag; IMPALA/Ape-X style actors and learner).
//
//   hone::versioned_params<std::vector<float>> shared(initial);   // the learner's published copy
//   hone::policy_lag lag{.pull_every = 16, .max_lag = 4};
//   hone::staleness_gate gate(shared, lag);                        // learner-owned, shared by
//   actors
//
//   // learner thread, after some gradient steps:
//   const std::uint64_t v = shared.publish(net_params);            // returns the new version
//
//   // actor i (owns its environment and an actor_params, its local copy of the parameters):
//   hone::actor_params<std::vector<float>> mine(shared, lag);
//   mine.tick();                                       // one actor step: pulls at most every K
//   act(env, mine.get());                              // act with the local copy
//   record.policy_version = mine.version();            // tag what it writes
//   hone::gated_writer<Buffer> out(buffer, gate);       // writer + gate: stale steps are dropped
//   out.add(record);
//
// versioned_params: a double buffer. The learner writes the next snapshot into the spare slot (no
// lock: no reader touches it), then swaps the slots and bumps the version (release) under the
// exclusive side of a shared mutex, held for the swap only. pull(local, have) reads the version
// (acquire, one atomic load) and returns at once when it is not newer than `have`; otherwise it
// copies the current slot under the shared side (actors copy in parallel; a publication waits
// for the copies in progress). No reader ever sees a half-written snapshot, nothing is allocated
// after construction, and there is no data race in the C++ sense (ThreadSanitizer-clean).
//
// policy_lag: pull_every (K) is the fewest actor steps between two looks at the published
// version (an actor_params looks on its first tick, then on every K-th; a look that finds a newer
// version copies it); max_lag (L) is the oldest version the learner accepts: a transition acted
// with version v while the learner is at version c is dropped when c - v > L.
//
// staleness_gate: where the bound is enforced. hone checks at insertion (learner side: the gate
// reads the learner's current version when the transition reaches the buffer), as Sample Factory
// does when the learner receives a rollout, so stale data never takes buffer space or priority
// mass. What the buffer holds can age afterwards (replay is off-policy on purpose); the gate bounds
// the lag of the data when it arrives. Counters: accepted, dropped, the largest lag seen (of any
// transition) and the largest lag accepted.
//
// gated_writer: a replay_buffer writer behind the gate. The version is read from the record's
// field `VersionField` ("policy_version" by default, an unsigned integer). A stale step is not
// given to the n-step window: the window is flushed first (its pending steps are emitted with the
// horizon they have, bootstrapping from their last next_obs, which is exact), so no stored item
// spans a dropped step.
//
// actor_pool: runs N actor loops on oneTBB in an arena of its own.
//   run(steps, step)  every actor makes `steps` calls step(i) (i = 0..N-1), in parallel; returns
//                     when all are done (step may return false to end its actor early).
//   start(step)       the same loops in the background until stop() (or step returns false);
//                     each oneTBB task runs one actor for at most `chunk` steps and then
//                     re-enqueues it, so N actors share fewer threads fairly and none waits on
//                     another. stop() requests the end and waits for every loop.
// step(i) must only touch actor i's own state and thread-safe shared objects (a many_writers
// buffer, the gate, versioned_params).
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/rl/transition.hpp"

HONE_NAMESPACE_BEGIN

/// The policy-lag settings: K and L of the top of this file.
struct policy_lag {
  /// K: an actor looks for newer parameters at most once every pull_every of its steps (>= 1).
  std::size_t pull_every = 1;
  /// L: transitions acted with a version older than (current - max_lag) are dropped.
  std::uint64_t max_lag = 100;

  void check(const char* who) const {
    HONE_REQUIRE(pull_every >= 1,
                 std::string(who) +
                     ": policy_lag::pull_every (K) must be at least 1 (1: look for "
                     "new parameters on every actor step)");
  }
};

/// The version counter a staleness gate reads (the non-template part of versioned_params).
class version_source {
 public:
  /// The latest published version (0: nothing published yet). Acquire: the snapshot of that
  /// version is visible to a pull that follows.
  [[nodiscard]] std::uint64_t version() const noexcept {
    return version_.load(std::memory_order_acquire);
  }

 protected:
  version_source() = default;
  ~version_source() = default;
  std::atomic<std::uint64_t> version_{0};
};

/// Parameters the learner publishes and actors pull, with a version (see the top of this file).
/// Params must be copyable (std::vector<float>, a struct of arrays, ...).
template <class Params>
class versioned_params : public version_source {
  static_assert(std::is_copy_assignable_v<Params> && std::is_copy_constructible_v<Params>,
                "hone::versioned_params<Params>: Params must be copyable (actors copy it)");

 public:
  using params_type = Params;

  /// Publishes `initial` as version 0.
  explicit versioned_params(const Params& initial) : slots_{initial, initial} {}

  versioned_params(const versioned_params&) = delete;
  versioned_params& operator=(const versioned_params&) = delete;

  /// What an actor that holds nothing yet passes as `have`: any version is newer.
  static constexpr std::uint64_t no_version = ~std::uint64_t{0};

  /// Learner: publishes a copy of `p` as the next version and returns it. One learner thread.
  std::uint64_t publish(const Params& p) {
    return publish_with([&](Params& dst) { dst = p; });
  }

  /// Learner: publishes a snapshot written by fill(Params&) and returns its version. fill gets
  /// the spare buffer, which holds the snapshot before the current one (so a partial update must
  /// write everything that changed in the last two publications). One learner thread.
  template <class Fill>
  std::uint64_t publish_with(Fill&& fill) {
    // The spare slot is read by nobody: readers copy only the current slot, under the shared
    // lock, and the exclusive lock of the last swap waited for every reader of this one.
    const std::size_t spare = 1 - current_;
    fill(slots_[spare]);
    std::unique_lock lock(mutex_);
    current_ = spare;
    const std::uint64_t v = version_.load(std::memory_order_relaxed) + 1;
    version_.store(v, std::memory_order_release);
    return v;
  }

  /// Actor: when a version newer than `have` is published (or have == no_version), copies it into
  /// `local`, sets `have` to its version and returns true; otherwise returns false after one
  /// atomic load.
  bool pull(Params& local, std::uint64_t& have) const {
    if (have != no_version && version() <= have) return false;
    std::shared_lock lock(mutex_);
    const std::uint64_t v = version_.load(std::memory_order_relaxed);
    if (have != no_version && v <= have) return false;
    local = slots_[current_];
    have = v;
    return true;
  }

  /// Calls f(const Params&, version) on the latest snapshot (publication waits meanwhile).
  template <class F>
  decltype(auto) read(F&& f) const {
    std::shared_lock lock(mutex_);
    return f(static_cast<const Params&>(slots_[current_]),
             version_.load(std::memory_order_relaxed));
  }

 private:
  mutable std::shared_mutex mutex_;
  Params slots_[2];
  std::size_t current_ = 0;  // written under the exclusive lock, read under either
};

/// An actor's local copy of the parameters and the version it holds, pulling at most every K
/// steps. One per actor; not shared between threads.
template <class Params>
class actor_params {
 public:
  actor_params(const versioned_params<Params>& source, policy_lag lag)
      : source_(&source), every_(lag.pull_every) {
    lag.check("hone::actor_params");
    source_->pull(local_, version_);
    ++pulls_;
  }

  /// One actor step: looks for a newer version when K steps have passed since the last look.
  /// Returns true when it copied one.
  bool tick() {
    ++steps_;
    if (++since_look_ < every_) return false;
    since_look_ = 0;
    ++looks_;
    if (!source_->pull(local_, version_)) return false;
    ++pulls_;
    return true;
  }

  [[nodiscard]] const Params& get() const noexcept { return local_; }
  /// The version of the parameters get() returns: tag what is written with it.
  [[nodiscard]] std::uint64_t version() const noexcept { return version_; }
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  /// Looks at the published version (one every K ticks).
  [[nodiscard]] std::uint64_t looks() const noexcept { return looks_; }
  /// Copies made (the one at construction included).
  [[nodiscard]] std::uint64_t pulls() const noexcept { return pulls_; }

 private:
  const versioned_params<Params>* source_;
  std::size_t every_;
  Params local_{};
  std::uint64_t version_ = versioned_params<Params>::no_version;
  std::size_t since_look_ = 0;
  std::uint64_t steps_ = 0, looks_ = 0, pulls_ = 0;
};

/// What a staleness gate counted.
struct gate_stats {
  std::uint64_t accepted = 0;
  std::uint64_t dropped = 0;
  /// The largest lag (current - acted version) of any transition seen, accepted or not.
  std::uint64_t max_lag_seen = 0;
  /// The largest lag of an accepted transition (<= max_lag).
  std::uint64_t max_lag_accepted = 0;
};

/// The learner-side policy-lag bound: admit(v) is false for a transition acted with version v
/// when the learner's current version c has c - v > max_lag. Thread-safe (relaxed counters).
class staleness_gate {
 public:
  staleness_gate(const version_source& learner, policy_lag lag)
      : learner_(&learner), max_lag_(lag.max_lag) {
    lag.check("hone::staleness_gate");
  }

  [[nodiscard]] std::uint64_t max_lag() const noexcept { return max_lag_; }

  /// Whether a transition acted with `version` may enter (counted either way). A version newer
  /// than the learner's is a caller's bug: config_error.
  bool admit(std::uint64_t acted) { return admit(acted, learner_->version()); }

  /// The same against an explicit current version.
  bool admit(std::uint64_t acted, std::uint64_t current) {
    if (acted > current) {
      throw config_error("hone::staleness_gate: a transition carries policy version " +
                         std::to_string(acted) + " but the learner is at version " +
                         std::to_string(current) +
                         "; tag transitions with the version the actor acted with "
                         "(actor_params::version())");
    }
    const std::uint64_t lag = current - acted;
    raise(max_seen_, lag);
    if (lag > max_lag_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    raise(max_accepted_, lag);
    accepted_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  [[nodiscard]] gate_stats stats() const noexcept {
    return {accepted_.load(std::memory_order_relaxed), dropped_.load(std::memory_order_relaxed),
            max_seen_.load(std::memory_order_relaxed),
            max_accepted_.load(std::memory_order_relaxed)};
  }
  void reset_stats() noexcept {
    accepted_.store(0, std::memory_order_relaxed);
    dropped_.store(0, std::memory_order_relaxed);
    max_seen_.store(0, std::memory_order_relaxed);
    max_accepted_.store(0, std::memory_order_relaxed);
  }

 private:
  static void raise(std::atomic<std::uint64_t>& a, std::uint64_t v) noexcept {
    std::uint64_t cur = a.load(std::memory_order_relaxed);
    while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
    }
  }

  const version_source* learner_;
  std::uint64_t max_lag_;
  std::atomic<std::uint64_t> accepted_{0}, dropped_{0}, max_seen_{0}, max_accepted_{0};
};

/// A replay_buffer writer (one actor's stream) behind a staleness gate. The record's version is
/// its field VersionField (an unsigned integer scalar).
template <class Buffer, fixed_string VersionField = "policy_version">
class gated_writer {
  using transition_type = typename Buffer::transition_type;
  static constexpr std::size_t version_i = transition_type::template find<VersionField>;
  static_assert(version_i < transition_type::field_count,
                "hone::gated_writer: the transition has no policy-version field (default name "
                "\"policy_version\", e.g. hone::field<\"policy_version\", std::uint64_t>); "
                "transitions must carry the version they were acted with.");
  static_assert(
      std::is_unsigned_v<typename transition_type::template field_at<version_i>::element_type> &&
          transition_type::template field_at<version_i>::count == 1,
      "hone::gated_writer: the policy-version field must be an unsigned integer scalar.");

 public:
  using record_type = typename Buffer::record_type;

  gated_writer(Buffer& buffer, staleness_gate& gate) : writer_(buffer.writer()), gate_(&gate) {}

  /// Adds one step when its version passes the gate; returns whether it did. A dropped step
  /// first flushes the n-step window (no item spans it).
  bool add(const record_type& r) {
    const auto v = static_cast<std::uint64_t>(transition_type::template value<version_i>(r));
    if (!gate_->admit(v)) {
      writer_.flush();
      return false;
    }
    writer_.add(r);
    return true;
  }
  /// Emits the pending steps (the stream stops in mid-episode).
  void flush() { writer_.flush(); }
  /// Drops the pending steps (the environment was reset without a final step).
  void reset() noexcept { writer_.reset(); }
  [[nodiscard]] std::size_t pending() const noexcept { return writer_.pending(); }

 private:
  typename Buffer::writer_type writer_;
  staleness_gate* gate_;
};

/// How an actor_pool runs its actors.
struct actor_options {
  std::size_t actors = 1;
  /// Steps of one actor per oneTBB task in start() (then the actor is re-enqueued).
  std::size_t chunk = 64;
  /// Threads of the pool's arena (0: one per actor, capped at the machine's concurrency).
  std::size_t threads = 0;
};

/// N actor loops on oneTBB (see the top of this file).
class actor_pool {
 public:
  explicit actor_pool(actor_options o = {}) : options_(checked(o)), arena_(arena_threads(o)) {}
  actor_pool(const actor_pool&) = delete;
  actor_pool& operator=(const actor_pool&) = delete;
  ~actor_pool() {
    try {
      stop();
    } catch (...) {  // a step's exception is lost when the pool is destroyed without stop()
    }
  }

  [[nodiscard]] std::size_t actors() const noexcept { return options_.actors; }

  /// Every actor makes `steps` calls step(actor) in parallel; step may return void or bool
  /// (false: this actor stops). Returns when all are done; rethrows a step's exception.
  template <class Step>
  void run(std::size_t steps, Step&& step) {
    HONE_REQUIRE(!running(),
                 "hone::actor_pool::run: the pool is running start()ed loops; stop() first");
    arena_.execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, options_.actors, 1),
                        [&](const tbb::blocked_range<std::size_t>& r) {
                          for (std::size_t a = r.begin(); a != r.end(); ++a) {
                            for (std::size_t s = 0; s < steps; ++s) {
                              if (!call(step, a)) break;
                            }
                          }
                        });
    });
  }

  /// Starts the actor loops in the background: step(actor) is called repeatedly for every actor
  /// until stop() or until it returns false. The step object is copied once and shared by all.
  template <class Step>
  void start(Step step) {
    HONE_REQUIRE(!running(), "hone::actor_pool::start: already running; stop() first");
    auto shared = std::make_shared<std::function<bool(std::size_t)>>(
        [s = std::move(step)](std::size_t a) mutable { return call(s, a); });
    {
      std::lock_guard lock(mutex_);
      stop_requested_.store(false, std::memory_order_relaxed);
      live_ = options_.actors;
      error_ = nullptr;
    }
    for (std::size_t a = 0; a < options_.actors; ++a) enqueue(shared, a);
  }

  /// Asks the background loops to end (each ends after its current step).
  void request_stop() noexcept { stop_requested_.store(true, std::memory_order_relaxed); }
  [[nodiscard]] bool stop_requested() const noexcept {
    return stop_requested_.load(std::memory_order_relaxed);
  }
  /// Whether background loops are still running.
  [[nodiscard]] bool running() const {
    std::lock_guard lock(mutex_);
    return live_ > 0;
  }
  /// Requests the end and waits for every loop; rethrows the first exception a step threw.
  void stop() {
    request_stop();
    wait();
  }
  /// Waits until every loop has ended (by stop() or by its step returning false).
  void wait() {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return live_ == 0; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  template <class Step>
  static bool call(Step& step, std::size_t a) {
    if constexpr (std::is_void_v<std::invoke_result_t<Step&, std::size_t>>) {
      step(a);
      return true;
    } else {
      return static_cast<bool>(step(a));
    }
  }

  static actor_options checked(const actor_options& o) {
    HONE_REQUIRE(o.actors >= 1, "hone::actor_pool: actor_options::actors must be at least 1");
    HONE_REQUIRE(o.chunk >= 1, "hone::actor_pool: actor_options::chunk must be at least 1");
    return o;
  }
  static int arena_threads(const actor_options& o) {
    const auto hw = static_cast<std::size_t>(std::max(1, tbb::this_task_arena::max_concurrency()));
    const std::size_t n = o.threads > 0 ? o.threads : std::min(o.actors, hw);
    return static_cast<int>(std::max<std::size_t>(n, 1));
  }

  void enqueue(const std::shared_ptr<std::function<bool(std::size_t)>>& step, std::size_t a) {
    arena_.enqueue([this, step, a] {
      bool more = true;
      try {
        for (std::size_t s = 0; s < options_.chunk && more; ++s) {
          if (stop_requested()) {
            more = false;
            break;
          }
          more = (*step)(a);
        }
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
        more = false;
        request_stop();
      }
      if (more && !stop_requested()) {
        enqueue(step, a);
        return;
      }
      std::lock_guard lock(mutex_);
      if (--live_ == 0) done_.notify_all();
    });
  }

  actor_options options_;
  tbb::task_arena arena_;
  mutable std::mutex mutex_;
  std::condition_variable done_;
  std::size_t live_ = 0;
  std::exception_ptr error_;
  std::atomic<bool> stop_requested_{false};
};

HONE_NAMESPACE_END
