// hone/dist/mpi/detail/p2p_all_reduce.hpp: the all-reduce of small messages that
// hone::dist::mpi_comm::all_reduce runs on up to 8 ranks (docs/dist.md,
// "all_reduce's and reduce_scatter's algorithms"). Included by hone/dist/mpi/mpi_comm.hpp; not for
// direct use.
//
// Why: a non-blocking MPI_Iallreduce (Open MPI's coll/libnbc) builds and frees a schedule on every
// call, which costs more than the transfer itself for a few KiB on one node (0.83 us against
// blocking MPI_Allreduce's 0.42 us for 1 KiB on 2 ranks, docs/benchmarks.md). Here each rank sends
// its whole buffer straight to every other rank and receives theirs (one round of latency; n - 1
// copies of the whole buffer each way, which pays for small buffers only), as messages under the
// transport's eager limit, and reduces once all have arrived, in rank order: element i becomes
// ((v_0[i] op v_1[i]) op v_2[i]) ... op v_{n-1}[i], the same operations in the same order on every
// rank, so every rank holds the same bits whatever the timing. Scratch memory: n - 1 received
// buffers.
//
// Messages, tags and progress: p2p_op.hpp (one tag, the collective's first).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

#include "hone/core/config.hpp"
#include "hone/dist/mpi/detail/p2p_op.hpp"
#include "hone/dist/mpi/detail/types.hpp"

HONE_NAMESPACE_BEGIN
namespace dist::detail {

/// How all_reduce's own exchange is sized on one communicator: buffers of at most max_bytes (on at
/// most p2p_all_reduce::max_ranks ranks) run it, as messages of at most message_bytes each (at most
/// p2p_all_reduce::max_messages per peer: larger pieces when that is not enough); larger buffers
/// run MPI_Iallreduce (with the ring for sums). Every rank of the communicator must use the same
/// values (the receives are posted with the message sizes).
///
/// all_gather (p2p_all_gather.hpp) runs the same exchange when its output is at most max_bytes
/// and each rank's block at most gather_block_bytes.
struct exchange_limits {
  std::size_t max_bytes = std::size_t{48} << 10;  // 0: the exchange is never used
  std::size_t message_bytes = 4032;
  std::size_t gather_block_bytes = 8192;
  friend bool operator==(const exchange_limits&, const exchange_limits&) = default;
};

/// What an eager limit of the transport (bytes per message with the MPI library's own header;
/// 0 when unknown) makes of exchange_limits:
/// - message_bytes = limit - 64: every message goes eagerly. A message whose payload and header
///   pass the limit waits for a rendezvous handshake and a single-copy read (about 2 us more for
///   one 4 KiB message on Open MPI's shared-memory transport, whose header takes 49-56 bytes:
///   payloads of 4040 bytes went eagerly under its default limit of 4096, 4048 did not).
/// - max_bytes = min(48 KiB, 12 x limit): the exchange sends n - 1 copies of the whole buffer where
///   a ring sends 2 (n - 1) / n, so it pays for small buffers only: it was faster than
///   MPI_Iallreduce's ring up to 48 KiB on 2 and 3 ranks, and level or slower beyond even with an
///   8192-byte limit. Under a smaller limit, 16 messages per peer (the most) hold 12 x limit
///   before a message would pass the limit.
/// - gather_block_bytes = 2 x limit: an all-gather moves as many bytes as a ring would, but its
///   eager messages cost more per byte than the single copy of MPI's rendezvous, so it pays while
///   each block is a few messages: it was faster than MPI_Iallgather with blocks of up to 2 x limit
///   (limits of 4096 and 8192, 2 and 3 ranks) and not always beyond.
/// Measured with Open MPI 4.1 (docs/benchmarks.md); an unknown limit gives the defaults, which
/// are those of a 4096-byte limit.
[[nodiscard]] constexpr exchange_limits exchange_for_eager_limit(std::size_t limit) noexcept {
  if (limit == 0) return {};
  const std::size_t l = std::max<std::size_t>(limit, 256);
  return {std::min<std::size_t>(std::size_t{48} << 10, 12 * l), l - 64, 2 * l};
}

/// What the exchanges of all_reduce and all_gather (p2p_all_gather.hpp) share: n elements sent to
/// and received from every other rank of up to max_ranks, as messages of at most message_bytes
/// (at most max_messages per peer: larger pieces when that is not enough), all posted at once.
class p2p_exchange : public p2p_op {
 public:
  static constexpr int max_ranks = 8;
  static constexpr int max_messages = 16;  // per peer and direction
  static_assert(max_messages <= max_chunks, "the messages' tags must not reach the next slot's");

