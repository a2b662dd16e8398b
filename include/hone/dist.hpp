// hone/dist.hpp: the dist module's host part without dependencies: the communicator concept, its
// requests and reductions, hone::dist_error, local_comm (one rank), hone::data_parallel (the
// trainer's gradient reduction role over any communicator) and hone::zero<1|2> (its ZeRO
// sharding). The MPI communicator and
// its environment are in <hone/dist/mpi/mpi_comm.hpp>, which needs the hone::mpi CMake target
// (an MPI implementation) and is therefore not included here (docs/dist.md).
#pragma once

#include "hone/dist/clock.hpp"
#include "hone/dist/communicator.hpp"
#include "hone/dist/data_parallel.hpp"
#include "hone/dist/local_comm.hpp"
#include "hone/dist/wire_format.hpp"
#include "hone/dist/zero.hpp"
