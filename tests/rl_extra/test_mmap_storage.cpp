// Tests of hone::mmap_storage (the disk-backed ring as a replay buffer's storage): the same samples
// as the in-memory ring for the same adds and seeds (uniform and prioritized; the in-memory ring
// is the reference), reopening continues (keys, positions, only live items sampled, also when the
// live items do not start at slot 0 after an eviction and a kill), a damaged or mismatched file
// is a checkpoint_error, and a child adding in a loop, SIGKILLed at random moments, reopens with
// exactly a committed prefix, byte for byte.
#define BOOST_TEST_MODULE hone_rl_extra_mmap_storage
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <hone/rl/mmap_storage.hpp>
#include <hone/rl/replay_buffer.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "replay_test_common.hpp"

namespace fs = std::filesystem;
using namespace replay_test;

namespace {

template <class Buffer>
void add_keys(Buffer& b, std::uint64_t n) {
  for (std::uint64_t k = 0; k < n; ++k) b.add(record_for(b.total_added()));
}

template <class Buffer>
void update_from(Buffer& b, const typename Buffer::batch_type& out) {
  if constexpr (Buffer::is_prioritized) {
    std::vector<float> td(out.size());
    for (std::size_t r = 0; r < td.size(); ++r) {
      td[r] = static_cast<float>((out.keys()[r] * 2654435761u) % 1000) / 250.0f;
    }
    b.update_priorities(out.keys(), td);
  }
}

// The same adds (one by one and in batches), samples and updates on an in-memory buffer and an
// mmap_storage buffer: identical batches, keys and weights at every step.
template <class Sampler>
void check_same_as_ring(std::uint64_t total_adds, const fs::path& file) {
  constexpr std::size_t cap = 256;
  hone::replay_buffer<step, Sampler> ring(cap);
  hone::replay_buffer<step, hone::mmap_storage, Sampler> disk(
      cap, hone::mmap_storage{.path = file, .options = {.commit_every = 17, .sync = false}},
      Sampler{});
  ring.seed(77);
  disk.seed(77);
  hone::replay_batch<step> a, b, rows(5);
  bool same = true, rows_ok = true;
  int steps = 0;
  while (ring.total_added() < total_adds) {
    if (steps % 3 == 0) {
      for (std::size_t r = 0; r < 5; ++r) rows.set_row(r, record_for(ring.total_added() + r));
      ring.add_batch(rows);
      disk.add_batch(rows);
    } else {
      add_keys(ring, 4);
      add_keys(disk, 4);
    }
    ring.sample(24, a);
    disk.sample(24, b);
    same = same && same_batch(a, b);
    for (std::size_t r = 0; r < b.size(); ++r) rows_ok = rows_ok && row_matches_key(b, r);
    update_from(ring, a);
    update_from(disk, b);
    ++steps;
  }
  BOOST_TEST(same, "mmap_storage sampled differently from ring_storage");
  BOOST_TEST(rows_ok);
  BOOST_TEST(disk.size() == ring.size());
  BOOST_TEST(disk.total_added() == ring.total_added());
}

// Every live item of a (reopened) buffer is the record of its key, and nothing else is sampled.
template <class Buffer>
void check_samples_live(Buffer& b, std::uint64_t begin, std::uint64_t end) {
  hone::replay_batch<step> out;
  std::set<std::uint64_t> seen;
  bool in_range = true, rows_ok = true;
  for (int i = 0; i < 200; ++i) {
    b.sample(64, out);
    for (std::size_t r = 0; r < out.size(); ++r) {
      const std::uint64_t k = out.keys()[r];
      in_range = in_range && k >= begin && k < end;
      rows_ok = rows_ok && row_matches_key(out, r);
      seen.insert(k);
    }
  }
  BOOST_TEST(in_range, "a key outside the live range [" << begin << ", " << end << ") was sampled");
  BOOST_TEST(rows_ok, "a sampled row is not the record of its key");
  BOOST_TEST(seen.size() == end - begin, "not every live item was sampled");
}

}  // namespace

BOOST_AUTO_TEST_CASE(same_samples_as_ring_storage) {
  temp_dir tmp("mmap_storage");
  // Filling without wrapping (no eviction at all), then well past several wraps: in the running
  // process evicted records keep their bytes until overwritten, so the samples stay identical.
  check_same_as_ring<hone::uniform>(200, tmp.path / "u1.ring");
  check_same_as_ring<hone::prioritized<>>(200, tmp.path / "p1.ring");
  check_same_as_ring<hone::uniform>(1000, tmp.path / "u2.ring");
  check_same_as_ring<hone::prioritized<2>>(1000, tmp.path / "p2.ring");
}

