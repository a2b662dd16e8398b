// bench/optim_gpu.cu (bench_optim_gpu): the training core's GPU benchmarks. Without a CUDA device
// it prints a skip message and exits 0.
//
// The CPU workloads of bench/optim.cpp that have a CUDA path in hone, on the same model-like
// tensor mixes in device arenas, named <workload>_cuda:
//
//   adamw_fp32_{1M,16M,64M}_cuda  hone::step(cuda_exec, adamw_state<cuda_space>, ...)     28 B
//   sgd_momentum_64M_cuda         hone::step(cuda_exec, sgd_state<cuda_space>, ...)       20 B
//   adamw8bit_64M_cuda            hone::step(cuda_exec, adamw_8bit_state<cuda_space>, ...) (time;
//                                 no limit: the device limits stream 4-byte words only)
//   full_step_64M_cuda            hone::clip(cuda_exec, clip_grad_norm, ...) writes the norm, the
//                                 clip coefficient and found_inf in device memory; the AdamW step
//                                 reads the coefficient as its device_grad_scale and skips itself
//                                 on found_inf: no host synchronization inside the step       32 B
//
// Limits: device_limit<4, 3> (AdamW), device_limit<3, 2> (SGD), and for the full step a read-only
// pass over the gradients followed by device_limit<4, 3>. Timed with CUDA events around each
// iteration (manual time), like bench_core_gpu.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <hone/core/arena.hpp>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <hone/core/cuda/multi_tensor_apply.cuh>
#include <hone/core/cuda/space.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/adamw_8bit.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/optim/cuda/adamw.cuh>
#include <hone/optim/cuda/adamw_8bit.cuh>
#include <hone/optim/cuda/clipping.cuh>
#include <hone/optim/cuda/sgd.cuh>
#include <hone/optim/sgd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "support/device.cuh"
#include "support/harness.hpp"
#include "support/limit.cuh"
#include "support/optim_data.hpp"
#include "support/workloads.hpp"

namespace {

/// fp32 master weights, gradients and AdamW state in device arenas for one mix.
struct device_model {
  hone::arena_layout layout;
  std::size_t params = 0;
  hone::arena<float, hone::cuda_space> master;
  hone::arena<float, hone::cuda_space> grad;
  hone::adamw policy{};
  hone::adamw_state<hone::cuda_space> adamw;
  std::uint64_t adamw_steps = 0;

