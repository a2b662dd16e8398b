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

#include "support/harness.hpp"
#include "support/limit.cuh"
#include "support/workloads.hpp"

namespace {

__global__ void fill_kernel(float* p, std::size_t n, float base) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    p[i] = base + static_cast<float>(i % 1024) * (1.0f / 1024.0f);
  }
}

void fill(float* p, std::size_t n, float base) {
  fill_kernel<<<1024, 256>>>(p, n, base);
  hone::check_last_launch("fill_kernel");
}

// A read-only pass: each thread ORs its grid-stride words (16-byte loads), each block writes one
// word (gridDim words in all: nothing next to n).
__global__ void read_kernel(const uint4* v, std::size_t n4, std::uint32_t* out) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::uint32_t acc = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += stride) {
    const uint4 x = v[i];
    acc |= x.x | x.y | x.z | x.w;
  }
  __shared__ std::uint32_t shared[512];
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] |= shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = shared[0];
}

/// The limit of a pass that only reads n 4-byte words (n rounded down to a multiple of 4).
class device_read_limit {
 public:
  explicit device_read_limit(std::size_t n) : n_(n / 4 * 4), words_(n_), out_(max_grid) {
    HONE_CUDA_CHECK(cudaMemset(words_.data(), 0x11, words_.size_bytes()));
    int device = 0;
    HONE_CUDA_CHECK(cudaGetDevice(&device));
    HONE_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
    run(nullptr);
    HONE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void run(cudaStream_t stream) {
    const std::size_t want = (n_ / 4 + block - 1) / block;
    const std::size_t cap = static_cast<std::size_t>(sms_) * 4;
    unsigned grid = static_cast<unsigned>(want < cap ? (want > 0 ? want : 1) : cap);
    if (grid > max_grid) grid = max_grid;
    read_kernel<<<grid, block, 0, stream>>>(reinterpret_cast<const uint4*>(words_.data()), n_ / 4,
                                            out_.data());
    hone::check_last_launch("device_read_limit::run");
  }
  [[nodiscard]] std::size_t bytes_per_pass() const noexcept { return n_ * 4; }

 private:
  static constexpr int block = 512;
  static constexpr unsigned max_grid = 4096;
  std::size_t n_;
  hone::buffer<std::uint32_t, hone::cuda_space> words_;
  hone::buffer<std::uint32_t, hone::cuda_space> out_;
  int sms_ = 1;
};

/// Times `fn(stream)` with a pair of CUDA events around each iteration; one untimed warm-up.
template <class Fn>
void time_on_device(benchmark::State& state, Fn&& fn) {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  HONE_CUDA_CHECK(cudaEventCreate(&start));
  HONE_CUDA_CHECK(cudaEventCreate(&stop));
  fn(stream);
  HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (auto _ : state) {
    HONE_CUDA_CHECK(cudaEventRecord(start, stream));
    fn(stream);
    HONE_CUDA_CHECK(cudaEventRecord(stop, stream));
    HONE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    HONE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(static_cast<double>(ms) * 1e-3);
  }
  HONE_CUDA_CHECK(cudaEventDestroy(start));
  HONE_CUDA_CHECK(cudaEventDestroy(stop));
  HONE_CUDA_CHECK(cudaStreamDestroy(stream));
}

template <class Fn>
void add_gpu(const std::string& workload, const std::string& impl, Fn fn) {
  benchmark::RegisterBenchmark((workload + "/" + impl).c_str(), std::move(fn))
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

const std::vector<std::size_t>& mix(std::size_t total) {
  static const auto m1 = hone_bench::model_like_sizes(hone_bench::optim_1M);
  static const auto m16 = hone_bench::model_like_sizes(hone_bench::optim_16M);
  static const auto m64 = hone_bench::model_like_sizes(hone_bench::optim_64M);
  return total == hone_bench::optim_1M ? m1 : total == hone_bench::optim_16M ? m16 : m64;
}

hone::arena_layout make_layout(const std::vector<std::size_t>& sizes) {
  hone::arena_layout layout(sizeof(float));
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::string name = std::to_string(i);
    layout.add(name.insert(0, 1, 't'), sizes[i]);
  }
  return layout;
}

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
      : layout(make_layout(mix(total))), master(layout), grad(layout), adamw(policy, layout) {
    for (std::size_t n : mix(total)) params += n;
    fill(master.all().data(), layout.total(), 0.5f);
    fill(grad.all().data(), layout.total(), 0.25f);
    HONE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  float* p() { return master.all().data(); }
  const float* g() { return grad.all().data(); }
};

device_model& data(std::size_t total) {
  if (total == hone_bench::optim_1M) {
    static device_model d(total);
    return d;
  }
  if (total == hone_bench::optim_16M) {
    static device_model d(total);
    return d;
  }
  static device_model d(hone_bench::optim_64M);
  return d;
}

template <class Limit, std::size_t Total>
Limit& limit_of() {
  static Limit limit(data(Total).params);
  return limit;
}

constexpr float lr = 1e-3f;

void adamw_fp32_hone(benchmark::State& state, std::size_t total) {
  auto& d = data(total);
  time_on_device(state, [&](cudaStream_t s) {
    hone::step(hone::cuda_exec{s}, d.adamw, d.policy, {.step = ++d.adamw_steps, .lr = lr}, d.p(),
               d.g());
  });
  hone_bench::report_bytes(state, d.params * 28);
}

template <std::size_t Total>
void adamw_fp32_limit(benchmark::State& state) {
  auto& limit = limit_of<hone_bench::device_limit<4, 3>, Total>();
  time_on_device(state, [&](cudaStream_t s) { limit.run(s); });
  hone_bench::report_bytes(state, limit.bytes_per_pass());
}

void sgd_momentum_hone(benchmark::State& state) {
  auto& d = data(hone_bench::optim_64M);
  static const hone::sgd policy{.momentum = 0.9f};
  static hone::sgd_state<hone::cuda_space> sgd(policy, d.layout);
  static std::uint64_t steps = 0;
  time_on_device(state, [&](cudaStream_t s) {
    hone::step(hone::cuda_exec{s}, sgd, policy, {.step = ++steps, .lr = lr}, d.p(), d.g());
  });
  hone_bench::report_bytes(state, d.params * 20);
}

void sgd_momentum_limit(benchmark::State& state) {
  auto& limit = limit_of<hone_bench::device_limit<3, 2>, hone_bench::optim_64M>();
  time_on_device(state, [&](cudaStream_t s) { limit.run(s); });
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
  time_on_device(state, [&](cudaStream_t s) {
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
  time_on_device(state, [&](cudaStream_t s) {
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
  static device_read_limit norm_pass(data(hone_bench::optim_64M).params);
  auto& update = limit_of<hone_bench::device_limit<4, 3>, hone_bench::optim_64M>();
  time_on_device(state, [&](cudaStream_t s) {
    norm_pass.run(s);
    update.run(s);
  });
  hone_bench::report_bytes(state, norm_pass.bytes_per_pass() + update.bytes_per_pass());
}

bool register_benchmarks() {
  const int devices = hone::cuda_device_count();
  if (devices == 0) {
    std::printf("bench_optim_gpu: no CUDA device found; skipping the GPU benchmarks\n");
    return false;
  }
  cudaDeviceProp prop{};
  HONE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  benchmark::AddCustomContext("hone_gpu", prop.name);
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
  auto sizes_of = [](std::size_t total) { return [total] { return mix(total); }; };
  m.push_back({"adamw_fp32_1M_cuda", sizes_of(hone_bench::optim_1M)});
  m.push_back({"adamw_fp32_16M_cuda", sizes_of(hone_bench::optim_16M)});
  for (const char* w : {"adamw_fp32_64M_cuda", "sgd_momentum_64M_cuda", "adamw8bit_64M_cuda",
                        "full_step_64M_cuda"}) {
    m.push_back({w, sizes_of(hone_bench::optim_64M)});
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, mixes(), register_benchmarks);
}
