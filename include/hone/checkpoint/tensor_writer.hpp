// hone/checkpoint/tensor_writer.hpp: tensor_writer, which writes named tensors as one safetensors
// file (hone/checkpoint/safetensors.hpp: the format and its reader) or, with compress.hpp, as
// hone's compressed tensor file: borrowed contiguous tensors, converted to an export dtype while
// writing, and gathered tensors whose rows a callback produces (a replay buffer's packed records).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
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

#include "hone/checkpoint/safetensors.hpp"
#include "hone/core/arena.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/space.hpp"
#include "hone/io/dtype.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/hash.hpp"
#include "hone/io/json.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// The order in which tensor_writer lays tensors out in a file.
enum class tensor_order {
  by_size,   // largest element size first, then as added: every tensor aligned to its element
  as_added,  // exactly as added (the converters use it to keep a file's layout)
};

/// Shapes by tensor name, for writer helpers whose sources carry only a flat element count.
using shape_map = std::map<std::string, shape_type, std::less<>>;

/// Collects named tensors (borrowed views: the data must stay alive and unchanged until the last
/// write) and writes them as one safetensors file, or, with compress.hpp, as hone's compressed
/// tensor file. Each tensor may be stored in another float dtype than its source (the export
/// dtype: F32 master weights saved as BF16), converted while writing, chunk by chunk, without a
/// full copy.
///
/// File order (tensor_order::by_size, the default): by element size, largest first, then in the
/// order added. Every tensor then starts at a multiple of its element size (the header is padded
/// to 8), so a mapped file can be viewed as typed arrays. Python's safetensors orders the same way
/// (by dtype, largest first), so a file it wrote, read and added back in its order, is laid out
/// with identical offsets.
class tensor_writer {
 public:
  /// A tensor waiting to be written.
  /// Fills `out` (rows * row_bytes bytes) with rows [first_row, first_row + rows) of a gathered
  /// tensor (add_gathered).
  using gather_fn =
      std::function<void(std::uint64_t first_row, std::uint64_t rows, std::span<std::byte> out)>;

  struct entry {
    std::string name;
    io::dtype stored = io::dtype::f32;  // dtype in the file
    io::dtype source = io::dtype::f32;  // dtype of `data`
    shape_type shape;
    std::span<const std::byte> data;  // source bytes (empty for a gathered tensor)
    gather_fn gather{};               // a gathered tensor's rows (stored == source)
    std::uint64_t gathered_bytes = 0;
    std::uint64_t row_bytes = 0;  // bytes per row (shape[0]) of a gathered tensor
    [[nodiscard]] std::uint64_t stored_bytes() const noexcept {
      if (gather) return gathered_bytes;
      return data.size() / io::dtype_size(source) * io::dtype_size(stored);
    }
  };

  /// Adds a tensor given as raw little-endian bytes of `type`. config_error if the name is empty,
  /// "__metadata__", not UTF-8 or already used, or if the bytes do not match shape and dtype.
  tensor_writer& add(std::string name, io::dtype type, shape_type shape,
                     std::span<const std::byte> data) {
    return add_converted(std::move(name), type, type, std::move(shape), data);
  }

  /// Adds a tensor from a contiguous range of elements (std::vector<float>, std::span<const
  /// hone::bfloat16>, hone::buffer<std::int64_t>, ...), stored as `export_as` (default: its own
  /// dtype; float types convert to F16, BF16, F32 or F64).
  template <std::ranges::contiguous_range R>
  requires std::ranges::sized_range<R> tensor_writer& add(
      std::string name, shape_type shape, const R& data,
      std::optional<io::dtype> export_as = std::nullopt) {
    using T = std::remove_cv_t<std::ranges::range_value_t<R>>;
    constexpr io::dtype source = io::dtype_of<T>;
    const auto bytes = std::as_bytes(std::span<const T>(
        std::ranges::data(data), static_cast<std::size_t>(std::ranges::size(data))));
    return add_converted(std::move(name), source, export_as.value_or(source), std::move(shape),
                         bytes);
  }

