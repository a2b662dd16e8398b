// The profile module: zones, nesting, counters, flows, thread names, the run-time switch, bounded
// buffers that count what they drop, the Chrome JSON and Perfetto writers, duration statistics,
// and phase_timer as the trainer's step observer.
#define BOOST_TEST_MODULE hone_profile
#include <boost/test/unit_test.hpp>

#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <future>
#include <hone/optim/sgd.hpp>
#include <hone/profile.hpp>
#include <hone/schedule/constant.hpp>
#include <hone/train/accumulate.hpp>
#include <hone/train/trainer.hpp>
#include <iterator>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../support/linear_model.hpp"
#include "recording_sink.hpp"

namespace hp = hone::profile;
using strings = std::vector<std::string>;

namespace {

void inner_work() {
  HONE_ZONE("inner");
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::filesystem::path temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "hone_test_profile";
  std::filesystem::create_directories(dir);
  return dir / name;
}
}  // namespace

BOOST_AUTO_TEST_CASE(zones_nest_in_order_and_ends_carry_their_begins_name) {
  session s;
  {
    HONE_ZONE("outer");
    inner_work();
    {
      HONE_ZONE("second");
      inner_work();
    }
  }
  const auto r = drain(s.c);
  BOOST_TEST((r.script(this_serial()) == strings{"B:outer", "B:inner", "E:inner", "B:second",
                                                 "B:inner", "E:inner", "E:second", "E:outer"}));
  // Times never go backwards on a thread, and an outer zone covers its inner ones.
  for (std::size_t i = 1; i < r.events.size(); ++i)
    BOOST_TEST(r.events[i].ns >= r.events[i - 1].ns);
  const auto sum = s.c.summary();
  BOOST_TEST(sum.size() == 3u);
  const auto inner =
      std::find_if(sum.begin(), sum.end(), [](auto& x) { return x.name == "inner"; });
  BOOST_REQUIRE(inner != sum.end());
  BOOST_TEST(inner->count == 2u);
  BOOST_TEST(sum.front().name == "outer");  // largest total first
}

BOOST_AUTO_TEST_CASE(counters_and_flows_record_their_values) {
  session s;
  {
    HONE_ZONE("producer");
    HONE_COUNTER("queue_depth", 3);
    HONE_COUNTER("queue_depth", 2.5);
    HONE_FLOW_BEGIN("batch", 42);
  }
  {
    HONE_ZONE("consumer");
    HONE_FLOW_END("batch", 42);
  }
  const auto r = drain(s.c);
  BOOST_TEST(
      (r.script(this_serial()) == strings{"B:producer", "C:queue_depth", "C:queue_depth", ">batch",
                                          "E:producer", "B:consumer", "<batch", "E:consumer"}));
  std::vector<double> values;
  for (const auto& e : r.events) {
    if (e.kind == hp::event_kind::counter) values.push_back(std::bit_cast<double>(e.arg));
    if (e.kind == hp::event_kind::flow_out || e.kind == hp::event_kind::flow_in) {
      BOOST_TEST(e.arg == 42u);
    }
  }
  BOOST_TEST((values == std::vector<double>{3.0, 2.5}));
}

BOOST_AUTO_TEST_CASE(threads_carry_their_names_and_renames) {
  session s;
  std::uint64_t serial = 0;
  std::thread t([&] {
    hp::set_thread_name("loader");
    serial = this_serial();
    HONE_ZONE("load");
  });
  t.join();
  hp::set_thread_name("main");
  auto r = drain(s.c);
  BOOST_TEST(r.threads.at(serial).name == "loader");
  BOOST_TEST(r.threads.at(serial).tid != 0u);
  BOOST_TEST((r.script(serial) == strings{"B:load", "E:load"}));
  BOOST_TEST(r.threads.at(this_serial()).name == "main");
  hp::set_thread_name("main2");
  r = drain(s.c);
  BOOST_TEST(r.threads.at(this_serial()).name == "main2");
  // An exited thread is forgotten once its events are read: a new drain does not name it.
  BOOST_TEST(r.threads.count(serial) == 0u);
}

