// tests/dist/zero_scenario.hpp: the runs the ZeRO tests compare, shared by the thread-rank tests
// (test_zero) and the MPI tests (test_mpi_zero): dp_scenario.hpp's training run (fp16 mixed
// precision with dynamic loss scaling, AdamW with weight decay, global-norm clipping, accumulation
// by count) with hone::zero<1> or hone::zero<2> as the gradient reduction role, `micro` micro-
// batches per rank and step, and small windows (16 bytes: 4 floats per collective, so the 81-float
// arena takes several windows per shard).
#pragma once

#include <cstdint>
#include <filesystem>
#include <hone/checkpoint/sharded.hpp>
#include <hone/checkpoint/trainer_checkpoint.hpp>
#include <hone/dist/zero.hpp>
#include <span>
#include <vector>

#include "dp_scenario.hpp"

inline constexpr hone::zero_options small_windows{.bucket_bytes = 16};

/// The batches of rank `rank` at step `s`: `micro` of them, each scenario_batch of its own seed.
inline std::vector<mlp_batch> zero_batches(const scenario& sc, int s, int rank, int ranks,
                                           int micro) {
  std::vector<mlp_batch> mb;
  for (int k = 0; k < micro; ++k) mb.push_back(scenario_batch(sc, s, rank + k * ranks));
  return mb;
}

/// Rank comm.rank()'s run with hone::zero<Stage>.
template <int Stage, class Comm>
std::vector<step_record> train_zero(Comm& comm, const scenario& sc, int micro = 1,
                                    hone::zero_options o = small_windows) {
  mlp<hone::half> m;
  auto t = scenario_trainer(m, hone::zero<Stage>(comm, o));
  std::vector<step_record> out;
  for (int s = 0; s < sc.steps; ++s) {
    const auto mb = zero_batches(sc, s, comm.rank(), comm.size(), micro);
    out.push_back(record(t, t.step(std::span<const mlp_batch>(mb))));
  }
  return out;
}

/// One process accumulating every rank's micro-batches of each step.
inline std::vector<step_record> train_zero_reference(int ranks, const scenario& sc, int micro) {
  mlp<hone::half> m;
  auto t = scenario_trainer(m);
  std::vector<step_record> out;
  for (int s = 0; s < sc.steps; ++s) {
    std::vector<mlp_batch> all;
    for (int r = 0; r < ranks; ++r) {
      for (auto& b : zero_batches(sc, s, r, ranks, micro)) all.push_back(std::move(b));
    }
    out.push_back(record(t, t.step(std::span<const mlp_batch>(all))));
  }
  return out;
}

// ---- checkpoints across world sizes: a global batch of 6 micro-batches per step ----

/// Trains steps [from, to) of the 6-micro-batch global batch on comm.size() ranks (6 / size()
/// micro-batches each) with hone::zero<Stage>, after restoring `dir` when it is not empty, then
/// calls at_end(trainer). Returns the master weights.
template <int Stage, class Comm, class AtEnd>
std::vector<float> zero_segment_then(Comm& c, const std::filesystem::path& dir, int from, int to,
                                     AtEnd&& at_end) {
  const scenario sc{};
  mlp<hone::half> m;
  auto t = scenario_trainer(m, hone::zero<Stage>(c, small_windows));
  if (!dir.empty()) (void)hone::checkpoint::restore(t, dir);
  for (int s = from; s < to; ++s) {
    const auto mb = zero_batches(sc, s, c.rank(), c.size(), 6 / c.size());
    (void)t.step(std::span<const mlp_batch>(mb));
  }
  at_end(t);
  return hone::dist::gather_master_weights(t);
}

/// zero_segment_then; with `save_to`, captures a (consolidated) checkpoint at the end, every rank
/// taking part, into *save_to.
template <int Stage, class Comm>
std::vector<float> zero_segment(Comm& c, const std::filesystem::path& dir, int from, int to,
                                hone::checkpoint::snapshot* save_to = nullptr) {
  return zero_segment_then<Stage>(c, dir, from, to, [&](auto& t) {
    if (save_to != nullptr) hone::checkpoint::capture(t, *save_to);
  });
}

/// One process that never stopped: the 6 micro-batches of every step, steps [0, steps).
inline std::vector<float> six_batch_reference(int steps) {
  const scenario sc{};
  mlp<hone::half> m;
  auto t = scenario_trainer(m);
  for (int s = 0; s < steps; ++s) {
    std::vector<mlp_batch> mb;
    for (int k = 0; k < 6; ++k) mb.push_back(scenario_batch(sc, s, k));
    (void)t.step(std::span<const mlp_batch>(mb));
  }
  const auto w = t.master_weights();
  return {w.begin(), w.end()};
}

/// zero_segment, then a sharded checkpoint of step `to` under `save_root`
/// (hone::checkpoint::save_sharded: every rank writes its own part). With `consolidated`, also
/// captures the consolidated checkpoint of the same state (collective) into *consolidated.
template <int Stage, class Comm>
std::vector<float> zero_segment_sharded(Comm& c, const std::filesystem::path& dir, int from, int to,
                                        const std::filesystem::path& save_root,
                                        hone::checkpoint::snapshot* consolidated = nullptr) {
  return zero_segment_then<Stage>(c, dir, from, to, [&](auto& t) {
    if (consolidated != nullptr) hone::checkpoint::capture(t, *consolidated);
    (void)hone::checkpoint::save_sharded(t, c, save_root, static_cast<std::uint64_t>(to),
                                         {.sync = false});
  });
}