  /// Adds a tensor of `type` and `shape` whose bytes are not in one contiguous range: `gather`
  /// fills whole rows (along shape[0]) on demand while the file is written, into the writer's own
  /// staging buffer (a replay buffer's column gathered out of packed records). The same checks as
  /// add(); the callback must stay valid, and give the same bytes, until the last write. It may be
  /// called from several threads at once, for different rows (the compressed writer reads its
  /// chunks in parallel): it must only read shared state.
  tensor_writer& add_gathered(std::string name, io::dtype type, shape_type shape,
                              gather_fn gather) {
    HONE_REQUIRE(static_cast<bool>(gather),
                 "hone::checkpoint::tensor_writer::add_gathered: tensor '" + name +
                     "' has no gather function");
    HONE_REQUIRE(!shape.empty(), "hone::checkpoint::tensor_writer::add_gathered: tensor '" + name +
                                     "' needs at least one dimension (its rows)");
    const auto bytes = checked_byte_size(shape, io::dtype_size(type));
    HONE_REQUIRE(bytes.has_value(), "hone::checkpoint::tensor_writer: tensor '" + name +
                                        "' has shape " + shape_string(shape) +
                                        ", whose size overflows 64 bits");
    check_name(name, type, type);
    const std::uint64_t rows = shape[0];
    names_.insert(name);
    entry e{std::move(name), type, type, std::move(shape), {}};
    e.gather = std::move(gather);
    e.gathered_bytes = *bytes;
    e.row_bytes = rows == 0 ? 0 : *bytes / rows;
    entries_.push_back(std::move(e));
    return *this;
  }

