// hone/rl/concurrency.hpp: who may call a replay buffer at the same time.
//
//   hone::single_thread  one thread adds, samples and updates; no lock, no atomic, nothing.
//   hone::many_writers   any number of threads add (each through its own writer when n-step
//                        returns are on) while one learner thread samples and updates priorities.
//
// many_writers protocol (hone::replay_buffer): a write reserves its sequence number under the
// buffer's mutex and marks the slot busy (the old item's priority goes to 0 and the uniform
// sampler rejects busy slots), copies the transition with no lock held, then publishes the slot
// under the mutex (tag = sequence number, priority = running max). The learner samples, gathers
// and updates under the mutex, so it only ever reads published slots. Two writers that reach the
// same slot a lap apart (capacity smaller than the writes in flight) go in sequence order.
// Every transition is stored exactly once; none is lost except by being overwritten a lap later.
// A snapshot (replay_buffer::with_snapshot) holds back new reservations and waits until every
// sequence number reserved so far is published, including those whose writer still waits for
// its slot: every slot then holds the newest item of its residue.
#pragma once

#include <condition_variable>
#include <mutex>

#include "hone/core/config.hpp"
#include "hone/rl/roles.hpp"

HONE_NAMESPACE_BEGIN

namespace detail {
/// A mutex that is not one: single_thread's lock compiles to nothing.
struct null_mutex {
  void lock() noexcept {}
  void unlock() noexcept {}
  bool try_lock() noexcept { return true; }
};
/// A condition variable that never waits (single_thread never has to).
struct null_condition {
  template <class Lock, class Pred>
  void wait(Lock&, Pred) noexcept {}
  void notify_all() noexcept {}
};
}  // namespace detail

/// Concurrency policy: one thread does everything; no synchronization at all.
struct single_thread {
  using role = roles::replay_concurrency;
  static constexpr bool concurrent = false;
  using mutex_type = detail::null_mutex;
  using condition_type = detail::null_condition;
};

/// Concurrency policy: many writer threads add while one learner samples and updates priorities.
struct many_writers {
  using role = roles::replay_concurrency;
  static constexpr bool concurrent = true;
  using mutex_type = std::mutex;
  using condition_type = std::condition_variable;
};

HONE_NAMESPACE_END
