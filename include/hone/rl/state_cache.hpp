// hone/rl/state_cache.hpp: memoization of an expensive state featurization (a feature extractor,
// a tokenizer, a board encoder) with bounded memory: least-recently-used entries are evicted once
// the cache holds more than max_entries entries or more than max_bytes bytes (as measured by a
// size function, sizeof(Value) by default). hits(), misses(), evictions() and hit_rate() report
// how well it works.
//
// state_cache<Key, Value>: single-threaded. get_or_compute(key, f) returns a reference valid
// until the next mutating call.
// concurrent_state_cache<Key, Value>: shards (each an LRU under its own mutex) picked by the key's
// hash; get_or_compute returns std::shared_ptr<const Value> (valid after eviction) and runs f
// outside the lock, so two threads missing the same key may both compute it (the second result
// is dropped; both count as misses).
//
// The LRU itself is hone::detail::lru_map (hone/core/detail/lru.hpp), the one LRU of the library,
// which the data module's feature cache (hone/data/feature_cache.hpp, a RAM tier within a byte
// budget that spills to a zstd disk tier) is built on too.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/detail/lru.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN

struct state_cache_limits {
  std::size_t max_entries = 4096;  ///< 0: no entry bound
  std::size_t max_bytes = 0;       ///< 0: no byte bound
};

struct state_cache_stats {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t evictions = 0;
  std::size_t entries = 0;
  std::size_t bytes = 0;
  [[nodiscard]] double hit_rate() const noexcept {
    const std::uint64_t n = hits + misses;
    return n == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(n);
  }
};

namespace detail {
template <class Value>
struct sizeof_value {
  std::size_t operator()(const Value&) const noexcept { return sizeof(Value); }
};
}  // namespace detail

/// A bounded LRU memo of Key -> Value (single-threaded).
template <class Key, class Value, class Hash = std::hash<Key>, class Eq = std::equal_to<Key>,
          class SizeOf = detail::sizeof_value<Value>>
class state_cache {
 public:
  explicit state_cache(state_cache_limits limits = {}, SizeOf size_of = {})
      : limits_(limits), size_of_(std::move(size_of)) {
    HONE_REQUIRE(limits.max_entries > 0 || limits.max_bytes > 0,
                 "hone::state_cache: give max_entries or max_bytes");
  }

  /// The cached value of `key`, computing f(key) on a miss.
  template <class F>
  const Value& get_or_compute(const Key& key, F&& f) {
    if (const Value* v = find(key)) return *v;
    return insert(key, std::forward<F>(f)(key));
  }

  /// The cached value (nullptr on a miss); counts a hit or a miss and refreshes recency.
  const Value* find(const Key& key) {
    const Value* v = lru_.touch(key);
    ++(v != nullptr ? stats_.hits : stats_.misses);
    return v;
  }

  /// Stores (or replaces) key's value as the most recent entry, then evicts to the limits. The
  /// new entry itself is kept even when it alone exceeds max_bytes.
  const Value& insert(const Key& key, Value value) {
    const std::size_t b = size_of_(value);
    Value& stored = lru_.insert(key, std::move(value), b);
    while (lru_.size() > 1 && over_limits()) {
      lru_.pop_lru();
      ++stats_.evictions;
    }
    sync_sizes();
    return stored;
  }

  /// Whether `key` is cached (no statistics, no recency change).
  [[nodiscard]] bool contains(const Key& key) const { return lru_.contains(key); }
  /// The cached value or nullptr, without statistics or recency change.
  [[nodiscard]] const Value* peek(const Key& key) const { return lru_.peek(key); }
  void clear() {
    lru_.clear();
    sync_sizes();
  }
  void reset_stats() noexcept { stats_.hits = stats_.misses = stats_.evictions = 0; }

