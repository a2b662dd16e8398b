// Checkpoint directories (atomic commit, listing, leftovers, newest-valid fallback), retention,
// and the sync/async writer (one save in flight, wait/skip, staging reuse, background errors
// thrown at the next call, through the test-only fault hook).
#define BOOST_TEST_MODULE hone_checkpoint_directory
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <hone/checkpoint/directory.hpp>
#include <hone/checkpoint/retention.hpp>
#include <hone/checkpoint/writer.hpp>
#include <hone/io/file_io.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../support/temp_dir.hpp"

namespace fs = std::filesystem;
namespace ck = hone::checkpoint;
namespace io = hone::io;

namespace {
using temp_root = hone_test::temp_dir;

void fill(ck::snapshot& s, std::uint64_t step, std::size_t n = 1000) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(step) + 0.001f * static_cast<float>(i);
  s.add(ck::files::weights, "w", {n}, v);
  s.state.step = step;
  s.state.metadata["loss"] = std::to_string(100.0 / static_cast<double>(step + 1));
}

void save_sync(const fs::path& root, std::uint64_t step) {
  ck::snapshot s;
  fill(s, step);
  (void)ck::write_snapshot(root, step, s);
}

struct hook_guard {
  ~hook_guard() { ck::write_fault_hook() = nullptr; }
};
}  // namespace

BOOST_AUTO_TEST_CASE(step_names) {
  BOOST_TEST(ck::step_dir_name(123) == "step-000000123");
  BOOST_TEST(*ck::parse_step_dir_name("step-000000123") == 123u);
  BOOST_TEST(*ck::parse_step_dir_name("step-12345678901") == 12345678901u);
  BOOST_TEST(!ck::parse_step_dir_name("step-").has_value());
  BOOST_TEST(!ck::parse_step_dir_name("step-12a").has_value());
  BOOST_TEST(!ck::parse_step_dir_name(".tmp-step-1-2").has_value());
}

BOOST_AUTO_TEST_CASE(commit_is_atomic_and_listed) {
  temp_root r;
  {
    ck::snapshot s;
    fill(s, 7);
    ck::pending_checkpoint pc = ck::pending_checkpoint::for_step(r.path, 7);
    s.write_into(pc, {});
    BOOST_TEST(fs::exists(pc.temp_path()));
    BOOST_TEST(pc.temp_path().filename().string().starts_with(".tmp-step-000000007-"));
    BOOST_TEST(ck::list_checkpoints(r.path).empty());  // not visible before commit
    pc.commit();
    BOOST_TEST(!fs::exists(pc.temp_path()));
  }
  const auto all = ck::list_checkpoints(r.path);
  BOOST_REQUIRE(all.size() == 1u);
  BOOST_TEST(all[0].step == 7u);
  BOOST_TEST(ck::verify_directory(all[0].path).ok());
  const auto st = ck::read_state(all[0].path / ck::files::state);
  BOOST_TEST(st.step == 7u);
  // An aborted (destroyed) pending checkpoint leaves nothing behind.
  { ck::pending_checkpoint pc = ck::pending_checkpoint::for_step(r.path, 8); }
  BOOST_TEST(std::distance(fs::directory_iterator(r.path), fs::directory_iterator{}) == 1);
  // Saving the same step again replaces it (in one exchange: nothing is left beside it, neither
  // the old checkpoint nor a temporary).
  const auto marker = [&] { return fs::exists(r.path / "step-000000007" / "marker.bin"); };
  std::ofstream(r.path / "step-000000007" / "marker.bin") << "from the old checkpoint";
  BOOST_TEST(marker());
  save_sync(r.path, 7);
  BOOST_TEST(!marker());
  BOOST_TEST(ck::list_checkpoints(r.path).size() == 1u);
  BOOST_TEST(ck::verify_directory(r.path / "step-000000007").ok());
  BOOST_TEST(std::distance(fs::directory_iterator(r.path), fs::directory_iterator{}) == 1);
}

BOOST_AUTO_TEST_CASE(leftovers_are_cleaned_and_live_ones_kept) {
  temp_root r;
  save_sync(r.path, 1);
  // A dead writer's temporary (pid 1 would be alive: use a pid that cannot exist).
  fs::create_directories(r.path / ".tmp-step-000000002-999999999" / "sub");
  std::ofstream(r.path / ".tmp-step-000000002-999999999" / "model.safetensors") << "partial";
  fs::create_directories(r.path / ".tmp-del-step-000000000-999999998");
  // One of a live process (init, pid 1) is left alone.
  fs::create_directories(r.path / ".tmp-step-000000003-1");
  // Our own (a previous writer in this process that failed) is removed.
  fs::create_directories(r.path / (".tmp-step-000000004-" + std::to_string(::getpid())));
  const auto removed = ck::clean_leftovers(r.path);
  BOOST_TEST(removed.size() == 3u);
  BOOST_TEST(fs::exists(r.path / ".tmp-step-000000003-1"));
  BOOST_TEST(fs::exists(r.path / "step-000000001"));
  BOOST_TEST(ck::list_checkpoints(r.path).size() == 1u);
}

