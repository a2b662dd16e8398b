// hone/dist/mpi/detail/p2p_reduce_scatter.hpp: the reduce-scatter of point-to-point chunks that
// hone::dist::mpi_comm::reduce_scatter runs on more than one rank, for every element type and both
// reductions (docs/dist.md, "all_reduce's and reduce_scatter's algorithms"). Included by
// hone/dist/mpi/mpi_comm.hpp; not for direct use.
//
// Open MPI's non-blocking MPI_Ireduce_scatter_block (coll/libnbc) has one algorithm, with no
// control variable to change it: a binomial reduce of the whole input to rank 0, then a scatter of
// the blocks, so every byte crosses rank 0 and rank 0 adds all of them. Here every rank sends and
// receives (n - 1) / n of the input and adds (n - 1) blocks, all ranks at once. Two schedules,
// with n ranks and blocks of m elements:
// - direct (n <= p2p_direct_max_ranks = 8): step s = 0 .. n - 2 receives rank
//   (rank + s + 1)'s input of this rank's block and sends this rank's input of block
//   (rank - s - 1) to its owner; all steps are posted at the start (one round of latency), and
//   the received blocks are added in step order as they arrive (scratch: n - 2 blocks).
// - ring (more ranks): step s sends the partial sum of block (rank - s - 1) to rank + 1 and
//   receives the partial sum of block (rank - s - 2) from rank - 1, to which the rank adds its own
//   input; the last step receives into `out` (scratch: 2 blocks; n - 1 rounds of latency, 2
//   transfers in flight per chunk).
// The block is split into chunks (at most max_chunks, of at least min_chunk_bytes), each an
// independent pipeline, so that adds overlap the other chunks' transfers.
//
// Summation order, the same in both schedules: block b's sum is
// ((in_{b+1} + in_{b+2}) + ...) + in_b (ranks mod n; each add is partial + next input, the owner's
// own input last; "+" is the reduction: for the 16-bit floats each add widens to float and rounds
// back, as mpi_comm's own MPI operations do; max does not depend on the order). The order is fixed
// (it does not depend on timing or on the size), so a job gives the same bits run after run; it
// differs from Open MPI's tuned component's order in the last bits of a float.
//
// Messages, tags and progress: p2p_op.hpp.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/dist/mpi/detail/p2p_op.hpp"

HONE_NAMESPACE_BEGIN
namespace dist::detail {

/// One reduce-scatter in flight (see the header comment). Made by start_reduce_scatter.
class p2p_reduce_scatter final : public p2p_op {
 public:
  static constexpr std::size_t min_chunk_bytes = std::size_t{128} << 10;

  struct args {
    MPI_Comm comm;
    int rank, size;
    const void* in;
    void* out;
    std::size_t m;     // elements per block
    std::size_t elem;  // bytes per element
    MPI_Datatype type;
    p2p_reduce_fn add;
    int tag_base;
    bool direct;  // every rank sends each block straight to its owner (see the header comment)
  };

  /// Posts the first step (the ring) or every step (direct). error() says whether that failed.
  p2p_reduce_scatter(const args& a, std::unique_ptr<std::byte[]> scratch, std::size_t scratch_size)
      : a_(a) {
    scratch_ = std::move(scratch);
    scratch_size_ = scratch_size;
    const std::size_t bytes = a_.m * a_.elem;
    chunks_ = static_cast<int>(
        std::clamp<std::size_t>(bytes / min_chunk_bytes, 1, static_cast<std::size_t>(max_chunks)));
    const std::size_t steps = a_.direct ? static_cast<std::size_t>(a_.size - 1) : 1;
    reqs_.assign(2 * steps * static_cast<std::size_t>(chunks_), MPI_REQUEST_NULL);
    step_.assign(static_cast<std::size_t>(chunks_), 0);
    ready_.assign(static_cast<std::size_t>(chunks_), false);
    index_.resize(reqs_.size());
    for (int c = 0; c < chunks_ && rc_ == MPI_SUCCESS; ++c) {
      if (!a_.direct) {
        post(c, 0);
        continue;
      }
      for (int s = 0; s < a_.size - 1 && rc_ == MPI_SUCCESS; ++s) post_direct(c, s);
    }
    if (rc_ != MPI_SUCCESS) fail();
  }

