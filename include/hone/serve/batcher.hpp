// hone/serve/batcher.hpp: hone::serve::dynamic_batcher, many client threads submitting requests
// to the user's model, one dispatcher forming batches by a size cap, preferred batch sizes and a
// maximum queue delay; priorities, per-request timeouts, cancellation, a bounded queue that
// rejects when full, model errors confined to their batch, a shutdown that drains or cancels, and
// an optional adaptive cap (AIMD against a latency target, as Clipper does), and an optional
// caller-runs fast path (batcher_options::caller_runs: a lone request that would be dispatched
// alone at once runs on the submitting thread, with no thread wake-up).
// The model plugs in through hone::serve::batch_model<M, Request> (check_batch_model<M, Request>()
// says in a sentence what is missing). docs/serve.md describes every option and guarantee.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/profile/stats.hpp"
#include "hone/profile/zone.hpp"

HONE_NAMESPACE_BEGIN
namespace serve {

// ---------------------------------------------------------------------------------------------
// The model concept

/// The result of M::infer on a batch of Request.
template <class M, class Request>
using infer_result_t = decltype(std::declval<M&>().infer(std::declval<std::span<const Request>>()));

namespace detail {
template <class M, class Request>
concept has_infer = requires(M& m, std::span<const Request> batch) {
  m.infer(batch);
};

template <class M, class Request>
concept infer_returns_outputs =
    has_infer<M, Request> && std::ranges::sized_range<infer_result_t<M, Request>> &&
    std::ranges::input_range<infer_result_t<M, Request>> &&
    std::move_constructible<std::ranges::range_value_t<infer_result_t<M, Request>>>;
}  // namespace detail

/// A model the dynamic batcher can serve: `m.infer(std::span<const Request>)` returns a sized
/// range (a std::vector, typically) holding one output per request, in the requests' order.
template <class M, class Request>
concept batch_model = std::move_constructible<Request> && detail::infer_returns_outputs<M, Request>;

/// The output type of one request: the element type of what M::infer returns.
template <class M, class Request>
requires batch_model<M, Request>
using response_t = std::ranges::range_value_t<infer_result_t<M, Request>>;

/// static_assert(hone::serve::check_batch_model<MyModel, MyRequest>()): stops compilation with a
/// sentence naming what MyModel lacks to be served by hone::serve::dynamic_batcher.
template <class M, class Request>
consteval bool check_batch_model() {
  if constexpr (!std::move_constructible<Request>) {
    static_assert(std::move_constructible<Request>,
                  "hone::serve::batch_model: the request type is not move constructible; the "
                  "batcher moves each request into its queue and then into a contiguous batch. "
                  "Give the request type a move constructor.");
    return false;
  } else if constexpr (!detail::has_infer<M, Request>) {
    static_assert(detail::has_infer<M, Request>,
                  "hone::serve::batch_model: this model has no member function "
                  "infer(std::span<const Request>) callable on a non-const model. Add "
                  "`std::vector<Output> infer(std::span<const Request> batch)` returning one "
                  "output per request, in the requests' order.");
    return false;
  } else if constexpr (!detail::infer_returns_outputs<M, Request>) {
    static_assert(detail::infer_returns_outputs<M, Request>,
                  "hone::serve::batch_model: the model's infer(std::span<const Request>) must "
                  "return a sized input range of move-constructible outputs (a std::vector<Output> "
                  "with one output per request); it returns something else, e.g. void.");
    return false;
  } else {
    return true;
  }
}

// ---------------------------------------------------------------------------------------------
// Errors a request's future (or submit) may carry

/// submit() on a full queue: the request was not queued. Shed load, retry later or raise
/// batcher_options::queue_capacity.
class queue_full_error : public error {
 public:
  using error::error;
};
/// The request waited in the queue past its timeout and was not run.
class request_timeout_error : public error {
 public:
  using error::error;
};
/// The request was cancelled (by its handle's cancel()) before it was run, and was not run.
class request_cancelled_error : public error {
 public:
  using error::error;
};
/// The batcher was shut down: submit() after shutdown(), or a queued request failed by
/// shutdown(shutdown_mode::cancel); such a request was not run.
class batcher_stopped_error : public error {
 public:
  using error::error;
};

// ---------------------------------------------------------------------------------------------
// Options

/// Who forms and runs batches: a dispatcher thread the batcher owns, or the caller through
/// poll() (deterministic tests, or a user's own event loop).
enum class dispatch_mode { thread, manual };

/// What shutdown() does with requests still queued: run them all (drain) or fail them with
/// batcher_stopped_error (cancel). A batch already running always finishes.
enum class shutdown_mode { drain, cancel };

/// The adaptive mode (batcher_options::adaptive): AIMD on the batch-size cap against a latency
/// target, as Clipper does. After each batch whose infer returned: if infer took longer than
/// latency_target, the cap becomes max(min_batch_size, min(cap - 1, floor(cap *
/// decrease_factor))); otherwise, if the batch was full (its size reached the cap), the cap grows
/// by additive_step up to max_batch_size. The cap starts at min_batch_size. A batch that threw
/// leaves the cap as it is.
struct adaptive_options {
  /// The time one infer call may take; zero: the adaptive mode is off (the cap is max_batch_size).
  std::chrono::nanoseconds latency_target = std::chrono::nanoseconds::zero();
  std::size_t additive_step = 1;
  double decrease_factor = 0.9;  ///< in (0, 1)
  std::size_t min_batch_size = 1;
};

struct batcher_options {
  /// The largest batch; without preferred sizes a batch of this size is formed as soon as this
  /// many requests are queued.
  std::size_t max_batch_size = 32;
  /// Batch sizes to form exactly when they can be met (see chosen_batch_size); any order, each in
  /// [1, max_batch_size]; empty: none.
  std::vector<std::size_t> preferred_batch_sizes = {};
  /// How long the oldest queued request may wait for a fuller batch before one is formed from
  /// what is queued.
  std::chrono::nanoseconds max_queue_delay = std::chrono::microseconds(500);
  /// Requests queued (not yet in a batch) at most; submit() beyond it throws queue_full_error.
  std::size_t queue_capacity = 1024;
  /// The timeout of a request submitted without one; zero: none.
  std::chrono::nanoseconds default_timeout = std::chrono::nanoseconds::zero();
  dispatch_mode mode = dispatch_mode::thread;
  /// AIMD on the batch-size cap (off unless adaptive.latency_target is set); not combined with
  /// preferred_batch_sizes.
  adaptive_options adaptive = {};
  /// The caller-runs fast path (off by default). When submit() finds no batch running, the queue
  /// empty and the batching rule forming a batch of this request alone at once (the cap is 1,
  /// the largest preferred size is 1, or max_queue_delay is zero: chosen_batch_size(1, delay
  /// expired, cap, preferred) == 1), the calling thread runs that batch itself, under the same
  /// one-batch-at-a-time rule, and submit() returns with the future ready: no thread is woken.
  /// Otherwise submit() queues as usual. The model then also runs on client threads (and in
  /// their submit() calls), so leave it off for a model bound to one thread (thread-local
  /// state, a thread's CUDA context or stream) or when a client must not block in submit().
  bool caller_runs = false;
};

/// Per-request options of submit().
struct submit_options {
  /// Higher runs first; equal priorities run in submission order.
  int priority = 0;
  /// How long the request may wait in the queue; zero: batcher_options::default_timeout.
  std::chrono::nanoseconds timeout = std::chrono::nanoseconds::zero();
};

/// The size of the batch to form now, or 0 to keep waiting. `queued` requests are waiting;
/// `delay_expired` is true when the oldest of them has waited max_queue_delay (or the batcher is
/// draining). `preferred` is sorted ascending, without duplicates, each in [1, cap].
/// - Without preferred sizes: `cap` when at least `cap` are queued, else all of them once the
///   delay expired, else 0.
/// - With preferred sizes: the largest preferred size p_max as soon as p_max are queued. Once the
///   delay expired: the largest preferred size that is at most `queued` (a preferred size "can be
///   met" when that many requests are queued; the rest stay queued for the next batch), or all of
///   them when fewer than the smallest preferred size are queued. Else 0.
inline std::size_t chosen_batch_size(std::size_t queued, bool delay_expired, std::size_t cap,
                                     std::span<const std::size_t> preferred) noexcept {
  if (queued == 0) return 0;
  if (preferred.empty()) {
    if (queued >= cap) return cap;
    return delay_expired ? queued : 0;
  }
  if (queued >= preferred.back()) return preferred.back();
  if (!delay_expired) return 0;
  std::size_t best = 0;
  for (const std::size_t p : preferred)
    if (p <= queued) best = p;
  return best != 0 ? best : queued;
}

/// What a batcher has done since construction (stats()).
struct batcher_stats {
  std::uint64_t submitted = 0;  ///< accepted by submit()
  std::uint64_t rejected = 0;   ///< refused by submit() (queue full or stopped)
  std::uint64_t batches = 0;    ///< batches given to the model
  std::uint64_t run = 0;        ///< requests given to the model
  std::uint64_t failed = 0;     ///< requests of batches whose infer threw (or miscounted)
  std::uint64_t timed_out = 0;
  std::uint64_t cancelled = 0;     ///< by cancel() or shutdown(shutdown_mode::cancel)
  double mean_batch_size = 0;      ///< run / batches
  double mean_fill = 0;            ///< mean_batch_size / max_batch_size
  std::size_t batch_size_cap = 0;  ///< the cap now (max_batch_size unless adaptive)
  /// Time from submit() to the request's batch being formed, over the requests run
  /// (nanoseconds; quantiles within 1/32, from hone::profile::duration_stats).
  double queue_delay_p50_ns = 0;
  double queue_delay_p95_ns = 0;
  double queue_delay_p99_ns = 0;
  double queue_delay_max_ns = 0;
};

// ---------------------------------------------------------------------------------------------
// The handle submit() returns

namespace detail {
struct queue_key {
  int priority;
  std::uint64_t seq;
  friend bool operator<(const queue_key& a, const queue_key& b) noexcept {
    return a.priority != b.priority ? a.priority > b.priority : a.seq < b.seq;
  }
};
struct cancellable {
  virtual bool cancel(queue_key key) = 0;

