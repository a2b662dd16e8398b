// hone/offload.hpp: the offload module: the optimizer step offloaded to the host (engine and the
// trainer's optimizer_to_host role), its transports, the memory monitor and the batch-size finder.
// The monitor owns a thread and reads /proc; include offload/optimizer_to_host.hpp alone when only
// the trainer's role is needed. Device code (offload/cuda/) is included by .cu files only.
#pragma once

#include "hone/offload/batch_size_finder.hpp"
#include "hone/offload/memory_monitor.hpp"
#include "hone/offload/optimizer_to_host.hpp"
#include "hone/offload/transport.hpp"
