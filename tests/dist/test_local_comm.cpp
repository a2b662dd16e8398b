// Tests of the communicator concept and local_comm, the one-rank communicator: every collective
// completes at once, reductions leave the data unchanged, gathers and scatters copy.
#define BOOST_TEST_MODULE hone_dist_local_comm
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <hone/dist.hpp>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

namespace hd = hone::dist;

namespace {
struct missing_max_double {  // all_reduce for float only
  struct req {
    void wait() {}
    bool test() { return true; }
  };
  int rank() const { return 0; }
  int size() const { return 1; }
  req all_reduce(std::span<float>, hd::reduce_op) { return {}; }
  template <class T>
  req reduce_scatter(std::span<const T>, std::span<T>, hd::reduce_op) {
    return {};
  }
  template <class T>
  req all_gather(std::span<const T>, std::span<T>) {
    return {};
  }
  template <class T>
  req broadcast(std::span<T>, int) {
    return {};
  }
  req barrier() { return {}; }
};
struct request_without_test {
  void wait() {}
};
}  // namespace

static_assert(hd::communicator<hd::local_comm>);
static_assert(hd::check_communicator<hd::local_comm>());
static_assert(hd::request<hd::local_comm::request>);
static_assert(!hd::request<request_without_test>);
static_assert(hd::has_rank_and_size<missing_max_double>);
static_assert(hd::has_barrier<missing_max_double>);
static_assert(!hd::has_reductions<missing_max_double>);
static_assert(!hd::communicator<missing_max_double>);
static_assert(!hd::communicator<int>);

BOOST_AUTO_TEST_CASE(rank_and_size) {
  const hd::local_comm c;
  BOOST_TEST(c.rank() == 0);
  BOOST_TEST(c.size() == 1);
}

BOOST_AUTO_TEST_CASE(all_reduce_is_the_identity) {
  hd::local_comm c;
  std::vector<float> f{1.5f, -0.0f, std::numeric_limits<float>::quiet_NaN(), 4.0f};
  auto r = c.all_reduce(std::span<float>(f), hd::reduce_op::sum);
  BOOST_TEST(r.test());
  r.wait();
  BOOST_TEST(f[0] == 1.5f);
  BOOST_TEST(std::signbit(f[1]));
  BOOST_TEST(std::isnan(f[2]));
  std::vector<double> d{2.0, 3.0};
  c.all_reduce(std::span<double>(d), hd::reduce_op::max).wait();
  BOOST_TEST(d == (std::vector<double>{2.0, 3.0}), boost::test_tools::per_element());
  c.all_reduce(std::span<float>(), hd::reduce_op::sum).wait();  // empty
}

BOOST_AUTO_TEST_CASE(reduce_scatter_and_all_gather_copy) {
  hd::local_comm c;
  std::vector<float> in(7);
  std::iota(in.begin(), in.end(), 1.0f);
  std::vector<float> out(7, 0.0f);
  c.reduce_scatter(std::span<const float>(in), std::span<float>(out), hd::reduce_op::sum).wait();
  BOOST_TEST(out == in, boost::test_tools::per_element());
  std::vector<double> g(3, 0.0);
  const std::vector<double> src{4.0, 5.0, 6.0};
  c.all_gather(std::span<const double>(src), std::span<double>(g)).wait();
  BOOST_TEST(g == src, boost::test_tools::per_element());
  // In place (the input is this rank's block of the output) and empty.
  c.all_gather(std::span<const double>(g), std::span<double>(g)).wait();
  BOOST_TEST(g == src, boost::test_tools::per_element());
  c.all_gather(std::span<const double>(), std::span<double>()).wait();
  c.reduce_scatter(std::span<const float>(), std::span<float>(), hd::reduce_op::max).wait();
}

BOOST_AUTO_TEST_CASE(sizes_and_roots_are_checked) {
  hd::local_comm c;
  std::vector<float> a(4), b(3);
  BOOST_CHECK_THROW(
      (void)c.reduce_scatter(std::span<const float>(a), std::span<float>(b), hd::reduce_op::sum),
      hone::config_error);
  BOOST_CHECK_THROW((void)c.all_gather(std::span<const float>(a), std::span<float>(b)),
                    hone::config_error);
  BOOST_CHECK_THROW((void)c.broadcast(std::span<float>(a), 1), hone::config_error);
  a = {1, 2, 3, 4};
  c.broadcast(std::span<float>(a), 0).wait();
  BOOST_TEST(a == (std::vector<float>{1, 2, 3, 4}), boost::test_tools::per_element());
  auto r = c.barrier();
  BOOST_TEST(r.test());
}

BOOST_AUTO_TEST_CASE(dist_error_is_a_hone_error) {
  const hone::dist_error e("x");
  const hone::error& base = e;
  BOOST_TEST(std::string(base.what()) == "x");
  BOOST_TEST(std::string(hd::to_string(hd::reduce_op::max)) == "max");
}
