// tests/checkpoint/readers.hpp: runs hone's checkpoint readers over bytes, as the corpus test, the
// corpus generator and the fuzz target need: a file of each kind is read completely (every
// tensor's bytes touched, every compressed chunk decompressed and hashed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <hone/checkpoint/compress.hpp>
#include <hone/checkpoint/manifest.hpp>
#include <hone/checkpoint/safetensors.hpp>
#include <hone/checkpoint/state.hpp>
#include <hone/io/hash.hpp>

namespace hone_test {

namespace ck = hone::checkpoint;
namespace io = hone::io;

enum class input_kind { safetensors, compressed, manifest, state };

/// The kind of a corpus file, by its extension.
inline std::optional<input_kind> kind_of(const std::filesystem::path& p) {
  const auto ext = p.extension().string();
  if (ext == ".safetensors") return input_kind::safetensors;
  if (ext == ".hct") return input_kind::compressed;
  if (ext == ".manifest") return input_kind::manifest;
  if (ext == ".json") return input_kind::state;
  return std::nullopt;
}

inline std::string_view as_text(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

/// Reads `bytes` completely as a file of `kind`; throws hone::checkpoint_error when it is
/// malformed. Returns a value derived from everything read (so nothing is optimized away).
inline std::uint64_t read_fully(input_kind kind, std::span<const std::byte> bytes) {
  std::uint64_t acc = 0;
  switch (kind) {
    case input_kind::safetensors: {
      const auto f = ck::safetensors_file::view(bytes, "input.safetensors");
      for (const auto& t : f.tensors()) acc ^= io::hash64(f.data(t)) + t.shape.size();
      acc += f.metadata().size();
      break;
    }
    case input_kind::compressed: {
      const auto f = ck::compressed_file::view(bytes, "input.hct");
      f.verify();
      acc += f.tensors().size() + f.metadata().size();
      break;
    }
    case input_kind::manifest:
      acc += ck::manifest::parse(as_text(bytes), "input.manifest").size();
      break;
    case input_kind::state:
      acc += ck::parse_state(as_text(bytes), "input.json").step;
      break;
  }
  return acc;
}

inline std::vector<std::byte> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i) out[i] = static_cast<std::byte>(chars[i]);
  return out;
}

}  // namespace hone_test
