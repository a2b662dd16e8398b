// GPU test (label gpu): hone::bfloat16 and hone::half in device code, against CUDA's own
// conversions and against hone's host conversions. Exits 77 (skipped) without a CUDA device.
//
// All 2^32 float bit patterns are converted on the device, in chunks, with hone's constructors and
// with __float2bfloat16_rn / __float2half_rn; all 2^16 values of each type go back to float with
// hone::to_float and with __bfloat162float / __half2float.
//  - hone on the device must equal hone on the host bit for bit, NaNs included: it is the same
//    integer code.
//  - hone must equal CUDA bit for bit on every non-NaN result. For NaN results both must be NaN,
//    but the bits may differ: hone keeps the sign and the upper payload bits and sets the quiet
//    bit, while CUDA is expected to return its canonical NaN 0x7fff for both types (that is what
//    the host fallbacks in cuda_bf16.hpp / cuda_fp16.hpp of CUDA 13 return, and the device paths
//    use cvt.rn.bf16.f32 / cvt.rn.f16.f32). The test prints how many NaN results differed in bits
//    and CUDA's result for a few NaN inputs, so a run on a GPU documents what the hardware does;
//    only the non-NaN comparison and the NaN-ness can fail it.
#define BOOST_TEST_MODULE hone_numeric_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>

#include <cstdint>
#include <cstdio>
#include <hone/core/cuda/error.hpp>
#include <hone/core/cuda/math_mode.cuh>
#include <hone/core/numeric.hpp>
#include <vector>

#include "../support/gpu.hpp"

namespace {

struct gpu_fixture {
  gpu_fixture() {
    hone::test::skip_without_gpu();
    hone::require_ieee_device_math(
        "tests/core/test_numeric_gpu.cu");  // it compares device and host bits
  }
};

/// Device memory or pinned host memory for n elements of T, freed (with a checked call) on scope
/// exit.
template <class T, bool Pinned>
class memory {
 public:
  explicit memory(std::size_t n) : n_(n) {
    void* p = nullptr;
    if constexpr (Pinned) {
      HONE_CUDA_CHECK(cudaMallocHost(&p, n * sizeof(T)));
    } else {
      HONE_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    }
    p_ = static_cast<T*>(p);
  }
  memory(const memory&) = delete;
  memory& operator=(const memory&) = delete;
  ~memory() {
    const cudaError_t s = Pinned ? cudaFreeHost(p_) : cudaFree(p_);
    if (s != cudaSuccess) std::fprintf(stderr, "cudaFree failed: %s\n", cudaGetErrorString(s));
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

/// Per-format counts gathered on the device.
struct counts {
  unsigned long long mismatches;       // hone and CUDA differ, not both NaN
  unsigned long long nan_bits_differ;  // both NaN, different bits
  unsigned long long interop_errors;   // bfloat16(__nv_bfloat16) or back changed the bits
  unsigned int stored;                 // number of inputs stored in first[] (may exceed 8)
  std::uint32_t first[8];              // some failing inputs
};

constexpr int max_stored = 8;

__device__ void record(counts* c, std::uint32_t input) {
  const unsigned int slot = atomicAdd(&c->stored, 1u);
  if (slot < max_stored) c->first[slot] = input;
}

__host__ __device__ bool bf16_is_nan(std::uint16_t b) {
  return (b & 0x7fffu) > 0x7f80u;
}
__host__ __device__ bool half_is_nan(std::uint16_t b) {
  return (b & 0x7fffu) > 0x7c00u;
}

/// Converts the floats with bits base .. base + n - 1 with hone and with CUDA; writes hone's
/// results for the host comparison and counts the differences from CUDA.
__global__ void convert_chunk(std::uint32_t base, std::uint32_t n, std::uint16_t* hone_bf16,
                              std::uint16_t* hone_half, counts* c_bf16, counts* c_half) {
  unsigned long long mismatch_b = 0, nan_b = 0, interop_b = 0;
  unsigned long long mismatch_h = 0, nan_h = 0, interop_h = 0;
  const std::uint32_t stride = gridDim.x * blockDim.x;
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::uint32_t u = base + i;
    const float x = __uint_as_float(u);

    const hone::bfloat16 hb(x);
    const __nv_bfloat16 cb = __float2bfloat16_rn(x);
    const std::uint16_t cb_bits = __bfloat16_as_ushort(cb);
    hone_bf16[i] = hb.bits();
    if (hb.bits() != cb_bits) {
      if (bf16_is_nan(hb.bits()) && bf16_is_nan(cb_bits)) {
        ++nan_b;
      } else {
        ++mismatch_b;
        record(c_bf16, u);
      }
    }
    if (hone::bfloat16(cb).bits() != cb_bits ||
        __bfloat16_as_ushort(static_cast<__nv_bfloat16>(hb)) != hb.bits()) {
      ++interop_b;
    }

    const hone::half hh(x);
    const __half ch = __float2half_rn(x);
    const std::uint16_t ch_bits = __half_as_ushort(ch);
    hone_half[i] = hh.bits();
    if (hh.bits() != ch_bits) {
      if (half_is_nan(hh.bits()) && half_is_nan(ch_bits)) {
        ++nan_h;
      } else {
        ++mismatch_h;
        record(c_half, u);
      }
    }
    if (hone::half(ch).bits() != ch_bits ||
        __half_as_ushort(static_cast<__half>(hh)) != hh.bits()) {
      ++interop_h;
    }
  }
  if (mismatch_b != 0) atomicAdd(&c_bf16->mismatches, mismatch_b);
  if (nan_b != 0) atomicAdd(&c_bf16->nan_bits_differ, nan_b);
  if (interop_b != 0) atomicAdd(&c_bf16->interop_errors, interop_b);
  if (mismatch_h != 0) atomicAdd(&c_half->mismatches, mismatch_h);
  if (nan_h != 0) atomicAdd(&c_half->nan_bits_differ, nan_h);
  if (interop_h != 0) atomicAdd(&c_half->interop_errors, interop_h);
}

/// All 2^16 patterns to float with hone (out[0..2^16) for bf16, out[2^16..2^17) for half) and with
/// CUDA (cuda_out, same layout), as float bit patterns.
__global__ void decode_all(std::uint32_t* hone_out, std::uint32_t* cuda_out) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 0x10000u) return;
  const auto bits = static_cast<std::uint16_t>(i);
  hone_out[i] = __float_as_uint(hone::to_float(hone::bfloat16::from_bits(bits)));
  cuda_out[i] = __float_as_uint(__bfloat162float(__ushort_as_bfloat16(bits)));
  hone_out[0x10000u + i] = __float_as_uint(hone::to_float(hone::half::from_bits(bits)));
  cuda_out[0x10000u + i] = __float_as_uint(__half2float(__ushort_as_half(bits)));
}

