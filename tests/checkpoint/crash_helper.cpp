// The crash test's child: resumes from the newest valid checkpoint under ROOT (after cleaning
// what killed writers left), then saves a checkpoint per "step" until it is killed. With --once it
// saves one checkpoint and exits. Exit status: 0 done, 1 an error (a damaged resume point).
//   checkpoint_crash_helper ROOT [--async] [--once]
#include <cstdio>
#include <cstring>
#include <exception>
#include <hone/checkpoint/directory.hpp>
#include <hone/checkpoint/retention.hpp>
#include <hone/checkpoint/writer.hpp>
#include <string_view>

#include "crash_common.hpp"

int main(int argc, char** argv) {
  namespace ck = hone::checkpoint;
  if (argc < 2) {
    std::fprintf(stderr, "usage: checkpoint_crash_helper ROOT [--async] [--once]\n");
    return 2;
  }
  bool async = false, once = false;
  for (int i = 2; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--async") async = true;
    if (a == "--once") once = true;
  }
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
