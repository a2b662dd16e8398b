// tests/dist/dp_scenario.hpp: the training run the data-parallel tests compare, shared by the
// thread-rank tests (test_data_parallel) and the MPI tests (test_mpi_data_parallel).
//
// Rank r of N trains mlp<hone::half> with fp16_mixed dynamic loss scaling (init 2^16, so the first
// steps overflow and back off; growth every 3 good steps), AdamW with weight decay, global-norm
// clipping at 0.5 (active), accumulation by count and hone::data_parallel over its communicator
// with small buckets (the 81-float arena in 6 buckets). At step s it trains on
// scenario_batch(s, r); the reference is one process accumulating the N micro-batches
// scenario_batch(s, 0..N-1) of the same global batch, with local gradients.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <hone/dist/data_parallel.hpp>
#include <hone/dist/zero.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/precision/policies.hpp>
#include <hone/schedule/constant.hpp>
#include <hone/train/accumulate.hpp>
#include <hone/train/trainer.hpp>
#include <limits>
#include <span>
#include <vector>

#include "dp_model.hpp"

/// Small buckets: the MLP's 81-float arena in 6 buckets (first 8 floats, then 16; rounded down to
/// a multiple of the ranks).
inline constexpr hone::data_parallel_options scenario_buckets{.bucket_bytes = 64,
                                                              .first_bucket_bytes = 32};

struct scenario {
  int steps = 10;
  int poison_step = -1;  // at this step ...
  int poison_rank = -1;  // ... this rank's batch produces an inf gradient
  std::size_t rows = 8;  // per rank and step
  // Uneven batches: rank r's batches hold rows + r * extra_rows_per_rank rows.
  std::size_t extra_rows_per_rank = 0;
  // data_parallel_options::weight_by_count (the ranks weighted by their sample counts).
  bool weight_by_count = false;
};

/// What one step left: the master weights, the scaler's state and the report.
struct step_record {
  std::vector<float> master;
  float scale = 0;
  std::int32_t growth_tracker = 0;
  std::uint64_t skipped_steps = 0;
  bool skipped = false;
  double grad_norm = 0;
  std::uint64_t steps_done = 0;
};

inline mlp_batch scenario_batch(const scenario& sc, int step, int rank) {
  mlp_batch b =
      make_mlp_batch(sc.rows + static_cast<std::size_t>(rank) * sc.extra_rows_per_rank,
                     1000u * static_cast<unsigned>(step) + static_cast<unsigned>(rank) + 7u);
  if (step == sc.poison_step && rank == sc.poison_rank)
    b.poison = std::numeric_limits<float>::infinity();
  return b;
}

template <class Model, class... Extra>
auto scenario_trainer(Model& m, Extra... extra) {
  return hone::trainer(m,
                       hone::fp16_mixed<>{.scaler = {.init_scale = 65536.0f, .growth_interval = 3}},
                       hone::adamw{.weight_decay = 0.01f}, hone::clip_grad_norm{.max_norm = 0.5f},
                       hone::constant_lr{.base_lr = 0.01}, hone::accumulate::by_count{}, extra...);
}

template <class Trainer>
step_record record(Trainer& t, const hone::step_report& r) {
  step_record rec;
  rec.master = hone::dist::gather_master_weights(t);  // collective with sharded master weights
  rec.scale = t.scaler().state().scale;
  rec.growth_tracker = t.scaler().state().growth_tracker;
  rec.skipped_steps = t.scaler().state().skipped_steps;
  rec.skipped = r.skipped;
  rec.grad_norm = r.grad_norm;
  rec.steps_done = t.steps_done();
  return rec;
}

/// Rank comm.rank()'s run: one micro-batch per step, gradients reduced by data_parallel.
template <class Comm>
std::vector<step_record> train_replica(Comm& comm, const scenario& sc) {
  mlp<hone::half> m;
  hone::data_parallel_options o = scenario_buckets;
  o.weight_by_count = sc.weight_by_count;
  auto t = scenario_trainer(m, hone::data_parallel(comm, o));
  std::vector<step_record> out;
  for (int s = 0; s < sc.steps; ++s) {
    const mlp_batch b = scenario_batch(sc, s, comm.rank());
    out.push_back(record(t, t.step(b)));
  }
  return out;
}

