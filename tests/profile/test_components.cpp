// Zones inside hone's own components: the checkpoint writer, the replay buffer, the offload engine
// and the dynamic batcher record their phases (hone.<module>.<phase>) on the thread that runs
// them, nested as documented in docs/profile.md, and their own threads carry names. Also: a
// library thread that only named itself is forgotten once it exits, collector or not.
#define BOOST_TEST_MODULE hone_profile_components
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <hone/checkpoint/writer.hpp>
#include <hone/data/loader.hpp>
#include <hone/offload/optimizer_to_host.hpp>
#include <hone/profile/collector.hpp>
#include <hone/profile/zone.hpp>
#include <hone/rl/replay_buffer.hpp>
#include <hone/serve/batcher.hpp>

#include "../offload/problem.hpp"
#include "../support/temp_dir.hpp"
#include "recording_sink.hpp"

namespace hp = hone::profile;
namespace ck = hone::checkpoint;
namespace off = hone::offload;
namespace ot = offload_test;
using strings = std::vector<std::string>;

namespace {

/// The begin/end script of the thread named `name` (exactly one such thread must have recorded).
strings script_of(const recording_sink& s, const std::string& name) {
  std::vector<std::uint64_t> serials;
  for (const auto& [serial, info] : s.threads) {
    if (info.name == name) serials.push_back(serial);
  }
  BOOST_TEST_REQUIRE(serials.size() == 1u, "threads named " << name << ": " << serials.size());
  return s.script(serials.front());
}

/// The script without counters.
strings zones_only(strings s) {
  std::erase_if(s, [](const std::string& e) { return e.rfind("C:", 0) == 0; });
  return s;
}

using step = hone::transition<hone::field<"obs", float, 3>, hone::field<"reward", float>>;

}  // namespace

