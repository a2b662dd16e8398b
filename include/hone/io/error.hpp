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

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN
namespace io {

/// A file's content is damaged or not what was expected. A hone::checkpoint_error.
class format_error : public checkpoint_error {
 public:
  using checkpoint_error::checkpoint_error;
};

}  // namespace io
HONE_NAMESPACE_END