/// One process accumulating the `ranks` micro-batches of every step.
inline std::vector<step_record> train_reference(int ranks, const scenario& sc) {
  mlp<hone::half> m;
  auto t = scenario_trainer(m);
  std::vector<step_record> out;
  for (int s = 0; s < sc.steps; ++s) {
    std::vector<mlp_batch> mb;
    for (int r = 0; r < ranks; ++r) mb.push_back(scenario_batch(sc, s, r));
    out.push_back(record(t, t.step(std::span<const mlp_batch>(mb))));
  }
  return out;
}

inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

/// Whether two doubles are the same bits (a NaN norm included).
inline bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

/// The largest |a - b| over two equally long runs' master weights at one step.
inline double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    m = std::max(m, d < 0 ? -d : d);
  }
  return a.size() == b.size() ? m : std::numeric_limits<double>::infinity();
}

// ---- uneven inputs: ranks with different numbers of batches (hone::dist::join) ----

/// The model's working weights, as floats (to check that join published the taken state).
inline std::vector<float> model_weights(mlp<hone::half>& m) {
  std::vector<float> out;
  for (const auto* v : {&m.w1, &m.b1, &m.w2, &m.b2})
    for (hone::half x : *v) out.push_back(static_cast<float>(x));
  return out;
}

/// One rank's run over several epochs: in epoch e it trains on its steps_of_rank[e][rank] batches
/// (scenario_batch of the epoch's global step and its rank), then calls hone::dist::join.
struct join_run {
  std::vector<std::vector<step_record>> epochs;  // this rank's own steps, per epoch
  std::vector<step_record> after_join;           // the state after each epoch's join
  std::vector<std::vector<float>> model_after_join;
  std::vector<hone::dist::join_report> reports;
};

/// The global step at which epoch e begins: the epochs before it last as long as their longest
/// rank.
inline int epoch_start(const std::vector<std::vector<int>>& steps_of_rank, std::size_t e) {
  int start = 0;
  for (std::size_t k = 0; k < e; ++k)
    start += *std::max_element(steps_of_rank[k].begin(), steps_of_rank[k].end());
  return start;
}

template <class Comm>
join_run train_replica_uneven(Comm& comm, const scenario& sc,
                              const std::vector<std::vector<int>>& steps_of_rank) {
  mlp<hone::half> m;
  hone::data_parallel_options o = scenario_buckets;
  o.weight_by_count = sc.weight_by_count;
  o.uneven_inputs = true;
  auto t = scenario_trainer(m, hone::data_parallel(comm, o));
  const auto rank = static_cast<std::size_t>(comm.rank());
  join_run out;
  for (std::size_t e = 0; e < steps_of_rank.size(); ++e) {
    const int start = epoch_start(steps_of_rank, e);
    out.epochs.emplace_back();
    for (int s = 0; s < steps_of_rank[e][rank]; ++s) {
      const mlp_batch b = scenario_batch(sc, start + s, comm.rank());
      out.epochs.back().push_back(record(t, t.step(b)));
    }
    out.reports.push_back(hone::dist::join(t));
    out.after_join.push_back(record(t, hone::step_report{}));
    out.model_after_join.push_back(model_weights(m));
  }
  return out;
}

/// One process accumulating, at every global step, the batches of the ranks that still have one.
struct uneven_reference {
  std::vector<step_record> steps;                // per global step
  std::vector<std::vector<float>> model_at_end;  // the model's weights at the end of each epoch
};

inline uneven_reference train_reference_uneven(const scenario& sc,
                                               const std::vector<std::vector<int>>& steps_of_rank) {
  mlp<hone::half> m;
  auto t = scenario_trainer(m);
  uneven_reference out;
  for (std::size_t e = 0; e < steps_of_rank.size(); ++e) {
    const int start = epoch_start(steps_of_rank, e);
    const int longest = *std::max_element(steps_of_rank[e].begin(), steps_of_rank[e].end());
    for (int s = 0; s < longest; ++s) {
      std::vector<mlp_batch> mb;
      for (std::size_t r = 0; r < steps_of_rank[e].size(); ++r)
        if (s < steps_of_rank[e][r])
          mb.push_back(scenario_batch(sc, start + s, static_cast<int>(r)));
      out.steps.push_back(record(t, t.step(std::span<const mlp_batch>(mb))));
    }
    out.model_at_end.push_back(model_weights(m));
  }
  return out;
}
