// hone/io.hpp: the io module: the file formats and file operations several modules share: JSON,
// atomic file writes with fsync, hashing, tensor element types, directories, and their errors.
#pragma once

#include "hone/io/directory.hpp"
#include "hone/io/dtype.hpp"
#include "hone/io/error.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/hash.hpp"
#include "hone/io/json.hpp"
