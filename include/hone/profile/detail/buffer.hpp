// hone/profile/detail/buffer.hpp: where zones are recorded. Each thread writes its events into its
// own chain of fixed-size chunks (1024 events of 32 bytes); the chain is a single-producer,
// single-consumer list: the thread publishes each event with a release store of its chunk's count
// and links a fresh chunk when one fills, the collector (one at a time) reads behind it and gives
// consumed chunks back to a process-wide pool. No lock is taken per event; the pool's mutex is
// taken once per chunk (every 1024 events) by the writer and once per consumed chunk by the
// collector.
//
// Memory is bounded: the pool hands out at most `limit` chunks (16 MiB by default,
// hone::profile::set_buffer_limit). When a thread needs a chunk and none is left (no collector
// runs, or it falls behind), the thread drops its events and counts them until one is free again.
// Chunks handed to a collector were chosen over a ring that overwrites its oldest events: a
// streaming trace keeps every event as long as the collector keeps up, and what is lost is the
// newest events, counted, never a silent hole in the middle of a nesting.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/profile/clock.hpp"

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#elif defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

HONE_NAMESPACE_BEGIN
namespace profile {

/// What an event records.
enum class event_kind : std::uint8_t {
  begin,     ///< a zone begins (name)
  end,       ///< the innermost open zone of the thread ends (name repeated)
  counter,   ///< a counter's value (name, arg = the double's bits)
  flow_out,  ///< a flow starts in the innermost open zone (name, arg = the flow id)
  flow_in,   ///< a flow ends in the innermost open zone (name, arg = the flow id)
};

/// One recorded event: 32 bytes.
struct event {
  std::uint64_t ticks = 0;     ///< the stamp (hone/profile/clock.hpp)
  const char* name = nullptr;  ///< static storage: a string literal or a string that outlives
                               ///< every trace written from it
  std::uint64_t arg = 0;       ///< a counter's double (bit_cast) or a flow id
  event_kind kind = event_kind::begin;
};

namespace detail {

inline constexpr std::uint32_t chunk_events = 1024;

struct chunk {
  std::atomic<std::uint32_t> count{0};  // events published (writer: release; reader: acquire)
  std::atomic<chunk*> next{nullptr};    // the chunk after this one, once this one is full
  std::uint32_t consumed = 0;           // reader only
  event events[chunk_events];
};

/// The process-wide pool of chunks; at most `limit_` exist at once.
class chunk_pool {
 public:
  static constexpr std::size_t default_limit_bytes = std::size_t{16} << 20;

  /// A chunk, or nullptr when the limit is reached and none is free.
  chunk* acquire() noexcept {
    if (available_.load(std::memory_order_relaxed) == 0) return nullptr;
    const std::lock_guard lock(mu_);
    if (!free_.empty()) {
      chunk* c = free_.back();
      free_.pop_back();
      update_available();
      return c;
    }
    if (allocated_ >= limit_) return nullptr;
    chunk* c = new (std::nothrow) chunk;
    if (c == nullptr) return nullptr;
    ++allocated_;
    update_available();
    return c;
  }

  /// Gives a consumed chunk back (the reader's side); it is reset here.
  void release(chunk* c) noexcept {
    c->count.store(0, std::memory_order_relaxed);
    c->next.store(nullptr, std::memory_order_relaxed);
    c->consumed = 0;
    const std::lock_guard lock(mu_);
    if (allocated_ > limit_) {
      delete c;
      --allocated_;
    } else {
      free_.push_back(c);
    }
    update_available();
  }

  void set_limit(std::size_t bytes) {
    const std::lock_guard lock(mu_);
    limit_ = bytes / sizeof(chunk) > 0 ? bytes / sizeof(chunk) : 1;
    while (allocated_ > limit_ && !free_.empty()) {
      delete free_.back();
      free_.pop_back();
      --allocated_;
    }
    update_available();
  }
  [[nodiscard]] std::size_t limit_bytes() {
    const std::lock_guard lock(mu_);
    return limit_ * sizeof(chunk);
  }

  ~chunk_pool() {
    for (chunk* c : free_) delete c;
  }

 private:
  void update_available() noexcept {
    const std::size_t fresh = allocated_ < limit_ ? limit_ - allocated_ : 0;
    available_.store(free_.size() + fresh, std::memory_order_relaxed);
  }
  std::mutex mu_;
  std::vector<chunk*> free_;
  std::size_t allocated_ = 0;
  std::size_t limit_ = default_limit_bytes / sizeof(chunk);
  std::atomic<std::size_t> available_{default_limit_bytes / sizeof(chunk)};
};

/// The operating system's id of the calling thread (gettid on Linux), or a process-unique number.
inline std::uint64_t os_thread_id() noexcept {
#if defined(__linux__)
  return static_cast<std::uint64_t>(::syscall(SYS_gettid));
#else
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
#endif
}
inline std::uint32_t os_process_id() noexcept {
#if defined(__unix__) || defined(__APPLE__)
  return static_cast<std::uint32_t>(::getpid());
#else
  return 1;
#endif
}

/// One thread's events.
struct thread_buffer {
  // -- the writing thread only --
  chunk* cur = nullptr;
  std::uint32_t idx = chunk_events;  // == chunk_events: no room, take the slow path
  // -- shared --
  std::atomic<chunk*> first{nullptr};  // the first chunk the thread obtained (reader starts here)
  std::atomic<std::uint64_t> dropped{0};  // events lost for want of a chunk (writer increments)
  std::atomic<bool> finished{false};      // the thread has exited
  std::atomic<std::uint32_t> name_version{0};
  std::mutex name_mu;
  std::string name;  // guarded by name_mu
  const std::uint64_t tid = os_thread_id();
  const std::uint32_t pid = os_process_id();
  const std::uint64_t serial;  // registration order, unique in the process
  // -- the reader only --
  chunk* head = nullptr;

