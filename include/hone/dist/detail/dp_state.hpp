// hone/dist/detail/dp_state.hpp: the bucket type and the state of hone::data_parallel (one
// reduction in flight, its plan, its fp32 buffers and the 16-bit wire lanes of
// data_parallel_options::wire). Included by hone/dist/data_parallel.hpp; not for direct use.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "hone/core/bfloat16.hpp"
#include "hone/core/config.hpp"
#include "hone/core/half.hpp"
#include "hone/dist/communicator.hpp"
#include "hone/dist/wire_format.hpp"

HONE_NAMESPACE_BEGIN

namespace dist {

/// One bucket of the gradient arena: the elements [offset, offset + count).
struct bucket {
  std::size_t offset = 0;
  std::size_t count = 0;
  bool operator==(const bucket&) const = default;
};

namespace detail {

/// The request type of a lane whose communicator does not carry its element type (never made).
struct no_request {
  void wait() const noexcept {}
  [[nodiscard]] bool test() const noexcept { return true; }
};

/// The request types of T's reduce_scatter and all_gather on C (no_request when C lacks them).
template <class C, class T>
struct wire_requests {
  using scatter = no_request;
  using gather = no_request;
};
template <class C, class T>
requires carries<C, T>
struct wire_requests<C, T> {
  using scatter = decltype(std::declval<C&>().reduce_scatter(
      std::declval<std::span<const T>>(), std::declval<std::span<T>>(), reduce_op::sum));
  using gather = decltype(std::declval<C&>().all_gather(std::declval<std::span<const T>>(),
                                                        std::declval<std::span<T>>()));
};

/// The 16-bit wire of data_parallel_options::wire for element type T (hone::bfloat16 or
/// hone::half): the arena rounded to T (same offsets as the arena), the padded tail, this rank's
/// reduced blocks, and the requests of the reduction in flight. Empty unless that wire is used.
template <class C, class T>
struct wire_lane {
  using value_type = T;
  using scatter_request = typename wire_requests<C, T>::scatter;
  using gather_request = typename wire_requests<C, T>::gather;
  std::vector<T> data;
  std::vector<T> pad;
  std::vector<T> shards;
  std::vector<scatter_request> scatters;
  std::vector<gather_request> gathers;
};

}  // namespace detail

namespace detail {

/// What one reduction has in flight, and the plan it runs. Copying it gives a fresh state (no
/// plan, no requests, no count), so that the policy object stays copyable (the trainer copies
/// its policies) while its requests are move-only.
template <class ScatterRequest, class GatherRequest, class FlagRequest, class Bf16Lane,
          class HalfLane>
struct dp_state {
  /// One reduce_scatter + all_gather: a slice of the arena, or the padded tail of the last bucket.
  struct piece {
    std::size_t bucket = 0;        // index in the plan
    bool padded = false;           // the padded tail (`pad`), else arena elements:
    std::size_t offset = 0;        //   [offset, offset + count), reduced in place
    std::size_t count = 0;         // a multiple of the number of ranks
    std::size_t shard_offset = 0;  // this rank's block: count / ranks floats of `shards`
  };

  dp_state() = default;
  dp_state(const dp_state& /*other*/) {}
  dp_state& operator=(const dp_state& /*other*/) { return *this = dp_state(); }
  dp_state(dp_state&&) noexcept = default;
  dp_state& operator=(dp_state&&) noexcept = default;
  ~dp_state() = default;

  std::vector<bucket> plan;
  std::size_t elements = 0;   // the arena size the plan was made for
  bool planned = false;       // the plan and pieces are made (at the first reduce)
  std::vector<piece> pieces;  // in reduction order
  std::vector<float> shards;  // the reduce_scatter outputs of every piece
  std::vector<float> pad;     // the last bucket's tail (elements % ranks), padded to ranks
  std::size_t tail = 0;       // elements in the tail: [0, tail) of the arena
  std::vector<ScatterRequest> scatters;
  std::vector<GatherRequest> gathers;
  std::uint64_t reductions = 0;  // calls of reduce(), the one in flight included
  std::span<float> grads;        // the arena of the reduction in flight
  bool pending = false;          // a reduction was started and is not complete
  std::size_t averaged = 0;      // pieces whose scatter is waited (and averaged)
  std::size_t gathered_started = 0;
  std::size_t gathered = 0;  // pieces whose gather is waited
  // ---- overlap with backward (data_parallel::begin_overlap / range_ready) ----
  bool overlapping = false;          // begun by begin_overlap, reduce() not called yet
  std::vector<std::size_t> waiting;  // per piece: its arena elements not reported final yet
  std::size_t early_starts = 0;      // pieces whose reduce_scatter started before reduce()
  Bf16Lane bf16;                     // wire_format::bf16: the 16-bit buffers and requests
  HalfLane fp16;                     // wire_format::fp16

  // ---- uneven inputs (data_parallel_options::uneven_inputs) ----
  /// What follows the exchange of {samples, still active} once it completes.
  enum class after_flags { nothing, reduce, shadow, pick };  // pick: last_joiner()'s max
  std::array<double, 2> flags{};        // {samples, still active}: this rank's, then the sums
  std::optional<FlagRequest> flag_req;  // the exchange in flight
  bool flags_pending = false;           // an exchange failed and is not complete
  after_flags then = after_flags::nothing;
  bool flags_known = false;       // exchanged by count_share() for this step's reduce()
  std::size_t active = 0;         // ranks with a batch in the current step
  std::uint64_t last_active = 0;  // the last reduction in which this rank had a batch
  std::uint64_t shadowed = 0;     // steps taken part in after joining
};

}  // namespace detail
}  // namespace dist

HONE_NAMESPACE_END
