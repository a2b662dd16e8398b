// hone::data_parallel in one process: with local_comm a trainer is bit-identical to one with
// local_gradients (fp16 with dynamic loss scaling, AdamW, global-norm clipping, accumulation by
// count, several buckets); the bucket plan covers the arena exactly, from its end, in the
// documented sizes; bad options and a changing arena are config_errors; a collective that fails
// surfaces as a dist_error naming the step, the bucket, the collective and the communicator's
// message, leaves the reduction pending, and finish_pending() completes it.
#define BOOST_TEST_MODULE hone_dist_data_parallel
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <hone/dist.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/schedule/constant.hpp>
#include <hone/train/accumulate.hpp>
#include <hone/train/trainer.hpp>
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

template <class T>
std::vector<std::uint16_t> bits_of(const std::vector<T>& v) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) std::memcpy(&out[i], &v[i], sizeof(std::uint16_t));
  return out;
}

/// Small buckets: first 8 floats, then 16.
constexpr hone::data_parallel_options small_buckets = scenario_buckets;

using dist_test::flaky_comm;

}  // namespace

static_assert(
    std::is_same_v<hone::data_parallel<hd::local_comm>::role, hone::roles::gradient_reduction>);
static_assert(std::is_same_v<decltype(hone::data_parallel(std::declval<hd::local_comm&>())),
                             hone::data_parallel<hd::local_comm>>);

BOOST_AUTO_TEST_CASE(with_local_comm_the_trainer_is_bit_identical_to_local_gradients) {
  hd::local_comm comm;
  mlp<hone::half> a, b;
  // init_scale 2^16 overflows fp16 gradients at first (skipped steps, back-off); growth every 3
  // good steps; clipping at 0.5 is active.
  const hone::fp16_mixed<> fp16{.scaler = {.init_scale = 65536.0f, .growth_interval = 3}};
  const hone::adamw opt{.weight_decay = 0.01f};
  const hone::clip_grad_norm clip{.max_norm = 0.5f};
  const hone::constant_lr lr{.base_lr = 0.01};
  hone::trainer ref(a, fp16, opt, clip, lr, hone::accumulate::by_count{});
  hone::trainer dp(b, fp16, opt, clip, lr, hone::accumulate::by_count{},
                   hone::data_parallel(comm, small_buckets));
  static_assert(std::is_same_v<decltype(dp)::reduction_type, hone::data_parallel<hd::local_comm>>);
  int skipped = 0, clipped = 0;
  for (unsigned s = 0; s < 12; ++s) {
    const std::vector<mlp_batch> mb{make_mlp_batch(5, 10 * s), make_mlp_batch(11, 10 * s + 1)};
    const auto ra = ref.step(std::span<const mlp_batch>(mb));
    const auto rb = dp.step(std::span<const mlp_batch>(mb));
    BOOST_TEST(ra.skipped == rb.skipped);
    BOOST_TEST(ra.grad_norm == rb.grad_norm);
    BOOST_TEST(ra.loss_scale == rb.loss_scale);
    BOOST_TEST(same_bits(ref.master_weights(), dp.master_weights()), "step " << s);
    BOOST_TEST(same_bits(ref.master_gradients(), dp.master_gradients()), "step " << s);
    BOOST_TEST((bits_of(a.w1) == bits_of(b.w1)));
    skipped += rb.skipped;
    clipped += !rb.skipped && rb.grad_norm > clip.max_norm;
  }
  BOOST_TEST(skipped > 0);  // the skip path ran
  BOOST_TEST(clipped > 0);  // the clipping coefficient was exercised
  BOOST_TEST(ref.steps_done() == dp.steps_done());
  BOOST_TEST(ref.scaler().scale() == dp.scaler().scale());
  BOOST_TEST(dp.gradient_reduction().reductions() == 12u);
  BOOST_TEST(!dp.gradient_reduction().pending());
  BOOST_TEST(&dp.gradient_reduction().communicator() == &comm);
  // The plan the policy used is the documented plan of its arena (65 parameters, 81 floats with
  // the arena's alignment padding between tensors).
  BOOST_TEST(dp.layout().total() == 81u);
  const auto& plan = dp.gradient_reduction().buckets();
  BOOST_TEST((plan == dp.gradient_reduction().plan_for(81)));
  BOOST_TEST(plan.size() == 6u);
}

