// The roles that read or change whole master weights, over hone::zero's sharded master weights
// (zero_options::shard_master_weights), ranks as threads (thread_comm.hpp). Each case runs the
// fp16 scenario of zero_scenario.hpp on 1, 2 and 3 ranks twice, with the master weights sharded
// and kept whole (shard_master_weights = false, the route test_zero checks against one process),
// and requires the same bits:
//  - magnitude_pruning (global and per tensor, gradual schedule, zero<1> and zero<2>): the same
//    masks and master and model weights after every step; pruned master weights are +0;
//    restore_pruning masks each rank's shard;
//  - fake_quant_training (per channel and per tensor): the same model weights, which are
//    fake_quantize of the gathered master weights cast to fp16; the master weights are not
//    quantized; a NaN in one rank's shard makes every rank throw, naming the tensor;
//  - early stopping's kept best weights: each rank keeps its shard's (the keeper holds 4/d bytes
//    per parameter), restore_best_weights gives back the best step's master and model weights; a
//    checkpoint of 2 ranks carries whole best weights that restore on 3 ranks and in one process.
#define BOOST_TEST_MODULE hone_dist_zero_constraints
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <filesystem>
#include <hone/checkpoint/trainer_checkpoint.hpp>
#include <hone/compress/prune.hpp>
#include <hone/compress/prune_checkpoint.hpp>
#include <hone/compress/qat.hpp>
#include <hone/dist.hpp>
#include <hone/train/early_stopping.hpp>
#include <hone/train/trainer.hpp>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"
#include "thread_comm.hpp"
#include "zero_scenario.hpp"

namespace hc = hone::compress;
namespace ck = hone::checkpoint;

namespace {

constexpr int steps = 12;

hone::zero_options windows(bool shard) {
  hone::zero_options o = small_windows;
  o.shard_master_weights = shard;
  return o;
}

/// What a rank holds after each step: the gathered master weights and the model's weights.
struct run_record {
  std::vector<std::vector<float>> master, model;
  std::vector<std::uint8_t> masks;  // pruning: the masks at the end
  std::size_t held = 0;             // master_weights().size()
  bool sharded = false;
};

/// Trains the scenario's steps with hone::zero<Stage> and `constraint` (one micro-batch per rank
/// and step), recording every step.
template <int Stage, class Comm, class Constraint>
run_record train_constrained(Comm& c, bool shard, Constraint constraint) {
  const scenario sc{};
  mlp<hone::half> m;
  auto t = scenario_trainer(m, hone::zero<Stage>(c, windows(shard)), std::move(constraint));
  run_record out;
  out.sharded = t.master_weights_sharded();
  out.held = t.master_weights().size();
  for (int s = 0; s < steps; ++s) {
    const auto mb = zero_batches(sc, s, c.rank(), c.size(), 1);
    (void)t.step(std::span<const mlp_batch>(mb));
    out.master.push_back(hone::dist::gather_master_weights(t));
    out.model.push_back(model_weights(m));
  }
  if constexpr (std::is_same_v<Constraint, hc::magnitude_pruning>) {
    const auto all = t.weight_constraint().masks().all();
    out.masks.assign(all.begin(), all.end());
  }
  return out;
}

/// Runs make(comm, shard) on n thread ranks, sharded and whole, and checks that every rank of
/// both holds the same bits after every step. Returns rank 0's sharded run.
template <class Make>
run_record same_bits_sharded_and_whole(int n, Make&& make) {
  thread_group g(n);
  const auto ranks = static_cast<std::size_t>(n);
  std::vector<run_record> on(ranks), off(ranks);
  g.run([&](int r) {
    thread_comm c(g, r);
    on[static_cast<std::size_t>(r)] = make(c, true);
    off[static_cast<std::size_t>(r)] = make(c, false);
  });
  for (std::size_t r = 0; r < ranks; ++r) {
    BOOST_TEST_CONTEXT("rank " << r << " of " << n) {
      BOOST_TEST(on[r].sharded);
      BOOST_TEST(!off[r].sharded);
      if (n > 1) BOOST_TEST(on[r].held < off[r].held);
      BOOST_TEST(on[r].masks == off[r].masks);
      for (int s = 0; s < steps; ++s) {
        const auto i = static_cast<std::size_t>(s);
        BOOST_TEST(same_bits(on[r].master[i], off[r].master[i]), "step " << s);
        BOOST_TEST(same_bits(on[r].model[i], off[r].model[i]), "step " << s);
        BOOST_TEST(same_bits(on[r].master[i], on[0].master[i]), "step " << s);
        BOOST_TEST(same_bits(on[r].model[i], on[0].model[i]), "step " << s);
      }
    }
  }
  return on[0];
}

/// The arena offset and size of tensor `name` in the scenario's layout.
hone::arena_layout::slot slot_of(const std::string& name) {
  mlp<hone::half> probe;
  auto t = scenario_trainer(probe);
  return t.layout()[t.layout().find(name)];
}

}  // namespace

