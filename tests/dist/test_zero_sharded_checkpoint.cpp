// Sharded checkpoints of ZeRO trainers (hone/checkpoint/sharded.hpp, save_sharded), ranks as
// threads (thread_comm.hpp):
//  - 2 ranks of hone::zero<2> train steps 0..3 and save a sharded checkpoint (every rank writes its
//    own part; one MANIFEST; shards.json describes every tensor whole and its parts); it resumes
//    on 1, 2 and 3 ranks with zero<1> and zero<2>, and in a trainer without ZeRO: every
//    continuation matches one process that never stopped within 1e-6 and every rank of it holds
//    the same bits; the merged tensors equal the consolidated capture's bit for bit; a rank reads
//    only the parts that overlap its shard;
//  - a part missing, truncated, damaged, left out of the MANIFEST, or a tensor's part left out of
//    the index: verify_directory and restore refuse it with a sentence naming the part, and
//    newest_valid falls back to the previous checkpoint;
//  - plain trainers (the whole state on every rank) save sharded on 1, 3 and 7 ranks (the last
//    rank's shard empty), compressed parts, retention;
//  - a rank failing mid-save (its file cannot be written; rank 0's weights cannot be written; a
//    collective fails): no checkpoint of that step appears, no temporary is left, every rank gets
//    an error naming the failed rank, newest_valid skips it;
//  - hone-ckpt verify/info read the sharded checkpoint; convert --to file writes one safetensors
//    file whose tensors equal the consolidated capture's bit for bit; convert --to safetensors
//    writes an ordinary checkpoint that restores. With HONE_TEST_SHARDED_OUT set, the merged file
//    and the consolidated checkpoint are kept there for sharded_interop.py (Python's safetensors).
#define BOOST_TEST_MODULE hone_dist_zero_sharded_checkpoint
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <hone/checkpoint/directory.hpp>
#include <hone/checkpoint/sharded.hpp>
#include <hone/dist.hpp>
#include <hone/train/trainer.hpp>
#include <span>
#include <string>
#include <vector>

#include "flaky_comm.hpp"
#include "thread_comm.hpp"
#include "zero_resume.hpp"
#include "zero_scenario.hpp"

namespace ck = hone::checkpoint;
namespace fs = std::filesystem;

