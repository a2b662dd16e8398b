// hone/serve.hpp: serving the user's model inside the user's process: the dynamic batcher
// and the paged KV cache (docs/serve.md), and the prediction cache.
#pragma once

#include "hone/serve/batcher.hpp"
#include "hone/serve/kv_block_pool.hpp"
#include "hone/serve/kv_cache.hpp"
#include "hone/serve/prediction_cache.hpp"
