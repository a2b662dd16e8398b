// The power-loss test: every crash state a POSIX file system may leave during a save (see
// power_loss.hpp for what is enumerated and what is not) must open, with hone's own readers, as
// the previous or the new save, never as a damaged or mixed one, and never lose a save that
// returned. Over: checkpoint commits (first save, new step, re-saved step by exchange, compressed
// files), retention deleting old steps, replay buffer saves (first and replacing), and the
// memory-mapped ring (creation, commits, wrap-around evictions, close). A self-test first shows
// that the harness refuses a save that skips its fsyncs.
#define BOOST_TEST_MODULE hone_checkpoint_power_loss
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <hone/checkpoint/directory.hpp>
#include <hone/checkpoint/retention.hpp>
#include <hone/checkpoint/state.hpp>
#include <hone/checkpoint/verify.hpp>
#include <hone/checkpoint/writer.hpp>
#include <hone/io/directory.hpp>
#include <hone/io/file_io.hpp>
#include <hone/rl/mmap_ring.hpp>
#include <hone/rl/replay_buffer.hpp>
#include <hone/rl/replay_io.hpp>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "power_loss.hpp"

namespace fs = std::filesystem;
namespace ck = hone::checkpoint;
namespace io = hone::io;
namespace pl = power_loss;

namespace {

using clock_type = std::chrono::steady_clock;

// A fresh directory for one test, on tmpfs when the machine has one (the saves' fsyncs and the
// rebuilt crash states then cost no disk I/O), removed at the end.
struct work_dir {
  fs::path path;
  explicit work_dir(const std::string& tag) {
    static int counter = 0;
    std::error_code ec;
    const fs::path shm = "/dev/shm";
    const fs::path base = fs::is_directory(shm, ec) && ::access(shm.c_str(), W_OK) == 0
                              ? shm
                              : fs::temp_directory_path();
    path = base / ("hone-power-loss-" + tag + "-" + std::to_string(::getpid()) + "-" +
                   std::to_string(counter++));
    fs::remove_all(path, ec);
    fs::create_directories(path);
  }
  ~work_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  work_dir(const work_dir&) = delete;
  work_dir& operator=(const work_dir&) = delete;
};

std::string read_bytes(const fs::path& p) {
  std::string data(static_cast<std::size_t>(fs::file_size(p)), '\0');
  FILE* f = std::fopen(p.c_str(), "rb");
  BOOST_REQUIRE(f != nullptr);
  const bool ok = std::fread(data.data(), 1, data.size(), f) == data.size();
  std::fclose(f);
  BOOST_REQUIRE(ok);
  return data;
}

// The regular files of a directory: name -> bytes.
std::map<std::string, std::string> files_of(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) out[e.path().filename().string()] = read_bytes(e.path());
  }
  return out;
}

// Runs the check, prints the figures, and fails the test with the first refused states.
void require_all_open(const pl::recording& rec, const fs::path& scratch, const pl::oracle& o,
                      const std::string& what) {
  const auto problems = rec.problems();
  for (const auto& p : problems) BOOST_ERROR(what << ": the recording is incomplete: " << p);
  BOOST_REQUIRE(problems.empty());
  const auto t0 = clock_type::now();
  const pl::check_report r = rec.check(scratch, o);
  const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
  BOOST_TEST_MESSAGE(what << ": " << r.summary() << " in " << secs << " s");
  std::printf("power loss, %s: %s (%.2f s)\n", what.c_str(), r.summary().c_str(), secs);
  BOOST_TEST(r.ops > 10u);
  BOOST_TEST(r.distinct > 1u);
  for (const auto& f : r.failures) BOOST_ERROR(what << ": " << f);
  BOOST_TEST(r.failed == 0u, what << ": " << r.failed << " crash states do not open as the "
                                  << "previous or the new save; log:\n"
                                  << (r.failed > 0 ? rec.log_text() : std::string()));
}

// ---------------------------------------------------------------------------------------------
// Checkpoint directories: the plan of saves and what each crash state may show.

struct planned_save {
  std::uint64_t step;
  int version;
  std::vector<std::uint64_t> deletes;  // steps its retention removes
};

std::vector<float> values(std::uint64_t step, int version, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(step * 100 + static_cast<std::uint64_t>(version)) +
           0.5f * static_cast<float>(i % 17);
  }
  return v;
}

void fill(ck::snapshot& s, std::uint64_t step, int version) {
  s.add(ck::files::weights, "w", {96}, values(step, version, 96));
  s.add(ck::files::optimizer, "exp_avg.w", {64}, values(step, version + 7, 64));
  s.state.step = step;
  s.state.metadata["version"] = std::to_string(version);
}

using version_map = std::map<std::pair<std::uint64_t, int>, std::map<std::string, std::string>>;

