// The crash test (label slow): a child process checkpointing in a loop is SIGKILLed (>= 50 times,
// sync and async writers alternating), at random moments and, every third run, as soon as the
// child enters a commit window (from the MANIFEST's creation until the rename or exchange that
// publishes step-N returned; the child records where it is in a shared file, crash_common.hpp).
// Each kill is classified by where it landed: inside a commit window, while writing a
// checkpoint's files, or elsewhere. After each kill the newest committed checkpoint must verify
// and hold the state of its step (a resume), steps never go back, a kill inside the commit window
// of step s leaves step s - 1 or s as the newest, and at least a sixth of the kills (and 5) must
// have landed inside a commit window, or the test fails: the kills must exercise the commit. At
// the end a fresh start cleans every temporary left by the killed writes and resumes.
//   checkpoint_crash_driver HELPER WORKDIR [KILLS]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <hone/checkpoint/directory.hpp>
#include <hone/io/directory.hpp>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "crash_common.hpp"

namespace fs = std::filesystem;
namespace ck = hone::checkpoint;
namespace io = hone::io;

namespace {
pid_t spawn(const std::string& helper, const fs::path& root, bool async, bool once,
            const fs::path& log, const fs::path& window) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string r = root.string(), l = log.string(), w = window.string();
    if (std::freopen(l.c_str(), "w", stdout) == nullptr) ::_exit(127);
    std::vector<const char*> args{helper.c_str(), r.c_str(), "--window", w.c_str()};
    if (async) args.push_back("--async");
    if (once) args.push_back("--once");
    args.push_back(nullptr);
    ::execv(helper.c_str(), const_cast<char* const*>(args.data()));
    ::_exit(127);
  }
  return pid;
}

std::size_t count_leftovers(const fs::path& root) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(root)) {
    if (e.path().filename().string().starts_with(io::temp_prefix)) ++n;
  }
  return n;
}

int fail(const std::string& why) {
  std::fprintf(stderr, "crash test FAILED: %s\n", why.c_str());
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: checkpoint_crash_driver HELPER WORKDIR [KILLS]\n");
    return 2;
  }
  const std::string helper = argv[1];
  const fs::path work = argv[2];
  const int kills = argc > 3 ? std::atoi(argv[3]) : 60;
  const fs::path root = work / "ckpt";
  fs::remove_all(work);
  fs::create_directories(work);
  std::mt19937 rng(static_cast<unsigned>(std::random_device{}()));
  std::uniform_int_distribution<int> delay_us(2'000, 60'000);
  const fs::path window_file = work / "commit_window";
  crash_test::commit_window* window = crash_test::map_commit_window(window_file, true);
  if (window == nullptr) return fail("cannot map " + window_file.string());
  new (window) crash_test::commit_window{};
  std::uint64_t newest = 0;
  int verified = 0, resumed = 0, with_leftovers = 0;
  int in_window = 0, in_window_old = 0, in_window_new = 0, writing_files = 0, elsewhere = 0;
  int targeted = 0;
  std::size_t leftovers_seen = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kills; ++i) {
    const bool async = (i % 2) == 1;
    const bool target_commit = (i % 3) == 2;
    window->phase.store(crash_test::commit_window::elsewhere);
    window->step.store(0);
    window->entered.store(0);
    window->left.store(0);
    const pid_t pid = spawn(helper, root, async, false, work / "helper.log", window_file);
    if (pid < 0) return fail("fork failed");
    if (target_commit) {
      // Kill as soon as the child is inside a commit window (give up after 10 s).
      ++targeted;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (window->phase.load() != crash_test::commit_window::committing &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    }
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const std::uint32_t phase = window->phase.load();
    const std::uint64_t window_step = window->step.load();
    if (!WIFSIGNALED(status)) {
      return fail("the helper exited by itself (status " + std::to_string(status) + ") on run " +
                  std::to_string(i) + "; see " + (work / "helper.log").string());
    }
    if (!fs::exists(root)) continue;  // killed before it created anything
    const std::size_t left = count_leftovers(root);
    leftovers_seen += left;
    if (left > 0) ++with_leftovers;
    const auto c = ck::newest_valid(root);
    if (!c) {
      if (newest > 0) return fail("no valid checkpoint after kill " + std::to_string(i));
      continue;
    }
    if (c->step < newest) {
      return fail("the newest valid checkpoint went back from step " + std::to_string(newest) +
                  " to " + std::to_string(c->step));
    }
    try {
      if (crash_test::restore_and_check(c->path) != c->step) return fail("step mismatch");
    } catch (const std::exception& e) {
      return fail(std::string("kill ") + std::to_string(i) + ": " + e.what());
    }
    ++verified;
    if (phase == crash_test::commit_window::committing) {
      // Killed inside the commit of `window_step`: that step or the one before is the newest.
      ++in_window;
      if (c->step == window_step) {
        ++in_window_new;
      } else if (c->step + 1 == window_step) {
        ++in_window_old;
      } else {
        return fail("kill " + std::to_string(i) + " landed inside the commit window of step " +
                    std::to_string(window_step) + " but the newest checkpoint is step " +
                    std::to_string(c->step));
      }
    } else if (phase == crash_test::commit_window::writing_files) {
      ++writing_files;
    } else {
      ++elsewhere;
    }
    if (c->step > newest) ++resumed;  // the previous child resumed from the last one and saved
    newest = c->step;
  }
  // A final start cleans every leftover, resumes from the newest and saves one more.
  const pid_t pid = spawn(helper, root, false, true, work / "final.log", window_file);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return fail("the final start failed; see " + (work / "final.log").string());
  }
  if (count_leftovers(root) != 0) return fail("temporary leftovers were not cleaned");
  const auto last = ck::newest_valid(root);
  if (!last || last->step != newest + 1) {
    return fail("the final start did not resume from step " + std::to_string(newest));
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "crash test: %d kills (%d aimed at a commit window), %d verified after a kill, %d with a "
      "newer checkpoint than the previous kill (resumed and saved), %d kills left temporaries "
      "(%zu in all), all cleaned; newest step %llu; %.1f s\n"
      "where the verified kills landed: %d inside a commit window (%d left the previous step "
      "newest, %d the step being committed), %d while writing a checkpoint's files, %d "
      "elsewhere\n",
      kills, targeted, verified, resumed, with_leftovers, leftovers_seen,
      static_cast<unsigned long long>(newest), secs, in_window, in_window_old, in_window_new,
      writing_files, elsewhere);
  if (verified < kills / 2) return fail("too few kills found a committed checkpoint");
  const int min_in_window = std::max(5, kills / 6);
  if (in_window < min_in_window) {
    return fail("only " + std::to_string(in_window) + " kills landed inside a commit window (at " +
                "least " + std::to_string(min_in_window) + " required)");
  }
  return 0;
}
