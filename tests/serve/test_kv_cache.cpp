// hone::serve::kv_cache and kv_block_pool, operation by operation: the pool (allocate, release,
// exhaustion), each element type's round trip (float, bfloat16 and half exactly for values they
// represent, int8 within its documented bound, against a double reference), append and read,
// copy-on-write after fork, prefix sharing and its confirmation under forced hash collisions,
// eviction order (LRU with the frequency term, computed by hand), pinning, out-of-blocks with the
// cache unchanged, and every error sentence.
#define BOOST_TEST_MODULE hone_serve_kv_cache
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <hone/serve.hpp>
#include <span>
#include <string>
#include <vector>

#include "../support/error_text.hpp"

namespace hs = hone::serve;

namespace {

constexpr hs::kv_block_shape small{.block_tokens = 4, .heads = 2, .head_dim = 3};

/// K of token `tok` at `pos`: small integers, exact in every float type (|x| <= 100).
std::vector<float> k_of(hs::kv_token tok, std::size_t pos, std::size_t n = 6) {
  std::vector<float> x(n);
  for (std::size_t j = 0; j < n; ++j) {
    x[j] = static_cast<float>(
        (static_cast<long>(tok) * 7 + static_cast<long>(pos) * 3 + static_cast<long>(j)) % 201 -
        100);
  }
  return x;
}
std::vector<float> v_of(hs::kv_token tok, std::size_t pos, std::size_t n = 6) {
  std::vector<float> x = k_of(tok, pos + 1000, n);
  for (float& e : x) e = -e / 2;
  return x;
}

template <class T>
void append_tokens(hs::kv_cache<T>& c, hs::kv_seq_id s, const std::vector<hs::kv_token>& toks) {
  for (const hs::kv_token t : toks) {
    const std::size_t pos = c.length(s);
    c.append(s, t, k_of(t, pos), v_of(t, pos));
  }
}

template <class T>
void check_reads(const hs::kv_cache<T>& c, hs::kv_seq_id s, const std::vector<hs::kv_token>& toks) {
  BOOST_TEST_REQUIRE(c.length(s) == toks.size());
  std::vector<float> k(6), v(6);
  for (std::size_t p = 0; p < toks.size(); ++p) {
    BOOST_TEST(c.token(s, p) == toks[p]);
    c.read(s, p, k, v);
    const auto ek = k_of(toks[p], p), ev = v_of(toks[p], p);
    for (std::size_t j = 0; j < 6; ++j) {
      BOOST_TEST(k[j] == ek[j]);
      BOOST_TEST(v[j] == ev[j]);
    }
  }
}

std::vector<hs::kv_token> iota_tokens(std::size_t n, hs::kv_token first) {
  std::vector<hs::kv_token> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = first + static_cast<hs::kv_token>(i);
  return t;
}

}  // namespace

BOOST_AUTO_TEST_CASE(pool_allocates_every_block_once_and_refuses_when_empty) {
  hs::kv_block_pool<float> pool(small, 3);
  BOOST_TEST(pool.bytes() == 2u * 3 * 24 * sizeof(float));
  std::vector<hs::kv_block_id> got;
  for (int i = 0; i < 3; ++i) got.push_back(pool.allocate());
  std::sort(got.begin(), got.end());
  BOOST_TEST((got == std::vector<hs::kv_block_id>{0, 1, 2}));
  BOOST_TEST(pool.free_blocks() == 0u);
  BOOST_CHECK_THROW((void)pool.allocate(), hs::out_of_blocks_error);
  BOOST_TEST(pool.free_blocks() == 0u);
  pool.release(1);
  BOOST_TEST(pool.allocate() == 1u);  // LIFO
  BOOST_TEST(pool.k_data(1) + 2 * 24 == pool.k_data(2) + 24);
}

BOOST_AUTO_TEST_CASE(pool_shape_errors_name_the_extent) {
  const auto m = hone_test::error_of([] { hs::kv_block_pool<float> p({4, 0, 3}, 2); });
  BOOST_TEST(m.find("heads 0") != std::string::npos);
  BOOST_TEST(hone_test::error_of([] {
               hs::kv_block_pool<float> p(small, 0);
             }).find("num_blocks is 0") != std::string::npos);
}

