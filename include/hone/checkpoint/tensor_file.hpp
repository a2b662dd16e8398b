// hone/checkpoint/tensor_file.hpp: one reader for both tensor file formats (plain safetensors and
// hone's compressed files, told apart by their first bytes), one writer entry point choosing
// between them, and loaders that fill arenas and model parameters from a file.
//
//   hone::checkpoint::tensor_writer w;
//   w.add_arena(master, hone::io::dtype::bf16);                  // export fp32 master as bf16
//   auto d = hone::checkpoint::write_tensors(w, dir / "model.safetensors");   // d: size + hash
//
//   auto f = hone::checkpoint::tensor_file::open(dir / "model.safetensors");
//   hone::checkpoint::load_arena(f, master);                       // bf16 -> fp32, checked
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "hone/checkpoint/compress.hpp"
#include "hone/checkpoint/dtype.hpp"
#include "hone/checkpoint/file_io.hpp"
#include "hone/checkpoint/safetensors.hpp"
#include "hone/core/arena.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/space.hpp"
#include "hone/io/dtype.hpp"
#include "hone/io/file_io.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// The two tensor file formats.
enum class tensor_format {
  safetensors,  // plain safetensors, readable by Python
  compressed,   // hone's shuffled + zstd format (compress.hpp)
};

/// How write_tensors() writes.
struct write_options {
  std::optional<compression_options> compression;  // none: plain safetensors
  bool sync = true;                                // fsync the file before returning
};

/// Writes the tensors of `writer` to `path` as plain safetensors, or compressed when
/// options.compression is set; returns the file's size and XXH3-128 for the MANIFEST.
inline io::file_digest write_tensors(const tensor_writer& writer, const std::filesystem::path& path,
                                     const write_options& options = {}) {
  if (options.compression)
    return write_compressed(writer, path, *options.compression, options.sync);
  return writer.write(path, options.sync);
}

/// A validated tensor file of either format.
class tensor_file {
 public:
  /// Opens (maps) the file at `path`, detecting its format from its first bytes.
  [[nodiscard]] static tensor_file open(const std::filesystem::path& path) {
    std::array<std::byte, 8> start{};
    {
      io::input_file in(path);
      if (in.size() >= start.size()) in.read_at(0, start);
    }
    if (is_compressed_tensor_file(start)) return tensor_file(compressed_file::open(path));
    return tensor_file(safetensors_file::open(path));
  }
  /// Validates the file held in `bytes` (borrowed), detecting its format.
  [[nodiscard]] static tensor_file view(std::span<const std::byte> bytes, std::string context) {
    if (is_compressed_tensor_file(bytes)) {
      return tensor_file(compressed_file::view(bytes, std::move(context)));
    }
    return tensor_file(safetensors_file::view(bytes, std::move(context)));
  }

  [[nodiscard]] tensor_format format() const noexcept {
    return impl_.index() == 0 ? tensor_format::safetensors : tensor_format::compressed;
  }
  [[nodiscard]] const std::string& context() const noexcept {
    return std::visit([](const auto& f) -> const std::string& { return f.context(); }, impl_);
  }
  /// Tensors in data order (offsets of the plain safetensors layout).
  [[nodiscard]] std::span<const tensor_info> tensors() const noexcept {
    return std::visit([](const auto& f) { return f.tensors(); }, impl_);
  }
  [[nodiscard]] const metadata_map& metadata() const noexcept {
    return std::visit([](const auto& f) -> const metadata_map& { return f.metadata(); }, impl_);
  }
  [[nodiscard]] std::uint64_t file_size() const noexcept {
    return std::visit([](const auto& f) { return f.file_size(); }, impl_);
  }
  [[nodiscard]] const tensor_info* find(std::string_view name) const noexcept {
    return std::visit([&](const auto& f) { return f.find(name); }, impl_);
  }
  [[nodiscard]] const tensor_info& at(std::string_view name) const {
    return std::visit([&](const auto& f) -> const tensor_info& { return f.at(name); }, impl_);
  }

