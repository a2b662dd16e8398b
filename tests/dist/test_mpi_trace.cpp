// One trace per rank on one time base, merged into one file (run under mpirun with 2 and 3
// ranks). Every rank estimates its clock offset to rank 0 (hone::dist::estimate_clock_offset_ns),
// writes a Perfetto and a Chrome JSON trace tagged with its rank, with an "after_barrier" zone
// right after each of 5 barriers; rank 0 merges the files into merged.pftrace and merged.json in
// $HONE_TEST_TRACE_DIR. tests/profile/rank_traces_check.py (the next CTest) reads the merged
// files with Perfetto's own schema and checks that the zones of each barrier line up across ranks.
#define BOOST_TEST_MODULE hone_dist_mpi_trace
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <hone/dist/clock.hpp>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <hone/profile/merge.hpp>
#include <hone/profile/trace.hpp>
#include <string>
#include <thread>
#include <vector>

namespace hd = hone::dist;
namespace hp = hone::profile;
namespace fs = std::filesystem;

namespace {
struct mpi_fixture {
  hd::mpi_environment env;
};
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(mpi_fixture);

BOOST_AUTO_TEST_CASE(every_rank_traces_and_rank_0_merges) {
  hd::mpi_comm c(MPI_COMM_WORLD, std::chrono::seconds(30));
  const char* dir_env = std::getenv("HONE_TEST_TRACE_DIR");
  BOOST_TEST_REQUIRE(dir_env != nullptr, "HONE_TEST_TRACE_DIR names the output directory");
  const fs::path dir(dir_env);
  const int r = c.rank(), n = c.size();
  if (r == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  c.barrier().wait();
  const std::int64_t offset = hd::estimate_clock_offset_ns(c);
  // One host: the processes share steady_clock, so the estimate is the barrier's skew.
  BOOST_TEST(std::llabs(offset) < 50'000'000, "rank " << r << " offset " << offset << " ns");
  auto file = [&](int rank, const char* ext) {
    return dir / ("rank" + std::to_string(rank) + ext);
  };
  {
    hp::trace t({.perfetto = file(r, ".pftrace"),
                 .chrome_json = file(r, ".json"),
                 .flush_interval = std::chrono::milliseconds(0),
                 .rank = r,
                 .clock_offset_ns = offset});
    hp::set_thread_name("main");
    for (int k = 0; k < 5; ++k) {
      c.barrier().wait();
      HONE_ZONE("after_barrier");
      HONE_COUNTER("round", k);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    t.close();
  }
  c.barrier().wait();  // every rank's files are closed
  if (r == 0) {
    std::vector<fs::path> pf, js;
    for (int k = 0; k < n; ++k) {
      pf.push_back(file(k, ".pftrace"));
      js.push_back(file(k, ".json"));
    }
    hp::merge_perfetto_traces(pf, dir / "merged.pftrace");
    hp::merge_chrome_json_traces(js, dir / "merged.json");
    std::ofstream(dir / "ranks.txt") << n << "\n";
  }
  c.barrier().wait();
}
