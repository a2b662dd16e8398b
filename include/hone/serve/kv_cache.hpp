// hone/serve/kv_cache.hpp: a paged KV cache with prefix sharing (docs/serve.md, "Paged KV
// cache"). Sequences own block tables into a kv_block_pool; blocks are reference counted and
// copied on write; a full block is found again by a chained XXH3-128 hash of its parent's hash and
// its tokens, confirmed by comparing the tokens and the parent block (a hash collision never
// shares a wrong block); unreferenced cached blocks are evicted by LRU with a frequency term, and
// pinned prefixes are never evicted.
//
// The bookkeeping is host code for any memory space; with Space = hone::cuda_space the blocks are
// device memory (device_kv_cache), and the data moves through hone/serve/cuda/kv_cache.cuh, built
// on append_with() below.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/hash.hpp"
#include "hone/serve/kv_block_pool.hpp"

HONE_NAMESPACE_BEGIN
namespace serve {

/// A token id.
using kv_token = std::int32_t;
/// A sequence of the cache (from add_sequence or fork; never reused).
using kv_seq_id = std::uint64_t;
/// A pinned prefix (from pin_prefix; never reused).
using kv_pin_id = std::uint64_t;

struct kv_cache_options {
  /// Seeds the chained hash: caches (or models, adapters) with different salts never share.
  std::uint64_t salt = 0;
  /// Eviction: each reuse of a block through a prefix lookup delays its eviction as if it had been
  /// released this many releases later ...
  std::uint64_t frequency_ticks = 64;
  /// ... counting at most this many reuses.
  std::uint32_t max_counted_hits = 8;
  /// Bits of the 128-bit chained hash kept, in [1, 128]. Only for testing the collision path
  /// (few bits make collisions frequent, and the cache must stay exact); leave at 128.
  unsigned hash_bits = 128;
};

/// What add_sequence gives: the new sequence and how many of the prompt's tokens it already holds
/// (cached blocks reused, a multiple of block_tokens). The caller appends the rest.
struct kv_prefix_match {
  kv_seq_id seq = 0;
  std::size_t cached_tokens = 0;
};

/// What pin_prefix gives: the pin and how many leading tokens it holds (a multiple of
/// block_tokens; 0 when no leading block of the prefix was cached).
struct kv_pin {
  kv_pin_id id = 0;
  std::size_t pinned_tokens = 0;
};

struct kv_cache_stats {
  std::uint64_t lookup_tokens = 0;    // prompt tokens add_sequence looked up
  std::uint64_t hit_tokens = 0;       // of those, found in cached blocks
  std::uint64_t evictions = 0;        // cached blocks evicted
  std::uint64_t cow_copies = 0;       // partial blocks copied on write
  std::uint64_t hash_collisions = 0;  // equal hash, different block content (rejected)
  std::uint64_t refused = 0;          // operations refused with out_of_blocks_error
};

namespace detail {
/// Throws config_error unless `k` and `v` hold `tokens` tokens' K and V (heads x head_dim each).
inline void check_kv_sizes(const kv_block_shape& shape, const char* op, const char* unit,
                           std::size_t tokens, std::size_t k, std::size_t v) {
  const std::size_t te = shape.token_elements();
  if (k != tokens * te || v != tokens * te) {
    throw config_error("hone::serve::kv_cache::" + std::string(op) + ": " + std::to_string(tokens) +
                       " tokens need " + std::to_string(tokens * te) + " K and V " + unit +
                       " each (tokens x heads x head_dim = " + std::to_string(tokens) + " x " +
                       std::to_string(shape.heads) + " x " + std::to_string(shape.head_dim) +
                       "), got " + std::to_string(k) + " K and " + std::to_string(v) + " V");
  }
}
}  // namespace detail

/// The paged KV cache. Not thread-safe: one thread (the scheduler) drives it; the data of the
/// blocks (pool().k_data/v_data) may be read by kernels between calls.
template <class T, class Space = host_space>
class kv_cache {
  static_assert(kv_element<T>,
                "hone::serve: the KV element type must be float, hone::bfloat16, hone::half or "
                "std::int8_t (int8 is stored with one float scale per block and head); convert "
                "the model's K and V to one of these.");

 public:
  using pool_type = kv_block_pool<T, Space>;
  static constexpr kv_block_id no_block = std::numeric_limits<kv_block_id>::max();

