// tests/serve/kv_random_driver.hpp: the randomized test of hone::serve::kv_cache, shared by the
// host test (test_kv_cache_random.cpp) and the CUDA one (test_kv_cache_gpu.cu): random operations
// (add a sequence with a prompt, append, fork, free, evict, pin, unpin, read) applied to the cache
// and to a reference model written separately here: blocks are plain records in a std::map,
// cached prefixes are keyed by their whole token prefix (no hashing at all), eviction scans every
// record for the smallest (key, tick). After every operation the cache must agree with the
// reference on the prefix hits, on out-of-blocks refusals and on the used / cached / free block
// counts; every read returns the K and V written for that position (derived from the sequence's
// tokens up to it, so a shared block reads the same through every sequence); and periodically the
// full state is swept: every block table entry is referenced, the sharing structure (which
// positions of which sequences alias one block) is the reference's, and validate() holds. At the
// end everything is freed and unpinned and every block is back.
//
// The data goes through an Io type (the host cache's append/read, or the CUDA functions); include
// after <boost/test/unit_test.hpp> and <hone/serve.hpp>.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace hs = hone::serve;

// A failed check stops the run; plain (not BOOST_TEST) to keep 10^6 operations cheap.
#define REQUIRE(cond)                                                           \
  do {                                                                          \
    if (!(cond)) BOOST_FAIL("check failed at line " << __LINE__ << ": " #cond); \
  } while (0)

namespace kv_random {

inline std::size_t ops_from_env() {
  if (const char* e = std::getenv("HONE_KV_RANDOM_OPS")) {
    const long long n = std::atoll(e);
    if (n > 0) return static_cast<std::size_t>(n);
  }
  return 1000000;
}

constexpr std::size_t bt = 4;  // tokens per block
constexpr std::size_t te = 4;  // heads (2) x head_dim (2)
constexpr std::size_t blocks = 48;
constexpr std::size_t max_len = 40;
constexpr std::uint64_t freq_ticks = 16;
constexpr std::uint32_t max_hits = 4;

/// Rolling content hash of a sequence's tokens up to and including one position.
inline std::uint64_t roll(std::uint64_t prev, hs::kv_token t) {
  std::uint64_t x = (prev ^ static_cast<std::uint64_t>(t + 1)) * 0x9e3779b97f4a7c15ull;
  return x ^ (x >> 29);
}
/// The K (which 0) or V (1) element j of a position with rolling hash r: an integer in
/// [-128, 127], exact in float, bfloat16 and half.
inline float value(std::uint64_t r, int which, std::size_t j) {
  return static_cast<float>(static_cast<int>((r >> (8 * (j + 4 * std::size_t(which)))) & 0xff) -
                            128);
}

// -- the reference model --
struct ref_model {
  struct block {
    int refs = 0;
    bool registered = false;
    std::vector<hs::kv_token> key;  // registered: the whole token prefix it ends
    std::uint64_t tick = 0, ekey = 0, hits = 0;
  };
  struct seq {
    std::vector<hs::kv_token> toks;
    std::vector<std::uint64_t> rolls;
    std::vector<int> blocks;
  };
  std::map<int, block> rb;
  std::map<std::vector<hs::kv_token>, int> cache;
  std::map<hs::kv_seq_id, seq> seqs;
  std::map<hs::kv_pin_id, std::vector<int>> pins;
  int next_block = 0;
  std::uint64_t clock = 0;
  std::size_t cached = 0;  // registered, unreferenced

  [[nodiscard]] std::size_t used() const { return rb.size() - cached; }
  [[nodiscard]] std::size_t available() const { return blocks - used(); }

  std::vector<int> match(const std::vector<hs::kv_token>& p) const {
    std::vector<int> out;
    for (std::size_t i = 1; i * bt <= p.size(); ++i) {
      auto it =
          cache.find(std::vector<hs::kv_token>(p.begin(), p.begin() + std::ptrdiff_t(i * bt)));
      if (it == cache.end()) break;
      out.push_back(it->second);
    }
    return out;
  }
  void acquire(int b, bool hit) {
    block& x = rb.at(b);
    if (x.refs == 0) --cached;
    ++x.refs;
    if (hit) ++x.hits;
  }
  void release(int b) {
    block& x = rb.at(b);
    if (--x.refs > 0) return;
    if (x.registered) {
      x.tick = ++clock;
      x.ekey = x.tick + freq_ticks * std::min<std::uint64_t>(x.hits, max_hits);
      ++cached;
    } else {
      rb.erase(b);
    }
  }
  bool evict_one() {
    int best = -1;
    for (const auto& [id, x] : rb) {
      if (x.refs != 0) continue;
      if (best < 0 || x.ekey < rb.at(best).ekey ||
          (x.ekey == rb.at(best).ekey && x.tick < rb.at(best).tick)) {
        best = id;
      }
    }
    if (best < 0) return false;
    cache.erase(rb.at(best).key);
    rb.erase(best);
    --cached;
    return true;
  }
  int take() {
    if (rb.size() == blocks) BOOST_REQUIRE(evict_one());
    const int id = next_block++;
    rb[id].refs = 1;
    return id;
  }
  std::size_t need(const seq& s, std::size_t n) const {
    const std::size_t now = (s.toks.size() + bt - 1) / bt,
                      after = (s.toks.size() + n + bt - 1) / bt;
    const bool cow = s.toks.size() % bt != 0 && rb.at(s.blocks.back()).refs > 1;
    return after - now + (cow ? 1 : 0);
  }
  /// Appends; false (and nothing changed) when out of blocks.
  bool append(seq& s, const std::vector<hs::kv_token>& toks) {
    if (toks.empty()) return true;
    if (need(s, toks.size()) > available()) return false;
    if (s.toks.size() % bt != 0 && rb.at(s.blocks.back()).refs > 1) {
      const int nb = take();
      --rb.at(s.blocks.back()).refs;
      s.blocks.back() = nb;
    }
    for (const hs::kv_token t : toks) {
      if (s.toks.size() % bt == 0) s.blocks.push_back(take());
      s.rolls.push_back(roll(s.rolls.empty() ? 0 : s.rolls.back(), t));
      s.toks.push_back(t);
      if (s.toks.size() % bt == 0) {
        const std::size_t i = s.toks.size() / bt - 1;
        if (i > 0 && !rb.at(s.blocks[i - 1]).registered) continue;
        if (cache.contains(s.toks)) continue;
        block& x = rb.at(s.blocks[i]);
        x.registered = true;
        x.key = s.toks;
        cache.emplace(s.toks, s.blocks[i]);
      }
    }
    return true;
  }
};

/// Drives a kv_cache<T, Io::space> and the reference model with the same random operations. The
/// data goes through `io` (Io::append and Io::read: the host cache's members, or the CUDA
/// functions of hone/serve/cuda/kv_cache.cuh); everything else is the cache's host bookkeeping.
template <class T, class Io>
struct driver {
  hs::kv_cache<T, typename Io::space> c;
  ref_model r;
  Io io;
  std::mt19937_64 rng;
  std::vector<std::vector<hs::kv_token>> bases;  // shared prompt beginnings
  std::size_t hits = 0, refusals = 0, cows = 0;

  explicit driver(unsigned hash_bits, std::uint64_t seed)
      : c({bt, 2, 2}, blocks,
          {.frequency_ticks = freq_ticks, .max_counted_hits = max_hits, .hash_bits = hash_bits}),
        rng(seed) {
    for (int i = 0; i < 6; ++i) {
      std::vector<hs::kv_token> b(4 + std::size_t(i) * 3);
      for (auto& t : b) t = hs::kv_token(rng() % 3);
      bases.push_back(b);
    }
  }
  std::size_t pick(std::size_t n) { return static_cast<std::size_t>(rng() % n); }
  hs::kv_token tok() { return hs::kv_token(rng() % 3); }
  template <class M>
  auto pick_key(const M& m) {
    auto it = m.begin();
    std::advance(it, std::ptrdiff_t(pick(m.size())));
    return it->first;
  }
  std::vector<hs::kv_token> prompt() {
    std::vector<hs::kv_token> p = bases[pick(bases.size())];
    p.resize(std::min(p.size(), pick(p.size() + 1) + 2));
    const std::size_t extra = pick(8);
    for (std::size_t i = 0; i < extra; ++i) p.push_back(tok());
    return p;
  }

  // Appends `toks` to both; checks they agree on refusal.
  void append_both(hs::kv_seq_id id, const std::vector<hs::kv_token>& toks) {
    ref_model::seq& s = r.seqs.at(id);
    std::vector<float> k(toks.size() * te), v(toks.size() * te);
    std::uint64_t rl = s.rolls.empty() ? 0 : s.rolls.back();
    for (std::size_t i = 0; i < toks.size(); ++i) {
      rl = roll(rl, toks[i]);
      for (std::size_t j = 0; j < te; ++j) {
        k[i * te + j] = value(rl, 0, j);
        v[i * te + j] = value(rl, 1, j);
      }
    }
    REQUIRE(c.blocks_needed(id, toks.size()) == r.need(s, toks.size()));
    const bool ok = r.append(s, toks);
    bool threw = false;
    try {
      io.append(c, id, toks, k, v);
    } catch (const hs::out_of_blocks_error&) {
      threw = true;
    }
    REQUIRE(threw == !ok);
    if (threw) ++refusals;
  }

  void check_read(hs::kv_seq_id id) {
    const ref_model::seq& s = r.seqs.at(id);
    REQUIRE(c.length(id) == s.toks.size());
    if (s.toks.empty()) return;
    const std::size_t p = pick(s.toks.size());
    std::vector<float> k(te), v(te);
    io.read(c, id, p, k, v);
    REQUIRE(c.token(id, p) == s.toks[p]);
    for (std::size_t j = 0; j < te; ++j) {
      REQUIRE(k[j] == value(s.rolls[p], 0, j));
      REQUIRE(v[j] == value(s.rolls[p], 1, j));
    }
    for (const hs::kv_block_id b : c.block_table(id)) REQUIRE(c.references(b) > 0u);
  }

  // The whole state: every read, the aliasing structure, validate().
  void sweep() {
    c.validate();
    std::map<hs::kv_block_id, int> real_to_ref;
    std::map<int, hs::kv_block_id> ref_to_real;
    auto pair_up = [&](hs::kv_block_id a, int b) {
      auto [i1, new1] = real_to_ref.emplace(a, b);
      auto [i2, new2] = ref_to_real.emplace(b, a);
      REQUIRE(i1->second == b);
      REQUIRE(i2->second == a);
    };
    std::vector<float> k(te), v(te);
    for (const auto& [id, s] : r.seqs) {
      const auto t = c.block_table(id);
      REQUIRE(t.size() == s.blocks.size());
      for (std::size_t i = 0; i < t.size(); ++i) pair_up(t[i], s.blocks[i]);
      for (std::size_t p = 0; p < s.toks.size(); ++p) {
        io.read(c, id, p, k, v);
        for (std::size_t j = 0; j < te; ++j) {
          REQUIRE(k[j] == value(s.rolls[p], 0, j));
          REQUIRE(v[j] == value(s.rolls[p], 1, j));
        }
      }
    }
    for (const auto& [b, ref] : real_to_ref) {
      REQUIRE(c.references(b) == std::size_t(r.rb.at(ref).refs));
    }
  }

  void step() {
    const std::size_t nseq = r.seqs.size();
    std::size_t op = pick(100);
    if (nseq >= 24 && op < 70 && (op < 22 || op >= 60)) op = 70;  // at most 24 sequences: free
    if (op < 22 || nseq == 0) {  // a new sequence with a prompt: lookup, then the rest appended
      const auto p = prompt();
      const auto m = c.add_sequence(p);
      const auto want = r.match(p);
      REQUIRE(m.cached_tokens == want.size() * bt);
      hits += want.size();
      ref_model::seq s;
      for (const int b : want) r.acquire(b, true);
      s.blocks = want;
      s.toks.assign(p.begin(), p.begin() + std::ptrdiff_t(want.size() * bt));
      for (const hs::kv_token t : s.toks)
        s.rolls.push_back(roll(s.rolls.empty() ? 0 : s.rolls.back(), t));
      r.seqs.emplace(m.seq, s);
      append_both(m.seq,
                  std::vector<hs::kv_token>(p.begin() + std::ptrdiff_t(m.cached_tokens), p.end()));
      check_read(m.seq);
    } else if (op < 60) {  // append 1..6 tokens (decode steps, or a chunk)
      const auto id = pick_key(r.seqs);
      const std::size_t len = r.seqs.at(id).toks.size();
      if (len >= max_len) return free_one(id);
      std::vector<hs::kv_token> toks(1 + (pick(4) == 0 ? pick(6) : 0));
      for (auto& t : toks) t = tok();
      const std::size_t before = c.stats().cow_copies;
      append_both(id, toks);
      cows += c.stats().cow_copies - before;
      check_read(id);
    } else if (op < 70) {  // fork
      const auto id = pick_key(r.seqs);
      const auto f = c.fork(id);
      ref_model::seq s = r.seqs.at(id);
      for (const int b : s.blocks) ++r.rb.at(b).refs;
      r.seqs.emplace(f, s);
      check_read(f);
    } else if (op < 70 + std::min<std::size_t>(nseq, 25)) {  // free (likelier with more)
      free_one(pick_key(r.seqs));
    } else if (op < 97) {  // read
      check_read(pick_key(r.seqs));
    } else if (op < 98) {  // evict a few
      const std::size_t n = pick(4);
      std::size_t want = 0;
      while (want < n && r.evict_one()) ++want;
      REQUIRE(c.evict(n) == want);
    } else if (op < 99) {  // pin a prefix
      const auto p = prompt();
      const auto pin = c.pin_prefix(p);
      const auto want = r.match(p);
      REQUIRE(pin.pinned_tokens == want.size() * bt);
      for (const int b : want) r.acquire(b, false);
      r.pins.emplace(pin.id, want);
    } else if (!r.pins.empty()) {  // unpin
      const auto id = pick_key(r.pins);
      c.unpin(id);
      const auto& bl = r.pins.at(id);
      for (auto b = bl.rbegin(); b != bl.rend(); ++b) r.release(*b);
      r.pins.erase(id);
    }
    REQUIRE(c.used_blocks() == r.used());
    REQUIRE(c.cached_blocks() == r.cached);
    REQUIRE(c.free_blocks() == blocks - r.rb.size());
  }

  void free_one(hs::kv_seq_id id) {
    c.free_sequence(id);
    const auto& bl = r.seqs.at(id).blocks;
    for (auto b = bl.rbegin(); b != bl.rend(); ++b) r.release(*b);
    r.seqs.erase(id);
    BOOST_CHECK_THROW((void)c.length(id), hone::config_error);
  }

  void run(std::size_t ops) {
    for (std::size_t i = 0; i < ops; ++i) {
      step();
      if (i % 4096 == 4095) sweep();
    }
    sweep();
    // No leak: everything freed and unpinned leaves every block free or cached, then free.
    while (!r.seqs.empty()) free_one(r.seqs.begin()->first);
    while (!r.pins.empty()) {
      const auto id = r.pins.begin()->first;
      c.unpin(id);
      for (auto b = r.pins.at(id).rbegin(); b != r.pins.at(id).rend(); ++b) r.release(*b);
      r.pins.erase(id);
    }
    BOOST_TEST(c.used_blocks() == 0u);
    BOOST_TEST(c.cached_blocks() == r.cached);
    c.validate();
    BOOST_TEST(c.evict(blocks) == r.cached);
    BOOST_TEST(c.free_blocks() == blocks);
    c.validate();
    BOOST_TEST_MESSAGE(ops << " ops: " << hits << " prefix block hits, " << refusals
                           << " refusals, " << cows << " copies on write, " << c.stats().evictions
                           << " evictions, " << c.stats().hash_collisions
                           << " hash collisions rejected");
    // The run exercised what it claims to.
    BOOST_TEST(hits > ops / 100);
    BOOST_TEST(refusals > 0u);
    BOOST_TEST(cows > 0u);
    BOOST_TEST(c.stats().evictions > 0u);
  }
};

}  // namespace kv_random
