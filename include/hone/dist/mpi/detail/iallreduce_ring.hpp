// hone/dist/mpi/detail/iallreduce_ring.hpp: asks Open MPI for the ring algorithm for the
// non-blocking all-reduces that hone::dist::mpi_comm starts (docs/dist.md, "all_reduce's
// algorithm").
//
// Open MPI's non-blocking collectives (coll/libnbc) choose the algorithm of MPI_Iallreduce when
// the call starts. For fewer than 4 ranks, or in place (mpi_comm's all_reduce is in place), the
// default is a binomial reduce to rank 0 followed by a broadcast: every byte goes through rank 0
// twice, while blocking MPI_Allreduce (coll/tuned) uses a ring for large messages, in which each
// rank sends and receives 2 (n - 1) / n of the data at once. The control variable
// coll_libnbc_iallreduce_algorithm, which the MPI tool interface (MPI_T) can write at run time,
// selects the ring (1) for the calls started while it is set: this class sets it around one
// MPI_Iallreduce and restores the previous value. Where the variable does not exist (another MPI
// library, an Open MPI without libnbc) or cannot be written, it does nothing. Not used when MPI
// runs with MPI_THREAD_MULTIPLE: another thread's MPI_Iallreduce started meanwhile would take the
// ring too, which is wrong for a non-commutative operation.
#pragma once

#include <mpi.h>

#include <utility>

#include "hone/core/config.hpp"
#include "hone/dist/mpi/detail/mpi_tool.hpp"

HONE_NAMESPACE_BEGIN
namespace dist::detail {

class iallreduce_ring {
 public:
  /// The value of coll_libnbc_iallreduce_algorithm that selects the ring.
  static constexpr int ring = 1;

  iallreduce_ring() {
#if HONE_DETAIL_MPI_T
    int level = MPI_THREAD_SINGLE;
    if (MPI_Query_thread(&level) != MPI_SUCCESS || level == MPI_THREAD_MULTIPLE) return;
    int provided = 0;
    if (MPI_T_init_thread(level, &provided) != MPI_SUCCESS) return;
    tool_ = true;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    int scope = 0;
    handle_ = open_cvar("coll_libnbc_iallreduce_algorithm", type, scope);
    if (handle_ == MPI_T_CVAR_HANDLE_NULL) return;
    // An int that may be written, and is writable now? (a read-only variable answers
    // MPI_T_ERR_CVAR_SET_NEVER or _NOT_NOW)
    int value = 0;
    if (type != MPI_INT || scope == MPI_T_SCOPE_CONSTANT || scope == MPI_T_SCOPE_READONLY ||
        MPI_T_cvar_read(handle_, &value) != MPI_SUCCESS ||
        MPI_T_cvar_write(handle_, &value) != MPI_SUCCESS) {
      MPI_T_cvar_handle_free(&handle_);
      handle_ = MPI_T_CVAR_HANDLE_NULL;
    }
#endif
  }

  iallreduce_ring(const iallreduce_ring&) = delete;
  iallreduce_ring& operator=(const iallreduce_ring&) = delete;

  ~iallreduce_ring() {
#if HONE_DETAIL_MPI_T
    if (handle_ != MPI_T_CVAR_HANDLE_NULL) MPI_T_cvar_handle_free(&handle_);
    if (tool_) MPI_T_finalize();
#endif
  }

  /// Whether the ring can be asked for.
  [[nodiscard]] bool available() const noexcept {
#if HONE_DETAIL_MPI_T
    return handle_ != MPI_T_CVAR_HANDLE_NULL;
#else
    return false;
#endif
  }

  /// Runs start() (which starts one MPI_Iallreduce and returns its MPI status) with the ring
  /// selected when available(), then restores the previous setting.
  template <class Start>
  int run(Start&& start) {
#if HONE_DETAIL_MPI_T
    int previous = 0;
    if (available() && MPI_T_cvar_read(handle_, &previous) == MPI_SUCCESS) {
      int value = ring;
      MPI_T_cvar_write(handle_, &value);
      const int rc = std::forward<Start>(start)();
      MPI_T_cvar_write(handle_, &previous);
      return rc;
    }
#endif
    return std::forward<Start>(start)();
  }

 private:
#if HONE_DETAIL_MPI_T
  MPI_T_cvar_handle handle_ = MPI_T_CVAR_HANDLE_NULL;
  bool tool_ = false;  // MPI_T_init_thread succeeded: MPI_T_finalize at the end
#endif
};

}  // namespace dist::detail
HONE_NAMESPACE_END
