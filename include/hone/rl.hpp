// hone/rl.hpp: the rl module: transitions and replay buffers composed from storages (ring,
// packed, frame store, memory-mapped ring, disk), samplers (uniform, prioritized with its sum
// tree), n-step returns, concurrency policies, saving and loading, HOGWILD! updates, the state
// cache, variable batches, parallel actors and actors on other ranks (dist_actors.hpp, generic
// over hone::dist::communicator: no MPI dependency). Device code (rl/cuda/) is included by .cu
// files only.
#pragma once

#include "hone/rl/actors.hpp"
#include "hone/rl/auto_storage.hpp"
#include "hone/rl/batch.hpp"
#include "hone/rl/concurrency.hpp"
#include "hone/rl/dist_actors.hpp"
#include "hone/rl/field_layout.hpp"
#include "hone/rl/frame_store.hpp"
#include "hone/rl/hogwild.hpp"
#include "hone/rl/mmap_ring.hpp"
#include "hone/rl/mmap_storage.hpp"
#include "hone/rl/n_step.hpp"
#include "hone/rl/packed_storage.hpp"
#include "hone/rl/prioritized_sampler.hpp"
#include "hone/rl/replay_buffer.hpp"
#include "hone/rl/replay_io.hpp"
#include "hone/rl/ring_storage.hpp"
#include "hone/rl/rng.hpp"
#include "hone/rl/roles.hpp"
#include "hone/rl/state_cache.hpp"
#include "hone/rl/sum_tree.hpp"
#include "hone/rl/transition.hpp"
#include "hone/rl/uniform_sampler.hpp"
#include "hone/rl/variable_batch.hpp"
