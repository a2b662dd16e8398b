// The power-loss harness (test-only), in the manner of ALICE, CrashMonkey and LazyFS: record the
// file-system operations of a save, then check every crash state a POSIX file system may leave
// after a power loss.
//
// Recording. power_loss_shim.c interposes the libc calls that change a file system; while a
// `recording` is active, those that touch its sandbox directory are executed and logged, with the
// files and directories they touch resolved to stable inode ids of a model of the tree (writes and
// their bytes, truncations, fsync/fdatasync of files and directories, creations, renames and
// RENAME_EXCHANGE, unlinks, and for MAP_SHARED writable mappings the 512-byte sectors that
// changed, found by comparing the mapping with its last recorded contents at each msync, fsync and
// munmap). `mark(label)` logs a point the oracle can use (e.g. "save 3 returned"). At stop() the
// model of the tree must equal the real tree byte for byte (problems() says otherwise), so nothing
// escaped the log.
//
// Crash states. For a crash after the first k logged operations, an operation is durable if a
// later operation of the prefix forced it: an fsync/fdatasync of the file (for its writes and
// size changes), an msync(MS_SYNC) covering a mapped sector, an fsync of the directory (for the
// creations, renames and unlinks of its entries; a rename across directories needs both). The
// others may each be lost or persist, independently of their order: a subset of the un-forced
// directory operations applied in log order (atomic each: a rename or exchange persists whole or
// not at all), and per file a subset of its un-forced writes, or all of them with the last one
// torn in half, or all of them with their sizes but not their bytes (a file that grew reads zeros
// past its durable end, overwritten bytes keep their old contents: size persisted, data not).
// Sets that are too large are bounded: all subsets up to 2^8 directory operations and 2^4 writes
// per file, then the corner cases (none, all, each prefix, each one dropped, each one alone) plus
// seeded random ones, and at most `max_states_per_point` combinations per crash point (corner
// cases first, then seeded random ones). Each distinct resulting tree is rebuilt in a scratch
// directory and handed to the oracle.
//
// Not modelled: the contents of a sector at an intermediate moment between two recorded points
// (a mapped sector is either its last durable or its latest contents); a crash inside one system
// call (a write is torn only at the halves of a logged write); metadata other than names and
// contents (permissions, times); hard links, symlinks, O_APPEND, dup'ed descriptors (the shim
// reports their use instead); file systems that do persist more than POSIX requires (ext4's
// ordered mode never shows some of these states: the harness is stricter than they are).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace power_loss {

/// What the oracle knows about a crash state.
struct crash_point {
  std::size_t ops_done = 0;        ///< operations of the log that ran before the crash
  std::size_t ops_total = 0;       ///< operations logged in all
  std::vector<std::string> marks;  ///< the marks logged before the crash, in order
  std::string choice;              ///< which un-forced operations persisted (for messages)
};

/// Checks one crash state rebuilt at `root` (the sandbox as the file system left it). Returns
/// nothing when the state is acceptable, else a sentence saying what is wrong. It must depend
/// only on the tree and the marks (results are cached by both).
using oracle = std::function<std::optional<std::string>(const std::filesystem::path& root,
                                                        const crash_point& point)>;

struct check_options {
  std::size_t max_states_per_point = 384;
  std::uint64_t seed = 0x5eed;
  std::size_t failures_kept = 6;
};

struct check_report {
  std::size_t ops = 0;                ///< operations logged
  std::size_t crash_points = 0;       ///< ops + 1
  std::size_t states = 0;             ///< crash states enumerated
  std::size_t distinct = 0;           ///< distinct trees checked by the oracle
  std::size_t failed = 0;             ///< crash states the oracle refused
  std::vector<std::string> failures;  ///< the first few, with their crash point and choice
  [[nodiscard]] std::string summary() const;
};

/// Records the file-system operations under `sandbox` from construction to stop() (one recording
/// at a time per process). The tree already there at construction is taken as durable.
class recording {
 public:
  explicit recording(const std::filesystem::path& sandbox);
  ~recording();
  recording(const recording&) = delete;
  recording& operator=(const recording&) = delete;

  void mark(const std::string& label);
  /// Ends the recording (records the last changes of live mappings) and compares the model with
  /// the real tree.
  void stop();
  /// Everything that escaped the model: unmodeled calls on recorded files, a tree that differs.
  [[nodiscard]] std::vector<std::string> problems() const;
  /// The log, one operation per line (for diagnosing a failure).
  [[nodiscard]] std::string log_text() const;
  /// Enumerates the crash states (see the top of this header) and checks each with `check`,
  /// rebuilding them under `scratch` (emptied first).
  [[nodiscard]] check_report check(const std::filesystem::path& scratch, const oracle& check,
                                   const check_options& options = {}) const;
};

}  // namespace power_loss