 protected:
  ~cancellable() = default;
};
}  // namespace detail

/// One submitted request: its future (a result, or the model's exception, or one of the errors
/// above), and cancel().
template <class Response>
class request_handle {
 public:
  request_handle(std::future<Response> f, std::shared_ptr<detail::cancellable> core,
                 detail::queue_key key)
      : future_(std::move(f)), core_(std::move(core)), key_(key) {}

  /// The future; get() returns the output or rethrows the request's error.
  [[nodiscard]] std::future<Response>& future() noexcept { return future_; }
  /// future().get().
  Response get() { return future_.get(); }
  /// Removes the request from the queue if it is still there: it will not run and its future
  /// holds request_cancelled_error. Returns false (and changes nothing) when the request was
  /// already in a batch, timed out, cancelled or failed by shutdown.
  bool cancel() { return core_->cancel(key_); }

 private:
  std::future<Response> future_;
  std::shared_ptr<detail::cancellable> core_;
  detail::queue_key key_;
};

namespace detail {
/// The queue, shared by the batcher and the handles (so cancel() is safe after the batcher is
/// gone: it finds nothing to cancel).
template <class Request, class Response, class Clock>
class batcher_core final : public cancellable {
 public:
  using time_point = typename Clock::time_point;
  struct entry {
    Request request;
    std::promise<Response> promise;
    time_point enqueued;
    std::optional<time_point> deadline;
  };

