// hone/dist/mpi/detail/mpi_tool.hpp: opening a control variable of the MPI tool interface (MPI_T),
// shared by iallreduce_ring.hpp (writes Open MPI's libnbc algorithm) and eager_limit.hpp (reads
// the transports' eager limits). Included by those; not for direct use.
#pragma once

#include <mpi.h>

#include "hone/core/config.hpp"

#if MPI_VERSION > 3 || (MPI_VERSION == 3 && MPI_SUBVERSION >= 1)
#define HONE_DETAIL_MPI_T 1  // the tool interface (MPI 3.1) is there
#else
#define HONE_DETAIL_MPI_T 0
#endif

HONE_NAMESPACE_BEGIN
namespace dist::detail {

#if HONE_DETAIL_MPI_T
/// A handle to the control variable `name` when it exists, is bound to no object and holds one
/// element, with its datatype and scope; else MPI_T_CVAR_HANDLE_NULL. MPI_T must be initialized
/// (MPI_T_init_thread); free the handle with MPI_T_cvar_handle_free.
[[nodiscard]] inline MPI_T_cvar_handle open_cvar(const char* name, MPI_Datatype& type,
                                                 int& scope) noexcept {
  int index = -1, verbosity = 0, bind = 0;
  MPI_T_enum enumtype = MPI_T_ENUM_NULL;
  int name_len = 0, desc_len = 0;  // lengths 0: the name and description are not wanted
  type = MPI_DATATYPE_NULL;
  scope = 0;
  if (MPI_T_cvar_get_index(name, &index) != MPI_SUCCESS ||
      MPI_T_cvar_get_info(index, nullptr, &name_len, &verbosity, &type, &enumtype, nullptr,
                          &desc_len, &bind, &scope) != MPI_SUCCESS ||
      bind != MPI_T_BIND_NO_OBJECT) {
    return MPI_T_CVAR_HANDLE_NULL;
  }
  MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
  int count = 0;
  if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) != MPI_SUCCESS) {
    return MPI_T_CVAR_HANDLE_NULL;
  }
  if (count != 1) {
    MPI_T_cvar_handle_free(&handle);
    return MPI_T_CVAR_HANDLE_NULL;
  }
  return handle;
}
#endif

}  // namespace dist::detail
HONE_NAMESPACE_END