/// CUDA's and hone's results for a few NaN inputs (for the log).
__global__ void nan_examples(const std::uint32_t* in, int n, std::uint16_t* out) {
  for (int i = 0; i < n; ++i) {
    const float x = __uint_as_float(in[i]);
    out[4 * i + 0] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    out[4 * i + 1] = hone::bfloat16(x).bits();
    out[4 * i + 2] = __half_as_ushort(__float2half_rn(x));
    out[4 * i + 3] = hone::half(x).bits();
  }
}

bool float_bits_nan(std::uint32_t u) {
  return (u & 0x7fffffffu) > 0x7f800000u;
}

/// Checks the launch of the kernel named `what` and waits for it, checking its completion.
void launch_check(const char* what) {
  hone::check_last_launch(what);
  HONE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(gpu_fixture);

BOOST_AUTO_TEST_CASE(every_float_on_device_matches_cuda_and_host) {
  constexpr std::uint32_t chunk = 1u << 26;  // 64 chunks of 2^26 floats (128 MiB per result array)
  memory<std::uint16_t, false> d_bf16(chunk), d_half(chunk);
  memory<std::uint16_t, true> h_bf16(chunk), h_half(chunk);
  memory<counts, false> d_counts(2);
  HONE_CUDA_CHECK(cudaMemset(d_counts.get(), 0, 2 * sizeof(counts)));

  int device = 0, sms = 0;
  HONE_CUDA_CHECK(cudaGetDevice(&device));
  HONE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const unsigned int blocks = static_cast<unsigned int>(sms) * 8u;

  unsigned long long host_mismatches = 0;
  std::vector<std::uint32_t> host_first;
  for (std::uint64_t base = 0; base < (1ull << 32); base += chunk) {
    convert_chunk<<<blocks, 256>>>(static_cast<std::uint32_t>(base), chunk, d_bf16.get(),
                                   d_half.get(), d_counts.get(), d_counts.get() + 1);
    launch_check("convert_chunk");
    HONE_CUDA_CHECK(cudaMemcpy(h_bf16.get(), d_bf16.get(), chunk * sizeof(std::uint16_t),
                               cudaMemcpyDeviceToHost));
    HONE_CUDA_CHECK(cudaMemcpy(h_half.get(), d_half.get(), chunk * sizeof(std::uint16_t),
                               cudaMemcpyDeviceToHost));
    // hone on the host must give the same bits, NaNs included.
    const std::uint16_t* got_b = h_bf16.get();
    const std::uint16_t* got_h = h_half.get();
    const auto host_differs = [&](std::uint32_t i) {
      const float x = hone::detail::bits_to_float(static_cast<std::uint32_t>(base + i));
      return hone::bfloat16(x).bits() != got_b[i] || hone::half(x).bits() != got_h[i];
    };
    const unsigned long long bad = tbb::parallel_reduce(
        tbb::blocked_range<std::uint32_t>(0, chunk, 1u << 16), 0ull,
        [&](const tbb::blocked_range<std::uint32_t>& r, unsigned long long acc) {
          for (std::uint32_t i = r.begin(); i != r.end(); ++i) acc += host_differs(i) ? 1u : 0u;
          return acc;
        },
        [](unsigned long long a, unsigned long long b) { return a + b; });
    host_mismatches += bad;
    for (std::uint32_t i = 0; bad != 0 && i < chunk && host_first.size() < max_stored; ++i) {
      if (host_differs(i)) host_first.push_back(static_cast<std::uint32_t>(base + i));
    }
  }

  counts c[2];
  HONE_CUDA_CHECK(cudaMemcpy(c, d_counts.get(), sizeof c, cudaMemcpyDeviceToHost));
  const char* names[2] = {"bfloat16", "half"};
  for (int t = 0; t < 2; ++t) {
    std::printf(
        "float -> %s on device: %llu mismatches with CUDA, %llu NaN results with other bits "
        "than CUDA's, %llu interop errors\n",
        names[t], c[t].mismatches, c[t].nan_bits_differ, c[t].interop_errors);
    for (unsigned int k = 0; k < c[t].stored && k < max_stored; ++k) {
      BOOST_ERROR(names[t] << ": hone and CUDA differ for float bits 0x" << std::hex
                           << c[t].first[k]);
    }
    BOOST_TEST(c[t].mismatches == 0u);
    BOOST_TEST(c[t].interop_errors == 0u);
  }
  std::printf("device vs host hone: %llu inputs with other bits\n", host_mismatches);
  for (std::uint32_t u : host_first) {
    BOOST_ERROR("hone on device and on host differ for float bits 0x" << std::hex << u);
  }
  BOOST_TEST(host_mismatches == 0u);

  // For the log: what CUDA makes of a few NaNs (hone: sign kept, payload kept, quiet bit set).
  const std::uint32_t nans[] = {0x7f800001u, 0x7fc00000u, 0xffc00000u, 0x7fa00000u, 0xffffffffu};
  constexpr int n_nans = 5;
  memory<std::uint32_t, false> d_in(n_nans);
  memory<std::uint16_t, false> d_out(4 * n_nans);
  HONE_CUDA_CHECK(cudaMemcpy(d_in.get(), nans, sizeof nans, cudaMemcpyHostToDevice));
  nan_examples<<<1, 1>>>(d_in.get(), n_nans, d_out.get());
  launch_check("nan_examples");
  std::uint16_t out[4 * n_nans];
  HONE_CUDA_CHECK(cudaMemcpy(out, d_out.get(), sizeof out, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n_nans; ++i) {
    std::printf(
        "NaN 0x%08x: CUDA bf16 0x%04x, hone bf16 0x%04x; CUDA half 0x%04x, hone half 0x%04x\n",
        nans[i], out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]);
    BOOST_TEST(bf16_is_nan(out[4 * i]));
    BOOST_TEST(half_is_nan(out[4 * i + 2]));
  }
}

BOOST_AUTO_TEST_CASE(every_value_to_float_on_device) {
  memory<std::uint32_t, false> d_hone(0x20000u), d_cuda(0x20000u);
  decode_all<<<0x10000u / 256u, 256>>>(d_hone.get(), d_cuda.get());
  launch_check("decode_all");
  std::vector<std::uint32_t> hone_bits(0x20000u), cuda_bits(0x20000u);
  HONE_CUDA_CHECK(cudaMemcpy(hone_bits.data(), d_hone.get(), 0x20000u * sizeof(std::uint32_t),
                             cudaMemcpyDeviceToHost));
  HONE_CUDA_CHECK(cudaMemcpy(cuda_bits.data(), d_cuda.get(), 0x20000u * sizeof(std::uint32_t),
                             cudaMemcpyDeviceToHost));
  unsigned long long vs_host = 0, vs_cuda = 0, nan_bits_differ = 0;
  for (std::uint32_t i = 0; i < 0x20000u; ++i) {
    const auto bits = static_cast<std::uint16_t>(i & 0xffffu);
    const float host = i < 0x10000u ? hone::to_float(hone::bfloat16::from_bits(bits))
                                    : hone::to_float(hone::half::from_bits(bits));
    if (hone::detail::float_to_bits(host) != hone_bits[i]) {
      if (++vs_host <= 8) BOOST_ERROR("device hone::to_float differs from host for " << i);
    }
    if (hone_bits[i] != cuda_bits[i]) {
      if (float_bits_nan(hone_bits[i]) && float_bits_nan(cuda_bits[i])) {
        ++nan_bits_differ;
      } else if (++vs_cuda <= 8) {
        BOOST_ERROR((i < 0x10000u ? "bfloat16 0x" : "half 0x")
                    << std::hex << bits << ": hone 0x" << hone_bits[i] << ", CUDA 0x"
                    << cuda_bits[i]);
      }
    }
  }
  std::printf(
      "to float on device: %llu differences from host, %llu from CUDA, %llu NaNs with "
      "other bits than CUDA's\n",
      vs_host, vs_cuda, nan_bits_differ);
  BOOST_TEST(vs_host == 0u);
  BOOST_TEST(vs_cuda == 0u);
}
