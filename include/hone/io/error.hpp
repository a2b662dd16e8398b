// hone/io/error.hpp: the errors of hone's file-format layer.
//
//  - hone::io_error (hone/core/error.hpp): a system call failed (open, write, fsync, rename, mmap);
//    the message names the operation, the path and errno's text. hone::io::throw_io_error
//    (hone/io/file_io.hpp) builds it.
//  - hone::io::format_error: a file's content is damaged or is not what the reader expects (a
//    truncated file, malformed JSON, a JSON value of the wrong kind, a file far larger than its
//    kind may be). It derives from hone::checkpoint_error, which every reader of hone's files has
//    always thrown, so code that catches checkpoint_error (or hone::error) catches it too.
//  - hone::config_error: a value that cannot be written (a non-finite JSON number, a string that
//    is not UTF-8) or conversion arguments that do not fit.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN
namespace io {

/// A file's content is damaged or not what was expected. A hone::checkpoint_error.
class format_error : public checkpoint_error {
 public:
  using checkpoint_error::checkpoint_error;
};

/// Bytes from a damaged file, made safe to put in a message: printable ASCII as it is, a
/// backslash and a double quote escaped, every other byte as \xNN (so control characters and
/// invalid UTF-8 never reach the user's terminal raw); at most `max_bytes` of input, then "...".
[[nodiscard]] inline std::string escaped(std::string_view bytes, std::size_t max_bytes = 64) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  const std::size_t n = bytes.size() < max_bytes ? bytes.size() : max_bytes;
  out.reserve(n + 8);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c == '\\' || c == '"') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (bytes.size() > n) out += "...";
  return out;
}

}  // namespace io
HONE_NAMESPACE_END
