// hone/checkpoint/manifest.hpp: the MANIFEST of a checkpoint directory: the size and XXH3-128 of
// every file in it, so that a load (or `hone-ckpt verify`) can prove the files are the ones that
// were written, end to end (torchtitan RFC #4011 asks for exactly this).
//
// Format (text, UTF-8/ASCII, every line ends with "\n", no "\r"):
//
//   hone-manifest 1 xxh3-128
//   <32 hex digits> <size in bytes> <name>
//   ...
//   end <32 hex digits>
//
// - the first line names the format, its version and the hash;
// - one line per file: the XXH3-128 digest in canonical form (lowercase, as `xxh128sum` prints
//   it), one space, the decimal size (no sign, no leading zeros), one space, the file name;
// - names are 1-255 characters of [A-Za-z0-9._-], do not start with '.', are not "MANIFEST",
//   and the lines are sorted by name in byte order (so each name appears once);
// - the last line is "end " and the XXH3-128 of every byte before it: a truncated or edited
//   MANIFEST is detected, not read as a shorter list.
// Anything else is a checkpoint_error naming the line.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "hone/checkpoint/file_io.hpp"
#include "hone/checkpoint/hash.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/error.hpp"
#include "hone/io/file_io.hpp"
#include "hone/io/hash.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// The first line of a MANIFEST (without its newline).
inline constexpr std::string_view manifest_header = "hone-manifest 1 xxh3-128";
/// The largest MANIFEST a reader accepts.
inline constexpr std::uint64_t max_manifest_bytes = std::uint64_t{16} << 20;

/// Whether `name` may appear in a MANIFEST (and so in a checkpoint directory).
[[nodiscard]] constexpr bool is_valid_manifest_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > 255 || name.front() == '.' || name == "MANIFEST") return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

/// One file of a checkpoint.
struct manifest_entry {
  std::string name;
  std::uint64_t size = 0;
  io::digest128 hash{};
  friend bool operator==(const manifest_entry&, const manifest_entry&) = default;
};

/// The list of a checkpoint's files, sorted by name.
class manifest {
 public:
  /// Adds (or replaces) the entry for `name`. config_error if the name is not valid.
  manifest& add(std::string name, const io::file_digest& d) {
    HONE_REQUIRE(
        is_valid_manifest_name(name),
        "hone::checkpoint::manifest: '" + name +
            "' is not a valid checkpoint file name (1-255 characters of A-Z a-z 0-9 . _ -, "
            "not starting with '.', not MANIFEST)");
    const auto it =
        std::lower_bound(entries_.begin(), entries_.end(), name,
                         [](const manifest_entry& e, const std::string& n) { return e.name < n; });
    if (it != entries_.end() && it->name == name) {
      it->size = d.size;
      it->hash = d.hash;
    } else {
      entries_.insert(it, manifest_entry{std::move(name), d.size, d.hash});
    }
    return *this;
  }

  [[nodiscard]] std::span<const manifest_entry> entries() const noexcept { return entries_; }
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  [[nodiscard]] const manifest_entry* find(std::string_view name) const noexcept {
    const auto it = std::lower_bound(
        entries_.begin(), entries_.end(), name,
        [](const manifest_entry& e, std::string_view n) { return std::string_view(e.name) < n; });
    return (it != entries_.end() && it->name == name) ? &*it : nullptr;
  }

  /// The MANIFEST text.
  [[nodiscard]] std::string to_string() const {
    std::string out(manifest_header);
    out += '\n';
    for (const auto& e : entries_) {
      out += e.hash.hex();
      out += ' ';
      out += std::to_string(e.size);
      out += ' ';
      out += e.name;
      out += '\n';
    }
    const io::digest128 h = io::hash128(std::as_bytes(std::span(out.data(), out.size())));
    out += "end ";
    out += h.hex();
    out += '\n';
    return out;
  }

  /// Writes the MANIFEST file (fsynced when `sync`).
  io::file_digest write(const std::filesystem::path& path, bool sync = true) const {
    return io::write_file(path, to_string(), sync);
  }