  /// Adds every slot of a host arena as a tensor named prefix + slot name, stored as `export_as`.
  /// A slot's shape comes from `shapes` (by slot name), or is one-dimensional [count].
  template <class T, class Space>
  requires space_traits<Space>::host_accessible tensor_writer& add_arena(
      const arena<T, Space>& a, std::optional<io::dtype> export_as = std::nullopt,
      std::string_view prefix = {}, const shape_map& shapes = {}) {
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto& slot = a.layout()[i];
      shape_type shape{slot.count};
      if (const auto it = shapes.find(slot.name); it != shapes.end()) shape = it->second;
      add(std::string(prefix) + slot.name, std::move(shape), a.view(i), export_as);
    }
    return *this;
  }

  /// Adds the parameters of a model (any range of hone::parameter-like values with name, shape and
  /// a host `value` view), stored as `export_as`, named prefix + name.
  template <std::ranges::input_range Params>
  tensor_writer& add_parameters(Params&& params, std::optional<io::dtype> export_as = std::nullopt,
                                std::string_view prefix = {}) {
    for (auto&& p : params) {
      using V = std::remove_cvref_t<decltype(p.value)>;
      static_assert(std::ranges::contiguous_range<V>,
                    "hone::checkpoint::tensor_writer::add_parameters: parameter values must be "
                    "host views (std::span); copy device parameters to the host first");
      shape_type shape(std::ranges::begin(p.shape), std::ranges::end(p.shape));
      add(std::string(prefix) + std::string(p.name), std::move(shape), p.value, export_as);
    }
    return *this;
  }

  /// Sets a "__metadata__" entry (UTF-8 strings).
  tensor_writer& set_metadata(std::string key, std::string value) {
    HONE_REQUIRE(io::json::is_valid_utf8(key) && io::json::is_valid_utf8(value),
                 "hone::checkpoint::tensor_writer: metadata keys and values must be valid UTF-8");
    metadata_.insert_or_assign(std::move(key), std::move(value));
    return *this;
  }
  [[nodiscard]] const metadata_map& metadata() const noexcept { return metadata_; }

  /// The tensors in the order they were added.
  [[nodiscard]] std::span<const entry> entries() const noexcept { return entries_; }
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  [[nodiscard]] bool empty() const noexcept { return entries_.empty(); }
  void clear() noexcept {
    entries_.clear();
    names_.clear();
    metadata_.clear();
  }

  /// Chooses the file order (default tensor_order::by_size).
  tensor_writer& set_order(tensor_order order) noexcept {
    order_ = order;
    return *this;
  }
  [[nodiscard]] tensor_order order() const noexcept { return order_; }

  /// Indices into entries() in file order.
  [[nodiscard]] std::vector<std::size_t> file_order() const {
    std::vector<std::size_t> order(entries_.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    if (order_ == tensor_order::as_added) return order;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return io::dtype_size(entries_[a].stored) > io::dtype_size(entries_[b].stored);
    });
    return order;
  }
  /// The header entries as they will be written (file order, offsets assigned).
  [[nodiscard]] std::vector<tensor_info> layout() const {
    std::vector<tensor_info> out;
    out.reserve(entries_.size());
    std::uint64_t offset = 0;
    for (std::size_t i : file_order()) {
      const entry& e = entries_[i];
      out.push_back({e.name, e.stored, e.shape, offset, offset + e.stored_bytes()});
      offset += e.stored_bytes();
    }
    return out;
  }

  /// Fills `out` with the stored bytes of entries()[index] from byte `offset` on (converted to the
  /// stored dtype). offset and out.size() must be multiples of the stored element size.
  void read_stored(std::size_t index, std::uint64_t offset, std::span<std::byte> out) const {
    const entry& e = entries_.at(index);
    const std::size_t out_size = io::dtype_size(e.stored);
    const std::size_t in_size = io::dtype_size(e.source);
    HONE_REQUIRE(
        offset % out_size == 0 && out.size() % out_size == 0 &&
            offset + out.size() <= e.stored_bytes(),
        "hone::checkpoint::tensor_writer::read_stored: range outside tensor '" + e.name + "'");
    if (e.gather) {
      read_gathered(e, offset, out);
      return;
    }
    const auto first = static_cast<std::size_t>(offset / out_size);
    const std::size_t count = out.size() / out_size;
    io::convert(e.data.subspan(first * in_size, count * in_size), e.source, out, e.stored);
  }

  /// The size of the safetensors file write() produces.
  [[nodiscard]] std::uint64_t file_size() const {
    const auto l = layout();
    return detail::safetensors_prefix(l, metadata_).size() + (l.empty() ? 0 : l.back().end);
  }

  /// Writes a safetensors file at `path` (created or truncated), fsyncs it when `sync`, and returns
  /// its size and XXH3-128 (for the MANIFEST).
  ///
  /// A file of background_hash_bytes or more is written in pieces of background_hash_piece bytes,
  /// one write() each, and hashed on a second thread (io::background_hasher) right behind the
  /// writes, piece by piece, while the pieces are still in the shared cache; the fsync overlaps the
  /// hash of the last pieces. With a second core free, the writing thread then only writes. A
  /// smaller file, or one written where only one core is available, is hashed on the calling
  /// thread, each block of io::hash_io_bytes right after its write() (the bytes are still in the
  /// cache: one pass over memory). Either way the file, the order of its writes and fsync, and its
  /// digest are the same.
  io::file_digest write(const std::filesystem::path& path, bool sync = true) const {
    if (file_size() < background_hash_bytes) {
      io::output_file out(path);
      write_to(out);
      if (sync) out.sync();
      return out.close();
    }
    io::output_file out(path, io::create_mode::truncate, io::write_hashing::off);
    io::background_hasher hash;
    struct sink {
      io::output_file& out;
      io::background_hasher& hash;
      // Bytes the caller reuses or frees next (the header, a conversion's staging chunk).
      void write(std::span<const std::byte> b) {
        out.write(b);
        hash.add_now(b);
      }
      // A tensor's own bytes: alive until write() returns.
      void write_stable(std::span<const std::byte> b) {
        for (std::size_t off = 0; off < b.size(); off += background_hash_piece) {
          const auto piece = b.subspan(off, std::min(background_hash_piece, b.size() - off));
          out.write(piece);
          hash.add(piece);
        }
      }
    } s{out, hash};
    write_to(s);
    if (sync) out.sync();
    const io::digest128 h = hash.digest();
    const io::file_digest d = out.close();
    return {d.size, h};
  }

  /// The file size from which write() hashes on a second thread.
  static constexpr std::uint64_t background_hash_bytes = std::uint64_t{64} << 20;
  /// The write() size (and hand-off size to the hashing thread) of such a file.
  static constexpr std::size_t background_hash_piece = std::size_t{4} << 20;

  /// The same file in memory.
  [[nodiscard]] std::vector<std::byte> to_bytes() const {
    struct sink {
      std::vector<std::byte> bytes;
      void write(std::span<const std::byte> b) { bytes.insert(bytes.end(), b.begin(), b.end()); }
    } s;
    s.bytes.reserve(static_cast<std::size_t>(file_size()));
    write_to(s);
    return std::move(s.bytes);
  }

  /// Streams the file into any sink with write(std::span<const std::byte>), which may not keep the
  /// span past the call. A sink that also has write_stable(std::span<const std::byte>) gets the
  /// tensors' own bytes (unconverted) through it: those stay alive until write_to returns.
  template <class Sink>
  void write_to(Sink& sink) const {
    const auto l = layout();
    const std::string prefix = detail::safetensors_prefix(l, metadata_);
    sink.write(std::as_bytes(std::span(prefix.data(), prefix.size())));
    std::vector<std::byte> staging;
    for (std::size_t i : file_order()) {
      const entry& e = entries_[i];
      if (e.gather) {
        // Whole rows per piece, about 1 MiB (at least one row).
        if (e.row_bytes == 0) continue;
        const std::uint64_t per_piece =
            std::max<std::uint64_t>(1, (std::uint64_t{1} << 20) / e.row_bytes);
        const std::uint64_t rows = e.gathered_bytes / e.row_bytes;
        staging.resize(static_cast<std::size_t>(std::min(per_piece, rows) * e.row_bytes));
        for (std::uint64_t r = 0; r < rows; r += per_piece) {
          const std::uint64_t n = std::min(per_piece, rows - r);
          const auto piece = std::span(staging).first(static_cast<std::size_t>(n * e.row_bytes));
          e.gather(r, n, piece);
          sink.write(std::span<const std::byte>(piece));
        }
        continue;
      }
      if (e.source == e.stored) {
        if constexpr (requires { sink.write_stable(e.data); }) {
          sink.write_stable(e.data);  // the tensor's bytes stay alive until write_to returns
        } else {
          sink.write(e.data);
        }
        continue;
      }
      const std::size_t chunk = (std::size_t{1} << 20) / 8 * 8;  // a multiple of every item size
      staging.resize(chunk);
      for (std::uint64_t off = 0; off < e.stored_bytes(); off += chunk) {
        const auto n =
            static_cast<std::size_t>(std::min<std::uint64_t>(chunk, e.stored_bytes() - off));
        read_stored(i, off, std::span(staging).first(n));
        sink.write(std::span<const std::byte>(staging).first(n));
      }
    }
  }

 private:
  /// Copies bytes [offset, offset + out.size()) of a gathered tensor: whole rows are gathered
  /// straight into `out`, a partial row at either end through a one-row buffer.
  static void read_gathered(const entry& e, std::uint64_t offset, std::span<std::byte> out) {
    const std::uint64_t rb = e.row_bytes;
    std::vector<std::byte> row;
    while (!out.empty()) {
      const std::uint64_t r = offset / rb, in_row = offset % rb;
      if (in_row == 0 && out.size() >= rb) {
        const std::uint64_t n = out.size() / rb;
        e.gather(r, n, out.first(static_cast<std::size_t>(n * rb)));
        out = out.subspan(static_cast<std::size_t>(n * rb));
        offset += n * rb;
        continue;
      }
      row.resize(static_cast<std::size_t>(rb));
      e.gather(r, 1, row);
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(rb - in_row, out.size()));
      std::memcpy(out.data(), row.data() + in_row, n);
      out = out.subspan(n);
      offset += n;
    }
  }

  void check_name(const std::string& name, io::dtype source, io::dtype stored) const {
    HONE_REQUIRE(!name.empty(), "hone::checkpoint::tensor_writer: a tensor name may not be empty");
    HONE_REQUIRE(name != "__metadata__",
                 "hone::checkpoint::tensor_writer: \"__metadata__\" is reserved by safetensors and "
                 "cannot name a tensor");
    HONE_REQUIRE(io::json::is_valid_utf8(name),
                 "hone::checkpoint::tensor_writer: tensor names must be valid UTF-8");
    HONE_REQUIRE(!names_.contains(name), "hone::checkpoint::tensor_writer: the tensor name '" +
                                             name +
                                             "' is used twice; every tensor needs a distinct name");
    HONE_REQUIRE(io::can_convert(source, stored),
                 "hone::checkpoint::tensor_writer: tensor '" + name + "' of " +
                     std::string(io::dtype_name(source)) + " cannot be stored as " +
                     std::string(io::dtype_name(stored)) +
                     " (the export dtype converts between F16, BF16, F32 and F64 only)");
  }

  tensor_writer& add_converted(std::string name, io::dtype source, io::dtype stored,
                               shape_type shape, std::span<const std::byte> data) {
    check_name(name, source, stored);
    const auto bytes = checked_byte_size(shape, io::dtype_size(source));
    HONE_REQUIRE(bytes.has_value() && *bytes == data.size(),
                 "hone::checkpoint::tensor_writer: tensor '" + name + "' has shape " +
                     shape_string(shape) + " of " + std::string(io::dtype_name(source)) + " (" +
                     (bytes ? std::to_string(*bytes) : std::string("overflowing")) +
                     " bytes) but its data are " + std::to_string(data.size()) + " bytes");
    names_.insert(name);
    entries_.push_back({std::move(name), stored, source, std::move(shape), data});
    return *this;
  }

  std::vector<entry> entries_;
  std::set<std::string, std::less<>> names_;
  metadata_map metadata_;
  tensor_order order_ = tensor_order::by_size;
};

}  // namespace checkpoint
HONE_NAMESPACE_END