// What a crash state under `root` must look like when `done` of the planned saves returned
// (after the baseline steps) and plan[done], if any, was running.
std::optional<std::string> check_checkpoints(const fs::path& root,
                                             const std::map<std::uint64_t, int>& baseline,
                                             const std::vector<planned_save>& plan,
                                             std::size_t done, const version_map& versions) {
  std::map<std::uint64_t, int> durable = baseline;
  for (std::size_t i = 0; i < done && i < plan.size(); ++i) {
    durable[plan[i].step] = plan[i].version;
    for (const auto d : plan[i].deletes) durable.erase(d);
  }
  const planned_save* flight = done < plan.size() ? &plan[done] : nullptr;
  // step -> allowed versions (-1: absent)
  std::map<std::uint64_t, std::set<int>> allowed;
  for (const auto& [s, v] : durable) allowed[s].insert(v);
  if (flight != nullptr) {
    if (!durable.contains(flight->step)) allowed[flight->step].insert(-1);
    allowed[flight->step].insert(flight->version);
    for (const auto d : flight->deletes) allowed[d].insert(-1);
  }
  std::set<std::uint64_t> visible;
  for (const auto& c : ck::list_checkpoints(root)) {
    visible.insert(c.step);
    const auto it = allowed.find(c.step);
    if (it == allowed.end()) {
      return "step " + std::to_string(c.step) + " is visible but should not exist";
    }
    const ck::verify_report vr = ck::verify_directory(c.path, true);
    if (!vr.ok()) {
      return "step " + std::to_string(c.step) +
             " looks committed but does not verify: " + vr.problems.front();
    }
    if (ck::read_state(c.path / ck::files::state).step != c.step) {
      return "step " + std::to_string(c.step) + "'s state.json names another step";
    }
    const auto files = files_of(c.path);
    bool match = false;
    for (const int v : it->second) {
      const auto w = versions.find({c.step, v});
      if (v >= 0 && w != versions.end() && w->second == files) match = true;
    }
    if (!match) return "step " + std::to_string(c.step) + " holds none of its allowed versions";
  }
  for (const auto& [s, vs] : allowed) {
    if (!vs.contains(-1) && !visible.contains(s)) {
      return "step " + std::to_string(s) + ", committed by a save that returned, is lost";
    }
  }
  // Steps as signed numbers, -1 for none.
  auto step_or_none = [](const std::optional<ck::checkpoint_entry>& c) {
    return c ? static_cast<long long>(c->step) : -1LL;
  };
  const long long want = visible.empty() ? -1LL : static_cast<long long>(*visible.rbegin());
  if (step_or_none(ck::newest_valid(root)) != want) {
    return "newest_valid is not the newest visible step";
  }
  // A restart: its cleaning removes every temporary and keeps the same newest checkpoint.
  if (fs::exists(root)) {
    (void)ck::clean_leftovers(root);
    for (const auto& e : fs::directory_iterator(root)) {
      if (e.path().filename().string().starts_with(io::temp_prefix)) {
        return "clean_leftovers left '" + e.path().filename().string() + "'";
      }
    }
    if (step_or_none(ck::newest_valid(root)) != want) {
      return "cleaning the leftovers changed the newest checkpoint";
    }
  }
  return std::nullopt;
}

}  // namespace

// The harness must refuse a save that renames a file into place without fsyncing it or its
// directory, and accept the same save with both fsyncs.
BOOST_AUTO_TEST_CASE(harness_refuses_a_save_without_fsync) {
  work_dir tmp("self");
  const fs::path sandbox = tmp.path / "fs";
  fs::create_directories(sandbox);
  io::write_file(sandbox / "data", std::string_view("old contents, 32 bytes long....."));
  const std::string old_text = read_bytes(sandbox / "data");
  const std::string new_text(3000, 'n');
  auto save = [&](bool sync) {
    io::write_file(sandbox / "data.tmp", new_text, sync);
    io::rename_path(sandbox / "data.tmp", sandbox / "data");
    if (sync) io::sync_directory(sandbox);
  };
  auto oracle = [&](const fs::path& root, const pl::crash_point& cp) -> std::optional<std::string> {
    if (!fs::exists(root / "data")) return "the file is gone";
    const std::string got = read_bytes(root / "data");
    if (got == new_text) return std::nullopt;
    if (got == old_text && cp.marks.empty()) return std::nullopt;
    return "the file holds " + std::to_string(got.size()) + " bytes of neither version";
  };
  for (const bool sync : {false, true}) {
    pl::recording rec(sandbox);
    save(sync);
    rec.mark("saved");
    rec.stop();
    BOOST_TEST(rec.problems().empty());
    const pl::check_report r = rec.check(tmp.path / "scratch", oracle);
    std::printf("power loss, self-test with%s fsync: %s\n", sync ? "" : "out", r.summary().c_str());
    if (sync) {
      BOOST_TEST(r.failed == 0u);
      for (const auto& f : r.failures) BOOST_ERROR(f);
    } else {
      BOOST_TEST(r.failed > 0u, "the harness accepted a save without fsync");
    }
  }
}

