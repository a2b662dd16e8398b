// hone/dist/mpi/detail/eager_limit.hpp: reads the eager limit of the MPI library's transports
// through the MPI tool interface (MPI_T control variables), for the sizes of all_reduce's own
// exchange (p2p_all_reduce.hpp, exchange_for_eager_limit). Included by
// hone/dist/mpi/detail/mpi_state.hpp; not for direct use.
//
// Open MPI's point-to-point layer (pml/ob1) sends a message eagerly when its payload and header
// fit in the transport's eager limit, which is a control variable of each transport (btl):
// btl_vader_eager_limit (Open MPI 4's shared memory; btl_sm_eager_limit in Open MPI 5) and
// btl_tcp_eager_limit (between nodes). A program's --mca setting or OMPI_MCA_* variable changes
// them, so hone reads them rather than assuming the defaults. Other MPI libraries (and Open MPI's
// pml/ucx, whose thresholds are not control variables) have none of these variables: the limit
// is then unknown (0) and the exchange keeps its defaults.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hone/core/config.hpp"
#include "hone/dist/mpi/detail/mpi_tool.hpp"

HONE_NAMESPACE_BEGIN
namespace dist::detail {

/// The value of the integer control variable `name`, or 0 when the MPI library has no such
/// variable, it is not an integer of one element, or it cannot be read.
[[nodiscard]] inline std::uint64_t read_cvar_unsigned(const char* name) noexcept {
#if HONE_DETAIL_MPI_T
  int level = MPI_THREAD_SINGLE;
  if (MPI_Query_thread(&level) != MPI_SUCCESS) return 0;
  int provided = 0;
  if (MPI_T_init_thread(level, &provided) != MPI_SUCCESS) return 0;
  std::uint64_t value = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  int scope = 0;
  MPI_T_cvar_handle handle = open_cvar(name, type, scope);
  // Wide enough for any integer type MPI_T may use; read by its type.
  alignas(std::uint64_t) unsigned char buffer[16] = {};
  if (handle != MPI_T_CVAR_HANDLE_NULL && MPI_T_cvar_read(handle, buffer) == MPI_SUCCESS) {
    const auto as = [&](auto zero) {
      decltype(zero) v{};
      std::memcpy(&v, buffer, sizeof(v));
      if constexpr (std::is_signed_v<decltype(zero)>) {
        if (v < 0) return std::uint64_t{0};
      }
      return static_cast<std::uint64_t>(v);
    };
    if (type == MPI_INT)
      value = as(int{});
    else if (type == MPI_UNSIGNED)
      value = as(0u);
    else if (type == MPI_LONG)
      value = as(0L);
    else if (type == MPI_UNSIGNED_LONG)
      value = as(0UL);
    else if (type == MPI_LONG_LONG)
      value = as(0LL);
    else if (type == MPI_UNSIGNED_LONG_LONG)
      value = as(0ULL);
    else if (type == MPI_COUNT)
      value = as(MPI_Count{});
  }
  if (handle != MPI_T_CVAR_HANDLE_NULL) MPI_T_cvar_handle_free(&handle);
  MPI_T_finalize();
  return value;
#else
  (void)name;
  return 0;
#endif
}

/// The eager limit (bytes per message with the header) that messages between the ranks of `comm`
/// meet, agreed by every rank (the smallest of the ranks' values; 0 when a rank does not know
/// it): the smaller of the shared-memory and TCP transports' limits where both variables exist
/// (TCP's default, 64 KiB, is far above shared memory's 4 KiB, so on one node this is the
/// shared-memory limit unless a program lowers TCP's). Collective over `comm` (one
/// MPI_Allreduce); 0 when that fails.
[[nodiscard]] inline std::size_t transport_eager_limit(MPI_Comm comm) noexcept {
  std::uint64_t limit = read_cvar_unsigned("btl_vader_eager_limit");
  if (limit == 0) limit = read_cvar_unsigned("btl_sm_eager_limit");
  const std::uint64_t tcp = read_cvar_unsigned("btl_tcp_eager_limit");
  if (limit != 0 && tcp != 0) limit = std::min(limit, tcp);
  // Every rank must size its messages alike: the smallest limit, and unknown (0) anywhere wins.
  std::uint64_t agreed = 0;
  if (MPI_Allreduce(&limit, &agreed, 1, MPI_UINT64_T, MPI_MIN, comm) != MPI_SUCCESS) return 0;
  return static_cast<std::size_t>(agreed);
}

}  // namespace dist::detail
HONE_NAMESPACE_END
