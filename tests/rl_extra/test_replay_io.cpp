// Tests of hone::save_replay_buffer / hone::load_replay_buffer: a loaded buffer continues exactly
// as the saved one (the original buffer, continuing, is the reference), for uniform, prioritized
// and n-step buffers; mismatched buffers and every kind of damage are checkpoint_errors that
// leave the buffer unchanged; leftovers of killed saves are ignored and cleaned; a save taken
// while many writers add is a consistent snapshot; and a child saving in a loop, SIGKILLed at
// random moments, always leaves a save that loads. Every test runs on both in-memory storages
// (hone::ring_storage's columns, hone::packed_storage's records); a columns save and a packed save
// of the same buffer are the same files, byte for byte, and each loads into the other storage.
#define BOOST_TEST_MODULE hone_rl_extra_replay_io
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/mpl/list.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <hone/checkpoint/manifest.hpp>
#include <hone/io/hash.hpp>
#include <hone/rl/packed_storage.hpp>
#include <hone/rl/replay_buffer.hpp>
#include <hone/rl/replay_io.hpp>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "replay_test_common.hpp"

namespace fs = std::filesystem;
using namespace replay_test;

namespace {

// Every test runs on both in-memory storages: they save the same file and load each other's.
using storages = boost::mpl::list<hone::ring_storage, hone::packed_storage>;

template <class Storage>
using uniform_on = hone::replay_buffer<step, Storage>;
template <class Storage>
using per_on = hone::replay_buffer<step, Storage, hone::prioritized<>>;

template <class Buffer>
void add_keys(Buffer& b, std::uint64_t n) {
  for (std::uint64_t k = 0; k < n; ++k) b.add(record_for(b.total_added()));
}

// One step of the common future: add a few, sample, update priorities from the batch.
template <class Buffer>
void future_step(Buffer& b, int i, typename Buffer::batch_type& out) {
  add_keys(b, static_cast<std::uint64_t>(3 + i % 5));
  b.sample(32, out);
  if constexpr (Buffer::is_prioritized) {
    std::vector<float> td(out.size());
    for (std::size_t r = 0; r < td.size(); ++r) {
      td[r] = static_cast<float>((out.keys()[r] * 2654435761u) % 1000) / 250.0f;
    }
    b.update_priorities(out.keys(), td);
  }
}

// Saves `a`, loads into a fresh buffer with another seed, then checks that both produce
// identical batches, keys and weights for 40 steps of the same adds/samples/updates.
template <class Buffer, class... Policies>
void check_identical_future(Buffer& a, const fs::path& dir, std::size_t capacity,
                            const Policies&... policies) {
  hone::save_replay_buffer(a, dir);
  Buffer b(capacity, policies...);
  b.seed(987654321);  // the load must bring the RNG back
  hone::load_replay_buffer(b, dir);
  BOOST_TEST(b.total_added() == a.total_added());
  BOOST_TEST(b.size() == a.size());
  BOOST_TEST(b.state().rng == a.state().rng);
  BOOST_TEST(b.state().sample_calls == a.state().sample_calls);
  typename Buffer::batch_type ba, bb;
  bool all_same = true;
  bool rows_ok = true;
  for (int i = 0; i < 40; ++i) {
    future_step(a, i, ba);
    future_step(b, i, bb);
    all_same = all_same && same_batch(ba, bb);
    for (std::size_t r = 0; r < bb.size(); ++r) rows_ok = rows_ok && row_matches_key(bb, r);
  }
  BOOST_TEST(all_same, "the loaded buffer diverged from the original");
  BOOST_TEST(rows_ok, "a sampled row is not the record of its key");
  if constexpr (Buffer::is_prioritized) {
    const auto pa = a.priorities();
    const auto pb = b.priorities();
    BOOST_TEST(std::memcmp(pa.data(), pb.data(), pa.size_bytes()) == 0);
  }
}

// A fingerprint of everything a load could change: state, every field of every slot (read the
// same way from either storage), priorities.
template <class Buffer>
std::string fingerprint(Buffer& b) {
  std::string s;
  const hone::replay_state st = b.state();
  s += std::to_string(st.written) + "/" + std::to_string(st.sample_calls) + "/" +
       std::to_string(st.max_priority) + "/";
  for (auto w : st.rng) s += std::to_string(w) + ",";
  for (std::size_t f = 0; f < Buffer::transition_type::field_count; ++f) {  // every slot's bytes
    std::vector<std::byte> bytes(b.capacity() * Buffer::field_bytes(f));
    b.read_field(f, 0, bytes);
    s += hone::io::hex64(hone::io::hash64(bytes)) + ";";
  }
  if constexpr (Buffer::is_prioritized) {
    s += hone::io::hex64(hone::io::hash64(std::as_bytes(b.priorities())));
  }
  return s;
}

// Rewrites the MANIFEST entry of `name` after a deliberate edit (a damage the hashes cannot see,
// for the semantic checks).
void rehash(const fs::path& dir, const std::string& name) {
  auto m = hone::checkpoint::manifest::read(dir / "MANIFEST");
  m.add(name, hone::io::hash_file(dir / name));
  m.write(dir / "MANIFEST");
}

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(uniform_round_trip_continues_identically, Storage, storages) {
  temp_dir tmp("replay_io");
  constexpr std::size_t cap = 100;
  uniform_on<Storage> a(cap);
  a.seed(11);
  add_keys(a, 250);  // wrapped twice
  typename uniform_on<Storage>::batch_type batch;
  a.sample(16, batch);
  check_identical_future(a, tmp.path / "replay", cap);
  // A partly filled buffer too (empty slots are saved as zeros, positions below capacity).
  uniform_on<Storage> c(cap);
  add_keys(c, 37);
  check_identical_future(c, tmp.path / "partial", cap);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(prioritized_round_trip_continues_identically, Storage, storages) {
  temp_dir tmp("replay_io");
  constexpr std::size_t cap = 128;
  const hone::prioritized<> cfg{.alpha = 0.7, .beta = 0.5, .beta_steps = 50};
  per_on<Storage> a(cap, Storage{}, cfg);
  a.seed(5);
  typename per_on<Storage>::batch_type batch;
  for (int i = 0; i < 30; ++i) future_step(a, i, batch);  // priorities, max, beta steps move
  BOOST_TEST(a.state().max_priority != 1.0f);
  check_identical_future(a, tmp.path / "replay", cap, Storage{}, cfg);
  // Saving again over the previous save replaces it (the second save is what loads).
  hone::save_replay_buffer(a, tmp.path / "replay");
  per_on<Storage> b(cap, Storage{}, cfg);
  hone::load_replay_buffer(b, tmp.path / "replay");
  BOOST_TEST(fingerprint(b) == fingerprint(a));
  std::size_t siblings = 0;
  for (const auto& e : fs::directory_iterator(tmp.path)) {
    (void)e;
    ++siblings;
  }
  BOOST_TEST(siblings == 1u);  // no temporary left behind
}

BOOST_AUTO_TEST_CASE_TEMPLATE(n_step_buffer_refuses_pending_steps_and_round_trips_at_a_boundary,
                              Storage, storages) {
  temp_dir tmp("replay_io");
  using nbuf = hone::replay_buffer<step, Storage, hone::n_step<3>, hone::prioritized<>>;
  nbuf a(64);
  record r = record_for(0);
  hone::get<"terminated">(r) = false;
  a.add(r);
  a.add(r);
  BOOST_TEST(a.pending() == 2u);
  const std::string e = error_text([&] { hone::save_replay_buffer(a, tmp.path / "n"); });
  BOOST_TEST(contains_text(e, "config_error"), e);
  BOOST_TEST(contains_text(e, "pending"), e);
  BOOST_TEST(!fs::exists(tmp.path / "n"));
  hone::get<"terminated">(r) = true;  // the episode ends: the window empties
  a.add(r);
  BOOST_TEST(a.pending() == 0u);
  hone::save_replay_buffer(a, tmp.path / "n");
  nbuf b(64);
  hone::load_replay_buffer(b, tmp.path / "n");
  BOOST_TEST(fingerprint(b) == fingerprint(a));
  BOOST_TEST(b.total_added() == 3u);
  // Loading into a buffer whose window holds steps is refused too (its steps would mix in).
  nbuf c(64);
  hone::get<"terminated">(r) = false;
  c.add(r);
  const std::string before = fingerprint(c);
  const std::string e2 = error_text([&] { hone::load_replay_buffer(c, tmp.path / "n"); });
  BOOST_TEST(contains_text(e2, "pending"), e2);
  BOOST_TEST(fingerprint(c) == before);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(mismatched_buffers_are_clear_errors_and_unchanged, Storage,
                              storages) {
  temp_dir tmp("replay_io");
  per_on<Storage> a(64);
  add_keys(a, 80);
  hone::save_replay_buffer(a, tmp.path / "p");
  uniform_on<Storage> u(64);
  add_keys(u, 10);
  hone::save_replay_buffer(u, tmp.path / "u");

  per_on<Storage> wrong_cap(65);
  add_keys(wrong_cap, 5);
  std::string before = fingerprint(wrong_cap);
  std::string e = error_text([&] { hone::load_replay_buffer(wrong_cap, tmp.path / "p"); });
  BOOST_TEST(contains_text(e, "checkpoint_error"), e);
  BOOST_TEST(contains_text(e, "capacity 64, this buffer 65"), e);
  BOOST_TEST(contains_text(e, "state.json"), e);
  BOOST_TEST(fingerprint(wrong_cap) == before);

  per_on<Storage> per(64);
  before = fingerprint(per);
  e = error_text([&] { hone::load_replay_buffer(per, tmp.path / "u"); });
  BOOST_TEST(contains_text(e, "uniform sampler, this buffer a prioritized"), e);
  BOOST_TEST(fingerprint(per) == before);

  uniform_on<Storage> uni(64);
  e = error_text([&] { hone::load_replay_buffer(uni, tmp.path / "p"); });
  BOOST_TEST(contains_text(e, "prioritized sampler, this buffer a uniform"), e);

  // Another transition: a field with another dtype, and one with another shape.
  using other_dtype =
      hone::transition<hone::field<"obs", double, 4>, hone::field<"action", std::int32_t>,
                       hone::field<"reward", float>, hone::field<"next_obs", float, 4>,
                       hone::field<"terminated", bool>, hone::field<"truncated", bool>,
                       hone::field<"discount", float>>;
  hone::replay_buffer<other_dtype, Storage, hone::prioritized<>> od(64);
  e = error_text([&] { hone::load_replay_buffer(od, tmp.path / "p"); });
  BOOST_TEST(contains_text(e, "obs F32 [4]"), e);
  BOOST_TEST(contains_text(e, "obs F64 [4]"), e);
  using other_shape =
      hone::transition<hone::field<"obs", float, 2, 2>, hone::field<"action", std::int32_t>,
                       hone::field<"reward", float>, hone::field<"next_obs", float, 4>,
                       hone::field<"terminated", bool>, hone::field<"truncated", bool>,
                       hone::field<"discount", float>>;
  hone::replay_buffer<other_shape, Storage, hone::prioritized<>> os(64);
  e = error_text([&] { hone::load_replay_buffer(os, tmp.path / "p"); });
  BOOST_TEST(contains_text(e, "obs F32 [2, 2]"), e);

  // No save there at all.
  e = error_text([&] { hone::load_replay_buffer(per, tmp.path / "nothing"); });
  BOOST_TEST(contains_text(e, "checkpoint_error"), e);
  BOOST_TEST(contains_text(e, "not a directory"), e);
  BOOST_TEST(fingerprint(per) == before);

  // A directory that is not a save is never replaced.
  fs::create_directories(tmp.path / "mine");
  { std::ofstream(tmp.path / "mine" / "notes.txt") << "keep me"; }
  e = error_text([&] { hone::save_replay_buffer(a, tmp.path / "mine"); });
  BOOST_TEST(contains_text(e, "config_error"), e);
  BOOST_TEST(fs::exists(tmp.path / "mine" / "notes.txt"));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(every_kind_of_damage_is_a_checkpoint_error_and_changes_nothing,
                              Storage, storages) {
  temp_dir tmp("replay_io");
  per_on<Storage> a(48);
  add_keys(a, 70);
  typename per_on<Storage>::batch_type batch;
  future_step(a, 0, batch);
  const fs::path good = tmp.path / "good";
  hone::save_replay_buffer(a, good);

  per_on<Storage> b(48);
  add_keys(b, 3);
  const std::string before = fingerprint(b);
  int cases = 0;
  const auto expect_damage = [&](const std::string& what, const std::string& file,
                                 const auto& damage) {
    const fs::path d = tmp.path / ("case" + std::to_string(cases++));
    fs::copy(good, d);
    damage(d / file);
    const std::string e = error_text([&] { hone::load_replay_buffer(b, d); });
    BOOST_TEST(contains_text(e, "checkpoint_error"), what << " of " << file << ": " << e);
    BOOST_TEST(contains_text(e, file), what << " of " << file << " is not named: " << e);
    BOOST_TEST(fingerprint(b) == before, what << " of " << file << " changed the buffer");
  };
  for (const std::string file :
       {"columns.safetensors", "priorities.safetensors", "state.json", "MANIFEST"}) {
    const auto size = fs::file_size(good / file);
    expect_damage("truncation", file, [&](const fs::path& p) { fs::resize_file(p, size / 2); });
    expect_damage("an empty file", file, [&](const fs::path& p) { fs::resize_file(p, 0); });
    expect_damage("a flipped first byte", file, [&](const fs::path& p) { flip_byte(p, 0); });
    expect_damage("a flipped middle byte", file,
                  [&](const fs::path& p) { flip_byte(p, size / 2); });
    expect_damage("a flipped last byte", file, [&](const fs::path& p) { flip_byte(p, size - 1); });
    expect_damage("deletion", file, [&](const fs::path& p) { fs::remove(p); });
  }
  // Damage the hashes cannot see (a tool rewrote the file and its MANIFEST entry): the content
  // checks still refuse it.
  const auto semantic = [&](const std::string& what, const std::string& file, const auto& edit,
                            const std::string& expected) {
    const fs::path d = tmp.path / ("case" + std::to_string(cases++));
    fs::copy(good, d);
    edit(d / file);
    rehash(d, file);
    const std::string e = error_text([&] { hone::load_replay_buffer(b, d); });
    BOOST_TEST(contains_text(e, "checkpoint_error"), what << ": " << e);
    BOOST_TEST(contains_text(e, expected), what << ": " << e);
    BOOST_TEST(fingerprint(b) == before, what << " changed the buffer");
  };
  const auto replace_text = [](const fs::path& p, const std::string& from, const std::string& to) {
    std::ifstream in(p);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto at = s.find(from);
    BOOST_REQUIRE(at != std::string::npos);
    s.replace(at, from.size(), to);
    std::ofstream(p, std::ios::trunc) << s;
  };
  semantic(
      "a NaN priority", "priorities.safetensors",
      [&](const fs::path& p) {
        const auto size = fs::file_size(p);
        poke(p, size - 4, {0, 0, static_cast<char>(0xc0), 0x7f});  // the last slot: NaN
      },
      "priority 47");
  semantic(
      "written and step disagree", "state.json",
      [&](const fs::path& p) {
        const std::string w = std::to_string(a.total_added());
        replace_text(p, "\"written\": " + w, "\"written\": " + w + "1");
      },
      "disagree");
  semantic(
      "an RNG word missing", "state.json",
      [&](const fs::path& p) { replace_text(p, "\"rng\": [", "\"rng\": [7, "); },
      "must hold 4 words, not 5");
  semantic(
      "a field of the wrong JSON kind", "state.json",
      [&](const fs::path& p) {
        replace_text(p, "\"sample_calls\": ", "\"sample_calls\": \"x\", \"y\": ");
      },
      "malformed");
  semantic(
      "another kind of save", "state.json",
      [&](const fs::path& p) { replace_text(p, "hone-replay-buffer", "something-else"); },
      "not a saved replay buffer");
  // Checked before anything else: the buffer still loads the good save.
  hone::load_replay_buffer(b, good);
  BOOST_TEST(fingerprint(b) == fingerprint(a));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(leftovers_of_killed_saves_are_ignored_and_cleaned, Storage,
                              storages) {
  temp_dir tmp("replay_io");
  per_on<Storage> a(32);
  add_keys(a, 40);
  const fs::path dir = tmp.path / "replay";
  hone::save_replay_buffer(a, dir);
  // A pid that is certainly gone: a child that has exited and been reaped.
  const pid_t dead = ::fork();
  BOOST_REQUIRE(dead >= 0);
  if (dead == 0) ::_exit(0);
  int status = 0;
  BOOST_REQUIRE(::waitpid(dead, &status, 0) == dead);
  const fs::path left = tmp.path / (".tmp-replay-" + std::to_string(dead));
  const fs::path left_old = tmp.path / (".tmp-old-replay-" + std::to_string(dead));
  const fs::path other = tmp.path / ".tmp-replay2-12";  // another directory's temporary
  for (const auto& p : {left, left_old, other}) {
    fs::create_directories(p);
    std::ofstream(p / "columns.safetensors") << "half written";
  }
  per_on<Storage> b(32);
  hone::load_replay_buffer(b, dir);  // the leftovers are ignored
  BOOST_TEST(fingerprint(b) == fingerprint(a));
  add_keys(a, 5);
  hone::save_replay_buffer(a, dir);  // ... and cleaned by the next save to the same path
  BOOST_TEST(!fs::exists(left));
  BOOST_TEST(!fs::exists(left_old));
  BOOST_TEST(fs::exists(other));
  hone::load_replay_buffer(b, dir);
  BOOST_TEST(fingerprint(b) == fingerprint(a));
  BOOST_TEST(hone::checkpoint::verify_directory(dir, true).ok());  // a valid hone checkpoint
}

// Writers keep adding while the learner saves: the save waits for the writes in flight and holds
// the writers off, so the saved buffer is consistent: every item is the record of its key, and
// the positions match the items.
BOOST_AUTO_TEST_CASE_TEMPLATE(save_during_many_writers_is_a_consistent_snapshot, Storage,
                              storages) {
  temp_dir tmp("replay_io");
  constexpr std::size_t cap = 512;
  hone::replay_buffer<step, Storage, hone::many_writers, hone::prioritized<>> live(cap);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> next{0};
  std::vector<std::thread> writers;
  for (int t = 0; t < 3; ++t) {
    writers.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed) &&
             next.load(std::memory_order_relaxed) < 2'000'000) {
        // Content follows the key the buffer will give it only if keys are taken in order; so
        // the record carries its own tag and the check below compares with the sampled key via
        // the tag, not via the order of adds.
        live.add(record_for(next.fetch_add(1, std::memory_order_relaxed)));
      }
    });
  }
  hone::replay_buffer<step, Storage, hone::prioritized<>> loaded(cap);
  int saves = 0;
  bool consistent = true;
  for (int i = 0; i < 15; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    hone::save_replay_buffer(live, tmp.path / "snap");
    ++saves;
    hone::load_replay_buffer(loaded, tmp.path / "snap");
    const std::uint64_t n = loaded.total_added();
    consistent = consistent && loaded.size() == std::min<std::uint64_t>(n, cap);
    // Every slot holds a complete record (one of record_for(x) for some x), never a torn one.
    hone::replay_batch<step> one(1);
    for (std::size_t s = 0; s < std::min<std::uint64_t>(n, cap); ++s) {
      record r{};
      loaded.storage().read(s, r);
      const auto x = static_cast<std::uint64_t>(hone::get<"obs">(r)[0]) / 4;
      consistent = consistent && same_record(r, record_for(x));
    }
    // Every published item has a positive priority.
    for (std::size_t s = 0; s < std::min<std::uint64_t>(n, cap); ++s) {
      consistent = consistent && loaded.priorities()[s] > 0.0f;
    }
  }
  stop = true;
  for (auto& w : writers) w.join();
  BOOST_TEST(saves == 15);
  BOOST_TEST(consistent, "a save taken during writes holds a torn or unpublished item");
  BOOST_TEST(live.writes_in_flight() == 0u);
}

// A child process adds and saves in a loop (each start loads the previous save first); it is
// SIGKILLed at random moments. After every kill the save at the path loads, its positions never
// go back, and every stored item is the record of its key.
BOOST_AUTO_TEST_CASE_TEMPLATE(kill_during_save_always_leaves_a_loadable_save, Storage, storages) {
  temp_dir tmp("replay_io");
  const fs::path dir = tmp.path / "replay";
  constexpr std::size_t cap = 4096;
  std::mt19937 rng(2024);
  std::uint64_t last_written = 0;
  int kills = 0, loaded_ok = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int round = 0; round < 20; ++round) {
    int fds[2];
    BOOST_REQUIRE(::pipe(fds) == 0);
    const pid_t pid = ::fork();
    BOOST_REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      try {
        per_on<Storage> b(cap);
        if (fs::exists(dir)) hone::load_replay_buffer(b, dir);
        typename per_on<Storage>::batch_type batch;
        for (int i = 0;; ++i) {
          add_keys(b, 1000);
          future_step(b, i, batch);
          hone::save_replay_buffer(b, dir);
          if (i == 0 && ::write(fds[1], "s", 1) != 1) ::_exit(4);  // one save done
        }
      } catch (...) {
        ::_exit(3);
      }
    }
    // The kill lands at a random moment after the round's first save (so that every round makes
    // progress, however slow the build: sanitizers), mostly inside a later save.
    ::close(fds[1]);
    char c = 0;
    BOOST_REQUIRE(::read(fds[0], &c, 1) == 1);
    ::close(fds[0]);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 60000));
    BOOST_REQUIRE(::kill(pid, SIGKILL) == 0);
    int status = 0;
    BOOST_REQUIRE(::waitpid(pid, &status, 0) == pid);
    BOOST_REQUIRE(!(WIFEXITED(status) && WEXITSTATUS(status) == 3));
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ++kills;
    if (!fs::exists(dir)) continue;  // killed before the first save
    per_on<Storage> b(cap);
    const std::string e = error_text([&] { hone::load_replay_buffer(b, dir); });
    BOOST_TEST(e == "no error", "round " << round << ": " << e);
    if (e != "no error") continue;
    ++loaded_ok;
    BOOST_TEST(b.total_added() >= last_written);
    last_written = b.total_added();
    bool rows_ok = true;
    const auto n = std::min<std::uint64_t>(b.total_added(), cap);
    for (std::size_t s = 0; s < n; ++s) {
      record r{};
      b.storage().read(s, r);
      const std::uint64_t w = b.total_added();
      const std::size_t head = static_cast<std::size_t>(w % cap);
      const std::uint64_t back = (head + cap - 1 - s) % cap;  // slots behind the last write
      rows_ok = rows_ok && same_record(r, record_for(w - 1 - back));
    }
    BOOST_TEST(rows_ok, "round " << round << ": a stored item is not the record of its key");
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE("replay save kill test: " << kills << " kills, " << loaded_ok
                                               << " loads after a kill, " << last_written
                                               << " items at the end, " << secs << " s");
  BOOST_TEST(kills >= 15);
  BOOST_TEST(loaded_ok == 20);
  // One more save from this process cleans what the killed saves left, and it loads.
  per_on<Storage> b(cap);
  hone::load_replay_buffer(b, dir);
  add_keys(b, 10);
  hone::save_replay_buffer(b, dir);
  std::size_t temporaries = 0;
  for (const auto& e : fs::directory_iterator(tmp.path)) {
    if (e.path().filename().string().starts_with(".tmp-")) ++temporaries;
  }
  BOOST_TEST(temporaries == 0u);
  per_on<Storage> c(cap);
  hone::load_replay_buffer(c, dir);
  BOOST_TEST(c.total_added() == last_written + 10);
  BOOST_TEST(last_written > cap);
}