  bool cancel(queue_key key) override {
    std::promise<Response> p;
    {
      std::lock_guard lock(m);
      auto it = queue.find(key);
      if (it == queue.end()) return false;
      p = std::move(it->second.promise);
      erase(it);
      ++cancelled;
    }
    cv.notify_one();  // the dispatcher's next wake-up may have changed
    p.set_exception(std::make_exception_ptr(request_cancelled_error(
        "hone::serve::dynamic_batcher: this request was cancelled before it was run; it was not "
        "given to the model.")));
    return true;
  }

  using iterator = typename std::map<queue_key, entry>::iterator;
  void erase(iterator it) {
    by_age.erase(it->first.seq);
    if (it->second.deadline) by_deadline.erase({*it->second.deadline, it->first});
    queue.erase(it);
  }

  std::mutex m;
  std::condition_variable cv;
  std::map<queue_key, entry> queue;            // run order: priority desc, seq asc
  std::map<std::uint64_t, time_point> by_age;  // seq -> enqueue time (oldest first)
  std::set<std::pair<time_point, queue_key>> by_deadline;
  std::uint64_t next_seq = 0;
  bool stopping = false;       // no more submissions
  bool cancel_queued = false;  // shutdown(cancel)
  bool running = false;        // a batch is with the model
  std::uint64_t cancelled = 0;
};
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// The batcher

/// Serves `model` (held by reference: it must outlive the batcher) to many client threads. One
/// batch runs at a time, on the dispatcher thread (dispatch_mode::thread) or on the thread calling
/// poll() (dispatch_mode::manual), or with batcher_options::caller_runs on a thread in submit();
/// the model is never called concurrently with itself.
/// Clock: std::chrono::steady_clock, or a test clock with the same interface.
template <class Model, class Request, class Clock = std::chrono::steady_clock>
class dynamic_batcher {
  static_assert(check_batch_model<Model, Request>());