  explicit device_model(std::size_t total)
      : layout(hone_bench::optim_layout(hone_bench::optim_mix(total))),
        master(layout),
        grad(layout),
        adamw(policy, layout) {
    for (std::size_t n : hone_bench::optim_mix(total)) params += n;
    hone_bench::device_fill(master.all().data(), layout.total(), 0.5f);
    hone_bench::device_fill(grad.all().data(), layout.total(), 0.25f);
    HONE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  float* p() { return master.all().data(); }
  const float* g() { return grad.all().data(); }
};

device_model& data(std::size_t total) {
  return hone_bench::optim_model<device_model>(total);
}

template <class Limit, std::size_t Total>
Limit& limit_of() {
  return hone_bench::optim_limit<Limit, device_model, Total>();
}

constexpr float lr = 1e-3f;

void adamw_fp32_hone(benchmark::State& state, std::size_t total) {
  auto& d = data(total);
  hone_bench::time_on_device(state, [&](cudaStream_t s) {
    hone::step(hone::cuda_exec{s}, d.adamw, d.policy, {.step = ++d.adamw_steps, .lr = lr}, d.p(),
               d.g());
  });
  hone_bench::report_bytes(state, d.params * 28);
}

template <std::size_t Total>
void adamw_fp32_limit(benchmark::State& state) {
  auto& limit = limit_of<hone_bench::device_limit<4, 3>, Total>();
  hone_bench::time_on_device(state, [&](cudaStream_t s) { limit.run(s); });
  hone_bench::report_bytes(state, limit.bytes_per_pass());
}

void sgd_momentum_hone(benchmark::State& state) {
  auto& d = data(hone_bench::optim_64M);
  static const hone::sgd policy{.momentum = 0.9f};
  static hone::sgd_state<hone::cuda_space> sgd(policy, d.layout);
  static std::uint64_t steps = 0;
  hone_bench::time_on_device(state, [&](cudaStream_t s) {
    hone::step(hone::cuda_exec{s}, sgd, policy, {.step = ++steps, .lr = lr}, d.p(), d.g());
  });
  hone_bench::report_bytes(state, d.params * 20);
}

void sgd_momentum_limit(benchmark::State& state) {
  auto& limit = limit_of<hone_bench::device_limit<3, 2>, hone_bench::optim_64M>();
  hone_bench::time_on_device(state, [&](cudaStream_t s) { limit.run(s); });
  hone_bench::report_bytes(state, limit.bytes_per_pass());
}

void adamw8bit_hone(benchmark::State& state) {
  auto& d = data(hone_bench::optim_64M);
  static const hone::adamw_8bit policy{};
  static hone::adamw_8bit_state<hone::cuda_space> st(policy, d.layout);
  static std::uint64_t steps = 0;
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < d.layout.size(); ++i) {
    const std::size_t n = d.layout[i].count;
    bytes += st.quantized(i) ? n * 16 + (n + policy.block - 1) / policy.block * 16 : n * 28;
  }
  hone_bench::time_on_device(state, [&](cudaStream_t s) {
    hone::step(hone::cuda_exec{s}, st, policy, {.step = ++steps, .lr = lr}, d.p(), d.g());
  });
  hone_bench::report_bytes(state, bytes);
  state.counters["state_bytes"] = static_cast<double>(st.bytes());
  state.counters["fp32_state_bytes"] = static_cast<double>(d.adamw.bytes());
  state.counters["state_ratio"] =
      static_cast<double>(st.bytes()) / static_cast<double>(d.adamw.bytes());
}

/// Device scalars of the full step: norm, clip coefficient, found_inf.
struct step_scalars {
  hone::buffer<float, hone::cuda_space> norm{1};
  hone::buffer<float, hone::cuda_space> coefficient{1};
  hone::buffer<int, hone::cuda_space> found_inf{1};
  hone::grad_norm_workspace workspace;
};

void full_step_hone(benchmark::State& state) {
  auto& d = data(hone_bench::optim_64M);
  static step_scalars sc;
  const hone::clip_grad_norm clip{.max_norm = 1e6f};  // as bench_optim's full_step_64M
  std::uint64_t k = 0;
  hone_bench::time_on_device(state, [&](cudaStream_t s) {
    const float unscale = (++k & 1) ? 2.0f : 0.5f;  // 1 / the loss scale, 2 and 1/2 in turn
    HONE_CUDA_CHECK(cudaMemsetAsync(sc.found_inf.data(), 0, sizeof(int), s));
    hone::clip(hone::cuda_exec{s}, clip, d.g(), d.layout.total(), unscale, sc.workspace,
               sc.norm.data(), sc.coefficient.data(), sc.found_inf.data());
    hone::step(hone::cuda_exec{s}, d.adamw, d.policy,
               {.step = ++d.adamw_steps, .lr = lr, .grad_scale = unscale}, d.p(), d.g(), {},
               sc.found_inf.data(), sc.coefficient.data());
  });
  hone_bench::report_bytes(state, d.params * 32);
}

void full_step_limit(benchmark::State& state) {
  static hone_bench::device_read_limit norm_pass(data(hone_bench::optim_64M).params);
  auto& update = limit_of<hone_bench::device_limit<4, 3>, hone_bench::optim_64M>();
  hone_bench::time_on_device(state, [&](cudaStream_t s) {
    norm_pass.run(s);
    update.run(s);
  });
  hone_bench::report_bytes(state, norm_pass.bytes_per_pass() + update.bytes_per_pass());
}

bool register_benchmarks() {
  if (!hone_bench::device_present("bench_optim_gpu")) return false;
  using hone_bench::add_gpu;
  add_gpu("adamw_fp32_1M_cuda", "hone",
          [](benchmark::State& s) { adamw_fp32_hone(s, hone_bench::optim_1M); });
  add_gpu("adamw_fp32_1M_cuda", "limit", adamw_fp32_limit<hone_bench::optim_1M>);
  add_gpu("adamw_fp32_16M_cuda", "hone",
          [](benchmark::State& s) { adamw_fp32_hone(s, hone_bench::optim_16M); });
  add_gpu("adamw_fp32_16M_cuda", "limit", adamw_fp32_limit<hone_bench::optim_16M>);
  add_gpu("adamw_fp32_64M_cuda", "hone",
          [](benchmark::State& s) { adamw_fp32_hone(s, hone_bench::optim_64M); });
  add_gpu("adamw_fp32_64M_cuda", "limit", adamw_fp32_limit<hone_bench::optim_64M>);
  add_gpu("sgd_momentum_64M_cuda", "hone", sgd_momentum_hone);
  add_gpu("sgd_momentum_64M_cuda", "limit", sgd_momentum_limit);
  add_gpu("adamw8bit_64M_cuda", "hone", adamw8bit_hone);
  add_gpu("full_step_64M_cuda", "hone", full_step_hone);
  add_gpu("full_step_64M_cuda", "limit", full_step_limit);
  return true;
}

std::vector<hone_bench::workload_mix> mixes() {
  std::vector<hone_bench::workload_mix> m;
  m.push_back({"adamw_fp32_1M_cuda", hone_bench::optim_sizes(hone_bench::optim_1M)});
  m.push_back({"adamw_fp32_16M_cuda", hone_bench::optim_sizes(hone_bench::optim_16M)});
  for (const char* w : {"adamw_fp32_64M_cuda", "sgd_momentum_64M_cuda", "adamw8bit_64M_cuda",
                        "full_step_64M_cuda"}) {
    m.push_back({w, hone_bench::optim_sizes(hone_bench::optim_64M)});
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, mixes(), register_benchmarks);
}