  /// The scratch bytes for `size` ranks and `block_bytes` per block: direct, the received blocks
  /// after the first (n - 2); ring, the partial sums of the steps before the last, two
  /// alternating blocks (one with 3 ranks, none with 2).
  static std::size_t scratch_bytes(int size, bool direct, std::size_t block_bytes) noexcept {
    return static_cast<std::size_t>(direct ? size - 2 : std::min(size - 2, 2)) * block_bytes;
  }

  /// Tests the pending transfers, adds what has arrived and starts the next steps. Never throws:
  /// a failure is kept in error() (the reduce-scatter is then done).
  void progress() noexcept override {
    if (done_) return;
    std::vector<int>& index = index_;
    for (;;) {
      int count = 0;
      const int rc = MPI_Testsome(static_cast<int>(reqs_.size()), reqs_.data(), &count,
                                  index.data(), MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) {
        rc_ = rc;
        call_ = "MPI_Testsome";
        fail();
        return;
      }
      if (count == MPI_UNDEFINED || count == 0) break;
      if (a_.direct) {
        fold();
        continue;
      }
      for (int k = 0; k < count; ++k) {
        const int i = index[static_cast<std::size_t>(k)];
        if (i >= chunks_) {  // a receive: add this rank's block, then the chunk may move on
          const int c = i - chunks_;
          const int s = step_[static_cast<std::size_t>(c)];
          const auto [begin, n] = span_of(c);
          a_.add(at(recv_target(s), begin), at(in_block(block_received(s)), begin), n);
          ready_[static_cast<std::size_t>(c)] = true;
        }
      }
      for (int c = 0; c < chunks_ && rc_ == MPI_SUCCESS; ++c) {
        const auto k = static_cast<std::size_t>(c);
        // Next step once received and added, and once the previous send (whose source the next
        // receive overwrites, two steps on) has completed.
        if (!ready_[k] || reqs_[k] != MPI_REQUEST_NULL) continue;
        ready_[k] = false;
        if (step_[k] + 1 < a_.size - 1) {
          post(c, ++step_[k]);
        } else {
          step_[k] = a_.size - 1;  // finished
        }
      }
      if (rc_ != MPI_SUCCESS) {
        fail();
        return;
      }
    }
    for (int c = 0; c < chunks_; ++c) {
      if (step_[static_cast<std::size_t>(c)] != a_.size - 1) return;
    }
    for (const MPI_Request& r : reqs_) {
      if (r != MPI_REQUEST_NULL) return;
    }
    done_ = true;
  }

 private:
  [[nodiscard]] int mod(int x) const noexcept { return ((x % a_.size) + a_.size) % a_.size; }
  [[nodiscard]] int block_sent(int s) const noexcept { return mod(a_.rank - s - 1); }
  [[nodiscard]] int block_received(int s) const noexcept { return mod(a_.rank - s - 2); }
  [[nodiscard]] const void* in_block(int b) const noexcept {
    return static_cast<const std::byte*>(a_.in) + static_cast<std::size_t>(b) * a_.m * a_.elem;
  }
  /// Where step s's receive lands: `out` at the last step, else scratch block s mod 2.
  [[nodiscard]] void* recv_target(int s) const noexcept {
    if (s == a_.size - 2) return a_.out;
    return scratch_.get() + static_cast<std::size_t>(s % 2) * a_.m * a_.elem;
  }
  [[nodiscard]] const void* send_source(int s) const noexcept {
    return s == 0 ? in_block(block_sent(0)) : recv_target(s - 1);
  }
  /// Chunk c's first element and element count.
  [[nodiscard]] std::pair<std::size_t, std::size_t> span_of(int c) const noexcept {
    const auto k = static_cast<std::size_t>(chunks_);
    const std::size_t begin = a_.m * static_cast<std::size_t>(c) / k;
    return {begin, a_.m * static_cast<std::size_t>(c + 1) / k - begin};
  }
  template <class P>
  [[nodiscard]] P* at(P* base, std::size_t element) const noexcept {
    using byte_t = std::conditional_t<std::is_const_v<P>, const std::byte, std::byte>;
    return static_cast<byte_t*>(base) + element * a_.elem;
  }

  /// Starts chunk c's step s: the receive of the left's partial sum and the send to the right.
  void post(int c, int s) noexcept {
    const auto [begin, n] = span_of(c);
    const int count = static_cast<int>(n);
    const int tag = a_.tag_base + c;
    const auto k = static_cast<std::size_t>(c);
    step_[k] = s;
    int rc = MPI_Irecv(at(recv_target(s), begin), count, a_.type, mod(a_.rank - 1), tag, a_.comm,
                       &reqs_[k + static_cast<std::size_t>(chunks_)]);
    if (rc != MPI_SUCCESS) {
      rc_ = rc;
      call_ = "MPI_Irecv";
      return;
    }
    rc = MPI_Isend(at(send_source(s), begin), count, a_.type, mod(a_.rank + 1), tag, a_.comm,
                   &reqs_[k]);
    if (rc != MPI_SUCCESS) {
      rc_ = rc;
      call_ = "MPI_Isend";
    }
  }

