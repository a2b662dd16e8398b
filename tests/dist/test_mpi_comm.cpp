// Tests of mpi_comm, run under mpirun with 2 and 3 ranks: every collective against an oracle each
// rank computes alone (rank-dependent data whose reduction over the ranks is known in closed
// form), with sizes that are not multiples of the rank count, empty spans, max's NaN and signed
// zero rule, requests waited out of order, and argument checks, and that all_reduce asks Open MPI
// for its ring only while it starts; reduce_scatter's own transfers (every type, sum and max): the
// bits of its documented order in both schedules, repeatable, several in flight, and the timeout;
// all_reduce's own exchange of small messages: the bits of its rank order, and the max, sum and
// integer tests above through both of all_reduce's paths.
#define BOOST_TEST_MODULE hone_dist_mpi_comm
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <hone/core/isa.hpp>
#include <hone/dist/mpi/mpi_comm.hpp>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace hd = hone::dist;

namespace {
struct mpi_fixture {
  hd::mpi_environment env;
};

// A failing check on one rank must not leave the others waiting for ever: 20 s, then an error.
hd::mpi_comm make_comm() {
  return hd::mpi_comm(MPI_COMM_WORLD, std::chrono::seconds(20));
}

// Exact in float and double: small multiples of 0.5.
template <class T>
T value(int rank, std::size_t i) {
  return static_cast<T>(rank + 1) * (static_cast<T>(i % 13) + T(0.5));
}
template <class T>
T sum_oracle(int size, std::size_t i) {
  return static_cast<T>(size * (size + 1) / 2) * (static_cast<T>(i % 13) + T(0.5));
}
// max over r of ((i + 7 r) mod 11), computed by brute force.
double max_oracle(int size, std::size_t i) {
  double m = -1;
  for (int r = 0; r < size; ++r) m = std::max(m, static_cast<double>((i + 7 * r) % 11));
  return m;
}
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(mpi_fixture);

BOOST_AUTO_TEST_CASE(rank_and_size_agree_with_mpi) {
  auto c = make_comm();
  int r = -1, n = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  BOOST_TEST(c.rank() == r);
  BOOST_TEST(c.size() == n);
  BOOST_TEST(n >= 2);
  std::vector<std::int32_t> one{1};
  c.all_reduce(std::span<std::int32_t>(one), hd::reduce_op::sum).wait();
  BOOST_TEST(one[0] == n);
}

template <class T>
void check_sum(hd::mpi_comm& c, std::size_t n) {
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = value<T>(c.rank(), i);
  auto req = c.all_reduce(std::span<T>(x), hd::reduce_op::sum);
  req.wait();
  BOOST_TEST(req.test());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += x[i] != sum_oracle<T>(c.size(), i);
  BOOST_TEST(wrong == 0u, "n = " << n);
}

// Runs f() with both paths of all_reduce and all_gather for small messages on `c`: hone's own
// exchange (detail/p2p_all_reduce.hpp and p2p_all_gather.hpp, the default up to 48 KiB) and MPI's
// non-blocking collectives (the exchange off).
template <class F>
void with_and_without_the_exchange(hd::mpi_comm& c, F&& f) {
  const auto defaults = c.exchange();
  for (const std::size_t max_bytes : {defaults.max_bytes, std::size_t{0}}) {
    BOOST_TEST_CONTEXT((max_bytes == 0 ? "MPI's collective" : "own exchange")) {
      c.set_exchange({max_bytes, defaults.message_bytes, defaults.gather_block_bytes});
      f();
    }
  }
  c.set_exchange(defaults);
}

BOOST_AUTO_TEST_CASE(all_reduce_sum_float_and_double) {
  auto c = make_comm();
  with_and_without_the_exchange(c, [&] {
    for (std::size_t n : {0u, 1u, 7u, 1000u, 4099u, 12288u, 12289u, 100003u}) {
      check_sum<float>(c, n);
      check_sum<double>(c, n);
    }
    std::vector<std::int64_t> big{std::int64_t{1} << 40, -3};
    c.all_reduce(std::span<std::int64_t>(big), hd::reduce_op::sum).wait();
    BOOST_TEST(big[0] == (std::int64_t{1} << 40) * c.size());
    BOOST_TEST(big[1] == -3 * c.size());
  });
}

BOOST_AUTO_TEST_CASE(all_reduce_max_with_nan_and_signed_zero) {
  auto c = make_comm();
  with_and_without_the_exchange(c, [&] {
    const std::size_t n = 1001;
    std::vector<float> f(n);
    std::vector<double> d(n);
    for (std::size_t i = 0; i < n; ++i) {
      f[i] = static_cast<float>((i + 7 * static_cast<std::size_t>(c.rank())) % 11);
      d[i] = static_cast<double>(f[i]) - 100.0;
    }
    const int last = c.size() - 1;
    // Element 3: NaN on the last rank only; element 4: NaN on rank 0 only; element 5: +0 on rank 0,
    // -0 elsewhere; element 6: -0 everywhere.
    if (c.rank() == last) f[3] = d[3] = std::numeric_limits<float>::quiet_NaN();
    if (c.rank() == 0) f[4] = d[4] = std::numeric_limits<float>::quiet_NaN();
    f[5] = d[5] = c.rank() == 0 ? 0.0 : -0.0;
    f[6] = d[6] = -0.0;
    auto rf = c.all_reduce(std::span<float>(f), hd::reduce_op::max);
    auto rd = c.all_reduce(std::span<double>(d), hd::reduce_op::max);
    rd.wait();  // out of order
    rf.wait();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (i >= 3 && i <= 6) continue;
      wrong += f[i] != static_cast<float>(max_oracle(c.size(), i));
      wrong += d[i] != max_oracle(c.size(), i) - 100.0;
    }
    BOOST_TEST(wrong == 0u);
    BOOST_TEST(std::isnan(f[3]));
    BOOST_TEST(std::isnan(d[3]));
    BOOST_TEST(std::isnan(f[4]));
    BOOST_TEST(std::isnan(d[4]));
    BOOST_TEST((f[5] == 0.0f && !std::signbit(f[5])));
    BOOST_TEST((d[5] == 0.0 && !std::signbit(d[5])));
    BOOST_TEST((f[6] == 0.0f && std::signbit(f[6])));
    // Every rank holds the same bits (NaNs included): gather rank 0's result and compare.
    std::vector<float> root = f;
    c.broadcast(std::span<float>(root), 0).wait();
    BOOST_TEST(std::memcmp(root.data(), f.data(), n * sizeof(float)) == 0);
    std::vector<std::int32_t> ints{c.rank(), -c.rank()};
    c.all_reduce(std::span<std::int32_t>(ints), hd::reduce_op::max).wait();
    BOOST_TEST(ints[0] == c.size() - 1);
    BOOST_TEST(ints[1] == 0);
  });
}

