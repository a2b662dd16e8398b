// hone::serve::kv_cache (host memory) driven by random operations against a reference model
// written separately: the driver and the model are in kv_random_driver.hpp (shared with the CUDA
// test, test_kv_cache_gpu.cu), which says what is checked; here the data goes through the host
// cache's own append and read.
//
// HONE_KV_RANDOM_OPS overrides the number of operations of the main run (default 1000000, a few
// seconds in Release); the collision run (2 hash bits) and the bfloat16 / half runs do a tenth.
#define BOOST_TEST_MODULE hone_serve_kv_cache_random
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <hone/serve.hpp>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kv_random_driver.hpp"

namespace {
/// The host cache's own append and read.
struct host_io {
  using space = hone::host_space;
  template <class C>
  void append(C& c, hs::kv_seq_id id, std::span<const hs::kv_token> toks, std::span<const float> k,
              std::span<const float> v) {
    c.append(id, toks, k, v);
  }
  template <class C>
  void read(const C& c, hs::kv_seq_id id, std::size_t p, std::span<float> k, std::span<float> v) {
    c.read(id, p, k, v);
  }
};
template <class T>
using driver = kv_random::driver<T, host_io>;
using kv_random::ops_from_env;
}  // namespace

BOOST_AUTO_TEST_CASE(float_cache_against_the_reference) {
  driver<float> d(128, 1);
  d.run(ops_from_env());
}

BOOST_AUTO_TEST_CASE(two_hash_bits_collide_constantly_and_stay_exact) {
  driver<float> d(2, 2);
  d.run(ops_from_env() / 10 + 1000);
  BOOST_TEST(d.c.stats().hash_collisions > 0u);
}

BOOST_AUTO_TEST_CASE(bfloat16_and_half_caches_against_the_reference) {
  driver<hone::bfloat16> b(128, 3);
  b.run(ops_from_env() / 10 + 1000);
  driver<hone::half> h(128, 4);
  h.run(ops_from_env() / 10 + 1000);
}