 public:
  using model_type = Model;
  using request_type = Request;
  using response_type = response_t<Model, Request>;
  using handle_type = request_handle<response_type>;
  using clock_type = Clock;
  using time_point = typename Clock::time_point;

  explicit dynamic_batcher(Model& model, batcher_options options = {})
      : model_(&model), options_(std::move(options)), core_(std::make_shared<core_type>()) {
    HONE_REQUIRE(options_.max_batch_size >= 1,
                 "hone::serve::dynamic_batcher: max_batch_size is 0; set it to the largest batch "
                 "the model accepts (at least 1).");
    HONE_REQUIRE(options_.queue_capacity >= 1,
                 "hone::serve::dynamic_batcher: queue_capacity is 0, so every request would be "
                 "rejected; set it to the number of requests that may wait (at least 1).");
    HONE_REQUIRE(options_.max_queue_delay.count() >= 0 && options_.default_timeout.count() >= 0,
                 "hone::serve::dynamic_batcher: max_queue_delay and default_timeout must not be "
                 "negative.");
    auto& pref = options_.preferred_batch_sizes;
    std::sort(pref.begin(), pref.end());
    pref.erase(std::unique(pref.begin(), pref.end()), pref.end());
    for (const std::size_t p : pref) {
      HONE_REQUIRE(
          p >= 1 && p <= options_.max_batch_size,
          "hone::serve::dynamic_batcher: preferred batch size " + std::to_string(p) +
              " is outside [1, max_batch_size = " + std::to_string(options_.max_batch_size) +
              "]; remove it or raise max_batch_size.");
    }
    const adaptive_options& a = options_.adaptive;
    if (adaptive()) {
      HONE_REQUIRE(pref.empty(),
                   "hone::serve::dynamic_batcher: the adaptive mode (adaptive.latency_target) and "
                   "preferred_batch_sizes cannot be combined: the adaptive cap would make "
                   "preferred sizes unreachable. Use one of them.");
      HONE_REQUIRE(a.additive_step >= 1 && a.decrease_factor > 0 && a.decrease_factor < 1 &&
                       a.min_batch_size >= 1 && a.min_batch_size <= options_.max_batch_size,
                   "hone::serve::dynamic_batcher: adaptive options out of range; additive_step "
                   "must be at least 1, decrease_factor in (0, 1) and min_batch_size in [1, "
                   "max_batch_size].");
      cap_ = a.min_batch_size;
    } else {
      cap_ = options_.max_batch_size;
    }
    batch_.reserve(options_.max_batch_size);
    promises_.reserve(options_.max_batch_size);
    if (options_.mode == dispatch_mode::thread) {
      dispatcher_ = std::thread([this] {
        profile::set_thread_name("hone.serve.dispatcher");
        loop();
      });
    }
  }