  kv_cache(kv_block_shape shape, std::size_t num_blocks, kv_cache_options options = {})
      : pool_(shape, num_blocks),
        opt_(options),
        meta_(num_blocks),
        tokens_(num_blocks * shape.block_tokens) {
    if (options.hash_bits == 0 || options.hash_bits > 128) {
      throw config_error("hone::serve::kv_cache: hash_bits is " +
                         std::to_string(options.hash_bits) +
                         "; it must be in [1, 128] (leave it at 128 outside tests)");
    }
    scratch_.resize(4 + shape.block_tokens);
  }

  [[nodiscard]] const kv_block_shape& shape() const noexcept { return pool_.shape(); }
  [[nodiscard]] pool_type& pool() noexcept { return pool_; }
  [[nodiscard]] const pool_type& pool() const noexcept { return pool_; }
  [[nodiscard]] const kv_cache_stats& stats() const noexcept { return stats_; }

  /// Blocks on the free list.
  [[nodiscard]] std::size_t free_blocks() const noexcept { return pool_.free_blocks(); }
  /// Unreferenced cached blocks (evictable: they go when a free block is needed).
  [[nodiscard]] std::size_t cached_blocks() const noexcept { return evictable_.size(); }
  /// Blocks referenced by a sequence or a pin.
  [[nodiscard]] std::size_t used_blocks() const noexcept {
    return pool_.num_blocks() - free_blocks() - cached_blocks();
  }
  /// Blocks an operation may take: free plus evictable.
  [[nodiscard]] std::size_t available_blocks() const noexcept {
    return free_blocks() + cached_blocks();
  }
  [[nodiscard]] std::size_t sequences() const noexcept { return seqs_.size(); }
  /// Whether `seq` is a live sequence (made by add_sequence or fork, not freed).
  [[nodiscard]] bool contains(kv_seq_id seq) const { return seqs_.contains(seq); }
  /// References held on block `id` (sequences and pins); 0 for a free or cached block.
  [[nodiscard]] std::size_t references(kv_block_id id) const {
    if (id >= meta_.size()) {
      throw config_error("hone::serve::kv_cache::references: block " + std::to_string(id) +
                         " is not in the pool (" + std::to_string(meta_.size()) + " blocks)");
    }
    return meta_[id].refs;
  }

  /// Starts a sequence whose tokens begin with `prompt`, reusing the cached full blocks of the
  /// longest prefix of `prompt` found (whole blocks, at most prompt.size() tokens). Takes no free
  /// block, so it cannot run out. To have the model run on the last prompt token, pass the prompt
  /// without it.
  kv_prefix_match add_sequence(std::span<const kv_token> prompt = {}) {
    std::vector<kv_block_id> table;
    match(prompt, table);
    for (const kv_block_id b : table) acquire(b, true);
    stats_.lookup_tokens += prompt.size();
    const std::size_t cached = table.size() * shape().block_tokens;
    stats_.hit_tokens += cached;
    const kv_seq_id id = next_seq_++;
    seqs_.emplace(id, sequence{std::move(table), cached});
    return {id, cached};
  }

  /// Tokens of `prompt` that add_sequence would find cached now (changes nothing).
  [[nodiscard]] std::size_t lookup(std::span<const kv_token> prompt) const {
    std::vector<kv_block_id> table;
    match(prompt, table);
    return table.size() * shape().block_tokens;
  }

  /// A new sequence sharing every block of `seq` (beam search, parallel sampling). Takes no free
  /// block; the first append into a shared partial block copies it.
  kv_seq_id fork(kv_seq_id seq) {
    sequence copy = find(seq, "fork");
    for (const kv_block_id b : copy.table) ++meta_[b].refs;
    const kv_seq_id id = next_seq_++;
    seqs_.emplace(id, std::move(copy));
    return id;
  }

  /// Blocks append(seq, n tokens) would take (new blocks, and one copy when the last block is a
  /// shared partial block).
  [[nodiscard]] std::size_t blocks_needed(kv_seq_id seq, std::size_t n) const {
    return needed(find(seq, "blocks_needed"), n);
  }

  /// Appends one token with its K and V (heads * head_dim floats each, head-major).
  void append(kv_seq_id seq, kv_token token, std::span<const float> k,
              std::span<const float> v) requires space_traits<Space>::host_accessible {
    append(seq, std::span<const kv_token>(&token, 1), k, v);
  }

