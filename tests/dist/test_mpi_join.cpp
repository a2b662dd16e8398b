// Uneven inputs under mpirun with 2 and 3 ranks (hone::data_parallel_options::uneven_inputs and
// hone::dist::join over mpi_comm): rank r has a different number of batches in each of two epochs
// and calls join when its batches are done. Checked:
//  (a) no rank hangs (CTest's TIMEOUT and the communicator's 20 s timeout are the guards);
//  (b) every rank's own steps, and its whole trainer state after each join (master weights, the
//      model's weights, step count, loss scaler), match one process accumulating at every step
//      the batches of the ranks that still had one (dp_scenario.hpp's train_reference_uneven):
//      bit for bit with 2 ranks (1 or 2 active ranks: the divisors are exact), within 1e-6 with
//      3 (steps with 3 active ranks round 1/3);
//  (c) every rank holds the same bits after each join (all-gathered and compared);
//  (d) the same with weight_by_count and batches of 8 + 5 r rows: the global count counts only
//      the samples of the ranks that had a batch (within 1e-6).
#define BOOST_TEST_MODULE hone_dist_mpi_join
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstring>
#include <hone/dist/data_parallel.hpp>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <span>
#include <vector>

#include "dp_scenario.hpp"

namespace hd = hone::dist;

namespace {
struct mpi_fixture {
  hd::mpi_environment env;
};

hd::mpi_comm make_comm() {
  return hd::mpi_comm(MPI_COMM_WORLD, std::chrono::seconds(20));
}

/// Epochs of rank r's batch counts for `ranks` ranks: rank 1 runs out first in epoch 0, rank 0
/// in epoch 1 (where the 3-rank run's rank 2 has none at all).
std::vector<std::vector<int>> uneven_steps(int ranks) {
  if (ranks == 2) return {{5, 2}, {1, 3}};
  std::vector<std::vector<int>> steps{{5, 3, 6}, {1, 3, 0}};
  for (auto& e : steps) e.resize(static_cast<std::size_t>(ranks), 2);  // more ranks: 2 each
  return steps;
}

/// All-gathers this rank's state after each join and checks that every rank holds rank 0's bits.
void check_same_state_on_every_rank(hd::mpi_comm& c, const join_run& run) {
  std::vector<double> mine;
  for (std::size_t e = 0; e < run.after_join.size(); ++e) {
    const step_record& r = run.after_join[e];
    mine.insert(mine.end(), r.master.begin(), r.master.end());
    mine.insert(mine.end(), run.model_after_join[e].begin(), run.model_after_join[e].end());
    mine.push_back(r.scale);
    mine.push_back(r.growth_tracker);
    mine.push_back(static_cast<double>(r.skipped_steps));
    mine.push_back(static_cast<double>(r.steps_done));
  }
  std::vector<double> all(mine.size() * static_cast<std::size_t>(c.size()));
  c.all_gather(std::span<const double>(mine), std::span<double>(all)).wait();
  for (int q = 1; q < c.size(); ++q) {
    const bool same = std::memcmp(all.data() + mine.size() * static_cast<std::size_t>(q),
                                  all.data(), mine.size() * sizeof(double)) == 0;
    BOOST_TEST(same, "rank " << q << "'s state after the joins differs from rank 0's");
  }
}

void check_against_reference(hd::mpi_comm& c, const scenario& sc, double tol) {
  const auto steps = uneven_steps(c.size());
  const join_run run = train_replica_uneven(c, sc, steps);
  check_same_state_on_every_rank(c, run);
  const uneven_reference ref = train_reference_uneven(sc, steps);
  const auto r = static_cast<std::size_t>(c.rank());
  double worst = 0;
  for (std::size_t e = 0; e < steps.size(); ++e) {
    const auto start = static_cast<std::size_t>(epoch_start(steps, e));
    const int longest = *std::max_element(steps[e].begin(), steps[e].end());
    BOOST_TEST_REQUIRE(run.epochs[e].size() == static_cast<std::size_t>(steps[e][r]));
    for (std::size_t s = 0; s < run.epochs[e].size(); ++s) {
      const step_record& want = ref.steps[start + s];
      BOOST_TEST(run.epochs[e][s].skipped == want.skipped, "step " << start + s);
      BOOST_TEST(run.epochs[e][s].scale == want.scale, "step " << start + s);
      if (tol == 0) BOOST_TEST(same_bits(run.epochs[e][s].master, want.master), "step " << s);
      worst = std::max(worst, max_abs_diff(run.epochs[e][s].master, want.master));
    }
    const step_record& want = ref.steps[start + static_cast<std::size_t>(longest) - 1];
    const step_record& got = run.after_join[e];
    if (tol == 0) {
      BOOST_TEST(same_bits(got.master, want.master), "after join " << e);
      BOOST_TEST(same_bits(run.model_after_join[e], ref.model_at_end[e]), "after join " << e);
    }
    worst = std::max(worst, max_abs_diff(got.master, want.master));
    BOOST_TEST(got.steps_done == want.steps_done, "after join " << e);
    BOOST_TEST(got.scale == want.scale, "after join " << e);
    BOOST_TEST(got.skipped_steps == want.skipped_steps, "after join " << e);
    BOOST_TEST(run.reports[e].shadowed_steps == static_cast<std::uint64_t>(longest - steps[e][r]));
  }
  BOOST_TEST_MESSAGE("rank " << c.rank() << ": largest difference to one process " << worst);
  BOOST_TEST(worst <= tol);
}
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(mpi_fixture);

BOOST_AUTO_TEST_CASE(uneven_ranks_join_and_match_one_process_over_the_active_ranks_batches) {
  auto c = make_comm();
  check_against_reference(c, scenario{}, c.size() == 2 ? 0.0 : 1e-6);
}

BOOST_AUTO_TEST_CASE(uneven_ranks_weighted_by_count_count_only_the_samples_that_exist) {
  auto c = make_comm();
  scenario sc{};
  sc.extra_rows_per_rank = 5;
  sc.weight_by_count = true;
  check_against_reference(c, sc, 1e-6);
}
