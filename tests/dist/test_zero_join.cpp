// Uneven inputs with hone::zero (zero_options::uneven_inputs, hone::dist::join), ranks as threads
// (thread_comm.hpp): rank r trains steps_of_rank[e][r] steps in epoch e, then joins; a joined rank
// keeps running the other ranks' steps without micro-batches (it owns a shard of the state).
//  - both stages on 2, 3 and 4 ranks (a rank with no batch at all in an epoch too) against one
//    process accumulating, at every step, the batches of the ranks that still have one (dp_scenario
//    .hpp's uneven reference): every active step and the state after each join within 1e-6 (the
//    norm's sum is grouped by shard), the same steps done, loss scale and skipped steps; every
//    rank holds the same bits after each join; the shadowed steps are the epoch's longest minus
//    the rank's own;
//  - an inf on an active rank skips the step on the joined rank too;
//  - weight_by_count: ranks of 8 + 5 r rows, with and without joins, match one process over every
//    sample (and the mean of the ranks' means does not);
//  - zero<2> with ranks of different micro-batch counts (the others add reduce-scatters of zeros)
//    gives zero<1>'s weights;
//  - a step observer sees each of a joined rank's steps as one step;
//  - join without uneven_inputs is a config_error that says what to set.
#define BOOST_TEST_MODULE hone_dist_zero_join
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <hone/dist.hpp>
#include <hone/profile/phase_timer.hpp>
#include <span>
#include <string>
#include <vector>

#include "dp_scenario.hpp"
#include "thread_comm.hpp"
#include "zero_scenario.hpp"