BOOST_AUTO_TEST_CASE(checkpoint_writer_zones_on_the_caller_and_on_its_thread) {
  hone_test::temp_dir dir;
  std::vector<float> w(1000, 0.5f);
  {
    session s;
    {
      ck::checkpoint_writer writer({.root = dir.path / "ckpt",
                                    .async = true,
                                    .retention = ck::retention_policy{.keep_last = 1}});
      for (std::uint64_t step_no = 1; step_no <= 2; ++step_no) {
        (void)writer.save(step_no, [&](ck::snapshot& snap) {
          snap.add(ck::files::weights, "w", {w.size()}, std::span<const float>(w));
        });
        writer.wait();
      }
    }
    const recording_sink r = drain(s.c);
    // The caller stalls for save, which holds the snapshot copy; twice.
    const strings caller = r.script(this_serial());
    const strings one = {"B:hone.checkpoint.save", "B:hone.checkpoint.snapshot",
                         "E:hone.checkpoint.snapshot", "E:hone.checkpoint.save"};
    strings both = one;
    both.insert(both.end(), one.begin(), one.end());
    BOOST_TEST(caller == both, boost::test_tools::per_element());
    // The files are written on the writer's own, named thread; retention inside the write.
    const strings bg = script_of(r, "hone.checkpoint.writer");
    const strings write = {"B:hone.checkpoint.write", "B:hone.checkpoint.retention",
                           "E:hone.checkpoint.retention", "E:hone.checkpoint.write"};
    strings writes = write;
    writes.insert(writes.end(), write.begin(), write.end());
    BOOST_TEST(bg == writes, boost::test_tools::per_element());
  }
  // A synchronous writer writes on the caller, inside save (after the snapshot).
  {
    session s;
    ck::checkpoint_writer writer({.root = dir.path / "sync"});
    (void)writer.save(1, [&](ck::snapshot& snap) {
      snap.add(ck::files::weights, "w", {w.size()}, std::span<const float>(w));
    });
    const strings caller = drain(s.c).script(this_serial());
    const strings want = {"B:hone.checkpoint.save",  "B:hone.checkpoint.snapshot",
                          "E:hone.checkpoint.snapshot", "B:hone.checkpoint.write",
                          "E:hone.checkpoint.write", "E:hone.checkpoint.save"};
    BOOST_TEST(caller == want, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(replay_buffer_zones) {
  hone::replay_buffer<step, hone::prioritized<>> buffer(64);
  hone::replay_batch<step> rows;
  rows.resize(8);
  session s;
  buffer.add_batch(rows);
  step::record one{};
  buffer.add(one);  // a single add records nothing: it is too short to time
  hone::replay_batch<step> b;
  (void)buffer.sample(4, b);
  const std::vector<float> prio(b.keys().size(), 2.0f);
  (void)buffer.update_priorities(b.keys(), prio);
  const strings want = {"B:hone.replay.add_batch",        "E:hone.replay.add_batch",
                        "B:hone.replay.sample",           "E:hone.replay.sample",
                        "B:hone.replay.update_priorities", "E:hone.replay.update_priorities"};
  BOOST_TEST(drain(s.c).script(this_serial()) == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(offload_engine_zones_immediate_and_delayed) {
  const auto l = ot::layout();
  std::vector<float> params(l.total()), grads(l.total());
  for (const bool delayed : {false, true}) {
    BOOST_TEST_CONTEXT("delayed " << delayed) {
      // Several buckets: every bucket is stepped in its own zone.
      off::engine<hone::adamw, float, float> eng(
          {.bucket_bytes = (l.total() * sizeof(float) + 2) / 3, .delayed_update = delayed},
          hone::adamw{}, l);
      const std::size_t buckets = eng.buckets().size();
      BOOST_TEST_REQUIRE(buckets >= 3u);
      eng.push_params(params.data());
      session s;
      ot::backward(l, params.data(), grads.data(), 1);
      eng.step(ot::args(1), grads.data(), params.data());
      eng.flush(params.data());
      const recording_sink r = drain(s.c);
      strings want = {"B:hone.offload.step", "B:hone.offload.to_host", "E:hone.offload.to_host"};
      strings updates;
      for (std::size_t b = 0; b < buckets; ++b) {
        updates.push_back("B:hone.offload.update");
        updates.push_back("E:hone.offload.update");
      }
      if (!delayed) {
        // The host steps each bucket inside step, on the caller.
        want.insert(want.end(), updates.begin(), updates.end());
        want.push_back("E:hone.offload.step");
      } else {
        // step returns while its own thread steps the buckets; flush publishes them.
        want.push_back("E:hone.offload.step");
        want.push_back("B:hone.offload.publish");
        want.push_back("E:hone.offload.publish");
        BOOST_TEST(script_of(r, "hone.offload.host_step") == updates,
                   boost::test_tools::per_element());
      }
      BOOST_TEST(r.script(this_serial()) == want, boost::test_tools::per_element());
    }
  }
}

namespace {
struct doubler {
  std::vector<int> infer(std::span<const int> batch) {
    std::vector<int> out;
    for (const int x : batch) out.push_back(2 * x);
    return out;
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(batcher_zones_and_batch_size_counter) {
  namespace hs = hone::serve;
  doubler m;
  {
    // Manual dispatch: the batch runs in poll, on the caller.
    hs::batcher_options o;
    o.max_batch_size = 3;
    o.max_queue_delay = std::chrono::hours(1);
    o.mode = hs::dispatch_mode::manual;
    hs::dynamic_batcher<doubler, int> b(m, o);
    session s;
    std::vector<hs::dynamic_batcher<doubler, int>::handle_type> h;
    for (int i = 0; i < 3; ++i) h.push_back(b.submit(i));
    BOOST_TEST(b.poll() == 3u);
    const recording_sink r = drain(s.c);
    BOOST_TEST(r.script(this_serial()) ==
                   (strings{"B:hone.serve.batch", "C:hone.serve.batch_size", "E:hone.serve.batch"}),
               boost::test_tools::per_element());
    const auto counter = std::find_if(r.events.begin(), r.events.end(), [](const auto& e) {
      return e.kind == hp::event_kind::counter;
    });
    BOOST_TEST_REQUIRE((counter != r.events.end()));
    BOOST_TEST(std::bit_cast<double>(counter->arg) == 3.0);
  }
  {
    // Thread dispatch: the batches run on the batcher's named thread.
    hs::batcher_options o;
    o.max_batch_size = 2;
    o.max_queue_delay = std::chrono::milliseconds(1);
    session s;
    {
      hs::dynamic_batcher<doubler, int> b(m, o);
      auto h0 = b.submit(1);
      auto h1 = b.submit(2);
      BOOST_TEST(h0.future().get() == 2);
      BOOST_TEST(h1.future().get() == 4);
    }  // joined: its events are all recorded
    const strings bg = zones_only(script_of(drain(s.c), "hone.serve.dispatcher"));
    BOOST_TEST_REQUIRE(!bg.empty());
    BOOST_TEST(bg.size() % 2 == 0u);
    for (std::size_t i = 0; i < bg.size(); i += 2) {
      BOOST_TEST(bg[i] == "B:hone.serve.batch");
      BOOST_TEST(bg[i + 1] == "E:hone.serve.batch");
    }
  }
}

namespace {
struct counting {  // sample i is i
  [[nodiscard]] std::size_t size() const { return 10; }
  [[nodiscard]] std::uint64_t get(std::size_t i) const { return i; }
};
struct rows {
  std::vector<std::uint64_t> v;
};
struct put_row {
  void operator()(rows& b, std::size_t row, std::uint64_t x) const { b.v.at(row) = x; }
};
}  // namespace

BOOST_AUTO_TEST_CASE(loader_zones_on_the_consumer) {
  // threads = 0: the consumer fills every batch itself, inside next() and its wait.
  const counting ds;
  hone::data::loader l(ds, rows{std::vector<std::uint64_t>(4)}, put_row{},
                       {.batch_size = 4, .threads = 0, .prefetch = 1});
  session s;
  const auto* b = l.next();
  BOOST_TEST_REQUIRE(b != nullptr);
  BOOST_TEST(b->info.rows == 4u);
  const strings want = {"B:hone.data.next",  "B:hone.data.wait", "B:hone.data.batch",
                        "E:hone.data.batch", "E:hone.data.wait", "E:hone.data.next"};
  BOOST_TEST(drain(s.c).script(this_serial()) == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(threads_that_only_named_themselves_are_forgotten_when_they_exit) {
  // No collector runs: a thread that named itself and recorded nothing leaves no buffer behind
  // once a later thread registers (the offload engine starts a named thread per delayed step).
  auto& reg = hp::detail::registry::get();
  (void)hp::detail::this_thread_buffer();
  const std::size_t before = reg.size();
  for (int i = 0; i < 50; ++i) {
    std::thread([] { hp::set_thread_name("short-lived"); }).join();
  }
  std::thread([] { hp::set_thread_name("last"); }).join();
  BOOST_TEST(reg.size() <= before + 1);
}
