// hone/serve.hpp: serving the user's model inside the user's process: the dynamic batcher, the
// prediction cache and the paged KV cache (docs/serve.md).
#pragma once

#include "hone/serve/batcher.hpp"
#include "hone/serve/kv_block_pool.hpp"
#include "hone/serve/kv_cache.hpp"
#include "hone/serve/prediction_cache.hpp"
