// hone::data_parallel with uneven inputs (data_parallel_options::uneven_inputs and
// hone::dist::join) in one process: ranks as threads (thread_comm.hpp, sums in rank order) with
// different numbers of batches. Checked against independent references:
//  - the reduction itself: with a rank joined, every rank's gradients become the mean over the
//    ranks that had a batch (a double oracle written here), and the sum with weight_by_count;
//  - whole training runs (fp16 dynamic loss scaling, AdamW, clipping, two epochs, each ending in
//    join) against one process accumulating, step by step, the batches of the ranks that still
//    had one (dp_scenario.hpp): bit-identical where the active ranks number 1, 2 or 4, within
//    1e-6 with 3; every rank holds the same bits after each join, the model included;
//  - the errors: join without uneven_inputs, and a failed exchange of the still-active flags
//    names the step and stays pending until finish_pending().
#define BOOST_TEST_MODULE hone_dist_data_parallel_join
#include <boost/test/unit_test.hpp>

#include <hone/dist.hpp>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "dp_model.hpp"
#include "dp_scenario.hpp"
#include "flaky_comm.hpp"
#include "thread_comm.hpp"

namespace hd = hone::dist;

namespace {

using dist_test::flaky_comm;

/// Rank r's gradients in the reduction tests: small integers, so that every sum is exact.
std::vector<float> rank_gradients(int r, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i)
    g[i] = static_cast<float>((static_cast<int>(i) * 7 + r * 13) % 23 - 11);
  return g;
}

/// Runs train_replica_uneven on one thread per rank.
std::vector<join_run> train_threads_uneven(const scenario& sc,
                                           const std::vector<std::vector<int>>& steps) {
  const int ranks = static_cast<int>(steps.front().size());
  thread_group g(ranks);
  std::vector<join_run> out(static_cast<std::size_t>(ranks));
  g.run([&](int r) {
    thread_comm c(g, r);
    out[static_cast<std::size_t>(r)] = train_replica_uneven(c, sc, steps);
  });
  return out;
}

