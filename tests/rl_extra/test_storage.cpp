// Tests of the disk-backed ring (round trip, wrap, reopen, every kind of damage as an exception,
// and repeated SIGKILLs of a writer process) and of the frame store (stacks against a naive
// reference, both padding conventions, overwriting, zstd, bytes per transition).
#define BOOST_TEST_MODULE hone_rl_extra_storage
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <hone/rl/frame_store.hpp>
#include <hone/rl/mmap_ring.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../support/temp_dir.hpp"
#include "replay_test_common.hpp"

namespace fs = std::filesystem;

namespace {

using temp_dir = hone_test::temp_dir;

constexpr std::size_t rec_bytes = 40;

/// The content of record `seq`: its sequence then bytes derived from it.
std::vector<std::byte> record_for(std::uint64_t seq) {
  std::vector<std::byte> r(rec_bytes);
  std::memcpy(r.data(), &seq, 8);
  std::uint64_t x = seq * 0x9E3779B97F4A7C15ULL + 1;
  for (std::size_t i = 8; i < rec_bytes; ++i) {
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ULL;
    r[i] = static_cast<std::byte>(x >> 56);
  }
  return r;
}

bool record_ok(std::span<const std::byte> got, std::uint64_t seq) {
  const auto want = record_for(seq);
  return std::memcmp(got.data(), want.data(), rec_bytes) == 0;
}

using replay_test::error_text;

void poke(const fs::path& p, std::uint64_t offset, std::span<const char> bytes) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(mmap_ring_tests)

BOOST_AUTO_TEST_CASE(round_trip_wrap_and_reopen) {
  temp_dir dir;
  const fs::path p = dir.path / "ring.bin";
  hone::mmap_ring_options opt;
  opt.commit_every = 5;
  opt.evict_block = 4;
  {
    auto r = hone::mmap_ring::create(p, rec_bytes, 32, opt);
    BOOST_TEST(r.size() == 0u);
    BOOST_TEST(r.file_bytes() == 4096u + 32u * rec_bytes);
    for (std::uint64_t s = 0; s < 20; ++s) BOOST_TEST(r.push(record_for(s)) == s);
    BOOST_TEST(r.size() == 20u);
    BOOST_TEST(r.committed_end() == 20u);  // every 5
    for (std::size_t i = 0; i < r.size(); ++i) BOOST_TEST(record_ok(r[i], i));
    r.set_user_tag(77);
  }  // destructor commits
  {
    auto r = hone::mmap_ring::open(p, opt, rec_bytes, 32);
    BOOST_TEST(r.size() == 20u);
    BOOST_TEST(r.end() == 20u);
    BOOST_TEST(r.user_tag() == 77u);
    for (std::uint64_t s = 20; s < 100; ++s) r.push(record_for(s));
    // Wrapped: evictions in blocks of 4 keep 29..32 live records.
    BOOST_TEST(r.size() <= 32u);
    BOOST_TEST(r.size() >= 29u);
    BOOST_TEST(r.end() == 100u);
    for (std::size_t i = 0; i < r.size(); ++i) BOOST_TEST(record_ok(r[i], r.oldest() + i));
    BOOST_TEST(record_ok(r.at_sequence(99), 99));
    BOOST_CHECK_THROW((void)r.at_sequence(r.oldest() - 1), hone::config_error);
    r.push(record_for(100));  // not committed explicitly: close() commits it
    r.close();
    BOOST_TEST(!r.is_open());
  }
  {
    auto r = hone::mmap_ring::open_or_create(p, rec_bytes, 32, opt);
    BOOST_TEST(r.end() == 101u);
    for (std::size_t i = 0; i < r.size(); ++i) BOOST_TEST(record_ok(r[i], r.oldest() + i));
  }
  // Mismatched expectations.
  const std::string e1 = error_text([&] { (void)hone::mmap_ring::open(p, opt, rec_bytes + 1); });
  BOOST_TEST(e1.find("checkpoint_error") == 0u);
  BOOST_TEST(e1.find("not the expected") != std::string::npos);
  BOOST_TEST(e1.find(p.string()) != std::string::npos);
  const std::string e2 =
      error_text([&] { (void)hone::mmap_ring::open_or_create(p, rec_bytes, 64, opt); });
  BOOST_TEST(e2.find("capacity 32") != std::string::npos);
  // create() refuses an existing file.
  BOOST_TEST(error_text([&] {
               (void)hone::mmap_ring::create(p, rec_bytes, 32, opt);
             }).find("io_error") == 0u);
}

BOOST_AUTO_TEST_CASE(typed_records_and_bad_arguments) {
  temp_dir dir;
  struct rec {
    std::uint32_t a;
    float b;
  };
  auto r = hone::mmap_ring::create(dir.path / "t.bin", sizeof(rec), 8);
  r.push_value(rec{3, 1.5f});
  BOOST_TEST(r.value_at<rec>(0).a == 3u);
  BOOST_TEST(r.value_at<rec>(0).b == 1.5f);
  std::vector<std::byte> wrong(sizeof(rec) + 1);
  BOOST_CHECK_THROW(r.push(wrong), hone::config_error);
  BOOST_CHECK_THROW((void)hone::mmap_ring::create(dir.path / "z.bin", 0, 8), hone::config_error);
  BOOST_CHECK_THROW((void)hone::mmap_ring::create(dir.path / "z.bin", 8, 0), hone::config_error);
}

BOOST_AUTO_TEST_CASE(damage_is_an_exception) {
  temp_dir dir;
  const fs::path p = dir.path / "ring.bin";
  hone::mmap_ring_options opt;
  opt.commit_every = 0;
  {
    auto r = hone::mmap_ring::create(p, rec_bytes, 16, opt);  // generation 1 in slot A
    for (std::uint64_t s = 0; s < 10; ++s) r.push(record_for(s));
    r.commit();  // generation 2 in slot B: end 10
    for (std::uint64_t s = 10; s < 15; ++s) r.push(record_for(s));
    r.commit();  // generation 3 in slot A: end 15
  }
  const fs::path q = dir.path / "copy.bin";
  auto fresh = [&] {
    fs::remove(q);
    fs::copy_file(p, q);
  };
  const std::array<char, 1> junk{'\x5a'};

  // One damaged header copy: the other (older) one is used.
  fresh();
  poke(q, 40, junk);  // inside slot A's begin/end fields
  {
    auto r = hone::mmap_ring::open(q, opt);
    BOOST_TEST(r.end() == 10u);
    for (std::size_t i = 0; i < r.size(); ++i) BOOST_TEST(record_ok(r[i], i));
  }
  // Both damaged.
  fresh();
  poke(q, 40, junk);
  poke(q, 512 + 40, junk);
  std::string e = error_text([&] { (void)hone::mmap_ring::open(q, opt); });
  BOOST_TEST_MESSAGE(e);
  BOOST_TEST(e.find("checkpoint_error") == 0u);
  BOOST_TEST(e.find("checksum") != std::string::npos);
  BOOST_TEST(e.find(q.string()) != std::string::npos);
  // Not a ring file.
  fresh();
  poke(q, 0, std::array<char, 8>{'G', 'A', 'R', 'B', 'A', 'G', 'E', '!'});
  poke(q, 512, std::array<char, 8>{'G', 'A', 'R', 'B', 'A', 'G', 'E', '!'});
  e = error_text([&] { (void)hone::mmap_ring::open(q, opt); });
  BOOST_TEST(e.find("bad magic") != std::string::npos);
  // Truncated records.
  fresh();
  fs::resize_file(q, fs::file_size(q) - 7);
  e = error_text([&] { (void)hone::mmap_ring::open(q, opt); });
  BOOST_TEST_MESSAGE(e);
  BOOST_TEST(e.find("truncated") != std::string::npos);
  // Shorter than a header.
  fresh();
  fs::resize_file(q, 100);
  e = error_text([&] { (void)hone::mmap_ring::open(q, opt); });
  BOOST_TEST(e.find("shorter than a ring header") != std::string::npos);
  // Another version, with a valid checksum.
  fresh();
  for (std::uint64_t off : {0, 512}) {
    hone::detail::mmap_ring_header h{};
    std::ifstream in(q, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(off));
    in.read(reinterpret_cast<char*>(&h), sizeof h);
    in.close();
    h.version = 9;
    h.checksum = h.compute_checksum();
    poke(q, off, std::span(reinterpret_cast<const char*>(&h), sizeof h));
  }
  e = error_text([&] { (void)hone::mmap_ring::open(q, opt); });
  BOOST_TEST(e.find("version 9") != std::string::npos);
  // begin/end beyond the capacity, with a valid checksum.
  fresh();
  for (std::uint64_t off : {0, 512}) {
    hone::detail::mmap_ring_header h{};
    std::ifstream in(q, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(off));
    in.read(reinterpret_cast<char*>(&h), sizeof h);
    in.close();
    h.begin = 0;
    h.end = 1000;
    h.checksum = h.compute_checksum();
    poke(q, off, std::span(reinterpret_cast<const char*>(&h), sizeof h));
  }
  e = error_text([&] { (void)hone::mmap_ring::open(q, opt); });
  BOOST_TEST(e.find("inconsistent header") != std::string::npos);
  // Missing file, a directory.
  BOOST_TEST(error_text([&] {
               (void)hone::mmap_ring::open(dir.path / "none.bin");
             }).find("io_error") == 0u);
  BOOST_TEST(error_text([&] { (void)hone::mmap_ring::open(dir.path); }) != "no error");
}

// A child process appends forever, committing every few records; it is SIGKILLed at a random
// moment, and the parent reopens the file: every committed record must be intact, and the next
// child continues where the killed one stopped.
BOOST_AUTO_TEST_CASE(survives_sigkill) {
  temp_dir dir;
  const fs::path p = dir.path / "ring.bin";
  constexpr std::size_t capacity = 4096;
  std::mt19937 rng(12345);
  std::uint64_t last_end = 0;
  const auto t0 = std::chrono::steady_clock::now();
  int kills = 0;
  for (int round = 0; round < 20; ++round) {
    hone::mmap_ring_options opt;
    opt.commit_every = 1 + rng() % 64;
    opt.sync = (round % 5 == 0);  // msync in some rounds (slower), page cache only in the others
    const pid_t pid = ::fork();
    BOOST_REQUIRE(pid >= 0);
    if (pid == 0) {
      try {
        auto r = hone::mmap_ring::open_or_create(p, rec_bytes, capacity, opt);
        for (std::uint64_t s = r.end();; ++s) r.push(record_for(s));
      } catch (...) {
        ::_exit(3);
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(5000 + rng() % 40000));
    BOOST_REQUIRE(::kill(pid, SIGKILL) == 0);
    int status = 0;
    BOOST_REQUIRE(::waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ++kills;
    BOOST_REQUIRE(!(WIFEXITED(status) && WEXITSTATUS(status) == 3));
    if (!fs::exists(p)) continue;  // killed before the file was renamed into place
    auto r = hone::mmap_ring::open(p, opt, rec_bytes, capacity);
    BOOST_TEST(r.end() >= last_end);
    BOOST_TEST(r.size() <= capacity);
    BOOST_TEST(r.end() - r.oldest() == r.size());
    bool all_ok = true;
    for (std::size_t i = 0; i < r.size(); ++i) all_ok = all_ok && record_ok(r[i], r.oldest() + i);
    BOOST_TEST(all_ok, "round " << round << ": a committed record is damaged");
    last_end = r.end();
    r.close();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE("mmap_ring kill test: " << kills << " kills, " << last_end
                                             << " records committed, " << secs << " s");
  BOOST_TEST(kills >= 15);
  BOOST_TEST(last_end > capacity);  // the ring wrapped across restarts
}

BOOST_AUTO_TEST_SUITE_END()

// ------------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(frame_store_tests)

namespace {

constexpr std::size_t side = 84;
constexpr std::size_t frame_px = side * side;

/// A Pong-like frame: constant background, two paddles and a ball that move with t.
std::vector<std::uint8_t> pong_frame(std::uint64_t t, std::uint64_t episode) {
  std::vector<std::uint8_t> f(frame_px, 144);
  for (std::size_t x = 0; x < side; ++x) {
    f[(14 + x % 2) * side + x] = 236;  // top wall
    f[(78 + x % 2) * side + x] = 236;  // bottom wall
  }
  auto rect = [&](std::size_t x0, std::size_t y0, std::size_t w, std::size_t h, std::uint8_t v) {
    for (std::size_t y = y0; y < y0 + h && y < side; ++y)
      for (std::size_t x = x0; x < x0 + w && x < side; ++x) f[y * side + x] = v;
  };
  rect(8, 20 + (t * 3 + episode) % 50, 2, 8, 213);
  rect(74, 20 + (t * 5 + 7) % 50, 2, 8, 92);
  rect(10 + (t * 2) % 62, 18 + (t * 3) % 58, 2, 2, 236);
  f[0] = static_cast<std::uint8_t>(t);  // score digits stand-in: every frame distinct
  f[1] = static_cast<std::uint8_t>(episode);
  return f;
}

/// Drives a frame_store and a naive reference (every frame and episode boundary kept forever).
struct reference_run {
  std::vector<std::vector<std::uint8_t>> frames;  // by id
  std::vector<std::uint64_t> episode_first;       // by id
  std::vector<bool> has_next;                     // by id
  std::vector<std::int32_t> action;
  std::vector<float> reward;
  std::vector<bool> terminal;

  void run(hone::frame_store& fs, std::size_t episodes, std::mt19937& rng) {
    for (std::size_t e = 0; e < episodes; ++e) {
      const std::size_t len = 1 + rng() % 12;
      auto f0 = pong_frame(0, e);
      const std::uint64_t first = fs.begin_episode(f0);
      BOOST_REQUIRE(first == frames.size());
      push(std::move(f0), first);
      const bool ends_terminal = rng() % 2 == 0;
      for (std::size_t t = 1; t <= len; ++t) {
        const bool term = ends_terminal && t == len;
        const auto a = static_cast<std::int32_t>(rng() % 6);
        const float r = static_cast<float>(rng() % 3) - 1.0f;
        auto f = pong_frame(t, e);
        has_next.back() = true;
        action.back() = a;
        reward.back() = r;
        terminal.back() = term;
        BOOST_REQUIRE(fs.add_step(a, r, term, f) == frames.size());
        push(std::move(f), first);
      }
    }
  }
  void push(std::vector<std::uint8_t> f, std::uint64_t first) {
    frames.push_back(std::move(f));
    episode_first.push_back(first);
    has_next.push_back(false);
    action.push_back(0);
    reward.push_back(0);
    terminal.push_back(false);
  }
  std::vector<std::uint8_t> expected_stack(std::uint64_t id, std::size_t k,
                                           hone::frame_padding pad) const {
    std::vector<std::uint8_t> out;
    for (std::size_t j = 0; j < k; ++j) {
      const std::uint64_t back = k - 1 - j;
      if (id >= back && id - back >= episode_first[id]) {
        out.insert(out.end(), frames[id - back].begin(), frames[id - back].end());
      } else if (pad == hone::frame_padding::zeros) {
        out.insert(out.end(), frame_px, 0);
      } else {
        const auto& f = frames[episode_first[id]];
        out.insert(out.end(), f.begin(), f.end());
      }
    }
    return out;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(stacks_match_reference_with_overwrite) {
  for (const bool compress : {false, true}) {
    for (const auto pad : {hone::frame_padding::zeros, hone::frame_padding::repeat_first}) {
      hone::frame_store_options opt;
      opt.stack = 4;
      opt.padding = pad;
      opt.compress = compress;
      hone::frame_store fs(50, frame_px, opt);
      reference_run ref;
      std::mt19937 rng(7);
      ref.run(fs, 40, rng);  // ~300 frames through a 50-frame ring
      BOOST_TEST(fs.frames() == 50u);
      BOOST_TEST(fs.end() == ref.frames.size());
      std::size_t checked = 0;
      std::size_t live_transitions = 0;
      std::vector<std::uint8_t> got(4 * frame_px);
      for (std::uint64_t id = fs.oldest(); id < fs.end(); ++id) {
        if (ref.has_next[id]) ++live_transitions;
        const bool history_live =
            id - std::min<std::uint64_t>(id - ref.episode_first[id], 3) >= fs.oldest();
        const bool expect = ref.has_next[id] && id + 1 < fs.end() && history_live;
        BOOST_TEST(fs.sampleable(id) == expect, "id " << id);
        if (!fs.sampleable(id)) continue;
        fs.stack(id, got);
        BOOST_TEST((got == ref.expected_stack(id, 4, pad)), "id " << id);
        fs.stack(id + 1, got);
        BOOST_TEST((got == ref.expected_stack(id + 1, 4, pad)), "id " << id + 1);
        BOOST_TEST(fs.meta(id).action == ref.action[id]);
        BOOST_TEST(fs.meta(id).reward == ref.reward[id]);
        BOOST_TEST(((fs.meta(id).flags & hone::frame_meta::terminal) != 0) == ref.terminal[id]);
        ++checked;
      }
      BOOST_TEST(fs.transitions() == live_transitions);
      BOOST_TEST(checked > 20u);
      // Sampling and gathering.
      std::mt19937_64 g(3);
      std::vector<std::uint64_t> ids(16);
      for (auto& id : ids) id = fs.sample_id(g);
      std::vector<std::uint8_t> obs(16 * 4 * frame_px), next(16 * 4 * frame_px), term(16);
      std::vector<std::int32_t> act(16);
      std::vector<float> rew(16);
      fs.gather(ids, obs, next, act, rew, term);
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const auto want = ref.expected_stack(ids[i] + 1, 4, pad);
        BOOST_TEST(std::memcmp(next.data() + i * 4 * frame_px, want.data(), want.size()) == 0);
        BOOST_TEST(act[i] == ref.action[ids[i]]);
      }
      // An id whose history was overwritten is refused.
      BOOST_CHECK_THROW(fs.stack(fs.oldest() - 1, got), hone::config_error);
    }
  }
}

BOOST_AUTO_TEST_CASE(argument_checks) {
  BOOST_CHECK_THROW(hone::frame_store(1, 10), hone::config_error);
  BOOST_CHECK_THROW(hone::frame_store(4, 10, {.stack = 4}), hone::config_error);
  hone::frame_store fs(8, 4);
  const std::vector<std::uint8_t> f(4, 1), bad(5, 1);
  BOOST_CHECK_THROW(fs.add_step(0, 0, false, f), hone::config_error);  // no episode yet
  BOOST_CHECK_THROW(fs.begin_episode(bad), hone::config_error);
  fs.begin_episode(f);
  fs.add_step(0, 0, true, f);
  BOOST_CHECK_THROW(fs.add_step(0, 0, false, f), hone::config_error);  // after terminal
}

// The budget: 84x84 uint8 stacks of 4 cost <= 7.1 KB per transition without compression.
BOOST_AUTO_TEST_CASE(bytes_per_transition_and_zstd_ratio) {
  constexpr std::size_t capacity = 20000;
  constexpr std::size_t episode_len = 1000;
  double raw_bpt = 0, z_bpt = 0, ratio = 0;
  for (const bool compress : {false, true}) {
    hone::frame_store_options opt;
    opt.compress = compress;
    hone::frame_store fs(capacity, frame_px, opt);
    for (std::uint64_t e = 0; e * (episode_len + 1) < capacity + 3000; ++e) {
      fs.begin_episode(pong_frame(0, e));
      for (std::uint64_t t = 1; t <= episode_len; ++t) {
        fs.add_step(0, 0.0f, t == episode_len, pong_frame(t, e));
      }
    }
    BOOST_TEST(fs.frames() == capacity);
    (compress ? z_bpt : raw_bpt) = fs.bytes_per_transition();
    if (compress) ratio = fs.compression_ratio();
  }
  BOOST_TEST_MESSAGE("frame_store_bytes_per_transition (84x84x4, uncompressed): " << raw_bpt);
  BOOST_TEST_MESSAGE("frame_store_bytes_per_transition (zstd level 1 per frame): " << z_bpt);
  BOOST_TEST_MESSAGE("frame_store_zstd_ratio (synthetic Pong frames): " << ratio);
  BOOST_TEST(raw_bpt <= 7100.0);
  BOOST_TEST(raw_bpt >= 7056.0);
  BOOST_TEST(ratio > 5.0);
  BOOST_TEST(z_bpt < raw_bpt / 4);
}

BOOST_AUTO_TEST_SUITE_END()