BOOST_AUTO_TEST_CASE(reduce_scatter_blocks) {
  auto c = make_comm();
  for (std::size_t m : {0u, 1u, 5u, 333u}) {
    const std::size_t total = m * static_cast<std::size_t>(c.size());
    std::vector<double> in(total);
    for (std::size_t j = 0; j < total; ++j) in[j] = value<double>(c.rank(), j);
    std::vector<double> out(m, -1.0);
    c.reduce_scatter(std::span<const double>(in), std::span<double>(out), hd::reduce_op::sum)
        .wait();
    std::size_t wrong = 0;
    for (std::size_t k = 0; k < m; ++k) {
      wrong += out[k] != sum_oracle<double>(c.size(), static_cast<std::size_t>(c.rank()) * m + k);
    }
    BOOST_TEST(wrong == 0u, "m = " << m);
    std::vector<float> inf(total), outf(m);
    for (std::size_t j = 0; j < total; ++j) {
      inf[j] = static_cast<float>((j + 7 * static_cast<std::size_t>(c.rank())) % 11);
    }
    c.reduce_scatter(std::span<const float>(inf), std::span<float>(outf), hd::reduce_op::max)
        .wait();
    wrong = 0;
    for (std::size_t k = 0; k < m; ++k) {
      wrong += outf[k] !=
               static_cast<float>(max_oracle(c.size(), static_cast<std::size_t>(c.rank()) * m + k));
    }
    BOOST_TEST(wrong == 0u, "max, m = " << m);
  }
}

// Blocks of 0, 1, 3 and 1001 floats (one message of the exchange), 2047 (8188 bytes: three
// messages, the largest block the exchange takes under the default limit) and 2049 (MPI's
// MPI_Iallgather), copied (float) and in place (double: 1001 take the exchange, 2047 and 2049
// MPI's path), two in flight at once; through both paths, and with the message size lowered to 8
// bytes (the pieces grow to fit 16 messages per peer).
void check_all_gather(hd::mpi_comm& c, std::size_t m) {
  const auto n = static_cast<std::size_t>(c.size());
  std::vector<float> in(m);
  for (std::size_t k = 0; k < m; ++k) in[k] = static_cast<float>(c.rank() * 10000 + int(k));
  std::vector<float> out(m * n, -1.0f);
  // In place: this rank's block of the output is the input.
  std::vector<double> buf(m * n, -1.0);
  const std::size_t mine = static_cast<std::size_t>(c.rank()) * m;
  for (std::size_t k = 0; k < m; ++k) buf[mine + k] = c.rank() + 0.25 * static_cast<double>(k);
  auto copied = c.all_gather(std::span<const float>(in), std::span<float>(out));
  auto in_place =
      c.all_gather(std::span<const double>(buf.data() + mine, m), std::span<double>(buf));
  in_place.wait();  // out of order
  copied.wait();
  std::size_t wrong = 0;
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t k = 0; k < m; ++k) {
      wrong += out[r * m + k] != static_cast<float>(static_cast<int>(r) * 10000 + int(k));
    }
  }
  BOOST_TEST(wrong == 0u, "m = " << m);
  wrong = 0;
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t k = 0; k < m; ++k) {
      wrong += buf[r * m + k] != static_cast<double>(r) + 0.25 * static_cast<double>(k);
    }
  }
  BOOST_TEST(wrong == 0u, "in place, m = " << m);
}

