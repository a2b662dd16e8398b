// hone/checkpoint/compressed_convert.hpp: conversions between hone compressed tensor files
// (hone/checkpoint/compressed_format.hpp) and plain safetensors files, both ways, keeping the
// tensors' order, offsets and metadata (what `hone-ckpt decompress` and `compress` do).
#pragma once

#include <filesystem>

#include "hone/checkpoint/compressed_reader.hpp"
#include "hone/checkpoint/compressed_writer.hpp"
#include "hone/checkpoint/safetensors.hpp"
#include "hone/core/config.hpp"
#include "hone/io/file_io.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// Converts the compressed tensor file `in` into the plain safetensors file `out` (readable by
/// Python's safetensors); returns the new file's size and XXH3-128.
inline io::file_digest decompress_to_safetensors(const std::filesystem::path& in,
                                                 const std::filesystem::path& out,
                                                 bool sync = true) {
  const compressed_file src = compressed_file::open(in);
  io::output_file dst(out);
  decompress_to(src, dst);
  if (sync) dst.sync();
  return dst.close();
}

/// Converts the plain safetensors file `in` into a compressed tensor file `out`, keeping its
/// tensor order and offsets; returns the new file's size and XXH3-128.
inline io::file_digest compress_safetensors(const std::filesystem::path& in,
                                            const std::filesystem::path& out,
                                            const compression_options& options = {},
                                            bool sync = true) {
  const safetensors_file src = safetensors_file::open(in);
  tensor_writer w;
  w.set_order(tensor_order::as_added);
  for (const auto& t : src.tensors()) w.add(t.name, t.type, t.shape, src.data(t));
  for (const auto& [k, v] : src.metadata()) w.set_metadata(k, v);
  return write_compressed(w, out, options, sync);
}

}  // namespace checkpoint
HONE_NAMESPACE_END
