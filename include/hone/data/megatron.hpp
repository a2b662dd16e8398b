// hone/data/megatron.hpp: Megatron-LM's indexed dataset layout (`MMapIndexedDataset`, in
// megatron-core `IndexedDataset`), read and written byte for byte: a `<prefix>.bin` holding the
// sequences' elements back to back and a `<prefix>.idx`:
//
//   "MMIDIDX\0\0"            9 bytes
//   version                  uint64 = 1
//   dtype code               uint8 (uint8=1 int8=2 int16=3 int32=4 int64=5 float64=6 float32=7
//                            uint16=8)
//   sequence count N         uint64
//   document count D         uint64 (entries in the document index array, D >= 1)
//   sequence lengths         int32[N]   elements per sequence
//   sequence pointers        int64[N]   byte offset of each sequence in the .bin
//   document indices         int64[D]   0, then the sequence index that ends each document
//
// All little-endian. megatron_writer writes both files (under temporary names, renamed into place
// by finalize()); megatron_dataset<T> maps them, checks every length, pointer and document index
// against the file sizes (a damaged or truncated pair is a hone::io::format_error naming the file
// and the field, never an out-of-bounds read) and returns each sequence as a std::span into the
// mapped .bin (zero copy). Multimodal files (a trailing int8 mode per sequence) are not supported.
#pragma once

#include <unistd.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/error.hpp"
#include "hone/io/file_io.hpp"

HONE_NAMESPACE_BEGIN
namespace data {

static_assert(std::endian::native == std::endian::little,
              "hone/data/megatron.hpp: Megatron's .bin/.idx files are little-endian; this header "
              "maps them directly and needs a little-endian host");

/// Megatron's DType codes (megatron/core/datasets/indexed_dataset.py).
enum class megatron_dtype : std::uint8_t {
  uint8 = 1,
  int8 = 2,
  int16 = 3,
  int32 = 4,
  int64 = 5,
  float64 = 6,
  float32 = 7,
  uint16 = 8,
};

/// Bytes per element of a dtype code; 0 for a code Megatron does not define.
[[nodiscard]] constexpr std::size_t megatron_dtype_size(std::uint8_t code) noexcept {
  switch (code) {
    case 1:
    case 2:
      return 1;
    case 3:
    case 8:
      return 2;
    case 4:
    case 7:
      return 4;
    case 5:
    case 6:
      return 8;
    default:
      return 0;
  }
}

[[nodiscard]] constexpr std::string_view megatron_dtype_name(std::uint8_t code) noexcept {
  constexpr std::string_view names[] = {"?",     "uint8",   "int8",    "int16", "int32",
                                        "int64", "float64", "float32", "uint16"};
  return code <= 8 ? names[code] : "?";
}

/// The code of the element type T; a compile error for a type Megatron has no code for.
template <class T>
[[nodiscard]] constexpr megatron_dtype megatron_dtype_of() noexcept {
  if constexpr (std::is_same_v<T, std::uint8_t>)
    return megatron_dtype::uint8;
  else if constexpr (std::is_same_v<T, std::int8_t>)
    return megatron_dtype::int8;
  else if constexpr (std::is_same_v<T, std::int16_t>)
    return megatron_dtype::int16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return megatron_dtype::int32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return megatron_dtype::int64;
  else if constexpr (std::is_same_v<T, double>)
    return megatron_dtype::float64;
  else if constexpr (std::is_same_v<T, float>)
    return megatron_dtype::float32;
  else if constexpr (std::is_same_v<T, std::uint16_t>)
    return megatron_dtype::uint16;
  else
    static_assert(sizeof(T) == 0,
                  "hone::data: Megatron's layout stores uint8, int8, int16, uint16, int32, int64, "
                  "float32 or float64 elements; use one of those types");
}

inline constexpr char megatron_idx_magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr std::size_t megatron_idx_header_bytes = 9 + 8 + 1 + 8 + 8;  // 34

[[nodiscard]] inline std::filesystem::path megatron_bin_path(const std::filesystem::path& prefix) {
  return prefix.string() + ".bin";
}
[[nodiscard]] inline std::filesystem::path megatron_idx_path(const std::filesystem::path& prefix) {
  return prefix.string() + ".idx";
}

/// Writes `<prefix>.bin` and `<prefix>.idx` like megatron-core's IndexedDatasetBuilder:
/// add_item() appends a sequence, end_document() closes a document after the sequences added
/// since the last one, add_document() does both for several sequences. finalize() writes the
/// index (closing a document left open) and renames both files into place (until then they are
/// `<name>.tmp.<pid>`).
template <class T>
class megatron_writer {
 public:
  explicit megatron_writer(std::filesystem::path prefix)
      : prefix_(std::move(prefix)),
        bin_tmp_(megatron_bin_path(prefix_).string() + tmp_suffix()),
        bin_(bin_tmp_, io::create_mode::truncate, io::write_hashing::off) {}

