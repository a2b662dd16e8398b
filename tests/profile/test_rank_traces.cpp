// Traces of several processes on one time line: the collector's time offset, rank-tagged
// Perfetto and Chrome JSON files (their own packet sequence, track ids and pid), and the merge of
// several files into one, including the refusal of a file cut short. The multi-process run is
// test_mpi_trace (tests/dist), checked with Perfetto's own schema by rank_traces_check.py.
#define BOOST_TEST_MODULE hone_profile_rank_traces
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <hone/io/json.hpp>
#include <hone/profile/merge.hpp>
#include <hone/profile/trace.hpp>

#include "../support/temp_dir.hpp"
#include "recording_sink.hpp"

namespace hp = hone::profile;
namespace fs = std::filesystem;
namespace json = hone::io::json;

namespace {

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

/// Records one "work" zone and returns the begin time the sink saw, with the collector's offset.
std::uint64_t zone_time_with_offset(std::int64_t offset) {
  hp::collector c;
  c.discard();
  c.set_time_offset_ns(offset);
  hp::set_enabled(true);
  { HONE_ZONE("work"); }
  hp::set_enabled(false);
  const recording_sink s = drain(c);
  BOOST_TEST_REQUIRE(s.events.size() == 2u);
  return s.events.front().ns;
}

/// Writes the traces of `rank`: a named thread with nested zones and a counter.
void write_rank_trace(const fs::path& dir, int rank) {
  hp::trace t({.perfetto = dir / ("rank" + std::to_string(rank) + ".pftrace"),
               .chrome_json = dir / ("rank" + std::to_string(rank) + ".json"),
               .flush_interval = std::chrono::milliseconds(0),
               .rank = rank});
  hp::set_thread_name("main");
  {
    HONE_ZONE("step");
    HONE_ZONE("inner");
    HONE_COUNTER("loss", 1.5 + rank);
  }
  t.close();
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_collector_offset_moves_every_time_and_clamps_at_zero) {
  // Stamps are TSC ticks converted with a calibration: they agree with steady_clock to well
  // within a millisecond, not to the nanosecond.
  constexpr std::uint64_t slack = 1'000'000;
  const auto within = [&](std::uint64_t t, std::uint64_t lo, std::uint64_t hi) {
    return t + slack >= lo && t <= hi + slack;
  };
  // Each time is taken between two readings of the clock (sequenced: arguments are not).
  const auto bracket = [&](std::int64_t offset, std::uint64_t shift_up, std::uint64_t shift_down) {
    const std::uint64_t lo = now_ns();
    const std::uint64_t t = zone_time_with_offset(offset);
    const std::uint64_t hi = now_ns();
    return within(t, lo + shift_up - shift_down, hi + shift_up - shift_down);
  };
  BOOST_TEST(bracket(0, 0, 0));
  constexpr std::int64_t ahead = 1'000'000'000'000;  // 1000 s
  BOOST_TEST(bracket(ahead, static_cast<std::uint64_t>(ahead), 0));
  constexpr std::uint64_t back = 5'000'000'000;  // 5 s earlier
  BOOST_TEST(bracket(-static_cast<std::int64_t>(back), 0, back));
  // An offset larger than the clock's reading gives 0, not a wrapped time.
  BOOST_TEST(zone_time_with_offset(INT64_MIN) == 0u);
  BOOST_TEST(zone_time_with_offset(-static_cast<std::int64_t>(now_ns()) - 1'000'000'000) == 0u);
}

BOOST_AUTO_TEST_CASE(rank_traces_merge_into_one_file) {
  hone_test::temp_dir dir;
  for (int r = 0; r < 3; ++r) write_rank_trace(dir.path, r);
  std::vector<fs::path> pf, js;
  std::uintmax_t total = 0;
  for (int r = 0; r < 3; ++r) {
    pf.push_back(dir.path / ("rank" + std::to_string(r) + ".pftrace"));
    js.push_back(dir.path / ("rank" + std::to_string(r) + ".json"));
    total += fs::file_size(pf.back());
  }
  // Perfetto: the concatenation, byte for byte (each input's packets whole).
  hp::merge_perfetto_traces(pf, dir.path / "all.pftrace");
  std::string want;
  for (const auto& p : pf) want += read_text(p);
  BOOST_TEST(fs::file_size(dir.path / "all.pftrace") == total);
  BOOST_TEST((read_text(dir.path / "all.pftrace") == want));
  // Chrome JSON: every event of every file, pid = the rank, a process_name per rank.
  hp::merge_chrome_json_traces(js, dir.path / "all.json");
  const json::value doc = json::parse(read_text(dir.path / "all.json"), "all.json");
  std::size_t events_in = 0;
  for (const auto& p : js) {
    events_in += json::parse(read_text(p), p.string()).at("traceEvents").as_array().size();
  }
  const auto& events = doc.at("traceEvents").as_array();
  BOOST_TEST(events.size() == events_in);
  std::set<std::uint64_t> pids, named;
  std::size_t begins = 0;
  for (const auto& e : events) {
    pids.insert(e.at("pid").as_u64());
    const std::string& ph = e.at("ph").as_string();
    if (ph == "M" && e.at("name").as_string() == "process_name") {
      named.insert(e.at("pid").as_u64());
      BOOST_TEST(e.at("args").at("name").as_string().rfind(
                     "rank " + std::to_string(e.at("pid").as_u64()) + " (pid ", 0) == 0u);
    }
    if (ph == "B") ++begins;
  }
  BOOST_TEST((pids == std::set<std::uint64_t>{0, 1, 2}));
  BOOST_TEST((named == std::set<std::uint64_t>{0, 1, 2}));
  BOOST_TEST(begins == 6u);  // step and inner, per rank
}

BOOST_AUTO_TEST_CASE(a_trace_cut_short_is_refused_and_nothing_is_written) {
  hone_test::temp_dir dir;
  write_rank_trace(dir.path, 0);
  write_rank_trace(dir.path, 1);
  const fs::path good = dir.path / "rank0.pftrace", cut = dir.path / "rank1.pftrace";
  fs::resize_file(cut, fs::file_size(cut) - 3);
  const fs::path inputs[] = {good, cut};
  const fs::path out = dir.path / "all.pftrace";
  try {
    hp::merge_perfetto_traces(inputs, out);
    BOOST_FAIL("a trace cut short must be refused");
  } catch (const hone::checkpoint_error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find(cut.string()) != std::string::npos, what);
    BOOST_TEST(what.find("runs past the end") != std::string::npos, what);
  }
  BOOST_TEST(!fs::exists(out));
  // Not a trace at all: the first byte is not a packet's tag.
  std::ofstream(dir.path / "text.pftrace") << "hello";
  const fs::path text[] = {dir.path / "text.pftrace"};
  BOOST_CHECK_THROW(hp::merge_perfetto_traces(text, out), hone::checkpoint_error);
  // Chrome JSON: not JSON, or JSON without traceEvents, names the file.
  std::ofstream(dir.path / "bad.json") << "{\"traceEvents\": [";
  std::ofstream(dir.path / "other.json") << "{\"events\": []}";
  for (const char* name : {"bad.json", "other.json"}) {
    const fs::path in[] = {dir.path / name};
    try {
      hp::merge_chrome_json_traces(in, dir.path / "all.json");
      BOOST_FAIL("must be refused");
    } catch (const hone::checkpoint_error& e) {
      BOOST_TEST(std::string(e.what()).find(name) != std::string::npos, e.what());
    }
  }
  BOOST_TEST(!fs::exists(dir.path / "all.json"));
  BOOST_CHECK_THROW(hp::merge_perfetto_traces(std::span<const fs::path>{}, out),
                    hone::config_error);
  BOOST_CHECK_THROW(hp::trace({.rank = -2}), hone::config_error);
}

BOOST_AUTO_TEST_CASE(threads_named_before_a_trace_starts_keep_their_names_in_it) {
  // A trace discards what was recorded before it; the names of the threads that exist already
  // (a checkpoint writer's thread started before the trace) must still reach its files.
  std::thread named([] { hp::set_thread_name("started-before"); });
  named.join();  // exited: forgotten once drained, but its name must be seen by the next drain
  std::atomic<bool> stop{false}, ready{false};
  std::thread alive([&] {
    hp::set_thread_name("alive-before");
    ready = true;
    while (!stop) std::this_thread::yield();
  });
  while (!ready) std::this_thread::yield();
  hp::collector c;
  c.discard();  // what hone::profile::trace does when it starts
  const recording_sink s = drain(c);
  stop = true;
  alive.join();
  bool found = false;
  for (const auto& [serial, t] : s.threads) found = found || t.name == "alive-before";
  BOOST_TEST(found, "the name of a thread named before the trace reaches the sink");
}
