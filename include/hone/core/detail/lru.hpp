// hone/core/detail/lru.hpp: the one least-recently-used map of the library, shared by the RL state
// cache (hone/rl/state_cache.hpp) and the data module's feature cache
// (hone/data/feature_cache.hpp).
//
// lru_map<Key, Value> keeps its entries in recency order (most recent first) and an index from key
// to entry, and counts each entry's size in bytes as its owner measured it. It decides nothing: the
// caller asks for the least recent entry (lru()) and takes it out (pop_lru()) for as long as its
// own limits say so, which lets a caller evict by entries, by bytes or both, and keep (spill) what
// it evicts. Not thread-safe: callers that share one put it under their own lock.
//
//   hone::detail::lru_map<int, std::string> m;
//   m.insert(1, "a", 1);
//   m.insert(2, "b", 1);
//   m.touch(1);                          // 1 is now the most recent
//   auto e = m.pop_lru();                // e.key == 2
#pragma once

#include <cstddef>
#include <functional>
#include <iterator>
#include <list>
#include <unordered_map>
#include <utility>

#include "hone/core/config.hpp"

HONE_NAMESPACE_BEGIN
namespace detail {

/// A map in recency order with a byte count per entry. References to values stay valid until the
/// entry is replaced, erased or popped (std::list nodes do not move).
template <class Key, class Value, class Hash = std::hash<Key>, class Eq = std::equal_to<Key>>
class lru_map {
 public:
  struct entry {
    Key key;
    Value value;
    std::size_t bytes;
  };

  lru_map() = default;
  explicit lru_map(Hash hash, Eq eq = {}) : index_(0, std::move(hash), std::move(eq)) {}

  /// The value of `key` made the most recent entry, or nullptr.
  Value* touch(const Key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->value;
  }
  /// The value of `key` or nullptr, recency unchanged.
  [[nodiscard]] Value* peek(const Key& key) {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &it->second->value;
  }
  [[nodiscard]] const Value* peek(const Key& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &it->second->value;
  }
  [[nodiscard]] bool contains(const Key& key) const { return index_.contains(key); }

  /// Stores `value` (of `bytes` bytes) as the most recent entry, replacing `key`'s entry if any.
  Value& insert(Key key, Value value, std::size_t bytes) {
    if (auto it = index_.find(key); it != index_.end()) {
      bytes_ -= it->second->bytes;
      order_.erase(it->second);
      index_.erase(it);
    }
    order_.push_front(entry{key, std::move(value), bytes});
    try {
      index_.emplace(std::move(key), order_.begin());
    } catch (...) {
      order_.pop_front();
      throw;
    }
    bytes_ += bytes;
    return order_.front().value;
  }

  /// Removes `key`'s entry; false when there is none.
  bool erase(const Key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    bytes_ -= it->second->bytes;
    order_.erase(it->second);
    index_.erase(it);
    return true;
  }

  /// The least recent entry (the map must not be empty).
  [[nodiscard]] const entry& lru() const { return order_.back(); }
  /// Takes the least recent entry out and returns it (the map must not be empty).
  entry pop_lru() {
    auto last = std::prev(order_.end());
    index_.erase(last->key);
    entry out = std::move(*last);
    order_.erase(last);
    bytes_ -= out.bytes;
    return out;
  }

  /// Calls f(const entry&) from the most recent entry to the least recent.
  template <class F>
  void for_each(F&& f) const {
    for (const entry& e : order_) f(e);
  }

  void clear() noexcept {
    order_.clear();
    index_.clear();
    bytes_ = 0;
  }
  [[nodiscard]] std::size_t size() const noexcept { return index_.size(); }
  [[nodiscard]] bool empty() const noexcept { return index_.empty(); }
  /// The sum of the entries' bytes.
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  using iterator = typename std::list<entry>::iterator;
  std::list<entry> order_;  // most recent first
  std::unordered_map<Key, iterator, Hash, Eq> index_;
  std::size_t bytes_ = 0;
};

}  // namespace detail
HONE_NAMESPACE_END