BOOST_AUTO_TEST_CASE(packed_records_in_the_file) {
  temp_dir tmp("mmap_storage");
  using storage = hone::mmap_records<step>;
  static_assert(storage::record_bytes == 16 + 4 + 4 + 16 + 1 + 1 + 4);
  static_assert(storage::offset<0>() == 0 && storage::offset<1>() == 16 &&
                storage::offset<4>() == 40 && storage::offset<6>() == 42);
  {
    hone::replay_buffer<step, hone::mmap_storage> b(8, hone::mmap_storage{.path = tmp.path / "f"});
    add_keys(b, 3);
  }
  // Slot 2 of the file holds key 2's fields packed in order.
  auto ring = hone::mmap_ring::open(tmp.path / "f");
  BOOST_TEST(ring.record_size() == storage::record_bytes);
  const record want = record_for(2);
  const auto got = ring.at_sequence(2);
  BOOST_TEST(std::memcmp(got.data(), hone::get<"obs">(want).data(), 16) == 0);
  std::int32_t action = 0;
  std::memcpy(&action, got.data() + 16, 4);
  BOOST_TEST(action == 2);
  BOOST_TEST(static_cast<bool>(got[40]) == hone::get<"terminated">(want));
}

BOOST_AUTO_TEST_CASE(reopen_continues_where_it_stopped) {
  temp_dir tmp("mmap_storage");
  const fs::path p = tmp.path / "replay.ring";
  constexpr std::size_t cap = 64;
  const hone::mmap_storage where{.path = p, .options = {.commit_every = 5, .evict_block = 4}};
  using per = hone::replay_buffer<step, hone::mmap_storage, hone::prioritized<>>;
  {
    per b(cap, where, hone::prioritized<>{.initial_priority = 2.0});
    BOOST_TEST(b.total_added() == 0u);
    add_keys(b, 150);
    hone::replay_batch<step> out;
    b.sample(32, out);
    std::vector<float> big(out.size(), 50.0f);
    b.update_priorities(out.keys(), big);  // the running max rises; not kept across a reopen
  }                                        // destroyed: committed
  {
    per b(cap, where, hone::prioritized<>{.initial_priority = 2.0});
    const auto& ring = b.storage().ring();
    BOOST_TEST(b.total_added() == 150u);
    BOOST_TEST(ring.end() == 150u);
    const std::uint64_t begin = ring.oldest();
    BOOST_TEST(begin > 150u - cap);  // the wrap evicted a block: fewer than cap live items
    BOOST_TEST(b.size() == 150u - begin);
    BOOST_TEST(!b.contains(begin - 1));
    BOOST_TEST(b.contains(begin));
    BOOST_TEST(b.contains(149u));
    BOOST_TEST(!b.contains(150u));
    // Live items at the initial priority, the evicted slots at 0.
    bool prio_ok = true;
    for (std::uint64_t k = 150 - cap; k < 150; ++k) {
      const float want = k >= begin ? 2.0f : 0.0f;
      prio_ok = prio_ok && b.priorities()[k % cap] == want;
    }
    BOOST_TEST(prio_ok);
    BOOST_TEST(b.sampler().max_priority() == 2.0f);
    check_samples_live(b, begin, 150);
    // Adds continue the keys; each one revives one slot.
    add_keys(b, 3);
    BOOST_TEST(b.total_added() == 153u);
    BOOST_TEST(b.size() == std::min<std::uint64_t>(153u - begin, cap));
    check_samples_live(b, std::max<std::uint64_t>(begin, 153 - cap), 153);
    add_keys(b, cap);
    BOOST_TEST(b.size() == cap);
    check_samples_live(b, 153 + cap - cap, 153 + cap);
  }
  // A uniform buffer on the same file reopens too (the file does not record the sampler).
  hone::replay_buffer<step, hone::mmap_storage> u(cap, where);
  BOOST_TEST(u.total_added() == 153u + cap);
  check_samples_live(u, u.storage().ring().oldest(), u.total_added());
}

