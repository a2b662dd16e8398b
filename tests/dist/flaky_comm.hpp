// tests/dist/flaky_comm.hpp: a one-rank communicator that fails one chosen collective, for the
// tests of how data_parallel reports a collective that does not complete.
#pragma once

#include <hone/dist/communicator.hpp>
#include <hone/dist/local_comm.hpp>
#include <span>
#include <string>

namespace dist_test {
namespace hd = hone::dist;

/// A one-rank communicator whose n-th started collective (counting from 1) fails at its first
/// wait(), like a timed-out MPI request: the request stays pending and the next wait() succeeds.
struct flaky_comm {
  struct request {
    bool fail = false;
    int number = 0;
    void wait() {
      if (fail) {
        fail = false;
        throw hone::dist_error("flaky_comm: collective #" + std::to_string(number) +
                               " did not complete on rank 0 of 1");
      }
    }
    [[nodiscard]] bool test() const noexcept { return !fail; }
  };
  hd::local_comm local;
  int started = 0;
  int fail_at = 0;
  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
  request next() {
    ++started;
    return {started == fail_at, started};
  }
  template <class T>
  [[nodiscard]] request all_reduce(std::span<T> d, hd::reduce_op op) {
    local.all_reduce(d, op).wait();
    return next();
  }
  template <class T>
  [[nodiscard]] request reduce_scatter(std::span<const T> in, std::span<T> out, hd::reduce_op op) {
    local.reduce_scatter(in, out, op).wait();
    return next();
  }
  template <class T>
  [[nodiscard]] request all_gather(std::span<const T> in, std::span<T> out) {
    local.all_gather(in, out).wait();
    return next();
  }
  template <class T>
  [[nodiscard]] request broadcast(std::span<T> d, int root) {
    local.broadcast(d, root).wait();
    return next();
  }
  [[nodiscard]] request barrier() { return next(); }
};
static_assert(hd::communicator<flaky_comm>);

}  // namespace dist_test