  /// Appends tokens with their K and V (tokens.size() * heads * head_dim floats each, token-major,
  /// then head-major). All or nothing: out_of_blocks_error (or a size error) leaves the cache as
  /// it was. A full block is registered for prefix sharing when its chain is (below).
  /// (A cache in device memory appends through hone/serve/cuda/kv_cache.cuh instead.)
  void append(kv_seq_id seq, std::span<const kv_token> tokens, std::span<const float> k,
              std::span<const float> v) requires space_traits<Space>::host_accessible {
    (void)find(seq, "append");
    detail::check_kv_sizes(shape(), "append", "floats", tokens.size(), k.size(), v.size());
    append_with(seq, tokens, host_io{pool_, k, v, shape().token_elements()});
  }

  /// The bookkeeping of an append, with the data movement left to `io`; the host append above and
  /// the CUDA appends of hone/serve/cuda/kv_cache.cuh are written with it. Checks that `seq`
  /// exists and that the blocks are available (out_of_blocks_error, nothing changed), then
  /// updates the block tables, reference counts and prefix table, calling, in this order:
  ///   io.copy(from, to, n): copy on write, the first n tokens of block `from` (K, V and int8
  ///     scales) into block `to` (at most once, before any write);
  ///   io.write(first, count, block, slot): tokens [first, first + count) of this append go to
  ///     slots [slot, slot + count) of `block` (slots [0, slot) already hold tokens; one call per
  ///     run of tokens that lands in one block, in token order).
  /// Both may only queue the work (a stream). An exception thrown by io leaves the bookkeeping
  /// of the tokens already planned in place (their data not written): the sequence should then
  /// be freed. The caller checks the sizes of its K and V.
  template <class Io>
  void append_with(kv_seq_id seq, std::span<const kv_token> tokens, Io&& io) {
    sequence& s = find(seq, "append");
    if (tokens.empty()) return;
    const std::size_t need = needed(s, tokens.size());
    if (need > available_blocks()) {
      ++stats_.refused;
      throw out_of_blocks_error(
          "hone::serve::kv_cache::append: sequence " + std::to_string(seq) + " needs " +
              std::to_string(need) + " blocks for " + std::to_string(tokens.size()) +
              " tokens, and only " + std::to_string(available_blocks()) +
              " are free or evictable; the cache is unchanged: free or preempt a sequence, "
              "unpin a prefix, or refuse the request",
          need, available_blocks());
    }
    const std::size_t bt = shape().block_tokens;
    s.table.reserve(s.table.size() + need);  // the only allocation that could fail comes first
    if (s.length % bt != 0 && meta_[s.table.back()].refs > 1) {  // copy on write
      const kv_block_id old = s.table.back();
      const kv_block_id nb = take_block();
      std::copy_n(tokens_.data() + std::size_t(old) * bt, meta_[old].filled,
                  tokens_.data() + std::size_t(nb) * bt);
      meta_[nb].filled = meta_[old].filled;
      --meta_[old].refs;  // still referenced by another sequence: stays in use
      s.table.back() = nb;
      ++stats_.cow_copies;
      io.copy(old, nb, std::size_t(meta_[nb].filled));
    }
    for (std::size_t i = 0; i < tokens.size();) {
      if (s.length % bt == 0) s.table.push_back(take_block());
      const kv_block_id b = s.table.back();
      block_meta& m = meta_[b];
      const std::size_t slot = m.filled;
      const std::size_t n = std::min(tokens.size() - i, bt - slot);
      std::copy_n(tokens.data() + i, n, tokens_.data() + std::size_t(b) * bt + slot);
      m.filled = static_cast<std::uint32_t>(slot + n);
      s.length += n;
      io.write(i, n, b, slot);
      i += n;
      if (m.filled == bt) on_full(s, s.table.size() - 1);
    }
  }

  /// Ends a sequence: its references are dropped, last block first; a registered block no longer
  /// referenced stays cached (evictable), any other goes back to the free list.
  void free_sequence(kv_seq_id seq) {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) throw missing(seq, "free_sequence");
    const std::vector<kv_block_id>& t = it->second.table;
    for (auto b = t.rbegin(); b != t.rend(); ++b) release(*b);
    seqs_.erase(it);
  }