namespace {

/// A fresh temporary directory, removed at the end of the test.
struct temp_root {
  fs::path path;
  explicit temp_root(const std::string& tag)
      : path(fs::temp_directory_path() /
             ("hone-test-sharded-" + tag + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_root() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

/// 2 ranks of zero<2>: steps 0..3, then a sharded checkpoint of step 4 under `root`; with
/// `consolidated`, rank 0's consolidated capture of the same state.
void save_two_ranks(const fs::path& root, ck::snapshot* consolidated = nullptr) {
  std::vector<ck::snapshot> snaps(2);
  thread_group g(2);
  g.run([&](int r) {
    thread_comm c(g, r);
    (void)zero_segment_sharded<2>(
        c, {}, 0, 4, root, consolidated != nullptr ? &snaps[static_cast<std::size_t>(r)] : nullptr);
  });
  if (consolidated != nullptr) *consolidated = std::move(snaps[0]);
}

/// Whether every tensor of `want` is in `got` with the same name, dtype, shape and bytes (used by
/// the hone-ckpt cases only, which a build without the tools leaves out).
[[maybe_unused]] bool same_tensors(const ck::tensor_file& want, const ck::tensor_file& got,
                                   std::string& why) {
  for (const auto& t : want.tensors()) {
    const ck::tensor_info* u = got.find(t.name);
    if (u == nullptr || u->type != t.type || u->shape != t.shape) {
      why = "tensor '" + t.name + "' is missing or has another dtype or shape";
      return false;
    }
    std::vector<std::byte> a(t.size_bytes()), b(u->size_bytes());
    want.read(t, a);
    got.read(*u, b);
    if (a != b) {
      why = "tensor '" + t.name + "' has other bytes";
      return false;
    }
  }
  return true;
}

void copy_dir(const fs::path& from, const fs::path& to) {
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

/// The checkpoint error restore() throws for `dir`, or "" when it restores.
std::string restore_error(const fs::path& dir) {
  mlp<hone::half> m;
  auto t = scenario_trainer(m);
  try {
    (void)ck::restore(t, dir);
  } catch (const hone::checkpoint_error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

#ifdef HONE_CKPT_TOOL
int run_tool(const std::string& args, const fs::path& output) {
  const std::string cmd =
      std::string(HONE_CKPT_TOOL) + " " + args + " > " + output.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
#endif

const std::string part0 = "optimizer-00000-of-00002.safetensors";
const std::string part1 = "optimizer-00001-of-00002.safetensors";

}  // namespace

BOOST_AUTO_TEST_CASE(a_sharded_checkpoint_of_two_ranks_resumes_on_one_two_and_three) {
  const temp_root root("resume");
  ck::snapshot consolidated;
  save_two_ranks(root.path, &consolidated);
  const fs::path dir = root.path / ck::step_dir_name(4);
  // One MANIFEST for the set; one part per rank; no temporary left.
  BOOST_TEST_REQUIRE(ck::verify_directory(dir).ok(), joined(ck::verify_directory(dir).problems));
  const ck::manifest m = ck::manifest::read(dir / ck::files::manifest);
  for (const std::string& f :
       {part0, part1, std::string(ck::files::weights), std::string(ck::files::state),
        std::string(ck::files::shard_index)}) {
    BOOST_TEST(m.find(f) != nullptr, f);
  }
  BOOST_TEST(m.size() == 5u);
  BOOST_TEST(!fs::exists(dir / ck::files::optimizer));
  for (const auto& e : fs::directory_iterator(root.path)) {
    BOOST_TEST(!e.path().filename().string().starts_with(ck::temp_prefix), e.path().string());
  }
  // The index describes the tensors whole (the model's shapes) and their parts: 2 ranks cut the
  // arena at element 48, after layer1.weight.
  const ck::shard_index idx = ck::shard_index::read(dir / ck::files::shard_index);
  BOOST_TEST(idx.world_size == 2u);
  BOOST_TEST((idx.find("exp_avg.layer1.weight")->shape == ck::shape_type{8, 6}));
  BOOST_TEST(
      (idx.find("exp_avg.layer1.weight")->parts == std::vector<ck::shard_part>{{part0, 0, 48}}));
  BOOST_TEST(idx.find("exp_avg_sq.layer2.bias")->parts.size() == 1u);
  BOOST_TEST(idx.find("exp_avg_sq.layer2.bias")->parts[0].file == part1);
  // Each part file says which ranges it holds.
  const ck::tensor_file f1 = ck::tensor_file::open(dir / part1);
  BOOST_TEST(contains(f1.metadata().at("hone.shard"), "\"world_size\":2"));
  // The merged tensors are the consolidated capture's, bit for bit.
  fs::create_directories(root.path / "consolidated");
  const fs::path cdir = ck::write_snapshot(root.path / "consolidated", 4, consolidated,
                                           {.compression = std::nullopt, .sync = false});
  const ck::tensor_file copt = ck::tensor_file::open(cdir / ck::files::optimizer);
  ck::sharded_reader reader(dir, idx);
  for (const auto& t : copt.tensors()) {
    const auto whole = reader.read_whole(t.name);
    const auto want = copt.read_as<float>(t.name);
    BOOST_TEST(std::memcmp(whole.data(), want.data(), want.size() * sizeof(float)) == 0, t.name);
  }
  BOOST_TEST(copt.tensors().size() == idx.tensors.size());
  // A range inside rank 0's part opens rank 0's file only.
  ck::sharded_reader narrow(dir, idx);
  std::vector<float> some(8);
  narrow.read_range("exp_avg.layer1.weight", 8, some);
  BOOST_TEST((narrow.opened() == std::vector<std::string>{part0}));

  const std::vector<float> want = six_batch_reference(8);
  check_resumes_on_one_two_and_three(dir, want);
  const auto wp = plain_resume(dir);  // a trainer without ZeRO reads every part
  BOOST_TEST(max_abs_diff(wp, want) <= 1e-6, max_abs_diff(wp, want));
  // The same as resuming the consolidated checkpoint, bit for bit.
  BOOST_TEST(same_bits(wp, plain_resume(cdir)));
  BOOST_TEST(same_bits(resume_on<2>(2, dir)[0], resume_on<2>(2, cdir)[0]));
  // And the comparison can fail: the weights moved after step 4.
  BOOST_TEST(max_abs_diff(six_batch_reference(4), want) > 1e-4);
}

BOOST_AUTO_TEST_CASE(a_missing_truncated_or_damaged_part_is_refused_with_a_sentence) {
  const temp_root root("damage");
  save_two_ranks(root.path);
  const fs::path good = root.path / ck::step_dir_name(4);
  const fs::path bad = root.path / "bad";

  // Rank 1's part missing.
  copy_dir(good, bad);
  fs::remove(bad / part1);
  auto r = ck::verify_directory(bad);
  BOOST_TEST_REQUIRE(!r.ok());
  BOOST_TEST(contains(r.problems.front(), part1), r.problems.front());
  BOOST_TEST(contains(r.problems.front(), "missing"), r.problems.front());
  std::string e = restore_error(bad);
  BOOST_TEST(contains(e, part1), e);

  // Truncated.
  copy_dir(good, bad);
  fs::resize_file(bad / part1, fs::file_size(bad / part1) - 8);
  r = ck::verify_directory(bad);
  BOOST_TEST_REQUIRE(!r.ok());
  BOOST_TEST(contains(r.problems.front(), part1), r.problems.front());
  BOOST_TEST(contains(r.problems.front(), "(truncated)"), r.problems.front());

  // One byte flipped in the last piece's data.
  copy_dir(good, bad);
  {
    std::fstream io(bad / part0, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(-3, std::ios::end);
    char c = 0;
    io.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    io.seekp(-3, std::ios::end);
    io.write(&c, 1);
  }
  r = ck::verify_directory(bad);
  BOOST_TEST_REQUIRE(!r.ok());
  BOOST_TEST(contains(r.problems.front(), part0), r.problems.front());
  BOOST_TEST(contains(r.problems.front(), "damaged"), r.problems.front());
  e = restore_error(bad);
  BOOST_TEST(contains(e, part0), e);

  // The part removed and left out of a rewritten (self-consistent) MANIFEST: the index names it.
  copy_dir(good, bad);
  {
    const ck::manifest old = ck::manifest::read(bad / ck::files::manifest);
    ck::manifest without;
    for (const auto& en : old.entries()) {
      if (en.name != part1) without.add(en.name, {en.size, en.hash});
    }
    fs::remove(bad / part1);
    (void)without.write(bad / ck::files::manifest, false);
  }
  r = ck::verify_directory(bad);
  BOOST_TEST_REQUIRE(!r.ok());
  BOOST_TEST(contains(r.problems.front(), "the part file '" + part1 + "' of rank 1 of 2"),
             r.problems.front());
  BOOST_TEST(contains(r.problems.front(), "not listed in the MANIFEST"), r.problems.front());
  e = restore_error(bad);
  BOOST_TEST(contains(e, part1), e);

  // An index whose tensor lost a part (rewritten, with a MANIFEST that matches it).
  copy_dir(good, bad);
  {
    ck::shard_index idx = ck::shard_index::read(bad / ck::files::shard_index);
    for (auto& t : idx.tensors) {
      if (t.name == "exp_avg_sq.layer2.bias") t.parts.clear();
    }
    ck::manifest m = ck::manifest::read(bad / ck::files::manifest);
    m.add(std::string(ck::files::shard_index), idx.write(bad / ck::files::shard_index, false));
    (void)m.write(bad / ck::files::manifest, false);
  }
  r = ck::verify_directory(bad);
  BOOST_TEST_REQUIRE(!r.ok());
  BOOST_TEST(contains(r.problems.front(), "a part is missing"), r.problems.front());

  // newest_valid falls back past a damaged newer checkpoint.
  copy_dir(good, root.path / ck::step_dir_name(5));
  fs::remove(root.path / ck::step_dir_name(5) / part0);
  std::vector<std::string> skipped;
  const auto newest = ck::newest_valid(root.path, true, &skipped);
  BOOST_TEST_REQUIRE(newest.has_value());
  BOOST_TEST(newest->step == 4u);
  BOOST_TEST_REQUIRE(skipped.size() == 1u);
  BOOST_TEST(contains(skipped[0], part0), skipped[0]);
}

BOOST_AUTO_TEST_CASE(a_rank_failing_mid_save_leaves_no_valid_checkpoint) {
  const temp_root root("fail");
  save_two_ranks(root.path);  // step 4: committed
  const auto no_step_6 = [&] {
    BOOST_TEST(!fs::exists(root.path / ck::step_dir_name(6)));
    for (const auto& e : fs::directory_iterator(root.path)) {
      BOOST_TEST(!e.path().filename().string().starts_with(ck::temp_prefix), e.path().string());
    }
    const auto newest = ck::newest_valid(root.path);
    BOOST_TEST_REQUIRE(newest.has_value());
    BOOST_TEST(newest->step == 4u);
  };
  // Each case: the file whose creation fails, and what every rank's error must say.
  struct fault {
    std::string file;
    std::string failed;  // "rank 1 could not write its part"
  };
  for (const fault& f :
       {fault{part1, "rank 1 could not write its part"},
        fault{std::string(ck::files::weights), "rank 0 could not write its part"}}) {
    BOOST_TEST_CONTEXT("failing " << f.file) {
      ck::write_fault_hook() = [&](const fs::path& p) {
        if (p.filename() == f.file &&
            p.parent_path().filename().string().find("step-000000006") != std::string::npos) {
          throw hone::io_error("injected: no space left on device writing '" + p.string() + "'");
        }
      };
      std::vector<std::string> errors(2);
      thread_group g(2);
      g.run([&](int r) {
        thread_comm c(g, r);
        try {
          (void)zero_segment_sharded<2>(c, root.path / ck::step_dir_name(4), 4, 6, root.path);
        } catch (const hone::checkpoint_error& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
      ck::write_fault_hook() = nullptr;
      for (const auto& e : errors) {
        BOOST_TEST(contains(e, "was not committed"), e);
        BOOST_TEST(contains(e, f.failed), e);
      }
      const std::size_t failing = f.file == part1 ? 1 : 0;
      BOOST_TEST(contains(errors[failing], "injected: no space left"), errors[failing]);
      no_step_6();
    }
  }
  // A collective that fails (a rank that died): dist_error, and no checkpoint.
  for (int n : {1, 2, 3}) {
    BOOST_TEST_CONTEXT("collective #" << n << " fails") {
      dist_test::flaky_comm fc;
      fc.fail_at = n;
      mlp<hone::half> m;
      auto t = scenario_trainer(m);
      (void)ck::restore(t, root.path / ck::step_dir_name(4));
      BOOST_CHECK_THROW((void)ck::save_sharded(t, fc, root.path, 6, {.sync = false}),
                        hone::dist_error);
      if (n < 3) no_step_6();  // the last one fails after rank 0 committed
      fs::remove_all(root.path / ck::step_dir_name(6));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_plain_or_data_parallel_trainer_saves_sharded_too) {
  // Ranks holding the whole state (no ZeRO) write the same pieces: a checkpoint of 3 ranks of
  // plain trainers that hold the same state resumes like the one-process checkpoint.
  const temp_root root("plain");
  const scenario sc{};
  mlp<hone::half> m;
  auto t = scenario_trainer(m);
  for (int s = 0; s < 4; ++s) {
    std::vector<mlp_batch> mb;
    for (int k = 0; k < 6; ++k) mb.push_back(scenario_batch(sc, s, k));
    (void)t.step(std::span<const mlp_batch>(mb));
  }
  hone::dist::local_comm one;
  const fs::path single = ck::save_sharded(t, one, root.path / "one", 4, {.sync = false});
  BOOST_TEST(ck::verify_directory(single).ok());
  BOOST_TEST(ck::shard_index::read(single / ck::files::shard_index).world_size == 1u);
  const std::vector<float> want = six_batch_reference(8);
  BOOST_TEST(max_abs_diff(plain_resume(single), want) <= 1e-6);
  // 3 thread ranks, each a trainer restored from that checkpoint (the same state on every rank).
  thread_group g(3);
  g.run([&](int r) {
    thread_comm c(g, r);
    mlp<hone::half> mr;
    auto tr = scenario_trainer(mr);
    (void)ck::restore(tr, single);
    (void)ck::save_sharded(tr, c, root.path / "three", 4, {.sync = false});
  });
  const fs::path three = root.path / "three" / ck::step_dir_name(4);
  BOOST_TEST(ck::verify_directory(three).ok(), joined(ck::verify_directory(three).problems));
  const ck::shard_index idx3 = ck::shard_index::read(three / ck::files::shard_index);
  BOOST_TEST(idx3.world_size == 3u);
  // 3 ranks cut the arena at 32 and 64: layer1.weight (48 elements) straddles ranks 0 and 1.
  BOOST_TEST((idx3.find("exp_avg.layer1.weight")->parts ==
              std::vector<ck::shard_part>{{"optimizer-00000-of-00003.safetensors", 0, 32},
                                          {"optimizer-00001-of-00003.safetensors", 32, 16}}));
  BOOST_TEST(same_bits(plain_resume(three), plain_resume(single)));
  const auto w3 = resume_on<2>(3, three);
  BOOST_TEST(max_abs_diff(w3[0], want) <= 1e-6);

  // 7 ranks: the last rank's shard of the 81-float arena is empty (stride 16), its part holds no
  // tensor; compressed parts (.hct); retention keeps the newest only.
  thread_group g7(7);
  for (std::uint64_t step : {4u, 5u}) {
    g7.run([&](int r) {
      thread_comm c(g7, r);
      mlp<hone::half> mr;
      auto tr = scenario_trainer(mr);
      (void)ck::restore(tr, single);
      (void)ck::save_sharded(tr, c, root.path / "seven", step,
                             {.compression = ck::compression_options{},
                              .sync = false,
                              .retention = ck::retention_policy{.keep_last = 1}});
    });
  }
  BOOST_TEST(!fs::exists(root.path / "seven" / ck::step_dir_name(4)));  // retention
  const fs::path seven = root.path / "seven" / ck::step_dir_name(5);
  BOOST_TEST(ck::verify_directory(seven).ok(), joined(ck::verify_directory(seven).problems));
  const ck::shard_index idx7 = ck::shard_index::read(seven / ck::files::shard_index);
  BOOST_TEST(idx7.files.back() == "optimizer-00006-of-00007.hct");
  BOOST_TEST(ck::tensor_file::open(seven / idx7.files.back()).tensors().empty());
  BOOST_TEST(
      (ck::tensor_file::open(seven / idx7.files[0]).format() == ck::tensor_format::compressed));
  BOOST_TEST(same_bits(plain_resume(seven), plain_resume(single)));
}

#ifdef HONE_CKPT_TOOL  // built with the tools (HONE_BUILD_TOOLS)
BOOST_AUTO_TEST_CASE(hone_ckpt_verifies_and_converts_a_sharded_checkpoint) {
  const temp_root root("tool");
  ck::snapshot consolidated;
  save_two_ranks(root.path / "run", &consolidated);
  const fs::path dir = root.path / "run" / ck::step_dir_name(4);
  fs::create_directories(root.path / "consolidated");
  const fs::path cdir = ck::write_snapshot(root.path / "consolidated", 4, consolidated,
                                           {.compression = std::nullopt, .sync = false});
  const fs::path log = root.path / "log.txt";
  BOOST_TEST(run_tool("verify " + dir.string(), log) == 0, read_text(log));
  BOOST_TEST(contains(read_text(log), "sharded over 2 ranks"), read_text(log));
  BOOST_TEST(run_tool("info " + (root.path / "run").string(), log) == 0, read_text(log));
  BOOST_TEST(contains(read_text(log), "rank 1: " + part1), read_text(log));
  BOOST_TEST(contains(read_text(log), "exp_avg.layer1.weight"), read_text(log));

  // One file of whole tensors: the consolidated capture's weights and optimizer state, bit for bit.
  const fs::path one = root.path / "one.safetensors";
  BOOST_TEST_REQUIRE(run_tool("convert " + dir.string() + " --to file " + one.string(), log) == 0,
                     read_text(log));
  const ck::tensor_file merged = ck::tensor_file::open(one);
  const ck::tensor_file cw = ck::tensor_file::open(cdir / ck::files::weights);
  const ck::tensor_file co = ck::tensor_file::open(cdir / ck::files::optimizer);
  std::string why;
  BOOST_TEST(same_tensors(cw, merged, why), why);
  BOOST_TEST(same_tensors(co, merged, why), why);
  BOOST_TEST(merged.tensors().size() == cw.tensors().size() + co.tensors().size());
  BOOST_TEST(merged.metadata().at("format") == "pt");

  // An ordinary checkpoint: optimizer.safetensors of whole tensors; it restores.
  const fs::path plain = root.path / "plain";
  BOOST_TEST_REQUIRE(
      run_tool("convert " + dir.string() + " --to safetensors " + plain.string(), log) == 0,
      read_text(log));
  BOOST_TEST(ck::verify_directory(plain).ok());
  BOOST_TEST(!ck::is_sharded_checkpoint(plain));
  BOOST_TEST(same_tensors(co, ck::tensor_file::open(plain / ck::files::optimizer), why), why);
  BOOST_TEST(same_bits(plain_resume(plain), plain_resume(cdir)));

  // For sharded_interop.py (label interop): Python's safetensors reads the merged file.
  if (const char* out = std::getenv("HONE_TEST_SHARDED_OUT"); out != nullptr && *out != '\0') {
    const fs::path keep = out;
    fs::remove_all(keep);
    fs::create_directories(keep);
    fs::copy_file(one, keep / "merged.safetensors");
    copy_dir(cdir, keep / "consolidated");
  }

  // A damaged part: verify says which, with status 1.
  fs::resize_file(dir / part1, fs::file_size(dir / part1) - 1);
  BOOST_TEST(run_tool("verify " + dir.string(), log) == 1);
  BOOST_TEST(contains(read_text(log), "invalid: "), read_text(log));
  BOOST_TEST(contains(read_text(log), part1), read_text(log));
}
#endif
