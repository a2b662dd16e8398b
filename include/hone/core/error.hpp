// hone/core/error.hpp: the exception hierarchy. Every error hone throws derives from
// hone::error (itself a std::runtime_error) and its message says what was wrong and what to do.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN

/// Base of every exception hone throws.
class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error(what) {}
};

/// A configuration or argument that cannot work (a zero size, mismatched shapes, a bad option).
class config_error : public error {
 public:
  using error::error;
};

/// Memory could not be obtained (host, pinned or device).
class allocation_error : public error {
 public:
  allocation_error(const std::string& what, std::size_t bytes) : error(what), bytes_(bytes) {}
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  std::size_t bytes_;
};

/// A checkpoint or other file hone reads is damaged or does not match what was expected.
class checkpoint_error : public error {
 public:
  using error::error;
};

/// An I/O operation failed (open, write, fsync, rename); the message carries errno's text.
class io_error : public error {
 public:
  using error::error;
};

/// A CUDA runtime call failed. The message names the call, the CUDA error and the source place.
class cuda_error : public error {
 public:
  cuda_error(const std::string& what, int code) : error(what), code_(code) {}
  /// The cudaError_t value, as an int so this header needs no CUDA headers.
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  int code_;
};

/// The place an error was detected. std::source_location would do, but clang 14 with libstdc++
/// cannot compile it; the builtins below are understood by g++, clang and nvcc alike.
struct source_location {
  const char* file = "";
  unsigned line = 0;
  static constexpr source_location current(const char* file = __builtin_FILE(),
                                           unsigned line = __builtin_LINE()) noexcept {
    return {file, line};
  }
};

namespace detail {
inline std::string where(const source_location& loc) {
  return std::string(loc.file) + ":" + std::to_string(loc.line);
}
}  // namespace detail

/// Throws config_error with `message` when `condition` is false. Used for argument checks that
/// cannot be made at compile time. The message is built before the call, whether the check
/// passes or not; hone's own checks use HONE_REQUIRE, which builds it only on failure.
inline void require(bool condition, std::string_view message) {
  if (!condition) throw config_error(std::string(message));
}

namespace detail {
/// The failure side of HONE_REQUIRE: out of line and cold, so the compiler treats the branch
/// that builds the message as unlikely and optimizes it for size.
[[noreturn, gnu::cold, gnu::noinline]] inline void config_failure(const std::string& message) {
  throw config_error(message);
}
}  // namespace detail

HONE_NAMESPACE_END

/// HONE_REQUIRE(condition, message): throws hone::config_error(message) when `condition` is
/// false, evaluating `message` (anything a std::string can be made from) only then. Argument
/// checks sit on paths that run every step: built eagerly (as hone::require's argument is),
/// their sentences cost string work at every call and generated code in every caller.
#define HONE_REQUIRE(condition, ...)                            \
  do {                                                          \
    if (!(condition)) [[unlikely]]                              \
      ::hone::detail::config_failure(std::string(__VA_ARGS__)); \
  } while (false)
