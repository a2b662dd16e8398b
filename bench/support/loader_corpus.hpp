// bench/support/loader_corpus.hpp: the record corpora of the loader benchmarks (bench_loader,
// bench_data_gpu): `records` records of `width` uint16 tokens each, record i holding the tokens
// (i * width + j) & 0xffff, as one Megatron .bin/.idx pair (the torch peer reads the same .bin).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <hone/data/megatron.hpp>
#include <string>
#include <vector>

namespace hone_bench {

/// The corpus' prefix under `dir`, written once (kept while its .bin has the expected size).
inline std::filesystem::path loader_corpus(const std::filesystem::path& dir, std::size_t records,
                                           std::size_t width) {
  namespace fs = std::filesystem;
  namespace data = hone::data;
  const fs::path prefix =
      dir / ("records_" + std::to_string(records) + "x" + std::to_string(width));
  if (fs::exists(data::megatron_idx_path(prefix)) && fs::exists(data::megatron_bin_path(prefix)) &&
      fs::file_size(data::megatron_bin_path(prefix)) == records * width * 2) {
    return prefix;
  }
  fs::create_directories(dir);
  data::megatron_writer<std::uint16_t> w(prefix);
  std::vector<std::uint16_t> rec(width);
  for (std::size_t i = 0; i < records; ++i) {
    for (std::size_t j = 0; j < width; ++j) {
      rec[j] = static_cast<std::uint16_t>((i * width + j) & 0xffffu);
    }
    w.add_item(rec);
    w.end_document();
  }
  w.finalize();
  return prefix;
}

}  // namespace hone_bench