BOOST_AUTO_TEST_CASE(all_gather_blocks_and_in_place) {
  auto c = make_comm();
  with_and_without_the_exchange(c, [&] {
    for (std::size_t m : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1001},
                          c.exchange().gather_block_bytes / sizeof(float) - 1,
                          c.exchange().gather_block_bytes / sizeof(float) + 1}) {
      check_all_gather(c, m);
    }
  });
  const auto limits = c.exchange();
  c.set_exchange({limits.max_bytes, 8, limits.gather_block_bytes});
  check_all_gather(c, 1001);
  c.set_exchange(limits);
}

BOOST_AUTO_TEST_CASE(broadcast_from_the_last_rank) {
  auto c = make_comm();
  const int root = c.size() - 1;
  for (std::size_t n : {0u, 1u, 777u}) {
    std::vector<double> x(n, -1.0);
    if (c.rank() == root) {
      for (std::size_t i = 0; i < n; ++i) x[i] = 1.5 * static_cast<double>(i);
    }
    c.broadcast(std::span<double>(x), root).wait();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += x[i] != 1.5 * static_cast<double>(i);
    BOOST_TEST(wrong == 0u, "n = " << n);
  }
}

BOOST_AUTO_TEST_CASE(barrier_and_sequence_numbers) {
  auto c = make_comm();
  auto a = c.barrier();
  auto b = c.barrier();
  BOOST_TEST(a.sequence() == 0u);
  BOOST_TEST(b.sequence() == 1u);
  b.wait();
  BOOST_TEST(a.test());        // barriers complete in order
  hd::mpi_comm::request done;  // default: complete
  BOOST_TEST(done.test());
  done.wait();
}

BOOST_AUTO_TEST_CASE(a_request_destroyed_unwaited_completes_first) {
  auto c = make_comm();
  std::vector<float> x(10000, 1.0f);
  { auto r = c.all_reduce(std::span<float>(x), hd::reduce_op::sum); }  // destroyed: waits
  BOOST_TEST(x[9999] == static_cast<float>(c.size()));
}

BOOST_AUTO_TEST_CASE(arguments_are_checked_before_anything_starts) {
  auto c = make_comm();
  std::vector<float> a(5), b(2);
  BOOST_CHECK_THROW(
      (void)c.reduce_scatter(std::span<const float>(a), std::span<float>(b), hd::reduce_op::sum),
      hone::config_error);
  BOOST_CHECK_THROW((void)c.all_gather(std::span<const float>(a), std::span<float>(b)),
                    hone::config_error);
  BOOST_CHECK_THROW((void)c.broadcast(std::span<float>(a), c.size()), hone::config_error);
  std::vector<float> overlap(static_cast<std::size_t>(c.size()) * 2);
  BOOST_CHECK_THROW(
      (void)c.reduce_scatter(std::span<const float>(overlap),
                             std::span<float>(overlap.data() + 1, 2), hd::reduce_op::sum),
      hone::config_error);
  BOOST_CHECK_THROW(c.set_timeout(std::chrono::milliseconds(0)), hone::config_error);
  // Nothing was started: the next collective is #0 on every rank.
  auto r = c.barrier();
  BOOST_TEST(r.sequence() == 0u);
  r.wait();
}

// start_progress_thread needs MPI_THREAD_MULTIPLE; this program runs with MPI_THREAD_SERIALIZED
// (test_mpi_progress runs the thread).
BOOST_AUTO_TEST_CASE(a_progress_thread_needs_mpi_thread_multiple) {
  auto c = make_comm();
  std::string m;
  try {
    c.start_progress_thread();
  } catch (const hone::config_error& e) {
    m = e.what();
  }
  BOOST_TEST(m.find("start_progress_thread: MPI provides MPI_THREAD_SERIALIZED, but a progress "
                    "thread calls MPI beside the program's own calls") != std::string::npos,
             m);
  BOOST_TEST(m.find("thread_level::multiple") != std::string::npos, m);
  BOOST_TEST(!c.has_progress_thread());
}

BOOST_AUTO_TEST_CASE(environment_reports_the_thread_level) {
  // MPI is already initialized by the fixture: a second environment does not own it.
  hd::mpi_environment again(hd::thread_level::single);
  BOOST_TEST(!again.owns());
  BOOST_TEST(static_cast<int>(again.provided()) >= static_cast<int>(hd::thread_level::serialized));
}