// Checkpoint commits: a first save into a new root, a new step, the same step saved again (an
// atomic exchange), and a compressed save by a second writer.
BOOST_AUTO_TEST_CASE(checkpoint_commit) {
  work_dir tmp("commit");
  const fs::path sandbox = tmp.path / "fs";
  const fs::path root = sandbox / "run" / "ckpt";
  fs::create_directories(sandbox);
  const std::vector<planned_save> plan{{1, 0, {}}, {2, 0, {}}, {2, 1, {}}, {3, 0, {}}};
  version_map versions;
  {
    pl::recording rec(sandbox);
    {
      ck::checkpoint_writer w({.root = root});
      for (std::size_t i = 0; i < 3; ++i) {
        w.save(plan[i].step, [&](ck::snapshot& s) { fill(s, plan[i].step, plan[i].version); });
        versions[{plan[i].step, plan[i].version}] =
            files_of(root / ck::step_dir_name(plan[i].step));
        rec.mark("saved");
      }
    }
    ck::checkpoint_writer w2({.root = root, .compression = ck::compression_options{}});
    w2.save(3, [&](ck::snapshot& s) { fill(s, 3, 0); });
    versions[{3, 0}] = files_of(root / ck::step_dir_name(3));
    rec.mark("saved");
    rec.stop();
    require_all_open(
        rec, tmp.path / "scratch",
        [&](const fs::path& r, const pl::crash_point& cp) {
          return check_checkpoints(r / "run" / "ckpt", {}, plan, cp.marks.size(), versions);
        },
        "checkpoint commit");
  }
}

// Retention: each save deletes the oldest step (keep_last = 2) after committing its own.
BOOST_AUTO_TEST_CASE(checkpoint_retention) {
  work_dir tmp("retention");
  const fs::path sandbox = tmp.path / "fs";
  const fs::path root = sandbox / "ckpt";
  fs::create_directories(sandbox);
  version_map versions;
  std::map<std::uint64_t, int> baseline;
  {
    ck::checkpoint_writer w({.root = root});
    for (std::uint64_t s : {1, 2}) {
      w.save(s, [&](ck::snapshot& snap) { fill(snap, s, 0); });
      versions[{s, 0}] = files_of(root / ck::step_dir_name(s));
      baseline[s] = 0;
    }
  }
  const std::vector<planned_save> plan{{3, 0, {1}}, {4, 0, {2}}};
  pl::recording rec(sandbox);
  {
    ck::checkpoint_writer w({.root = root, .retention = ck::retention_policy{.keep_last = 2}});
    for (const auto& p : plan) {
      w.save(p.step, [&](ck::snapshot& s) { fill(s, p.step, p.version); });
      versions[{p.step, p.version}] = files_of(root / ck::step_dir_name(p.step));
      rec.mark("saved");
    }
  }
  rec.stop();
  BOOST_TEST(!fs::exists(root / ck::step_dir_name(1)));
  BOOST_TEST(!fs::exists(root / ck::step_dir_name(2)));
  require_all_open(
      rec, tmp.path / "scratch",
      [&](const fs::path& r, const pl::crash_point& cp) {
        return check_checkpoints(r / "ckpt", baseline, plan, cp.marks.size(), versions);
      },
      "retention");
}