BOOST_AUTO_TEST_CASE(magnitude_pruning_over_sharded_master_weights_prunes_the_same_weights) {
  for (const hc::prune_scope scope : {hc::prune_scope::global, hc::prune_scope::per_tensor}) {
    const hc::magnitude_pruning pruning(
        {.schedule = {.initial = 0.2, .target = 0.6, .begin_step = 2, .every = 2, .prunings = 3},
         .scope = scope});
    for (int n : {1, 2, 3}) {
      BOOST_TEST_CONTEXT("scope " << static_cast<int>(scope) << ", " << n << " ranks") {
        const run_record one = same_bits_sharded_and_whole(
            n, [&](auto& c, bool shard) { return train_constrained<1>(c, shard, pruning); });
        (void)same_bits_sharded_and_whole(
            n, [&](auto& c, bool shard) { return train_constrained<2>(c, shard, pruning); });
        // The schedule reached its target, and the pruned master weights are +0.
        std::size_t pruned = 0;
        const auto& last = one.master.back();
        for (std::size_t j = 0; j < one.masks.size(); ++j) {
          if (one.masks[j] != 0) continue;
          ++pruned;
          BOOST_TEST(std::signbit(last[j]) == false);
          BOOST_TEST(last[j] == 0.0f);
        }
        BOOST_TEST(pruned >= 28u);  // 60% of the 54 prunable weights (48 + 6 per tensor)
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(restore_pruning_masks_each_ranks_shard) {
  hone_test::temp_dir dir("zero-prune");
  const hc::magnitude_pruning pruning(
      {.schedule = {.initial = 0.5, .target = 0.5, .begin_step = 1, .every = 1, .prunings = 1}});
  std::vector<std::uint8_t> masks;
  std::filesystem::path path;
  {
    hone::dist::local_comm c;
    mlp<hone::half> m;
    auto t = scenario_trainer(m, hone::zero<1>(c, windows(false)), pruning);
    for (int s = 0; s < 6; ++s) (void)t.step(scenario_batch(scenario{}, s, 0));
    BOOST_TEST(t.weight_constraint().level() == 0.5);
    ck::snapshot snap;
    hc::capture_pruning(t, snap);
    path = ck::write_snapshot(dir.path, t.steps_done(), snap,
                              {.compression = std::nullopt, .sync = false});
    const auto all = t.weight_constraint().masks().all();
    masks.assign(all.begin(), all.end());
  }
  // 3 ranks with sharded master weights restore the masks: the gathered master weights and the
  // model's are zero where the masks are.
  thread_group g(3);
  std::vector<std::vector<float>> master(3);
  g.run([&](int r) {
    thread_comm c(g, r);
    mlp<hone::half> m;
    auto t = scenario_trainer(m, hone::zero<1>(c, windows(true)), pruning);
    hc::restore_pruning(t, path);
    master[static_cast<std::size_t>(r)] = hone::dist::gather_master_weights(t);
  });
  std::size_t zeros = 0;
  for (std::size_t j = 0; j < masks.size(); ++j) {
    if (masks[j] != 0) continue;
    ++zeros;
    for (const auto& w : master) BOOST_TEST(w[j] == 0.0f);
  }
  BOOST_TEST(zeros >= 27u);
  BOOST_TEST(same_bits(master[1], master[0]));
  BOOST_TEST(same_bits(master[2], master[0]));
}

BOOST_AUTO_TEST_CASE(fake_quant_training_over_sharded_master_weights_gives_the_same_model) {
  const hone::arena_layout::slot w1 = slot_of("layer1.weight");
  for (const auto gran : {hc::quant_granularity::per_channel, hc::quant_granularity::per_tensor}) {
    const hc::fake_quant_training qat({.granularity = gran});
    for (int n : {1, 2, 3}) {
      BOOST_TEST_CONTEXT("granularity " << static_cast<int>(gran) << ", " << n << " ranks") {
        const run_record one = same_bits_sharded_and_whole(
            n, [&](auto& c, bool shard) { return train_constrained<1>(c, shard, qat); });
        (void)same_bits_sharded_and_whole(
            n, [&](auto& c, bool shard) { return train_constrained<2>(c, shard, qat); });
        // The model's layer1.weight is the fake-quantized master weights cast to fp16 (an
        // oracle independent of the sharded route); the master weights themselves are not.
        const auto& master = one.master.back();
        const std::span<const float> mw(master.data() + w1.offset, w1.count);
        std::vector<float> fq(w1.count);
        hc::fake_quantize(mw, 8, 6, gran, fq);
        bool master_quantized = true;
        for (std::size_t j = 0; j < w1.count; ++j) {
          BOOST_TEST(one.model.back()[j] == static_cast<float>(hone::half(fq[j])), "weight " << j);
          master_quantized = master_quantized && mw[j] == fq[j];
        }
        BOOST_TEST(!master_quantized);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_non_finite_weight_in_one_shard_stops_fake_quantization_on_every_rank) {
  // 2 ranks: rank 1's shard holds layer2.weight (arena elements 64..71 of the 81).
  const hone::arena_layout::slot w2 = slot_of("layer2.weight");
  thread_group g(2);
  std::vector<std::string> errors(2);
  g.run([&](int r) {
    thread_comm c(g, r);
    mlp<hone::half> m;
    auto t = scenario_trainer(m, hone::zero<1>(c, windows(true)), hc::fake_quant_training{});
    // (no Boost.Test assertion on the rank threads: its log is not thread-safe)
    const std::size_t lo = t.master_weights_offset();
    if (r == 1 && lo <= w2.offset + 3) {
      t.master_weights()[w2.offset + 3 - lo] = std::numeric_limits<float>::quiet_NaN();
    }
    try {
      t.weight_constraint().apply(t);
    } catch (const hone::config_error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const auto& e : errors) {
    BOOST_TEST(e.find("'layer2.weight' is NaN or infinite") != std::string::npos, e);
  }
}

BOOST_AUTO_TEST_CASE(publish_weights_of_values_checks_its_input) {
  hone::dist::local_comm c;
  mlp<hone::half> m;
  auto t = scenario_trainer(m, hone::zero<1>(c, windows(true)));
  std::vector<float> wrong(t.master_weights().size() + 1, 0.0f);
  BOOST_CHECK_THROW(t.publish_weights(std::span<const float>(wrong)), hone::config_error);
  // values become the model's weights; the master weights stay
  const auto before = hone::dist::gather_master_weights(t);
  std::vector<float> ones(t.master_weights().size(), 1.0f);
  t.publish_weights(std::span<const float>(ones));
  for (const float v : model_weights(m)) BOOST_TEST(v == 1.0f);
  BOOST_TEST(same_bits(hone::dist::gather_master_weights(t), before));
}

namespace {
/// Early stopping with kept best weights: steps with a metric per step (the same on every rank),
/// the best at step 3; returns the gathered master weights after each step, then (last) after
/// restore_best_weights, and the model's after it. With `save`, captures a checkpoint before the
/// restore.
struct best_run {
  std::vector<std::vector<float>> master;
  std::vector<float> model_after;
  std::size_t keeper_bytes = 0, total = 0;
  std::uint64_t best_step = 0;  // the steps done at the best check
};
const std::vector<double> metrics{5.0, 3.0, 4.0, 2.5, 2.7, 2.9, 3.1, 2.6};

template <class Comm>
best_run train_keeping_best(Comm& c, bool shard, ck::snapshot* save = nullptr) {
  const scenario sc{};
  mlp<hone::half> m;
  auto t = scenario_trainer(
      m, hone::zero<2>(c, windows(shard)),
      hone::early_stopping_policy{.options = {.patience = 10}, .keep_best_weights = true});
  best_run out;
  out.total = t.layout().total();
  out.keeper_bytes = t.early_stopper().keeper().bytes();
  for (std::size_t s = 0; s < metrics.size(); ++s) {
    const auto mb = zero_batches(sc, static_cast<int>(s), c.rank(), c.size(), 1);
    (void)t.step(std::span<const mlp_batch>(mb));
    (void)t.observe_metric(metrics[s]);
    out.master.push_back(hone::dist::gather_master_weights(t));
  }
  out.best_step = t.early_stopping().best_step().value_or(0);
  if (save != nullptr) ck::capture(t, *save);
  t.restore_best_weights();
  out.master.push_back(hone::dist::gather_master_weights(t));
  out.model_after = model_weights(m);
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(early_stopping_keeps_each_ranks_shard_of_the_best_weights) {
  for (int n : {1, 2, 3}) {
    thread_group g(n);
    const auto ranks = static_cast<std::size_t>(n);
    std::vector<best_run> on(ranks), off(ranks);
    g.run([&](int r) {
      thread_comm c(g, r);
      on[static_cast<std::size_t>(r)] = train_keeping_best(c, true);
      off[static_cast<std::size_t>(r)] = train_keeping_best(c, false);
    });
    for (std::size_t r = 0; r < ranks; ++r) {
      BOOST_TEST_CONTEXT("rank " << r << " of " << n) {
        BOOST_TEST(on[r].keeper_bytes * ranks <= (on[r].total + 16 * ranks) * sizeof(float));
        BOOST_TEST(off[r].keeper_bytes == off[r].total * sizeof(float));
        // back to step 3's weights (the best metric), the model's too
        BOOST_TEST(same_bits(on[r].master.back(), on[r].master[3]));
        BOOST_TEST(!same_bits(on[r].master.back(), on[r].master[7]));
        BOOST_TEST(same_bits(on[r].master.back(), off[r].master.back()));
        BOOST_TEST(same_bits(on[r].model_after, off[r].model_after));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(sharded_best_weights_travel_in_checkpoints_across_world_sizes) {
  hone_test::temp_dir root("zero-best");
  // 2 ranks, sharded: a checkpoint captured by both after step 8 (best at step 3).
  std::vector<ck::snapshot> snaps(2);
  std::vector<best_run> saved(2);
  {
    thread_group g(2);
    g.run([&](int r) {
      thread_comm c(g, r);
      const auto i = static_cast<std::size_t>(r);
      saved[i] = train_keeping_best(c, true, &snaps[i]);
    });
  }
  const std::filesystem::path dir =
      ck::write_snapshot(root.path, 8, snaps[0], {.compression = std::nullopt, .sync = false});
  const std::vector<float>& best = saved[0].master[3];
  // The restored best weights (gathered) and best step; no Boost.Test assertion on the rank
  // threads (its log is not thread-safe).
  const auto restored_best = [&](auto& c, bool shard, std::uint64_t& best_step) {
    mlp<hone::half> m;
    auto t = scenario_trainer(
        m, hone::zero<2>(c, windows(shard)),
        hone::early_stopping_policy{.options = {.patience = 10}, .keep_best_weights = true});
    (void)ck::restore(t, dir);
    best_step = t.early_stopping().best_step().value_or(0);
    t.restore_best_weights();
    return hone::dist::gather_master_weights(t);
  };
  // ... restores on 3 sharded ranks and in one process: restore_best_weights gives step 3's.
  thread_group g(3);
  std::vector<std::vector<float>> three(3);
  std::vector<std::uint64_t> steps(3);
  g.run([&](int r) {
    thread_comm c(g, r);
    const auto i = static_cast<std::size_t>(r);
    three[i] = restored_best(c, true, steps[i]);
  });
  for (std::size_t r = 0; r < 3; ++r) {
    BOOST_TEST(same_bits(three[r], best));
    BOOST_TEST(steps[r] == saved[0].best_step);
  }
  hone::dist::local_comm one;
  std::uint64_t step = 0;
  BOOST_TEST(same_bits(restored_best(one, false, step), best));
  BOOST_TEST(step == saved[0].best_step);
  BOOST_TEST(same_bits(restored_best(one, true, step), best));
  BOOST_TEST(step == saved[0].best_step);
}
