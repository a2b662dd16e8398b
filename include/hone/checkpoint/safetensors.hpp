// hone/checkpoint/safetensors.hpp: the safetensors format (huggingface/safetensors), written so
// that Python's `safetensors` package reads it unchanged, and read with every field validated
// before a byte of tensor data is used.
//
// Format: 8 bytes little-endian u64 N; N bytes of UTF-8 JSON
//   {"__metadata__": {"key": "value", ...},
//    "<name>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...}
// (hone pads the JSON with spaces to a multiple of 8, so the data starts 8-aligned, as Python
// does); then the data section: each tensor's elements little-endian, row-major, at
// [begin, end) relative to the start of the data section.
//
// The reader follows the reference implementation (safetensors/src/tensor.rs, read_metadata and
// Metadata::validate) and is stricter where that one lets damage through:
//  - N <= 100,000,000 (the reference's MAX_HEADER_SIZE) and 8 + N <= file size;
//  - the header is valid UTF-8 strict JSON (json.hpp): an object, no duplicate keys (the
//    reference keeps the last of two equal names silently; hone refuses), whitespace around it
//    allowed (Python accepts it; the spec allows padding);
//  - "__metadata__" is null or an object of string values;
//  - every other key is a tensor with "dtype" (a known name), "shape" (non-negative integers) and
//    "data_offsets" (exactly two non-negative integers, begin <= end); other fields are ignored,
//    as the reference ignores them;
//  - product(shape) * item size, computed without overflow, equals end - begin;
//  - sorted by offsets, the tensors tile the data section exactly: the first begins at 0, each
//    begins where the previous ends (no gap, no overlap), and the last ends at the end of the
//    file (trailing bytes are refused, as in the reference: "incomplete metadata").
// Any violation is hone::checkpoint_error naming the file, the tensor and the field.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <ranges>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/checkpoint/dtype.hpp"
#include "hone/checkpoint/file_io.hpp"
#include "hone/checkpoint/json.hpp"
#include "hone/core/arena.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/space.hpp"
#include "hone/io/dtype.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/json.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// A tensor's dimensions, outermost first. An empty shape is a scalar (one element).
using shape_type = std::vector<std::uint64_t>;
/// The "__metadata__" map of a safetensors file: free-form string pairs.
using metadata_map = std::map<std::string, std::string, std::less<>>;

/// The largest header the reader accepts (the reference implementation's MAX_HEADER_SIZE).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

/// One tensor of a file: what its header says, validated.
struct tensor_info {
  std::string name;
  io::dtype type = io::dtype::f32;
  shape_type shape;
  std::uint64_t begin = 0;  // data_offsets, relative to the start of the data section
  std::uint64_t end = 0;

  [[nodiscard]] std::uint64_t size_bytes() const noexcept { return end - begin; }
  [[nodiscard]] std::uint64_t elements() const noexcept {
    return size_bytes() / io::dtype_size(type);
  }
  friend bool operator==(const tensor_info&, const tensor_info&) = default;
};

/// A validated safetensors header.
struct safetensors_header {
  std::uint64_t header_bytes = 0;    // N, the JSON's length including padding
  std::vector<tensor_info> tensors;  // in data order (sorted by offsets)
  metadata_map metadata;

  /// Where the data section starts in the file.
  [[nodiscard]] std::uint64_t data_offset() const noexcept { return 8 + header_bytes; }
  /// Length of the data section.
  [[nodiscard]] std::uint64_t data_bytes() const noexcept {
    return tensors.empty() ? 0 : tensors.back().end;
  }
};

