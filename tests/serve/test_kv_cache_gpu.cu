// GPU test (label gpu): the paged KV cache with its blocks in CUDA memory
// (hone/serve/cuda/kv_cache.cuh). The randomized driver of the host test (kv_random_driver.hpp:
// the same reference model, the same checks after every operation and in the sweeps) on
// device_kv_cache<float, bfloat16, half>, with the data going through every CUDA path in turn
// (appends from host floats, from device float, from a device 16-bit type, from device T; reads to
// host, to device float, to device T), all on one non-blocking stream; then unit cases: device
// appends convert exactly as the host cache does (every source type, runs crossing blocks),
// copy-on-write leaves the parent unchanged, out-of-blocks changes neither the bookkeeping nor the
// data, the uploaded block tables equal block_table(), the reference decode attention against a
// double-precision oracle on the host, and the error sentences. Exits 77 (skipped) without a CUDA
// device. HONE_KV_RANDOM_OPS overrides the operations of each randomized run (default 20000).
#define BOOST_TEST_MODULE hone_serve_kv_cache_gpu
#include <boost/test/unit_test.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <hone/core/cuda/error.hpp>
#include <hone/serve.hpp>
#include <hone/serve/cuda/kv_cache.cuh>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "../support/gpu.hpp"
#include "kv_random_driver.hpp"