  dynamic_batcher(const dynamic_batcher&) = delete;
  dynamic_batcher& operator=(const dynamic_batcher&) = delete;

  /// Drains (shutdown(shutdown_mode::drain)) unless shutdown() was called.
  ~dynamic_batcher() { shutdown(shutdown_mode::drain); }

  /// Queues `request`; its handle's future becomes ready when its batch has run (or it fails).
  /// Throws queue_full_error when queue_capacity requests are queued, batcher_stopped_error after
  /// shutdown(); the request is then not queued. Thread-safe. With batcher_options::caller_runs,
  /// a request the rule would dispatch alone at once while no batch runs is run by this call
  /// instead (the future is ready when it returns; the model's error is in the future).
  handle_type submit(Request request, submit_options so = {}) {
    const time_point now = Clock::now();
    const auto timeout = so.timeout.count() > 0 ? so.timeout : options_.default_timeout;
    std::promise<response_type> promise;
    std::future<response_type> future = promise.get_future();
    detail::queue_key key{so.priority, 0};
    bool wake = false;
    {
      std::unique_lock lock(core_->m);
      if (core_->stopping) {
        ++rejected_;
        throw batcher_stopped_error(
            "hone::serve::dynamic_batcher: submit() after shutdown(); the request was not "
            "queued. Submit before shutting the batcher down.");
      }
      if (core_->queue.size() >= options_.queue_capacity) {
        ++rejected_;
        throw queue_full_error("hone::serve::dynamic_batcher: the queue is full (" +
                               std::to_string(options_.queue_capacity) +
                               " requests wait); the request was not queued. Retry later, shed "
                               "load, or raise batcher_options::queue_capacity.");
      }
      key.seq = core_->next_seq++;
      if (options_.caller_runs && core_->queue.empty() && !core_->running &&
          chosen_batch_size(1, options_.max_queue_delay.count() == 0, cap_,
                            options_.preferred_batch_sizes) == 1) {
        // The rule forms this request's batch alone now and nothing runs: run it here.
        ++submitted_;
        handle_type handle(std::move(future), core_, key);
        run_on_caller(lock, std::move(request), std::move(promise));
        return handle;
      }
      std::optional<time_point> deadline;
      if (timeout.count() > 0)
        deadline = now + std::chrono::duration_cast<typename Clock::duration>(timeout);
      core_->queue.emplace(
          key, typename core_type::entry{std::move(request), std::move(promise), now, deadline});
      core_->by_age.emplace(key.seq, now);
      if (deadline) core_->by_deadline.emplace(*deadline, key);
      ++submitted_;
      const std::size_t n = core_->queue.size();
      // Wake the dispatcher only when this request may change its decision: the first request
      // (a new delay starts), a size that forms a batch now, or a timeout it does not wait for.
      wake = n == 1 || n >= threshold() || (deadline && core_->by_deadline.size() == 1) ||
             (deadline && *deadline == core_->by_deadline.begin()->first);
    }
    if (wake && options_.mode == dispatch_mode::thread) core_->cv.notify_one();
    return handle_type(std::move(future), core_, key);
  }