BOOST_AUTO_TEST_CASE(the_plan_covers_the_arena_from_its_end) {
  // 65 floats, 3 ranks, first bucket 32 bytes (8 floats, rounded down to 6 = 2 per rank), then
  // 64 bytes (16 floats, rounded down to 15); the last bucket holds what is left at the start.
  const auto plan = hd::plan_buckets(65, 3, small_buckets);
  const std::vector<hd::bucket> want{{59, 6}, {44, 15}, {29, 15}, {14, 15}, {0, 14}};
  BOOST_TEST((plan == want));
  // One rank: no rounding.
  const std::vector<hd::bucket> one{{57, 8}, {41, 16}, {25, 16}, {9, 16}, {0, 9}};
  BOOST_TEST((hd::plan_buckets(65, 1, small_buckets) == one));
  // Defaults: 1 MiB then 25 MiB of floats (DDP's first bucket and bucket_cap_mb).
  const std::size_t n = 19'000'000;
  const auto d1 = hd::plan_buckets(n, 1, {});
  BOOST_TEST(d1.size() == 4u);
  BOOST_TEST((d1[0] == hd::bucket{n - 262'144, 262'144}));
  BOOST_TEST((d1[1] == hd::bucket{n - 262'144 - 6'553'600, 6'553'600}));
  BOOST_TEST(d1[2].count == 6'553'600u);
  BOOST_TEST((d1[3] == hd::bucket{0, n - 262'144 - 2 * 6'553'600}));
  // With 3 ranks every bucket but the last is a multiple of 3.
  const auto d3 = hd::plan_buckets(n, 3, {});
  BOOST_TEST(d3[0].count == 262'143u);
  BOOST_TEST(d3[1].count == 6'553'599u);
  // Coverage for many sizes and rank counts: contiguous from the end, each element once, every
  // bucket but the last a multiple of the ranks, the first no larger than the first-bucket size.
  for (std::size_t size : {0u, 1u, 2u, 5u, 14u, 15u, 16u, 65u, 1000u, 4099u}) {
    for (int ranks : {1, 2, 3, 4, 7}) {
      const auto p = hd::plan_buckets(size, ranks, small_buckets);
      std::size_t end = size;
      for (std::size_t k = 0; k < p.size(); ++k) {
        BOOST_TEST(p[k].count > 0u);
        BOOST_TEST(p[k].offset + p[k].count == end, "size " << size << " ranks " << ranks);
        end = p[k].offset;
        if (k + 1 < p.size()) BOOST_TEST(p[k].count % static_cast<std::size_t>(ranks) == 0u);
      }
      BOOST_TEST(end == 0u);
      if (!p.empty()) BOOST_TEST(p[0].count <= std::max<std::size_t>(8, ranks));
    }
  }
  // A bucket smaller than one float per rank holds one float per rank.
  const auto tiny = hd::plan_buckets(10, 4, {.bucket_bytes = 4, .first_bucket_bytes = 4});
  BOOST_TEST(tiny.size() == 3u);
  BOOST_TEST((tiny[0] == hd::bucket{6, 4}));
  BOOST_TEST((tiny[2] == hd::bucket{0, 2}));
}

BOOST_AUTO_TEST_CASE(the_reduction_leaves_one_rank_s_gradients_unchanged_in_every_piece) {
  // Every element goes through exactly one scatter and one gather: with one rank the result is
  // the input, bit for bit, including a NaN payload and signed zeros.
  hd::local_comm comm;
  hone::data_parallel dp(comm, small_buckets);
  std::vector<float> g(65);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i) * 0.37f - 3.0f;
  g[0] = -0.0f;
  g[64] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> before = g;
  dp.reduce(g);
  BOOST_TEST(same_bits(g, before));
  BOOST_TEST(dp.reductions() == 1u);
}

BOOST_AUTO_TEST_CASE(bad_options_and_a_changing_arena_are_config_errors) {
  hd::local_comm comm;
  auto message_of = [&](hone::data_parallel_options o) {
    try {
      hone::data_parallel dp(comm, o);
    } catch (const hone::config_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string zero = message_of({.bucket_bytes = 0});
  BOOST_TEST(zero.find("bucket_bytes is 0") != std::string::npos, zero);
  BOOST_TEST(zero.find("at least one float") != std::string::npos, zero);
  const std::string first = message_of({.first_bucket_bytes = 3});
  BOOST_TEST(first.find("first_bucket_bytes 3") != std::string::npos, first);
  BOOST_TEST(message_of({.bucket_bytes = 4, .first_bucket_bytes = 4}).empty());
  BOOST_CHECK_THROW((void)hd::plan_buckets(10, 0, {}), hone::config_error);

  hone::data_parallel dp(comm, small_buckets);
  std::vector<float> g(65, 1.0f), h(64, 1.0f);
  dp.reduce(g);
  try {
    dp.reduce(h);
    BOOST_FAIL("a smaller arena was accepted");
  } catch (const hone::config_error& e) {
    const std::string m = e.what();
    BOOST_TEST(m.find("holds 64 floats but held 65") != std::string::npos, m);
  }
  BOOST_TEST(!dp.pending());
  dp.reduce(g);  // the right size still works
}

BOOST_AUTO_TEST_CASE(a_failed_collective_names_the_step_and_the_bucket_and_stays_pending) {
  flaky_comm comm;
  hone::data_parallel dp(comm, small_buckets);
  std::vector<float> g(65);
  std::iota(g.begin(), g.end(), 1.0f);
  const std::vector<float> before = g;
  dp.reduce(g);  // step 1: 5 scatters, 5 gathers (collectives #1-#10)
  BOOST_TEST(comm.started == 10);
  // Step 2: the scatter of bucket 1 (#12) fails at its wait.
  comm.fail_at = 12;
  std::string message;
  try {
    dp.reduce(g);
  } catch (const hone::dist_error& e) {
    message = e.what();
  }
  BOOST_TEST_MESSAGE(message);
  BOOST_TEST(message.find("hone::data_parallel: step 2, bucket 1 of 5 (arena elements [41, 57)) "
                          "on rank 0 of 1, reduce_scatter: flaky_comm: collective #12 did not "
                          "complete on rank 0 of 1") == 0u,
             message);
  BOOST_TEST(message.find("finish_pending()") != std::string::npos, message);
  BOOST_TEST(dp.pending());
  // The scatters of every bucket were started; the gather of bucket 0 only.
  BOOST_TEST(comm.started == 10 + 5 + 1);
  // A new step before the pending one is finished is refused, naming it.
  try {
    dp.reduce(g);
    BOOST_FAIL("reduce() ran while a reduction was pending");
  } catch (const hone::dist_error& e) {
    const std::string m = e.what();
    BOOST_TEST(m.find("step 2") != std::string::npos, m);
    BOOST_TEST(m.find("still pending") != std::string::npos, m);
  }
  BOOST_TEST(dp.reductions() == 2u);
  dp.finish_pending();  // the late collective completes: the rest of step 2 runs once
  BOOST_TEST(!dp.pending());
  BOOST_TEST(comm.started == 20);
  BOOST_TEST(same_bits(g, before));
  // A failing gather is named as such.
  comm.fail_at = 20 + 5 + 5;  // step 3's last gather: bucket 4 (the arena's start)
  try {
    dp.reduce(g);
    BOOST_FAIL("the failing gather was not reported");
  } catch (const hone::dist_error& e) {
    const std::string m = e.what();
    BOOST_TEST(m.find("step 3, bucket 4 of 5 (arena elements [0, 9)) on rank 0 of 1, all_gather: "
                      "flaky_comm: collective #30") != std::string::npos,
               m);
  }
  dp.finish_pending();
  BOOST_TEST(!dp.pending());
  BOOST_TEST(same_bits(g, before));
  dp.finish_pending();  // nothing pending: nothing happens
  BOOST_TEST(comm.started == 30);
}

BOOST_AUTO_TEST_CASE(copies_share_the_communicator_but_not_the_progress) {
  hd::local_comm comm;
  hone::data_parallel dp(comm, small_buckets);
  std::vector<float> g(65, 2.0f);
  dp.reduce(g);
  const hone::data_parallel copy = dp;
  BOOST_TEST(&copy.communicator() == &comm);
  BOOST_TEST(copy.options().bucket_bytes == 64u);
  BOOST_TEST(copy.reductions() == 0u);
  BOOST_TEST(copy.buckets().empty());
  BOOST_TEST(dp.reductions() == 1u);
}

// ---- N ranks as N threads (thread_comm: sums in rank order) ----

namespace {
/// Runs the scenario on `ranks` threads; returns each rank's records.
std::vector<std::vector<step_record>> train_threads(int ranks, const scenario& sc) {
  thread_group g(ranks);
  std::vector<std::vector<step_record>> out(static_cast<std::size_t>(ranks));
  g.run([&](int r) {
    thread_comm c(g, r);
    out[static_cast<std::size_t>(r)] = train_replica(c, sc);
  });
  return out;
}

/// Every rank holds the same bits as rank 0 at every step.
void check_ranks_agree(const std::vector<std::vector<step_record>>& runs) {
  for (std::size_t r = 1; r < runs.size(); ++r) {
    for (std::size_t s = 0; s < runs[0].size(); ++s) {
      BOOST_TEST(same_bits(runs[r][s].master, runs[0][s].master), "rank " << r << " step " << s);
      BOOST_TEST(runs[r][s].scale == runs[0][s].scale);
      BOOST_TEST(runs[r][s].skipped == runs[0][s].skipped);
      BOOST_TEST(same_bits(runs[r][s].grad_norm, runs[0][s].grad_norm));  // NaN on overflow
    }
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(thread_ranks_match_one_process_accumulating_their_batches) {
  // With sums in rank order and N a power of two, 1/N scales exactly: rank-averaged gradients
  // (((g0 + g1) + g2) + g3) / 4 are the bits of the accumulation by count
  // ((g0/4 + g1/4) + g2/4) + g3/4, so every step is bit-identical to one process. With 3 ranks
  // the weights 1/3 round: a tolerance (see docs/dist.md).
  const scenario sc{};
  for (int n : {2, 3, 4}) {
    BOOST_TEST_CONTEXT("ranks " << n) {
      const auto runs = train_threads(n, sc);
      const auto ref = train_reference(n, sc);
      check_ranks_agree(runs);
      int skipped = 0;
      double worst = 0;
      for (std::size_t s = 0; s < ref.size(); ++s) {
        BOOST_TEST(runs[0][s].skipped == ref[s].skipped, "step " << s);
        BOOST_TEST(runs[0][s].scale == ref[s].scale, "step " << s);
        skipped += ref[s].skipped;
        if (n != 3) {
          BOOST_TEST(same_bits(runs[0][s].master, ref[s].master), "step " << s);
        }
        worst = std::max(worst, max_abs_diff(runs[0][s].master, ref[s].master));
      }
      BOOST_TEST_MESSAGE("ranks " << n << ": largest weight difference to one process " << worst);
      BOOST_TEST(worst <= 1e-6);
      BOOST_TEST(skipped > 0);  // the first steps overflow at scale 2^16
      BOOST_TEST(ref.back().steps_done > 5u);
    }
  }
}

BOOST_AUTO_TEST_CASE(uneven_ranks_weighted_by_count_match_one_process_over_every_sample) {
  // Rank r's batches hold 8 + 5 r rows. Weighted by their sample counts the ranks give the
  // gradient of the mean over every sample, which is what one process accumulating all the
  // micro-batches by count computes; DDP's mean of per-rank means (the default) does not.
  scenario sc{};
  sc.extra_rows_per_rank = 5;
  for (int n : {2, 3}) {
    BOOST_TEST_CONTEXT("ranks " << n) {
      const auto ref = train_reference(n, sc);
      sc.weight_by_count = true;
      const auto by_count = train_threads(n, sc);
      sc.weight_by_count = false;
      const auto by_rank = train_threads(n, sc);
      check_ranks_agree(by_count);
      double worst = 0, worst_ddp = 0;
      for (std::size_t s = 0; s < ref.size(); ++s) {
        BOOST_TEST(by_count[0][s].skipped == ref[s].skipped, "step " << s);
        worst = std::max(worst, max_abs_diff(by_count[0][s].master, ref[s].master));
        worst_ddp = std::max(worst_ddp, max_abs_diff(by_rank[0][s].master, ref[s].master));
      }
      BOOST_TEST_MESSAGE("ranks " << n << ": by count " << worst << ", DDP mean " << worst_ddp);
      BOOST_TEST(worst <= 1e-6);
      BOOST_TEST(worst_ddp > 100 * worst);  // the test tells the two weightings apart
      BOOST_TEST(worst_ddp > 1e-5);
    }
  }
}

BOOST_AUTO_TEST_CASE(weight_by_count_refuses_a_step_where_no_rank_has_a_sample) {
  hd::local_comm comm;
  hone::data_parallel dp(comm, {.weight_by_count = true});
  BOOST_TEST(dp.count_share(12.0) == 1.0);
  BOOST_CHECK_THROW((void)dp.count_share(0.0), hone::config_error);
  BOOST_CHECK_THROW((void)dp.count_share(-1.0), hone::config_error);
  BOOST_CHECK_THROW((void)dp.count_share(std::nan("")), hone::config_error);
  // Without accumulation by count the trainer cannot count samples: a sentence, at the step.
  mlp<hone::half> m;
  hone::trainer t(m, hone::fp16_mixed<>{}, hone::adamw{}, hone::accumulate::none{},
                  hone::data_parallel(comm, {.weight_by_count = true}));
  try {
    (void)t.step(make_mlp_batch(4, 1));
    BOOST_FAIL("weight_by_count without accumulate::by_count must be refused");
  } catch (const hone::config_error& e) {
    BOOST_TEST(std::string(e.what()).find("accumulate::by_count") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(an_inf_on_one_thread_rank_skips_the_step_on_every_rank) {
  scenario sc{};
  sc.poison_step = 6;
  sc.poison_rank = 1;
  const auto runs = train_threads(3, sc);
  check_ranks_agree(runs);
  const auto& r0 = runs[0];
  BOOST_TEST(!r0[5].skipped);
  BOOST_TEST(r0[6].skipped);
  BOOST_TEST(same_bits(r0[6].master, r0[5].master));  // weights unchanged
  BOOST_TEST(r0[6].scale == r0[5].scale / 2);         // backed off once
  BOOST_TEST(r0[6].skipped_steps == r0[5].skipped_steps + 1);
  BOOST_TEST(r0[6].steps_done == r0[5].steps_done);
  for (std::size_t r = 0; r < runs.size(); ++r)
    BOOST_TEST(runs[r][6].skipped_steps == r0[6].skipped_steps);
}
