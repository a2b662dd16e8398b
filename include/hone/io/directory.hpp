// hone/io/directory.hpp: the directory operations of hone's atomic writers (checkpoints, saved
// replay buffers): creating a directory, removing a tree, and naming the temporary siblings that a
// directory is written into before one rename makes it appear.
//
// A directory `D` is written as a temporary sibling `.tmp-D-PID` (PID: the writing process), then
// renamed to `D`; a writer killed midway leaves the temporary behind. The PID in the name lets the
// next writer tell what a dead process left (remove it) from what a live one is still writing
// (keep it): temp_owner() reads it, temp_owner_alive() asks whether that process still runs.
//
// Errors: hone::io_error naming the path and errno's text (hone/io/file_io.hpp).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/io/file_io.hpp"

HONE_NAMESPACE_BEGIN
namespace io {

/// Temporary directories (being written, or left by a killed writer) start with this prefix.
inline constexpr std::string_view temp_prefix = ".tmp-";

/// The temporary sibling that `final_path` is written into by this process:
/// parent/.tmp-<tag><name>-<pid> (`tag` tells apart several temporaries of one directory, e.g.
/// "old-" for the previous version moved aside).
[[nodiscard]] inline std::filesystem::path temp_sibling(const std::filesystem::path& final_path,
                                                        std::string_view tag = {}) {
  const std::filesystem::path parent =
      final_path.parent_path().empty() ? std::filesystem::path(".") : final_path.parent_path();
  return parent / (std::string(temp_prefix) + std::string(tag) + final_path.filename().string() +
                   "-" + std::to_string(static_cast<long>(::getpid())));
}

/// Whether process `pid` exists (also when it belongs to another user: EPERM).
[[nodiscard]] inline bool process_alive(long pid) noexcept {
  if (pid <= 0) return false;
  if (pid == static_cast<long>(::getpid())) return true;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

/// The pid at the end of a temporary name (".tmp-...-4242" gives 4242), or -1 when the name is
/// not one that temp_sibling() makes: it must start with ".tmp-", have something between that
/// prefix and the last '-', and end with a pid written as temp_sibling() writes it (decimal
/// digits, positive, no leading zero). So ".tmp-step-000000001", a step number and no pid, is no
/// temporary of process 1 (which always runs, and would keep it forever).
[[nodiscard]] inline long temp_owner(std::string_view name) noexcept {
  if (!name.starts_with(temp_prefix)) return -1;
  const auto dash = name.rfind('-');
  if (dash == std::string_view::npos || dash < temp_prefix.size() + 1) return -1;
  const std::string_view digits = name.substr(dash + 1);
  if (digits.empty() || digits.front() == '0') return -1;
  long pid = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
  if (ec != std::errc{} || end != digits.data() + digits.size() || pid <= 0) return -1;
  return pid;
}

/// Whether the temporary called `name` belongs to a live process other than this one, which may
/// still be writing it (a cleaner keeps it). False for this process's own temporaries and for
/// names without a pid.
[[nodiscard]] inline bool temp_owner_alive(std::string_view name) noexcept {
  const long pid = temp_owner(name);
  return pid > 0 && pid != static_cast<long>(::getpid()) && process_alive(pid);
}

/// Removes `p` and everything under it (nothing when it does not exist); io_error when it cannot.
inline void remove_tree(const std::filesystem::path& p) {
  std::error_code ec;
  std::filesystem::remove_all(p, ec);
  if (ec) throw_io_error("remove", p, ec.value());
}

/// Creates `root` (and its parents) when missing, durably: the parent of every directory it
/// creates is fsynced, so a power loss cannot take away a directory that later commits (which
/// fsync only the directory they write into) rely on. io_error when it cannot, or when `root`
/// exists and is not a directory.
inline void ensure_directory(const std::filesystem::path& root) {
  std::error_code ec;
  // The directories that do not exist yet, the deepest first.
  std::vector<std::filesystem::path> missing;
  for (std::filesystem::path p = std::filesystem::absolute(root, ec).lexically_normal();
       !ec && p.has_relative_path() && !std::filesystem::exists(p, ec); p = p.parent_path()) {
    if (p.has_filename()) missing.push_back(p);
  }
  std::filesystem::create_directories(root, ec);
  if (ec) throw_io_error("create the directory", root, ec.value());
  if (!std::filesystem::is_directory(root)) throw_io_error("use the directory", root, ENOTDIR);
  // The top one's entry first, then each created directory's entry in the one above it.
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) sync_directory(it->parent_path());
}

}  // namespace io
HONE_NAMESPACE_END