 protected:
  /// Posts the receives of n elements from every other rank q into recv(q), then the sends of
  /// n elements from `send` to every other rank. On failure error() says which call; the
  /// collective is then done.
  template <class Recv>
  void post(MPI_Comm comm, int rank, int size, std::size_t n, std::size_t elem,
            std::size_t message_bytes, MPI_Datatype type, int tag, Recv&& recv,
            const std::byte* send) {
    const std::size_t per = std::max<std::size_t>(
        {1, message_bytes / elem, (n + max_messages - 1) / static_cast<std::size_t>(max_messages)});
    const int messages = static_cast<int>((n + per - 1) / per);
    count_ = 2 * (size - 1) * messages;
    int k = 0;
    for (int q = 0; q < size && rc_ == MPI_SUCCESS; ++q) {
      if (q == rank) continue;
      for (int c = 0; c < messages && rc_ == MPI_SUCCESS; ++c) {
        const std::size_t begin = per * static_cast<std::size_t>(c);
        rc_ = MPI_Irecv(recv(q) + begin * elem, static_cast<int>(std::min(per, n - begin)), type, q,
                        tag + c, comm, &reqs_[k++]);
      }
    }
    for (int q = 0; q < size && rc_ == MPI_SUCCESS; ++q) {
      if (q == rank) continue;
      for (int c = 0; c < messages && rc_ == MPI_SUCCESS; ++c) {
        const std::size_t begin = per * static_cast<std::size_t>(c);
        rc_ = MPI_Isend(send + begin * elem, static_cast<int>(std::min(per, n - begin)), type, q,
                        tag + c, comm, &reqs_[k++]);
      }
    }
    if (rc_ != MPI_SUCCESS) {
      call_ = "MPI_Isend/MPI_Irecv";
      fail(reqs_.data(), static_cast<std::size_t>(k));
    }
  }

  /// Tests the transfers: true once all are complete (false, and done with error(), when the
  /// test fails).
  bool transfers_complete() noexcept {
    int complete = 0;
    const int rc = MPI_Testall(count_, reqs_.data(), &complete, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      rc_ = rc;
      call_ = "MPI_Testall";
      fail(reqs_.data(), static_cast<std::size_t>(count_));
      return false;
    }
    return complete != 0;
  }

 private:
  int count_ = 0;
  std::array<MPI_Request, 2 * (max_ranks - 1) * max_messages> reqs_;  // receives, then sends
};

/// One small all-reduce in flight (see the header comment). Made by start_all_reduce.
class p2p_all_reduce final : public p2p_exchange {
 public:
  struct args {
    MPI_Comm comm;
    int rank, size;  // 2 <= size <= max_ranks
    void* data;      // in place
    std::size_t n;   // elements
    std::size_t elem;
    std::size_t message_bytes;  // exchange_limits::message_bytes
    MPI_Datatype type;
    p2p_reduce_fn op;
    int tag;
  };

  /// The scratch bytes: the other ranks' buffers.
  static std::size_t scratch_bytes(int size, std::size_t bytes) noexcept {
    return static_cast<std::size_t>(size - 1) * bytes;
  }

  /// Posts every receive and send. error() says whether that failed.
  p2p_all_reduce(const args& a, std::unique_ptr<std::byte[]> scratch, std::size_t scratch_size)
      : a_(a) {
    scratch_ = std::move(scratch);
    scratch_size_ = scratch_size;
    post(
        a_.comm, a_.rank, a_.size, a_.n, a_.elem, a_.message_bytes, a_.type, a_.tag,
        [this](int q) { return block(q); }, static_cast<const std::byte*>(a_.data));
  }

  /// Tests the transfers; once all are complete, reduces in rank order into the buffer.
  void progress() noexcept override {
    if (done_ || !transfers_complete()) return;
    // Every send has completed, so the buffer may change; v_0 first on every rank.
    void* acc = a_.rank == 0 ? a_.data : block(0);
    for (int q = 1; q < a_.size; ++q) {
      a_.op(acc, q == a_.rank ? a_.data : block(q), a_.n);
    }
    if (acc != a_.data) std::memcpy(a_.data, acc, a_.n * a_.elem);
    done_ = true;
  }

 private:
  /// Where rank q's buffer arrives (q != rank).
  [[nodiscard]] std::byte* block(int q) const noexcept {
    const int slot = q < a_.rank ? q : q - 1;
    return scratch_.get() + static_cast<std::size_t>(slot) * a_.n * a_.elem;
  }

  args a_;
};

/// Whether all_reduce of `bytes` bytes on `size` ranks runs p2p_all_reduce.
[[nodiscard]] inline bool p2p_all_reduce_fits(const exchange_limits& limits, int size,
                                              std::size_t bytes) noexcept {
  return size > 1 && size <= p2p_all_reduce::max_ranks && bytes > 0 && bytes <= limits.max_bytes;
}

/// Starts the all-reduce (`op`) of `data` (n elements, as messages of at most `message_bytes`) for
/// collective number `seq` of the communicator whose collectives `ops` holds. Check error() of
/// the result.
template <class T>
std::shared_ptr<p2p_all_reduce> start_all_reduce(p2p_ops& ops, MPI_Comm comm, int rank, int size,
                                                 T* data, std::size_t n, MPI_Datatype type,
                                                 reduce_op op, std::uint64_t seq,
                                                 std::size_t message_bytes) {
  ops.reserve_one();  // nothing throws once the transfers are posted
  auto [scratch, bytes] = ops.scratch(p2p_all_reduce::scratch_bytes(size, n * sizeof(T)));
  auto started = std::make_shared<p2p_all_reduce>(
      p2p_all_reduce::args{comm, rank, size, data, n, sizeof(T), message_bytes, type,
                           p2p_reduction<T>(op), ops.tag_of(seq)},
      std::move(scratch), bytes);
  ops.track(started);
  return started;
}

}  // namespace dist::detail
HONE_NAMESPACE_END