  megatron_writer(const megatron_writer&) = delete;
  megatron_writer& operator=(const megatron_writer&) = delete;
  ~megatron_writer() {
    if (!finalized_) {
      std::error_code ec;
      std::filesystem::remove(bin_tmp_, ec);
    }
  }

  /// Appends one sequence (it belongs to the open document until end_document()).
  void add_item(std::span<const T> sequence) {
    require_open();
    if (sequence.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
      throw config_error(
          "hone: a Megatron sequence holds at most 2^31 - 1 elements (its length "
          "is an int32 in the .idx); sequence " +
          std::to_string(lengths_.size()) + " of '" + prefix_.string() + "' has " +
          std::to_string(sequence.size()) + "; split it");
    }
    bin_.write(std::as_bytes(sequence));
    lengths_.push_back(static_cast<std::int32_t>(sequence.size()));
  }
  /// Ends the current document (after the sequences added since the previous one).
  void end_document() {
    require_open();
    documents_.push_back(static_cast<std::int64_t>(lengths_.size()));
  }
  /// Appends the sequences of one document: `tokens` cut into consecutive `lengths`.
  void add_document(std::span<const T> tokens, std::span<const std::size_t> lengths) {
    std::size_t at = 0;
    for (const std::size_t n : lengths) {
      if (n > tokens.size() - at) {
        throw config_error("hone: add_document for '" + prefix_.string() +
                           "' was given lengths that add up to more than its " +
                           std::to_string(tokens.size()) + " elements");
      }
      add_item(tokens.subspan(at, n));
      at += n;
    }
    if (at != tokens.size()) {
      throw config_error("hone: add_document for '" + prefix_.string() +
                         "' was given lengths "
                         "that add up to " +
                         std::to_string(at) + " of its " + std::to_string(tokens.size()) +
                         " elements; they must cover all");
    }
    end_document();
  }
  [[nodiscard]] std::size_t sequences() const noexcept { return lengths_.size(); }

  /// Ends an open document (sequences added after the last end_document()), writes the .idx,
  /// fsyncs both files and renames them into place.
  void finalize() {
    require_open();
    if (documents_.back() != static_cast<std::int64_t>(lengths_.size())) end_document();
    bin_.sync();
    bin_.close();
    const std::filesystem::path idx_tmp = megatron_idx_path(prefix_).string() + tmp_suffix();
    try {
      io::output_file idx(idx_tmp, io::create_mode::truncate, io::write_hashing::off);
      std::string head(megatron_idx_magic, 9);
      append(head, std::uint64_t{1});
      head.push_back(static_cast<char>(megatron_dtype_of<T>()));
      append(head, static_cast<std::uint64_t>(lengths_.size()));
      append(head, static_cast<std::uint64_t>(documents_.size()));
      idx.write(head);
      idx.write(std::as_bytes(std::span(lengths_)));
      std::vector<std::int64_t> pointers(lengths_.size());
      std::int64_t at = 0;
      for (std::size_t i = 0; i < lengths_.size(); ++i) {
        pointers[i] = at;
        at += static_cast<std::int64_t>(lengths_[i]) * static_cast<std::int64_t>(sizeof(T));
      }
      idx.write(std::as_bytes(std::span(pointers)));
      idx.write(std::as_bytes(std::span(documents_)));
      idx.sync();
      idx.close();
      io::rename_path(bin_tmp_, megatron_bin_path(prefix_));
      io::rename_path(idx_tmp, megatron_idx_path(prefix_));
    } catch (...) {
      std::error_code ec;
      std::filesystem::remove(idx_tmp, ec);
      throw;
    }
    finalized_ = true;
    const auto dir = prefix_.parent_path();
    io::sync_directory(dir.empty() ? std::filesystem::path(".") : dir);
  }

