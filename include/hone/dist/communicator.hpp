// hone/dist/communicator.hpp: what a communicator is. A communicator connects the ranks of a job
// (processes, one per data-parallel replica) and runs collectives on contiguous spans: slices of
// the flat gradient or parameter arenas, reduced in place, with no fusion copy.
//
//   static_assert(hone::dist::communicator<MyComm>);
//
// Every collective is started by a call that returns a request; request.wait() blocks until the
// collective is complete on this rank (and throws hone::dist_error when it fails or times out),
// request.test() says whether it is complete without blocking. The blocking form is the handle
// form waited at once: `comm.all_reduce(grads, reduce_op::sum).wait();`. Until a request is
// complete the spans it was given belong to the communicator: do not read or write them.
//
// Every rank calls the same collectives in the same order with the same sizes; a rank that does
// not is reported by the others as a dist_error when their wait() times out (never a hang).
//
// Reductions:
//   sum  elementwise sum over the ranks.
//   max  elementwise maximum over the ranks; a NaN on any rank gives NaN at that element (as
//        std::isnan would see it; the payload is unspecified), and +0 is larger than -0, so the
//        result does not depend on the order the ranks are combined in and every rank holds the
//        same bits.
// hone::dist::check_communicator<C>() states each missing piece of a communicator as a sentence.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN

/// A collective failed, or did not complete on this rank within the communicator's timeout. The
/// message names the operation, this rank and what went wrong (for MPI, its error string).
class dist_error : public error {
 public:
  using error::error;
};

namespace dist {

namespace detail {
/// What a started collective is, for messages: "all_reduce #3 (sum of 1000 float)". The strings
/// are literals (a request carries the pointers, not copies).
struct collective_label {
  const char* op = "";
  const char* detail = "";  // e.g. the reduction ("sum"), or ""
  const char* type = "";    // the element type's name, or "" (then no parenthesis)
  std::size_t count = 0;
  std::uint64_t seq = 0;  // the collective's number on its communicator

  [[nodiscard]] std::string describe() const {
    std::string s = std::string(op) + " #" + std::to_string(seq);
    if (type[0] != '\0') {
      s += " (";
      if (detail[0] != '\0') s += std::string(detail) + " of ";
      s += std::to_string(count) + " " + type + ")";
    }
    return s;
  }
};
}  // namespace detail

/// The elementwise reductions of all_reduce and reduce_scatter (see the header comment for max's
/// NaN and signed-zero rule).
enum class reduce_op { sum, max };

[[nodiscard]] constexpr const char* to_string(reduce_op op) noexcept {
  return op == reduce_op::sum ? "sum" : "max";
}

/// A handle on a started collective: wait() blocks until it is complete on this rank (throwing
/// hone::dist_error on failure or timeout), test() returns true once it is, without blocking.
template <class R>
concept request = requires(R& r) {
  r.wait();
  { r.test() } -> std::same_as<bool>;
};

namespace detail {
template <class C, class T>
concept reduces = requires(C& c, std::span<T> data, std::span<const T> in, reduce_op op) {
  { c.all_reduce(data, op) } -> request;
  { c.reduce_scatter(in, data, op) } -> request;
};
template <class C, class T>
concept moves = requires(C& c, std::span<T> data, std::span<const T> in, int root) {
  { c.all_gather(in, data) } -> request;
  { c.broadcast(data, root) } -> request;
};
}  // namespace detail

/// The ranks and size of the job.
template <class C>
concept has_rank_and_size = requires(const C& c) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
};

/// all_reduce(std::span<T> data, reduce_op) in place, and
/// reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op) with in.size() ==
/// out.size() * size(): rank r receives the reduction of block r of every rank's `in`.
template <class C>
concept has_reductions = detail::reduces<C, float> && detail::reduces<C, double>;

/// all_gather(std::span<const T> in, std::span<T> out) with out.size() == in.size() * size():
/// block r of `out` receives rank r's `in`; broadcast(std::span<T> data, int root) copies the
/// root's data to every rank.
template <class C>
concept has_gather_and_broadcast = detail::moves<C, float> && detail::moves<C, double>;

/// barrier(): complete once every rank has started it.
template <class C>
concept has_barrier = requires(C& c) {
  { c.barrier() } -> request;
};

template <class C>
concept communicator =
    has_rank_and_size<C> && has_reductions<C> && has_gather_and_broadcast<C> && has_barrier<C>;

/// Compile-time check with one sentence per missing piece; returns true when C is a communicator.
/// The data-parallel policies call it so that the first error a user sees says what to add.
template <class C>
consteval bool check_communicator() {
  if constexpr (!has_rank_and_size<C>) {
    static_assert(has_rank_and_size<C>,
                  "hone::dist::communicator: this type has no const member functions rank() and "
                  "size() returning int. Add them: this process's rank in [0, size()) and the "
                  "number of ranks.");
    return false;
  } else if constexpr (!has_reductions<C>) {
    static_assert(has_reductions<C>,
                  "hone::dist::communicator: this type lacks all_reduce(std::span<T>, reduce_op) "
                  "or reduce_scatter(std::span<const T>, std::span<T>, reduce_op) for T = float "
                  "and double, each returning a request (a type with wait() and bool test()). "
                  "Add both for float and double.");
    return false;
  } else if constexpr (!has_gather_and_broadcast<C>) {
    static_assert(has_gather_and_broadcast<C>,
                  "hone::dist::communicator: this type lacks all_gather(std::span<const T>, "
                  "std::span<T>) or broadcast(std::span<T>, int root) for T = float and double, "
                  "each returning a request (a type with wait() and bool test()). Add both for "
                  "float and double.");
    return false;
  } else if constexpr (!has_barrier<C>) {
    static_assert(has_barrier<C>,
                  "hone::dist::communicator: this type has no member function barrier() "
                  "returning a request (a type with wait() and bool test()). Add it.");
    return false;
  } else {
    return true;
  }
}

}  // namespace dist

HONE_NAMESPACE_END