namespace {

hone::zero_options uneven(bool weight_by_count = false) {
  hone::zero_options o = small_windows;
  o.uneven_inputs = true;
  o.weight_by_count = weight_by_count;
  return o;
}

/// What an active step left on this rank, read without a collective (record() gathers sharded
/// master weights, and a joined rank, which records nothing, would not mirror it): its shard of
/// the master weights and the scaler's state.
struct shard_step {
  std::vector<float> shard;
  std::size_t offset = 0;
  bool skipped = false;
  float scale = 0;
};

/// A rank's epochs: its own steps, then the state after each join (gathered by every rank).
struct zero_join_run {
  std::vector<std::vector<shard_step>> epochs;
  std::vector<step_record> after_join;
  std::vector<std::vector<float>> model_after_join;
  std::vector<hone::dist::join_report> reports;
  bool sharded = false;
};

/// Rank comm.rank()'s epochs with hone::zero<Stage>, each ending in join.
template <int Stage, class Comm>
zero_join_run train_zero_uneven(Comm& comm, const scenario& sc,
                                const std::vector<std::vector<int>>& steps_of_rank) {
  mlp<hone::half> m;
  auto t = scenario_trainer(m, hone::zero<Stage>(comm, uneven(sc.weight_by_count)));
  const auto rank = static_cast<std::size_t>(comm.rank());
  zero_join_run out;
  out.sharded = t.master_weights_sharded();
  for (std::size_t e = 0; e < steps_of_rank.size(); ++e) {
    const int start = epoch_start(steps_of_rank, e);
    out.epochs.emplace_back();
    for (int s = 0; s < steps_of_rank[e][rank]; ++s) {
      const hone::step_report r = t.step(scenario_batch(sc, start + s, comm.rank()));
      const auto mine = t.master_weights();
      out.epochs.back().push_back({{mine.begin(), mine.end()},
                                   t.master_weights_offset(),
                                   r.skipped,
                                   t.scaler().state().scale});
    }
    out.reports.push_back(hone::dist::join(t));
    out.after_join.push_back(record(t, hone::step_report{}));  // collective: every rank
    out.model_after_join.push_back(model_weights(m));
  }
  return out;
}

template <int Stage>
std::vector<zero_join_run> zero_threads_uneven(const scenario& sc,
                                               const std::vector<std::vector<int>>& steps) {
  const int ranks = static_cast<int>(steps.front().size());
  thread_group g(ranks);
  std::vector<zero_join_run> out(static_cast<std::size_t>(ranks));
  g.run([&](int r) {
    thread_comm c(g, r);
    out[static_cast<std::size_t>(r)] = train_zero_uneven<Stage>(c, sc, steps);
  });
  return out;
}

void check_against_reference(const std::vector<zero_join_run>& runs, const uneven_reference& ref,
                             const std::vector<std::vector<int>>& steps) {
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const zero_join_run& run = runs[r];
    BOOST_TEST(run.sharded);
    BOOST_TEST_REQUIRE(run.after_join.size() == steps.size());
    for (std::size_t e = 0; e < steps.size(); ++e) {
      BOOST_TEST_CONTEXT("rank " << r << " of " << runs.size() << ", epoch " << e) {
        const auto start = static_cast<std::size_t>(epoch_start(steps, e));
        const int longest = *std::max_element(steps[e].begin(), steps[e].end());
        BOOST_TEST_REQUIRE(run.epochs[e].size() == static_cast<std::size_t>(steps[e][r]));
        for (std::size_t s = 0; s < run.epochs[e].size(); ++s) {
          const step_record& want = ref.steps[start + s];
          const shard_step& got = run.epochs[e][s];
          const std::span<const float> want_shard(want.master.data() + got.offset,
                                                  got.shard.size());
          BOOST_TEST(max_abs_diff(got.shard, want_shard) <= 1e-6, "step " << start + s);
          BOOST_TEST(got.skipped == want.skipped);
          BOOST_TEST(got.scale == want.scale);
        }
        // After the join: the state at the end of the epoch, whichever step this rank stopped at.
        const step_record& want = ref.steps[start + static_cast<std::size_t>(longest) - 1];
        const step_record& got = run.after_join[e];
        BOOST_TEST(max_abs_diff(got.master, want.master) <= 1e-6);
        BOOST_TEST(max_abs_diff(run.model_after_join[e], ref.model_at_end[e]) <= 4e-3);
        BOOST_TEST(got.steps_done == want.steps_done);
        BOOST_TEST(got.scale == want.scale);
        BOOST_TEST(got.growth_tracker == want.growth_tracker);
        BOOST_TEST(got.skipped_steps == want.skipped_steps);
        BOOST_TEST(run.reports[e].shadowed_steps ==
                   static_cast<std::uint64_t>(longest - steps[e][r]));
        BOOST_TEST(run.reports[e].state_from == -1);
        // Every rank holds the same bits.
        BOOST_TEST(same_bits(got.master, runs[0].after_join[e].master));
        BOOST_TEST(same_bits(run.model_after_join[e], runs[0].model_after_join[e]));
      }
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(uneven_zero_ranks_match_one_process_over_the_active_ranks_batches) {
  const scenario sc{};
  const std::vector<std::vector<int>> two{{5, 2}, {1, 3}};
  const std::vector<std::vector<int>> three{{5, 3, 6}, {2, 0, 1}};
  const std::vector<std::vector<int>> four{{6, 3, 5, 3}, {0, 2, 2, 1}};
  for (const auto* steps : {&two, &three, &four}) {
    const auto ref = train_reference_uneven(sc, *steps);
    check_against_reference(zero_threads_uneven<1>(sc, *steps), ref, *steps);
    check_against_reference(zero_threads_uneven<2>(sc, *steps), ref, *steps);
  }
}

BOOST_AUTO_TEST_CASE(uneven_zero_ranks_weighted_by_count_match_one_process_over_every_sample) {
  // Rank r's batches hold 8 + 5 r rows; the step's exchange carries the samples, a joined rank
  // counts 0, so every step is the mean over the samples that exist.
  scenario sc{};
  sc.extra_rows_per_rank = 5;
  sc.weight_by_count = true;
  const std::vector<std::vector<int>> two{{2, 5}, {3, 1}};
  const std::vector<std::vector<int>> three{{5, 3, 6}, {1, 2, 0}};
  for (const auto* steps : {&two, &three}) {
    const auto ref = train_reference_uneven(sc, *steps);
    check_against_reference(zero_threads_uneven<1>(sc, *steps), ref, *steps);
    check_against_reference(zero_threads_uneven<2>(sc, *steps), ref, *steps);
  }
}

BOOST_AUTO_TEST_CASE(weight_by_count_gives_the_mean_over_every_sample) {
  // Every rank trains every step (no join), rank r's micro-batches of 8 + 5 (r + k ranks) rows:
  // with weight_by_count both stages match one process accumulating every micro-batch by count;
  // without it, the mean of the ranks' means differs (the comparison can fail).
  scenario sc{};
  sc.extra_rows_per_rank = 5;
  for (int n : {2, 3}) {
    const auto ref = train_zero_reference(n, sc, 2);
    thread_group g(n);
    std::vector<double> worst(4, 0.0);
    g.run([&](int r) {
      thread_comm c(g, r);
      hone::zero_options o = small_windows;
      o.weight_by_count = true;
      const auto w1 = train_zero<1>(c, sc, 2, o);
      const auto w2 = train_zero<2>(c, sc, 2, o);
      o.weight_by_count = false;
      const auto m1 = train_zero<1>(c, sc, 2, o);
      if (r != 0) return;
      for (std::size_t s = 0; s < ref.size(); ++s) {
        worst[0] = std::max(worst[0], max_abs_diff(w1[s].master, ref[s].master));
        worst[1] = std::max(worst[1], max_abs_diff(w2[s].master, ref[s].master));
        worst[2] = std::max(worst[2], max_abs_diff(m1[s].master, ref[s].master));
      }
    });
    BOOST_TEST(worst[0] <= 1e-6, n << " ranks, zero<1>");
    BOOST_TEST(worst[1] <= 1e-6, n << " ranks, zero<2>");
    BOOST_TEST(worst[2] > 1e-5, n << " ranks, the mean of the ranks' means");
  }
}

BOOST_AUTO_TEST_CASE(an_inf_on_an_active_rank_skips_the_step_on_the_joined_zero_rank_too) {
  scenario sc{};
  sc.poison_step = 3;
  sc.poison_rank = 1;
  const std::vector<std::vector<int>> steps{{2, 6}};
  const auto ref = train_reference_uneven(sc, steps);
  BOOST_TEST(ref.steps[3].skipped);
  check_against_reference(zero_threads_uneven<1>(sc, steps), ref, steps);
  check_against_reference(zero_threads_uneven<2>(sc, steps), ref, steps);
}

BOOST_AUTO_TEST_CASE(zero_2_pads_ranks_with_fewer_micro_batches_with_zeros) {
  // 3 ranks, rank r with r + 1 micro-batches per step: zero<2> reduce-scatters each micro-batch,
  // so ranks 0 and 1 add 2 and 1 reduce-scatters of zeros; zero<1> reduces each rank's
  // accumulated gradients once. The same mean of the ranks' accumulations.
  const scenario sc{};
  thread_group g(3);
  std::vector<std::vector<float>> one(3), two(3);
  std::vector<std::size_t> micro(3);  // (asserted after the threads: Boost.Test's log is not
                                      // thread-safe)
  g.run([&](int r) {
    thread_comm c(g, r);
    const auto run = [&]<int Stage>() {
      mlp<hone::half> m;
      auto t = scenario_trainer(m, hone::zero<Stage>(c, uneven()));
      for (int s = 0; s < 6; ++s) {
        std::vector<mlp_batch> mb;
        for (int k = 0; k <= r; ++k) mb.push_back(scenario_batch(sc, s, 10 * k + r));
        (void)t.step(std::span<const mlp_batch>(mb));
      }
      micro[static_cast<std::size_t>(r)] = t.gradient_reduction().micro_batches();
      return hone::dist::gather_master_weights(t);
    };
    one[static_cast<std::size_t>(r)] = run.template operator()<1>();
    two[static_cast<std::size_t>(r)] = run.template operator()<2>();
  });
  for (std::size_t r = 0; r < 3; ++r) {
    BOOST_TEST(micro[r] == 3u);  // the most micro-batches of any rank
    BOOST_TEST(max_abs_diff(one[r], two[r]) <= 1e-6, "rank " << r);
    BOOST_TEST(same_bits(two[r], two[0]));
  }
  mlp<hone::half> probe;
  auto t = scenario_trainer(probe);
  const auto w0 = t.master_weights();
  BOOST_TEST(max_abs_diff(two[0], std::vector<float>(w0.begin(), w0.end())) > 1e-3);
}

BOOST_AUTO_TEST_CASE(join_without_uneven_inputs_is_refused_with_what_to_set) {
  hone::dist::local_comm c;
  mlp<hone::half> m;
  auto t = scenario_trainer(m, hone::zero<1>(c, small_windows));
  BOOST_CHECK_EXCEPTION(
      (void)hone::dist::join(t), hone::config_error, [](const hone::config_error& e) {
        return std::string(e.what()).find(".uneven_inputs = true") != std::string::npos;
      });
}

BOOST_AUTO_TEST_CASE(a_step_observer_sees_each_joined_step_as_one_step) {
  // Rank 0 trains 1 step and joins, rank 1 trains 3: both ranks' phase timers count 3 steps, each
  // with the step's phases (the exchange before a joined step is not a phase of it).
  const scenario sc{};
  thread_group g(2);
  std::vector<std::uint64_t> counted(2), optimizer_runs(2);
  g.run([&](int r) {
    thread_comm c(g, r);
    mlp<hone::half> m;
    auto t = scenario_trainer(m, hone::zero<2>(c, uneven()), hone::profile::phase_timer{});
    for (int s = 0; s < (r == 0 ? 1 : 3); ++s) (void)t.step(scenario_batch(sc, s, r));
    (void)hone::dist::join(t);
    counted[static_cast<std::size_t>(r)] = t.observer().steps();
    optimizer_runs[static_cast<std::size_t>(r)] =
        t.observer().stats(hone::step_phase::optimizer).count;
  });
  for (std::size_t r = 0; r < 2; ++r) {
    BOOST_TEST(counted[r] == 3u, "rank " << r);
    BOOST_TEST(optimizer_runs[r] == 3u, "rank " << r);
  }
}