// A kill after an eviction and before the next commit: the file's live items are [16, 72), which
// wrap around the end of the ring, and slots 8..15 hold records of keys 72 and 73 that were never
// committed (8, 9) or keys 8..15 that were evicted: the reopened buffer never samples them.
BOOST_AUTO_TEST_CASE(reopen_after_a_kill_samples_only_live_items) {
  temp_dir tmp("mmap_storage");
  const fs::path p = tmp.path / "replay.ring";
  constexpr std::size_t cap = 64;
  const hone::mmap_storage where{.path = p, .options = {.commit_every = 0, .evict_block = 8}};
  const pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    try {
      hone::replay_buffer<step, hone::mmap_storage> b(cap, where);
      add_keys(b, 64);
      b.commit();
      add_keys(b, 10);  // 64..71 into the evicted block; 72 commits [16, 72); 72, 73 uncommitted
      ::_exit(0);       // no destructor (no commit): as if killed
    } catch (...) {
      ::_exit(3);
    }
  }
  int status = 0;
  BOOST_REQUIRE(::waitpid(pid, &status, 0) == pid);
  BOOST_REQUIRE(WIFEXITED(status));
  BOOST_REQUIRE(WEXITSTATUS(status) == 0);
  hone::replay_buffer<step, hone::mmap_storage> u(cap, where);
  BOOST_TEST(u.storage().ring().oldest() == 16u);
  BOOST_TEST(u.total_added() == 72u);
  BOOST_TEST(u.size() == 56u);
  check_samples_live(u, 16, 72);
  hone::replay_buffer<step, hone::mmap_storage, hone::prioritized<>> pr(cap, where,
                                                                        hone::prioritized<>{});
  check_samples_live(pr, 16, 72);
  u.seed(1);
  add_keys(u, 2);  // keys 72, 73 rewritten properly
  check_samples_live(u, 16, 74);
}

BOOST_AUTO_TEST_CASE(a_reopened_file_with_no_live_item_cannot_be_sampled) {
  temp_dir tmp("mmap_storage");
  const fs::path p = tmp.path / "r";
  constexpr std::size_t cap = 4;
  // evict_block = capacity: the wrap commits an empty live range.
  const hone::mmap_storage where{.path = p, .options = {.commit_every = 0, .evict_block = 4}};
  const pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    hone::replay_buffer<step, hone::mmap_storage> b(cap, where);
    add_keys(b, 5);  // the 5th add commits [4, 4) first
    ::_exit(0);
  }
  int status = 0;
  BOOST_REQUIRE(::waitpid(pid, &status, 0) == pid);
  hone::replay_buffer<step, hone::mmap_storage> b(cap, where);
  BOOST_TEST(b.total_added() == 4u);
  BOOST_TEST(b.size() == 0u);
  BOOST_TEST(b.empty());
  hone::replay_batch<step> out;
  BOOST_CHECK_THROW(b.sample(4, out), hone::error);
  hone::replay_buffer<step, hone::mmap_storage, hone::prioritized<>> pb(cap, where,
                                                                        hone::prioritized<>{});
  BOOST_CHECK_THROW(pb.sample(4, out), hone::error);
  add_keys(b, 1);
  check_samples_live(b, 4, 5);
}

BOOST_AUTO_TEST_CASE(damaged_or_mismatched_files_are_checkpoint_errors) {
  temp_dir tmp("mmap_storage");
  const fs::path p = tmp.path / "replay.ring";
  {
    hone::replay_buffer<step, hone::mmap_storage> b(32, hone::mmap_storage{.path = p});
    add_keys(b, 40);
  }
  const auto open_as = [&](std::size_t cap, const fs::path& file) {
    return error_text([&] {
      hone::replay_buffer<step, hone::mmap_storage> b(cap, hone::mmap_storage{.path = file});
    });
  };
  BOOST_TEST(open_as(32, p) == "no error");
  std::string e = open_as(33, p);
  BOOST_TEST(contains_text(e, "checkpoint_error"), e);
  BOOST_TEST(contains_text(e, "capacity 32, not the expected 33"), e);
  BOOST_TEST(contains_text(e, p.string()), e);
  // Another transition with the same record size (46 bytes: the record size cannot tell).
  using other = hone::transition<hone::field<"x", std::int16_t, 23>>;
  static_assert(other::bytes == step::bytes);
  e = error_text(
      [&] { hone::replay_buffer<other, hone::mmap_storage> b(32, hone::mmap_storage{.path = p}); });
  BOOST_TEST(contains_text(e, "another transition type"), e);
  // Another record size.
  using small = hone::transition<hone::field<"x", float>>;
  e = error_text(
      [&] { hone::replay_buffer<small, hone::mmap_storage> b(32, hone::mmap_storage{.path = p}); });
  BOOST_TEST(contains_text(e, "records of 46 bytes"), e);
  // Damage: truncated, both headers flipped, garbage, empty.
  const auto damaged = [&](const std::string& name, const auto& damage) {
    const fs::path q = tmp.path / name;
    fs::copy_file(p, q);
    damage(q);
    return open_as(32, q);
  };
  e = damaged("trunc", [](const fs::path& q) { fs::resize_file(q, fs::file_size(q) - 10); });
  BOOST_TEST(contains_text(e, "checkpoint_error"), e);
  BOOST_TEST(contains_text(e, "truncated"), e);
  e = damaged("headers", [](const fs::path& q) {
    flip_byte(q, 30);
    flip_byte(q, 512 + 30);
  });
  BOOST_TEST(contains_text(e, "both header copies"), e);
  e = damaged("garbage", [](const fs::path& q) { poke(q, 0, std::vector<char>(1024, 'x')); });
  BOOST_TEST(contains_text(e, "bad magic"), e);
  e = damaged("empty", [](const fs::path& q) { fs::resize_file(q, 0); });
  BOOST_TEST(contains_text(e, "checkpoint_error"), e);
  // One header damaged: the other copy is used (a torn header write), and it still opens.
  e = damaged("one", [](const fs::path& q) { flip_byte(q, 30); });
  BOOST_TEST(e == "no error");
  e = error_text(
      [&] { hone::replay_buffer<step, hone::mmap_storage> b(32, hone::mmap_storage{}); });
  BOOST_TEST(contains_text(e, "path of the ring file is empty"), e);
}

