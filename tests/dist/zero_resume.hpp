// tests/dist/zero_resume.hpp: resuming a checkpoint of the 6-micro-batch ZeRO scenario
// (zero_scenario.hpp) on thread ranks, shared by test_zero (consolidated checkpoints) and
// test_zero_sharded_checkpoint (sharded ones): steps 4..7 after restoring `dir`, with hone::zero
// on any number of ranks or with a trainer without ZeRO, and the check that every resume matches
// one process that never stopped.
#pragma once

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <hone/checkpoint/trainer_checkpoint.hpp>
#include <span>
#include <vector>

#include "thread_comm.hpp"
#include "zero_scenario.hpp"

/// Every rank's master weights after restoring `dir` into hone::zero<Stage> on `ranks` thread
/// ranks and training steps 4..7.
template <int Stage>
std::vector<std::vector<float>> resume_on(int ranks, const std::filesystem::path& dir) {
  thread_group g(ranks);
  std::vector<std::vector<float>> out(static_cast<std::size_t>(ranks));
  g.run([&](int r) {
    thread_comm c(g, r);
    out[static_cast<std::size_t>(r)] = zero_segment<Stage>(c, dir, 4, 8);
  });
  return out;
}

/// The master weights after restoring `dir` into a trainer without ZeRO (one process, the 6
/// micro-batches of every step) and training steps 4..7; `perturb` runs on it after the restore.
template <class Perturb>
std::vector<float> plain_resume(const std::filesystem::path& dir, Perturb&& perturb) {
  const scenario sc{};
  mlp<hone::half> m;
  auto t = scenario_trainer(m);
  (void)hone::checkpoint::restore(t, dir);
  perturb(t);
  for (int s = 4; s < 8; ++s) {
    std::vector<mlp_batch> mb;
    for (int k = 0; k < 6; ++k) mb.push_back(scenario_batch(sc, s, k));
    (void)t.step(std::span<const mlp_batch>(mb));
  }
  const auto w = t.master_weights();
  return {w.begin(), w.end()};
}
inline std::vector<float> plain_resume(const std::filesystem::path& dir) {
  return plain_resume(dir, [](auto& /*trainer*/) {});
}

/// Resumes `dir` on 1, 2 and 3 ranks with zero<1> and zero<2>: every rank holds the same bits, and
/// the weights are within 1e-6 of `want` (one process that never stopped).
inline void check_resumes_on_one_two_and_three(const std::filesystem::path& dir,
                                               const std::vector<float>& want) {
  for (int ranks : {1, 2, 3}) {
    BOOST_TEST_CONTEXT("resumed on " << ranks << " ranks") {
      const auto w1 = resume_on<1>(ranks, dir);
      const auto w2 = resume_on<2>(ranks, dir);
      for (int r = 0; r < ranks; ++r) {
        BOOST_TEST(same_bits(w1[static_cast<std::size_t>(r)], w1[0]));
        BOOST_TEST(same_bits(w2[static_cast<std::size_t>(r)], w2[0]));
      }
      BOOST_TEST(max_abs_diff(w1[0], want) <= 1e-6, max_abs_diff(w1[0], want));
      BOOST_TEST(max_abs_diff(w2[0], want) <= 1e-6, max_abs_diff(w2[0], want));
    }
  }
}