namespace {
/// The library's control variable coll_libnbc_iallreduce_algorithm read and written through this
/// test's own MPI_T handle (nullopt where the MPI library has none).
struct nbc_algorithm_cvar {
  MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
  nbc_algorithm_cvar() {
    int provided = 0, index = -1, count = 0;
    if (MPI_T_init_thread(MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) return;
    if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) == MPI_SUCCESS)
      MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count);
  }
  ~nbc_algorithm_cvar() {
    if (handle != MPI_T_CVAR_HANDLE_NULL) MPI_T_cvar_handle_free(&handle);
    MPI_T_finalize();
  }
  nbc_algorithm_cvar(const nbc_algorithm_cvar&) = delete;
  nbc_algorithm_cvar& operator=(const nbc_algorithm_cvar&) = delete;
  [[nodiscard]] int read() const {
    int v = -1;
    MPI_T_cvar_read(handle, &v);
    return v;
  }
  void write(int v) const { MPI_T_cvar_write(handle, &v); }
};
}  // namespace

BOOST_AUTO_TEST_CASE(all_reduce_asks_open_mpi_for_its_ring_and_restores_the_setting) {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  const nbc_algorithm_cvar cvar;
  auto c = make_comm();
  if (std::string(version, static_cast<std::size_t>(len)).find("Open MPI") == std::string::npos ||
      cvar.handle == MPI_T_CVAR_HANDLE_NULL) {
    BOOST_TEST_MESSAGE("not Open MPI with coll/libnbc: all_reduce asks for nothing");
    BOOST_TEST(!c.asks_for_ring());
    return;
  }
  BOOST_TEST(c.asks_for_ring());
  // The ring (1) is set while the MPI_Iallreduce starts, and the program's own setting (here 2,
  // binomial) is back afterwards.
  cvar.write(2);
  hd::detail::iallreduce_ring ring;
  int during = -1;
  const int rc = ring.run([&] {
    during = cvar.read();
    return MPI_SUCCESS;
  });
  BOOST_TEST(rc == MPI_SUCCESS);
  BOOST_TEST(during == hd::detail::iallreduce_ring::ring);
  BOOST_TEST(cvar.read() == 2);
  check_sum<float>(c, 100003);  // through mpi_comm: still the right sums, setting restored
  BOOST_TEST(cvar.read() == 2);
  cvar.write(0);
}

namespace {
// Values whose sums round (so the order of the additions shows in the bits): a hash of the rank
// and the index, scaled by 1/3.
template <class T>
T inexact(int rank, std::size_t j) {
  const std::uint64_t h = (j * 2654435761u + static_cast<std::uint64_t>(rank) * 40503u) % 1000003u;
  return static_cast<T>(static_cast<double>(h) / 997.0) / T(3);
}

// Rank r's block of the ring's sum, in its documented order: in_{r+1} + in_{r+2} + ... + in_r
// (ranks mod n), each rank adding its own input to the partial sum it received.
template <class T>
std::vector<T> ring_order_oracle(int rank, int size, std::size_t m) {
  std::vector<T> out(m);
  const std::size_t base = static_cast<std::size_t>(rank) * m;
  for (std::size_t k = 0; k < m; ++k) {
    T acc = inexact<T>((rank + 1) % size, base + k);
    for (int step = 2; step <= size; ++step) acc = acc + inexact<T>((rank + step) % size, base + k);
    out[k] = acc;
  }
  return out;
}

template <class T>
void check_ring_reduce_scatter(hd::mpi_comm& c, std::size_t m) {
  const std::size_t total = m * static_cast<std::size_t>(c.size());
  std::vector<T> in(total);
  for (std::size_t j = 0; j < total; ++j) in[j] = inexact<T>(c.rank(), j);
  const std::vector<T> oracle = ring_order_oracle<T>(c.rank(), c.size(), m);
  std::vector<T> first;
  for (int run = 0; run < 3; ++run) {
    std::vector<T> out(m, T(-1));
    c.reduce_scatter(std::span<const T>(in), std::span<T>(out), hd::reduce_op::sum).wait();
    BOOST_TEST(std::memcmp(out.data(), oracle.data(), m * sizeof(T)) == 0,
               "m = " << m << ", run " << run << ": not the ring's order");
    if (run == 0) first = out;
    BOOST_TEST(std::memcmp(out.data(), first.data(), m * sizeof(T)) == 0,
               "m = " << m << ", run " << run << ": other bits than the first run");
  }
}
}  // namespace

// Runs f() with both of reduce_scatter's schedules (detail/p2p_reduce_scatter.hpp): direct (the
// default on 2 and 3 ranks) and the ring (forced by lowering p2p_direct_max_ranks).
template <class F>
void with_both_schedules(F&& f) {
  for (const int direct_max : {8, 1}) {
    BOOST_TEST_CONTEXT((direct_max == 1 ? "ring" : "direct")) {
      hd::detail::p2p_direct_max_ranks = direct_max;
      f();
    }
  }
  hd::detail::p2p_direct_max_ranks = 8;
}

