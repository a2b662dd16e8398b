// bench/compress.cpp (bench_compress): the compress module's benchmarks.
//
//   distill_loss_b256_c32000  hone::compress::distill_loss, loss and student gradient (forward +
//   distill_loss_b32_c1000    backward), T = 2, alpha = 0.5, labels, on [batch, classes] fp32
//                             logits (student and teacher uniform in [-8, 8], fixed seeds); the
//                             gradient buffer is kept between iterations. Peer:
//                             bench/peers/torch_distill.py, the same expression composed in
//                             PyTorch (kl_div of the two log_softmax at T, log_target=True,
//                             batchmean, times T^2, blended with cross_entropy, then backward()),
//                             on the same shapes (--hone_print_sizes=<workload>: batch, classes).
// Time per call in ms; no limit row (the loss is compute-bound: three exponentials per logit).

#include <cstddef>
#include <cstdint>
#include <hone/compress/distill.hpp>
#include <random>
#include <string>
#include <vector>

#include "support/harness.hpp"

namespace {

struct distill_case {
  std::size_t batch;
  std::size_t classes;
  std::string name() const {
    return "distill_loss_b" + std::to_string(batch) + "_c" + std::to_string(classes);
  }
};

const std::vector<distill_case>& distill_cases() {
  static const std::vector<distill_case> cases{{256, 32000}, {32, 1000}};
  return cases;
}

void distill(benchmark::State& state, distill_case c) {
  const std::size_t n = c.batch * c.classes;
  std::vector<float> s(n), t(n), g(n);
  std::vector<std::int32_t> labels(c.batch);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (auto& x : s) x = u(rng);
  for (auto& x : t) x = u(rng);
  std::uniform_int_distribution<std::int32_t> cls(0, static_cast<std::int32_t>(c.classes) - 1);
  for (auto& y : labels) y = cls(rng);
  const hone::compress::distill_options o{2.0f, 0.5f};
  double loss = hone::compress::distill_loss({c.batch, c.classes}, s, t, labels, g, o).loss;
  for (auto _ : state) {
    loss = hone::compress::distill_loss({c.batch, c.classes}, s, t, labels, g, o).loss;
    benchmark::DoNotOptimize(loss);
    benchmark::ClobberMemory();
  }
  hone_bench::report_threads(state);
}

bool register_benchmarks() {
  for (const distill_case& c : distill_cases()) {
    hone_bench::add(c.name(), "hone", [c](benchmark::State& s) { distill(s, c); });
  }
  return true;
}

std::vector<hone_bench::workload_mix> mixes() {
  std::vector<hone_bench::workload_mix> m;
  for (const distill_case& c : distill_cases()) {
    m.push_back({c.name(), [c] { return std::vector<std::size_t>{c.batch, c.classes}; }});
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, mixes(), register_benchmarks);
}
