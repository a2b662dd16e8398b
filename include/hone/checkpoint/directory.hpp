// hone/checkpoint/directory.hpp: checkpoint directories that appear atomically, and the listing
// of a run's checkpoints.
//
// A run keeps its checkpoints under one root:
//   ROOT/step-000000100/       committed (has a valid MANIFEST, appeared by one rename)
//   ROOT/step-000000200/
//   ROOT/.tmp-step-000000300-4242/   being written by process 4242 (or left by a crash)
//
// pending_checkpoint writes into the temporary sibling; commit() writes the MANIFEST (fsynced),
// fsyncs the temporary directory, renames it into place and fsyncs the parent, so a reader sees
// either no checkpoint or a complete one, even after SIGKILL or power loss. clean_leftovers()
// removes what killed writers left; newest_valid() picks the newest checkpoint whose MANIFEST and
// files verify, falling back to older ones when the latest is damaged.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "hone/checkpoint/manifest.hpp"
#include "hone/checkpoint/verify.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/directory.hpp"
#include "hone/io/file_io.hpp"

HONE_NAMESPACE_BEGIN
namespace checkpoint {

/// Committed checkpoint directories are named step_prefix + the step, zero-padded to 9 digits.
inline constexpr std::string_view step_prefix = "step-";
/// Temporary directories (being written, or left by a crash) start with this prefix (io's).
using io::temp_prefix;
/// Creates a directory and its parents when missing (io's, re-exported).
using io::ensure_directory;

/// "step-000000123" for step 123 (more digits above 999,999,999).
[[nodiscard]] inline std::string step_dir_name(std::uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%09llu", static_cast<unsigned long long>(step));
  return std::string(step_prefix) + buf;
}

/// The step of a committed checkpoint's directory name, or nothing for any other name.
[[nodiscard]] inline std::optional<std::uint64_t> parse_step_dir_name(std::string_view name) {
  if (!name.starts_with(step_prefix)) return std::nullopt;
  name.remove_prefix(step_prefix.size());
  if (name.empty() || name.size() > 20) return std::nullopt;
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), v);
  if (ec != std::errc{} || end != name.data() + name.size()) return std::nullopt;
  return v;
}

/// A committed checkpoint of a run.
struct checkpoint_entry {
  std::uint64_t step = 0;
  std::filesystem::path path;
};

/// Test-only failure injection: when set, called with each file's path just before the writers
/// of this header and writer.hpp create it; it may throw (e.g. io_error for ENOSPC) to simulate a
/// full disk or a permission error, which root (who ignores permissions) cannot provoke otherwise.
/// Not thread-safe to change while a save is in flight.
inline std::function<void(const std::filesystem::path&)>& write_fault_hook() {
  static std::function<void(const std::filesystem::path&)> hook;
  return hook;
}

namespace detail {
inline void fault_point(const std::filesystem::path& p) {
  if (auto& h = write_fault_hook()) h(p);
}
}  // namespace detail

/// The committed checkpoints under `root` (directories named step-N), oldest first. Does not
/// verify them. An empty list when `root` does not exist.
[[nodiscard]] inline std::vector<checkpoint_entry> list_checkpoints(
    const std::filesystem::path& root) {
  std::vector<checkpoint_entry> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (const auto step = parse_step_dir_name(name); step && e.is_directory()) {
      out.push_back({*step, e.path()});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const checkpoint_entry& a, const checkpoint_entry& b) { return a.step < b.step; });
  return out;
}

/// Removes the temporary directories under `root` that writers left behind when they were killed
/// (.tmp-*-PID whose process is gone; those of live processes other than this one are kept, they
/// may be writing). Call it once at start, before this process starts writing. Returns the paths
/// removed.
inline std::vector<std::filesystem::path> clean_leftovers(const std::filesystem::path& root) {
  std::vector<std::filesystem::path> removed;
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) return removed;
  std::vector<std::filesystem::path> victims;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(io::temp_prefix) || io::temp_owner_alive(name)) continue;
    victims.push_back(e.path());
  }
  for (const auto& v : victims) {
    io::remove_tree(v);
    removed.push_back(v);
  }
  if (!removed.empty()) io::sync_directory(root);
  return removed;
}