// Float and double sums run hone's own transfers (detail/p2p_reduce_scatter.hpp), direct and ring:
// the bits of their documented summation order, the same in repeated runs, for 1 element per
// rank, sizes that split into uneven chunks (100003 floats: 3 chunks of 128 KiB or more; 262147:
// 8) and large counts (2^21 + 5 elements per rank: 16 uneven chunks).
BOOST_AUTO_TEST_CASE(reduce_scatter_sums_in_its_documented_order) {
  auto c = make_comm();
  with_both_schedules([&] {
    for (std::size_t m : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{1000},
                          std::size_t{100003}, std::size_t{262147}, (std::size_t{1} << 21) + 5}) {
      check_ring_reduce_scatter<float>(c, m);
      check_ring_reduce_scatter<double>(c, m);
    }
  });
}

// Several reduce-scatters in flight at once (their messages apart by tag), interleaved with
// libnbc collectives and waited in reverse order, with an integer reduce-scatter.
BOOST_AUTO_TEST_CASE(reduce_scatters_in_flight_together) {
  auto c = make_comm();
  with_both_schedules([&] {
    const auto n = static_cast<std::size_t>(c.size());
    const std::vector<std::size_t> sizes{5, 300001, 1, 70000};
    std::vector<std::vector<float>> ins, outs;
    for (std::size_t m : sizes) {
      ins.emplace_back(m * n);
      for (std::size_t j = 0; j < m * n; ++j) ins.back()[j] = inexact<float>(c.rank(), j);
      outs.emplace_back(m, -1.0f);
    }
    std::vector<std::int32_t> ints_in(3 * n), ints_out(3);
    for (std::size_t j = 0; j < ints_in.size(); ++j) {
      ints_in[j] = static_cast<std::int32_t>(j) + c.rank();
    }
    std::vector<float> all(1001, 1.0f);
    std::vector<hd::mpi_comm::request> reqs;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      reqs.push_back(c.reduce_scatter(std::span<const float>(ins[i]), std::span<float>(outs[i]),
                                      hd::reduce_op::sum));
      if (i == 1) reqs.push_back(c.all_reduce(std::span<float>(all), hd::reduce_op::sum));
    }
    reqs.push_back(c.reduce_scatter(std::span<const std::int32_t>(ints_in),
                                    std::span<std::int32_t>(ints_out), hd::reduce_op::sum));
    for (auto it = reqs.rbegin(); it != reqs.rend(); ++it) it->wait();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const auto oracle = ring_order_oracle<float>(c.rank(), c.size(), sizes[i]);
      BOOST_TEST(std::memcmp(outs[i].data(), oracle.data(), sizes[i] * sizeof(float)) == 0,
                 "m = " << sizes[i]);
    }
    BOOST_TEST(all[1000] == static_cast<float>(c.size()));
    const int tri = c.size() * (c.size() - 1) / 2;
    for (std::size_t k = 0; k < 3; ++k) {
      const auto j = static_cast<std::int32_t>(static_cast<std::size_t>(c.rank()) * 3 + k);
      BOOST_TEST(ints_out[k] == j * c.size() + tri);
    }
  });
}