  /// dispatch_mode::manual: fails the queued requests whose timeout passed at Clock::now(), then
  /// forms and runs at most one batch if one is due (chosen_batch_size); returns its size (0:
  /// none was due). Not to be called in dispatch_mode::thread.
  std::size_t poll() {
    HONE_REQUIRE(options_.mode == dispatch_mode::manual,
                 "hone::serve::dynamic_batcher::poll: this batcher has its own dispatcher thread "
                 "(dispatch_mode::thread); construct it with mode = dispatch_mode::manual to "
                 "form batches by calling poll().");
    std::unique_lock lock(core_->m);
    bool released = false;
    return step(lock, Clock::now(), nullptr, released);
  }

  /// Stops accepting requests (submit() then throws batcher_stopped_error). drain: every queued
  /// request still runs (batches formed without waiting for the delay; timeouts still apply);
  /// cancel: every queued request fails with batcher_stopped_error. Returns when the queue is
  /// empty and no batch runs (with the dispatcher thread joined). In dispatch_mode::manual, drain
  /// runs the remaining batches on the calling thread. Idempotent; called by the destructor.
  void shutdown(shutdown_mode mode = shutdown_mode::drain) {
    {
      std::lock_guard lock(core_->m);
      core_->stopping = true;
      if (mode == shutdown_mode::cancel) core_->cancel_queued = true;
    }
    core_->cv.notify_all();
    if (dispatcher_.joinable()) {
      dispatcher_.join();
      return;
    }
    if (options_.mode == dispatch_mode::manual) {
      std::unique_lock lock(core_->m);
      for (;;) {
        if (core_->running) {  // another thread's poll() is running a batch
          core_->cv.wait(lock);
          continue;
        }
        if (core_->queue.empty()) break;
        bool released = false;
        step(lock, Clock::now(), nullptr, released);
      }
    }
  }

  /// Requests waiting in the queue now.
  [[nodiscard]] std::size_t queued() const {
    std::lock_guard lock(core_->m);
    return core_->queue.size();
  }

  [[nodiscard]] batcher_stats stats() const {
    std::lock_guard lock(core_->m);
    batcher_stats s;
    s.submitted = submitted_;
    s.rejected = rejected_;
    s.batches = batches_;
    s.run = run_;
    s.failed = failed_;
    s.timed_out = timed_out_;
    s.cancelled = core_->cancelled;
    if (batches_ != 0) {
      s.mean_batch_size = static_cast<double>(run_) / static_cast<double>(batches_);
      s.mean_fill = s.mean_batch_size / static_cast<double>(options_.max_batch_size);
    }
    s.queue_delay_p50_ns = delay_.quantile(0.50);
    s.queue_delay_p95_ns = delay_.quantile(0.95);
    s.queue_delay_p99_ns = delay_.quantile(0.99);
    s.queue_delay_max_ns = static_cast<double>(delay_.max());
    s.batch_size_cap = cap_;
    return s;
  }

  [[nodiscard]] const batcher_options& options() const noexcept { return options_; }

 private:
  using core_type = detail::batcher_core<Request, response_type, Clock>;

  bool adaptive() const noexcept { return options_.adaptive.latency_target.count() > 0; }

  /// The adaptive mode's step after a batch of k requests whose infer took `took`.
  void adapt(std::size_t k, typename Clock::duration took) noexcept {
    const adaptive_options& a = options_.adaptive;
    if (took > a.latency_target) {
      const auto shrunk = static_cast<std::size_t>(static_cast<double>(cap_) * a.decrease_factor);
      const std::size_t lower = cap_ > 1 ? std::min(shrunk, cap_ - 1) : cap_;
      cap_ = std::max(a.min_batch_size, lower);
    } else if (k >= cap_) {
      cap_ = std::min(options_.max_batch_size, cap_ + a.additive_step);
    }
  }

  std::size_t threshold() const noexcept {
    return options_.preferred_batch_sizes.empty() ? cap_ : options_.preferred_batch_sizes.back();
  }

