// The crash test's child: resumes from the newest valid checkpoint under ROOT (after cleaning
// what killed writers left), then saves a checkpoint per "step" until it is killed. With --once it
// saves one checkpoint and exits. With --window FILE it records in FILE (crash_common.hpp's
// commit_window) whether it is writing a checkpoint's files or inside the commit window, so the
// driver can tell where each kill landed. Exit status: 0 done, 1 an error (a damaged resume
// point).
//   checkpoint_crash_helper ROOT [--async] [--once] [--window FILE]
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <hone/checkpoint/directory.hpp>
#include <hone/checkpoint/retention.hpp>
#include <hone/checkpoint/writer.hpp>
#include <string>
#include <string_view>

#include "crash_common.hpp"

namespace {
crash_test::commit_window* window = nullptr;

// The step of a file written into ROOT/.tmp-step-N-PID/, or 0.
std::uint64_t step_of(const std::filesystem::path& file) {
  const std::string dir = file.parent_path().filename().string();
  const std::string prefix = std::string(hone::io::temp_prefix) + "step-";
  if (!dir.starts_with(prefix)) return 0;
  return std::strtoull(dir.c_str() + prefix.size(), nullptr, 10);
}

// Called (through the writer's test fault hook) just before each file of a checkpoint is created:
// the MANIFEST is the first thing pending_checkpoint::commit writes.
void on_file(const std::filesystem::path& file) {
  if (window == nullptr) return;
  window->step.store(step_of(file));
  if (file.filename() == hone::checkpoint::files::manifest) {
    window->entered.fetch_add(1);
    window->phase.store(crash_test::commit_window::committing);
  } else {
    window->phase.store(crash_test::commit_window::writing_files);
  }
}

// After the rename or exchange that publishes ROOT/step-N: the commit window is over.
void after_rename(const char* to, int rc) {
  if (window == nullptr || rc != 0) return;
  if (window->phase.load() != crash_test::commit_window::committing) return;
  if (!std::filesystem::path(to).filename().string().starts_with(hone::checkpoint::step_prefix)) {
    return;
  }
  window->phase.store(crash_test::commit_window::elsewhere);
  window->left.fetch_add(1);
}
}  // namespace

// The helper is linked with --wrap=rename,--wrap=renameat2: hone's rename_path and exchange_paths
// come here first.
extern "C" int __real_rename(const char* from, const char* to);
extern "C" int __wrap_rename(const char* from, const char* to) {
  const int rc = __real_rename(from, to);
  after_rename(to, rc);
  return rc;
}
extern "C" int __real_renameat2(int from_dir, const char* from, int to_dir, const char* to,
                                unsigned flags);
extern "C" int __wrap_renameat2(int from_dir, const char* from, int to_dir, const char* to,
                                unsigned flags) {
  const int rc = __real_renameat2(from_dir, from, to_dir, to, flags);
  after_rename(to, rc);
  return rc;
}

int main(int argc, char** argv) {
  namespace ck = hone::checkpoint;
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: checkpoint_crash_helper ROOT [--async] [--once] [--window FILE]\n");
    return 2;
  }
  bool async = false, once = false;
  for (int i = 2; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--async") async = true;
    if (a == "--once") once = true;
    if (a == "--window" && i + 1 < argc) {
      window = crash_test::map_commit_window(argv[++i], false);
      if (window == nullptr) {
        std::fprintf(stderr, "checkpoint_crash_helper: cannot map '%s'\n", argv[i]);
        return 2;
      }
    }
  }
  ck::write_fault_hook() = on_file;
  try {
    ck::checkpoint_writer w({.root = argv[1],
                             .async = async,
                             .busy = ck::on_busy::wait,
                             .retention = ck::retention_policy{.keep_last = 3}});
    std::uint64_t step = 0;
    if (const auto c = ck::newest_valid(argv[1])) step = crash_test::restore_and_check(c->path);
    std::printf("cleaned %zu resumed %llu\n", w.cleaned().size(),
                static_cast<unsigned long long>(step));
    std::fflush(stdout);
    do {
      ++step;
      w.check();
      (void)w.save(step, [&](ck::snapshot& s) { crash_test::fill(s, step); });
    } while (!once);
    w.wait();
    std::printf("saved %llu\n", static_cast<unsigned long long>(step));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_crash_helper: %s\n", e.what());
    return 1;
  }
}
