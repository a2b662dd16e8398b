// hone/checkpoint/file_io.hpp: the file operations checkpoints are written and read with. They are
// hone::io's (hone/io/file_io.hpp), re-exported here: hone::checkpoint::file_digest is
// hone::io::file_digest.
#pragma once

#include "hone/checkpoint/hash.hpp"
#include "hone/core/config.hpp"
#include "hone/io/file_io.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {
using io::create_mode;
using io::file_digest;
using io::hash_file;
using io::input_file;
using io::mapped_file;
using io::output_file;
using io::read_small_file;
using io::rename_path;
using io::sync_directory;
using io::throw_io_error;
using io::write_file;
using io::write_hashing;
}  // namespace checkpoint
HONE_NAMESPACE_END
