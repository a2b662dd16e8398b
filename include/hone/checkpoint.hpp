// hone/checkpoint.hpp: the checkpoint module: safetensors files, compressed tensor files, the
// MANIFEST and its verification, the (async) writer, retention, trainer state capture and restore,
// and the trainer's checkpoint policy. Device code (checkpoint/cuda/) is included by .cu files
// only.
#pragma once

#include "hone/checkpoint/byte_transforms.hpp"
#include "hone/checkpoint/compress.hpp"
#include "hone/checkpoint/compressed_convert.hpp"
#include "hone/checkpoint/compressed_format.hpp"
#include "hone/checkpoint/compressed_reader.hpp"
#include "hone/checkpoint/compressed_writer.hpp"
#include "hone/checkpoint/directory.hpp"
#include "hone/checkpoint/dtype.hpp"
#include "hone/checkpoint/file_io.hpp"
#include "hone/checkpoint/hash.hpp"
#include "hone/checkpoint/json.hpp"
#include "hone/checkpoint/manifest.hpp"
#include "hone/checkpoint/policy.hpp"
#include "hone/checkpoint/retention.hpp"
#include "hone/checkpoint/safetensors.hpp"
#include "hone/checkpoint/shard_index.hpp"
#include "hone/checkpoint/sharded.hpp"
#include "hone/checkpoint/state.hpp"
#include "hone/checkpoint/tensor_file.hpp"
#include "hone/checkpoint/tensor_writer.hpp"
#include "hone/checkpoint/trainer_checkpoint.hpp"
#include "hone/checkpoint/verify.hpp"
#include "hone/checkpoint/writer.hpp"