// A reduce-scatter (direct and ring) that one rank joins late: the others' wait() times out naming
// that rank, the request stays pending, and it completes with the right bits once the rank arrives.
namespace {
/// The 16-bit floats' reduction as mpi_comm documents it: widened to float, added, rounded back.
template <class T>
T add16(T a, T b) {
  return T(static_cast<float>(a) + static_cast<float>(b));
}
template <class T>
T input16(int rank, std::size_t j) {
  return T(inexact<float>(rank, j) - 100.0f);
}
template <class T>
bool same16(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// reduce_scatter of 16-bit sums in the documented order (each add rounded to T), and max with
/// NaN and signed zeros, on bfloat16 or half; all_reduce of 16-bit sums in rank order.
template <class T>
void check_16_bit_and_max(hd::mpi_comm& c, std::size_t m) {
  const int n = c.size();
  const std::size_t total = m * static_cast<std::size_t>(n);
  std::vector<T> in(total), out(m, T(-1.0f)), oracle(m);
  for (std::size_t j = 0; j < total; ++j) in[j] = input16<T>(c.rank(), j);
  const std::size_t base = static_cast<std::size_t>(c.rank()) * m;
  for (std::size_t k = 0; k < m; ++k) {
    T acc = input16<T>((c.rank() + 1) % n, base + k);
    for (int step = 2; step <= n; ++step)
      acc = add16(acc, input16<T>((c.rank() + step) % n, base + k));
    oracle[k] = acc;
  }
  c.reduce_scatter(std::span<const T>(in), std::span<T>(out), hd::reduce_op::sum).wait();
  BOOST_TEST(same16(out, oracle), "16-bit sum, m = " << m);
  // max: the largest rank's value; NaN on the last rank at k % 5 == 1; +0 over -0 at k % 5 == 2.
  for (std::size_t j = 0; j < total; ++j) {
    in[j] = T(static_cast<float>((j + 7 * static_cast<std::size_t>(c.rank())) % 11));
    if (j % 5 == 1 && c.rank() == n - 1) in[j] = T(std::numeric_limits<float>::quiet_NaN());
    if (j % 5 == 2) in[j] = T(c.rank() == 0 ? 0.0f : -0.0f);
  }
  c.reduce_scatter(std::span<const T>(in), std::span<T>(out), hd::reduce_op::max).wait();
  std::size_t wrong = 0;
  for (std::size_t k = 0; k < m; ++k) {
    const float v = static_cast<float>(out[k]);
    const std::size_t j = base + k;
    if (j % 5 == 1) {
      wrong += !std::isnan(v);
    } else if (j % 5 == 2) {
      wrong += !(v == 0.0f && !std::signbit(v));
    } else {
      wrong += v != static_cast<float>(max_oracle(n, j));
    }
  }
  BOOST_TEST(wrong == 0u, "16-bit max, m = " << m);
  // all_reduce: rank order, each add rounded to T.
  std::vector<T> x(m), expect(m);
  for (std::size_t k = 0; k < m; ++k) {
    x[k] = input16<T>(c.rank(), k);
    T acc = input16<T>(0, k);
    for (int r = 1; r < n; ++r) acc = add16(acc, input16<T>(r, k));
    expect[k] = acc;
  }
  c.all_reduce(std::span<T>(x), hd::reduce_op::sum).wait();
  if (m * sizeof(T) <= c.exchange().max_bytes && n <= hd::detail::p2p_all_reduce::max_ranks) {
    BOOST_TEST(same16(x, expect), "16-bit all_reduce, m = " << m);
  } else {
    // MPI's collective (libnbc's ring): another order of the rounded adds, so within a few of T's
    // rounding steps (relative to the magnitudes added, since the sums cancel) of the rank-order
    // sums, and the same bits on every rank (rank 0's, spread by a max).
    std::size_t far = 0;
    for (std::size_t k = 0; k < m; ++k) {
      float magnitude = 0.0f;
      for (int r = 0; r < n; ++r) magnitude += std::fabs(static_cast<float>(input16<T>(r, k)));
      const float got = static_cast<float>(x[k]), want = static_cast<float>(expect[k]);
      far += !(std::fabs(got - want) <= 0.02f * magnitude);
    }
    BOOST_TEST(far == 0u, "16-bit all_reduce through MPI, m = " << m << ": " << far << " far off");
    std::vector<T> zero(m, T(-std::numeric_limits<float>::infinity()));
    if (c.rank() == 0) zero = x;
    c.all_reduce(std::span<T>(zero), hd::reduce_op::max).wait();  // rank 0's values everywhere
    BOOST_TEST(same16(x, zero),
               "16-bit all_reduce through MPI: bits differ from rank 0's, m = " << m);
  }
}
}  // namespace

// The 16-bit sums run through hone's vector loop (F16C on AVX2 and AVX-512 for half): the point-
// to-point collectives' reduction and the MPI operation of MPI's own collectives, on every target
// this CPU has. Each of the 65536 values plus each of 80 others (zeros, infinities, NaNs, the
// largest and smallest subnormals and normals, values whose sum rounds on a tie, random ones)
// gives the bits of the scalar T(float(a) + float(b)); NaN results only as NaN. Lengths 1 to 40
// put every element in a vector body and in a padded tail.
namespace {
template <class T>
std::size_t count_16_bit_sum_errors(std::uint32_t seed) {
  std::vector<std::uint16_t> others = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7d01, 0xfe12,
                                       0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400, 0x7bff, 0xfbff,
                                       0x3c00, 0xbc00, 0x3c01, 0x1400, 0x5bff, 0x6800, 0x7f80,
                                       0xff80, 0x7fc0, 0x7f81, 0x0080, 0x7f7f, 0x3f80, 0x3f81};
  std::uint32_t x = seed;
  while (others.size() < 80) {
    x = x * 1664525u + 1013904223u;
    others.push_back(static_cast<std::uint16_t>(x >> 16));
  }
  const std::size_t n = 65536;
  std::vector<T> all(n);
  for (std::size_t i = 0; i < n; ++i) all[i] = T::from_bits(static_cast<std::uint16_t>(i));
  const auto p2p = hd::detail::p2p_reduction<T>(hd::reduce_op::sum);
  const auto mpi_op =
      std::is_same_v<T, hone::half> ? &hd::detail::mpi_half_sum : &hd::detail::mpi_bf16_sum;
  std::size_t wrong = 0;
  const auto compare = [&](const std::vector<T>& got, const std::vector<T>& expect) {
    for (std::size_t i = 0; i < expect.size(); ++i) {
      wrong += is_nan(expect[i]) ? !is_nan(got[i]) : got[i].bits() != expect[i].bits();
    }
  };
  const auto check = [&](const std::vector<T>& a, const std::vector<T>& b) {
    std::vector<T> expect = a, by_p2p = a, by_mpi = a;
    hd::detail::p2p_float16_add<T>(expect.data(), b.data(), a.size());
    p2p(by_p2p.data(), b.data(), a.size());
    int count = static_cast<int>(a.size());
    MPI_Datatype type = MPI_UINT16_T;
    mpi_op(const_cast<T*>(b.data()), by_mpi.data(), &count, &type);
    compare(by_p2p, expect);
    compare(by_mpi, expect);
  };
  for (const std::uint16_t b : others) check(all, std::vector<T>(n, T::from_bits(b)));
  for (std::size_t len = 1; len <= 40; ++len) {
    check(std::vector<T>(all.begin() + 15000, all.begin() + 15000 + static_cast<long>(len)),
          std::vector<T>(all.begin() + 40000, all.begin() + 40000 + static_cast<long>(len)));
  }
  return wrong;
}
}  // namespace

