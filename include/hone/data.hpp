// hone/data.hpp: the data module: lazy datasets over memory-mapped files (text lines, CSV, JSON
// Lines) with a saved offset index of 8 bytes per record, and Megatron-LM's .bin/.idx indexed
// dataset layout, read and written byte for byte, the dataset concept a user's own type plugs
// in through, samplers, and the loader that assembles batches on oneTBB threads with exact
// mid-epoch resume (with pinned_batch, batches in one block of pinned memory that the CUDA stager
// hone/data/cuda/staging.hpp copies to the device), and sharded record files of independently
// decodable zstd frames; and a feature cache (precomputed per-sample features in RAM within a byte
// budget, spilled to a checksummed zstd disk tier, keyed by sample and transform version)
// (docs/data.md).
#pragma once

#include "hone/data/dataset.hpp"
#include "hone/data/feature_cache.hpp"
#include "hone/data/line_dataset.hpp"
#include "hone/data/loader.hpp"
#include "hone/data/loader_state.hpp"
#include "hone/data/megatron.hpp"
#include "hone/data/pinned_batch.hpp"
#include "hone/data/sampler.hpp"
#include "hone/data/shard.hpp"
#include "hone/data/shard_format.hpp"