/// The newest checkpoint under `root` whose MANIFEST and files verify (`deep`: every file is also
/// parsed; otherwise sizes and hashes only). Damaged ones are skipped, newest first; a sentence per
/// skipped checkpoint goes to `skipped` when given. Nothing when no checkpoint verifies.
[[nodiscard]] inline std::optional<checkpoint_entry> newest_valid(
    const std::filesystem::path& root, bool deep = true,
    std::vector<std::string>* skipped = nullptr) {
  const auto all = list_checkpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const verify_report r = verify_directory(it->path, deep);
    if (r.ok()) return *it;
    if (skipped != nullptr) {
      skipped->push_back("skipped damaged checkpoint '" + it->path.string() +
                         "': " + r.problems.front());
    }
  }
  return std::nullopt;
}

/// A checkpoint directory being written: files go into a temporary sibling of `final_path`;
/// commit() makes it appear at `final_path` in one rename. Destroying it without commit()
/// removes the temporary directory.
class pending_checkpoint {
 public:
  /// Starts ROOT/step-N (the temporary is ROOT/.tmp-step-N-PID).
  static pending_checkpoint for_step(const std::filesystem::path& root, std::uint64_t step) {
    return pending_checkpoint(root / step_dir_name(step));
  }

  /// Starts a checkpoint that will appear at `final_path` (its parent must exist).
  explicit pending_checkpoint(std::filesystem::path final_path) : final_(std::move(final_path)) {
    HONE_REQUIRE(!final_.filename().empty(),
                 "hone::checkpoint::pending_checkpoint: the path must name a directory");
    temp_ = io::temp_sibling(final_);
    if (std::filesystem::exists(temp_)) io::remove_tree(temp_);
    std::error_code ec;
    std::filesystem::create_directory(temp_, ec);
    if (ec) io::throw_io_error("create the directory", temp_, ec.value());
  }
  pending_checkpoint(const pending_checkpoint&) = delete;
  pending_checkpoint& operator=(const pending_checkpoint&) = delete;
  pending_checkpoint(pending_checkpoint&& o) noexcept
      : final_(std::move(o.final_)),
        temp_(std::move(o.temp_)),
        manifest_(std::move(o.manifest_)),
        done_(std::exchange(o.done_, true)) {}
  pending_checkpoint& operator=(pending_checkpoint&&) = delete;
  ~pending_checkpoint() {
    if (!done_) abort();
  }

  /// Where files go until commit().
  [[nodiscard]] const std::filesystem::path& temp_path() const noexcept { return temp_; }
  /// Where the checkpoint appears.
  [[nodiscard]] const std::filesystem::path& final_path() const noexcept { return final_; }
  /// The path of file `name` inside the temporary directory (calls the test fault hook).
  [[nodiscard]] std::filesystem::path file(std::string_view name) const {
    std::filesystem::path p = temp_ / name;
    detail::fault_point(p);
    return p;
  }
  /// Records a file written (fsynced) into temp_path() for the MANIFEST.
  void add(std::string name, const io::file_digest& d) { manifest_.add(std::move(name), d); }
  [[nodiscard]] const manifest& files() const noexcept { return manifest_; }

  /// Writes the MANIFEST, fsyncs, renames into place, fsyncs the parent. An existing checkpoint
  /// at final_path() (the same step saved again) is replaced in one atomic exchange
  /// (io::exchange_paths), so a kill at any moment leaves the old or the new checkpoint at
  /// final_path(); only a file system without RENAME_EXCHANGE falls back to moving the old one
  /// aside first (a kill between the two renames then leaves it at its "old-" temporary name).
  /// Returns final_path().
  const std::filesystem::path& commit() {
    HONE_REQUIRE(!done_,
                 "hone::checkpoint::pending_checkpoint::commit: already committed or aborted");
    const std::filesystem::path parent = temp_.parent_path();
    manifest_.write(file(files::manifest));
    io::sync_directory(temp_);
    if (std::filesystem::exists(final_) && io::exchange_paths(temp_, final_)) {
      done_ = true;
      io::sync_directory(parent);
      io::remove_tree(temp_);  // the previous checkpoint, now at the temporary name
      return final_;
    }
    std::filesystem::path old;
    if (std::filesystem::exists(final_)) {
      old = io::temp_sibling(final_, "old-");
      if (std::filesystem::exists(old)) io::remove_tree(old);
      io::rename_path(final_, old);
    }
    io::rename_path(temp_, final_);
    done_ = true;
    io::sync_directory(parent);
    if (!old.empty()) io::remove_tree(old);
    return final_;
  }

  /// Removes the temporary directory (best effort, never throws).
  void abort() noexcept {
    done_ = true;
    std::error_code ec;
    std::filesystem::remove_all(temp_, ec);
  }

 private:
  std::filesystem::path final_;
  std::filesystem::path temp_;
  manifest manifest_;
  bool done_ = false;
};

}  // namespace checkpoint
HONE_NAMESPACE_END
