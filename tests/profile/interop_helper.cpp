// tests/profile/interop_helper.cpp: writes the traces interop.py reads with Perfetto's own schema
// (perfetto_trace_pb2) and with json.
//
//   profile_interop_helper <dir>
// writes <dir>/trace.pftrace and <dir>/trace.json from one recording: a "loader" thread makes 3
// batches (zone "load", each starting flow i+1), the "trainer" thread consumes them (zone
// "consume", ending the flow) and runs a hone::trainer step with phase_timer on each (2
// micro-batches: zones step > checkpoint, forward_backward, unscale, ... ), recording the loss as
// the counter "loss". A synthetic device source (the interface hone/profile/cuda/zone.hpp's event
// pool implements, fed here without a GPU) adds, during each step, a device zone "gpu_step"
// holding "gpu_kernel" on the track "GPU 0 stream 7", at host times inside the step, so the
// exporters' device-track path is read back by Perfetto's schema in CI. Prints one JSON line:
// {"pid", "loader_tid", "trainer_tid", "losses"}.
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
#include <string>
#include <thread>
#include <vector>

#include "../support/linear_model.hpp"

namespace {
/// A device source whose marks the helper writes itself (track 7: "GPU 0 stream 7").
class synthetic_gpu final : public hone::profile::detail::device_source {
 public:
  void add(bool begin, const char* name, std::uint64_t ns) {
    const std::lock_guard lock(mu_);
    ready_.push_back({7, begin, name, ns});
  }
  void collect(std::vector<hone::profile::device_mark>& out, bool) override {
    const std::lock_guard lock(mu_);
    out.insert(out.end(), ready_.begin(), ready_.end());
    ready_.clear();
  }
  std::string track_name(std::uint64_t id) override { return "GPU 0 stream " + std::to_string(id); }
  std::uint64_t dropped() const override { return 0; }

 private:
  std::mutex mu_;
  std::vector<hone::profile::device_mark> ready_;
};

std::uint64_t host_ns() {
  return hone::profile::clock_calibration::get().to_ns(hone::profile::detail::ticks());
}
}  // namespace

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: profile_interop_helper <dir>\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  synthetic_gpu gpu;
  hone::profile::detail::device_sources().add(&gpu);
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
    const std::uint64_t t0 = host_ns();
    const auto r = t.step(std::span<const batch>(mb));
    const std::uint64_t t1 = host_ns();
    // The step's "device work": inside the step's host interval, nested.
    const std::uint64_t q = (t1 - t0) / 5;
    gpu.add(true, "gpu_step", t0 + q);
    gpu.add(true, "gpu_kernel", t0 + 2 * q);
    gpu.add(false, nullptr, t0 + 3 * q);
    gpu.add(false, nullptr, t0 + 4 * q);
    HONE_COUNTER("loss", r.loss);
    losses.push_back(r.loss);
  }
  loader.join();
  tr.close();
  hone::profile::detail::device_sources().remove(&gpu);
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
