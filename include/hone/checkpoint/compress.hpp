// hone/checkpoint/compress.hpp: hone compressed tensor files (".hct"), all of it: the format
// (compressed_format.hpp), the byte transforms applied before zstd (byte_transforms.hpp), the
// reader (compressed_reader.hpp), the writer (compressed_writer.hpp) and the conversions to and
// from plain safetensors (compressed_convert.hpp). Include one of those to take less.
#pragma once

#include "hone/checkpoint/byte_transforms.hpp"
#include "hone/checkpoint/compressed_convert.hpp"
#include "hone/checkpoint/compressed_format.hpp"
#include "hone/checkpoint/compressed_reader.hpp"
#include "hone/checkpoint/compressed_writer.hpp"
