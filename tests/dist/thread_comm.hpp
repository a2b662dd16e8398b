// tests/dist/thread_comm.hpp: a communicator of N ranks that are N threads of one process, for
// tests of code written against hone::dist::communicator without MPI. Every collective completes
// when it is called (each rank blocks until all ranks have called it), so its request is always
// complete; sums are taken in rank order 0, 1, ..., N-1 (hone::bfloat16 and hone::half in float,
// rounded back after each sum) (the result of a reduction is the same
// bits on every rank). A collective that one rank never calls blocks the others: use it only in
// tests whose ranks call the same collectives.
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <hone/core/bfloat16.hpp>
#include <hone/core/half.hpp>
#include <hone/dist/communicator.hpp>
#include <limits>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

/// What the ranks of one thread_comm group share.
class thread_group {
 public:
  explicit thread_group(int size)
      : size_(size), barrier_(size), in_(static_cast<std::size_t>(size)) {}
  [[nodiscard]] int size() const { return size_; }

  /// Runs body(rank) on `size` threads and joins them.
  void run(const std::function<void(int)>& body) {
    std::vector<std::jthread> threads;
    for (int r = 0; r < size_; ++r) threads.emplace_back([&body, r] { body(r); });
  }

 private:
  friend class thread_comm;
  int size_;
  std::barrier<> barrier_;
  std::vector<const void*> in_;
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
    g_->barrier_.arrive_and_wait();
    return {};
  }

 private:
  /// Publishes this rank's input, lets every rank compute its output from all inputs, and waits
  /// until every rank is done reading before anyone continues.
  template <class F>
  void exchange(const void* in, F&& compute) {
    g_->in_[static_cast<std::size_t>(rank_)] = in;
    g_->barrier_.arrive_and_wait();
    compute();
    g_->barrier_.arrive_and_wait();
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
