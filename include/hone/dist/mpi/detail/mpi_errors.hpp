// hone/dist/mpi/detail/mpi_errors.hpp: the error texts of hone::dist::mpi_comm (MPI's error
// strings, dist_error for a failed call, lists of ranks in sentences). Included by
// hone/dist/mpi/mpi_comm.hpp; not for direct use.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/dist/communicator.hpp"

HONE_NAMESPACE_BEGIN
namespace dist::detail {

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS || length <= 0) {
    return "MPI error code " + std::to_string(code);
  }
  return std::string(text, static_cast<std::size_t>(length));
}

[[noreturn, gnu::cold, gnu::noinline]] inline void mpi_failure(int code, std::string_view what) {
  throw dist_error("hone::dist::" + std::string(what) + " failed: " + mpi_error_string(code));
}

/// Throws dist_error("hone::dist::<what> failed: <MPI's error string>") when rc is not MPI_SUCCESS.
inline void mpi_check(int rc, std::string_view what) {
  if (rc != MPI_SUCCESS) [[unlikely]]
    mpi_failure(rc, what);
}

/// "1", "1 and 2", "1, 2 and 3".
inline std::string join_list(const std::vector<std::string>& items) {
  std::string s;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) s += i + 1 == items.size() ? " and " : ", ";
    s += items[i];
  }
  return s;
}

/// "rank 2" or "ranks 1 and 2".
inline std::string ranks_phrase(const std::vector<int>& ranks) {
  std::vector<std::string> items;
  for (int r : ranks) items.push_back(std::to_string(r));
  return (ranks.size() == 1 ? "rank " : "ranks ") + join_list(items);
}

}  // namespace dist::detail
HONE_NAMESPACE_END
