// Tests of the oneTBB backend (for_each, transform_reduce) and of tensor_lists, each against a
// scalar reference written independently in this file.
#define BOOST_TEST_MODULE hone_core_parallel
#include <boost/test/unit_test.hpp>

#include <oneapi/tbb/task_arena.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <hone/core/buffer.hpp>
#include <hone/core/multi_tensor.hpp>
#include <hone/core/parallel.hpp>
#include <random>
#include <vector>

namespace {
struct axpy {
  float a;
  HONE_HOST_DEVICE void operator()(float& y, const float& x) const { y += a * x; }
};
struct sum_squares {
  HONE_HOST_DEVICE double operator()(const float& x) const {
    return static_cast<double>(x) * static_cast<double>(x);
  }
};
struct plus {
  HONE_HOST_DEVICE double operator()(double a, double b) const { return a + b; }
};
struct three_way {  // a 4-array functor with mixed types: z = x * y + w, counted in c
  HONE_HOST_DEVICE void operator()(float& z, const float& x, const double& y, int& c) const {
    z = static_cast<float>(x * y) + z;
    c += 1;
  }
};

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
}  // namespace

BOOST_AUTO_TEST_CASE(for_each_matches_scalar_loop) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{65536},
                        std::size_t{65537}, std::size_t{1} << 20}) {
    auto x = random_floats(n, 1);
    auto y = random_floats(n, 2);
    auto ref = y;
    for (std::size_t i = 0; i < n; ++i) ref[i] = ref[i] + 0.5f * x[i];
    hone::for_each(n, axpy{0.5f}, y.data(), static_cast<const float*>(x.data()));
    BOOST_TEST((y == ref), "n = " << n);  // exact: the same operations in the same order
  }
}

BOOST_AUTO_TEST_CASE(for_each_mixed_types_and_small_grain) {
  const std::size_t n = 10007;
  auto x = random_floats(n, 3);
  std::vector<double> y(n);
  for (std::size_t i = 0; i < n; ++i) y[i] = 0.25 * static_cast<double>(i % 13);
  std::vector<float> z(n, 1.0f);
  std::vector<int> count(n, 0);
  hone::for_each(n, three_way{}, hone::host_tuning{.grain = 100}, z.data(),
                 static_cast<const float*>(x.data()), static_cast<const double*>(y.data()),
                 count.data());
  for (std::size_t i = 0; i < n; ++i) {
    const float expect = static_cast<float>(x[i] * y[i]) + 1.0f;
    BOOST_REQUIRE(z[i] == expect);
    BOOST_REQUIRE(count[i] == 1);  // every element visited exactly once
  }
}

BOOST_AUTO_TEST_CASE(transform_reduce_matches_reference_and_is_deterministic) {
  const std::size_t n = (std::size_t{1} << 20) + 12345;
  auto x = random_floats(n, 4);
  long double ref = 0;
  for (float v : x) ref += static_cast<long double>(v) * v;
  const float* px = x.data();
  const double r = hone::transform_reduce(n, 0.0, sum_squares{}, plus{}, px);
  BOOST_TEST(std::abs(r - static_cast<double>(ref)) / static_cast<double>(ref) < 1e-12);

  // The same bits whatever the number of threads.
  for (int threads : {1, 2, 3, 8}) {
    tbb::task_arena arena(threads);
    double again = 0;
    arena.execute([&] { again = hone::transform_reduce(n, 0.0, sum_squares{}, plus{}, px); });
    BOOST_TEST(std::memcmp(&again, &r, sizeof r) == 0, "threads = " << threads);
  }
  BOOST_TEST(hone::transform_reduce(0, 7.0, sum_squares{}, plus{}, px) == 7.0);
}

BOOST_AUTO_TEST_CASE(tensor_lists_validate_input) {
  hone::tensor_lists<float, const float> lists;
  std::vector<float> a(10), b(11);
  BOOST_CHECK_THROW(lists.add_spans(std::span<float>(a), std::span<const float>(b)),
                    hone::config_error);
  BOOST_CHECK_THROW(lists.add(3, nullptr, b.data()), hone::config_error);
  lists.add(0, nullptr, nullptr);  // empty tensors are skipped, even without storage
  BOOST_TEST(lists.empty());
  lists.add_spans(std::span<float>(a), std::span<const float>(b).first(10));
  BOOST_TEST(lists.size() == 1u);
  BOOST_TEST(lists.total_numel() == 10u);
  BOOST_TEST(lists.pointer<1>(0) == b.data());
}

BOOST_AUTO_TEST_CASE(multi_tensor_for_each_over_mixed_sizes) {
  // Many tensors of mixed sizes, including ones smaller than, equal to and larger than a chunk.
  std::mt19937 rng(5);
  std::uniform_int_distribution<std::size_t> size(1, 200000);
  std::vector<std::size_t> sizes{1, 65536, 65537, 3};
  for (int i = 0; i < 60; ++i) sizes.push_back(size(rng));
  std::vector<std::vector<float>> ys, xs, refs;
  hone::tensor_lists<float, const float> lists;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    ys.push_back(random_floats(sizes[i], static_cast<unsigned>(10 + i)));
    xs.push_back(random_floats(sizes[i], static_cast<unsigned>(1000 + i)));
    refs.push_back(ys.back());
    for (std::size_t k = 0; k < sizes[i]; ++k) refs.back()[k] += -1.25f * xs.back()[k];
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) lists.add(sizes[i], ys[i].data(), xs[i].data());
  hone::for_each(lists, axpy{-1.25f});
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    BOOST_TEST(std::memcmp(ys[i].data(), refs[i].data(), sizes[i] * sizeof(float)) == 0,
               "tensor " << i << " of " << sizes[i]);
  }

  // Reduction over the same lists equals the sum of per-tensor scalar sums.
  hone::tensor_lists<const float> ro;
  long double ref = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    ro.add(sizes[i], ys[i].data());
    for (float v : ys[i]) ref += static_cast<long double>(v) * v;
  }
  const double r = hone::transform_reduce(ro, 0.0, sum_squares{}, plus{});
  BOOST_TEST(std::abs(r - static_cast<double>(ref)) / static_cast<double>(ref) < 1e-12);
  tbb::task_arena one(1);
  double r1 = 0;
  one.execute([&] { r1 = hone::transform_reduce(ro, 0.0, sum_squares{}, plus{}); });
  BOOST_TEST(std::memcmp(&r1, &r, sizeof r) == 0);
}