BOOST_AUTO_TEST_CASE(newest_valid_falls_back_past_damage) {
  temp_root r;
  for (std::uint64_t s : {10, 20, 30}) save_sync(r.path, s);
  BOOST_TEST(ck::newest_valid(r.path)->step == 30u);
  // Damage the newest: a flipped byte in the weights.
  {
    std::fstream f(r.path / "step-000000030" / ck::files::weights,
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  std::vector<std::string> skipped;
  const auto c = ck::newest_valid(r.path, true, &skipped);
  BOOST_REQUIRE(c.has_value());
  BOOST_TEST(c->step == 20u);
  BOOST_REQUIRE(skipped.size() == 1u);
  BOOST_TEST(skipped[0].find("step-000000030") != std::string::npos);
  // A checkpoint without a MANIFEST (renamed by hand, never committed) is not valid either.
  fs::remove(r.path / "step-000000020" / ck::files::manifest);
  BOOST_TEST(ck::newest_valid(r.path)->step == 10u);
  fs::remove(r.path / "step-000000010" / ck::files::state);
  BOOST_TEST(!ck::newest_valid(r.path).has_value());
}

BOOST_AUTO_TEST_CASE(retention_keeps_last_best_and_newest_valid) {
  temp_root r;
  for (std::uint64_t s = 1; s <= 6; ++s) save_sync(r.path, s);
  // loss = 100 / (step + 1): the best (lowest) is step 6. Make step 2 the best by hand.
  {
    ck::snapshot s;
    fill(s, 2);
    s.state.metadata["loss"] = "0.5";
    (void)ck::write_snapshot(r.path, 2, s);
  }
  auto deleted = ck::apply_retention(
      r.path, {.keep_last = 2, .best_metric = "loss", .higher_is_better = false, .keep_best = 1});
  BOOST_TEST(deleted.size() == 3u);  // 1, 3, 4
  std::vector<std::uint64_t> left;
  for (const auto& c : ck::list_checkpoints(r.path)) left.push_back(c.step);
  BOOST_TEST((left == std::vector<std::uint64_t>{2, 5, 6}));
  // The newest valid checkpoint survives even a policy that would delete it: damage 5 and 6, then
  // keep only the last one (6, damaged): 2 is the newest valid and stays.
  for (const char* d : {"step-000000005", "step-000000006"}) fs::remove(r.path / d / "MANIFEST");
  deleted = ck::apply_retention(r.path, {.keep_last = 1});
  left.clear();
  for (const auto& c : ck::list_checkpoints(r.path)) left.push_back(c.step);
  BOOST_TEST((left == std::vector<std::uint64_t>{2, 6}));
  // keep_last = 0 keeps everything.
  BOOST_TEST(ck::apply_retention(r.path, {}).empty());
  // Nothing left as a temporary.
  for (const auto& e : fs::directory_iterator(r.path)) {
    BOOST_TEST(!e.path().filename().string().starts_with(".tmp-"));
  }
}

BOOST_AUTO_TEST_CASE(sync_writer_with_retention) {
  temp_root r;
  ck::checkpoint_writer w(
      {.root = r.path / "run", .retention = ck::retention_policy{.keep_last = 2}});
  for (std::uint64_t s = 1; s <= 5; ++s) {
    BOOST_TEST(w.save(s, [&](ck::snapshot& snap) { fill(snap, s); }));
  }
  BOOST_TEST(w.saves_committed() == 5u);
  BOOST_TEST(ck::list_checkpoints(r.path / "run").size() == 2u);
  BOOST_TEST(ck::newest_valid(r.path / "run")->step == 5u);
  BOOST_TEST(w.last_committed()->filename() == "step-000000005");
}

BOOST_AUTO_TEST_CASE(async_writer_wait_skip_and_staging_reuse) {
  temp_root r;
  hook_guard g;
  std::atomic<bool> release{false};
  std::atomic<int> entered{0};
  // The fault hook doubles as a way to hold the background save until the test lets it go.
  ck::write_fault_hook() = [&](const fs::path& p) {
    if (p.filename() == ck::files::weights) {
      ++entered;
      while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  {
    ck::checkpoint_writer w({.root = r.path, .async = true, .busy = ck::on_busy::skip});
    BOOST_TEST(w.save(1, [&](ck::snapshot& s) { fill(s, 1, 100000); }));
    while (entered.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    BOOST_TEST(w.busy());
    // Still running: skipped, training goes on.
    BOOST_TEST(!w.save(2, [&](ck::snapshot& s) { fill(s, 2, 100000); }));
    BOOST_TEST(w.saves_skipped() == 1u);
    release = true;
    w.wait();
    BOOST_TEST(!w.busy());
    const std::size_t cap = w.staging().capacity();
    BOOST_TEST(w.save(3, [&](ck::snapshot& s) { fill(s, 3, 100000); }));
    w.wait();
    BOOST_TEST(w.staging().capacity() == cap);  // the staging buffer is reused
    BOOST_TEST(w.saves_committed() == 2u);
  }
  std::vector<std::uint64_t> steps;
  for (const auto& c : ck::list_checkpoints(r.path)) steps.push_back(c.step);
  BOOST_TEST((steps == std::vector<std::uint64_t>{1, 3}));

  // on_busy::wait: the second save waits for the first and both are committed.
  release = false;
  entered = 0;
  temp_root r2;
  ck::checkpoint_writer w({.root = r2.path, .async = true, .busy = ck::on_busy::wait});
  BOOST_TEST(w.save(1, [&](ck::snapshot& s) { fill(s, 1); }));
  while (entered.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    release = true;
  });
  BOOST_TEST(w.save(2, [&](ck::snapshot& s) { fill(s, 2); }));
  releaser.join();
  w.wait();
  BOOST_TEST(w.saves_committed() == 2u);
  BOOST_TEST(ck::list_checkpoints(r2.path).size() == 2u);
}

BOOST_AUTO_TEST_CASE(background_errors_surface_at_the_next_call) {
  temp_root r;
  hook_guard g;
  save_sync(r.path, 1);
  ck::checkpoint_writer w({.root = r.path, .async = true});
  // A full disk while writing state.json of step 2.
  ck::write_fault_hook() = [](const fs::path& p) {
    if (p.filename() == ck::files::state) io::throw_io_error("write", p, ENOSPC);
  };
  BOOST_TEST(w.save(2, [&](ck::snapshot& s) { fill(s, 2); }));
  // Training continues; the next check() (every step) throws, naming the path and the cause.
  bool thrown = false;
  for (int i = 0; i < 5000 && !thrown; ++i) {
    try {
      w.check();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } catch (const hone::io_error& e) {
      thrown = true;
      const std::string what = e.what();
      BOOST_TEST(what.find("state.json") != std::string::npos);
      BOOST_TEST(what.find("disk full") != std::string::npos);
    }
  }
  BOOST_TEST(thrown);
  w.check();  // reported once
  // Nothing half-written is visible; the earlier checkpoint is intact.
  BOOST_TEST(ck::list_checkpoints(r.path).size() == 1u);
  BOOST_TEST(ck::newest_valid(r.path)->step == 1u);
  // A permission error (EACCES: root ignores modes, so it is injected) on the next save is
  // thrown by save() itself in the sync writer.
  ck::write_fault_hook() = [](const fs::path& p) { io::throw_io_error("create", p, EACCES); };
  ck::checkpoint_writer sw({.root = r.path});
  BOOST_CHECK_THROW(sw.save(3, [&](ck::snapshot& s) { fill(s, 3); }), hone::io_error);
  ck::write_fault_hook() = nullptr;
  BOOST_TEST(sw.save(4, [&](ck::snapshot& s) { fill(s, 4); }));
  for (const auto& e : fs::directory_iterator(r.path)) {
    BOOST_TEST(!e.path().filename().string().starts_with(".tmp-"));
  }
}

BOOST_AUTO_TEST_CASE(a_fill_callback_may_ask_the_writer_about_itself) {
  temp_root r;
  for (const bool async : {false, true}) {
    ck::checkpoint_writer w({.root = r.path / (async ? "async" : "sync"), .async = async});
    for (std::uint64_t step = 1; step <= 3; ++step) {
      BOOST_TEST(w.save(step, [&](ck::snapshot& s) {
        w.check();  // these took the writer's lock, held during fill: a deadlock
        BOOST_TEST(!w.busy());
        (void)w.saves_committed();
        BOOST_CHECK_THROW((void)w.save(99, [](ck::snapshot&) {}), hone::config_error);
        fill(s, step);
      }));
    }
    w.wait();
    BOOST_TEST(w.saves_committed() == 3u);
  }
}

BOOST_AUTO_TEST_CASE(a_background_error_is_never_dropped) {
  temp_root r;
  hook_guard g;
  ck::write_fault_hook() = [](const fs::path& p) {
    if (p.filename() == ck::files::state) io::throw_io_error("write", p, ENOSPC);
  };
  // Destroyed without anyone checking: the error reaches on_unobserved_error.
  std::string reported;
  {
    ck::checkpoint_writer w(
        {.root = r.path / "a", .async = true, .on_unobserved_error = [&](std::exception_ptr e) {
           try {
             std::rethrow_exception(e);
           } catch (const hone::io_error& x) {
             reported = x.what();
           }
         }});
    BOOST_TEST(w.save(1, [&](ck::snapshot& s) { fill(s, 1); }));
  }
  BOOST_TEST(reported.find("state.json") != std::string::npos, reported);
  // close() waits and throws it.
  ck::checkpoint_writer w({.root = r.path / "b", .async = true});
  BOOST_TEST(w.save(1, [&](ck::snapshot& s) { fill(s, 1); }));
  BOOST_CHECK_THROW(w.close(), hone::io_error);
  BOOST_CHECK_THROW((void)w.save(2, [&](ck::snapshot& s) { fill(s, 2); }), hone::config_error);
}
