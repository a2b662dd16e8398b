// hone::data_parallel overlapping its reduction with backward (data_parallel_options::
// overlap_with_backward), driven by a model that reports gradients final through
// hone::gradient_ready (dp_model.hpp's mlp_reporting), ranks as threads (thread_comm.hpp):
//  - 2 and 3 ranks, 1 and 2 micro-batches per rank, fp16 dynamic loss scaling with skipped steps,
//    AdamW, clipping, small buckets: the overlapped run gives the bits of the reduction after
//    backward at every step, on every rank, whatever order the model reports in (backward order,
//    forward order, a part only), and buckets really start during backward (early_starts());
//  - one rank (local_comm): overlapped steps are the bits of local gradients;
//  - a parameter reported twice or out of range is refused with a sentence;
//  - a collective that fails during an overlapped step names the step and bucket, stays pending,
//    and finish_pending() completes it.
#define BOOST_TEST_MODULE hone_dist_data_parallel_overlap
#include <boost/test/unit_test.hpp>

#include <hone/dist.hpp>
#include <span>
#include <string>
#include <vector>

#include "dp_model.hpp"
#include "dp_scenario.hpp"
#include "flaky_comm.hpp"
#include "thread_comm.hpp"

namespace hd = hone::dist;

namespace {

static_assert(hone::reports_gradient_ready<mlp_reporting<hone::half>, mlp_batch>);
static_assert(!hone::reports_gradient_ready<mlp<hone::half>, mlp_batch>);

struct run_result {
  std::vector<step_record> steps;
  std::vector<std::size_t> early;  // early_starts() after each step
};

/// Rank comm.rank()'s run: `micro` micro-batches per step, the model reporting in `order`.
template <class Comm>
run_result train_reporting(Comm& comm, const scenario& sc, int micro,
                           const std::vector<std::size_t>& order, bool overlap) {
  mlp_reporting<hone::half> m;
  m.order = order;
  hone::data_parallel_options o = scenario_buckets;
  o.overlap_with_backward = overlap;
  auto t = scenario_trainer(m, hone::data_parallel(comm, o));
  run_result out;
  for (int s = 0; s < sc.steps; ++s) {
    std::vector<mlp_batch> mb;
    for (int k = 0; k < micro; ++k) mb.push_back(scenario_batch(sc, s, comm.rank() + k * 10));
    out.steps.push_back(record(t, t.step(std::span<const mlp_batch>(mb))));
    out.early.push_back(t.gradient_reduction().early_starts());
  }
  return out;
}

std::vector<run_result> on_threads(int ranks, const scenario& sc, int micro,
                                   const std::vector<std::size_t>& order, bool overlap) {
  thread_group g(ranks);
  std::vector<run_result> out(static_cast<std::size_t>(ranks));
  g.run([&](int r) {
    thread_comm c(g, r);
    out[static_cast<std::size_t>(r)] = train_reporting(c, sc, micro, order, overlap);
  });
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(overlapped_steps_are_the_bits_of_the_reduction_after_backward) {
  const scenario sc{};
  const std::vector<std::vector<std::size_t>> orders{{3, 2, 1, 0}, {0, 1, 2, 3}, {3, 1}};
  for (int ranks : {2, 3}) {
    for (int micro : {1, 2}) {
      const auto after = on_threads(ranks, sc, micro, {3, 2, 1, 0}, false);
      for (const auto& order : orders) {
        BOOST_TEST_CONTEXT("ranks " << ranks << ", micro-batches " << micro << ", " << order.size()
                                    << " parameters reported, first " << order[0]) {
          const auto over = on_threads(ranks, sc, micro, order, true);
          std::size_t early = 0;
          int skipped = 0;
          for (std::size_t r = 0; r < over.size(); ++r) {
            for (std::size_t s = 0; s < over[r].steps.size(); ++s) {
              BOOST_TEST(same_bits(over[r].steps[s].master, after[0].steps[s].master),
                         "rank " << r << " step " << s);
              BOOST_TEST(same_bits(over[r].steps[s].grad_norm, after[0].steps[s].grad_norm));
              BOOST_TEST(over[r].steps[s].skipped == after[0].steps[s].skipped);
              BOOST_TEST(after[r].early[s] == 0u);  // without overlap nothing starts early
              if (r == 0) {
                early += over[r].early[s];
                skipped += over[r].steps[s].skipped;
              }
            }
          }
          // The 81-float arena is 6 buckets (7 pieces with the padded tail): in backward order
          // every piece but those waiting for the last report starts during backward.
          BOOST_TEST(early > 0u, "no bucket started during backward");
          BOOST_TEST(skipped > 0);
          BOOST_TEST(max_abs_diff(over[0].steps.back().master, over[0].steps.front().master) >
                     1e-3);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(buckets_start_in_plan_order_as_their_parameters_are_reported) {
  // The buckets are planned from the arena's end (layer2.bias first). Reported last layer first
  // without layer1.weight, every bucket but the one(s) holding layer1.weight starts during
  // backward; reported first layer first without layer2.bias, the first bucket waits for
  // layer2.bias and holds every later one back (plan order): nothing starts during backward.
  const scenario sc{.steps = 2};
  const auto backward = on_threads(2, sc, 1, {3, 2, 1}, true);
  const auto forward = on_threads(2, sc, 1, {0, 1, 2}, true);
  const auto all = on_threads(2, sc, 1, {3, 2, 1, 0}, true);
  BOOST_TEST_MESSAGE("pieces started during backward: backward order without layer1.weight "
                     << backward[0].early[0] << ", forward order without layer2.bias "
                     << forward[0].early[0] << ", all " << all[0].early[0]);
  BOOST_TEST(forward[0].early[0] == 0u);
  BOOST_TEST(backward[0].early[0] > 0u);
  BOOST_TEST(backward[0].early[0] < all[0].early[0]);
  BOOST_TEST(all[0].early[0] == 7u);  // 6 buckets and the padded tail
  BOOST_TEST(same_bits(backward[0].steps[1].master, forward[0].steps[1].master));
}

BOOST_AUTO_TEST_CASE(one_rank_overlapped_is_local_gradients) {
  const scenario sc{};
  hd::local_comm c;
  const auto over = train_reporting(c, sc, 2, {3, 2, 1, 0}, true);
  mlp_reporting<hone::half> m;
  auto t = scenario_trainer(m);
  for (int s = 0; s < sc.steps; ++s) {
    std::vector<mlp_batch> mb{scenario_batch(sc, s, 0), scenario_batch(sc, s, 10)};
    const auto rec = record(t, t.step(std::span<const mlp_batch>(mb)));
    BOOST_TEST(same_bits(rec.master, over.steps[static_cast<std::size_t>(s)].master), "step " << s);
  }
}

BOOST_AUTO_TEST_CASE(a_parameter_reported_twice_or_out_of_range_is_refused) {
  const scenario sc{};
  hd::local_comm c;
  const auto message = [&](std::vector<std::size_t> order) {
    mlp_reporting<hone::half> m;
    m.order = std::move(order);
    auto t = scenario_trainer(m, hone::data_parallel(c, scenario_buckets));
    try {
      (void)t.step(scenario_batch(sc, 0, 0));
    } catch (const hone::config_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string twice = message({3, 2, 3});
  BOOST_TEST(twice.find("reported parameter 3 ('layer2.bias') ready twice in one backward") !=
                 std::string::npos,
             twice);
  const std::string range = message({7});
  BOOST_TEST(range.find("reported parameter 7 ready, but parameters() has 4") != std::string::npos,
             range);
}

BOOST_AUTO_TEST_CASE(a_failed_collective_of_an_overlapped_step_names_the_bucket_and_stays_pending) {
  const scenario sc{};
  dist_test::flaky_comm c;
  // Collective #1 is bucket 0's reduce_scatter (started when layer2.bias is reported), #2 bucket
  // 1's (when layer2.weight is): it fails at its wait in reduce().
  c.fail_at = 2;
  mlp_reporting<hone::half> m;
  auto t = scenario_trainer(m, hone::data_parallel(c, scenario_buckets));
  std::string what = "no error";
  try {
    (void)t.step(scenario_batch(sc, 0, 0));
  } catch (const hone::dist_error& e) {
    what = e.what();
  }
  BOOST_TEST(what.find("hone::data_parallel: step 1, bucket 1 of 6") == 0u, what);
  BOOST_TEST(what.find("reduce_scatter: flaky_comm: collective #2") != std::string::npos, what);
  BOOST_TEST(t.gradient_reduction().pending());
  t.gradient_reduction().finish_pending();
  BOOST_TEST(!t.gradient_reduction().pending());
  (void)t.step(scenario_batch(sc, 1, 0));  // and the next step runs
  BOOST_TEST(t.gradient_reduction().reductions() == 2u);
}