  /// Copies (plain) or decompresses and checks (compressed) tensor `t` into `out`, converted to
  /// `as` (default: its own dtype). config_error when `out` has the wrong size.
  void read(const tensor_info& t, std::span<std::byte> out,
            std::optional<io::dtype> as = {}) const {
    std::visit([&](const auto& f) { f.read(t, out, as); }, impl_);
  }
  /// Reads tensor `name` into `out` as T (converting between float types); the element counts
  /// must match (checkpoint_error naming file and tensor otherwise).
  template <class T>
  void read_into(std::string_view name, std::span<T> out) const {
    const tensor_info& t = at(name);
    constexpr io::dtype want = io::dtype_of<T>;
    if (!io::can_convert(t.type, want)) {
      detail::fail(context(), "tensor " + detail::quote_name(name) + " is " +
                                  std::string(io::dtype_name(t.type)) +
                                  ", which cannot be read as " + std::string(io::dtype_name(want)));
    }
    if (t.elements() != out.size()) {
      detail::fail(context(), "tensor " + detail::quote_name(name) + " has " +
                                  std::to_string(t.elements()) + " elements (shape " +
                                  shape_string(t.shape) + "), the destination " +
                                  std::to_string(out.size()));
    }
    read(t, std::as_writable_bytes(out), want);
  }
  /// Reads tensor `name` as a vector of T.
  template <class T>
  [[nodiscard]] std::vector<T> read_as(std::string_view name) const {
    std::vector<T> v(static_cast<std::size_t>(at(name).elements()));
    read_into(name, std::span<T>(v));
    return v;
  }

  /// Checks everything not checked at open: for compressed files every chunk's size and hash
  /// (plain safetensors carry no checksum; the MANIFEST hash covers them).
  void verify() const {
    if (const auto* c = std::get_if<compressed_file>(&impl_)) c->verify();
  }

  /// The underlying reader of each format (nullptr for the other one).
  [[nodiscard]] const safetensors_file* plain() const noexcept {
    return std::get_if<safetensors_file>(&impl_);
  }
  [[nodiscard]] const compressed_file* compressed() const noexcept {
    return std::get_if<compressed_file>(&impl_);
  }

 private:
  explicit tensor_file(safetensors_file f) : impl_(std::move(f)) {}
  explicit tensor_file(compressed_file f) : impl_(std::move(f)) {}
  std::variant<safetensors_file, compressed_file> impl_;
};

/// Fills every slot of a host arena from the tensors named prefix + slot name (converting float
/// types: a BF16 export loads into an F32 arena). checkpoint_error naming the file and tensor when
/// one is missing or its element count differs from the slot's; tensors of the file that are not
/// slots are ignored. Returns the number of slots loaded.
template <class T, class Space>
requires space_traits<Space>::host_accessible std::size_t load_arena(const tensor_file& file,
                                                                     arena<T, Space>& a,
                                                                     std::string_view prefix = {}) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    file.read_into(std::string(prefix) + a.layout()[i].name, a.view(i));
  }
  return a.size();
}

/// Fills the `value` views of a model's parameters (hone::parameter-like: name, shape, value) from
/// the tensors named prefix + name; the shapes must match exactly. Returns the number loaded.
template <std::ranges::input_range Params>
std::size_t load_parameters(const tensor_file& file, Params&& params,
                            std::string_view prefix = {}) {
  std::size_t n = 0;
  for (auto&& p : params) {
    const std::string name = std::string(prefix) + std::string(p.name);
    const tensor_info& t = file.at(name);
    const shape_type want(std::ranges::begin(p.shape), std::ranges::end(p.shape));
    if (t.shape != want) {
      detail::fail(file.context(), "tensor " + detail::quote_name(name) + " has shape " +
                                       shape_string(t.shape) + ", the model's parameter has " +
                                       shape_string(want));
    }
    using V = std::remove_reference_t<decltype(*std::ranges::data(p.value))>;
    static_assert(!std::is_const_v<V>,
                  "hone::checkpoint::load_parameters: parameter values must be writable views");
    file.read_into(name, std::span<V>(std::ranges::data(p.value), std::ranges::size(p.value)));
    ++n;
  }
  return n;
}

}  // namespace checkpoint
HONE_NAMESPACE_END