template <class T>
void round_trip_exact() {
  hs::kv_cache<T> c(small, 8);
  const auto toks = iota_tokens(11, 5);
  const auto s = c.add_sequence().seq;
  append_tokens(c, s, toks);
  check_reads(c, s, toks);
  BOOST_TEST(c.used_blocks() == 3u);  // 11 tokens in blocks of 4: one partial block
}

BOOST_AUTO_TEST_CASE(float_bfloat16_half_store_what_was_written) {
  round_trip_exact<float>();
  round_trip_exact<hone::bfloat16>();
  round_trip_exact<hone::half>();
}

BOOST_AUTO_TEST_CASE(bfloat16_rounds_like_the_reference) {
  hs::kv_cache<hone::bfloat16> c({1, 1, 2}, 1);
  const auto s = c.add_sequence().seq;
  c.append(s, 1, std::vector<float>{1.00390625f, 3.0f}, std::vector<float>{0.1f, -2.5f});
  std::vector<float> k(2), v(2);
  c.read(s, 0, k, v);
  BOOST_TEST(k[0] == 1.0f);  // 1 + 2^-8 ties to even in bf16 (8 significant bits)
  BOOST_TEST(std::fabs(v[0] - 0.1f) <= 0.1f / 256);
}

BOOST_AUTO_TEST_CASE(int8_reads_within_the_documented_bound) {
  const hs::kv_block_shape sh{4, 2, 8};
  hs::kv_cache<std::int8_t> c(sh, 4);
  const auto s = c.add_sequence().seq;
  // Growing magnitudes force requantization of the earlier tokens of the block.
  std::vector<std::vector<double>> ks, vs;
  for (std::size_t p = 0; p < 7; ++p) {
    std::vector<float> k(16), v(16);
    std::vector<double> kd(16), vd(16);
    for (std::size_t j = 0; j < 16; ++j) {
      kd[j] = std::sin(double(p * 16 + j)) * std::pow(3.0, double(p % 4));
      vd[j] = std::cos(double(p * 5 + j)) * (j < 8 ? 0.01 : 50.0);
      k[j] = float(kd[j]);
      v[j] = float(vd[j]);
    }
    c.append(s, hs::kv_token(p), k, v);
    ks.push_back(kd);
    vs.push_back(vd);
  }
  std::vector<float> k(16), v(16);
  for (std::size_t p = 0; p < 7; ++p) {
    c.read(s, p, k, v);
    const hs::kv_block_id b = c.block_table(s)[p / 4];
    for (std::size_t h = 0; h < 2; ++h) {
      // Bound: within the final scale, which is at most 2 max|x| / 127 of that head and block.
      double amax_k = 0, amax_v = 0;
      for (std::size_t q = (p / 4) * 4; q < std::min<std::size_t>((p / 4) * 4 + 4, 7); ++q) {
        for (std::size_t j = h * 8; j < h * 8 + 8; ++j) {
          amax_k = std::max(amax_k, std::fabs(ks[q][j]));
          amax_v = std::max(amax_v, std::fabs(vs[q][j]));
        }
      }
      const float sk = c.pool().scale(b, 0, h), sv = c.pool().scale(b, 1, h);
      BOOST_TEST(sk <= 2 * amax_k / 127 * (1 + 1e-6));
      BOOST_TEST(sv <= 2 * amax_v / 127 * (1 + 1e-6));
      for (std::size_t j = h * 8; j < h * 8 + 8; ++j) {
        BOOST_TEST(std::fabs(k[j] - ks[p][j]) <= sk * (1 + 1e-5));
        BOOST_TEST(std::fabs(v[j] - vs[p][j]) <= sv * (1 + 1e-5));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(fork_shares_and_copies_a_partial_block_on_write) {
  hs::kv_cache<float> c(small, 8);
  const auto a = c.add_sequence().seq;
  const auto toks = iota_tokens(6, 10);
  append_tokens(c, a, toks);
  const auto b = c.fork(a);
  BOOST_TEST(c.used_blocks() == 2u);
  const auto ta = c.block_table(a);
  BOOST_TEST(c.references(ta[0]) == 2u);
  BOOST_TEST(c.references(ta[1]) == 2u);
  BOOST_TEST(c.blocks_needed(a, 1) == 1u);  // the shared partial block is copied
  BOOST_TEST(c.blocks_needed(a, 3) == 2u);  // and one new block
  auto ta_copy = std::vector<hs::kv_block_id>(ta.begin(), ta.end());
  c.append(a, 99, k_of(99, 6), v_of(99, 6));
  BOOST_TEST(c.stats().cow_copies == 1u);
  BOOST_TEST(c.block_table(a)[0] == ta_copy[0]);  // full block: still shared
  BOOST_TEST(c.block_table(a)[1] != ta_copy[1]);
  BOOST_TEST(c.references(ta_copy[1]) == 1u);
  BOOST_TEST(c.blocks_needed(b, 1) == 0u);  // b owns the old one alone now: written in place
  c.append(b, 77, k_of(77, 6), v_of(77, 6));
  BOOST_TEST(c.block_table(b)[1] == ta_copy[1]);
  auto ea = toks, eb = toks;
  ea.push_back(99);
  eb.push_back(77);
  check_reads(c, a, ea);
  check_reads(c, b, eb);
  c.validate();
  c.free_sequence(a);
  c.free_sequence(b);
  BOOST_TEST(c.used_blocks() == 0u);
  c.validate();
}

BOOST_AUTO_TEST_CASE(a_known_prefix_reuses_full_blocks_only) {
  hs::kv_cache<float> c(small, 16);
  const auto p = iota_tokens(10, 1);  // two full blocks and 2 tokens
  const auto a = c.add_sequence(p);
  BOOST_TEST(a.cached_tokens == 0u);
  append_tokens(c, a.seq, p);
  BOOST_TEST(c.lookup(p) == 8u);
  auto q = p;
  q[9] = 500;  // differs in the partial block only
  const auto b = c.add_sequence(q);
  BOOST_TEST(b.cached_tokens == 8u);
  BOOST_TEST(c.block_table(b.seq)[0] == c.block_table(a.seq)[0]);
  BOOST_TEST(c.block_table(b.seq)[1] == c.block_table(a.seq)[1]);
  // Append the rest and read the shared part back through b.
  for (std::size_t i = 8; i < q.size(); ++i) c.append(b.seq, q[i], k_of(q[i], i), v_of(q[i], i));
  check_reads(c, b.seq, q);
  auto r = p;
  r[5] = 600;  // differs in block 1: only block 0 is shared
  BOOST_TEST(c.lookup(r) == 4u);
  r[0] = 600;  // differs in block 0: nothing, although block 1's tokens match
  r[5] = p[5];
  BOOST_TEST(c.lookup(r) == 0u);
  BOOST_TEST(c.lookup(std::vector<hs::kv_token>(p.begin(), p.begin() + 7)) == 4u);
  BOOST_TEST(c.stats().hit_tokens == 8u);
  BOOST_TEST(c.stats().lookup_tokens == 20u);
  // Freed: the full blocks stay cached and are found again.
  c.free_sequence(a.seq);
  c.free_sequence(b.seq);
  BOOST_TEST(c.used_blocks() == 0u);
  BOOST_TEST(c.cached_blocks() == 2u);
  BOOST_TEST(c.add_sequence(p).cached_tokens == 8u);
  BOOST_TEST(c.cached_blocks() == 0u);
  c.validate();
}

BOOST_AUTO_TEST_CASE(hash_collisions_never_share_a_wrong_block) {
  // One hash bit: nearly every pair of blocks collides; lookups must still be exact.
  hs::kv_cache<float> c(small, 64, {.hash_bits = 1});
  std::vector<std::vector<hs::kv_token>> prompts;
  for (hs::kv_token i = 0; i < 6; ++i) {
    prompts.push_back({i, i + 1, i + 2, i + 3, 7, 7, 7, i});
    append_tokens(c, c.add_sequence().seq, prompts.back());
  }
  for (const auto& p : prompts) {
    BOOST_TEST(c.lookup(p) == 8u);
    auto q = p;
    q[7] += 100;
    BOOST_TEST(c.lookup(q) == 4u);
    q[0] += 100;
    BOOST_TEST(c.lookup(q) == 0u);
    const auto m = c.add_sequence(p);
    check_reads(c, m.seq, p);  // the values of exactly this prefix
  }
  BOOST_TEST(c.stats().hash_collisions > 0u);
  c.validate();
}

BOOST_AUTO_TEST_CASE(eviction_is_lru_with_a_frequency_term) {
  // 4 blocks; single-block prompts. Releases get ticks 1, 2, 3; a hit adds frequency_ticks.
  hs::kv_cache<float> c(small, 4, {.frequency_ticks = 2, .max_counted_hits = 8});
  const std::vector<hs::kv_token> a{1, 1, 1, 1}, b{2, 2, 2, 2}, d{3, 3, 3, 3};
  for (const auto* p : {&a, &b, &d}) {
    const auto s = c.add_sequence().seq;
    append_tokens(c, s, *p);
    c.free_sequence(s);
  }
  // a: tick 1, b: tick 2, d: tick 3. Reuse a once: released again at tick 4, key 4 + 2 = 6.
  c.free_sequence(c.add_sequence(a).seq);
  BOOST_TEST(c.cached_blocks() == 3u);
  BOOST_TEST(c.free_blocks() == 1u);
  // Two new blocks: the free one, then the evicted one with the smallest key (b: 2).
  const auto s = c.add_sequence().seq;
  append_tokens(c, s, iota_tokens(8, 40));
  BOOST_TEST(c.stats().evictions == 1u);
  BOOST_TEST(c.lookup(b) == 0u);
  BOOST_TEST(c.lookup(a) == 4u);
  BOOST_TEST(c.lookup(d) == 4u);
  // Next: d (key 3) before a (key 6), although a's last release is more recent.
  c.append(s, 9, k_of(9, 8), v_of(9, 8));
  BOOST_TEST(c.lookup(d) == 0u);
  BOOST_TEST(c.lookup(a) == 4u);
  BOOST_TEST(c.evict(5) == 1u);
  BOOST_TEST(c.lookup(a) == 0u);
  BOOST_TEST(c.free_blocks() == 1u);
  c.validate();
}

BOOST_AUTO_TEST_CASE(pinned_prefixes_are_never_evicted) {
  hs::kv_cache<float> c(small, 4);
  const auto sys = iota_tokens(8, 1);
  const auto s = c.add_sequence().seq;
  append_tokens(c, s, sys);
  const auto pin = c.pin_prefix(sys);
  BOOST_TEST(pin.pinned_tokens == 8u);
  c.free_sequence(s);
  BOOST_TEST(c.used_blocks() == 2u);  // held by the pin
  BOOST_TEST(c.cached_blocks() == 0u);
  // Fill the other two blocks, then ask for more: refused, not evicting the pinned prefix.
  const auto t = c.add_sequence().seq;
  append_tokens(c, t, iota_tokens(8, 100));
  BOOST_CHECK_THROW(c.append(t, 5, k_of(5, 8), v_of(5, 8)), hs::out_of_blocks_error);
  BOOST_TEST(c.lookup(sys) == 8u);
  const auto u = c.add_sequence(sys);
  BOOST_TEST(u.cached_tokens == 8u);
  check_reads(c, u.seq, sys);
  c.free_sequence(u.seq);
  c.unpin(pin.id);
  BOOST_TEST(c.cached_blocks() == 2u);
  c.append(t, 5, k_of(5, 8), v_of(5, 8));  // now an unpinned cached block is evicted
  BOOST_TEST(c.lookup(sys) == 4u);         // the tail block went first (released first by unpin)
  BOOST_TEST(c.pin_prefix(iota_tokens(4, 900)).pinned_tokens == 0u);
  c.validate();
}

BOOST_AUTO_TEST_CASE(out_of_blocks_is_recoverable_and_changes_nothing) {
  hs::kv_cache<float> c(small, 3);
  const auto a = c.add_sequence().seq;
  const auto ta = iota_tokens(6, 1);
  append_tokens(c, a, ta);
  const auto b = c.fork(a);
  std::vector<hs::kv_token> many(9, 3);
  std::vector<float> k(9 * 6, 1.0f), v(9 * 6, 2.0f);
  BOOST_TEST(c.blocks_needed(a, 9) == 3u);  // copy of the partial block + 2 new
  try {
    c.append(a, many, k, v);
    BOOST_FAIL("append of 9 tokens into 1 free block did not throw");
  } catch (const hs::out_of_blocks_error& e) {
    BOOST_TEST(e.needed() == 3u);
    BOOST_TEST(e.available() == 1u);
    BOOST_TEST(std::string(e.what()).find("needs 3 blocks for 9 tokens, and only 1 are free or "
                                          "evictable; the cache is unchanged") !=
               std::string::npos);
  }
  BOOST_TEST(c.stats().refused == 1u);
  BOOST_TEST(c.free_blocks() == 1u);
  BOOST_TEST(c.stats().cow_copies == 0u);
  check_reads(c, a, ta);
  check_reads(c, b, ta);
  // Preempt b: now it fits.
  c.free_sequence(b);
  c.append(a, std::span<const hs::kv_token>(many.data(), 2), std::span<const float>(k.data(), 12),
           std::span<const float>(v.data(), 12));
  BOOST_TEST(c.length(a) == 8u);
  c.validate();
}

BOOST_AUTO_TEST_CASE(error_sentences_name_what_is_wrong) {
  hs::kv_cache<float> c(small, 4);
  const auto s = c.add_sequence().seq;
  std::vector<float> k(6), v(5);
  BOOST_TEST(hone_test::error_of([&] { c.append(s, 1, k, v); })
                 .find("1 tokens need 6 K and V floats each (tokens x heads x head_dim = 1 x 2 x "
                       "3), got 6 K and 5 V") != std::string::npos);
  BOOST_TEST(c.length(s) == 0u);
  BOOST_TEST(hone_test::error_of([&] { c.free_sequence(42); })
                 .find("free_sequence: sequence 42 does not exist (never made by add_sequence "
                       "or fork, or already freed)") != std::string::npos);
  BOOST_CHECK_THROW((void)c.fork(42), hone::config_error);
  BOOST_CHECK_THROW((void)c.length(42), hone::config_error);
  std::vector<float> kk(6), vv(6);
  BOOST_TEST(hone_test::error_of([&] { c.read(s, 0, kk, vv); })
                 .find("read: position 0 is past the end of sequence " + std::to_string(s) +
                       " (0 tokens)") != std::string::npos);
  c.append(s, 1, kk, vv);
  BOOST_TEST(hone_test::error_of([&] {
               c.read(s, 0, kk, v);
             }).find("one token's K and V are 6 floats each (heads x head_dim), got 6 and 5") !=
             std::string::npos);
  BOOST_TEST(hone_test::error_of([&] { c.unpin(7); }).find("pin 7 does not exist") !=
             std::string::npos);
  BOOST_TEST(hone_test::error_of([&] {
               (void)c.references(4);
             }).find("block 4 is not in the pool (4 blocks)") != std::string::npos);
  BOOST_TEST(hone_test::error_of([] {
               hs::kv_cache<float> d(small, 2, {.hash_bits = 0});
             }).find("hash_bits is 0; it must be in [1, 128]") != std::string::npos);
  c.free_sequence(s);
  BOOST_CHECK_THROW(c.free_sequence(s), hone::config_error);  // twice
  c.validate();
}
