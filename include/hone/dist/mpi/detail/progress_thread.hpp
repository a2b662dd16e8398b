// hone/dist/mpi/detail/progress_thread.hpp: the thread that hone::dist::mpi_comm's
// start_progress_thread() runs beside the program (docs/dist.md, "Progress of non-blocking
// collectives"). Included by hone/dist/mpi/mpi_comm.hpp; not for direct use.
//
// Open MPI advances a non-blocking collective only inside MPI calls (ompi#9759). The thread calls
// poll() (mpi_comm's: its own collectives' next steps, then an MPI call that runs MPI's progress
// engine) every `interval`, holding the communicator's mutex, which every MPI call mpi_comm makes
// for the program holds too; it sleeps on a condition variable in between (the mutex released).
// MPI_Finalize stops it first: a delete callback of an attribute on MPI_COMM_SELF, which
// MPI_Finalize calls before anything else, so the thread never calls MPI after it.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace dist::detail {

class progress_thread {
 public:
  /// Starts the thread. `mutex` must outlive this object.
  progress_thread(std::mutex& mutex, std::function<void()> poll, std::chrono::microseconds interval)
      : mutex_(mutex), poll_(std::move(poll)), interval_(interval) {
    if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &progress_thread::on_finalize, &keyval_,
                               nullptr) == MPI_SUCCESS &&
        MPI_Comm_set_attr(MPI_COMM_SELF, keyval_, this) != MPI_SUCCESS) {
      MPI_Comm_free_keyval(&keyval_);
    }
    thread_ = std::thread([this] { run(); });
  }
  progress_thread(const progress_thread&) = delete;
  progress_thread& operator=(const progress_thread&) = delete;

  /// Stops the thread (after its current poll) and removes the finalize hook.
  ~progress_thread() {
    stop();
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (!finalized && keyval_ != MPI_KEYVAL_INVALID) {
      MPI_Comm_delete_attr(MPI_COMM_SELF, keyval_);  // calls on_finalize: already stopped
      MPI_Comm_free_keyval(&keyval_);
    }
  }

  /// Stops and joins the thread; idempotent. Not with the mutex held.
  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      poll_();
      wake_.wait_for(lock, interval_, [this] { return stopping_; });
    }
  }

  static int on_finalize(MPI_Comm, int, void* attribute, void*) {
    static_cast<progress_thread*>(attribute)->stop();
    return MPI_SUCCESS;
  }

  std::mutex& mutex_;
  std::function<void()> poll_;
  std::chrono::microseconds interval_;
  std::condition_variable wake_;
  bool stopping_ = false;
  int keyval_ = MPI_KEYVAL_INVALID;
  std::thread thread_;
};

}  // namespace dist::detail
HONE_NAMESPACE_END
