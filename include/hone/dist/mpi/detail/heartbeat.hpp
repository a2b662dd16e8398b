// hone/dist/mpi/detail/heartbeat.hpp: the process's heartbeat, by which a rank that waits too
// long for a collective tells a rank that has died (or been stopped) from one that is alive but
// not calling MPI. Included by hone/dist/mpi/mpi_comm.hpp; not for direct use.
//
// Each mpi_comm with missing_ranks::named exposes two words in its MPI window: [0] the number of
// collectives this rank has started, [1] its heartbeat. One thread per process (started with the
// first communicator, idle when there is none) adds one to a count every `heartbeat_period` and
// stores it into word [1] of every registered window: a plain atomic store into this process's own
// memory, no MPI call (so MPI's thread level does not matter). A rank whose wait timed out reads a
// peer's heartbeat twice, `heartbeat_window` apart (docs/dist.md, "A rank that died inside a
// collective"): if it has not moved, the peer's process is dead or stopped (SIGSTOP, a debugger).
// Open MPI's shared-memory window (osc/sm) keeps a killed process's word readable.
//
// The words are MPI's memory: MPI_Win_free and MPI_Finalize unmap them. mpi_comm removes its word
// before freeing the window, and MPI_Finalize removes them all first (a delete callback of an
// attribute on MPI_COMM_SELF, which MPI_Finalize calls before anything else), so the thread never
// writes into freed memory, even for a communicator that outlives MPI.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace dist::detail {

/// How often the heartbeat advances, and how long a reader watches it before it calls a rank
/// that shows no change dead or stopped (six periods: a sleeping thread that a loaded machine
/// wakes late does not look dead).
inline constexpr std::chrono::milliseconds heartbeat_period{50};
inline constexpr std::chrono::milliseconds heartbeat_window{300};

class heartbeat_service {
 public:
  heartbeat_service() = default;
  heartbeat_service(const heartbeat_service&) = delete;
  heartbeat_service& operator=(const heartbeat_service&) = delete;
  ~heartbeat_service() {
    {
      std::lock_guard lock(mutex_);
      words_.clear();
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  /// Starts writing the heartbeat into `word` (and the thread, the first time). Also arranges
  /// (once, while MPI is initialized) for MPI_Finalize to remove every word first; returns false,
  /// and writes nothing, when that cannot be arranged (the word then stays 0: no heartbeat).
  [[nodiscard]] bool add(std::uint64_t* word) {
    {
      std::lock_guard lock(mutex_);
      if (!hook_finalize() || finalized_) return false;
      std::atomic_ref<std::uint64_t>(*word).store(count_, std::memory_order_relaxed);
      words_.push_back(word);
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    }
    wake_.notify_all();
    return true;
  }

  /// Stops writing into `word`: once this returns, the thread no longer touches it.
  void remove(std::uint64_t* word) noexcept {
    std::lock_guard lock(mutex_);
    words_.erase(std::remove(words_.begin(), words_.end(), word), words_.end());
  }

  /// Removes every word (MPI_Finalize is about to unmap them) and refuses new ones.
  void finalize() noexcept {
    std::lock_guard lock(mutex_);
    words_.clear();
    finalized_ = true;
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      if (words_.empty()) {
        wake_.wait(lock, [this] { return stopping_ || !words_.empty(); });
        continue;
      }
      ++count_;
      for (std::uint64_t* w : words_)
        std::atomic_ref<std::uint64_t>(*w).store(count_, std::memory_order_relaxed);
      wake_.wait_for(lock, heartbeat_period, [this] { return stopping_; });
    }
  }

  static int on_finalize(MPI_Comm, int, void*, void*);

  /// Called with mutex_ held, from the thread that constructs a communicator (an MPI call like
  /// the constructor's own).
  bool hook_finalize() {
    if (hooked_) return true;
    int keyval = MPI_KEYVAL_INVALID;
    if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &heartbeat_service::on_finalize, &keyval,
                               nullptr) != MPI_SUCCESS)
      return false;
    if (MPI_Comm_set_attr(MPI_COMM_SELF, keyval, this) != MPI_SUCCESS) return false;
    hooked_ = true;
    return true;
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::uint64_t*> words_;
  std::uint64_t count_ = 1;  // 0 in a window means "no heartbeat on that rank"
  bool stopping_ = false;
  bool finalized_ = false;
  bool hooked_ = false;
  std::thread thread_;
};

/// The process's heartbeat (one thread for every communicator).
inline heartbeat_service& heartbeat() {
  static heartbeat_service service;
  return service;
}

inline int heartbeat_service::on_finalize(MPI_Comm, int, void* attribute, void*) {
  static_cast<heartbeat_service*>(attribute)->finalize();
  return MPI_SUCCESS;
}

}  // namespace dist::detail
HONE_NAMESPACE_END
