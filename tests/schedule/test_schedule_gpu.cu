// GPU test (label gpu): every schedule's lr() evaluated in a kernel equals its host evaluation.
// Exits 77 (skipped) without a CUDA device.
//
// The host values are themselves checked against the peers' formulas by the host tests of this
// folder (test_linear_warmup.cpp, test_cosine.cpp, test_one_cycle.cpp, test_wsd.cpp). The
// device may differ in the last bits (CUDA's double cos is within 2 ulp, and nvcc contracts
// a * b + c into fma), so the comparison allows 1e-14 of the schedule's peak learning rate, a
// few ulp of the largest term in any of the formulas.
#define BOOST_TEST_MODULE hone_schedule_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <hone/core/cuda/error.hpp>
#include <hone/schedule/schedule.hpp>
#include <string>
#include <vector>

#include "../support/gpu.hpp"

namespace {

struct gpu_fixture {
  gpu_fixture() { hone::test::skip_without_gpu(); }
};

template <class S>
__global__ void evaluate(S schedule, std::uint64_t first, std::uint64_t n, double* out) {
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = schedule.lr(first + i);
  }
}

// Evaluates steps [0, n) and a few far past the end on the device; compares with the host.
template <class S>
void compare(const S& schedule, std::uint64_t n, double peak, const std::string& name) {
  schedule.validate();
  std::vector<std::uint64_t> starts = {0, ~std::uint64_t{0} - 4};
  std::vector<std::uint64_t> counts = {n, 4};
  for (std::size_t k = 0; k < starts.size(); ++k) {
    double* device = nullptr;
    HONE_CUDA_CHECK(cudaMalloc(&device, counts[k] * sizeof(double)));
    evaluate<<<64, 256>>>(schedule, starts[k], counts[k], device);
    hone::check_last_launch("evaluate");
    std::vector<double> host(counts[k]);
    HONE_CUDA_CHECK(
        cudaMemcpy(host.data(), device, counts[k] * sizeof(double), cudaMemcpyDeviceToHost));
    HONE_CUDA_CHECK(cudaFree(device));
    double worst = 0.0;
    std::size_t bad = 0;
    for (std::uint64_t i = 0; i < counts[k]; ++i) {
      const double error = std::abs(host[i] - schedule.lr(starts[k] + i));
      worst = std::max(worst, error);
      if (!(error <= 1e-14 * peak)) ++bad;
    }
    BOOST_TEST_MESSAGE(name << ": largest |device - host| = " << worst << " (" << worst / peak
                            << " of the peak)");
    BOOST_TEST(bad == 0u, name << ": " << bad << " steps differ by more than 1e-14 * peak");
  }
}

}  // namespace

BOOST_GLOBAL_FIXTURE(gpu_fixture);

BOOST_AUTO_TEST_CASE(device_equals_host) {
  compare(hone::constant_lr{.base_lr = 3e-4}, 1000, 3e-4, "constant_lr");
  compare(hone::linear_warmup{.base_lr = 0.05, .warmup_steps = 777, .start_factor = 0.01}, 2000,
          0.05, "linear_warmup");
  compare(
      hone::cosine_with_warmup{
          .base_lr = 3e-4, .warmup_steps = 1000, .total_steps = 100000, .min_lr = 3e-5},
      101000, 3e-4, "cosine_with_warmup");
  compare(hone::one_cycle{.max_lr = 0.1, .total_steps = 100000}, 100000, 0.1, "one_cycle cos");
  compare(hone::one_cycle{.max_lr = 0.1,
                          .total_steps = 12345,
                          .pct_start = 0.25,
                          .anneal_strategy = hone::one_cycle::anneal::linear,
                          .three_phase = true},
          12345, 0.1, "one_cycle linear three_phase");
  for (const auto decay :
       {hone::wsd::shape::linear, hone::wsd::shape::cosine, hone::wsd::shape::one_minus_sqrt}) {
    compare(hone::wsd{.base_lr = 1e-3,
                      .warmup_steps = 500,
                      .stable_steps = 5000,
                      .decay_steps = 4500,
                      .min_lr = 1e-5,
                      .decay = decay},
            11000, 1e-3, "wsd shape " + std::to_string(static_cast<int>(decay)));
  }
}
