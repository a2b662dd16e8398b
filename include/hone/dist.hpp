// hone/dist.hpp: the dist module's host part without dependencies: the communicator concept, its
// requests and reductions, hone::dist_error, and local_comm (one rank). The MPI communicator and
// its environment are in <hone/dist/mpi/mpi_comm.hpp>, which needs the hone::mpi CMake target
// (an MPI implementation) and is therefore not included here (docs/dist.md).
#pragma once

#include "hone/dist/communicator.hpp"
#include "hone/dist/local_comm.hpp"