  [[nodiscard]] const state_cache_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] std::uint64_t hits() const noexcept { return stats_.hits; }
  [[nodiscard]] std::uint64_t misses() const noexcept { return stats_.misses; }
  [[nodiscard]] std::uint64_t evictions() const noexcept { return stats_.evictions; }
  [[nodiscard]] double hit_rate() const noexcept { return stats_.hit_rate(); }
  [[nodiscard]] std::size_t size() const noexcept { return stats_.entries; }
  [[nodiscard]] std::size_t bytes() const noexcept { return stats_.bytes; }
  [[nodiscard]] const state_cache_limits& limits() const noexcept { return limits_; }

 private:
  [[nodiscard]] bool over_limits() const noexcept {
    return (limits_.max_entries > 0 && lru_.size() > limits_.max_entries) ||
           (limits_.max_bytes > 0 && lru_.bytes() > limits_.max_bytes);
  }
  void sync_sizes() noexcept {
    stats_.entries = lru_.size();
    stats_.bytes = lru_.bytes();
  }

  state_cache_limits limits_;
  SizeOf size_of_;
  detail::lru_map<Key, Value, Hash, Eq> lru_;  // the LRU core shared with data::feature_cache
  state_cache_stats stats_;
};

/// A thread-safe state_cache: `shards` LRUs under their own mutexes (the limits are split evenly).
template <class Key, class Value, class Hash = std::hash<Key>, class Eq = std::equal_to<Key>,
          class SizeOf = detail::sizeof_value<Value>>
class concurrent_state_cache {
  struct shared_size {
    SizeOf inner;
    std::size_t operator()(const std::shared_ptr<const Value>& v) const { return inner(*v); }
  };
  using shard_cache = state_cache<Key, std::shared_ptr<const Value>, Hash, Eq, shared_size>;

 public:
  explicit concurrent_state_cache(state_cache_limits limits = {}, std::size_t shards = 16,
                                  SizeOf size_of = {}, Hash hash = {})
      : hash_(std::move(hash)) {
    HONE_REQUIRE(shards > 0, "hone::concurrent_state_cache: at least one shard");
    state_cache_limits per{
        limits.max_entries == 0 ? 0 : std::max<std::size_t>(1, limits.max_entries / shards),
        limits.max_bytes == 0 ? 0 : std::max<std::size_t>(1, limits.max_bytes / shards)};
    shards_.reserve(shards);
    for (std::size_t i = 0; i < shards; ++i) {
      shards_.push_back(std::make_unique<shard>(per, shared_size{size_of}));
    }
  }

  /// The cached value of `key`, computing f(key) (outside any lock) on a miss.
  template <class F>
  std::shared_ptr<const Value> get_or_compute(const Key& key, F&& f) {
    shard& s = shard_for(key);
    {
      std::lock_guard lock(s.mutex);
      if (const auto* v = s.cache.find(key)) return *v;
    }
    auto value = std::make_shared<const Value>(std::forward<F>(f)(key));
    std::lock_guard lock(s.mutex);
    // Another thread may have computed it meanwhile: keep the cached one.
    if (const auto* v = s.cache.peek(key)) return *v;
    return s.cache.insert(key, std::move(value));
  }

  /// Statistics summed over the shards.
  [[nodiscard]] state_cache_stats stats() const {
    state_cache_stats t;
    for (const auto& s : shards_) {
      std::lock_guard lock(s->mutex);
      const auto& x = s->cache.stats();
      t.hits += x.hits;
      t.misses += x.misses;
      t.evictions += x.evictions;
      t.entries += x.entries;
      t.bytes += x.bytes;
    }
    return t;
  }
  [[nodiscard]] double hit_rate() const { return stats().hit_rate(); }

 private:
  struct shard {
    shard(state_cache_limits l, shared_size s) : cache(l, std::move(s)) {}
    mutable std::mutex mutex;
    shard_cache cache;
  };
  shard& shard_for(const Key& key) { return *shards_[hash_(key) % shards_.size()]; }

  Hash hash_;
  std::vector<std::unique_ptr<shard>> shards_;
};

HONE_NAMESPACE_END
