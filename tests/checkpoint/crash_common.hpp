// The crash test's shared pieces: the contents of the checkpoint of step s (a deterministic
// function of s, so a resumed process can tell that what it restored belongs to its step).
#pragma once

#include <cstdint>
#include <filesystem>
#include <hone/checkpoint/tensor_file.hpp>
#include <hone/checkpoint/verify.hpp>
#include <hone/checkpoint/writer.hpp>
#include <string>
#include <vector>

namespace crash_test {

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