/// Text for a shape in messages and tools: "[2, 3]".
[[nodiscard]] inline std::string shape_string(const shape_type& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

/// The number of elements of `shape` times `item_size`, or nullopt if it overflows 64 bits.
[[nodiscard]] inline std::optional<std::uint64_t> checked_byte_size(
    const shape_type& shape, std::size_t item_size) noexcept {
  std::uint64_t n = item_size;
  for (std::uint64_t d : shape) {
    if (d != 0 && n > std::numeric_limits<std::uint64_t>::max() / d) return std::nullopt;
    n *= d;
  }
  return n;
}

namespace detail {

[[noreturn]] inline void fail(std::string_view context, const std::string& what) {
  throw checkpoint_error("hone: '" + std::string(context) + "': " + what);
}

/// A printable, bounded rendering of a tensor name taken from a file.
inline std::string quote_name(std::string_view name) {
  std::string s = "'";
  for (std::size_t i = 0; i < name.size() && i < 200; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    s += (c < 0x20 || c == 0x7f) ? '?' : name[i];
  }
  if (name.size() > 200) s += "...";
  return s + "'";
}

inline std::uint64_t read_u64_le(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint64_t>(p[i]);
  return v;
}
inline void write_u64_le(std::byte* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

/// A tensor entry of a header, validated, with its JSON object (compressed files read more
/// fields from it).
struct parsed_entry {
  tensor_info info;
  const io::json::value* object = nullptr;
};

inline std::uint64_t entry_u64(const io::json::value& v, std::string_view context,
                               const std::string& what) {
  if (!v.is_number())
    fail(context, what + " is " + std::string(io::json::kind_name(v.type())) +
                      ", not a non-negative integer");
  try {
    return v.as_u64();
  } catch (const checkpoint_error& e) {
    fail(context, what + ": " + e.what());
  }
}

/// Validates a parsed header object: metadata, tensor entries, offsets tiling [0, total). Returns
/// the entries sorted by offsets.
inline std::vector<parsed_entry> validate_header(const io::json::value& root,
                                                 std::string_view context, metadata_map& metadata) {
  if (!root.is_object()) {
    fail(context, "the header is " + std::string(io::json::kind_name(root.type())) +
                      ", not a JSON object of tensors");
  }
  std::vector<parsed_entry> entries;
  entries.reserve(root.size());
  for (const auto& [key, val] : root.as_object()) {
    if (key == "__metadata__") {
      if (val.is_null()) continue;
      if (!val.is_object()) {
        fail(context, "\"__metadata__\" is " + std::string(io::json::kind_name(val.type())) +
                          ", not an object of strings");
      }
      for (const auto& [mk, mv] : val.as_object()) {
        if (!mv.is_string()) {
          fail(context, "\"__metadata__\" entry " + quote_name(mk) + " is " +
                            std::string(io::json::kind_name(mv.type())) + ", not a string");
        }
        metadata.emplace(mk, mv.as_string());
      }
      continue;
    }
    const std::string who = "tensor " + quote_name(key);
    if (!val.is_object()) {
      fail(context, who + " is " + std::string(io::json::kind_name(val.type())) +
                        ", not an object with dtype, shape and data_offsets");
    }
    parsed_entry e;
    e.object = &val;
    e.info.name = key;
    const io::json::value* dt = val.find("dtype");
    if (dt == nullptr) fail(context, who + " has no \"dtype\"");
    if (!dt->is_string()) fail(context, who + ": \"dtype\" is not a string");
    const auto parsed = io::dtype_from_name(dt->as_string());
    if (!parsed) {
      if (io::is_sub_byte_dtype_name(dt->as_string())) {
        fail(context,
             who + " has the sub-byte dtype " + dt->as_string() + ", which hone does not support");
      }
      fail(context, who + " has an unknown dtype " + quote_name(dt->as_string()));
    }
    e.info.type = *parsed;
    const io::json::value* shape = val.find("shape");
    if (shape == nullptr) fail(context, who + " has no \"shape\"");
    if (!shape->is_array()) fail(context, who + ": \"shape\" is not an array");
    e.info.shape.reserve(shape->size());
    for (const auto& d : shape->as_array()) {
      e.info.shape.push_back(entry_u64(d, context, who + ": a \"shape\" dimension"));
    }
    const io::json::value* offsets = val.find("data_offsets");
    if (offsets == nullptr) fail(context, who + " has no \"data_offsets\"");
    if (!offsets->is_array() || offsets->size() != 2) {
      fail(context, who + ": \"data_offsets\" is not an array of two integers [begin, end]");
    }
    e.info.begin = entry_u64(offsets->as_array()[0], context, who + ": data_offsets begin");
    e.info.end = entry_u64(offsets->as_array()[1], context, who + ": data_offsets end");
    if (e.info.end < e.info.begin) {
      fail(context, who + ": data_offsets [" + std::to_string(e.info.begin) + ", " +
                        std::to_string(e.info.end) + "] end before they begin");
    }
    const auto bytes = checked_byte_size(e.info.shape, io::dtype_size(e.info.type));
    if (!bytes) {
      fail(context, who + ": shape " + shape_string(e.info.shape) + " of " +
                        std::string(io::dtype_name(e.info.type)) + " overflows 64 bits");
    }
    if (*bytes != e.info.size_bytes()) {
      fail(context, who + ": shape " + shape_string(e.info.shape) + " of " +
                        std::string(io::dtype_name(e.info.type)) + " needs " +
                        std::to_string(*bytes) + " bytes, but data_offsets [" +
                        std::to_string(e.info.begin) + ", " + std::to_string(e.info.end) +
                        "] span " + std::to_string(e.info.size_bytes()));
    }
    entries.push_back(std::move(e));
  }
  std::stable_sort(
      entries.begin(), entries.end(), [](const parsed_entry& a, const parsed_entry& b) {
        return a.info.begin != b.info.begin ? a.info.begin < b.info.begin : a.info.end < b.info.end;
      });
  std::uint64_t expected = 0;
  const tensor_info* previous = nullptr;
  for (const auto& e : entries) {
    if (e.info.begin != expected) {
      const std::string who = "tensor " + quote_name(e.info.name);
      if (previous == nullptr) {
        fail(context, who + " is the first in the data section but begins at " +
                          std::to_string(e.info.begin) + ", not 0 (a gap)");
      }
      if (e.info.begin < expected) {
        fail(context, who + " at [" + std::to_string(e.info.begin) + ", " +
                          std::to_string(e.info.end) + ") overlaps tensor " +
                          quote_name(previous->name) + " at [" + std::to_string(previous->begin) +
                          ", " + std::to_string(previous->end) + ")");
      }
      fail(context, who + " begins at " + std::to_string(e.info.begin) + ", leaving a gap of " +
                        std::to_string(e.info.begin - expected) + " bytes after tensor " +
                        quote_name(previous->name));
    }
    expected = e.info.end;
    previous = &e.info;
  }
  return entries;
}

/// Reads and checks the 8-byte length prefix; returns N.
inline std::uint64_t check_length_prefix(std::span<const std::byte> start, std::uint64_t file_size,
                                         std::string_view context) {
  if (file_size < 8 || start.size() < 8) {
    fail(context, "the file is " + std::to_string(file_size) +
                      " bytes, shorter than the 8-byte header length of a safetensors file");
  }
  const std::uint64_t n = read_u64_le(start.data());
  if (n > max_header_bytes) {
    fail(context, "the header length " + std::to_string(n) + " exceeds the " +
                      std::to_string(max_header_bytes) +
                      "-byte limit; this is not a safetensors file, or its first 8 bytes are "
                      "damaged");
  }
  if (n > file_size - 8) {
    fail(context, "the header length " + std::to_string(n) + " runs past the end of the " +
                      std::to_string(file_size) + "-byte file (truncated?)");
  }
  return n;
}

/// Parses a header's JSON text (validated as UTF-8 by the JSON reader).
inline io::json::value parse_header_json(std::span<const std::byte> text, std::string_view context,
                                         std::string_view what) {
  const std::string_view s(reinterpret_cast<const char*>(text.data()), text.size());
  try {
    return io::json::parse(s);
  } catch (const checkpoint_error& e) {
    // json's message starts with "hone: "; put the file first.
    std::string_view m = e.what();
    if (m.substr(0, 6) == "hone: ") m.remove_prefix(6);
    fail(context, std::string(what) + ": " + std::string(m));
  }
}

/// Sorted-by-name index over a vector of tensor_info, for find().
class name_index {
 public:
  name_index() = default;
  explicit name_index(const std::vector<tensor_info>& tensors) : order_(tensors.size()) {
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    std::sort(order_.begin(), order_.end(),
              [&](std::size_t a, std::size_t b) { return tensors[a].name < tensors[b].name; });
  }
  [[nodiscard]] const tensor_info* find(const std::vector<tensor_info>& tensors,
                                        std::string_view name) const noexcept {
    const auto it = std::lower_bound(
        order_.begin(), order_.end(), name,
        [&](std::size_t i, std::string_view n) { return std::string_view(tensors[i].name) < n; });
    if (it == order_.end() || tensors[*it].name != name) return nullptr;
    return &tensors[*it];
  }

 private:
  std::vector<std::size_t> order_;
};

/// Appends the JSON header of safetensors (without padding): metadata first, then the tensors in
/// the order given. `extra(i, out)` may append more fields (with a leading comma) to tensor i.
template <class Extra>
void append_header_json(std::string& out, std::span<const tensor_info> tensors,
                        const metadata_map& metadata, Extra&& extra) {
  out += '{';
  bool first = true;
  if (!metadata.empty()) {
    out += "\"__metadata__\":{";
    bool first_entry = true;
    for (const auto& [k, v] : metadata) {
      if (!first_entry) out += ',';
      first_entry = false;
      io::json::write_string(out, k);
      out += ':';
      io::json::write_string(out, v);
    }
    out += '}';
    first = false;
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const tensor_info& t = tensors[i];
    if (!first) out += ',';
    first = false;
    io::json::write_string(out, t.name);
    out += ":{\"dtype\":\"";
    out += io::dtype_name(t.type);
    out += "\",\"shape\":[";
    for (std::size_t d = 0; d < t.shape.size(); ++d) {
      if (d != 0) out += ',';
      out += std::to_string(t.shape[d]);
    }
    out += "],\"data_offsets\":[";
    out += std::to_string(t.begin);
    out += ',';
    out += std::to_string(t.end);
    out += ']';
    extra(i, out);
    out += '}';
  }
  out += '}';
}

/// Pads `json` with spaces to a multiple of 8 bytes.
inline void pad_to_8(std::string& json) {
  json.append((8 - json.size() % 8) % 8, ' ');
}

/// The complete prefix of a safetensors file: the 8-byte length and the padded header.
inline std::string safetensors_prefix(std::span<const tensor_info> tensors,
                                      const metadata_map& metadata) {
  std::string out(8, '\0');
  append_header_json(out, tensors, metadata, [](std::size_t, std::string&) {});
  std::string_view body(out);
  body.remove_prefix(8);
  std::size_t n = body.size();
  out.append((8 - n % 8) % 8, ' ');
  n = out.size() - 8;
  HONE_REQUIRE(n <= max_header_bytes, "hone::checkpoint: the safetensors header would be " +
                                          std::to_string(n) + " bytes, more than the " +
                                          std::to_string(max_header_bytes) +
                                          " readers accept; split the tensors over several files");
  write_u64_le(reinterpret_cast<std::byte*>(out.data()), n);
  return out;
}

}  // namespace detail

/// Validates the header of a safetensors file. `start` holds the file's first bytes (at least
/// 8 + N of them, or the whole file), `file_size` is the whole file's size (the data section must
/// end exactly there), `context` names the file in messages. checkpoint_error on any violation.
[[nodiscard]] inline safetensors_header parse_safetensors_header(std::span<const std::byte> start,
                                                                 std::uint64_t file_size,
                                                                 std::string_view context) {
  safetensors_header h;
  h.header_bytes = detail::check_length_prefix(start, file_size, context);
  if (start.size() - 8 < h.header_bytes) {
    throw config_error("hone::checkpoint::parse_safetensors_header: pass at least the first 8 + " +
                       std::to_string(h.header_bytes) + " bytes of the file");
  }
  const io::json::value root = detail::parse_header_json(
      start.subspan(8, static_cast<std::size_t>(h.header_bytes)), context, "header");
  auto entries = detail::validate_header(root, context, h.metadata);
  h.tensors.reserve(entries.size());
  for (auto& e : entries) h.tensors.push_back(std::move(e.info));
  const std::uint64_t available = file_size - h.data_offset();
  if (h.data_bytes() != available) {
    if (h.data_bytes() > available) {
      detail::fail(context, "the tensors need a data section of " + std::to_string(h.data_bytes()) +
                                " bytes, but only " + std::to_string(available) +
                                " follow the header (truncated?)");
    }
    detail::fail(context, std::to_string(available - h.data_bytes()) +
                              " bytes follow the last tensor; the data section must end with it");
  }
  return h;
}

/// Reads and validates the header of the file at `path` without reading its data (two preads).
[[nodiscard]] inline safetensors_header read_safetensors_header(const std::filesystem::path& path) {
  io::input_file in(path);
  const std::string context = path.string();
  std::vector<std::byte> start(8);
  if (in.size() < 8) {
    (void)detail::check_length_prefix({}, in.size(), context);
  }
  in.read_at(0, start);
  const std::uint64_t n = detail::check_length_prefix(start, in.size(), context);
  start.resize(8 + static_cast<std::size_t>(n));
  in.read_at(8, std::span(start).subspan(8));
  return parse_safetensors_header(start, in.size(), context);
}

/// A validated safetensors file in memory: mapped from disk (open) or borrowed (view). Tensor data
/// are views into the file; the object is movable and the views stay valid while it lives.
class safetensors_file {
 public:
  /// Maps the file at `path` and validates its header; checkpoint_error naming it on damage.
  [[nodiscard]] static safetensors_file open(const std::filesystem::path& path) {
    safetensors_file f;
    f.map_ = io::mapped_file(path);
    f.init(f.map_.bytes(), path.string());
    return f;
  }
  /// Validates the safetensors file held in `bytes` (borrowed: it must outlive the result).
  [[nodiscard]] static safetensors_file view(std::span<const std::byte> bytes,
                                             std::string context) {
    safetensors_file f;
    f.init(bytes, std::move(context));
    return f;
  }

  /// The name used in messages (the path).
  [[nodiscard]] const std::string& context() const noexcept { return context_; }
  [[nodiscard]] const safetensors_header& header() const noexcept { return header_; }
  /// Tensors in data order.
  [[nodiscard]] std::span<const tensor_info> tensors() const noexcept { return header_.tensors; }
  [[nodiscard]] const metadata_map& metadata() const noexcept { return header_.metadata; }
  [[nodiscard]] std::uint64_t file_size() const noexcept { return bytes_.size(); }

  /// The tensor called `name`, or nullptr.
  [[nodiscard]] const tensor_info* find(std::string_view name) const noexcept {
    return index_.find(header_.tensors, name);
  }
  /// The tensor called `name`; checkpoint_error naming the file and the tensor when absent.
  [[nodiscard]] const tensor_info& at(std::string_view name) const {
    if (const tensor_info* t = find(name)) return *t;
    detail::fail(context_, "has no tensor " + detail::quote_name(name));
  }
  /// The stored bytes of a tensor of this file (little-endian; aligned to the element size in
  /// files hone writes, not necessarily in others: copy with read() or std::memcpy).
  [[nodiscard]] std::span<const std::byte> data(const tensor_info& t) const noexcept {
    return bytes_.subspan(static_cast<std::size_t>(header_.data_offset() + t.begin),
                          static_cast<std::size_t>(t.size_bytes()));
  }
  [[nodiscard]] std::span<const std::byte> data(std::string_view name) const {
    return data(at(name));
  }
  /// Copies a tensor's bytes into `out`, converting to `as` (config_error when `out` has the wrong
  /// size or the dtypes cannot be converted). A large tensor of a file opened from disk that needs
  /// no conversion is read with pread straight into `out` (the kernel copies from the page cache
  /// without faulting the mapping in page by page); everything else is copied from the mapping.
  void read(const tensor_info& t, std::span<std::byte> out,
            std::optional<io::dtype> as = {}) const {
    const io::dtype to = as.value_or(t.type);
    if (to == t.type && map_.size() != 0 && out.size() == t.size_bytes() &&
        out.size() >= pread_min_bytes) {
      map_.read_at(header_.data_offset() + t.begin, out);
      return;
    }
    io::convert(data(t), t.type, out, to);
  }

  /// Tensors at least this large are read with pread (read()); smaller ones are copied from the
  /// mapping, where a system call per tensor would cost more than the copy.
  static constexpr std::size_t pread_min_bytes = std::size_t{64} << 10;

 private:
  safetensors_file() = default;
  void init(std::span<const std::byte> bytes, std::string context) {
    context_ = std::move(context);
    bytes_ = bytes;
    header_ = parse_safetensors_header(bytes_, bytes_.size(), context_);
    index_ = detail::name_index(header_.tensors);
  }

  io::mapped_file map_;
  std::span<const std::byte> bytes_;
  std::string context_;
  safetensors_header header_;
  detail::name_index index_;
};

}  // namespace checkpoint
HONE_NAMESPACE_END

// The writer (tensor_writer, write_tensors helpers) lives in its own header; every file that
// includes this one gets it too.
#include "hone/checkpoint/tensor_writer.hpp"
