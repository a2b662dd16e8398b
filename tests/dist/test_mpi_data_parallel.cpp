// hone::data_parallel<mpi_comm> under mpirun with 2 and 3 ranks: a two-layer MLP trained with
// fp16 dynamic loss scaling, AdamW and global-norm clipping (tests/dist/dp_scenario.hpp), its
// 81-float gradient arena in 6 buckets.
//  (a) every rank holds bit-identical master weights and scaler state after every step;
//  (b) the run matches one process accumulating the same global batch as N micro-batches by
//      count: bit for bit with 2 ranks (1/2 scales exactly), within 1e-6 with 3 (1/3 rounds);
//  (c) two runs give the same bits;
//  (d) an inf in one rank's gradients skips the step on every rank (weights unchanged, the scale
//      backed off alike);
//  (e) a rank that arrives late at a step makes the others throw a dist_error naming the step,
//      the bucket, the collective, their rank and the late rank within the communicator's
//      timeout; the pending reduction then completes once the late rank arrives
//      (finish_pending), and the job ends cleanly;
//  and broadcast_weights gives every rank the root's weights.
#define BOOST_TEST_MODULE hone_dist_mpi_data_parallel
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstring>
#include <hone/dist/data_parallel.hpp>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dp_scenario.hpp"

namespace hd = hone::dist;

