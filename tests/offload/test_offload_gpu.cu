// GPU test (label gpu) of the CUDA transport: the offload engine moving bf16 gradients and
// parameters between device memory and pinned staging on a side stream, against the same engine
// with the host transport (and so against the plain host optimizer): bit-identical master weights,
// optimizer state and device parameters, immediate and delayed update, several bucket sizes.
// The "backward" runs on the host and its gradients are uploaded on the compute stream, so the
// transport's stream ordering (side stream after compute, compute after side) is exercised.
// Exits 77 (skipped) when no CUDA device is present.
#define BOOST_TEST_MODULE hone_offload_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <hone/core/buffer.hpp>
#include <hone/core/cuda/error.hpp>
#include <hone/core/cuda/math_mode.cuh>
#include <hone/offload/cuda/transport.cuh>
#include <hone/offload/memory_monitor.hpp>
#include <hone/offload/optimizer_to_host.hpp>
#include <string_view>
#include <vector>

#include "../support/gpu.hpp"
#include "problem.hpp"

namespace {
struct gpu_fixture {
  gpu_fixture() {
    hone::test::skip_without_gpu();
    hone::require_ieee_device_math(
        "tests/offload/test_offload_gpu.cu");  // it compares device and host bits
  }
};

namespace ot = offload_test;
namespace off = hone::offload;
using bf16 = hone::bfloat16;

template <class G, class W>
void check_cuda_engine(std::size_t bucket_bytes, bool delayed, std::uint64_t n = 6) {
  BOOST_TEST_CONTEXT("bucket_bytes " << bucket_bytes << ", delayed " << delayed) {
    const auto l = ot::layout();
    const hone::adamw opt{.weight_decay = 0.05f};
    hone::optimizer_state_t<hone::adamw> ref_state(opt, l);
    std::vector<std::vector<W>> ref_seen;
    const auto ref_master =
        ot::reference<hone::adamw, G, W>(opt, ref_state, l, n, delayed, {}, &ref_seen);

    cudaStream_t compute = nullptr;
    HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    {
      off::engine<hone::adamw, G, W, off::cuda_transport> eng(
          {.bucket_bytes = bucket_bytes, .delayed_update = delayed}, opt, l,
          off::cuda_transport(compute));
      const auto init = ot::initial(l);
      std::copy(init.begin(), init.end(), eng.master().all().begin());
      hone::buffer<W, hone::cuda_space> d_params(l.total());
      hone::buffer<G, hone::cuda_space> d_grads(l.total());
      hone::buffer<W, hone::pinned_host_space> h_params(l.total());
      hone::buffer<G, hone::pinned_host_space> h_grads(l.total());
      eng.push_params(d_params.data());
      for (std::uint64_t k = 1; k <= n; ++k) {
        // "forward/backward" on the compute stream: read the parameters, write the gradients.
        HONE_CUDA_CHECK(cudaMemcpyAsync(h_params.data(), d_params.data(), d_params.size_bytes(),
                                        cudaMemcpyDeviceToHost, compute));
        HONE_CUDA_CHECK(cudaStreamSynchronize(compute));
        BOOST_TEST(ot::same_bits(h_params.data(), ref_seen[k - 1].data(), l.total()),
                   "parameters seen by forward/backward " << k);
        ot::backward(l, h_params.data(), h_grads.data(), k);
        HONE_CUDA_CHECK(cudaMemcpyAsync(d_grads.data(), h_grads.data(), d_grads.size_bytes(),
                                        cudaMemcpyHostToDevice, compute));
        eng.step(ot::args(k), d_grads.data(), d_params.data());
      }
      eng.flush(d_params.data());
      HONE_CUDA_CHECK(cudaMemcpyAsync(h_params.data(), d_params.data(), d_params.size_bytes(),
                                      cudaMemcpyDeviceToHost, compute));
      HONE_CUDA_CHECK(cudaStreamSynchronize(compute));
      BOOST_TEST(ot::same_bits(eng.master().all().data(), ref_master.data(), l.total()));
      const auto final_params = ot::cast<W>(ref_master);
      BOOST_TEST(ot::same_bits(h_params.data(), final_params.data(), l.total()));
      BOOST_TEST(ot::same_bits(eng.state().exp_avg_sq().all().data(),
                               ref_state.exp_avg_sq().all().data(), l.total()));
    }
    HONE_CUDA_CHECK(cudaStreamDestroy(compute));
  }
}
}  // namespace

BOOST_FIXTURE_TEST_SUITE(offload_gpu, gpu_fixture)

BOOST_AUTO_TEST_CASE(cuda_transport_matches_host) {
  for (std::size_t bytes : {std::size_t{62}, std::size_t{4096}, std::size_t{1} << 20}) {
    for (bool delayed : {false, true}) {
      check_cuda_engine<bf16, bf16>(bytes, delayed);
      check_cuda_engine<float, float>(bytes, delayed, 3);
    }
  }
}

BOOST_AUTO_TEST_CASE(staging_is_pinned) {
  BOOST_TEST(hone::space_traits<off::cuda_transport::staging_space>::pinned());
}

BOOST_AUTO_TEST_CASE(monitor_sees_device_memory) {
  const auto before = off::device_memory();
  BOOST_TEST(before.device_total > 0u);
  hone::buffer<float, hone::cuda_space> big(std::size_t{256} << 20);  // 1 GiB
  const auto after = off::device_memory();
  BOOST_TEST(after.device_used >= before.device_used + (std::size_t{900} << 20));
}

BOOST_AUTO_TEST_SUITE_END()