  explicit thread_buffer(std::uint64_t s) : serial(s) {}
  thread_buffer(const thread_buffer&) = delete;
  thread_buffer& operator=(const thread_buffer&) = delete;
  /// Gives the chunks the buffer still holds back to the pool: from the reader's position, or
  /// from the first chunk when no reader has started (a collector that drained an exited thread
  /// has given every chunk back and cleared both). Runs when the registry forgets a drained
  /// thread, and at exit for the threads no collector drained (the pool outlives the registry).
  ~thread_buffer() {
    chunk* c = head != nullptr ? head : first.load(std::memory_order_acquire);
    while (c != nullptr) {
      chunk* const next = c->next.load(std::memory_order_acquire);
      pool().release(c);
      c = next;
    }
  }

  /// Gets a fresh chunk once the current one is full; false (and the event counted as dropped)
  /// when the pool has none.
  bool advance() noexcept {
    chunk* c = pool().acquire();
    if (c == nullptr) {
      dropped.store(dropped.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      return false;
    }
    if (cur == nullptr) {
      first.store(c, std::memory_order_release);
    } else {
      cur->next.store(c, std::memory_order_release);
    }
    cur = c;
    idx = 0;
    return true;
  }

  static chunk_pool& pool() noexcept {
    static chunk_pool p;
    return p;
  }
};

/// Every thread that recorded something, for the collector.
class registry {
 public:
  static registry& get() noexcept {
    static registry r;
    return r;
  }
  /// The chunk pool is constructed first, so that it is destroyed after the registry, whose
  /// buffers give their chunks back to it.
  registry() { (void)thread_buffer::pool(); }
  registry(const registry&) = delete;
  registry& operator=(const registry&) = delete;
  ~registry() = default;

  /// Registers the calling thread. Threads that exited without recording an event (a library
  /// thread that only named itself) are forgotten here, so a program that starts many such
  /// threads and never runs a collector does not accumulate their buffers.
  thread_buffer* add() {
    const std::lock_guard lock(mu_);
    std::erase_if(buffers_, [](const std::unique_ptr<thread_buffer>& b) {
      return b->finished.load(std::memory_order_acquire) &&
             b->first.load(std::memory_order_acquire) == nullptr;
    });
    buffers_.push_back(std::make_unique<thread_buffer>(next_serial_++));
    return buffers_.back().get();
  }

  /// Calls f(thread_buffer&) for each registered thread, under the registry's lock.
  template <class F>
  void for_each(F&& f) {
    const std::lock_guard lock(mu_);
    for (auto& b : buffers_) f(*b);
  }

  /// Removes the buffers for which pred(thread_buffer&) is true (finished and drained).
  template <class Pred>
  void remove_if(Pred&& pred) {
    const std::lock_guard lock(mu_);
    std::erase_if(buffers_, [&](const std::unique_ptr<thread_buffer>& b) { return pred(*b); });
  }

  /// The threads registered now (exited ones included until they are forgotten).
  [[nodiscard]] std::size_t size() {
    const std::lock_guard lock(mu_);
    return buffers_.size();
  }

  /// Claims the right to read the buffers: one collector at a time.
  bool claim() noexcept { return !claimed_.exchange(true, std::memory_order_acq_rel); }
  void unclaim() noexcept { claimed_.store(false, std::memory_order_release); }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<thread_buffer>> buffers_;
  std::uint64_t next_serial_ = 1;
  std::atomic<bool> claimed_{false};
};

/// The calling thread's buffer: a plain pointer with constant initialization, so reading it on
/// the hot path costs one TLS load.
inline thread_local thread_buffer* tls_buffer = nullptr;

/// Marks the thread's buffer finished when the thread exits (touched only at registration).
struct thread_exit_marker {
  thread_buffer* b = nullptr;
  ~thread_exit_marker() {
    if (b != nullptr) {
      b->finished.store(true, std::memory_order_release);
      tls_buffer = nullptr;
    }
  }
};
inline thread_local thread_exit_marker tls_exit_marker;

/// The calling thread's buffer, registered on first use (nullptr if that fails).
inline thread_buffer* this_thread_buffer() noexcept {
  thread_buffer* b = tls_buffer;
  if (b != nullptr) return b;
  try {
    (void)anchor();  // the clock's anchor precedes every stamp
    b = registry::get().add();
  } catch (...) {
    return nullptr;
  }
  tls_exit_marker.b = b;
  tls_buffer = b;
  return b;
}

/// Records one event in the calling thread's buffer. Never blocks on another thread's events;
/// takes the pool's lock once per 1024 events.
HONE_FORCEINLINE void record(event_kind kind, const char* name, std::uint64_t arg) noexcept {
  thread_buffer* b = tls_buffer;
  if (b == nullptr || b->idx == chunk_events) [[unlikely]] {
    if (b == nullptr && (b = this_thread_buffer()) == nullptr) return;
    if (b->idx == chunk_events && !b->advance()) return;
  }
  chunk* c = b->cur;
  event& e = c->events[b->idx];
  e.ticks = ticks();
  e.name = name;
  e.arg = arg;
  e.kind = kind;
  c->count.store(++b->idx, std::memory_order_release);
}

}  // namespace detail
}  // namespace profile
HONE_NAMESPACE_END