namespace {

struct gpu_fixture {
  gpu_fixture() { hone::test::skip_without_gpu(); }
};

template <class T>
using dbuf = hone::buffer<T, hone::cuda_space>;

template <class T>
hone::device_span<const T> cspan(const dbuf<T>& b, std::size_t n) {
  return {b.data(), n};
}
template <class T>
hone::device_span<T> mspan(dbuf<T>& b, std::size_t n) {
  return {b.data(), n};
}

template <class T>
std::vector<T> to_type(std::span<const float> x) {
  std::vector<T> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = hs::detail::kv_from_float<T>(x[i]);
  return r;
}
template <class T>
std::vector<float> to_float(const std::vector<T>& x) {
  std::vector<float> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = hs::detail::kv_to_float(x[i]);
  return r;
}
/// Copies `h` to `d` after the work queued on `stream`, and waits (h may be a temporary).
template <class T>
void upload(dbuf<T>& d, const std::vector<T>& h, cudaStream_t stream) {
  BOOST_TEST_REQUIRE(h.size() <= d.size());
  if (h.empty()) return;  // an append of nothing (the whole prompt was cached)
  HONE_CUDA_CHECK(
      cudaMemcpyAsync(d.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
}
template <class T>
std::vector<T> download(const dbuf<T>& d, std::size_t n) {
  std::vector<T> h(n);
  HONE_CUDA_CHECK(cudaMemcpy(h.data(), d.data(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

/// A 16-bit source type other than T (every value the tests append is exact in both).
template <class T>
using other_t = std::conditional_t<std::is_same_v<T, hone::half>, hone::bfloat16, hone::half>;

/// The randomized driver's data path on the device: appends and reads cycle through every form,
/// on one non-blocking stream (a read to the host waits for it).
template <class T>
struct gpu_io {
  using space = hone::cuda_space;
  static constexpr std::size_t max_values = 64 * kv_random::te;  // a prompt is at most 27 tokens
  cudaStream_t stream{};
  dbuf<float> fk{max_values}, fv{max_values};
  dbuf<T> tk{max_values}, tv{max_values};
  dbuf<other_t<T>> ok{max_values}, ov{max_values};
  std::size_t appends = 0, reads = 0;

  gpu_io() { HONE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~gpu_io() {
    (void)cudaStreamSynchronize(stream);
    (void)cudaStreamDestroy(stream);
  }
  gpu_io(const gpu_io&) = delete;
  gpu_io& operator=(const gpu_io&) = delete;

  void append(hs::device_kv_cache<T>& c, hs::kv_seq_id id, std::span<const hs::kv_token> toks,
              std::span<const float> k, std::span<const float> v) {
    const std::size_t n = k.size();
    BOOST_TEST_REQUIRE(n <= max_values);
    switch (appends++ % 4) {
      case 0:
        hs::append_from_host(c, id, toks, k, v, stream);
        break;
      case 1:
        upload(fk, std::vector<float>(k.begin(), k.end()), stream);
        upload(fv, std::vector<float>(v.begin(), v.end()), stream);
        hs::append(c, id, toks, cspan(fk, n), cspan(fv, n), stream);
        break;
      case 2:
        upload(tk, to_type<T>(k), stream);
        upload(tv, to_type<T>(v), stream);
        hs::append(c, id, toks, cspan(tk, n), cspan(tv, n), stream);
        break;
      default:
        upload(ok, to_type<other_t<T>>(k), stream);
        upload(ov, to_type<other_t<T>>(v), stream);
        hs::append(c, id, toks, mspan(ok, n), mspan(ov, n), stream);  // non-const source span
        break;
    }
  }

  void read(const hs::device_kv_cache<T>& c, hs::kv_seq_id id, std::size_t p, std::span<float> k,
            std::span<float> v) {
    const std::size_t n = k.size();
    switch (reads++ % 3) {
      case 0:
        hs::read_to_host(c, id, p, 1, k, v, stream);
        return;
      case 1: {
        HONE_CUDA_CHECK(cudaMemsetAsync(fk.data(), 0xff, n * sizeof(float), stream));  // NaN
        HONE_CUDA_CHECK(cudaMemsetAsync(fv.data(), 0xff, n * sizeof(float), stream));
        hs::read(c, id, p, 1, mspan(fk, n), mspan(fv, n), stream);
        HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
        const auto hk = download(fk, n), hv = download(fv, n);
        std::copy(hk.begin(), hk.end(), k.begin());
        std::copy(hv.begin(), hv.end(), v.begin());
        return;
      }
      default: {
        HONE_CUDA_CHECK(cudaMemsetAsync(tk.data(), 0xff, n * sizeof(T), stream));  // NaN
        HONE_CUDA_CHECK(cudaMemsetAsync(tv.data(), 0xff, n * sizeof(T), stream));
        hs::read(c, id, p, 1, mspan(tk, n), mspan(tv, n), stream);
        HONE_CUDA_CHECK(cudaStreamSynchronize(stream));
        const auto hk = to_float(download(tk, n)), hv = to_float(download(tv, n));
        std::copy(hk.begin(), hk.end(), k.begin());
        std::copy(hv.begin(), hv.end(), v.begin());
        return;
      }
    }
  }
};

std::size_t gpu_ops() {
  if (const char* e = std::getenv("HONE_KV_RANDOM_OPS")) {
    const long long n = std::atoll(e);
    if (n > 0) return static_cast<std::size_t>(n);
  }
  return 20000;
}

template <class T>
void random_run(unsigned hash_bits, std::uint64_t seed, std::size_t ops) {
  kv_random::driver<T, gpu_io<T>> d(hash_bits, seed);
  d.run(ops);
  BOOST_TEST(d.io.appends > 0u);
  HONE_CUDA_CHECK(cudaStreamSynchronize(d.io.stream));
  HONE_CUDA_CHECK(cudaGetLastError());
}

// -- the unit cases: a shape with odd extents, values that round in 16 bits --

constexpr hs::kv_block_shape shape{.block_tokens = 4, .heads = 3, .head_dim = 5};
constexpr std::size_t te = 15;

std::vector<float> random_values(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (float& e : x) e = dist(g);
  return x;
}

/// What the host cache stores for `x` written as S, then converted to T (float through float).
template <class T, class S>
std::vector<float> expected(std::span<const float> x) {
  std::vector<float> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float s = hs::detail::kv_to_float(hs::detail::kv_from_float<S>(x[i]));
    r[i] = hs::detail::kv_to_float(hs::detail::kv_from_float<T>(s));
  }
  return r;
}

/// The K and V of tokens [0, n) of `seq`, read back to the host.
template <class T>
std::pair<std::vector<float>, std::vector<float>> read_all(const hs::device_kv_cache<T>& c,
                                                           hs::kv_seq_id seq) {
  const std::size_t n = c.length(seq);
  std::vector<float> k(n * te, -1.0f), v(n * te, -1.0f);
  hs::read_to_host(c, seq, 0, n, k, v);
  return {k, v};
}

std::size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::min(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(a[i] == b[i])) return i;
  }
  return a.size();
}

#define CHECK_SAME(got, want, what)                                                             \
  do {                                                                                          \
    const auto& g_ = (got);                                                                     \
    const auto& w_ = (want);                                                                    \
    const std::size_t i_ = first_difference(g_, w_);                                            \
    BOOST_TEST(i_ == w_.size(), what << ": " << g_.size() << " values against " << w_.size()    \
                                     << "; first difference at " << i_ << " (token " << i_ / te \
                                     << ", element " << i_ % te << "): got "                    \
                                     << (i_ < g_.size() ? g_[i_] : -999.0f) << ", want "        \
                                     << (i_ < w_.size() ? w_[i_] : -999.0f));                   \
  } while (0)

std::vector<hs::kv_token> iota_tokens(std::size_t n, hs::kv_token first) {
  std::vector<hs::kv_token> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = first + static_cast<hs::kv_token>(i);
  return t;
}

template <class T, class S>
void device_appends_convert(std::uint64_t seed) {
  BOOST_TEST_CONTEXT("cache " << typeid(T).name() << ", source " << typeid(S).name()) {
    hs::device_kv_cache<T> c(shape, 16);
    const auto s = c.add_sequence().seq;
    // 11 tokens at once (runs of 4, 4, 3), then 1 (fills the block), then 6 (a new block, and one
    // more), each from device memory of type S.
    std::vector<float> all_k, all_v;
    std::size_t pos = 0;
    for (const std::size_t n : {std::size_t{11}, std::size_t{1}, std::size_t{6}}) {
      const auto k = random_values(n * te, seed++, 3.0f), v = random_values(n * te, seed++, 0.5f);
      const auto ks = to_type<S>(k), vs = to_type<S>(v);
      dbuf<S> dk(ks.size()), dv(vs.size());
      upload(dk, ks, nullptr);
      upload(dv, vs, nullptr);
      hs::append(c, s, iota_tokens(n, hs::kv_token(pos)), cspan(dk, ks.size()),
                 cspan(dv, vs.size()));
      pos += n;
      const auto ek = expected<T, S>(k), ev = expected<T, S>(v);
      all_k.insert(all_k.end(), ek.begin(), ek.end());
      all_v.insert(all_v.end(), ev.begin(), ev.end());
    }
    BOOST_TEST(c.length(s) == 18u);
    BOOST_TEST(c.used_blocks() == 5u);
    const auto [k, v] = read_all(c, s);
    CHECK_SAME(k, all_k, "K read to the host");
    CHECK_SAME(v, all_v, "V read to the host");
    // A range starting inside a block, read to device float.
    dbuf<float> dk(7 * te), dv(7 * te);
    hs::read(c, s, 3, 7, mspan(dk, 7 * te), mspan(dv, 7 * te));
    CHECK_SAME(download(dk, 7 * te),
               std::vector<float>(all_k.begin() + 3 * te, all_k.begin() + 10 * te),
               "K [3, 10) read to device float");
    CHECK_SAME(download(dv, 7 * te),
               std::vector<float>(all_v.begin() + 3 * te, all_v.begin() + 10 * te),
               "V [3, 10) read to device float");
    // The host cache given the same values (as floats of S) stores the same.
    hs::kv_cache<T> h(shape, 16);
    const auto hseq = h.add_sequence().seq;
    std::vector<float> sk(all_k.size()), sv(all_v.size());
    h.append(hseq, iota_tokens(18, 0), all_k, all_v);
    for (std::size_t p = 0; p < 18; ++p) {
      h.read(hseq, p, std::span<float>(sk).subspan(p * te, te),
             std::span<float>(sv).subspan(p * te, te));
    }
    CHECK_SAME(k, sk, "K against the host cache");
  }
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(gpu_fixture);

BOOST_AUTO_TEST_CASE(random_operations_against_the_reference_float) {
  random_run<float>(128, 1, gpu_ops());
}

BOOST_AUTO_TEST_CASE(random_operations_against_the_reference_bfloat16_and_half) {
  random_run<hone::bfloat16>(128, 3, gpu_ops());
  random_run<hone::half>(128, 4, gpu_ops());
}

BOOST_AUTO_TEST_CASE(random_operations_with_constant_hash_collisions) {
  random_run<float>(2, 2, gpu_ops() / 4 + 1000);
}

BOOST_AUTO_TEST_CASE(device_appends_convert_as_the_host_does) {
  device_appends_convert<float, float>(10);
  device_appends_convert<float, hone::bfloat16>(20);
  device_appends_convert<float, hone::half>(30);
  device_appends_convert<hone::bfloat16, float>(40);
  device_appends_convert<hone::bfloat16, hone::bfloat16>(50);
  device_appends_convert<hone::bfloat16, hone::half>(60);
  device_appends_convert<hone::half, float>(70);
  device_appends_convert<hone::half, hone::bfloat16>(80);
  device_appends_convert<hone::half, hone::half>(90);
}

BOOST_AUTO_TEST_CASE(bfloat16_rounds_to_nearest_even_on_the_device) {
  hs::device_kv_cache<hone::bfloat16> c({1, 1, 4}, 1);
  const auto s = c.add_sequence().seq;
  // 1 + 2^-8 ties to even (1), 1 + 3 * 2^-8 ties to even upwards (1 + 2^-6), 0.1 rounds up.
  const std::vector<float> k{1.00390625f, 1.01171875f, 0.1f, -3.0f};
  dbuf<float> dk(4);
  upload(dk, k, nullptr);
  hs::append(c, s, std::vector<hs::kv_token>{7}, cspan(dk, 4), cspan(dk, 4));
  const auto [rk, rv] = [&] {
    std::vector<float> a(4), b(4);
    hs::read_to_host(c, s, 0, 1, a, b);
    return std::pair{a, b};
  }();
  BOOST_TEST(rk[0] == 1.0f);
  BOOST_TEST(rk[1] == 1.015625f);
  BOOST_TEST(rk[2] == 0.10009765625f);  // 0x3DCCCCCD rounds up to 0x3DCD
  BOOST_TEST(rk[3] == -3.0f);
  BOOST_TEST(rv == rk);
}

BOOST_AUTO_TEST_CASE(copy_on_write_leaves_the_parent_unchanged) {
  hs::device_kv_cache<float> c(shape, 8);
  const auto a = c.add_sequence().seq;
  const auto k = random_values(6 * te, 101), v = random_values(6 * te, 102);
  dbuf<float> dk(6 * te), dv(6 * te);
  upload(dk, k, nullptr);
  upload(dv, v, nullptr);
  hs::append(c, a, iota_tokens(6, 0), cspan(dk, 6 * te), cspan(dv, 6 * te));  // 4 + 2
  const auto b = c.fork(a);
  const std::vector<hs::kv_block_id> parent_table(c.block_table(a).begin(), c.block_table(a).end());
  BOOST_TEST(c.references(parent_table[1]) == 2u);
  // The fork writes one token into the shared partial block: it gets a copy.
  const auto k2 = random_values(te, 103), v2 = random_values(te, 104);
  dbuf<float> dk2(te), dv2(te);
  upload(dk2, k2, nullptr);
  upload(dv2, v2, nullptr);
  hs::append(c, b, std::vector<hs::kv_token>{99}, cspan(dk2, te), cspan(dv2, te));
  BOOST_TEST(c.stats().cow_copies == 1u);
  BOOST_TEST(c.block_table(b)[0] == parent_table[0]);  // the full block stays shared
  BOOST_TEST(c.block_table(b)[1] != parent_table[1]);
  BOOST_TEST((std::vector<hs::kv_block_id>(c.block_table(a).begin(), c.block_table(a).end()) ==
              parent_table));
  BOOST_TEST(c.references(parent_table[1]) == 1u);
  const auto [ak, av] = read_all(c, a);
  CHECK_SAME(ak, k, "the parent's K after the fork's write");
  CHECK_SAME(av, v, "the parent's V after the fork's write");
  auto bk_want = k, bv_want = v;
  bk_want.insert(bk_want.end(), k2.begin(), k2.end());
  bv_want.insert(bv_want.end(), v2.begin(), v2.end());
  const auto [bk, bv] = read_all(c, b);
  CHECK_SAME(bk, bk_want, "the fork's K (copied tokens, then its own)");
  CHECK_SAME(bv, bv_want, "the fork's V (copied tokens, then its own)");
  // The parent now holds its partial block alone: its next write goes in place, and leaves the
  // fork's copy alone.
  const auto k3 = random_values(te, 105), v3 = random_values(te, 106);
  hs::append_from_host(c, a, std::vector<hs::kv_token>{98}, k3, v3);
  BOOST_TEST(c.stats().cow_copies == 1u);
  BOOST_TEST(c.block_table(a)[1] == parent_table[1]);
  const auto [bk2, bv2] = read_all(c, b);
  CHECK_SAME(bk2, bk_want, "the fork's K after the parent's write");
  auto ak_want = k;
  ak_want.insert(ak_want.end(), k3.begin(), k3.end());
  CHECK_SAME(read_all(c, a).first, ak_want, "the parent's K after its own write");
  c.validate();
}

BOOST_AUTO_TEST_CASE(out_of_blocks_changes_neither_bookkeeping_nor_data) {
  hs::device_kv_cache<hone::half> c(shape, 3);
  const auto a = c.add_sequence().seq;
  const auto k = random_values(10 * te, 201), v = random_values(10 * te, 202);
  hs::append_from_host(c, a, iota_tokens(10, 0), k, v);  // 3 blocks, the last with 2 tokens
  const auto b = c.fork(a);
  const auto before_a = read_all(c, a);
  const std::vector<hs::kv_block_id> table(c.block_table(a).begin(), c.block_table(a).end());
  const auto k1 = random_values(3 * te, 203), v1 = random_values(3 * te, 204);
  dbuf<float> dk(3 * te), dv(3 * te);
  upload(dk, k1, nullptr);
  upload(dv, v1, nullptr);
  // The fork's write needs a copy of the shared partial block: no block is free.
  try {
    hs::append(c, b, iota_tokens(1, 50), cspan(dk, te), cspan(dv, te));
    BOOST_ERROR("append needing a copy with no free block did not throw");
  } catch (const hs::out_of_blocks_error& e) {
    BOOST_TEST(e.needed() == 1u);
    BOOST_TEST(e.available() == 0u);
  }
  // Three tokens into the parent's partial block, shared with the fork: a copy and one more block.
  BOOST_CHECK_THROW(hs::append(c, a, iota_tokens(3, 60), cspan(dk, 3 * te), cspan(dv, 3 * te)),
                    hs::out_of_blocks_error);
  BOOST_CHECK_THROW(hs::append_from_host(c, a, iota_tokens(3, 60), k1, v1),
                    hs::out_of_blocks_error);
  BOOST_TEST(c.stats().refused == 3u);
  BOOST_TEST(c.stats().cow_copies == 0u);
  BOOST_TEST(c.length(a) == 10u);
  BOOST_TEST(c.length(b) == 10u);
  BOOST_TEST(c.free_blocks() == 0u);
  BOOST_TEST(
      (std::vector<hs::kv_block_id>(c.block_table(b).begin(), c.block_table(b).end()) == table));
  c.validate();
  const auto after_a = read_all(c, a);
  CHECK_SAME(after_a.first, before_a.first, "K after the refusals");
  CHECK_SAME(after_a.second, before_a.second, "V after the refusals");
  // Preempting the parent lets the fork go on, in place.
  c.free_sequence(a);
  hs::append(c, b, iota_tokens(1, 50), cspan(dk, te), cspan(dv, te));
  BOOST_TEST(c.stats().cow_copies == 0u);
  auto want_k = before_a.first;
  const auto k1h = expected<hone::half, float>(std::span<const float>(k1).subspan(0, te));
  want_k.insert(want_k.end(), k1h.begin(), k1h.end());
  CHECK_SAME(read_all(c, b).first, want_k, "the fork's K after preempting the parent");
  c.validate();
}

namespace {
template <class T>
void attention_case() {
  constexpr hs::kv_block_shape sh{.block_tokens = 8, .heads = 2, .head_dim = 16};
  constexpr std::size_t e = 32;
  hs::device_kv_cache<T> c(sh, 64);
  std::vector<hs::kv_seq_id> seqs;
  std::uint64_t seed = 300;
  // Lengths 100 (its 12 full blocks registered), 1, 8 (one full block), 37, a fork of the 37 that
  // grows by 5 (a copy on write), a sequence reusing the 100's first 6 blocks through the prefix
  // table, and an empty one.
  const std::vector<hs::kv_token> prompt = iota_tokens(100, 1000);
  for (const std::size_t n : {std::size_t{100}, std::size_t{1}, std::size_t{8}, std::size_t{37}}) {
    const auto s = c.add_sequence().seq;
    const auto k = random_values(n * e, seed++), v = random_values(n * e, seed++);
    hs::append_from_host(c, s, std::span<const hs::kv_token>(prompt).subspan(0, n), k, v);
    seqs.push_back(s);
  }
  const auto f = c.fork(seqs[3]);
  const auto fk = random_values(5 * e, seed++), fv = random_values(5 * e, seed++);
  hs::append_from_host(c, f, iota_tokens(5, 7), fk, fv);
  seqs.push_back(f);
  const auto m = c.add_sequence(std::span<const hs::kv_token>(prompt).subspan(0, 50));
  BOOST_TEST(m.cached_tokens == 48u);
  const auto mk = random_values(3 * e, seed++), mv = random_values(3 * e, seed++);
  hs::append_from_host(c, m.seq, iota_tokens(3, 5000), mk, mv);
  seqs.push_back(m.seq);
  seqs.push_back(c.add_sequence().seq);
  BOOST_TEST(c.stats().cow_copies == 1u);

  hs::kv_block_tables tables;
  const auto view = tables.upload(c, seqs, nullptr);
  BOOST_TEST(view.sequences == seqs.size());
  BOOST_TEST(view.max_blocks == 13u);
  BOOST_TEST(view.max_length == 100u);
  std::vector<std::int32_t> t(seqs.size() * view.max_blocks), len(seqs.size());
  HONE_CUDA_CHECK(cudaMemcpy(t.data(), view.block_tables, t.size() * 4, cudaMemcpyDeviceToHost));
  HONE_CUDA_CHECK(cudaMemcpy(len.data(), view.lengths, len.size() * 4, cudaMemcpyDeviceToHost));
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const auto bt = c.block_table(seqs[i]);
    BOOST_TEST(len[i] == std::int32_t(c.length(seqs[i])));
    for (std::size_t j = 0; j < view.max_blocks; ++j) {
      const std::int32_t want = j < bt.size() ? std::int32_t(bt[j]) : -1;
      BOOST_TEST(t[i * view.max_blocks + j] == want, "sequence " << i << " block " << j);
    }
  }

  const std::size_t n = seqs.size() * e;
  const auto q = random_values(n, 399);
  dbuf<float> dq(n), dout(n);
  upload(dq, q, nullptr);
  HONE_CUDA_CHECK(cudaMemset(dout.data(), 0xff, n * sizeof(float)));
  const float scale = 0.25f;  // 1 / sqrt(head_dim)
  hs::decode_attention(view, cspan(dq, n), mspan(dout, n), scale, nullptr);
  HONE_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out = download(dout, n);
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const std::size_t L = c.length(seqs[i]);
    std::vector<float> k(L * e), v(L * e);
    if (L > 0) hs::read_to_host(c, seqs[i], 0, L, k, v);
    for (std::size_t h = 0; h < sh.heads; ++h) {
      std::vector<double> s(L), o(sh.head_dim, 0.0);
      double mx = -INFINITY, sum = 0.0;
      for (std::size_t p = 0; p < L; ++p) {
        double dot = 0.0;
        for (std::size_t j = 0; j < sh.head_dim; ++j) {
          dot += double(q[i * e + h * sh.head_dim + j]) * double(k[p * e + h * sh.head_dim + j]);
        }
        s[p] = dot * scale;
        mx = std::max(mx, s[p]);
      }
      for (std::size_t p = 0; p < L; ++p) sum += (s[p] = std::exp(s[p] - mx));
      for (std::size_t p = 0; p < L; ++p) {
        for (std::size_t j = 0; j < sh.head_dim; ++j) {
          o[j] += s[p] / sum * double(v[p * e + h * sh.head_dim + j]);
        }
      }
      for (std::size_t j = 0; j < sh.head_dim; ++j) {
        const float got = out[i * e + h * sh.head_dim + j];
        BOOST_TEST(std::fabs(double(got) - o[j]) <= 2e-5 * (1.0 + std::fabs(o[j])),
                   typeid(T).name() << " sequence " << i << " (" << L << " tokens) head " << h
                                    << " dim " << j << ": got " << got << ", oracle " << o[j]);
      }
    }
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(block_tables_and_decode_attention_against_a_double_oracle) {
  attention_case<hone::bfloat16>();
  attention_case<float>();
  attention_case<std::int8_t>();  // dequantized through the view's scales
}

namespace {
/// int8 on the device against the host cache given the same values (as floats of S): the same
/// bytes, the same scales, the same reads; every read within the final scale of what was written.
template <class S>
void int8_matches_host(bool from_host, std::uint64_t seed) {
  BOOST_TEST_CONTEXT("source " << (from_host ? "host float" : typeid(S).name())) {
    hs::device_kv_cache<std::int8_t> c(shape, 24);
    hs::kv_cache<std::int8_t> h(shape, 24);
    std::vector<std::vector<float>> written_k(2), written_v(2);  // per sequence, as floats of S
    const auto a = c.add_sequence().seq;
    BOOST_TEST_REQUIRE(h.add_sequence().seq == a);
    auto append = [&](hs::kv_seq_id seq, std::size_t n, float magnitude) {
      auto k = random_values(n * te, seed++, magnitude),
           v = random_values(n * te, seed++, magnitude / 3);
      const auto toks = iota_tokens(n, hs::kv_token(seed));
      if (from_host) {
        hs::append_from_host(c, seq, toks, k, v);
      } else {
        const auto ks = to_type<S>(k), vs = to_type<S>(v);
        dbuf<S> dk(ks.size()), dv(vs.size());
        upload(dk, ks, nullptr);
        upload(dv, vs, nullptr);
        hs::append(c, seq, toks, cspan(dk, ks.size()), cspan(dv, vs.size()));
        k = to_float(ks);
        v = to_float(vs);
      }
      h.append(seq, toks, k, v);
      auto& wk = written_k[seq - a];
      auto& wv = written_v[seq - a];
      wk.insert(wk.end(), k.begin(), k.end());
      wv.insert(wv.end(), v.begin(), v.end());
    };
    // Growing magnitudes (every block's scale is raised and its tokens requantized), runs that
    // cross blocks, then a fork whose write copies a partial block (scales included).
    const std::vector<std::pair<std::size_t, float>> steps{
        {1, 0.01f}, {2, 0.1f}, {5, 1.0f}, {1, 0.001f}, {3, 30.0f}, {7, 2.0f}, {2, 500.0f}};
    for (const auto& [n, m] : steps) append(a, n, m);
    const auto b = c.fork(a);
    BOOST_TEST_REQUIRE(h.fork(a) == b);
    written_k[1] = written_k[0];
    written_v[1] = written_v[0];
    append(b, 1, 5000.0f);  // copy on write, and a scale raised in the copy only
    append(a, 2, 0.5f);
    BOOST_TEST(c.stats().cow_copies == 1u);
    for (const hs::kv_seq_id seq : {a, b}) {
      const auto dt = c.block_table(seq), ht = h.block_table(seq);
      BOOST_TEST_REQUIRE((std::vector<hs::kv_block_id>(dt.begin(), dt.end()) ==
                          std::vector<hs::kv_block_id>(ht.begin(), ht.end())));
      const std::size_t n = c.length(seq);
      std::vector<float> hk(n * te), hv(n * te);
      for (std::size_t p = 0; p < n; ++p) {
        h.read(seq, p, std::span<float>(hk).subspan(p * te, te),
               std::span<float>(hv).subspan(p * te, te));
      }
      const auto [k, v] = read_all(c, seq);
      CHECK_SAME(k, hk, "int8 K against the host cache, sequence " << seq);
      CHECK_SAME(v, hv, "int8 V against the host cache, sequence " << seq);
      dbuf<float> dk(n * te), dv(n * te);
      hs::read(c, seq, 0, n, mspan(dk, n * te), mspan(dv, n * te));
      CHECK_SAME(download(dk, n * te), hk, "int8 K read to device float, sequence " << seq);
      // The documented bound, against what was written.
      const auto& wk = written_k[seq - a];
      for (std::size_t p = 0; p < n; ++p) {
        for (std::size_t e = 0; e < te; ++e) {
          const float sc = h.pool().scale(ht[p / shape.block_tokens], 0, e / shape.head_dim);
          BOOST_TEST(
              std::fabs(double(k[p * te + e]) - double(wk[p * te + e])) <= double(sc) * (1 + 1e-6),
              "position " << p << " element " << e);
        }
      }
      // The scales themselves.
      std::vector<float> ds(2 * shape.heads);
      for (const hs::kv_block_id blk : dt) {
        HONE_CUDA_CHECK(cudaMemcpy(ds.data(),
                                   c.pool().scales() + std::size_t(blk) * 2 * shape.heads,
                                   ds.size() * sizeof(float), cudaMemcpyDeviceToHost));
        for (std::size_t x = 0; x < ds.size(); ++x) {
          BOOST_TEST(
              ds[x] == h.pool().scale(blk, int(x / shape.heads), x % shape.heads),
              "block " << blk << (x < shape.heads ? " K" : " V") << " head " << x % shape.heads);
        }
      }
    }
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(int8_on_the_device_matches_the_host_cache_byte_for_byte) {
  int8_matches_host<float>(true, 500);
  int8_matches_host<float>(false, 600);
  int8_matches_host<hone::bfloat16>(false, 700);
  int8_matches_host<hone::half>(false, 800);
}

BOOST_AUTO_TEST_CASE(errors_are_sentences) {
  hs::device_kv_cache<float> c(shape, 4);
  const auto s = c.add_sequence().seq;
  dbuf<float> d(2 * te);
  auto message_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "(no exception)";
  };
  auto has = [](const std::string& m, const std::string& part) {
    BOOST_TEST(m.find(part) != std::string::npos, "'" << m << "' lacks '" << part << "'");
  };
  has(message_of(
          [&] { hs::append(c, s, iota_tokens(2, 0), cspan(d, 2 * te), cspan(d, 2 * te - 1)); }),
      "2 tokens need 30 K and V values each (tokens x heads x head_dim = 2 x 3 x 5), got 30 K "
      "and 29 V");
  has(message_of([&] {
        hs::append(c, s, iota_tokens(1, 0), hone::device_span<const float>(nullptr, te),
                   cspan(d, te));
      }),
      "k has 15 elements and a null data pointer");
  has(message_of([&] { hs::append(c, 42, iota_tokens(1, 0), cspan(d, te), cspan(d, te)); }),
      "sequence 42 does not exist");
  hs::append(c, s, iota_tokens(2, 0), cspan(d, 2 * te), cspan(d, 2 * te));
  std::vector<float> hk(2 * te), hv(2 * te);
  has(message_of([&] { hs::read_to_host(c, s, 1, 2, hk, hv); }),
      "read_to_host: tokens [1, 3) are not all in sequence " + std::to_string(s) + " (2 tokens)");
  has(message_of([&] { hs::read(c, s, 0, 2, mspan(d, 2 * te), mspan(d, te)); }),
      "read: 2 tokens need 30 K and V values each");
  hs::kv_block_tables tables;
  has(message_of([&] { (void)tables.upload(c, std::span<const hs::kv_seq_id>{}, nullptr); }),
      "no sequences");
  const std::vector<hs::kv_seq_id> one{s};
  const auto view = tables.upload(c, one, nullptr);
  has(message_of(
          [&] { hs::decode_attention(view, cspan(d, te - 1), mspan(d, te), 1.0f, nullptr); }),
      "q and out must hold sequences x heads x head_dim = 15 floats of device memory each, got "
      "14 and 15");
  HONE_CUDA_CHECK(cudaDeviceSynchronize());
  BOOST_TEST(c.length(s) == 2u);
  c.validate();
}