/// Every rank's own steps and its state after every join against the reference, within `tol`
/// (0: the same bits); every rank holds rank 0's bits after each join.
void check_against_reference(const std::vector<join_run>& runs, const uneven_reference& ref,
                             const std::vector<std::vector<int>>& steps, double tol) {
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const join_run& run = runs[r];
    BOOST_TEST_REQUIRE(run.after_join.size() == steps.size());
    for (std::size_t e = 0; e < steps.size(); ++e) {
      const auto start = static_cast<std::size_t>(epoch_start(steps, e));
      const int longest = *std::max_element(steps[e].begin(), steps[e].end());
      BOOST_TEST_REQUIRE(run.epochs[e].size() == static_cast<std::size_t>(steps[e][r]));
      for (std::size_t s = 0; s < run.epochs[e].size(); ++s) {
        const step_record& want = ref.steps[start + s];
        const step_record& got = run.epochs[e][s];
        if (tol == 0) {
          BOOST_TEST(same_bits(got.master, want.master), "rank " << r << " step " << start + s);
        } else {
          BOOST_TEST(max_abs_diff(got.master, want.master) <= tol,
                     "rank " << r << " step " << start + s);
        }
        BOOST_TEST(got.skipped == want.skipped);
        BOOST_TEST(got.scale == want.scale);
      }
      // After the join: the state of the end of the epoch, whichever step this rank stopped at.
      const step_record& want = ref.steps[start + static_cast<std::size_t>(longest) - 1];
      const step_record& got = run.after_join[e];
      if (tol == 0) {
        BOOST_TEST(same_bits(got.master, want.master), "rank " << r << " after join " << e);
        BOOST_TEST(same_bits(run.model_after_join[e], ref.model_at_end[e]));
      } else {
        BOOST_TEST(max_abs_diff(got.master, want.master) <= tol, "rank " << r << " join " << e);
        BOOST_TEST(max_abs_diff(run.model_after_join[e], ref.model_at_end[e]) <= 4e-3);
      }
      BOOST_TEST(got.steps_done == want.steps_done, "rank " << r << " after join " << e);
      BOOST_TEST(got.scale == want.scale);
      BOOST_TEST(got.growth_tracker == want.growth_tracker);
      BOOST_TEST(got.skipped_steps == want.skipped_steps);
      BOOST_TEST(run.reports[e].shadowed_steps ==
                 static_cast<std::uint64_t>(longest - steps[e][r]));
      // Every rank took the same state.
      BOOST_TEST(same_bits(got.master, runs[0].after_join[e].master), "rank " << r);
      BOOST_TEST(same_bits(run.model_after_join[e], runs[0].model_after_join[e]));
      BOOST_TEST(run.reports[e].state_from == runs[0].reports[e].state_from);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_joined_rank_contributes_nothing_and_the_mean_is_over_the_active_ranks) {
  // 3 thread ranks, 70 floats (the padded tail included); rank 1 has joined. average: every rank
  // receives (g0 + g2) / 2; weight_by_count: the sum g0 + g2 (the trainer scaled the weights).
  for (const bool by_count : {false, true}) {
    thread_group grp(3);
    const std::size_t n = 70;
    std::vector<std::vector<float>> out(3);
    std::vector<std::size_t> active(3);
    std::vector<int> more(3, -1);
    grp.run([&](int r) {
      thread_comm c(grp, r);
      hone::data_parallel_options o = scenario_buckets;
      o.uneven_inputs = true;
      o.weight_by_count = by_count;
      hone::data_parallel dp(c, o);
      std::vector<float> g = rank_gradients(r, n);
      if (r == 1) {
        more[1] = dp.join_step(g) ? 1 : 0;
      } else {
        if (by_count) (void)dp.count_share(5.0);
        dp.reduce(g);
      }
      out[static_cast<std::size_t>(r)] = g;
      active[static_cast<std::size_t>(r)] = dp.active_ranks();
    });
    BOOST_TEST(more[1] == 1);
    const auto g0 = rank_gradients(0, n), g2 = rank_gradients(2, n);
    for (std::size_t r = 0; r < 3; ++r) {
      BOOST_TEST(active[r] == 2u);
      for (std::size_t i = 0; i < n; ++i) {
        const double sum = static_cast<double>(g0[i]) + static_cast<double>(g2[i]);
        const auto want = static_cast<float>(by_count ? sum : sum / 2.0);
        BOOST_TEST(out[r][i] == want, "rank " << r << " element " << i << " by_count " << by_count);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(join_ends_when_every_rank_has_joined_and_picks_the_last_active_rank) {
  // Rank 2 trains one step more than ranks 0 and 1; the join then ends after one shadowed step
  // on ranks 0 and 1 and none on rank 2, and every rank names rank 2 as the source of the state.
  thread_group grp(3);
  std::vector<int> shadowed(3), root(3), steps(3);
  grp.run([&](int r) {
    thread_comm c(grp, r);
    hone::data_parallel_options o = scenario_buckets;
    o.uneven_inputs = true;
    hone::data_parallel dp(c, o);
    std::vector<float> g = rank_gradients(r, 40);
    dp.reduce(g);
    if (r == 2) dp.reduce(g);
    int k = 0;
    while (dp.join_step(g)) ++k;
    shadowed[static_cast<std::size_t>(r)] = k;
    root[static_cast<std::size_t>(r)] = dp.last_joiner();
    steps[static_cast<std::size_t>(r)] = static_cast<int>(dp.reductions());
  });
  BOOST_TEST(shadowed == (std::vector<int>{1, 1, 0}), boost::test_tools::per_element());
  BOOST_TEST(root == (std::vector<int>{2, 2, 2}), boost::test_tools::per_element());
  // The same step numbers on every rank: 2 steps, then the exchange that ends the join.
  BOOST_TEST(steps == (std::vector<int>{3, 3, 3}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(uneven_thread_ranks_match_one_process_over_the_active_ranks_batches) {
  // Two epochs, each ending in join. The active ranks number 1, 2 or 4 at every step of the
  // 2- and 4-rank runs, so dividing by them is exact and the runs are bit-identical to one process
  // (see docs/dist.md, "Determinism"); the 3-rank run has steps with 3 active ranks.
  const scenario sc{};
  const std::vector<std::vector<int>> two{{5, 2}, {1, 3}};
  const std::vector<std::vector<int>> four{{6, 3, 5, 3}, {0, 2, 2, 1}};
  const std::vector<std::vector<int>> three{{5, 3, 6}, {2, 0, 1}};
  check_against_reference(train_threads_uneven(sc, two), train_reference_uneven(sc, two), two, 0);
  check_against_reference(train_threads_uneven(sc, four), train_reference_uneven(sc, four), four,
                          0);
  check_against_reference(train_threads_uneven(sc, three), train_reference_uneven(sc, three), three,
                          1e-6);
}

BOOST_AUTO_TEST_CASE(uneven_thread_ranks_weighted_by_count_match_one_process_over_every_sample) {
  // Rank r's batches hold 8 + 5 r rows; the global count counts the samples of the active ranks
  // only, so every step is the mean over the samples that exist.
  scenario sc{};
  sc.extra_rows_per_rank = 5;
  sc.weight_by_count = true;
  const std::vector<std::vector<int>> two{{2, 5}, {3, 1}};
  const std::vector<std::vector<int>> three{{5, 3, 6}, {1, 2, 0}};
  check_against_reference(train_threads_uneven(sc, two), train_reference_uneven(sc, two), two,
                          1e-6);
  check_against_reference(train_threads_uneven(sc, three), train_reference_uneven(sc, three), three,
                          1e-6);
}

BOOST_AUTO_TEST_CASE(an_inf_on_an_active_rank_skips_the_step_on_the_joined_rank_too) {
  // Rank 0 joins after 2 steps; rank 1's batch at step 3 overflows. The step is skipped by the
  // active rank, and the joined rank takes the halved scale and the skip count with the state.
  scenario sc{};
  sc.poison_step = 3;
  sc.poison_rank = 1;
  const std::vector<std::vector<int>> steps{{2, 6}};
  const auto runs = train_threads_uneven(sc, steps);
  const auto ref = train_reference_uneven(sc, steps);
  BOOST_TEST(ref.steps[3].skipped);
  check_against_reference(runs, ref, steps, 0);
}

BOOST_AUTO_TEST_CASE(join_without_uneven_inputs_is_a_config_error_that_says_what_to_set) {
  hd::local_comm comm;
  mlp<hone::half> m;
  auto t = scenario_trainer(m, hone::data_parallel(comm, scenario_buckets));
  try {
    (void)hd::join(t);
    BOOST_FAIL("join ran without uneven_inputs");
  } catch (const hone::config_error& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find("uneven_inputs is off") != std::string::npos, msg);
    BOOST_TEST(msg.find(".uneven_inputs = true") != std::string::npos, msg);
  }
}

BOOST_AUTO_TEST_CASE(a_failed_flag_exchange_names_the_step_and_stays_pending) {
  flaky_comm comm;
  hone::data_parallel_options o = scenario_buckets;
  o.uneven_inputs = true;
  hone::data_parallel dp(comm, o);
  std::vector<float> g(65);
  std::iota(g.begin(), g.end(), 1.0f);
  const std::vector<float> before = g;
  // Step 1: the exchange (#1) fails; its reduction runs at finish_pending().
  comm.fail_at = 1;
  try {
    dp.reduce(g);
    BOOST_FAIL("the failed exchange was not reported");
  } catch (const hone::dist_error& e) {
    const std::string m = e.what();
    BOOST_TEST(
        m.find("hone::data_parallel: step 1 on rank 0 of 1, the all_reduce of the sample "
               "counts and still-active flags: flaky_comm: collective #1 did not complete") == 0u,
        m);
    BOOST_TEST(m.find("finish_pending()") != std::string::npos, m);
  }
  BOOST_TEST(dp.pending());
  BOOST_TEST(comm.started == 1);
  BOOST_CHECK_THROW(dp.reduce(g), hone::dist_error);  // a new step is refused
  dp.finish_pending();
  BOOST_TEST(!dp.pending());
  BOOST_TEST(comm.started == 1 + 10);  // the step's 5 scatters and 5 gathers
  BOOST_TEST(same_bits(g, before));    // one rank: its own gradients, divided by 1
  // A joined rank's exchange (#12) fails: the message says it has joined.
  comm.fail_at = 12;
  try {
    (void)dp.join_step(g);
    BOOST_FAIL("the failed exchange was not reported");
  } catch (const hone::dist_error& e) {
    const std::string m = e.what();
    BOOST_TEST(m.find("hone::data_parallel: step 2 on rank 0 of 1 (joined: this rank has no batch "
                      "left and takes part with zero gradients), the all_reduce of the sample "
                      "counts and still-active flags: flaky_comm: collective #12") == 0u,
               m);
  }
  BOOST_TEST(dp.pending());
  dp.finish_pending();  // no rank is active: nothing follows the exchange
  BOOST_TEST(!dp.pending());
  BOOST_TEST(comm.started == 12);
  BOOST_TEST(!dp.join_step(g));  // every rank (the one) has joined
  BOOST_TEST(dp.shadowed_steps() == 0u);
  // The pick of the rank whose state every rank takes (#14) fails: named, pending, completed.
  comm.fail_at = 14;
  try {
    (void)dp.last_joiner();
    BOOST_FAIL("the failed pick was not reported");
  } catch (const hone::dist_error& e) {
    const std::string m = e.what();
    BOOST_TEST(m.find("hone::data_parallel: after step 3 on rank 0 of 1, the all_reduce (max) "
                      "that picks the rank whose trainer state every rank takes after the join: "
                      "flaky_comm: collective #14") == 0u,
               m);
  }
  BOOST_TEST(dp.pending());
  dp.finish_pending();
  BOOST_TEST(!dp.pending());
  BOOST_TEST(dp.last_joiner() == 0);
  BOOST_TEST(comm.started == 15);
}
