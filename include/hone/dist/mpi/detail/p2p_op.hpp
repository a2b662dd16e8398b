// hone/dist/mpi/detail/p2p_op.hpp: what hone::dist::mpi_comm's own point-to-point collectives
// share (docs/dist.md, "all_reduce's and reduce_scatter's algorithms"): the base of one collective
// in flight (p2p_op), the element-wise reductions they apply, and the per-communicator list that
// progresses them and keeps their scratch memory (p2p_ops). The collectives themselves:
// p2p_reduce_scatter.hpp and p2p_all_reduce.hpp. Included by hone/dist/mpi/mpi_comm.hpp; not for
// direct use.
//
// Messages: point-to-point on mpi_comm's own duplicated communicator (collectives never match
// them), tag = (the collective's sequence number mod tag_slots) * max_chunks + chunk; collectives
// in flight together therefore never share a tag unless tag_slots (MPI_TAG_UB / max_chunks, at
// least 2047) of them are in flight at once. Progress: Open MPI moves the transfers inside any MPI
// call, but the reductions and the next steps happen in progress(), which mpi_comm's requests
// call for every collective of their communicator whenever any of them is tested or waited for
// (so that waiting for one collective never stalls another rank's).
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
#include "hone/core/half.hpp"
#include "hone/dist/mpi/detail/types.hpp"

HONE_NAMESPACE_BEGIN
namespace dist::detail {

/// One of mpi_comm's own collectives in flight: progress() moves it on (never throws; a failed
/// MPI call is kept in error() and the collective is then done).
class p2p_op {
 public:
  /// Chunks per collective, the stride of the tags (see the header comment).
  static constexpr int max_chunks = 16;

  p2p_op() = default;
  p2p_op(const p2p_op&) = delete;
  p2p_op& operator=(const p2p_op&) = delete;
  virtual ~p2p_op() = default;

  virtual void progress() noexcept = 0;
  [[nodiscard]] bool done() const noexcept { return done_; }
  /// MPI's error code of a failed call (MPI_SUCCESS if none) and the call's name.
  [[nodiscard]] int error() const noexcept { return rc_; }
  [[nodiscard]] const char* failed_call() const noexcept { return call_; }

  /// Hands back the scratch memory once done without error (a failed one keeps it: a transfer
  /// may still write into it).
  std::unique_ptr<std::byte[]> release_scratch() noexcept {
    return done_ && rc_ == MPI_SUCCESS ? std::move(scratch_) : nullptr;
  }
  [[nodiscard]] std::size_t scratch_size() const noexcept { return scratch_size_; }

 protected:
  /// After an error: the pending transfers are released to MPI (they complete or fail on their
  /// own), the scratch memory is leaked to them, and the collective is done.
  void fail(MPI_Request* reqs, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) {
      if (reqs[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs[i]);
    }
    (void)scratch_.release();
    done_ = true;
  }

  std::unique_ptr<std::byte[]> scratch_;
  std::size_t scratch_size_ = 0;
  int rc_ = MPI_SUCCESS;
  const char* call_ = "";
  bool done_ = false;
};

/// An element-wise reduction acc[i] = op(acc[i], other[i]) over n elements.
using p2p_reduce_fn = void (*)(void* acc, const void* other, std::size_t n) noexcept;

// g++ 12 at -O2 leaves the add below scalar (its "very cheap" vectorizer cost model), as
// core/parallel.hpp's HONE_VECTORIZE_FUNCTION says; the same request here, without including
// oneTBB's headers into every MPI user for a macro.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__NVCC__)
#define HONE_DETAIL_P2P_VECTORIZE \
  __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define HONE_DETAIL_P2P_VECTORIZE
#endif

/// acc[i] = acc[i] + other[i]: the add, in the order the caller documents (vectorized whatever the
/// -O level: each element's sum is the same at any width).
template <class T>
HONE_DETAIL_P2P_VECTORIZE void p2p_add(void* acc, const void* other, std::size_t n) noexcept {
  T* __restrict a = static_cast<T*>(acc);
  const T* __restrict o = static_cast<const T*>(other);
  for (std::size_t i = 0; i < n; ++i) a[i] = a[i] + o[i];
}

/// acc[i] = max(acc[i], other[i]) with hone's rule for NaN and signed zeros on floats.
template <class T>
HONE_DETAIL_P2P_VECTORIZE void p2p_max(void* acc, const void* other, std::size_t n) noexcept {
  T* __restrict a = static_cast<T*>(acc);
  const T* __restrict o = static_cast<const T*>(other);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      a[i] = nan_max(a[i], o[i]);
    } else {
      a[i] = a[i] < o[i] ? o[i] : a[i];
    }
  }
}