  /// Number of tokens of `seq`.
  [[nodiscard]] std::size_t length(kv_seq_id seq) const { return find(seq, "length").length; }
  /// The block table of `seq`: block i holds tokens [i * block_tokens, (i + 1) * block_tokens).
  [[nodiscard]] std::span<const kv_block_id> block_table(kv_seq_id seq) const {
    return find(seq, "block_table").table;
  }
  /// The token at `pos` of `seq`.
  [[nodiscard]] kv_token token(kv_seq_id seq, std::size_t pos) const {
    const sequence& s = find(seq, "token");
    check_pos(s, seq, pos, "token");
    const std::size_t bt = shape().block_tokens;
    return tokens_[std::size_t(s.table[pos / bt]) * bt + pos % bt];
  }
  /// Reads the K and V of the token at `pos` of `seq` as floats (heads * head_dim each).
  void read(kv_seq_id seq, std::size_t pos, std::span<float> k,
            std::span<float> v) const requires space_traits<Space>::host_accessible {
    const sequence& s = find(seq, "read");
    check_pos(s, seq, pos, "read");
    const std::size_t te = shape().token_elements();
    if (k.size() != te || v.size() != te) {
      throw config_error("hone::serve::kv_cache::read: one token's K and V are " +
                         std::to_string(te) + " floats each (heads x head_dim), got " +
                         std::to_string(k.size()) + " and " + std::to_string(v.size()));
    }
    const std::size_t bt = shape().block_tokens;
    pool_.read_token(s.table[pos / bt], pos % bt, k, v);
  }

