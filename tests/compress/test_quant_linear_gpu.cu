// GPU test (label gpu): hone::compress::cuda_int8_linear (the dynamic int8 linear layer on
// cuBLASLt) against the host dynamic_int8_linear (scalar kernel) and scalar oracles, for m in
// {1, 7, 32, 256} and (in, out) in {(64, 32), (1024, 1024), (130, 66)}: the device activation
// codes, scales and zero points equal the host's bit for bit; cuBLASLt's int32 sums equal an int64
// triple loop exactly (and the host's accumulators after the 128 shift); the outputs are within
// 1 ulp of the host's (identical unless the host compiler fuses its multiply-add). Also zero,
// one-sided and non-finite rows, per-tensor weights, a caller's handle, repeatability, and the
// sentences for bad shapes. Exits 77 (skipped) without a CUDA device.
#define BOOST_TEST_MODULE hone_compress_quant_linear_gpu
#include <boost/test/unit_test.hpp>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <hone/compress/cuda/quant_linear.cuh>
#include <hone/compress/quant_linear.hpp>
#include <hone/core/cuda/error.hpp>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../support/gpu.hpp"

namespace hc = hone::compress;

namespace {

struct gpu_fixture {
  gpu_fixture() {
    hone::test::skip_without_gpu();
    std::printf("cuBLASLt version %zu\n", cublasLtGetVersion());
  }
};

template <class T>
struct device_array {
  T* p = nullptr;
  std::size_t n = 0;
  explicit device_array(std::size_t count) : n(count) {
    HONE_CUDA_CHECK(cudaMalloc(&p, count * sizeof(T) + 16));
  }
  explicit device_array(const std::vector<T>& host) : device_array(host.size()) {
    HONE_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    HONE_CUDA_CHECK(cudaDeviceSynchronize());  // ordered before work on non-blocking streams
  }
  ~device_array() { (void)cudaFree(p); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
};

template <class T>
std::vector<T> to_host(const T* d, std::size_t count) {
  std::vector<T> h(count);
  HONE_CUDA_CHECK(cudaMemcpy(h.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

struct stream_guard {
  cudaStream_t s = nullptr;
  stream_guard() { HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~stream_guard() { (void)cudaStreamDestroy(s); }
  stream_guard(const stream_guard&) = delete;
  stream_guard& operator=(const stream_guard&) = delete;
};

std::vector<float> random_values(std::size_t count, float lo, float hi, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(count);
  for (float& x : v) x = d(g);
  return v;
}

/// Activations with every kind of row: mixed sign, ReLU-like (>= 0: zero point 0), all negative
/// (zero point 255), a wide range, and (when `zero_row` is set and m > 2) a row of zeros.
std::vector<float> activations(std::size_t m, std::size_t k, std::uint32_t seed, bool zero_row) {
  std::vector<float> x = random_values(m * k, -3.0f, 3.0f, seed);
  for (std::size_t r = 0; r < m; ++r) {
    float* row = x.data() + r * k;
    switch (r % 4) {
      case 1:
        for (std::size_t j = 0; j < k; ++j) row[j] = std::fabs(row[j]);
        break;
      case 2:
        for (std::size_t j = 0; j < k; ++j) row[j] = -std::fabs(row[j]) - 0.5f;
        break;
      case 3:
        for (std::size_t j = 0; j < k; ++j) row[j] *= (j % 7 == 0) ? 1000.0f : 0.01f;
        break;
      default:
        break;
    }
  }
  if (zero_row && m > 2) std::fill(x.begin() + 2 * k, x.begin() + 3 * k, 0.0f);
  return x;
}

std::int64_t ulp_distance(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : INT64_MAX;
  std::int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  const std::int64_t la = ia < 0 ? std::int64_t{INT32_MIN} - ia : ia;
  const std::int64_t lb = ib < 0 ? std::int64_t{INT32_MIN} - ib : ib;
  return la > lb ? la - lb : lb - la;
}

/// What a device forward left behind, copied back.
struct device_result {
  std::vector<float> y;
  std::vector<std::int8_t> codes;  // [mp, kp]
  std::vector<float> scales;
  std::vector<std::int32_t> zero_points;
  std::vector<std::int32_t> acc;  // [mp, np]
};

device_result run_device(hc::cuda_int8_linear& lin, const std::vector<float>& x, std::size_t m,
                         cudaStream_t stream) {
  device_array<float> dx(x);
  device_array<float> dy(std::vector<float>(m * lin.out_features(), -7.0f));
  lin.forward(dx.p, m, dy.p, stream);
  HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::size_t mp = hc::cuda_int8_linear::padded_rows(m);
  device_result r;
  r.y = to_host(dy.p, m * lin.out_features());
  r.codes = to_host(lin.device_codes(), mp * lin.padded_in_features());
  r.scales = to_host(lin.device_activation_scales(), m);
  r.zero_points = to_host(lin.device_zero_points(), m);
  r.acc = to_host(lin.device_accumulators(), mp * lin.padded_out_features());
  return r;
}

/// Every check of the file header for one shape; `q` is shared by both layers.
void check_against_host(const hc::quantized_weights& q, const std::vector<float>& bias,
                        std::size_t m, std::uint32_t seed, cudaStream_t stream,
                        cublasLtHandle_t handle = nullptr) {
  const std::size_t k = q.cols, n = q.rows;
  BOOST_TEST_CONTEXT(
      "m " << m << " in " << k << " out " << n << " bias " << !bias.empty()
           << (q.granularity == hc::quant_granularity::per_tensor ? " per_tensor" : "")) {
    const std::vector<float> x = activations(m, k, seed, true);
    hc::dynamic_int8_linear host(q, bias);
    std::vector<float> yh(m * n);
    host.forward(x, m, yh, hc::int8_kernel::scalar);

    hc::cuda_int8_linear_options opt;
    opt.handle = handle;
    hc::cuda_int8_linear dev(q, bias, opt);
    const device_result d = run_device(dev, x, m, stream);
    const std::size_t kp = dev.padded_in_features(), np = dev.padded_out_features();
    BOOST_TEST(kp % 16 == 0);
    BOOST_TEST(np % 16 == 0);
    BOOST_TEST(kp >= k);
    BOOST_TEST(np >= n);

    // 1. activation parameters and codes: the host's, bit for bit
    const auto hp = host.last_activation_params();
    const auto ha = host.last_activations();  // [m, host kp], uint8, padding = zero point
    const std::size_t hkp = host.packed().kp;
    std::size_t bad_params = 0, bad_codes = 0;
    std::ostringstream first;
    for (std::size_t r = 0; r < m; ++r) {
      std::uint32_t hs, ds;
      std::memcpy(&hs, &hp[r].scale, 4);
      std::memcpy(&ds, &d.scales[r], 4);
      if (hs != ds || hp[r].zero_point != d.zero_points[r]) {
        if (bad_params++ == 0) {
          first << "row " << r << ": host scale " << hp[r].scale << " zp " << hp[r].zero_point
                << ", device scale " << d.scales[r] << " zp " << d.zero_points[r] << "; ";
        }
      }
      for (std::size_t j = 0; j < kp; ++j) {
        const int host_u = j < hkp ? ha[r * hkp + j] : hp[r].zero_point;  // host pads with zp
        const int dev_u = d.codes[r * kp + j] + 128;
        if (host_u != dev_u && bad_codes++ == 0) {
          first << "code [" << r << ", " << j << "]: host " << host_u << ", device " << dev_u
                << " (x = " << (j < k ? x[r * k + j] : 0.0f) << "); ";
        }
      }
    }
    BOOST_TEST(bad_params == 0u,
               "activation parameters differ in " << bad_params << " rows; " << first.str());
    BOOST_TEST(bad_codes == 0u,
               "activation codes differ in " << bad_codes << " places; " << first.str());
    // the padded rows hold zero codes
    const std::size_t mp = hc::cuda_int8_linear::padded_rows(m);
    std::size_t bad_pad_rows = 0;
    for (std::size_t i = m * kp; i < mp * kp; ++i) bad_pad_rows += d.codes[i] != 0;
    BOOST_TEST(bad_pad_rows == 0u);

    // 2. the int32 sums: an int64 triple loop over the device codes, exactly; the host's
    //    accumulators after the shift by 128 * sum_k Wq[o, k]
    const auto hacc = host.last_accumulators();  // [m, host np]
    const std::size_t hnp = host.packed().np;
    std::size_t bad_oracle = 0, bad_host = 0, bad_padcols = 0;
    std::ostringstream afirst;
    for (std::size_t r = 0; r < m; ++r) {
      for (std::size_t o = 0; o < np; ++o) {
        std::int64_t want = 0, wsum = 0;
        if (o < n) {
          for (std::size_t j = 0; j < k; ++j) {
            const std::int64_t w = q.values[o * k + j];
            want += static_cast<std::int64_t>(d.codes[r * kp + j]) * w;
            wsum += w;
          }
        }
        const std::int64_t got = d.acc[r * np + o];
        if (o >= n) {
          bad_padcols += got != 0;
          continue;
        }
        if (got != want && bad_oracle++ == 0) {
          afirst << "acc [" << r << ", " << o << "]: device " << got << ", oracle " << want << "; ";
        }
        if (got + 128 * wsum != hacc[r * hnp + o] && bad_host++ == 0) {
          afirst << "acc [" << r << ", " << o << "]: device + 128 wsum = " << got + 128 * wsum
                 << ", host " << hacc[r * hnp + o] << "; ";
        }
      }
    }
    BOOST_TEST(bad_oracle == 0u, "accumulators differ from the int64 oracle in "
                                     << bad_oracle << " places; " << afirst.str());
    BOOST_TEST(bad_host == 0u, "accumulators differ from the host's in " << bad_host << " places; "
                                                                         << afirst.str());
    BOOST_TEST(bad_padcols == 0u,
               "padded output columns are not zero in " << bad_padcols << " places");

    // 3. outputs: the host's within 1 ulp
    std::int64_t worst = 0;
    std::size_t identical = 0, worst_at = 0;
    for (std::size_t i = 0; i < m * n; ++i) {
      const std::int64_t u = ulp_distance(d.y[i], yh[i]);
      identical += u == 0;
      if (u > worst) {
        worst = u;
        worst_at = i;
      }
    }
    BOOST_TEST(worst <= 1, "outputs differ from the host's by up to "
                               << worst << " ulp at [" << worst_at / n << ", " << worst_at % n
                               << "]: device " << d.y[worst_at] << ", host " << yh[worst_at] << " ("
                               << identical << " of " << m * n << " identical)");

    // 4. the same bits on a second run of the same layer
    const device_result again = run_device(dev, x, m, stream);
    BOOST_TEST(std::memcmp(again.y.data(), d.y.data(), d.y.size() * sizeof(float)) == 0);
  }
}

hc::quantized_weights weights(std::size_t n, std::size_t k, std::uint32_t seed,
                              hc::quant_granularity g = hc::quant_granularity::per_channel) {
  std::vector<float> w = random_values(n * k, -0.5f, 0.5f, seed);
  // rows of different magnitudes, and one zero row (scale 0) when there are enough
  for (std::size_t o = 0; o < n; ++o) {
    const float f = o % 3 == 0 ? 4.0f : (o % 3 == 1 ? 0.01f : 1.0f);
    for (std::size_t j = 0; j < k; ++j) w[o * k + j] *= f;
  }
  if (n > 5) std::fill(w.begin() + 5 * k, w.begin() + 6 * k, 0.0f);
  return hc::quantize_weights(w, n, k, g);
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(gpu_fixture);

BOOST_AUTO_TEST_CASE(matches_host_and_oracle) {
  stream_guard stream;
  std::uint32_t seed = 10;
  const std::size_t shapes[][2] = {{64, 32}, {1024, 1024}, {130, 66}};  // {in, out}
  for (const auto& s : shapes) {
    const std::size_t k = s[0], n = s[1];
    const hc::quantized_weights q = weights(n, k, ++seed);
    const std::vector<float> bias = random_values(n, -1.0f, 1.0f, ++seed);
    for (const std::size_t m :
         {std::size_t{1}, std::size_t{7}, std::size_t{32}, std::size_t{256}}) {
      check_against_host(q, bias, m, ++seed, stream.s);
    }
    check_against_host(q, {}, 7, ++seed, stream.s);  // no bias
  }
}

BOOST_AUTO_TEST_CASE(per_tensor_weights_and_callers_handle) {
  stream_guard stream;
  cublasLtHandle_t handle = nullptr;
  BOOST_REQUIRE(cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS);
  const hc::quantized_weights q = weights(48, 100, 77, hc::quant_granularity::per_tensor);
  check_against_host(q, random_values(48, -2.0f, 2.0f, 78), 33, 79, stream.s, handle);
  // the default stream too
  check_against_host(q, {}, 5, 80, nullptr, handle);
  BOOST_TEST(cublasLtDestroy(handle) == CUBLAS_STATUS_SUCCESS);
}

BOOST_AUTO_TEST_CASE(zero_and_nonfinite_rows) {
  stream_guard stream;
  const std::size_t k = 70, n = 20, m = 4;
  const hc::quantized_weights q = weights(n, k, 5);
  const std::vector<float> bias = random_values(n, -1.0f, 1.0f, 6);
  hc::cuda_int8_linear dev(q, bias);
  // row 0 zeros: y = bias exactly; row 2 holds a NaN, row 3 an infinity: rows of NaN; row 1
  // matches the host
  std::vector<float> x = random_values(m * k, -1.0f, 1.0f, 7);
  std::fill(x.begin(), x.begin() + k, 0.0f);
  x[2 * k + 11] = std::numeric_limits<float>::quiet_NaN();
  x[3 * k + 69] = -std::numeric_limits<float>::infinity();
  const device_result d = run_device(dev, x, m, stream.s);
  for (std::size_t o = 0; o < n; ++o) {
    BOOST_TEST(d.y[o] == bias[o], "zero row, output " << o);
    BOOST_TEST(std::isnan(d.y[2 * n + o]), "NaN row, output " << o << " is " << d.y[2 * n + o]);
    BOOST_TEST(std::isnan(d.y[3 * n + o]), "inf row, output " << o << " is " << d.y[3 * n + o]);
  }
  BOOST_TEST(d.scales[0] == 1.0f);
  BOOST_TEST(d.zero_points[0] == 0);
  hc::dynamic_int8_linear host(q, bias);
  std::vector<float> yh(n);
  host.forward(std::span<const float>(x).subspan(k, k), 1, yh, hc::int8_kernel::scalar);
  for (std::size_t o = 0; o < n; ++o) {
    BOOST_TEST(ulp_distance(d.y[n + o], yh[o]) <= 1,
               "row 1, output " << o << ": device " << d.y[n + o] << ", host " << yh[o]);
  }
  // without a bias a zero row gives +0
  hc::cuda_int8_linear nobias(q);
  const device_result z = run_device(nobias, std::vector<float>(k, 0.0f), 1, stream.s);
  for (std::size_t o = 0; o < n; ++o) {
    BOOST_TEST(z.y[o] == 0.0f);
    BOOST_TEST(!std::signbit(z.y[o]));
  }
}

BOOST_AUTO_TEST_CASE(from_fp32_weights_and_move) {
  stream_guard stream;
  const std::size_t k = 40, n = 24, m = 9;
  const std::vector<float> w = random_values(n * k, -1.0f, 1.0f, 41);
  hc::cuda_int8_linear a(w, n, k);
  hc::cuda_int8_linear b(std::move(a));  // the moved-to layer works
  hc::dynamic_int8_linear host(w, n, k);
  const std::vector<float> x = activations(m, k, 42, false);
  std::vector<float> yh(m * n);
  host.forward(x, m, yh, hc::int8_kernel::scalar);
  const device_result d = run_device(b, x, m, stream.s);
  std::int64_t worst = 0;
  for (std::size_t i = 0; i < m * n; ++i) worst = std::max(worst, ulp_distance(d.y[i], yh[i]));
  BOOST_TEST(worst <= 1);
  // m = 0 does nothing, with null pointers too
  BOOST_CHECK_NO_THROW(b.forward(nullptr, 0, nullptr, stream.s));
  HONE_CUDA_CHECK(cudaStreamSynchronize(stream.s));
}

namespace {
template <class F>
void expect_sentence(F&& f, const std::string& part) {
  try {
    f();
    BOOST_ERROR("no exception; expected a hone::config_error mentioning '" << part << "'");
  } catch (const hone::config_error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find(part) != std::string::npos,
               "message '" << what << "' lacks '" << part << "'");
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(bad_shapes_are_refused) {
  const std::vector<float> w(12, 0.5f);
  expect_sentence([&] { hc::cuda_int8_linear l(w, 3, 5); }, "the weights hold 12 values");
  expect_sentence([&] { hc::cuda_int8_linear l(std::vector<float>{}, 0, 4); },
                  "needs at least one input and one output feature");
  expect_sentence([&] { hc::cuda_int8_linear l(w, 3, 4, std::vector<float>(2, 0.0f)); },
                  "the bias holds 2 values");
  const std::vector<float> wide(66001, 0.25f);
  expect_sentence([&] { hc::cuda_int8_linear l(wide, 1, 66001); },
                  "in_features = 66001 is above 66000");
  hc::quantized_weights q = hc::quantize_weights(w, 3, 4);
  q.scales.pop_back();
  expect_sentence([&] { hc::cuda_int8_linear l(q); }, "per_channel weights need 3");
  std::vector<float> bad = w;
  bad[7] = std::numeric_limits<float>::quiet_NaN();
  expect_sentence([&] { hc::cuda_int8_linear l(bad, 3, 4); }, "row 1, column 3");
  hc::cuda_int8_linear ok(w, 3, 4);
  device_array<float> y(3);
  expect_sentence([&] { ok.forward(nullptr, 1, y.p, nullptr); }, "null pointer with m = 1");
  expect_sentence([&] { ok.forward(y.p, std::size_t{1} << 31, y.p, nullptr); }, "split the batch");
}