// Replay buffer saves: the first one (rename) and one replacing it (exchange).
BOOST_AUTO_TEST_CASE(replay_buffer_save) {
  using step = hone::transition<hone::field<"obs", float, 3>, hone::field<"reward", float>>;
  using buffer = hone::replay_buffer<step, hone::prioritized<>>;
  constexpr std::size_t capacity = 48;
  work_dir tmp("replay");
  const fs::path sandbox = tmp.path / "fs";
  const fs::path dir = sandbox / "replay";
  fs::create_directories(sandbox);

  struct saved {
    std::uint64_t written;
    std::vector<std::string> columns;
    std::vector<float> priorities;
  };
  auto capture = [](buffer& b) {
    saved s{b.state().written, {}, {}};
    for (std::size_t f = 0; f < step::field_count; ++f) {  // any storage (the default packs)
      std::string bytes(b.capacity() * buffer::field_bytes(f), '\0');
      b.read_field(f, 0, std::as_writable_bytes(std::span(bytes.data(), bytes.size())));
      s.columns.push_back(std::move(bytes));
    }
    const auto p = b.priorities();
    s.priorities.assign(p.begin(), p.end());
    return s;
  };
  buffer b(capacity);
  auto add = [&](std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) {
      step::record r{};
      const std::uint64_t k = b.state().written;
      hone::get<"obs">(r)[0] = static_cast<float>(k);
      hone::get<"obs">(r)[1] = static_cast<float>(k) * 0.5f;
      hone::get<"obs">(r)[2] = -static_cast<float>(k);
      hone::get<"reward">(r) = static_cast<float>(k % 5);
      b.add(r);
    }
  };
  std::vector<saved> versions;
  pl::recording rec(sandbox);
  add(30);
  hone::save_replay_buffer(b, dir);
  versions.push_back(capture(b));
  rec.mark("saved");
  add(40);  // wraps
  hone::save_replay_buffer(b, dir);
  versions.push_back(capture(b));
  rec.mark("saved");
  rec.stop();
  require_all_open(
      rec, tmp.path / "scratch",
      [&](const fs::path& r, const pl::crash_point& cp) -> std::optional<std::string> {
        const std::size_t done = cp.marks.size();
        const fs::path d = r / "replay";
        if (!fs::exists(d)) {
          if (done == 0) return std::nullopt;  // a first save that had not returned
          return "the save that returned is gone";
        }
        buffer loaded(capacity);
        try {
          hone::load_replay_buffer(loaded, d);
        } catch (const std::exception& e) {
          return std::string("load_replay_buffer failed: ") + e.what();
        }
        const saved got = capture(loaded);
        for (std::size_t v = (done == 0 ? 0 : done - 1); v <= done && v < versions.size(); ++v) {
          const saved& want = versions[v];
          if (got.written == want.written && got.columns == want.columns &&
              got.priorities == want.priorities) {
            return std::nullopt;
          }
        }
        return "the loaded buffer (" + std::to_string(got.written) +
               " written) is neither the previous nor the new save";
      },
      "replay buffer save");
}

// The memory-mapped ring: creation, automatic commits every 5 records, wrap-around evictions and
// close. A crash state must open with every committed record intact and lose no commit that
// returned.
BOOST_AUTO_TEST_CASE(mmap_ring_commits) {
  constexpr std::size_t record_size = 40;
  constexpr std::size_t capacity = 32;
  work_dir tmp("ring");
  const fs::path sandbox = tmp.path / "fs";
  fs::create_directories(sandbox);
  auto record = [](std::uint64_t seq) {
    std::vector<std::byte> r(record_size);
    for (std::size_t i = 0; i < record_size; ++i) {
      r[i] = static_cast<std::byte>((seq * 31 + i * 7 + (seq >> 3)) & 0xff);
    }
    std::memcpy(r.data(), &seq, sizeof seq);
    return r;
  };
  struct commit_point {
    std::uint64_t generation, begin, end;
  };
  std::vector<commit_point> commits;  // one per mark
  pl::recording rec(sandbox);
  {
    hone::mmap_ring ring =
        hone::mmap_ring::create(sandbox / "ring", record_size, capacity, {.commit_every = 5});
    auto note = [&] {
      commits.push_back({ring.generation(), ring.oldest(), ring.committed_end()});
      rec.mark("commit");
    };
    note();
    for (std::uint64_t seq = 0; seq < 83; ++seq) {
      const std::uint64_t g = ring.generation();
      ring.push(record(seq));
      if (ring.generation() != g) note();
    }
    ring.commit();
    note();
    ring.close();
  }
  rec.stop();
  require_all_open(
      rec, tmp.path / "scratch",
      [&](const fs::path& r, const pl::crash_point& cp) -> std::optional<std::string> {
        const std::size_t done = cp.marks.size();
        if (!fs::exists(r / "ring")) {
          if (done == 0) return std::nullopt;  // create() had not returned
          return "the ring file is gone";
        }
        std::optional<hone::mmap_ring> ring;
        try {
          ring.emplace(hone::mmap_ring::open(r / "ring", {}, record_size, capacity));
        } catch (const std::exception& e) {
          return std::string("open failed: ") + e.what();
        }
        const std::uint64_t gen = ring->generation(), end = ring->end(), begin = ring->oldest();
        if (done > 0 && (gen < commits[done - 1].generation || end < commits[done - 1].end)) {
          return "commit " + std::to_string(commits[done - 1].generation) +
                 ", which returned, is lost (generation " + std::to_string(gen) + ")";
        }
        const std::uint64_t max_end =
            done < commits.size() ? commits[done].end : commits.back().end;
        if (end > max_end) return "the ring shows records no commit published";
        for (std::uint64_t seq = begin; seq < end; ++seq) {
          const auto got = ring->at_sequence(seq);
          const auto want = record(seq);
          if (!std::equal(got.begin(), got.end(), want.begin())) {
            return "record " + std::to_string(seq) + " of the committed range [" +
                   std::to_string(begin) + ", " + std::to_string(end) + ") is damaged";
          }
        }
        return std::nullopt;
      },
      "mmap ring");
}