BOOST_AUTO_TEST_CASE(a_disabled_zone_records_nothing_and_a_zone_open_when_disabled_still_ends) {
  session s;
  hp::set_enabled(false);
  BOOST_TEST(!hp::enabled());
  {
    HONE_ZONE("off");
    HONE_COUNTER("c", 1);
  }
  hp::set_enabled(true);
  {
    HONE_ZONE("on");
    hp::set_enabled(false);
    HONE_ZONE("off_inner");
  }
  const auto r = drain(s.c);
  BOOST_TEST((r.script(this_serial()) == strings{"B:on", "E:on"}));
}

BOOST_AUTO_TEST_CASE(a_full_buffer_drops_and_counts_events_and_recovers_once_drained) {
  session s;
  {
    HONE_ZONE("main");  // the main thread holds one chunk
  }
  (void)drain(s.c);
  const std::size_t old_limit = hp::buffer_limit();
  // Three chunks in the process: the main thread's, and two (2048 events) for the worker.
  hp::set_buffer_limit(3 * sizeof(hone::profile::detail::chunk));
  std::promise<void> burst_done, go_on, after_done;
  std::uint64_t serial = 0;
  std::thread worker([&] {
    serial = this_serial();
    {
      HONE_ZONE("outer");
      for (int i = 0; i < 1500; ++i) {
        HONE_ZONE("z");
      }
    }  // 3002 events: 2048 fit, the rest (the end of "outer" too) is dropped
    burst_done.set_value();
    go_on.get_future().wait();
    {
      HONE_ZONE("after");  // the drain gave the first chunk back: recorded again
    }
    after_done.set_value();
  });
  burst_done.get_future().wait();
  auto r = drain(s.c);
  BOOST_TEST(r.script(serial).size() == 2048u);
  BOOST_TEST(s.c.dropped_events() == 3002u - 2048u);
  go_on.set_value();
  after_done.get_future().wait();
  r = drain(s.c);
  BOOST_TEST((r.script(serial) == strings{"B:after", "E:after"}));
  worker.join();
  hp::set_buffer_limit(old_limit);
}

