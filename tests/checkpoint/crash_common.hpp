// The crash test's shared pieces: the contents of the checkpoint of step s (a deterministic
// function of s, so a resumed process can tell that what it restored belongs to its step), and
// the commit-window record the helper keeps in a shared file so that the driver can tell where
// each kill landed.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <hone/checkpoint/tensor_file.hpp>
#include <hone/checkpoint/verify.hpp>
#include <hone/checkpoint/writer.hpp>
#include <string>
#include <vector>

namespace crash_test {

/// Where the helper is, kept in a file both processes map (MAP_SHARED): the page cache keeps the
/// last stores of a SIGKILLed helper, so the driver reads where the kill landed.
struct commit_window {
  enum : std::uint32_t { elsewhere = 0, writing_files = 1, committing = 2 };
  /// committing: from the MANIFEST's creation (the start of pending_checkpoint::commit) until the
  /// rename or exchange that publishes step-N has returned.
  std::atomic<std::uint32_t> phase;
  std::atomic<std::uint64_t> step;     // the step being written or committed
  std::atomic<std::uint64_t> entered;  // commit windows entered by this helper
  std::atomic<std::uint64_t> left;     // and left
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "the commit window is shared between processes: it needs lock-free atomics");

/// Maps the commit-window file at `path` (created zeroed with `create`); nullptr on failure.
inline commit_window* map_commit_window(const std::filesystem::path& path, bool create) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0), 0644);
  if (fd < 0) return nullptr;
  if (create && ::ftruncate(fd, 4096) != 0) {
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<commit_window*>(p);
}

inline constexpr std::size_t tensor_elements = 16384;  // 64 KiB per tensor

inline std::vector<float> values(std::uint64_t step, std::uint64_t salt) {
  std::vector<float> v(tensor_elements);
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(step % 100000) + 0.25f * static_cast<float>((i + salt) % 97);
  }
  return v;
}

inline void fill(hone::checkpoint::snapshot& s, std::uint64_t step) {
  namespace ck = hone::checkpoint;
  s.add(ck::files::weights, "w", {tensor_elements}, values(step, 0));
  s.add(ck::files::optimizer, "exp_avg.w", {tensor_elements}, values(step, 1));
  s.state.step = step;
  s.state.data.set("position", step * 3);
  s.state.metadata["writer"] = "crash_helper";
}

/// Restores the checkpoint at `dir` and checks that it is the one of its step; returns the step.
/// Throws on any mismatch.
inline std::uint64_t restore_and_check(const std::filesystem::path& dir) {
  namespace ck = hone::checkpoint;
  ck::verify_directory(dir, true).require_ok(dir.string());
  const ck::training_state st = ck::read_state(dir / ck::files::state);
  const auto w = ck::tensor_file::open(dir / ck::files::weights).read_as<float>("w");
  const auto m = ck::tensor_file::open(dir / ck::files::optimizer).read_as<float>("exp_avg.w");
  if (w != values(st.step, 0) || m != values(st.step, 1) ||
      st.data.at("position").as_u64() != st.step * 3) {
    throw hone::checkpoint_error("hone: '" + dir.string() + "' does not hold the state of step " +
                                 std::to_string(st.step));
  }
  return st.step;
}

}  // namespace crash_test