  /// Pins the cached full blocks of the longest cached prefix of `prefix`: they are never evicted
  /// until unpin(), and stay findable by add_sequence. A pin holds a reference on each block.
  kv_pin pin_prefix(std::span<const kv_token> prefix) {
    std::vector<kv_block_id> table;
    match(prefix, table);
    for (const kv_block_id b : table) acquire(b, false);
    const kv_pin_id id = next_pin_++;
    const std::size_t n = table.size() * shape().block_tokens;
    pins_.emplace(id, std::move(table));
    return {id, n};
  }
  /// Releases a pin (its blocks become evictable when nothing else references them).
  void unpin(kv_pin_id pin) {
    auto it = pins_.find(pin);
    if (it == pins_.end()) {
      throw config_error("hone::serve::kv_cache::unpin: pin " + std::to_string(pin) +
                         " does not exist (never made by pin_prefix, or already unpinned)");
    }
    for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) release(*b);
    pins_.erase(it);
  }

  /// Evicts up to `n` unreferenced cached blocks now, in eviction order; returns how many.
  std::size_t evict(std::size_t n) {
    std::size_t done = 0;
    while (done < n && !evictable_.empty()) {
      pool_.release(evict_one());
      ++done;
    }
    return done;
  }

  /// Checks the cache's bookkeeping (tests and debugging): every reference is held by a sequence
  /// or a pin, no sequence holds a free or cached block, the free list, the cached set and the
  /// prefix table agree. Throws hone::error naming the first inconsistency. O(blocks + tokens).
  void validate() const {
    std::vector<std::size_t> refs(meta_.size(), 0);
    for (const auto& [id, s] : seqs_) {
      for (const kv_block_id b : s.table) ++refs[b];
    }
    for (const auto& [id, t] : pins_) {
      for (const kv_block_id b : t) ++refs[b];
    }
    std::size_t used = 0, registered = 0;
    for (std::size_t b = 0; b < meta_.size(); ++b) {
      const block_meta& m = meta_[b];
      if (refs[b] != m.refs) {
        throw error("hone::serve::kv_cache::validate: block " + std::to_string(b) + " counts " +
                    std::to_string(m.refs) + " references, the tables hold " +
                    std::to_string(refs[b]));
      }
      if (m.refs > 0) ++used;
      if (m.registered) ++registered;
      if (m.refs == 0 && m.registered != m.in_evictable) {
        throw error("hone::serve::kv_cache::validate: unreferenced block " + std::to_string(b) +
                    (m.registered ? " is registered but not evictable"
                                  : " is evictable but not registered"));
      }
    }
    if (used + free_blocks() + cached_blocks() != meta_.size()) {
      throw error("hone::serve::kv_cache::validate: " + std::to_string(used) + " used + " +
                  std::to_string(free_blocks()) + " free + " + std::to_string(cached_blocks()) +
                  " cached blocks != " + std::to_string(meta_.size()));
    }
    if (registered != table_.size()) {
      throw error("hone::serve::kv_cache::validate: " + std::to_string(registered) +
                  " registered blocks, " + std::to_string(table_.size()) + " in the prefix table");
    }
  }

 private:
  struct block_meta {
    std::uint32_t refs = 0;
    std::uint32_t filled = 0;
    std::uint32_t hits = 0;
    bool registered = false;                 // in the prefix table
    bool in_evictable = false;               // in evictable_
    kv_block_id parent = no_block;           // registered: the registered block before it (or none)
    std::uint64_t hash_lo = 0, hash_hi = 0;  // full: the chained hash
    std::uint64_t tick = 0, key = 0;         // cached: release tick and eviction key
  };
  struct sequence {
    std::vector<kv_block_id> table;
    std::size_t length = 0;
  };
  struct hash128 {
    std::uint64_t lo = 0, hi = 0;
    friend bool operator==(const hash128&, const hash128&) = default;
  };
  struct hash128_hasher {
    std::size_t operator()(const hash128& h) const noexcept {
      return static_cast<std::size_t>(h.lo ^ (h.hi * 0x9e3779b97f4a7c15ull));
    }
  };

  // append_with's data movement for a host-accessible pool: element by element through the
  // pool's accessors (which convert, and quantize int8).
  struct host_io {
    pool_type& pool;
    std::span<const float> k, v;
    std::size_t te;
    void copy(kv_block_id from, kv_block_id to, std::size_t n) { pool.copy_tokens(from, to, n); }
    void write(std::size_t first, std::size_t count, kv_block_id b, std::size_t slot) {
      for (std::size_t j = 0; j < count; ++j) {
        pool.write_token(b, slot + j, slot + j, k.subspan((first + j) * te, te),
                         v.subspan((first + j) * te, te));
      }
    }
  };

  [[nodiscard]] config_error missing(kv_seq_id seq, const char* op) const {
    return config_error(std::string("hone::serve::kv_cache::") + op + ": sequence " +
                        std::to_string(seq) +
                        " does not exist (never made by add_sequence or fork, or already freed)");
  }
  [[nodiscard]] const sequence& find(kv_seq_id seq, const char* op) const {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) throw missing(seq, op);
    return it->second;
  }
  [[nodiscard]] sequence& find(kv_seq_id seq, const char* op) {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) throw missing(seq, op);
    return it->second;
  }
  static void check_pos(const sequence& s, kv_seq_id seq, std::size_t pos, const char* op) {
    if (pos >= s.length) {
      throw config_error(std::string("hone::serve::kv_cache::") + op + ": position " +
                         std::to_string(pos) + " is past the end of sequence " +
                         std::to_string(seq) + " (" + std::to_string(s.length) + " tokens)");
    }
  }

  [[nodiscard]] std::size_t needed(const sequence& s, std::size_t n) const {
    if (n == 0) return 0;
    const std::size_t bt = shape().block_tokens;
    const std::size_t blocks_now = (s.length + bt - 1) / bt;
    const std::size_t blocks_after = (s.length + n + bt - 1) / bt;
    const bool cow = s.length % bt != 0 && meta_[s.table.back()].refs > 1;
    return blocks_after - blocks_now + (cow ? 1 : 0);
  }

  // The chained hash of a full block: XXH3-128 (seeded with the salt) of the parent's hash and
  // the block's tokens, masked to hash_bits.
  [[nodiscard]] hash128 chain_hash(const hash128& parent, const kv_token* toks) const {
    const std::size_t bt = shape().block_tokens;
    std::memcpy(scratch_.data(), &parent.lo, 8);
    std::memcpy(scratch_.data() + 2, &parent.hi, 8);
    std::memcpy(scratch_.data() + 4, toks, bt * sizeof(kv_token));
    const XXH128_hash_t h =
        XXH3_128bits_withSeed(scratch_.data(), (4 + bt) * sizeof(kv_token), opt_.salt);
    hash128 r{h.low64, h.high64};
    if (opt_.hash_bits < 128) {
      if (opt_.hash_bits <= 64) {
        r.hi = 0;
        if (opt_.hash_bits < 64) r.lo &= (std::uint64_t{1} << opt_.hash_bits) - 1;
      } else {
        r.hi &= (std::uint64_t{1} << (opt_.hash_bits - 64)) - 1;
      }
    }
    return r;
  }

  // The registered block with hash `h`, parent `parent` and these tokens, or no_block.
  [[nodiscard]] kv_block_id find_registered(const hash128& h, kv_block_id parent,
                                            const kv_token* toks, bool count) const {
    const std::size_t bt = shape().block_tokens;
    auto [lo, hi] = table_.equal_range(h);
    for (auto it = lo; it != hi; ++it) {
      const kv_block_id b = it->second;
      if (meta_[b].parent == parent &&
          std::equal(toks, toks + bt, tokens_.data() + std::size_t(b) * bt)) {
        return b;
      }
      if (count) ++collisions_seen_;
    }
    return no_block;
  }

  // The registered chain of the longest cached prefix of `prompt`, into `table`.
  void match(std::span<const kv_token> prompt, std::vector<kv_block_id>& table) const {
    const std::size_t bt = shape().block_tokens;
    const std::size_t full = prompt.size() / bt;
    hash128 h{};
    kv_block_id parent = no_block;
    table.reserve(full);
    for (std::size_t i = 0; i < full; ++i) {
      const kv_token* toks = prompt.data() + i * bt;
      h = chain_hash(h, toks);
      const kv_block_id b = find_registered(h, parent, toks, true);
      if (b == no_block) break;
      table.push_back(b);
      parent = b;
    }
    stats_.hash_collisions += collisions_seen_;
    collisions_seen_ = 0;
  }

  // A new reference on a registered block found by a lookup.
  void acquire(kv_block_id b, bool hit) {
    block_meta& m = meta_[b];
    if (m.refs == 0) {
      evictable_.erase({m.key, m.tick, b});
      m.in_evictable = false;
    }
    ++m.refs;
    if (hit && m.hits < std::numeric_limits<std::uint32_t>::max()) ++m.hits;
  }

  void release(kv_block_id b) {
    block_meta& m = meta_[b];
    if (--m.refs != 0) return;
    if (m.registered) {
      m.tick = ++clock_;
      m.key = m.tick + opt_.frequency_ticks * std::min(m.hits, opt_.max_counted_hits);
      evictable_.insert({m.key, m.tick, b});
      m.in_evictable = true;
    } else {
      m = block_meta{};
      pool_.release(b);
    }
  }

  // Removes the first block in eviction order from the cache (the caller frees or reuses it).
  kv_block_id evict_one() {
    const auto first = evictable_.begin();
    const kv_block_id b = std::get<2>(*first);
    evictable_.erase(first);
    block_meta& m = meta_[b];
    auto [lo, hi] = table_.equal_range(hash128{m.hash_lo, m.hash_hi});
    for (auto it = lo; it != hi; ++it) {
      if (it->second == b) {
        table_.erase(it);
        break;
      }
    }
    m = block_meta{};
    ++stats_.evictions;
    return b;
  }

  // A block for writing: a free one, else the first evictable one. The caller checked that one
  // is available.
  kv_block_id take_block() {
    if (pool_.free_blocks() == 0) pool_.release(evict_one());
    const kv_block_id b = pool_.allocate();
    meta_[b] = block_meta{};
    meta_[b].refs = 1;
    return b;
  }

  // Block i of `s` has just become full: hash it, and register it when its chain is registered
  // (block i - 1 of this very sequence is the registered one) and no identical block is.
  void on_full(sequence& s, std::size_t i) {
    const std::size_t bt = shape().block_tokens;
    const kv_block_id b = s.table[i];
    block_meta& m = meta_[b];
    hash128 parent_hash{};
    kv_block_id parent = no_block;
    if (i > 0) {
      const block_meta& p = meta_[s.table[i - 1]];
      parent_hash = {p.hash_lo, p.hash_hi};
      parent = s.table[i - 1];
      if (!p.registered) parent = no_block;
    }
    const kv_token* toks = tokens_.data() + std::size_t(b) * bt;
    const hash128 h = chain_hash(parent_hash, toks);
    m.hash_lo = h.lo;
    m.hash_hi = h.hi;
    if (i > 0 && parent == no_block) return;                          // the chain is not registered
    if (find_registered(h, parent, toks, false) != no_block) return;  // an identical block is
    table_.emplace(h, b);
    m.registered = true;
    m.parent = parent;
  }

  pool_type pool_;
  kv_cache_options opt_;
  std::vector<block_meta> meta_;
  std::vector<kv_token> tokens_;  // [block][slot]
  std::unordered_multimap<hash128, kv_block_id, hash128_hasher> table_;
  std::set<std::tuple<std::uint64_t, std::uint64_t, kv_block_id>> evictable_;  // (key, tick, id)
  std::unordered_map<kv_seq_id, sequence> seqs_;
  std::unordered_map<kv_pin_id, std::vector<kv_block_id>> pins_;
  kv_seq_id next_seq_ = 1;
  kv_pin_id next_pin_ = 1;
  std::uint64_t clock_ = 0;
  mutable std::vector<kv_token> scratch_;  // parent hash (4 tokens' room) + one block's tokens
  mutable std::uint64_t collisions_seen_ = 0;
  mutable kv_cache_stats stats_;
};

}  // namespace serve
HONE_NAMESPACE_END
