// GPU test (label gpu): hone::dist::nccl_comm, the NCCL communicator on device memory. One GPU is
// what a test machine has, so:
//   - every collective and element type on a one-rank communicator (made from an id and by
//     bootstrap over local_comm), checked bit for bit against the input it must reproduce, and
//     the stream ordering of a request that is not waited;
//   - two ranks (two threads) on the same GPU: NCCL refuses two ranks on one device, and both
//     ranks must get a dist_error naming their rank, never a hang; where NCCL accepts it (a
//     version that allows it), the two-rank sum, max, reduce_scatter, all_gather and broadcast
//     are checked against the host oracle instead;
//   - a rank that never joins: creation throws dist_error within the timeout (never a hang);
//   - bad spans (host memory, pinned host memory, wrong sizes, bad root) and use after abort()
//     are refused with sentences.
// Exits 77 (skipped) without a CUDA device.
#define BOOST_TEST_MODULE hone_nccl_comm_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <hone/core/cuda/error.hpp>
#include <hone/dist/local_comm.hpp>
#include <hone/dist/nccl/nccl_comm.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../support/gpu.hpp"

namespace hd = hone::dist;
using namespace std::chrono_literals;

namespace {

struct gpu_fixture {
  gpu_fixture() { hone::test::skip_without_gpu(); }
};

template <class T>
struct device_array {
  T* p = nullptr;
  std::size_t n = 0;
  explicit device_array(std::size_t count) : n(count) {
    HONE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), (count ? count : 1) * sizeof(T)));
  }
  explicit device_array(const std::vector<T>& host) : device_array(host.size()) { upload(host); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { (void)cudaFree(p); }
  // cudaMemcpy from pageable memory may return before its DMA lands, and the communicator's
  // stream is non-blocking (not ordered after the legacy default stream): wait for the device.
  void upload(const std::vector<T>& host) {
    HONE_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    HONE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  [[nodiscard]] std::vector<T> download() const {
    std::vector<T> h(n);
    HONE_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  [[nodiscard]] std::span<T> span() const { return {p, n}; }
  [[nodiscard]] std::span<const T> cspan() const { return {p, n}; }
};

struct stream_guard {
  cudaStream_t s = nullptr;
  stream_guard() { HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~stream_guard() { (void)cudaStreamDestroy(s); }
};

/// Distinct bit patterns per element (finite for the floating types).
template <class T>
std::vector<T> pattern(std::size_t n, int seed) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::uint32_t>(i * 2654435761u + static_cast<std::uint32_t>(seed));
    if constexpr (std::is_same_v<T, hone::half> || std::is_same_v<T, hone::bfloat16>) {
      v[i] = T(static_cast<float>(static_cast<int>(k % 2001u) - 1000) / 8.0f);
    } else if constexpr (std::is_floating_point_v<T>) {
      v[i] = static_cast<T>(static_cast<double>(static_cast<int>(k % 200001u) - 100000) / 7.0);
    } else {
      v[i] = static_cast<T>(k % 251u);
    }
  }
  return v;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
void one_rank_round_trip(hd::nccl_comm& comm, std::size_t n) {
  const auto in = pattern<T>(n, 7);
  device_array<T> a(in), b(n);
  comm.all_reduce(a.span(), hd::reduce_op::sum).wait();
  BOOST_TEST(same_bits(a.download(), in), "all_reduce(sum) over one rank changed the data");
  comm.all_reduce(a.span(), hd::reduce_op::max).wait();
  BOOST_TEST(same_bits(a.download(), in), "all_reduce(max) over one rank changed the data");
  comm.reduce_scatter(a.cspan(), b.span(), hd::reduce_op::sum).wait();
  BOOST_TEST(same_bits(b.download(), in), "reduce_scatter over one rank is not a copy");
  b.upload(std::vector<T>(n, T{}));
  comm.all_gather(a.cspan(), b.span()).wait();
  BOOST_TEST(same_bits(b.download(), in), "all_gather over one rank is not a copy");
  comm.broadcast(b.span(), 0).wait();
  BOOST_TEST(same_bits(b.download(), in), "broadcast from rank 0 of one changed the data");
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(gpu_fixture);

BOOST_AUTO_TEST_CASE(one_rank_every_collective_and_type) {
  stream_guard st;
  hd::nccl_comm comm(hd::nccl_unique_id::create(), 0, 1, st.s, 20s);
  BOOST_TEST(comm.rank() == 0);
  BOOST_TEST(comm.size() == 1);
  int dev = -1;
  HONE_CUDA_CHECK(cudaGetDevice(&dev));
  BOOST_TEST(comm.device() == dev);
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
    BOOST_TEST_CONTEXT("n = " << n) {
      one_rank_round_trip<float>(comm, n);
      one_rank_round_trip<double>(comm, n);
      one_rank_round_trip<std::int32_t>(comm, n);
      one_rank_round_trip<std::int64_t>(comm, n);
      one_rank_round_trip<std::uint8_t>(comm, n);
      one_rank_round_trip<hone::half>(comm, n);
      one_rank_round_trip<hone::bfloat16>(comm, n);
    }
  }
  // Sequence numbers count every collective of this communicator, the barrier included.
  auto r = comm.barrier();
  const auto seq = r.sequence();
  r.wait();
  BOOST_TEST(r.test());
  BOOST_TEST(seq == 3u * 7u * 5u);
  // Empty spans are valid collectives.
  float* none = nullptr;
  comm.all_reduce(std::span<float>(none, 0), hd::reduce_op::sum).wait();
  BOOST_TEST(!comm.failed());
}

BOOST_AUTO_TEST_CASE(a_request_that_is_not_waited_is_ordered_on_the_stream) {
  stream_guard st;
  hd::nccl_comm comm(hd::nccl_unique_id::create(), 0, 1, st.s, 20s);
  const std::size_t n = std::size_t{1} << 22;
  const auto in = pattern<float>(n, 3);
  device_array<float> a(in);
  std::vector<float> back(n, 0.0f);
  {
    auto r = comm.all_reduce(a.span(), hd::reduce_op::sum);  // dropped without wait()
  }
  HONE_CUDA_CHECK(
      cudaMemcpyAsync(back.data(), a.p, n * sizeof(float), cudaMemcpyDeviceToHost, st.s));
  HONE_CUDA_CHECK(cudaStreamSynchronize(st.s));
  BOOST_TEST(same_bits(back, in));
  // Many collectives in flight, then waited in reverse order (events come from a pool).
  std::vector<hd::nccl_comm::request> reqs;
  for (int i = 0; i < 1000; ++i) reqs.push_back(comm.all_reduce(a.span(), hd::reduce_op::sum));
  for (auto it = reqs.rbegin(); it != reqs.rend(); ++it) it->wait();
  BOOST_TEST(same_bits(a.download(), in));
}

BOOST_AUTO_TEST_CASE(bootstrap_over_a_host_communicator) {
  stream_guard st;
  hd::local_comm host;
  auto comm = hd::nccl_comm::bootstrap(host, st.s, 20s);
  BOOST_TEST(comm.rank() == 0);
  BOOST_TEST(comm.size() == 1);
  one_rank_round_trip<float>(comm, 4096);
  // The id survives its trip through int64 words.
  const auto id = hd::nccl_unique_id::create();
  const auto w = id.to_words();
  const auto back = hd::nccl_unique_id::from_words(w);
  BOOST_TEST(std::memcmp(&back.id, &id.id, sizeof(id.id)) == 0);
}

// Two ranks as two threads on the one GPU. NCCL refuses two ranks on one device ("Duplicate GPU
// detected"): each rank must then get a dist_error naming it, within the timeout. If this NCCL
// accepts them, the collectives are checked against the host oracle instead.
BOOST_AUTO_TEST_CASE(two_ranks_on_one_gpu_refused_or_correct) {
  const auto id = hd::nccl_unique_id::create();
  const std::size_t n = 4099;
  std::vector<float> in0 = pattern<float>(2 * n, 1), in1 = pattern<float>(2 * n, 2);
  std::string errors[2];
  std::vector<float> sum[2], max[2], scattered[2], gathered[2], bcast[2];
  std::atomic<int> made{0};
  int device = 0;
  HONE_CUDA_CHECK(cudaGetDevice(&device));
  const auto start = std::chrono::steady_clock::now();
  auto rank_main = [&](int r) {
    try {
      HONE_CUDA_CHECK(cudaSetDevice(device));
      stream_guard st;
      hd::nccl_comm comm(id, r, 2, st.s, 20s);
      made.fetch_add(1);
      const auto& in = r == 0 ? in0 : in1;
      device_array<float> a(in), b(n), c(2 * n), d(in);
      comm.all_reduce(a.span(), hd::reduce_op::sum).wait();
      sum[r] = a.download();
      comm.all_reduce(d.span(), hd::reduce_op::max).wait();
      max[r] = d.download();
      device_array<float> e(in);
      comm.reduce_scatter(e.cspan(), b.span(), hd::reduce_op::sum).wait();
      scattered[r] = b.download();
      device_array<float> f(std::vector<float>(in.begin(), in.begin() + static_cast<long>(n)));
      comm.all_gather(f.cspan(), c.span()).wait();
      gathered[r] = c.download();
      device_array<float> g(in);
      comm.broadcast(g.span(), 1).wait();
      bcast[r] = g.download();
      comm.barrier().wait();
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  BOOST_TEST_MESSAGE("two ranks on one GPU: " << seconds << " s; rank 0: '" << errors[0]
                                              << "'; rank 1: '" << errors[1] << "'");
  BOOST_TEST(seconds < 60.0);
  if (!errors[0].empty() || !errors[1].empty()) {
    for (int r = 0; r < 2; ++r) {
      BOOST_TEST_CONTEXT("rank " << r) {
        BOOST_TEST(!errors[r].empty(), "one rank failed and the other did not: " << errors[1 - r]);
        BOOST_TEST(errors[r].find("hone::dist::nccl_comm:") != std::string::npos, errors[r]);
        BOOST_TEST(errors[r].find("rank " + std::to_string(r) + " of 2") != std::string::npos,
                   errors[r]);
      }
    }
    return;
  }
  BOOST_TEST(made.load() == 2);
  std::vector<float> want_sum(2 * n), want_max(2 * n);
  for (std::size_t i = 0; i < 2 * n; ++i) {
    want_sum[i] = in0[i] + in1[i];
    want_max[i] = std::max(in0[i], in1[i]);
  }
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST_CONTEXT("rank " << r) {
      BOOST_TEST(same_bits(sum[r], want_sum));
      BOOST_TEST(same_bits(max[r], want_max));
      BOOST_TEST(same_bits(scattered[r],
                           std::vector<float>(want_sum.begin() + r * static_cast<long>(n),
                                              want_sum.begin() + (r + 1) * static_cast<long>(n))));
      std::vector<float> g(in0.begin(), in0.begin() + static_cast<long>(n));
      g.insert(g.end(), in1.begin(), in1.begin() + static_cast<long>(n));
      BOOST_TEST(same_bits(gathered[r], g));
      BOOST_TEST(same_bits(bcast[r], in1));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_rank_that_never_joins_is_an_error_not_a_hang) {
  stream_guard st;
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    hd::nccl_comm comm(hd::nccl_unique_id::create(), 0, 2, st.s, 1500ms);
  } catch (const hone::dist_error& e) {
    message = e.what();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  BOOST_TEST_MESSAGE("missing rank: " << seconds << " s: " << message);
  BOOST_TEST(message.find("did not finish within 1500 ms on rank 0 of 2") != std::string::npos,
             message);
  BOOST_TEST(message.find("NCCL does not say which rank is missing") != std::string::npos);
  BOOST_TEST(seconds >= 1.4);
  BOOST_TEST(seconds < 30.0);
}

BOOST_AUTO_TEST_CASE(bad_spans_and_use_after_abort_are_refused) {
  stream_guard st;
  hd::nccl_comm comm(hd::nccl_unique_id::create(), 0, 1, st.s, 20s);
  std::vector<float> host(16, 1.0f);
  auto says = [](const std::string& needle) {
    return [needle](const std::exception& e) {
      const bool ok = std::string(e.what()).find(needle) != std::string::npos;
      if (!ok) BOOST_TEST_MESSAGE("message: " << e.what());
      return ok;
    };
  };
  BOOST_CHECK_EXCEPTION((void)comm.all_reduce(std::span<float>(host), hd::reduce_op::sum),
                        hone::dist_error,
                        says("all_reduce: `data` is not GPU memory (it is ordinary host memory)"));
  float* pinned = nullptr;
  HONE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned), 64 * sizeof(float)));
  BOOST_CHECK_EXCEPTION((void)comm.broadcast(std::span<float>(pinned, 64), 0), hone::dist_error,
                        says("`data` is not GPU memory (it is pinned host memory)"));
  (void)cudaFreeHost(pinned);
  device_array<float> a(8), b(4);
  BOOST_CHECK_EXCEPTION((void)comm.reduce_scatter(a.cspan(), b.span(), hd::reduce_op::sum),
                        hone::error, says("the input holds 8 elements and the output 4"));
  BOOST_CHECK_EXCEPTION((void)comm.all_gather(a.cspan(), b.span()), hone::error,
                        says("the output must hold size() blocks of the input's size"));
  BOOST_CHECK_EXCEPTION((void)comm.broadcast(a.span(), 1), hone::error,
                        says("root 1 is not a rank of this communicator"));
  BOOST_CHECK_EXCEPTION(comm.set_timeout(0ms), hone::error, says("the timeout must be positive"));
  BOOST_CHECK_EXCEPTION(hd::nccl_comm(hd::nccl_unique_id::create(), 2, 2, st.s), hone::error,
                        says("rank 2 is not in [0, 2)"));
  // Nothing was enqueued by the refusals: the communicator still works.
  comm.all_reduce(a.span(), hd::reduce_op::sum).wait();
  comm.abort();
  BOOST_TEST(comm.failed());
  BOOST_CHECK_EXCEPTION((void)comm.all_reduce(a.span(), hd::reduce_op::sum), hone::dist_error,
                        says("all_reduce: the communicator on rank 0 of 1 was aborted"));
}