namespace {

// The columns file, MANIFEST and every other file of a save, byte for byte.
std::vector<std::string> save_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const char* name :
       {"columns.safetensors", "priorities.safetensors", "state.json", "MANIFEST"}) {
    std::ifstream in(dir / name, std::ios::binary);
    out.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  return out;
}

}  // namespace

// A column buffer and a packed buffer given the same adds, samples and updates save the same
// files, byte for byte (the packed save gathers each field in pieces of at most 1 MiB: 150 000
// slots make the 16-byte fields three pieces), and each save loads into the other storage and
// continues exactly as the buffer that was saved.
BOOST_AUTO_TEST_CASE(column_and_packed_saves_are_one_format_and_load_into_each_other) {
  temp_dir tmp("replay_io");
  constexpr std::size_t cap = 150'000;
  const hone::prioritized<> cfg{.alpha = 0.7, .beta = 0.5, .beta_steps = 50};
  using columns_t = per_on<hone::ring_storage>;
  using packed_t = per_on<hone::packed_storage>;
  static_assert(columns_t::has_columns && !packed_t::has_columns);
  columns_t c(cap, hone::ring_storage{}, cfg);
  packed_t p(cap, hone::packed_storage{}, cfg);
  c.seed(21);
  p.seed(21);
  add_keys(c, cap + 12'345);  // wrapped
  add_keys(p, cap + 12'345);
  typename columns_t::batch_type bc;
  typename packed_t::batch_type bp;
  for (int i = 0; i < 10; ++i) {
    future_step(c, i, bc);
    future_step(p, i, bp);
  }
  BOOST_TEST(fingerprint(c) == fingerprint(p));
  hone::save_replay_buffer(c, tmp.path / "from_columns");
  hone::save_replay_buffer(p, tmp.path / "from_packed");
  const auto fc = save_files(tmp.path / "from_columns");
  const auto fp = save_files(tmp.path / "from_packed");
  BOOST_TEST(fc[0].size() > 2 * cap * sizeof(float) * 4);
  for (std::size_t i = 0; i < fc.size(); ++i) {
    BOOST_TEST((fc[i] == fp[i]), "file " << i << " of the packed save differs from the columns'");
  }
  // Columns -> packed and packed -> columns, each against the buffer that was saved.
  packed_t p2(cap, hone::packed_storage{}, cfg);
  hone::load_replay_buffer(p2, tmp.path / "from_columns");
  columns_t c2(cap, hone::ring_storage{}, cfg);
  hone::load_replay_buffer(c2, tmp.path / "from_packed");
  BOOST_TEST(fingerprint(p2) == fingerprint(c));
  BOOST_TEST(fingerprint(c2) == fingerprint(p));
  typename columns_t::batch_type b1, b2;
  typename packed_t::batch_type b3, b4;
  bool same = true;
  for (int i = 0; i < 40; ++i) {
    future_step(c, i, b1);
    future_step(c2, i, b2);
    future_step(p, i, b3);
    future_step(p2, i, b4);
    same = same && same_batch(b1, b4) && same_batch(b3, b2) && same_batch(b1, b3);
  }
  BOOST_TEST(same, "a buffer loaded from the other storage's save diverged");
}

// A field larger than the staging piece (1 MiB) is gathered one item at a time: the same file.
BOOST_AUTO_TEST_CASE(a_field_larger_than_the_staging_piece_saves_the_same_file) {
  temp_dir tmp("replay_io");
  using big = hone::transition<hone::field<"frame", std::uint8_t, (1 << 20) + 3>,
                               hone::field<"reward", float>, hone::field<"done", bool>>;
  constexpr std::size_t cap = 3;
  hone::replay_buffer<big, hone::ring_storage> c(cap);
  hone::replay_buffer<big, hone::packed_storage> p(cap);
  auto frame = std::make_unique<big::record>();
  for (std::uint64_t k = 0; k < 5; ++k) {
    auto& px = hone::get<"frame">(*frame);
    for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>(i * 7 + k);
    hone::get<"reward">(*frame) = static_cast<float>(k) + 0.5f;
    hone::get<"done">(*frame) = k % 2 == 1;
    c.add(*frame);
    p.add(*frame);
  }
  hone::save_replay_buffer(c, tmp.path / "c");
  hone::save_replay_buffer(p, tmp.path / "p");
  const auto fc = save_files(tmp.path / "c");
  const auto fp = save_files(tmp.path / "p");
  BOOST_TEST((fc[0] == fp[0]), "the packed save's columns differ from the columns'");
  BOOST_TEST((fc[3] == fp[3]), "the MANIFESTs differ");
  hone::replay_buffer<big, hone::packed_storage> p2(cap);
  hone::load_replay_buffer(p2, tmp.path / "c");
  BOOST_TEST(fingerprint(p2) == fingerprint(c));
}