BOOST_AUTO_TEST_CASE(sixteen_bit_sums_of_the_vector_loop_are_the_scalar_sums_on_every_target) {
  for (const auto t : {hone::isa::scalar, hone::isa::sse2, hone::isa::avx2, hone::isa::avx512}) {
    if (!hone::isa_supported(t)) continue;
    hone::scoped_isa forced(t);
    BOOST_TEST(count_16_bit_sum_errors<hone::half>(12345) == 0u, "half, " << hone::to_string(t));
    BOOST_TEST(count_16_bit_sum_errors<hone::bfloat16>(777) == 0u,
               "bfloat16, " << hone::to_string(t));
  }
}

// reduce_scatter's own transfers take every element type and both reductions: the 16-bit floats'
// sums in the documented order with each add rounded (bfloat16's 8 bits round at every add), their
// max and float's with the NaN and signed-zero rule, int32 sums; both schedules; and the 16-bit
// all_reduce in rank order through the exchange.
BOOST_AUTO_TEST_CASE(reduce_scatter_16_bit_max_and_integers_in_the_documented_order) {
  auto c = make_comm();
  with_both_schedules([&] {
    for (std::size_t m : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{70001}}) {
      check_16_bit_and_max<hone::bfloat16>(c, m);
      check_16_bit_and_max<hone::half>(c, m);
    }
    const auto n = static_cast<std::size_t>(c.size());
    std::vector<float> f(5 * n), fo(5);
    for (std::size_t j = 0; j < f.size(); ++j) f[j] = -static_cast<float>(j) - 1.0f;
    if (c.rank() == 0)
      f[static_cast<std::size_t>(c.size() - 1) * 5 + 3] = NAN;  // last rank's block
    f[2] = c.rank() == 0 ? -0.0f : 0.0f;
    c.reduce_scatter(std::span<const float>(f), std::span<float>(fo), hd::reduce_op::max).wait();
    if (c.rank() == c.size() - 1) BOOST_TEST(std::isnan(fo[3]));
    if (c.rank() == 0) BOOST_TEST((fo[2] == 0.0f && !std::signbit(fo[2])));
    std::vector<std::int32_t> ints(4 * n), io(4);
    for (std::size_t j = 0; j < ints.size(); ++j) {
      ints[j] = static_cast<std::int32_t>(j) * (c.rank() + 1) - 1000;
    }
    c.reduce_scatter(std::span<const std::int32_t>(ints), std::span<std::int32_t>(io),
                     hd::reduce_op::sum)
        .wait();
    const int tri = c.size() * (c.size() + 1) / 2;
    for (std::size_t k = 0; k < 4; ++k) {
      const auto j = static_cast<std::int32_t>(static_cast<std::size_t>(c.rank()) * 4 + k);
      BOOST_TEST(io[k] == j * tri - 1000 * c.size());
    }
  });
}

// all_reduce's own exchange (detail/p2p_all_reduce.hpp) sums in rank order on every rank:
// element i is ((v_0 + v_1) + v_2) ..., the same bits on every rank and in every run, with two in
// flight at once.
template <class T>
void check_rank_order_all_reduce(hd::mpi_comm& c, std::size_t n) {
  std::vector<T> oracle(n);
  for (std::size_t j = 0; j < n; ++j) {
    T acc = inexact<T>(0, j);
    for (int r = 1; r < c.size(); ++r) acc = acc + inexact<T>(r, j);
    oracle[j] = acc;
  }
  for (int run = 0; run < 3; ++run) {
    std::vector<T> x(n), y(n);
    for (std::size_t j = 0; j < n; ++j) x[j] = y[j] = inexact<T>(c.rank(), j);
    auto rx = c.all_reduce(std::span<T>(x), hd::reduce_op::sum);
    auto ry = c.all_reduce(std::span<T>(y), hd::reduce_op::sum);  // two in flight
    ry.wait();
    rx.wait();
    BOOST_TEST(std::memcmp(x.data(), oracle.data(), n * sizeof(T)) == 0,
               "n = " << n << ", run " << run << ": not the rank order");
    BOOST_TEST(std::memcmp(y.data(), oracle.data(), n * sizeof(T)) == 0, "n = " << n);
  }
}

