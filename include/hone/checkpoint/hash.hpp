// hone/checkpoint/hash.hpp: the content hashes of checkpoints (MANIFEST entries, chunk checksums).
// They are hone::io's (hone/io/hash.hpp), re-exported here: hone::checkpoint::digest128 is
// hone::io::digest128.
#pragma once

#include "hone/core/config.hpp"
#include "hone/io/hash.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {
using io::digest128;
using io::hash128;
using io::hash64;
using io::hasher;
using io::hex64;
using io::parse_hex64;
}  // namespace checkpoint
HONE_NAMESPACE_END
