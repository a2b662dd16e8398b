// tests/profile/metrics_interop_helper.cpp: writes the metrics interop_metrics.py reads with the
// tensorboard package's event readers and Python's csv module.
//
//   metrics_interop_helper <dir>
// runs 5 hone::trainer steps (the linear model of tests/support) and logs each step_report with
// metrics_sink::log(r, step), a memory_monitor reading with log_memory, scalars whose tags need
// CSV quoting, and the values NaN, +-inf, -0, the smallest float32 subnormal and a double that
// float32 rounds, into <dir>/metrics.csv and an event file under <dir>/tb. Prints one JSON line:
// {"scalars": [[tag, step, value as C99 hex float], ...]} in the order they were logged, and
// "event_file": the event file's path.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <hone/offload/memory_monitor.hpp>
#include <hone/optim/sgd.hpp>
#include <hone/profile.hpp>
#include <hone/schedule/constant.hpp>
#include <hone/train/accumulate.hpp>
#include <hone/train/trainer.hpp>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../support/linear_model.hpp"

namespace {

struct logged {
  std::string tag;
  std::int64_t step;
  double value;
};

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: metrics_interop_helper <dir>\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::remove_all(dir);
  std::vector<logged> expect;
  std::string event_file;
  {
    hone::profile::metrics_sink sink({.csv = dir / "metrics.csv", .tensorboard = dir / "tb"});
    event_file = sink.tensorboard_path().string();
    auto scalar = [&](const std::string& tag, std::int64_t step, double v) {
      sink.scalar(tag, step, v);
      expect.push_back({tag, step, v});
    };
    linear<float> m(6);
    hone::trainer t(m, hone::sgd{}, hone::constant_lr{.base_lr = 0.05},
                    hone::accumulate::by_count{});
    for (unsigned i = 0; i < 5; ++i) {
      const std::vector<batch> mb = {make_batch(8, 6, i), make_batch(5, 6, i + 100)};
      const hone::step_report r = t.step(std::span<const batch>(mb));
      const auto step = static_cast<std::int64_t>(i);
      sink.log(r, step);
      expect.push_back({"train/loss", step, r.loss});
      expect.push_back({"train/grad_norm", step, r.grad_norm});
      expect.push_back({"train/lr", step, r.lr});
      expect.push_back({"train/loss_scale", step, r.loss_scale});
      expect.push_back({"train/skipped", step, r.skipped ? 1.0 : 0.0});
      scalar("eval/ratio", step, 1.0 / (3.0 + i));
      scalar("tag, with \"quotes\"", step, -0.125 * i);
      scalar("loss,smoothed", step, 0.5 + i);
    }
    const hone::offload::memory_sample mem{.host_rss = hone::offload::host_rss_bytes()};
    hone::profile::log_memory(sink, mem, 4);
    expect.push_back({"memory/host_rss_mib", 4, static_cast<double>(mem.host_rss) / (1 << 20)});
    const double specials[] = {std::numeric_limits<double>::quiet_NaN(),
                               std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity(),
                               -0.0,
                               static_cast<double>(std::numeric_limits<float>::denorm_min()),
                               0.1,
                               1e300};  // float32: +inf
    for (std::size_t i = 0; i < std::size(specials); ++i)
      scalar("special", static_cast<std::int64_t>(i), specials[i]);
    scalar("big_step", std::int64_t{1} << 40, 2.0);
    sink.close();
  }
  std::printf("{\"event_file\": %s, \"scalars\": [", json_string(event_file).c_str());
  for (std::size_t i = 0; i < expect.size(); ++i) {
    const double v = expect[i].value;
    char num[64];
    if (std::isnan(v)) {
      std::snprintf(num, sizeof num, "nan");
    } else if (std::isinf(v)) {
      std::snprintf(num, sizeof num, v > 0 ? "inf" : "-inf");
    } else {
      std::snprintf(num, sizeof num, "%a", v);
    }
    std::printf("%s[%s, %lld, \"%s\"]", i == 0 ? "" : ", ", json_string(expect[i].tag).c_str(),
                static_cast<long long>(expect[i].step), num);
  }
  std::printf("]}\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "metrics_interop_helper: %s\n", e.what());
  return 1;
}
