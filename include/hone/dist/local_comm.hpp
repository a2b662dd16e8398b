// hone/dist/local_comm.hpp: the communicator of a job with one rank. It has no dependency and
// every collective completes when it is called: all_reduce and broadcast leave the data as it
// is, reduce_scatter and all_gather copy their input to their output. Code written against
// hone::dist::communicator runs unchanged in one process with it. Element types: arithmetic types
// and the 16-bit floats hone::bfloat16 and hone::half (data_parallel_options::wire).
#pragma once

#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#include "hone/core/bfloat16.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/half.hpp"
#include "hone/dist/communicator.hpp"

HONE_NAMESPACE_BEGIN

namespace dist {

class local_comm {
 public:
  /// The request of a collective that completed when it was started.
  struct request {
    void wait() const noexcept {}
    [[nodiscard]] bool test() const noexcept { return true; }
  };

  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }

  /// The reduction over one rank: `data` unchanged.
  template <class T>
  [[nodiscard]] request all_reduce(std::span<T> data, reduce_op op) {
    static_assert(std::is_arithmetic_v<T> || std::is_same_v<T, bfloat16> || std::is_same_v<T, half>,
                  "hone::dist::local_comm::all_reduce: T must be an arithmetic type (float, "
                  "double or an integer) or hone::bfloat16 or hone::half.");
    (void)data;
    (void)op;
    return {};
  }

  /// Copies `in` to `out` (in.size() == out.size() * size() == out.size()).
  template <class T>
  [[nodiscard]] request reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    (void)op;
    HONE_REQUIRE(in.size() == out.size(),
                 "hone::dist::local_comm::reduce_scatter: the input holds " +
                     std::to_string(in.size()) + " elements and the output " +
                     std::to_string(out.size()) +
                     "; with one rank both must have the same size (in.size() == out.size() * "
                     "size())");
    copy(in, out);
    return {};
  }

  /// Copies `in` to `out` (out.size() == in.size() * size() == in.size()).
  template <class T>
  [[nodiscard]] request all_gather(std::span<const T> in, std::span<T> out) {
    HONE_REQUIRE(in.size() == out.size(),
                 "hone::dist::local_comm::all_gather: the input holds " +
                     std::to_string(in.size()) + " elements and the output " +
                     std::to_string(out.size()) +
                     "; with one rank both must have the same size (out.size() == in.size() * "
                     "size())");
    copy(in, out);
    return {};
  }

  /// The root's data is this rank's: `data` unchanged. `root` must be 0.
  template <class T>
  [[nodiscard]] request broadcast(std::span<T> data, int root) {
    (void)data;
    HONE_REQUIRE(root == 0, "hone::dist::local_comm::broadcast: root " + std::to_string(root) +
                                " is not a rank of a one-rank communicator; use root 0");
    return {};
  }

  [[nodiscard]] request barrier() noexcept { return {}; }

 private:
  template <class T>
  static void copy(std::span<const T> in, std::span<T> out) {
    // memmove: `in` and `out` may overlap (or be the same slice).
    if (!in.empty() && in.data() != out.data())
      std::memmove(out.data(), in.data(), in.size_bytes());
  }
};

static_assert(communicator<local_comm>);

}  // namespace dist

HONE_NAMESPACE_END
