// tests/data/megatron_interop_helper.cpp: the C++ side of megatron_interop.py.
//   megatron_interop_helper write <prefix>   writes the corpus below (uint16 tokens, documents)
//   megatron_interop_helper dump <prefix>    prints a uint16 or int32 pair read by hone: one line
//                                            "docs i0 i1 ...", then one line per sequence
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <hone/data/megatron.hpp>

namespace data = hone::data;

namespace {

// The Python twin is corpus() in megatron_interop.py: document k has k % 3 + 1 sequences, sequence
// j (over the whole file) holds (j * 7 + t) % 65536 for t < (j * 13) % 50 (so some are empty).
void write(const std::filesystem::path& prefix) {
  data::megatron_writer<std::uint16_t> w(prefix);
  std::size_t j = 0;
  for (std::size_t k = 0; k < 40; ++k) {
    for (std::size_t s = 0; s < k % 3 + 1; ++s, ++j) {
      std::vector<std::uint16_t> seq;
      for (std::size_t t = 0; t < (j * 13) % 50; ++t) {
        seq.push_back(static_cast<std::uint16_t>((j * 7 + t) % 65536));
      }
      w.add_item(seq);
    }
    w.end_document();
  }
  w.finalize();
}

template <class T>
void dump(const std::filesystem::path& prefix) {
  data::megatron_dataset<T> ds(prefix);
  std::string line = "docs";
  for (const auto k : ds.document_indices()) line += " " + std::to_string(k);
  std::puts(line.c_str());
  for (std::size_t i = 0; i < ds.size(); ++i) {
    line.clear();
    for (const auto v : ds[i]) line += std::to_string(v) + " ";
    std::puts(line.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s write|dump <prefix>\n", argv[0]);
    return 2;
  }
  try {
    const std::string cmd = argv[1];
    const std::filesystem::path prefix = argv[2];
    if (cmd == "write") {
      write(prefix);
    } else if (cmd == "dump") {
      const auto code = data::megatron_dtype_code(prefix);
      if (code == static_cast<std::uint8_t>(data::megatron_dtype::uint16)) {
        dump<std::uint16_t>(prefix);
      } else if (code == static_cast<std::uint8_t>(data::megatron_dtype::int32)) {
        dump<std::int32_t>(prefix);
      } else {
        std::fprintf(stderr, "dump reads uint16 or int32 pairs, not dtype code %d\n", code);
        return 2;
      }
    } else {
      std::fprintf(stderr, "unknown command '%s'\n", cmd.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