// Sizes from the exchange's message size (1008 floats of 4032 bytes under Open MPI's default
// eager limit): one message, two, several (doubles), the largest buffer the exchange takes (48 KiB:
// 12288 floats), and, with the message size lowered to 8 bytes, more pieces than the 16 messages
// per peer allowed (the pieces then grow instead). CTest runs this case again under an 8 KiB eager
// limit (OMPI_MCA_btl_vader_eager_limit), where a message holds 2032 floats.
BOOST_AUTO_TEST_CASE(small_all_reduce_sums_in_rank_order) {
  auto c = make_comm();
  if (c.size() > hd::detail::p2p_all_reduce::max_ranks) {
    BOOST_TEST_MESSAGE("more than " << hd::detail::p2p_all_reduce::max_ranks
                                    << " ranks: all_reduce does not run the exchange");
    return;
  }
  const auto limits = c.exchange();
  BOOST_TEST(limits.max_bytes == std::size_t{48} << 10);
  const std::size_t per = limits.message_bytes / sizeof(float);
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, per, per + 1, limits.max_bytes / 4}) {
    check_rank_order_all_reduce<float>(c, n);
  }
  for (std::size_t n : {std::size_t{1}, std::size_t{2048}, std::size_t{6000}}) {
    check_rank_order_all_reduce<double>(c, n);
  }
  c.set_exchange({limits.max_bytes, 8, limits.gather_block_bytes});
  check_rank_order_all_reduce<float>(c, 1000);
  check_rank_order_all_reduce<double>(c, 5);
  c.set_exchange(limits);
  BOOST_CHECK_THROW(c.set_exchange({1024, 0, 1024}), hone::config_error);
  c.set_exchange({0, 0, 0});  // off: MPI_Iallreduce, whatever the message size
  check_sum<float>(c, 1000);
}

// The exchange's sizes follow the transports' eager limit, read through MPI_T: messages of the
// limit less 64 bytes (the header takes 49-56 bytes in Open MPI 4.1's shared-memory transport),
// buffers up to min(48 KiB, 12 x limit); unknown (0) keeps 4032 bytes and 48 KiB.
BOOST_AUTO_TEST_CASE(exchange_follows_the_eager_limit) {
  using limits = hd::mpi_comm::exchange_limits;
  static_assert(hd::detail::exchange_for_eager_limit(0) == limits{49152, 4032, 8192});
  static_assert(hd::detail::exchange_for_eager_limit(4096) == limits{49152, 4032, 8192});
  static_assert(hd::detail::exchange_for_eager_limit(8192) == limits{49152, 8128, 16384});
  static_assert(hd::detail::exchange_for_eager_limit(2048) == limits{24576, 1984, 4096});
  static_assert(hd::detail::exchange_for_eager_limit(1) == limits{3072, 192, 512});
  auto c = make_comm();
  BOOST_TEST((c.exchange() == hd::detail::exchange_for_eager_limit(c.eager_limit())));
#ifdef OPEN_MPI
  // Open MPI 4 and 5 have the shared-memory transport's variable: the limit is known, and is the
  // one the run was given (CTest's second registration sets 8192) when set.
  BOOST_TEST(c.eager_limit() > 0u);
  if (const char* set = std::getenv("OMPI_MCA_btl_vader_eager_limit")) {
    BOOST_TEST(c.eager_limit() == std::strtoull(set, nullptr, 10));
  }
#endif
}

BOOST_AUTO_TEST_CASE(reduce_scatter_times_out_naming_the_late_rank_then_completes) {
  with_both_schedules([] {
    hd::mpi_comm c(MPI_COMM_WORLD, std::chrono::milliseconds(300));
    const int late = c.size() - 1;
    const std::size_t m = 50000;
    std::vector<float> in(m * static_cast<std::size_t>(c.size()));
    for (std::size_t j = 0; j < in.size(); ++j) in[j] = inexact<float>(c.rank(), j);
    std::vector<float> out(m, -1.0f);
    if (c.rank() == late) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    auto r =
        c.reduce_scatter(std::span<const float>(in), std::span<float>(out), hd::reduce_op::sum);
    if (c.rank() != late) {
      std::string message;
      try {
        r.wait();
      } catch (const hone::dist_error& e) {
        message = e.what();
      }
      BOOST_TEST(message.find("reduce_scatter #0 (sum of " + std::to_string(in.size()) +
                              " float) did not complete within 300 ms") != std::string::npos,
                 message);
      BOOST_TEST(
          message.find("rank " + std::to_string(late) + " has not started it") != std::string::npos,
          message);
      BOOST_TEST(message.find("The request is still pending") != std::string::npos, message);
      c.set_timeout(std::chrono::seconds(20));
    } else {
      c.set_timeout(std::chrono::seconds(20));
    }
    r.wait();
    const auto oracle = ring_order_oracle<float>(c.rank(), c.size(), m);
    BOOST_TEST(std::memcmp(out.data(), oracle.data(), m * sizeof(float)) == 0);
  });
}
