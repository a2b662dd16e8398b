// The host unscale pass (hone::unscale_accumulate_into) against a scalar reference written here:
// master = factor * g, or master + factor * g, each operation rounded on its own (no fused
// multiply-add: the device computes __fmul_rn then __fadd_rn), for fp32, bf16 and fp16 working
// gradients, separate tensors of odd sizes; and the sum of squares of the result in double, which
// hone::unscaled_sum_of_squares (the read-only pass) returns bit for bit without storing.
// Also built with -march=native (test_unscale_native), where a compiler may fuse the product
// into the add unless the library prevents it.
#define BOOST_TEST_MODULE hone_precision_unscale
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <hone/core/bfloat16.hpp>
#include <hone/core/half.hpp>
#include <hone/precision/unscale.hpp>
#include <limits>
#include <random>
#include <vector>

namespace {

/// factor * g rounded to float on its own: read back from a volatile, it cannot be fused into the
/// add that follows (a product computed in double and narrowed would be: g++ turns it back into a
/// float multiply and contracts that).
float product(float factor, float g) {
  volatile float x = factor * g;
  return x;
}

/// The index of the first element whose bits differ, or n.
std::size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  }
  return a.size();
}

template <class G>
void check_unscale(float poison) {
  const std::vector<std::size_t> sizes{1, 7, 33, 1000, 4099};
  std::size_t total = 0;
  for (auto n : sizes) total += n;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<G> g1(total), g2(total);
  for (std::size_t i = 0; i < total; ++i) {
    g1[i] = static_cast<G>(normal(rng));
    g2[i] = static_cast<G>(normal(rng));
  }
  if (poison != 0.0f) g2[total / 2] = static_cast<G>(poison);
  std::vector<float> master(total, 123.0f);  // overwritten by the first micro-batch
  hone::tensor_lists<float, const G> l1, l2;
  std::size_t off = 0;
  for (auto n : sizes) {
    l1.add(n, master.data() + off, g1.data() + off);
    l2.add(n, master.data() + off, g2.data() + off);
    off += n;
  }
  // Factors whose products round (not powers of two), as micro-batch weight / loss scale.
  const float f1 = 0.3f / 1024.0f, f2 = 0.7f / 1024.0f;
  const hone::host_tuning small_grain{.grain = 256};
  // The read-only pass (the trainer's direct route) leaves the master gradients alone and returns
  // the storing pass's sum, bit for bit.
  const double read_only = hone::unscaled_sum_of_squares(l1, f1, small_grain);
  BOOST_TEST(first_difference(master, std::vector<float>(total, 123.0f)) == total);
  const double first = hone::unscale_accumulate_into(l1, f1, false, small_grain);
  BOOST_TEST(std::memcmp(&read_only, &first, sizeof(double)) == 0);
  const double read_only2 = hone::unscaled_sum_of_squares(l2, f2, small_grain);
  if (poison == 0.0f) {
    BOOST_TEST(std::isfinite(read_only2));
  } else {
    BOOST_TEST(!std::isfinite(read_only2));  // the overflow check without the store
  }

  std::vector<float> ref(total);
  double ref_first = 0.0;
  for (std::size_t i = 0; i < total; ++i) {
    ref[i] = product(f1, static_cast<float>(g1[i]));
    ref_first += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  BOOST_TEST(first_difference(master, ref) == total);
  BOOST_TEST(first == ref_first, boost::test_tools::tolerance(1e-12));

  const double sum = hone::unscale_accumulate_into(l2, f2, true, small_grain);
  double ref_sum = 0.0;
  for (std::size_t i = 0; i < total; ++i) {
    ref[i] = ref[i] + product(f2, static_cast<float>(g2[i]));
    ref_sum += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  const std::size_t at = first_difference(master, ref);
  BOOST_TEST_INFO("first differing master gradient: " << at);
  BOOST_TEST(at == total);
  if (poison == 0.0f) {
    BOOST_TEST(std::isfinite(sum));
    BOOST_TEST(sum == ref_sum, boost::test_tools::tolerance(1e-12));
  } else {
    BOOST_TEST(!std::isfinite(sum));  // the overflow check
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(fp32_grads_match_the_unfused_reference) {
  check_unscale<float>(0.0f);
  check_unscale<float>(std::numeric_limits<float>::infinity());
  check_unscale<float>(std::numeric_limits<float>::quiet_NaN());
}

BOOST_AUTO_TEST_CASE(bf16_grads_match_the_unfused_reference) {
  check_unscale<hone::bfloat16>(0.0f);
  check_unscale<hone::bfloat16>(-std::numeric_limits<float>::infinity());
}

BOOST_AUTO_TEST_CASE(fp16_grads_match_the_unfused_reference) {
  check_unscale<hone::half>(0.0f);
  check_unscale<hone::half>(std::numeric_limits<float>::infinity());
}

BOOST_AUTO_TEST_CASE(read_only_sum_of_a_signalling_nan_is_the_storing_pass_bits) {
  // The read-only pass widens fp16 with F16C, which quiets a signalling NaN; the storing pass's
  // product quiets it too, so the sums (NaN, with a payload) must still be the same bits.
  std::vector<hone::half> g(1000, hone::half(0.5f));
  g[37] = hone::half::from_bits(0x7d01);   // signalling NaN with a payload
  g[600] = hone::half::from_bits(0xfd55);  // negative signalling NaN
  std::vector<float> master(g.size());
  hone::tensor_lists<float, const hone::half> l;
  l.add(g.size(), master.data(), g.data());
  const double read_only = hone::unscaled_sum_of_squares(l, 0.25f);
  const double stored = hone::unscale_accumulate_into(l, 0.25f, false);
  BOOST_TEST(std::isnan(read_only));
  BOOST_TEST(std::memcmp(&read_only, &stored, sizeof(double)) == 0);
}