  /// Direct: chunk c's transfers of step s, posted at the start. Rank r receives the block's
  /// input of rank r + s + 1 (into `out` at step 0, else scratch block s - 1) and sends its own
  /// input of block r - s - 1 to that block's owner. Sends at [s chunks + c], receives after them.
  void post_direct(int c, int s) noexcept {
    const auto [begin, n] = span_of(c);
    const int count = static_cast<int>(n);
    const int tag = a_.tag_base + c;
    const std::size_t k = static_cast<std::size_t>(s * chunks_ + c);
    void* target =
        s == 0 ? a_.out : scratch_.get() + static_cast<std::size_t>(s - 1) * a_.m * a_.elem;
    int rc = MPI_Irecv(at(target, begin), count, a_.type, mod(a_.rank + s + 1), tag, a_.comm,
                       &reqs_[k + reqs_.size() / 2]);
    if (rc == MPI_SUCCESS) {
      const int owner = mod(a_.rank - s - 1);
      rc = MPI_Isend(at(in_block(owner), begin), count, a_.type, owner, tag, a_.comm, &reqs_[k]);
    }
    if (rc != MPI_SUCCESS) {
      rc_ = rc;
      call_ = "MPI_Isend/MPI_Irecv";
    }
  }

  /// Direct: adds each chunk's received inputs into `out` in step order (the ring's order) as far
  /// as they have arrived, then this rank's own; step_[c] counts the steps folded in.
  void fold() noexcept {
    const std::size_t recvs = reqs_.size() / 2;
    for (int c = 0; c < chunks_; ++c) {
      int& s = step_[static_cast<std::size_t>(c)];
      const auto [begin, n] = span_of(c);
      void* acc = at(a_.out, begin);
      while (s < a_.size - 1 &&
             reqs_[recvs + static_cast<std::size_t>(s * chunks_ + c)] == MPI_REQUEST_NULL) {
        if (s > 0) {
          a_.add(acc, at(scratch_.get() + static_cast<std::size_t>(s - 1) * a_.m * a_.elem, begin),
                 n);
        }
        if (++s == a_.size - 1) a_.add(acc, at(in_block(a_.rank), begin), n);
      }
    }
  }

  void fail() noexcept { p2p_op::fail(reqs_.data(), reqs_.size()); }

  args a_;
  int chunks_ = 1;
  std::vector<MPI_Request> reqs_;  // ring: [0, chunks): sends, [chunks, 2 chunks): receives
  std::vector<int> step_;          // each chunk's current step (size - 1: finished)
  std::vector<bool> ready_;        // received and added, waiting for its send to complete
  std::vector<int> index_;
};

/// Up to this many ranks every block goes straight to its owner (one round); beyond, the ring.
/// A variable so that tests can run the ring on 2 or 3 ranks (set it to 1); read when a
/// reduce-scatter starts.
inline int p2p_direct_max_ranks = 8;

/// Starts the reduce-scatter of `in` (size * m elements) into `out` (m elements) for collective
/// number `seq` of the communicator whose collectives `ops` holds. Check error() of the result.
template <class T>
std::shared_ptr<p2p_reduce_scatter> start_reduce_scatter(p2p_ops& ops, MPI_Comm comm, int rank,
                                                         int size, const T* in, T* out,
                                                         std::size_t m, MPI_Datatype type,
                                                         reduce_op op, std::uint64_t seq) {
  ops.reserve_one();                                 // nothing throws once the transfers are posted
  const bool direct = size <= p2p_direct_max_ranks;  // one round of latency; scratch n - 2 blocks
  auto [scratch, bytes] =
      ops.scratch(p2p_reduce_scatter::scratch_bytes(size, direct, m * sizeof(T)));
  auto started = std::make_shared<p2p_reduce_scatter>(
      p2p_reduce_scatter::args{comm, rank, size, in, out, m, sizeof(T), type, p2p_reduction<T>(op),
                               ops.tag_of(seq), direct},
      std::move(scratch), bytes);
  ops.track(started);
  return started;
}

}  // namespace dist::detail
HONE_NAMESPACE_END