  /// With the lock held: expires timed-out requests, fails everything on shutdown(cancel), forms
  /// and runs one batch if due (the lock is released while the model runs and while futures are
  /// set). Returns the batch size (0: none). `wake` (when not null) gets the time at which a
  /// batch or a timeout is next due, if any; `released` is set when the lock was released (the
  /// queue may have changed meanwhile, so `wake` is stale). No batch is formed while another
  /// thread's batch runs (two poll() calls in dispatch_mode::manual).
  std::size_t step(std::unique_lock<std::mutex>& lock, time_point now,
                   std::optional<time_point>* wake, bool& released) {
    auto& c = *core_;
    std::vector<std::promise<response_type>> expired;
    while (!c.by_deadline.empty() && c.by_deadline.begin()->first <= now) {
      auto it = c.queue.find(c.by_deadline.begin()->second);
      expired.push_back(std::move(it->second.promise));
      c.erase(it);
      ++timed_out_;
    }
    std::vector<std::promise<response_type>> stopped;
    if (c.cancel_queued) {
      for (auto it = c.queue.begin(); it != c.queue.end();) {
        stopped.push_back(std::move(it->second.promise));
        it = c.queue.erase(it);
        ++c.cancelled;
      }
      c.by_age.clear();
      c.by_deadline.clear();
    }
    std::size_t k = 0;
    if (!c.queue.empty() && !c.running) {
      const time_point oldest = c.by_age.begin()->second;
      const auto delay =
          std::chrono::duration_cast<typename Clock::duration>(options_.max_queue_delay);
      const bool expired_delay = c.stopping || now - oldest >= delay;
      k = chosen_batch_size(c.queue.size(), expired_delay, cap_, options_.preferred_batch_sizes);
      if (k == 0 && wake) *wake = oldest + delay;
    }
    // While another thread's batch runs (a caller-runs batch, or another poll()), nothing is
    // formed and no delay sets `wake`: that thread wakes the dispatcher when its batch ends, so
    // meanwhile the dispatcher waits only for deadlines.
    if (wake && !c.by_deadline.empty() && (!*wake || c.by_deadline.begin()->first < **wake))
      *wake = c.by_deadline.begin()->first;
    if (k != 0) {
      batch_.clear();
      promises_.clear();
      for (std::size_t i = 0; i < k; ++i) {
        auto it = c.queue.begin();
        delay_.add(static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(now - it->second.enqueued)
                .count()));
        batch_.push_back(std::move(it->second.request));
        promises_.push_back(std::move(it->second.promise));
        c.erase(it);
      }
      c.running = true;
    }
    if (expired.empty() && stopped.empty() && k == 0) return 0;
    released = true;
    lock.unlock();
    for (auto& p : expired)
      p.set_exception(std::make_exception_ptr(request_timeout_error(
          "hone::serve::dynamic_batcher: this request waited in the queue past its timeout and "
          "was not run; raise its submit_options::timeout (or batcher_options::default_timeout), "
          "or add capacity.")));
    for (auto& p : stopped)
      p.set_exception(std::make_exception_ptr(batcher_stopped_error(
          "hone::serve::dynamic_batcher: the batcher was shut down with shutdown_mode::cancel "
          "while this request was queued; it was not run.")));
    std::uint64_t failed = 0;
    if (k != 0) failed = run_batch();
    lock.lock();
    if (k != 0) {
      ++batches_;
      run_ += k;
      failed_ += failed;
      if (adaptive() && !model_threw_) adapt(k, took_);
      c.running = false;
      if (options_.mode == dispatch_mode::manual) c.cv.notify_all();  // shutdown() may wait
    }
    return k;
  }