  /// Parses MANIFEST text; `context` (the path) starts every error message.
  [[nodiscard]] static manifest parse(std::string_view text, std::string_view context) {
    manifest m;
    std::size_t pos = 0;
    std::size_t line_no = 0;
    const auto fail = [&](const std::string& what) { fail_at(context, line_no, what); };
    const auto next_line = [&]() -> std::string_view {
      ++line_no;
      const std::size_t nl = text.find('\n', pos);
      if (nl == std::string_view::npos) {
        fail(pos == text.size() ? "the MANIFEST ends before its \"end\" line (truncated?)"
                                : "the last line has no newline (truncated?)");
      }
      const std::string_view line = text.substr(pos, nl - pos);
      if (!line.empty() && line.back() == '\r') {
        fail("the line ends with \"\\r\\n\"; MANIFEST lines end with \"\\n\" alone");
      }
      pos = nl + 1;
      return line;
    };
    const std::string_view first = next_line();
    if (first != manifest_header) {
      if (first.substr(0, 14) == "hone-manifest ") {
        fail("unsupported MANIFEST version or hash: \"" + io::escaped(first, 64) +
             "\" (this hone reads \"" + std::string(manifest_header) + "\")");
      }
      fail("not a hone MANIFEST (the first line must be \"" + std::string(manifest_header) + "\")");
    }
    for (;;) {
      const std::size_t line_start = pos;
      const std::string_view line = next_line();
      if (line.substr(0, 4) == "end ") {
        const auto expected = io::digest128::from_hex(line.substr(4));
        if (!expected) fail("the \"end\" line must hold 32 lowercase hexadecimal digits");
        const io::digest128 actual = io::hash128(std::as_bytes(std::span(text.data(), line_start)));
        if (!(actual == *expected)) {
          fail("the MANIFEST's own checksum does not match (it was damaged or edited)");
        }
        if (pos != text.size()) fail("bytes follow the \"end\" line");
        return m;
      }
      // <hash> <size> <name>
      if (line.size() < 32 + 1 + 1 + 1 + 1 || line[32] != ' ') {
        fail("expected \"<32 hex digits> <size> <name>\"");
      }
      const auto h = io::digest128::from_hex(line.substr(0, 32));
      if (!h) fail("the hash must be 32 lowercase hexadecimal digits");
      const std::string_view rest = line.substr(33);
      const std::size_t sp = rest.find(' ');
      if (sp == std::string_view::npos || sp == 0)
        fail("expected \"<size> <name>\" after the hash");
      const std::string_view size_text = rest.substr(0, sp);
      std::uint64_t size = 0;
      const auto [p, ec] =
          std::from_chars(size_text.data(), size_text.data() + size_text.size(), size);
      if (ec != std::errc() || p != size_text.data() + size_text.size() ||
          (size_text.size() > 1 && size_text[0] == '0')) {
        fail("the size \"" + io::escaped(size_text, 32) +
             "\" is not a decimal number below 2^64 without leading zeros");
      }
      const std::string_view name = rest.substr(sp + 1);
      if (!is_valid_manifest_name(name)) {
        fail("\"" + io::escaped(name, 64) + "\" is not a valid checkpoint file name");
      }
      if (!m.entries_.empty() && !(m.entries_.back().name < name)) {
        fail("names must be sorted and unique; \"" + std::string(name) + "\" follows \"" +
             m.entries_.back().name + "\"");
      }
      m.entries_.push_back(manifest_entry{std::string(name), size, *h});
    }
  }

  /// Reads and parses the MANIFEST file at `path`.
  [[nodiscard]] static manifest read(const std::filesystem::path& path) {
    return parse(io::read_small_file(path, max_manifest_bytes), path.string());
  }

  friend bool operator==(const manifest&, const manifest&) = default;

 private:
  [[noreturn]] static void fail_at(std::string_view context, std::size_t line,
                                   const std::string& what) {
    throw checkpoint_error("hone: '" + std::string(context) + "': line " + std::to_string(line) +
                           ": " + what);
  }

  std::vector<manifest_entry> entries_;
};

/// Checks every file `m` lists in directory `dir`: it exists, has its size (checked before any
/// byte is hashed) and its XXH3-128. Returns one sentence per problem (empty: all good).
/// `bytes_hashed`, when given, receives the number of bytes read.
[[nodiscard]] inline std::vector<std::string> check_manifest_files(
    const manifest& m, const std::filesystem::path& dir, std::uint64_t* bytes_hashed = nullptr) {
  std::vector<std::string> problems;
  std::uint64_t hashed = 0;
  for (const auto& e : m.entries()) {
    const std::filesystem::path p = dir / e.name;
    std::error_code ec;
    const auto status = std::filesystem::status(p, ec);
    if (ec || !std::filesystem::exists(status)) {
      problems.push_back("'" + p.string() + "' is listed in the MANIFEST but missing");
      continue;
    }
    if (!std::filesystem::is_regular_file(status)) {
      problems.push_back("'" + p.string() + "' is not a regular file");
      continue;
    }
    const std::uint64_t size = std::filesystem::file_size(p, ec);
    if (ec) {
      problems.push_back("'" + p.string() + "': cannot read its size: " + ec.message());
      continue;
    }
    if (size != e.size) {
      problems.push_back("'" + p.string() + "' is " + std::to_string(size) +
                         " bytes, the MANIFEST says " + std::to_string(e.size) +
                         (size < e.size ? " (truncated)" : ""));
      continue;
    }
    try {
      const io::file_digest d = io::hash_file(p);
      hashed += d.size;
      if (d.size != e.size) {
        problems.push_back("'" + p.string() + "' changed size while it was read");
      } else if (!(d.hash == e.hash)) {
        problems.push_back("'" + p.string() + "' has XXH3-128 " + d.hash.hex() +
                           ", the MANIFEST says " + e.hash.hex() + " (the file is damaged)");
      }
    } catch (const error& ex) {
      problems.push_back(ex.what());
    }
  }
  if (bytes_hashed != nullptr) *bytes_hashed = hashed;
  return problems;
}

}  // namespace checkpoint
HONE_NAMESPACE_END