 private:
  static std::string tmp_suffix() {
    return ".tmp." + std::to_string(static_cast<long>(::getpid()));
  }
  static void append(std::string& s, std::uint64_t v) {
    char b[8];
    std::memcpy(b, &v, 8);
    s.append(b, 8);
  }
  void require_open() const {
    if (finalized_) {
      throw config_error("hone: the Megatron writer of '" + prefix_.string() +
                         "' was already finalized; create a new writer to write more");
    }
  }
  std::filesystem::path prefix_;
  std::filesystem::path bin_tmp_;
  io::output_file bin_;
  std::vector<std::int32_t> lengths_;
  std::vector<std::int64_t> documents_{0};
  bool finalized_ = false;
};

/// The dtype code stored in `<prefix>.idx` (validated like the reader does).
[[nodiscard]] inline std::uint8_t megatron_dtype_code(const std::filesystem::path& prefix);

/// A Megatron `.bin`/`.idx` pair mapped read-only: size() sequences, get(i) a span into the .bin.
template <class T>
class megatron_dataset {
 public:
  using value_type = T;

  explicit megatron_dataset(const std::filesystem::path& prefix)
      : idx_path_(megatron_idx_path(prefix)), bin_path_(megatron_bin_path(prefix)) {
    {
      const io::mapped_file idx(idx_path_);
      parse_index(idx.bytes());
    }
    bin_ = io::mapped_file(bin_path_);
    validate_pointers();
  }

  [[nodiscard]] std::size_t size() const noexcept { return lengths_.size(); }
  /// Sequence `i` as a span of the mapped .bin.
  [[nodiscard]] std::span<const T> get(std::size_t i) const {
    if (i >= lengths_.size()) {
      throw config_error("hone: sequence " + std::to_string(i) + " of '" + bin_path_.string() +
                         "' does not exist: it has " + std::to_string(lengths_.size()) +
                         " sequences");
    }
    const auto* p = reinterpret_cast<const T*>(bin_.bytes().data() + pointers_[i]);
    return {p, static_cast<std::size_t>(lengths_[i])};
  }
  [[nodiscard]] std::span<const T> operator[](std::size_t i) const { return get(i); }
  /// Number of documents (the document index array's length minus its leading 0).
  [[nodiscard]] std::size_t documents() const noexcept { return documents_.size() - 1; }
  /// Sequences [first, last) of document `d`.
  [[nodiscard]] std::pair<std::size_t, std::size_t> document(std::size_t d) const {
    if (d >= documents()) {
      throw config_error("hone: document " + std::to_string(d) + " of '" + idx_path_.string() +
                         "' does not exist: it has " + std::to_string(documents()) + " documents");
    }
    return {static_cast<std::size_t>(documents_[d]), static_cast<std::size_t>(documents_[d + 1])};
  }
  [[nodiscard]] std::span<const std::int32_t> sequence_lengths() const noexcept { return lengths_; }
  [[nodiscard]] std::span<const std::int64_t> sequence_pointers() const noexcept {
    return pointers_;
  }
  [[nodiscard]] std::span<const std::int64_t> document_indices() const noexcept {
    return documents_;
  }

 private:
  template <class U>
  static U load(std::span<const std::byte> b, std::size_t at) {
    U v;
    std::memcpy(&v, b.data() + at, sizeof(U));
    return v;
  }
  [[noreturn]] void bad(const std::filesystem::path& file, const std::string& what) const {
    throw io::format_error("hone: '" + file.string() +
                           "' is not a valid Megatron indexed dataset: " + what +
                           "; write it again (megatron-core's IndexedDatasetBuilder or "
                           "hone::data::megatron_writer)");
  }

