// tests/dist/thread_comm.hpp: a communicator of N ranks that are N threads of one process, for
// tests of code written against hone::dist::communicator without MPI. Every collective completes
// when it is called (each rank blocks until all ranks have called it), so its request is always
// complete; sums are taken in rank order 0, 1, ..., N-1 (hone::bfloat16 and hone::half in float,
// rounded back after each sum) (the result of a reduction is the same
// bits on every rank). The ranks must call the same collectives; a test that breaks that fails
// instead of hanging until CTest's timeout:
// - a rank whose body throws releases the others: each throws thread_group_stopped (naming that
//   rank) from the collective it waits in or calls next, and run() rethrows the first rank's own
//   exception;
// - a rank that calls a collective after another rank's body returned throws
//   thread_group_stopped naming both (the ranks called different numbers of collectives);
// - a rank that waits longer than the group's timeout (a rank stuck elsewhere) prints which rank
//   waited and aborts the process (its threads cannot be joined).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <hone/core/bfloat16.hpp>
#include <hone/core/half.hpp>
#include <hone/dist/communicator.hpp>
#include <limits>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

/// Thrown by a collective of a rank whose peer stopped (its body threw).
class thread_group_stopped : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What the ranks of one thread_comm group share.
class thread_group {
 public:
  explicit thread_group(int size, std::chrono::seconds timeout = std::chrono::seconds(120))
      : size_(size), timeout_(timeout), in_(static_cast<std::size_t>(size)) {}
  [[nodiscard]] int size() const { return size_; }

  /// Runs body(rank) on `size` threads and joins them. If a body throws, the other ranks are
  /// released from their collectives and the exception of the first rank that threw is rethrown
  /// here (not the thread_group_stopped of the ranks it released).
  void run(const std::function<void(int)>& body) {
    {
      const std::lock_guard lock(mutex_);
      arrived_ = 0;
      thrown_ = -1;
      returned_ = -1;
    }
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size_));
    {
      std::vector<std::jthread> threads;
      for (int r = 0; r < size_; ++r)
        threads.emplace_back([this, &body, &errors, r] {
          try {
            body(r);
            leave(r, returned_);
          } catch (...) {
            errors[static_cast<std::size_t>(r)] = std::current_exception();
            leave(r, thrown_);
          }
        });
    }
    // The threads are joined: their writes are visible here.
    const int first = thrown_;
    if (first >= 0) std::rethrow_exception(errors[static_cast<std::size_t>(first)]);
  }

 private:
  friend class thread_comm;

  /// Records that `rank` left its body (the first one wins `slot`) and wakes every waiting rank.
  void leave(int rank, int& slot) {
    const std::lock_guard lock(mutex_);
    if (slot < 0) slot = rank;
    wake_.notify_all();
  }

  /// Blocks until every rank has arrived (then the next phase begins); throws
  /// thread_group_stopped when a rank left its body before arriving; aborts after the timeout.
  void arrive_and_wait(int rank) {
    std::unique_lock lock(mutex_);
    const auto left = [&] { return thrown_ >= 0 || returned_ >= 0; };
    const auto left_error = [&] {
      const bool threw = thrown_ >= 0;
      return thread_group_stopped(
          "thread_comm: rank " + std::to_string(rank) + " is in collective " +
          std::to_string(phase_) + ", which rank " + std::to_string(threw ? thrown_ : returned_) +
          (threw ? " left by throwing" : " will never call: its body returned"));
    };
    if (left()) throw left_error();
    const unsigned long phase = phase_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++phase_;
      wake_.notify_all();
      return;
    }
    if (!wake_.wait_for(lock, timeout_, [&] { return phase_ != phase || left(); })) {
      std::fprintf(stderr,
                   "thread_comm: rank %d waited %lld s in collective %lu for %d of %d ranks "
                   "(a rank is stuck outside the collectives); aborting\n",
                   rank, static_cast<long long>(timeout_.count()), phase, size_ - arrived_, size_);
      std::abort();
    }
    if (phase_ == phase) throw left_error();
  }

  int size_;
  std::chrono::seconds timeout_;
  std::vector<const void*> in_;
  std::mutex mutex_;
  std::condition_variable wake_;
  int arrived_ = 0;
  unsigned long phase_ = 0;
  int thrown_ = -1;    // the first rank whose body threw, or -1
  int returned_ = -1;  // the first rank whose body returned, or -1
};

