// tests/dist/mpi_scenario.hpp: what the mpirun tests of the data-parallel scenario share
// (test_mpi_data_parallel, test_mpi_zero): the MPI environment as a global fixture, a communicator
// whose collectives time out after 20 s (a failing check on one rank must not leave the others
// waiting for ever), and the check that every rank holds rank 0's bits after every step.
#pragma once

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstring>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <span>
#include <vector>

#include "dp_scenario.hpp"

namespace mpi_scenario {
namespace hd = hone::dist;

struct mpi_fixture {
  hd::mpi_environment env;
};

// A failing check on one rank must not leave the others waiting for ever: 20 s, then an error.
inline hd::mpi_comm make_comm() {
  return hd::mpi_comm(MPI_COMM_WORLD, std::chrono::seconds(20));
}

/// One step's record as doubles (the fp32 weights and the scaler's state exactly, the norm's
/// bits), to be compared across ranks.
inline std::vector<double> flatten(const step_record& r) {
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
inline void check_identical_on_every_rank(hd::mpi_comm& c, const std::vector<step_record>& run) {
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
}  // namespace mpi_scenario