  /// The caller-runs fast path, from submit() with the lock held, the queue empty and no batch
  /// running: runs `request` as a batch of one on this thread (the lock released meanwhile),
  /// then accounts for it as step() does and wakes the dispatcher (or a waiting shutdown()) if
  /// requests were queued, or shutdown() began, while it ran. Returns with the lock released.
  void run_on_caller(std::unique_lock<std::mutex>& lock, Request&& request,
                     std::promise<response_type>&& promise) {
    auto& c = *core_;
    delay_.add(0);  // its batch is formed as it is submitted
    batch_.clear();
    promises_.clear();
    batch_.push_back(std::move(request));  // within the reserved max_batch_size >= 1: no throw
    promises_.push_back(std::move(promise));
    c.running = true;
    lock.unlock();
    // run_batch answers the model's errors itself; the guard also ends the batch if anything
    // else (the profiler) throws, so `running` is never left set.
    struct finish {
      dynamic_batcher* self;
      std::uint64_t failed = 0;
      ~finish() { self->finish_on_caller(1, failed); }
    } guard{this};
    guard.failed = run_batch();
  }

  void finish_on_caller(std::size_t k, std::uint64_t failed) {
    auto& c = *core_;
    std::lock_guard lock(c.m);
    ++batches_;
    run_ += k;
    failed_ += failed;
    if (adaptive() && !model_threw_) adapt(k, took_);
    c.running = false;
    // Under the lock: once it is released, shutdown() may return and the batcher be destroyed.
    if (!c.queue.empty() || c.stopping) c.cv.notify_all();
  }

  /// Runs batch_ through the model and satisfies promises_ (without the lock). Returns the
  /// number of requests failed by the model.
  std::uint64_t run_batch() {
    HONE_ZONE("hone.serve.batch");  // the model's infer and the answers
    const std::size_t k = batch_.size();
    HONE_COUNTER("hone.serve.batch_size", k);
    std::exception_ptr err;
    model_threw_ = true;
    try {
      const time_point t0 = adaptive() ? Clock::now() : time_point{};
      auto&& outputs = model_->infer(std::span<const Request>(batch_.data(), k));
      if (adaptive()) took_ = Clock::now() - t0;
      model_threw_ = false;
      const auto got = static_cast<std::size_t>(std::ranges::size(outputs));
      if (got != k) {
        throw error("hone::serve::dynamic_batcher: the model's infer returned " +
                    std::to_string(got) + " outputs for a batch of " + std::to_string(k) +
                    " requests; it must return exactly one output per request, in order.");
      }
      std::size_t i = 0;
      for (auto&& out : outputs) promises_[i++].set_value(std::move(out));
    } catch (...) {
      err = std::current_exception();
    }
    batch_.clear();
    if (!err) return 0;
    // Outputs already handed out stay handed out only if the failure came after them (a throwing
    // move of an output); every request not yet answered gets the error.
    std::uint64_t failed = 0;
    for (auto& p : promises_) {
      try {
        p.set_exception(err);
        ++failed;
      } catch (const std::future_error&) {
        // already satisfied
      }
    }
    return failed;
  }

  void loop() {
    auto& c = *core_;
    std::unique_lock lock(c.m);
    for (;;) {
      std::optional<time_point> wake;
      bool released = false;
      step(lock, Clock::now(), &wake, released);
      if (released) continue;
      // A caller-runs batch may still run: shutdown() returns only after it (its thread
      // notifies when it ends).
      if (c.stopping && c.queue.empty() && !c.running) return;
      if (wake)
        c.cv.wait_until(lock, *wake);
      else
        c.cv.wait(lock);
    }
  }

  Model* model_;
  batcher_options options_;
  std::shared_ptr<core_type> core_;
  std::thread dispatcher_;
  // The dispatching side's (under core_->m, or owned by the one thread running a batch).
  std::vector<Request> batch_;
  std::vector<std::promise<response_type>> promises_;
  std::uint64_t submitted_ = 0, rejected_ = 0, batches_ = 0, run_ = 0, failed_ = 0, timed_out_ = 0;
  profile::duration_stats delay_;
  std::size_t cap_ = 0;  // the batch-size cap now (under core_->m)
  // The last batch's infer time and whether it threw (written by the thread running the batch,
  // read by it after it takes the lock again).
  typename Clock::duration took_{};
  bool model_threw_ = false;
};

}  // namespace serve
HONE_NAMESPACE_END
