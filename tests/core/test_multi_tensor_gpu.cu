// GPU test (label gpu): hone::for_each(cuda_exec, ...) against the oneTBB backend running the same
// functor on the same random data. Exits 77 (skipped) when no CUDA device is present.
#define BOOST_TEST_MODULE hone_core_multi_tensor_gpu
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/math_mode.cuh>
#include <hone/core/cuda/multi_tensor_apply.cuh>
#include <hone/core/multi_tensor.hpp>
#include <random>
#include <vector>

#include "../support/gpu.hpp"

namespace {
struct axpby {  // y = a * x + b * y, then x = -x: one input list, one in/out list, one output
  float a, b;
  HONE_HOST_DEVICE void operator()(float& y, float& x, const float& w) const {
    y = a * x + b * y + w;
    x = -x;
  }
};

struct gpu_fixture {
  gpu_fixture() {
    hone::test::skip_without_gpu();
    hone::require_ieee_device_math(
        "tests/core/test_multi_tensor_gpu.cu");  // it compares device and host bits
  }
};

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(gpu_fixture);

BOOST_AUTO_TEST_CASE(cuda_matches_host_on_mixed_sizes) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<std::size_t> size(1, 300000);
  // Enough tensors and chunks to cross both the tensor-table and the block-table limits.
  std::vector<std::size_t> sizes{1, 65536, 65537, 2, 65536 * 5 + 3};
  for (int i = 0; i < 150; ++i) sizes.push_back(size(rng));

  std::vector<std::vector<float>> hy, hx, hw;
  for (auto n : sizes) {
    hy.push_back(random_floats(n, rng));
    hx.push_back(random_floats(n, rng));
    hw.push_back(random_floats(n, rng));
  }
  std::vector<hone::buffer<float, hone::cuda_space>> dy, dx, dw;
  hone::tensor_lists<float, float, const float> dev;
  hone::tensor_lists<float, float, const float> host;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    dy.emplace_back(sizes[i]);
    dx.emplace_back(sizes[i]);
    dw.emplace_back(sizes[i]);
    HONE_CUDA_CHECK(cudaMemcpy(dy.back().data(), hy[i].data(), sizes[i] * 4, cudaMemcpyDefault));
    HONE_CUDA_CHECK(cudaMemcpy(dx.back().data(), hx[i].data(), sizes[i] * 4, cudaMemcpyDefault));
    HONE_CUDA_CHECK(cudaMemcpy(dw.back().data(), hw[i].data(), sizes[i] * 4, cudaMemcpyDefault));
    dev.add(sizes[i], dy.back().data(), dx.back().data(), dw.back().data());
    host.add(sizes[i], hy[i].data(), hx[i].data(), hw[i].data());
  }
  const axpby op{0.75f, -1.5f};
  hone::for_each(hone::cuda_exec{}, dev, op);
  hone::for_each(host, op);
  HONE_CUDA_CHECK(cudaDeviceSynchronize());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::vector<float> gy(sizes[i]), gx(sizes[i]);
    HONE_CUDA_CHECK(cudaMemcpy(gy.data(), dy[i].data(), sizes[i] * 4, cudaMemcpyDefault));
    HONE_CUDA_CHECK(cudaMemcpy(gx.data(), dx[i].data(), sizes[i] * 4, cudaMemcpyDefault));
    // Both backends evaluate a*x + b*y + w; nvcc may contract to FMA, so allow 2 ulp-ish slack.
    for (std::size_t k = 0; k < sizes[i]; ++k) {
      const float ref = hy[i][k];
      BOOST_REQUIRE_MESSAGE(std::abs(gy[k] - ref) <= 1e-5f * (1.0f + std::abs(ref)),
                            "tensor " << i << " element " << k << ": " << gy[k] << " vs " << ref);
    }
    BOOST_REQUIRE(std::memcmp(gx.data(), hx[i].data(), sizes[i] * 4) == 0);
  }
}

BOOST_AUTO_TEST_CASE(cuda_buffer_and_errors) {
  hone::buffer<float, hone::cuda_space> b(1000);
  static_assert(std::is_same_v<decltype(b.view()), hone::device_span<float>>);
  BOOST_TEST(b.view().size() == 1000u);
  hone::buffer<float, hone::pinned_host_space> pinned(1000, 1.0f);
  BOOST_TEST(hone::space_traits<hone::pinned_host_space>::pinned());
  // An impossible allocation is an allocation_error, not a crash.
  BOOST_CHECK_THROW((hone::buffer<float, hone::cuda_space>(std::size_t{1} << 45)),
                    hone::allocation_error);
  // A failing runtime call names itself.
  try {
    HONE_CUDA_CHECK(cudaMemcpy(nullptr, pinned.data(), 4000, cudaMemcpyHostToDevice));
    BOOST_FAIL("cudaMemcpy to nullptr should fail");
  } catch (const hone::cuda_error& e) {
    BOOST_TEST(std::string(e.what()).find("cudaMemcpy(nullptr") != std::string::npos);
  }
}