namespace {
struct mpi_fixture {
  hd::mpi_environment env;
};

// A failing check on one rank must not leave the others waiting for ever: 20 s, then an error.
hd::mpi_comm make_comm() {
  return hd::mpi_comm(MPI_COMM_WORLD, std::chrono::seconds(20));
}

/// One step's record as doubles (the fp32 weights and the scaler's state exactly, the norm's
/// bits), to be compared across ranks.
std::vector<double> flatten(const step_record& r) {
  std::vector<double> v(r.master.begin(), r.master.end());
  v.push_back(r.scale);
  v.push_back(r.growth_tracker);
  v.push_back(static_cast<double>(r.skipped_steps));
  v.push_back(r.skipped ? 1.0 : 0.0);
  v.push_back(static_cast<double>(r.steps_done));
  v.push_back(r.grad_norm);
  return v;
}

/// Gathers every rank's records and checks that every rank holds rank 0's bits at every step.
void check_identical_on_every_rank(hd::mpi_comm& c, const std::vector<step_record>& run) {
  std::vector<double> mine;
  for (const auto& r : run) {
    const auto f = flatten(r);
    mine.insert(mine.end(), f.begin(), f.end());
  }
  const std::size_t n = mine.size();
  std::vector<double> all(n * static_cast<std::size_t>(c.size()));
  c.all_gather(std::span<const double>(mine), std::span<double>(all)).wait();
  const std::size_t per_step = n / run.size();
  for (int q = 1; q < c.size(); ++q) {
    const double* other = all.data() + n * static_cast<std::size_t>(q);
    for (std::size_t s = 0; s < run.size(); ++s) {
      const bool same = std::memcmp(other + s * per_step, all.data() + s * per_step,
                                    per_step * sizeof(double)) == 0;
      BOOST_TEST(same, "rank " << q << " differs from rank 0 after step " << s);
    }
  }
}
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(mpi_fixture);

BOOST_AUTO_TEST_CASE(every_rank_holds_the_same_bits_and_matches_one_process) {
  auto c = make_comm();
  const scenario sc{};
  const auto run = train_replica(c, sc);
  check_identical_on_every_rank(c, run);  // (a)
  // (b) The reference: one process accumulating the N ranks' micro-batches by count.
  const auto ref = train_reference(c.size(), sc);
  int skipped = 0;
  double worst = 0;
  for (std::size_t s = 0; s < ref.size(); ++s) {
    BOOST_TEST(run[s].skipped == ref[s].skipped, "step " << s);
    BOOST_TEST(run[s].scale == ref[s].scale, "step " << s);
    BOOST_TEST(run[s].steps_done == ref[s].steps_done, "step " << s);
    if (c.size() == 2) BOOST_TEST(same_bits(run[s].master, ref[s].master), "step " << s);
    worst = std::max(worst, max_abs_diff(run[s].master, ref[s].master));
    skipped += ref[s].skipped;
  }
  BOOST_TEST_MESSAGE("rank " << c.rank() << " of " << c.size()
                             << ": largest weight difference to one process " << worst);
  BOOST_TEST(worst <= 1e-6);
  BOOST_TEST(skipped > 0);                 // the first steps overflow at scale 2^16
  BOOST_TEST(ref.back().steps_done > 5u);  // and most steps update
  // The run moved the weights: the comparison is not between two untouched models.
  BOOST_TEST(max_abs_diff(run.back().master, run.front().master) > 1e-3);
}

BOOST_AUTO_TEST_CASE(uneven_ranks_weighted_by_count_match_one_process_over_every_sample) {
  // Rank r's batches hold 8 + 5 r rows; with weight_by_count the ranks give the mean over every
  // sample (one process accumulating them all by count), bit-identical on every rank.
  auto c = make_comm();
  scenario sc{};
  sc.extra_rows_per_rank = 5;
  sc.weight_by_count = true;
  const auto run = train_replica(c, sc);
  check_identical_on_every_rank(c, run);
  const auto ref = train_reference(c.size(), sc);
  double worst = 0;
  for (std::size_t s = 0; s < ref.size(); ++s) {
    BOOST_TEST(run[s].skipped == ref[s].skipped, "step " << s);
    worst = std::max(worst, max_abs_diff(run[s].master, ref[s].master));
  }
  BOOST_TEST_MESSAGE("rank " << c.rank() << " of " << c.size()
                             << ": uneven ranks by count, largest difference " << worst);
  BOOST_TEST(worst <= 1e-6);
  BOOST_TEST(max_abs_diff(run.back().master, run.front().master) > 1e-3);
}

BOOST_AUTO_TEST_CASE(two_runs_give_the_same_bits) {  // (c)
  auto c = make_comm();
  const scenario sc{};
  const auto first = train_replica(c, sc);
  const auto second = train_replica(c, sc);
  for (std::size_t s = 0; s < first.size(); ++s) {
    BOOST_TEST(same_bits(first[s].master, second[s].master), "step " << s);
    BOOST_TEST(same_bits(first[s].grad_norm, second[s].grad_norm), "step " << s);
    BOOST_TEST(first[s].scale == second[s].scale);
  }
}

BOOST_AUTO_TEST_CASE(an_inf_on_one_rank_skips_the_step_on_every_rank) {  // (d)
  auto c = make_comm();
  scenario sc{};
  sc.poison_step = 6;
  sc.poison_rank = 1;
  const auto run = train_replica(c, sc);
  check_identical_on_every_rank(c, run);
  BOOST_TEST(!run[5].skipped);
  BOOST_TEST(run[6].skipped);
  BOOST_TEST(same_bits(run[6].master, run[5].master));  // weights unchanged on this rank
  BOOST_TEST(run[6].scale == run[5].scale / 2);         // backed off once
  BOOST_TEST(run[6].skipped_steps == run[5].skipped_steps + 1);
  BOOST_TEST(run[6].steps_done == run[5].steps_done);
  BOOST_TEST(!run[7].skipped);  // and training goes on
  // The same as one process whose second micro-batch produced the inf.
  const auto ref = train_reference(c.size(), sc);
  BOOST_TEST(ref[6].skipped);
  BOOST_TEST(run[6].scale == ref[6].scale);
}

BOOST_AUTO_TEST_CASE(broadcast_weights_starts_every_rank_from_the_root) {
  auto c = make_comm();
  mlp<hone::half> m;
  // Rank-dependent weights, as if each rank had initialized its model with its own seed.
  for (auto& w : m.w1)
    w = hone::half(static_cast<float>(w) + 0.125f * static_cast<float>(c.rank()));
  auto t = scenario_trainer(m, hone::data_parallel(c, scenario_buckets));
  mlp<hone::half> root_model;  // rank 0's weights
  hd::broadcast_weights(t, c);
  BOOST_TEST(std::memcmp(m.w1.data(), root_model.w1.data(), m.w1.size() * sizeof(hone::half)) == 0);
  const auto run = std::vector<step_record>{record(t, t.step(scenario_batch({}, 3, c.rank())))};
  check_identical_on_every_rank(c, run);
}

BOOST_AUTO_TEST_CASE(a_late_rank_makes_the_others_throw_naming_the_step_and_the_bucket) {  // (e)
  using namespace std::chrono;
  auto c = make_comm();
  mlp<hone::half> m;
  auto t = scenario_trainer(m, hone::data_parallel(c, scenario_buckets));
  const int late = c.size() - 1;
  for (int s = 0; s < 2; ++s) (void)t.step(scenario_batch({}, s, c.rank()));  // steps 1, 2
  const auto& plan = t.gradient_reduction().buckets();
  BOOST_TEST(plan.size() == 6u);
  c.barrier().wait();  // everybody is here (collective #24)
  c.set_timeout(milliseconds(300));
  if (c.rank() == late) {
    std::this_thread::sleep_for(milliseconds(1500));
    const auto r = t.step(scenario_batch({}, 2, c.rank()));  // step 3, late
    BOOST_TEST(r.step > 0u);
  } else {
    const auto start = steady_clock::now();
    std::string message;
    try {
      (void)t.step(scenario_batch({}, 2, c.rank()));
    } catch (const hone::dist_error& e) {
      message = e.what();
    }
    const auto waited = duration_cast<milliseconds>(steady_clock::now() - start).count();
    BOOST_TEST_MESSAGE("rank " << c.rank() << ": " << message);
    BOOST_TEST(!message.empty(), "the step returned after " << waited << " ms without an error");
    BOOST_TEST(waited >= 300);
    BOOST_TEST(waited < 1500);
    // Bucket 0 is the end of the arena; its scatter is the first collective waited at step 3.
    // Every step runs a scatter and a gather per bucket, and one more pair for the padded tail
    // when the last bucket is not a multiple of the ranks (81 floats over 2 ranks: 1 float);
    // then came the barrier.
    const std::size_t pieces =
        plan.size() + (plan.back().count % static_cast<std::size_t>(c.size()) != 0 ? 1 : 0);
    BOOST_TEST(pieces == (c.size() == 2 ? 7u : 6u));
    const std::string where = "hone::data_parallel: step 3, bucket 0 of 6 (arena elements [" +
                              std::to_string(plan[0].offset) + ", 81)) on rank " +
                              std::to_string(c.rank()) + " of " + std::to_string(c.size()) +
                              ", reduce_scatter: hone::dist::mpi_comm: reduce_scatter #" +
                              std::to_string(2 * 2 * pieces + 1);
    BOOST_TEST(message.find(where) == 0u, message);
    BOOST_TEST(message.find("did not complete within 300 ms") != std::string::npos, message);
    // The communicator's message names the late rank (its last collective was the barrier).
    const std::string missing = "rank " + std::to_string(late) +
                                " has not started it (the last collective it started: #" +
                                std::to_string(2 * 2 * pieces) + ")";
    BOOST_TEST(message.find(missing) != std::string::npos, message);
    BOOST_TEST(message.find("finish_pending()") != std::string::npos, message);
    BOOST_TEST(t.gradient_reduction().pending());
    BOOST_TEST(t.steps_done() == 2u);  // the failed step applied nothing
    c.set_timeout(seconds(20));
    t.gradient_reduction().finish_pending();  // the late rank arrives
    BOOST_TEST(!t.gradient_reduction().pending());
  }
  c.set_timeout(seconds(20));
  c.barrier().wait();
}
