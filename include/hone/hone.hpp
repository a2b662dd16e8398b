// hone/hone.hpp: every host-compilable hone module, through the module umbrellas. A file pays for
// each header it includes at every build: include the umbrella of the modules you use
// (<hone/train.hpp>, <hone/core.hpp>, ...) or the component headers under hone/<module>/ instead.
// Not included: the optional xtensor component (hone/xtensor/, target hone::xtensor), the MPI
// communicator (hone/dist/mpi/, target hone::mpi) and the device code (.cuh headers and */cuda/
// folders), which .cu files include.
#pragma once

#include "hone/checkpoint.hpp"
#include "hone/compress.hpp"
#include "hone/core.hpp"
#include "hone/data.hpp"
#include "hone/dist.hpp"
#include "hone/io.hpp"
#include "hone/offload.hpp"
#include "hone/optim.hpp"
#include "hone/precision.hpp"
#include "hone/profile.hpp"
#include "hone/rl.hpp"
#include "hone/schedule.hpp"
#include "hone/serve.hpp"
#include "hone/train.hpp"
