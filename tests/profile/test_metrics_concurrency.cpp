// hone::profile::metrics_sink under several threads (label concurrency: CI runs it under
// ThreadSanitizer): four threads log scalars into a small queue (so they wait for the background
// thread often) while a fifth calls flush() and reads the counters; every scalar reaches the CSV
// and TensorBoard files, each thread's in the order it logged them.
#define BOOST_TEST_MODULE hone_profile_metrics_concurrency
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <hone/profile.hpp>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace hp = hone::profile;
namespace fs = std::filesystem;

BOOST_AUTO_TEST_CASE(threads_logging_through_a_small_queue_lose_nothing_and_keep_their_order) {
  constexpr int threads = 4;
  constexpr int per_thread = 3000;
  const fs::path dir = fs::temp_directory_path() / "hone_test_metrics_concurrency";
  fs::remove_all(dir);
  std::uint64_t stalls = 0;
  {
    hp::metrics_sink sink({.csv = dir / "m.csv",
                           .tensorboard = dir / "tb",
                           .queue_capacity = 64,
                           .flush_interval = std::chrono::milliseconds(1)});
    std::atomic<int> running{threads};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const std::string tag = "thread" + std::to_string(t);
        for (int i = 0; i < per_thread; ++i) sink.scalar(tag, i, 0.5 * i);
        running.fetch_sub(1);
      });
    }
    std::thread flusher([&] {
      while (running.load() > 0) {
        sink.flush();
        const std::uint64_t written = sink.written();  // read first: logged() only grows
        BOOST_CHECK_LE(written, sink.logged());
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
    for (auto& th : pool) th.join();
    flusher.join();
    sink.flush();
    BOOST_CHECK_EQUAL(sink.written(), std::uint64_t{threads} * per_thread);
    stalls = sink.stalls();
    sink.close();
  }
  BOOST_TEST_MESSAGE("scalar() waited for a full queue " << stalls << " times");

  std::ifstream in(dir / "m.csv");
  std::string line;
  std::getline(in, line);
  BOOST_CHECK_EQUAL(line, "step,tag,value,wall_time");
  std::map<std::string, int> next;
  int rows = 0;
  while (std::getline(in, line)) {
    ++rows;
    std::istringstream row(line);
    std::string step, tag, value;
    std::getline(row, step, ',');
    std::getline(row, tag, ',');
    std::getline(row, value, ',');
    const int s = std::stoi(step);
    BOOST_CHECK_EQUAL(s, next[tag]);
    BOOST_CHECK_EQUAL(std::stod(value), 0.5 * s);
    next[tag] = s + 1;
  }
  BOOST_CHECK_EQUAL(rows, threads * per_thread);
  BOOST_CHECK_EQUAL(next.size(), std::size_t{threads});
  for (const auto& [tag, n] : next) BOOST_CHECK_EQUAL(n, per_thread);

  // The event file: the file_version record plus one record per scalar, each 16 bytes of framing
  // around an Event.
  std::size_t records = 0;
  for (const auto& e : fs::directory_iterator(dir / "tb")) {
    std::ifstream f(e.path(), std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    const std::string b = s.str();
    std::size_t at = 0;
    while (at + 12 <= b.size()) {
      std::uint64_t n = 0;
      for (int i = 0; i < 8; ++i)
        n |= static_cast<std::uint64_t>(static_cast<unsigned char>(b[at + i])) << (8 * i);
      at += 12 + n + 4;
      ++records;
    }
    BOOST_CHECK_EQUAL(at, b.size());
  }
  BOOST_CHECK_EQUAL(records, std::size_t{threads} * per_thread + 1);
}