  void parse_index(std::span<const std::byte> b) {
    const std::uint64_t size = b.size();
    if (size < megatron_idx_header_bytes) {
      bad(idx_path_, "it is " + std::to_string(size) + " bytes, shorter than the 34-byte header");
    }
    if (std::memcmp(b.data(), megatron_idx_magic, 9) != 0) {
      bad(idx_path_, "it does not start with the magic bytes \"MMIDIDX\\x00\\x00\"");
    }
    if (const auto v = load<std::uint64_t>(b, 9); v != 1) {
      bad(idx_path_, "its version is " + std::to_string(v) + ", only version 1 exists");
    }
    const auto code = load<std::uint8_t>(b, 17);
    if (megatron_dtype_size(code) == 0) {
      bad(idx_path_, "its dtype code " + std::to_string(code) + " is not one of Megatron's (1-8)");
    }
    if (code != static_cast<std::uint8_t>(megatron_dtype_of<T>())) {
      throw config_error(
          "hone: '" + idx_path_.string() + "' holds " + std::string(megatron_dtype_name(code)) +
          " elements, but it was opened as " +
          std::string(megatron_dtype_name(static_cast<std::uint8_t>(megatron_dtype_of<T>()))) +
          "; open it with that element type (megatron_dtype_code() tells it)");
    }
    const auto n = load<std::uint64_t>(b, 18);
    const auto d = load<std::uint64_t>(b, 26);
    const std::uint64_t room = size - megatron_idx_header_bytes;
    if (n > room / 12 || d > (room - n * 12) / 8) {
      bad(idx_path_, "its header counts " + std::to_string(n) + " sequences and " +
                         std::to_string(d) + " document indices, more than its " +
                         std::to_string(size) + " bytes hold (the file is truncated)");
    }
    const std::uint64_t expect = megatron_idx_header_bytes + n * 12 + d * 8;
    if (expect != size) {
      bad(idx_path_, "it is " + std::to_string(size) + " bytes, but its header's counts (" +
                         std::to_string(n) + " sequences, " + std::to_string(d) +
                         " document indices) make " + std::to_string(expect) +
                         (size == expect + n ? " (multimodal files with sequence modes are not "
                                               "supported)"
                                             : ""));
    }
    if (d == 0) bad(idx_path_, "its document index array is empty (it must start with 0)");
    lengths_.resize(static_cast<std::size_t>(n));
    pointers_.resize(static_cast<std::size_t>(n));
    documents_.resize(static_cast<std::size_t>(d));
    std::size_t at = megatron_idx_header_bytes;
    std::memcpy(lengths_.data(), b.data() + at, n * 4);
    at += n * 4;
    std::memcpy(pointers_.data(), b.data() + at, n * 8);
    at += n * 8;
    std::memcpy(documents_.data(), b.data() + at, d * 8);
    for (std::size_t i = 0; i < lengths_.size(); ++i) {
      if (lengths_[i] < 0) {
        bad(idx_path_, "sequence " + std::to_string(i) + " has the negative length " +
                           std::to_string(lengths_[i]));
      }
    }
    if (documents_[0] != 0) {
      bad(idx_path_,
          "its document indices start with " + std::to_string(documents_[0]) + " instead of 0");
    }
    for (std::size_t k = 1; k < documents_.size(); ++k) {
      if (documents_[k] < documents_[k - 1] || static_cast<std::uint64_t>(documents_[k]) > n) {
        bad(idx_path_, "document index " + std::to_string(k) + " (" +
                           std::to_string(documents_[k]) + ") is out of order or past the " +
                           std::to_string(n) + " sequences");
      }
    }
    if (static_cast<std::uint64_t>(documents_.back()) != n) {
      bad(idx_path_, "its last document ends at sequence " + std::to_string(documents_.back()) +
                         ", not at the sequence count " + std::to_string(n));
    }
  }

  void validate_pointers() const {
    const std::uint64_t size = bin_.size();
    for (std::size_t i = 0; i < lengths_.size(); ++i) {
      const std::int64_t p = pointers_[i];
      const std::uint64_t bytes = static_cast<std::uint64_t>(lengths_[i]) * sizeof(T);
      if (p < 0 || static_cast<std::uint64_t>(p) % alignof(T) != 0 ||
          static_cast<std::uint64_t>(p) > size || bytes > size - static_cast<std::uint64_t>(p)) {
        bad(bin_path_, "sequence " + std::to_string(i) + " (" + std::to_string(lengths_[i]) +
                           " elements at byte " + std::to_string(p) +
                           ") is misaligned or reaches past the file's " + std::to_string(size) +
                           " bytes (the .bin is truncated or does not belong to this .idx)");
      }
    }
  }

  std::filesystem::path idx_path_;
  std::filesystem::path bin_path_;
  io::mapped_file bin_;
  std::vector<std::int32_t> lengths_;
  std::vector<std::int64_t> pointers_;
  std::vector<std::int64_t> documents_;
};

inline std::uint8_t megatron_dtype_code(const std::filesystem::path& prefix) {
  const auto path = megatron_idx_path(prefix);
  io::input_file in(path);
  std::byte head[megatron_idx_header_bytes];
  in.read_at(0, head);
  if (std::memcmp(head, megatron_idx_magic, 9) != 0) {
    throw io::format_error(
        "hone: '" + path.string() +
        "' is not a Megatron index: it does not start with \"MMIDIDX\\x00\\x00\"");
  }
  const auto code = static_cast<std::uint8_t>(head[17]);
  if (megatron_dtype_size(code) == 0) {
    throw io::format_error("hone: '" + path.string() + "' has the dtype code " +
                           std::to_string(code) + ", not one of Megatron's (1-8)");
  }
  return code;
}

}  // namespace data
HONE_NAMESPACE_END