/// The 16-bit floats (hone::bfloat16, hone::half) as mpi_comm's own MPI operations combine them
/// (types.hpp): each pair widened to float, added (or nan_max), rounded back to T. The element
/// loops; the sums of the collectives run float16_sum_range (types.hpp), which gives these
/// bits (tests/dist/test_mpi_comm.cpp compares them).
template <class T>
void p2p_float16_add(void* acc, const void* other, std::size_t n) noexcept {
  T* a = static_cast<T*>(acc);
  const T* o = static_cast<const T*>(other);
  for (std::size_t i = 0; i < n; ++i) a[i] = T(static_cast<float>(a[i]) + static_cast<float>(o[i]));
}
template <class T>
void p2p_float16_max(void* acc, const void* other, std::size_t n) noexcept {
  T* a = static_cast<T*>(acc);
  const T* o = static_cast<const T*>(other);
  for (std::size_t i = 0; i < n; ++i)
    a[i] = T(nan_max(static_cast<float>(a[i]), static_cast<float>(o[i])));
}

/// The element-wise reduction of reduce_op `op` on T that the point-to-point collectives apply.
template <class T>
[[nodiscard]] p2p_reduce_fn p2p_reduction(reduce_op op) noexcept {
  if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, half>) {
    // The 16-bit sums through the vector loop of hone::active_isa() (types.hpp), the loop of
    // mpi_comm's MPI operations: F16C (half) and integer unpacking and rounding (bfloat16) widen
    // and round 8 or 16 values per instruction. On 64Ki-1Mi bfloat16 values it took a third to a
    // half of the time of the auto-vectorized element loop it replaced (same bits; 2026-11-28,
    // docs/dist.md). HONE_ISA=scalar gives the element loop.
    return op == reduce_op::sum ? &float16_sum_range<T> : &p2p_float16_max<T>;
  } else {
    return op == reduce_op::sum ? &p2p_add<T> : &p2p_max<T>;
  }
}

/// The collectives of one communicator: those in flight (progressed together) and the scratch
/// memory of finished ones, kept for the next (at most `kept` buffers).
class p2p_ops {
 public:
  static constexpr std::size_t kept = 4;

  /// MPI_TAG_UB of the communicator, read once.
  void init(MPI_Comm comm) {
    void* value = nullptr;
    int found = 0;
    int ub = 32767;  // the least MPI guarantees
    if (MPI_Comm_get_attr(comm, MPI_TAG_UB, &value, &found) == MPI_SUCCESS && found) {
      ub = *static_cast<int*>(value);
    }
    slots_ = std::max(1, ub / p2p_op::max_chunks);
    free_.reserve(kept);  // progress() then keeps scratch memory without allocating
  }

  /// The first tag of collective number `seq` (its chunks add 0 .. max_chunks - 1).
  [[nodiscard]] int tag_of(std::uint64_t seq) const noexcept {
    return static_cast<int>(seq % static_cast<std::uint64_t>(slots_)) * p2p_op::max_chunks;
  }

  /// Scratch memory of at least `need` bytes and its size: the smallest kept buffer that fits,
  /// else a new one (none for 0 bytes).
  std::pair<std::unique_ptr<std::byte[]>, std::size_t> scratch(std::size_t need) {
    if (need == 0) return {nullptr, 0};
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->first >= need && (best == free_.end() || it->first < best->first)) best = it;
    }
    if (best == free_.end()) return {std::unique_ptr<std::byte[]>(new std::byte[need]), need};
    std::pair<std::unique_ptr<std::byte[]>, std::size_t> s{std::move(best->second), best->first};
    free_.erase(best);
    return s;
  }

  /// Makes room for one more collective in flight (call before posting its transfers, so that
  /// track() does not throw once they are posted).
  void reserve_one() { active_.reserve(active_.size() + 1); }

  /// Adds a started collective to those progressed (nothing if it is already done).
  void track(std::shared_ptr<p2p_op> op) noexcept {
    if (!op->done()) active_.push_back(std::move(op));
  }

  /// Progresses every collective in flight; the finished ones leave the list (their scratch
  /// memory is kept for the next).
  void progress() noexcept {
    for (std::size_t i = 0; i < active_.size();) {
      active_[i]->progress();
      if (!active_[i]->done()) {
        ++i;
        continue;
      }
      const std::size_t size = active_[i]->scratch_size();
      if (auto s = active_[i]->release_scratch(); s && free_.size() < kept) {
        free_.emplace_back(size, std::move(s));
      }
      active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

 private:
  int slots_ = 1;
  std::vector<std::shared_ptr<p2p_op>> active_;
  std::vector<std::pair<std::size_t, std::unique_ptr<std::byte[]>>> free_;
};

}  // namespace dist::detail
HONE_NAMESPACE_END
