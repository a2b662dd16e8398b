// hone/dist/mpi/detail/p2p_all_gather.hpp: the all-gather of small outputs that
// hone::dist::mpi_comm::all_gather runs on up to 8 ranks (docs/dist.md, "all_gather's
// algorithm"). Included by hone/dist/mpi/detail/mpi_state.hpp; not for direct use.
//
// Why: a non-blocking MPI_Iallgather (Open MPI's coll/libnbc) builds and frees a schedule on every
// call, which costs more than the transfer itself for a few KiB on one node (docs/benchmarks.md).
// Here each rank sends its block straight to every other rank and receives theirs straight into
// the output (one round of latency; each rank sends and receives (n - 1) blocks, as a ring
// would), as messages under the transport's eager limit (the sizes of all_reduce's exchange,
// p2p_all_reduce.hpp). Nothing is reduced, so the result does not depend on the order of arrival.
// No scratch memory.
//
// Messages, tags and progress: p2p_op.hpp (one tag, the collective's first).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "hone/core/config.hpp"
#include "hone/dist/mpi/detail/p2p_all_reduce.hpp"
#include "hone/dist/mpi/detail/p2p_op.hpp"

HONE_NAMESPACE_BEGIN
namespace dist::detail {

/// One small all-gather in flight (see the header comment). Made by start_all_gather.
class p2p_all_gather final : public p2p_exchange {
 public:
  struct args {
    MPI_Comm comm;
    int rank, size;  // 2 <= size <= max_ranks
    const void* in;  // this rank's block, or nullptr when it is already in place in `out`
    void* out;       // size blocks of m elements
    std::size_t m;   // elements per block (> 0)
    std::size_t elem;
    std::size_t message_bytes;  // exchange_limits::message_bytes
    MPI_Datatype type;
    int tag;
  };

  /// Copies this rank's block into place, then posts every receive and send. error() says
  /// whether that failed.
  explicit p2p_all_gather(const args& a) : a_(a) {
    if (a_.in != nullptr) std::memcpy(block(a_.rank), a_.in, a_.m * a_.elem);
    post(
        a_.comm, a_.rank, a_.size, a_.m, a_.elem, a_.message_bytes, a_.type, a_.tag,
        [this](int q) { return block(q); }, block(a_.rank));
  }

  /// Tests the transfers; the all-gather is done once all are complete.
  void progress() noexcept override {
    if (!done_ && transfers_complete()) done_ = true;
  }

 private:
  /// Rank q's block of the output.
  [[nodiscard]] std::byte* block(int q) const noexcept {
    return static_cast<std::byte*>(a_.out) + static_cast<std::size_t>(q) * a_.m * a_.elem;
  }

  args a_;
};

/// Whether all_gather of blocks of `block_bytes` bytes on `size` ranks runs p2p_all_gather (the
/// output at most limits.max_bytes, each block at most limits.gather_block_bytes).
[[nodiscard]] inline bool p2p_all_gather_fits(const exchange_limits& limits, int size,
                                              std::size_t block_bytes) noexcept {
  return size > 1 && size <= p2p_all_gather::max_ranks && block_bytes > 0 &&
         block_bytes <= limits.gather_block_bytes &&
         block_bytes * static_cast<std::size_t>(size) <= limits.max_bytes;
}

/// Starts the all-gather of `in` (m elements; nullptr: already in place) into `out` (size blocks
/// of m) for collective number `seq` of the communicator whose collectives `ops` holds, as
/// messages of at most `message_bytes`. Check error() of the result.
template <class T>
std::shared_ptr<p2p_all_gather> start_all_gather(p2p_ops& ops, MPI_Comm comm, int rank, int size,
                                                 const T* in, T* out, std::size_t m,
                                                 MPI_Datatype type, std::uint64_t seq,
                                                 std::size_t message_bytes) {
  ops.reserve_one();  // nothing throws once the transfers are posted
  auto started = std::make_shared<p2p_all_gather>(p2p_all_gather::args{
      comm, rank, size, in, out, m, sizeof(T), message_bytes, type, ops.tag_of(seq)});
  ops.track(started);
  return started;
}

}  // namespace dist::detail
HONE_NAMESPACE_END