// A child adds in a loop (reopening the file at each start, committing every few adds, reporting
// each commit through a pipe) and is SIGKILLed at random moments. Each reopen: the end is the
// last reported commit or the one in progress, never before the previous reopen, every live
// record is byte-identical to the record of its key, and only live items are sampled.
BOOST_AUTO_TEST_CASE(survives_sigkill_with_exactly_a_committed_prefix) {
  temp_dir tmp("mmap_storage");
  const fs::path p = tmp.path / "replay.ring";
  constexpr std::size_t cap = 2048;
  constexpr std::uint64_t commit_period = 37;
  std::mt19937 rng(4242);
  std::uint64_t last_end = 0;
  int kills = 0, reopened = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int round = 0; round < 20; ++round) {
    const hone::mmap_storage where{
        .path = p,
        .options = {.commit_every = 0, .evict_block = 1 + rng() % 100, .sync = round % 5 == 0}};
    int fds[2];
    BOOST_REQUIRE(::pipe(fds) == 0);
    const pid_t pid = ::fork();
    BOOST_REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      try {
        hone::replay_buffer<step, hone::mmap_storage> b(cap, where);
        for (;;) {
          add_keys(b, commit_period);
          b.commit();
          const std::uint64_t end = b.storage().ring().committed_end();
          if (::write(fds[1], &end, sizeof end) != sizeof end) ::_exit(4);
        }
      } catch (...) {
        ::_exit(3);
      }
    }
    ::close(fds[1]);
    std::this_thread::sleep_for(std::chrono::microseconds(2000 + rng() % 30000));
    BOOST_REQUIRE(::kill(pid, SIGKILL) == 0);
    int status = 0;
    BOOST_REQUIRE(::waitpid(pid, &status, 0) == pid);
    BOOST_REQUIRE(!(WIFEXITED(status) && WEXITSTATUS(status) == 3));
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ++kills;
    std::uint64_t reported = last_end, v = 0;
    while (::read(fds[0], &v, sizeof v) == sizeof v) reported = v;
    ::close(fds[0]);
    if (!fs::exists(p)) continue;
    hone::replay_buffer<step, hone::mmap_storage> b(cap, where);
    const auto& ring = b.storage().ring();
    const std::uint64_t end = b.total_added();
    BOOST_TEST(end == ring.end());
    // Commits happen every commit_period adds and at wraps (which commit what is there): the
    // reopened end is the last reported commit or at most one period after it.
    BOOST_TEST(end >= reported, "round " << round << ": lost a reported commit");
    BOOST_TEST(end <= reported + commit_period, "round " << round << ": more than committed");
    BOOST_TEST(end >= last_end);
    bool bytes_ok = true;
    for (std::uint64_t k = ring.oldest(); k < end; ++k) {
      record r{};
      b.storage().read(static_cast<std::size_t>(k % cap), r);
      bytes_ok = bytes_ok && same_record(r, record_for(k));
    }
    BOOST_TEST(bytes_ok, "round " << round << ": a committed record is damaged");
    BOOST_TEST(b.size() == end - ring.oldest());
    if (b.size() > 0) {
      hone::replay_batch<step> out;
      bool live = true;
      for (int i = 0; i < 20; ++i) {
        b.sample(128, out);
        for (std::size_t r = 0; r < out.size(); ++r) {
          live = live && out.keys()[r] >= ring.oldest() && out.keys()[r] < end &&
                 row_matches_key(out, r);
        }
      }
      BOOST_TEST(live, "round " << round << ": sampled a dead slot");
    }
    last_end = end;
    ++reopened;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE("mmap_storage kill test: " << kills << " kills, " << reopened << " reopens, "
                                                << last_end << " items, " << secs << " s");
  BOOST_TEST(kills >= 15);
  BOOST_TEST(last_end > cap);
}