class thread_comm {
 public:
  struct request {
    void wait() const noexcept {}
    [[nodiscard]] bool test() const noexcept { return true; }
  };

  thread_comm(thread_group& g, int rank) : g_(&g), rank_(rank) {}
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return g_->size(); }

  template <class T>
  [[nodiscard]] request all_reduce(std::span<T> data, hone::dist::reduce_op op) {
    std::vector<T> result(data.size());
    exchange(data.data(), [&] {
      for (std::size_t i = 0; i < data.size(); ++i) result[i] = reduce_of<T>(op, i);
    });
    std::copy(result.begin(), result.end(), data.begin());  // every rank has read every input
    return {};
  }

  template <class T>
  [[nodiscard]] request reduce_scatter(std::span<const T> in, std::span<T> out,
                                       hone::dist::reduce_op op) {
    const std::size_t block = out.size();
    exchange(in.data(), [&] {
      for (std::size_t i = 0; i < block; ++i)
        out[i] = reduce_of<T>(op, static_cast<std::size_t>(rank_) * block + i);
    });
    return {};
  }

  template <class T>
  [[nodiscard]] request all_gather(std::span<const T> in, std::span<T> out) {
    const std::size_t block = in.size();
    exchange(in.data(), [&] {
      for (int q = 0; q < size(); ++q) {
        const T* src = static_cast<const T*>(g_->in_[static_cast<std::size_t>(q)]);
        if (block > 0)
          std::memcpy(out.data() + static_cast<std::size_t>(q) * block, src, block * sizeof(T));
      }
    });
    return {};
  }

  template <class T>
  [[nodiscard]] request broadcast(std::span<T> data, int root) {
    exchange(data.data(), [&] {
      if (rank_ != root && !data.empty())
        std::memcpy(data.data(), g_->in_[static_cast<std::size_t>(root)], data.size_bytes());
    });
    return {};
  }

  [[nodiscard]] request barrier() {
    g_->arrive_and_wait(rank_);
    return {};
  }

 private:
  /// Publishes this rank's input, lets every rank compute its output from all inputs, and waits
  /// until every rank is done reading before anyone continues.
  template <class F>
  void exchange(const void* in, F&& compute) {
    g_->in_[static_cast<std::size_t>(rank_)] = in;
    g_->arrive_and_wait(rank_);
    compute();
    g_->arrive_and_wait(rank_);
  }

  /// Rank 0's element i combined with rank 1's, then the result with rank 2's, ...: a left fold
  /// in rank order. 16-bit floats (hone::bfloat16, hone::half) are combined in float and rounded
  /// back after each step, as NCCL's and mpi_comm's half sums do.
  template <class T>
  [[nodiscard]] T reduce_of(hone::dist::reduce_op op, std::size_t i) const {
    if constexpr (std::is_same_v<T, hone::bfloat16> || std::is_same_v<T, hone::half>) {
      T acc = static_cast<const T*>(g_->in_[0])[i];
      for (int q = 1; q < size(); ++q) {
        const float a = static_cast<float>(acc);
        const float x =
            static_cast<float>(static_cast<const T*>(g_->in_[static_cast<std::size_t>(q)])[i]);
        if (op == hone::dist::reduce_op::sum) {
          acc = T(a + x);
        } else if (std::isnan(a) || std::isnan(x)) {
          acc = T(std::numeric_limits<float>::quiet_NaN());
        } else if (a < x || (a == x && std::signbit(a))) {
          acc = T(x);
        }
      }
      return acc;
    } else {
      return reduce_plain<T>(op, i);
    }
  }

  template <class T>
  [[nodiscard]] T reduce_plain(hone::dist::reduce_op op, std::size_t i) const {
    T acc = static_cast<const T*>(g_->in_[0])[i];
    for (int q = 1; q < size(); ++q) {
      const T x = static_cast<const T*>(g_->in_[static_cast<std::size_t>(q)])[i];
      if (op == hone::dist::reduce_op::sum) {
        acc = acc + x;
      } else if (std::isnan(acc) || std::isnan(x)) {
        acc = std::numeric_limits<T>::quiet_NaN();
      } else if (acc < x || (acc == x && std::signbit(acc))) {
        acc = x;
      }
    }
    return acc;
  }

  thread_group* g_;
  int rank_;
};

static_assert(hone::dist::communicator<thread_comm>);
