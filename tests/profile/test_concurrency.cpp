// The profile module under several threads (label concurrency: CI runs it under ThreadSanitizer):
// threads record zones, counters and renames while a collector drains them, while recording is
// switched on and off, and while a hone::profile::trace streams to files from its own thread.
// Every thread's events arrive complete and in order.
#define BOOST_TEST_MODULE hone_profile_concurrency
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <hone/profile.hpp>
#include <string>
#include <thread>
#include <vector>

#include "recording_sink.hpp"

namespace hp = hone::profile;

namespace {
constexpr int threads = 4;
constexpr int iterations = 5000;

/// What each worker records: per iteration outer{inner} and a counter (5 events).
void work(int id, std::atomic<int>& ready, std::uint64_t& serial) {
  serial = hone::profile::detail::this_thread_buffer()->serial;
  hp::set_thread_name("worker " + std::to_string(id));
  ready.fetch_add(1);
  for (int i = 0; i < iterations; ++i) {
    HONE_ZONE("outer");
    { HONE_ZONE("inner"); }
    HONE_COUNTER("i", i);
    if (i % 1000 == 0)
      hp::set_thread_name("worker " + std::to_string(id) + "." + std::to_string(i));
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(every_threads_events_arrive_complete_and_in_order_while_draining) {
  hp::collector c;
  c.discard();
  hp::set_enabled(true);
  std::atomic<int> ready{0};
  std::vector<std::uint64_t> serials(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] { work(t, ready, serials[static_cast<std::size_t>(t)]); });
  }
  recording_sink all;
  hp::trace_sink* sinks[] = {&all};
  while (ready.load() < threads) std::this_thread::yield();
  std::atomic<bool> done{false};
  std::thread joiner([&] {
    for (auto& th : pool) th.join();
    done.store(true);
  });
  while (!done.load()) c.drain(sinks);  // concurrently with the writers
  joiner.join();
  c.drain(sinks);  // the rest, and the exited threads are forgotten
  hp::set_enabled(false);

  BOOST_TEST(c.dropped_events() == 0u);
  for (int t = 0; t < threads; ++t) {
    const auto s = all.script(serials[static_cast<std::size_t>(t)]);
    BOOST_REQUIRE(s.size() == std::size_t{5} * iterations);
    bool ordered = true;
    for (std::size_t i = 0; i < s.size(); i += 5) {
      ordered = ordered && s[i] == "B:outer" && s[i + 1] == "B:inner" && s[i + 2] == "E:inner" &&
                s[i + 3] == "C:i" && s[i + 4] == "E:outer";
    }
    BOOST_TEST(ordered);
    BOOST_TEST(all.threads.at(serials[static_cast<std::size_t>(t)]).name.starts_with("worker"));
  }
  const auto sum = c.summary();
  BOOST_REQUIRE(sum.size() == 2u);
  BOOST_TEST(sum[0].count == std::uint64_t{threads} * iterations);
}

BOOST_AUTO_TEST_CASE(a_trace_streams_from_its_thread_while_recording_is_switched) {
  const auto dir = std::filesystem::temp_directory_path() / "hone_test_profile_concurrency";
  std::filesystem::create_directories(dir);
  hp::trace tr({.perfetto = dir / "c.pftrace",
                .chrome_json = dir / "c.json",
                .flush_interval = std::chrono::milliseconds(1)});
  std::atomic<bool> stop{false};
  std::thread toggler([&] {
    for (int i = 0; !stop.load(); ++i) {
      hp::set_enabled(i % 2 == 0);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      hp::set_thread_name("w" + std::to_string(t));
      for (int i = 0; i < iterations; ++i) {  // at most 25 chunks per thread: nothing dropped
        HONE_ZONE("a");
        HONE_ZONE("b");
        HONE_COUNTER("c", 1);
      }
    });
  }
  for (auto& th : pool) th.join();
  stop.store(true);
  toggler.join();
  hp::set_enabled(true);
  { HONE_ZONE("last"); }
  tr.close();
  BOOST_TEST(tr.dropped_events() == 0u);
  const auto sum = tr.summary();
  bool last_seen = false;
  for (const auto& r : sum) last_seen = last_seen || (r.name == "last" && r.count == 1);
  BOOST_TEST(last_seen);
  BOOST_TEST(std::filesystem::file_size(dir / "c.pftrace") > 0u);
}
