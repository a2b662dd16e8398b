// tests/profile/interop_helper.cpp: writes the traces interop.py reads with Perfetto's own schema
// (perfetto_trace_pb2) and with json.
//
//   profile_interop_helper <dir>
// writes <dir>/trace.pftrace and <dir>/trace.json from one recording: a "loader" thread makes 3
// batches (zone "load", each starting flow i+1), the "trainer" thread consumes them (zone
// "consume", ending the flow) and runs a hone::trainer step with phase_timer on each (2
// micro-batches: zones step > checkpoint, forward_backward, unscale, ... ), recording the loss as
// the counter "loss". Prints one JSON line: {"pid", "loader_tid", "trainer_tid", "losses"}.
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <hone/optim/sgd.hpp>
#include <hone/profile.hpp>
#include <hone/schedule/constant.hpp>
#include <hone/train/accumulate.hpp>
#include <hone/train/trainer.hpp>
#include <mutex>
#include <queue>
#include <span>
#include <thread>
#include <vector>

#include "../support/linear_model.hpp"

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: profile_interop_helper <dir>\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  hone::profile::trace tr({.perfetto = dir / "trace.pftrace",
                           .chrome_json = dir / "trace.json",
                           .flush_interval = std::chrono::milliseconds(1),
                           .process_name = "profile_interop_helper"});
  std::mutex mu;
  std::condition_variable cv;
  std::queue<std::vector<batch>> ready;
  long loader_tid = 0;
  std::thread loader([&] {
    hone::profile::set_thread_name("loader");
    loader_tid = ::syscall(SYS_gettid);
    for (unsigned i = 0; i < 3; ++i) {
      HONE_ZONE("load");
      HONE_FLOW_BEGIN("batch", i + 1);
      std::vector<batch> mb = {make_batch(8, 6, i), make_batch(5, 6, i + 100)};
      const std::lock_guard lock(mu);
      ready.push(std::move(mb));
      cv.notify_one();
    }
  });
  hone::profile::set_thread_name("trainer");
  linear<float> m(6);
  hone::trainer t(m, hone::sgd{}, hone::constant_lr{.base_lr = 0.05}, hone::accumulate::by_count{},
                  hone::profile::phase_timer{});
  std::vector<float> losses;
  for (unsigned i = 0; i < 3; ++i) {
    std::vector<batch> mb;
    {
      HONE_ZONE("consume");
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return !ready.empty(); });
      mb = std::move(ready.front());
      ready.pop();
      HONE_FLOW_END("batch", i + 1);
    }
    const auto r = t.step(std::span<const batch>(mb));
    HONE_COUNTER("loss", r.loss);
    losses.push_back(r.loss);
  }
  loader.join();
  tr.close();
  if (tr.dropped_events() != 0) {
    std::fprintf(stderr, "profile_interop_helper: %llu events dropped\n",
                 static_cast<unsigned long long>(tr.dropped_events()));
    return 1;
  }
  std::printf(
      "{\"pid\": %d, \"loader_tid\": %ld, \"trainer_tid\": %ld, \"losses\": [%.9g, %.9g, %.9g]}\n",
      static_cast<int>(::getpid()), loader_tid, static_cast<long>(::syscall(SYS_gettid)),
      static_cast<double>(losses[0]), static_cast<double>(losses[1]),
      static_cast<double>(losses[2]));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "profile_interop_helper: %s\n", e.what());
  return 1;
}