BOOST_AUTO_TEST_CASE(a_second_collector_is_refused_with_a_sentence) {
  hp::collector first;
  try {
    hp::collector second;
    BOOST_FAIL("a second collector must throw");
  } catch (const hone::config_error& e) {
    BOOST_TEST(std::string(e.what()).find("close the running hone::profile::trace") !=
               std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(durations_become_nanoseconds_of_steady_clock) {
  session s;
  const auto t0 = std::chrono::steady_clock::now();
  {
    HONE_ZONE("sleep");
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  const auto t1 = std::chrono::steady_clock::now();
  const auto r = drain(s.c);
  BOOST_REQUIRE(r.events.size() == 2u);
  const auto ns = [](auto t) {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
  };
  // Stamps fall between the steady_clock reads around them (100 us of slack for the calibration).
  BOOST_TEST(r.events[0].ns + 100'000 >= ns(t0));
  BOOST_TEST(r.events[1].ns <= ns(t1) + 100'000);
  const double d = static_cast<double>(r.events[1].ns - r.events[0].ns);
  BOOST_TEST(d >= 29.9e6);
  BOOST_TEST(d < 200e6);
}

BOOST_AUTO_TEST_CASE(duration_stats_quantiles_are_within_a_thirty_second) {
  hp::duration_stats st;
  std::vector<std::uint64_t> v;
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(10.0, 1.5);
  for (int i = 0; i < 20000; ++i) v.push_back(static_cast<std::uint64_t>(dist(rng)));
  for (auto x : v) st.add(x);
  std::sort(v.begin(), v.end());
  for (const double q : {0.5, 0.95, 0.99}) {
    const auto exact = static_cast<double>(v[static_cast<std::size_t>(std::ceil(q * 20000)) - 1]);
    BOOST_TEST(std::abs(st.quantile(q) - exact) <= exact / 32 + 1, "q=" << q);
  }
  BOOST_TEST(st.count() == 20000u);
  BOOST_TEST(st.min() == v.front());
  BOOST_TEST(st.max() == v.back());
  // Every value lies in its bucket.
  for (std::uint64_t x : {0ull, 15ull, 16ull, 17ull, 1000ull, 123456789ull, ~0ull >> 1}) {
    const unsigned b = hp::duration_stats::bucket_of(x);
    BOOST_TEST(hp::duration_stats::lower(b) <= x);
    BOOST_TEST(x < hp::duration_stats::upper(b));
  }
}

BOOST_AUTO_TEST_CASE(summary_table_prints_every_row) {
  hp::duration_stats a;
  for (std::uint64_t x : {1000u, 2000u, 3000u}) a.add(x);
  std::ostringstream os;
  hp::print_summary(os, {hp::make_row("forward_backward", a)});
  const std::string t = os.str();
  BOOST_TEST(t.find("zone") != std::string::npos);
  BOOST_TEST(t.find("p99") != std::string::npos);
  BOOST_TEST(t.find("forward_backward") != std::string::npos);
  BOOST_TEST(t.find("6 us") != std::string::npos);  // total
  BOOST_TEST(t.find("2 us") != std::string::npos);  // mean
}

BOOST_AUTO_TEST_CASE(chrome_json_holds_pairs_counters_and_thread_names) {
  const auto path = temp_path("t.json");
  {
    hp::trace tr({.chrome_json = path, .flush_interval = std::chrono::milliseconds(0)});
    hp::set_thread_name("main \"thread\"");
    {
      HONE_ZONE("outer");
      HONE_COUNTER("loss", 0.5);
    }
    tr.close();
    BOOST_TEST(!hp::enabled());  // the trace switched recording off
  }
  const std::string j = read_text(path);
  BOOST_TEST(j.starts_with("{\"displayTimeUnit\":\"ns\",\"traceEvents\":["));
  BOOST_TEST(j.ends_with("]}\n"));
  BOOST_TEST(j.find("\"ph\":\"M\",\"name\":\"thread_name\"") != std::string::npos);
  BOOST_TEST(j.find("\"args\":{\"name\":\"main \\\"thread\\\"\"}") != std::string::npos);
  BOOST_TEST(j.find("\"ph\":\"B\",\"name\":\"outer\"") != std::string::npos);
  BOOST_TEST(j.find("\"ph\":\"E\",\"name\":\"outer\"") != std::string::npos);
  BOOST_TEST(j.find("\"ph\":\"C\",\"name\":\"loss\"") != std::string::npos);
  BOOST_TEST(j.find("\"args\":{\"value\":0.5}") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(perfetto_file_starts_with_a_sequence_clearing_packet) {
  const auto path = temp_path("t.pftrace");
  {
    hp::trace tr({.perfetto = path, .flush_interval = std::chrono::milliseconds(0)});
    { HONE_ZONE("outer"); }
    tr.flush();
    // Streamed: the packets are in the file before the trace closes.
    BOOST_TEST(std::filesystem::file_size(path) > 0u);
    tr.close();
  }
  const std::string b = read_text(path);
  BOOST_REQUIRE(b.size() > 4u);
  BOOST_TEST(static_cast<unsigned char>(b[0]) == 0x0au);  // Trace.packet: field 1, length
  // The event name is interned once, as bytes in the file.
  BOOST_TEST(b.find("outer") != std::string::npos);
  BOOST_TEST(b.find("outer") == b.rfind("outer"));
}

BOOST_AUTO_TEST_CASE(a_trace_that_cannot_create_its_file_says_which) {
  try {
    hp::trace tr({.chrome_json = "/nonexistent-dir/x.json"});
    BOOST_FAIL("must throw");
  } catch (const hone::io_error& e) {
    BOOST_TEST(std::string(e.what()).find("/nonexistent-dir/x.json") != std::string::npos);
  }
  BOOST_TEST(!hp::enabled());
  // The failed trace released the buffers: another one starts.
  hp::trace ok(
      {.chrome_json = temp_path("ok.json"), .flush_interval = std::chrono::milliseconds(0)});
}

#if defined(__linux__)
namespace {
/// How many of this process's threads run in the SCHED_IDLE class (read from /proc/self/task).
int idle_threads() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    const int tid = std::stoi(e.path().filename().string());
    if (sched_getscheduler(tid) == SCHED_IDLE) ++n;
  }
  return n;
}
}  // namespace

BOOST_AUTO_TEST_CASE(an_idle_collector_drains_from_a_sched_idle_thread) {
  const auto path = temp_path("idle.json");
  BOOST_TEST(idle_threads() == 0);
  {
    hp::trace tr({.chrome_json = path,
                  .flush_interval = std::chrono::milliseconds(1),
                  .idle_collector = true});
    BOOST_TEST(idle_threads() == 1);  // the drain thread, and no other
    { HONE_ZONE("drained_by_the_idle_thread"); }
    // No flush(): the background thread alone writes the zone (this test leaves cores idle).
    bool seen = false;
    for (int i = 0; i < 2000 && !seen; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      seen = read_text(path).find("drained_by_the_idle_thread") != std::string::npos;
    }
    BOOST_TEST(seen);
    tr.close();
    BOOST_TEST(idle_threads() == 0);  // joined
  }
  {
    hp::trace normal({.chrome_json = path, .flush_interval = std::chrono::milliseconds(1)});
    BOOST_TEST(idle_threads() == 0);  // the default keeps the normal class
  }
  try {
    hp::trace tr({.chrome_json = path,
                  .flush_interval = std::chrono::milliseconds(0),
                  .idle_collector = true});
    BOOST_FAIL("must throw");
  } catch (const hone::config_error& e) {
    const std::string m = e.what();
    BOOST_TEST(m.find("idle_collector") != std::string::npos);
    BOOST_TEST(m.find("flush_interval is 0") != std::string::npos);
  }
  BOOST_TEST(!hp::enabled());
}
#endif

// -- phase_timer as the trainer's step observer --

BOOST_AUTO_TEST_CASE(phase_timer_zones_follow_the_trainers_phases) {
  session s;
  linear<float> m(6);
  hone::trainer t(m, hone::sgd{}, hone::constant_lr{.base_lr = 0.05}, hp::phase_timer{},
                  hone::accumulate::by_count{});
  static_assert(std::is_same_v<decltype(t)::observer_type, hp::phase_timer>);
  const std::vector<batch> mb = {make_batch(8, 6, 1), make_batch(5, 6, 2)};
  hone::step_report last;
  for (int i = 0; i < 3; ++i) last = t.step(std::span<const batch>(mb));
  const auto r = drain(s.c);
  const strings one_step = {"B:step",
                            "B:checkpoint",
                            "E:checkpoint",
                            "B:forward_backward",
                            "E:forward_backward",
                            "B:unscale",
                            "E:unscale",
                            "B:forward_backward",
                            "E:forward_backward",
                            "B:unscale",
                            "E:unscale",
                            "B:check",
                            "E:check",
                            "B:optimizer",
                            "E:optimizer",
                            "B:checkpoint",
                            "E:checkpoint",
                            "E:step"};
  strings want;
  for (int i = 0; i < 3; ++i) want.insert(want.end(), one_step.begin(), one_step.end());
  BOOST_TEST((r.script(this_serial()) == want));

  const hp::phase_timer& pt = t.observer();
  BOOST_TEST(pt.steps() == 3u);
  BOOST_TEST(pt.steps_failed() == 0u);
  BOOST_TEST(pt.stats(hone::step_phase::forward_backward).count == 6u);
  BOOST_TEST(pt.stats(hone::step_phase::checkpoint).count == 6u);
  BOOST_TEST(pt.stats(hone::step_phase::optimizer).count == 3u);
  BOOST_TEST(pt.stats(hone::step_phase::reduce).count == 0u);
  // The phases of the last step add up to at most the step.
  double sum = 0;
  for (auto p : {hone::step_phase::checkpoint, hone::step_phase::forward_backward,
                 hone::step_phase::unscale, hone::step_phase::check, hone::step_phase::optimizer}) {
    BOOST_TEST(pt.last_step_ns(p) > 0.0);
    sum += pt.last_step_ns(p);
  }
  BOOST_TEST(sum <= pt.last_step_ns() * 1.0001);
  // The step's report carries the same times (the trainer reads them from its observer).
  for (std::size_t i = 0; i < hone::step_phase_count; ++i) {
    const auto p = static_cast<hone::step_phase>(i);
    BOOST_TEST(last.ns(p) == pt.last_step_ns(p), hone::to_string(p));
  }
  BOOST_TEST(last.ns(hone::step_phase::forward_backward) > 0.0);
  BOOST_TEST(last.ns(hone::step_phase::reduce) == 0.0);
  BOOST_TEST(last.step_ns == pt.last_step_ns());
  // Without an observer that keeps times, the report's are 0.
  linear<float> m2(6);
  hone::trainer plain(m2, hone::sgd{}, hone::constant_lr{.base_lr = 0.05});
  const hone::step_report q = plain.step(make_batch(8, 6, 1));
  BOOST_TEST(q.step_ns == 0.0);
  for (const double v : q.phase_ns) BOOST_TEST(v == 0.0);
  std::ostringstream os;
  pt.print_summary(os);
  const std::string table = os.str();
  for (const char* name :
       {"checkpoint", "forward_backward", "unscale", "check", "optimizer", "step"})
    BOOST_TEST(table.find(name) != std::string::npos, name);
  BOOST_TEST(table.find("reduce") == std::string::npos);  // a phase that never ran has no row
}

namespace {
struct throwing_linear : linear<float> {
  using linear<float>::linear;
  bool fail = false;
  float forward_backward(const batch& bt, float scale) {
    if (fail) throw std::runtime_error("model failure");
    return linear<float>::forward_backward(bt, scale);
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(phase_timer_ends_a_step_that_throws_and_the_next_step_starts_clean) {
  session s;
  throwing_linear m(6);
  hone::trainer t(m, hone::sgd{}, hone::constant_lr{.base_lr = 0.05}, hp::phase_timer{});
  const batch b = make_batch(8, 6, 3);
  m.fail = true;
  BOOST_CHECK_THROW((void)t.step(b), std::runtime_error);
  m.fail = false;
  (void)t.step(b);
  const auto r = drain(s.c);
  const strings want = {"B:step",
                        "B:checkpoint",
                        "E:checkpoint",
                        "B:forward_backward",
                        "E:forward_backward",
                        "E:step",
                        "B:step",
                        "B:checkpoint",
                        "E:checkpoint",
                        "B:forward_backward",
                        "E:forward_backward",
                        "B:unscale",
                        "E:unscale",
                        "B:check",
                        "E:check",
                        "B:optimizer",
                        "E:optimizer",
                        "B:checkpoint",
                        "E:checkpoint",
                        "E:step"};
  BOOST_TEST((r.script(this_serial()) == want));
  BOOST_TEST(t.observer().steps() == 2u);
  BOOST_TEST(t.observer().steps_failed() == 1u);
}

// -- device tracks: a device source's marks (hone/profile/cuda/zone.hpp's event pool implements
//    the interface; a fake one here) become zones on a track of their own --

namespace {
class fake_device_source final : public hp::detail::device_source {
 public:
  std::vector<hp::device_mark> ready;
  std::vector<bool> waits;
  std::uint64_t dropped_zones = 0;
  void collect(std::vector<hp::device_mark>& out, bool wait) override {
    waits.push_back(wait);
    out.insert(out.end(), ready.begin(), ready.end());
    ready.clear();
  }
  std::string track_name(std::uint64_t id) override { return "fake stream " + std::to_string(id); }
  std::uint64_t dropped() const override { return dropped_zones; }
};

/// Registers a fake device source for a scope.
struct registered {
  fake_device_source& s;
  explicit registered(fake_device_source& src) : s(src) { hp::detail::device_sources().add(&s); }
  ~registered() { hp::detail::device_sources().remove(&s); }
};
}  // namespace

BOOST_AUTO_TEST_CASE(device_marks_become_zones_on_a_track_of_their_own) {
  fake_device_source src;
  session s;
  const registered reg(src);
  s.c.set_time_offset_ns(10);
  // Track 3: a > b, nested; track 4: an end whose begin was never seen (counted as dropped).
  src.ready = {{3, true, "dev_a", 1000},
               {3, true, "dev_b", 1200},
               {3, false, nullptr, 1300},
               {3, false, nullptr, 1600},
               {4, false, nullptr, 1700}};
  src.dropped_zones = 2;
  const auto r = drain(s.c);
  BOOST_TEST(r.threads.size() >= 2u);
  const hp::thread_info* t3 = nullptr;
  for (const auto& [serial, info] : r.threads) {
    if (info.name == "fake stream 3") t3 = &r.threads.at(serial);
  }
  BOOST_REQUIRE(t3 != nullptr);
  BOOST_TEST(t3->device);
  BOOST_TEST(t3->serial > (std::uint64_t{1} << 62));  // apart from every thread's serial
  BOOST_TEST(t3->tid == (std::uint64_t{1} << 30) + (t3->serial - (std::uint64_t{1} << 62)));
  BOOST_TEST(t3->pid == hp::detail::os_process_id());
  BOOST_TEST((r.script(t3->serial) == strings{"B:dev_a", "B:dev_b", "E:dev_b", "E:dev_a"}));
  std::vector<std::uint64_t> times;
  for (const auto& e : r.events)
    if (e.serial == t3->serial) times.push_back(e.ns);
  BOOST_TEST((times == std::vector<std::uint64_t>{1010, 1210, 1310, 1610}));  // offset added
  BOOST_TEST(s.c.dropped_events() == 3u);  // the source's 2 and the unmatched end
  BOOST_TEST((src.waits == std::vector<bool>{false}));
  const auto sum = s.c.summary();
  const auto a =
      std::find_if(sum.begin(), sum.end(), [](auto& x) { return x.name == "dev_a (device)"; });
  const auto b =
      std::find_if(sum.begin(), sum.end(), [](auto& x) { return x.name == "dev_b (device)"; });
  BOOST_REQUIRE(a != sum.end());
  BOOST_REQUIRE(b != sum.end());
  BOOST_TEST(a->count == 1u);
  BOOST_TEST(a->total_ns == 600.0);
  BOOST_TEST(b->total_ns == 100.0);
  // A later drain announces the track once more only after discard(); wait is passed through.
  src.ready = {{3, true, "dev_a", 2000}, {3, false, nullptr, 2100}};
  recording_sink again;
  hp::trace_sink* sinks[] = {&again};
  s.c.drain(sinks, /*wait_device=*/true);
  BOOST_TEST(again.threads.count(t3->serial) == 0u);
  BOOST_TEST((again.script(t3->serial) == strings{"B:dev_a", "E:dev_a"}));
  BOOST_TEST(src.waits.back());
  s.c.discard();
  src.ready = {{3, true, "dev_a", 3000}, {3, false, nullptr, 3100}};
  const auto third = drain(s.c);
  BOOST_TEST(third.threads.count(t3->serial) == 1u);
}

BOOST_AUTO_TEST_CASE(device_tracks_are_named_tracks_in_both_files) {
  fake_device_source src;
  const registered reg(src);
  const auto pf = temp_path("device.pftrace");
  const auto js = temp_path("device.json");
  {
    hp::trace tr(
        {.perfetto = pf, .chrome_json = js, .flush_interval = std::chrono::milliseconds(0)});
    src.ready = {{1, true, "kernel_zone", 5000}, {1, false, nullptr, 6000}};
    tr.close();
    BOOST_TEST((src.waits.back()));  // close() waits for pending device zones
  }
  const std::string b = read_text(pf);
  BOOST_TEST(b.find("fake stream 1") != std::string::npos);
  BOOST_TEST(b.find("kernel_zone") != std::string::npos);
  const std::string j = read_text(js);
  const std::string tid = "\"tid\":" + std::to_string((std::uint64_t{1} << 30) + 1);
  BOOST_TEST(j.find("\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" +
                    std::to_string(hp::detail::os_process_id()) + "," + tid +
                    ",\"args\":{\"name\":\"fake stream 1\"}") != std::string::npos);
  BOOST_TEST(j.find("\"ph\":\"B\",\"name\":\"kernel_zone\",\"pid\":" +
                    std::to_string(hp::detail::os_process_id()) + "," + tid + ",\"ts\":5.000") !=
             std::string::npos);
}
