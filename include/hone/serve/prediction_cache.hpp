// hone/serve/prediction_cache.hpp: hone::serve::prediction_cache, a thread-safe cache of a model's
// outputs keyed by a 128-bit hash of (model version, input bytes) and confirmed on every hit by
// comparing the stored version and input in full, so a hash collision can never serve another
// request's output. A RAM tier within a byte budget (CLOCK eviction, in shards with a lock each),
// a TTL, invalidation when the model's weights change version, and an optional disk tier
// (prediction_cache_disk.hpp) that takes the entries RAM evicts. hone::serve::cached_model puts
// the cache in front of a model served by the dynamic batcher. docs/serve.md, "Prediction cache".
#pragma once

#include <atomic>
#include <bit>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/io/hash.hpp"
#include "hone/serve/batcher.hpp"
#include "hone/serve/prediction_cache_disk.hpp"

HONE_NAMESPACE_BEGIN
namespace serve {

// ---------------------------------------------------------------------------------------------
// The key

/// The default hash policy: XXH3-128 of the input bytes with the model version as the seed, so
/// the key covers both in one pass over the input.
struct xxh3_prediction_hash {
  [[nodiscard]] prediction_key operator()(std::uint64_t version,
                                          std::span<const std::byte> input) const noexcept {
    const XXH128_hash_t h = XXH3_128bits_withSeed(input.data(), input.size(), version);
    return {h.low64, h.high64};
  }
};

/// A hash policy: `h(version, input)` on a const H returns a prediction_key.
template <class H>
concept prediction_hasher = std::copy_constructible<H> &&
    requires(const H& h, std::uint64_t version, std::span<const std::byte> input) {
  { h(version, input) } -> std::convertible_to<prediction_key>;
};

// ---------------------------------------------------------------------------------------------
// Outputs: how a cached output is counted against the budget and written to disk

/// prediction_codec<T>: `size(t)` bytes, `encode(t, out)` into exactly that many bytes and
/// `decode(bytes) -> std::optional<T>` (nullopt for bytes that cannot be a T). Given for trivially
/// copyable types, std::vector of them and std::string; specialize it for other outputs.
template <class T>
struct prediction_codec {};

template <class T>
requires std::is_trivially_copyable_v<T>
struct prediction_codec<T> {
  static std::size_t size(const T&) noexcept { return sizeof(T); }
  static void encode(const T& t, std::span<std::byte> out) noexcept {
    std::memcpy(out.data(), &t, sizeof(T));
  }
  static std::optional<T> decode(std::span<const std::byte> in) noexcept {
    if (in.size() != sizeof(T)) return std::nullopt;
    T t;
    std::memcpy(&t, in.data(), sizeof(T));
    return t;
  }
};

template <class T, class A>
requires std::is_trivially_copyable_v<T>
struct prediction_codec<std::vector<T, A>> {
  static std::size_t size(const std::vector<T, A>& v) noexcept { return v.size() * sizeof(T); }
  static void encode(const std::vector<T, A>& v, std::span<std::byte> out) noexcept {
    if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(T));
  }
  static std::optional<std::vector<T, A>> decode(std::span<const std::byte> in) {
    if (in.size() % sizeof(T) != 0) return std::nullopt;
    std::vector<T, A> v(in.size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), in.data(), in.size());
    return v;
  }
};

template <>
struct prediction_codec<std::string> {
  static std::size_t size(const std::string& s) noexcept { return s.size(); }
  static void encode(const std::string& s, std::span<std::byte> out) noexcept {
    if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  }
  static std::optional<std::string> decode(std::span<const std::byte> in) {
    return std::string(reinterpret_cast<const char*>(in.data()), in.size());
  }
};

/// An output the cache can hold: copy constructible, with a prediction_codec.
template <class T>
concept cacheable_output = std::copy_constructible<T> &&
    requires(const T& t, std::span<std::byte> out, std::span<const std::byte> in) {
  { prediction_codec<T>::size(t) } -> std::convertible_to<std::size_t>;
  prediction_codec<T>::encode(t, out);
  { prediction_codec<T>::decode(in) } -> std::same_as<std::optional<T>>;
};

/// static_assert(hone::serve::check_prediction_cache<Output, Hash>()): stops compilation with a
/// sentence naming what Output or Hash lacks to be used by hone::serve::prediction_cache.
template <class Output, class Hash = xxh3_prediction_hash>
consteval bool check_prediction_cache() {
  if constexpr (!prediction_hasher<Hash>) {
    static_assert(prediction_hasher<Hash>,
                  "hone::serve::prediction_cache: the hash policy must be copy constructible and "
                  "callable on a const object as h(std::uint64_t version, std::span<const "
                  "std::byte> input), returning a hone::serve::prediction_key; use the default, "
                  "hone::serve::xxh3_prediction_hash, unless a test needs another.");
    return false;
  } else if constexpr (!cacheable_output<Output>) {
    static_assert(cacheable_output<Output>,
                  "hone::serve::prediction_cache: the output type needs a copy constructor and a "
                  "hone::serve::prediction_codec<Output> with size(const Output&), "
                  "encode(const Output&, std::span<std::byte>) and decode(std::span<const "
                  "std::byte>) -> std::optional<Output>; one is given for trivially copyable "
                  "types, std::vector of them and std::string: specialize it for other outputs.");
    return false;
  } else {
    return true;
  }
}

// ---------------------------------------------------------------------------------------------
// Options and statistics

struct prediction_cache_options {
  std::size_t ram_budget_bytes = std::size_t{64} << 20;  // inputs + outputs + per-entry overhead
  std::size_t shards = 16;          // a power of two; the budget is split evenly between them
  std::chrono::nanoseconds ttl{0};  // 0: entries never expire
  std::uint64_t model_version = 0;  // the version of the weights at construction
  std::filesystem::path disk_directory{};                    // empty: no disk tier
  std::uint64_t disk_budget_bytes = std::uint64_t{1} << 30;  // the entry files' sizes, in all
  int zstd_level = 1;
};

struct prediction_cache_stats {
  std::uint64_t hits = 0;           // RAM hits and disk hits
  std::uint64_t misses = 0;         // lookups answered by neither tier
  std::uint64_t disk_hits = 0;      // hits read back from disk (promoted to RAM)
  std::uint64_t collisions = 0;     // key found, input (or version) different: a miss, never served
  std::uint64_t evictions = 0;      // RAM entries evicted for the budget
  std::uint64_t expired = 0;        // entries found past their TTL (RAM and disk), removed
  std::uint64_t stale = 0;          // RAM entries of an older model version, removed
  std::uint64_t damaged = 0;        // disk files damaged, truncated or foreign, removed
  std::uint64_t puts = 0;           // entries stored in RAM
  std::uint64_t rejected_puts = 0;  // put() of an old version, or of an entry over a shard's budget
  std::uint64_t disk_writes = 0;    // entries spilled to disk
  std::uint64_t disk_write_errors = 0;
  std::uint64_t disk_evictions = 0;
  std::uint64_t entries = 0;    // in RAM now
  std::uint64_t ram_bytes = 0;  // charged in RAM now
  std::uint64_t disk_files = 0;
  std::uint64_t disk_bytes = 0;
};

/// The bytes an entry is charged besides its input and encoded output (the entry, its index node
/// and its ring slot, rounded up).
inline constexpr std::size_t prediction_entry_overhead = 128;

// ---------------------------------------------------------------------------------------------
// The cache

/// Thread safety: every member function may be called from any thread at once.
/// Clock: std::chrono::steady_clock, or a test clock with the same interface.
template <class Output, class Hash = xxh3_prediction_hash, class Clock = std::chrono::steady_clock>
class prediction_cache {
  static_assert(check_prediction_cache<Output, Hash>());

 public:
  using output_type = Output;
  using codec = prediction_codec<Output>;
  using time_point = typename Clock::time_point;

  explicit prediction_cache(prediction_cache_options options = {}, Hash hash = {})
      : opt_(std::move(options)), hash_(std::move(hash)), version_(opt_.model_version) {
    HONE_REQUIRE(opt_.shards >= 1 && std::has_single_bit(opt_.shards),
                 "hone::serve::prediction_cache: shards is " + std::to_string(opt_.shards) +
                     "; it must be a power of two (1, 2, 4, ... ; 16 by default)");
    HONE_REQUIRE(opt_.ram_budget_bytes / opt_.shards >= prediction_entry_overhead,
                 "hone::serve::prediction_cache: ram_budget_bytes " +
                     std::to_string(opt_.ram_budget_bytes) + " leaves each of the " +
                     std::to_string(opt_.shards) + " shards less than one entry's overhead (" +
                     std::to_string(prediction_entry_overhead) +
                     " bytes); raise the budget or use fewer shards");
    HONE_REQUIRE(opt_.ttl.count() >= 0, "hone::serve::prediction_cache: ttl is negative (" +
                                            std::to_string(opt_.ttl.count()) +
                                            " ns); use 0 for entries that never expire");
    shard_budget_ = opt_.ram_budget_bytes / opt_.shards;
    shards_ = std::make_unique<shard[]>(opt_.shards);
    if (!opt_.disk_directory.empty()) {
      disk_ = std::make_unique<detail::prediction_disk_tier>(
          opt_.disk_directory, opt_.disk_budget_bytes, opt_.zstd_level);
    }
  }
  prediction_cache(const prediction_cache&) = delete;
  prediction_cache& operator=(const prediction_cache&) = delete;

  /// The version of the model's weights whose outputs are served.
  [[nodiscard]] std::uint64_t model_version() const noexcept {
    return version_.load(std::memory_order_acquire);
  }
  /// The weights changed: from now on only entries of `version` are served; entries of older
  /// versions are removed from RAM (and from disk where their version is known) and can never be
  /// served again. `version` must be larger than the current one (config_error otherwise).
  void set_model_version(std::uint64_t version) {
    {
      const std::lock_guard lock(version_mutex_);
      const std::uint64_t now = version_.load(std::memory_order_relaxed);
      HONE_REQUIRE(version > now, "hone::serve::prediction_cache::set_model_version: version " +
                                      std::to_string(version) + " is not newer than " +
                                      std::to_string(now) +
                                      "; versions only grow (use advance_model_version())");
      version_.store(version, std::memory_order_release);
    }
    for (std::size_t i = 0; i < opt_.shards; ++i) {
      shard& s = shards_[i];
      const std::lock_guard lock(s.mutex);
      for (std::size_t slot = 0; slot < s.ring.size(); ++slot) {
        if (s.ring[slot] && s.ring[slot]->version < version) {
          erase_locked(s, static_cast<std::uint32_t>(slot));
          ++s.stale;
        }
      }
    }
    if (disk_) disk_->drop_older(version);
  }
  /// set_model_version(model_version() + 1); returns the new version.
  std::uint64_t advance_model_version() {
    const std::lock_guard lock(advance_mutex_);
    const std::uint64_t v = model_version() + 1;
    set_model_version(v);
    return v;
  }

  /// The output cached for `input` at the current model version, or nullopt.
  [[nodiscard]] std::optional<Output> get(std::span<const std::byte> input) {
    return get(model_version(), input);
  }
  /// The output cached for `input` at `version`; nullopt unless `version` is the current one.
  [[nodiscard]] std::optional<Output> get(std::uint64_t version, std::span<const std::byte> input) {
    if (version != model_version()) return std::nullopt;
    const prediction_key key = hash_(version, input);
    shard& s = shard_of(key);
    const bool ttl = opt_.ttl.count() > 0;
    const time_point now = ttl ? Clock::now() : time_point{};
    {
      const std::lock_guard lock(s.mutex);
      if (const auto it = s.index.find(key); it != s.index.end()) {
        entry& e = *it->second;
        if (e.version < version) {
          erase_locked(s, e.slot);
          ++s.stale;
        } else if (e.version != version) {
          ++s.collisions;  // a newer version's entry under this key: never served for this one
        } else if (ttl && now >= e.expiry) {
          erase_locked(s, e.slot);
          ++s.expired;
        } else if (e.input.size() != input.size() ||
                   (!input.empty() &&
                    std::memcmp(e.input.data(), input.data(), input.size()) != 0)) {
          ++s.collisions;
        } else {
          e.referenced = true;
          ++s.hits;
          return e.output;
        }
      }
      ++s.misses;
    }
    if (!disk_) return std::nullopt;
    return get_from_disk(key, version, input, ttl, now);
  }

  /// Stores `output` for `input`, computed by the model at `version` (read with model_version()
  /// before the model ran). Returns false, storing nothing, when the version has changed since
  /// (an output of old weights is never stored as a new one) or when the entry is larger than a
  /// shard's budget. An entry already held for the same key is replaced (a different input under
  /// the same key counts as a collision). Entries evicted for room go to the disk tier, if any.
  bool put(std::uint64_t version, std::span<const std::byte> input, const Output& output) {
    const std::size_t out_bytes = codec::size(output);
    const std::size_t charge = input.size() + out_bytes + prediction_entry_overhead;
    const prediction_key key = hash_(version, input);
    shard& s = shard_of(key);
    if (version != model_version() || charge > shard_budget_) {
      const std::lock_guard lock(s.mutex);
      ++s.rejected;
      return false;
    }
    auto e = std::make_unique<entry>(entry{key, version, expiry_from(Clock::now()),
                                           std::vector<std::byte>(input.begin(), input.end()),
                                           output, charge, 0, false});
    entry* const fresh = e.get();
    std::vector<std::unique_ptr<entry>> spilled;
    {
      const std::lock_guard lock(s.mutex);
      std::uint32_t slot;
      if (const auto it = s.index.find(key); it != s.index.end()) {
        slot = it->second->slot;
        it->second = fresh;
        entry& old = *s.ring[slot];
        if (old.version == version &&
            (old.input.size() != input.size() ||
             std::memcmp(old.input.data(), input.data(), input.size()) != 0)) {
          ++s.collisions;
        }
        s.bytes -= old.charge;
        s.ring[slot] = std::move(e);
      } else {
        if (!s.free_slots.empty()) {
          slot = s.free_slots.back();
          s.free_slots.pop_back();
          s.ring[slot] = std::move(e);
        } else {
          slot = static_cast<std::uint32_t>(s.ring.size());
          s.ring.push_back(std::move(e));
        }
        s.index.emplace(key, fresh);
      }
      fresh->slot = slot;
      s.bytes += charge;
      ++s.puts;
      const std::uint64_t current = model_version();
      while (s.bytes > shard_budget_) {
        std::unique_ptr<entry> victim = evict_one_locked(s, slot);
        ++s.evictions;
        if (disk_ && victim->version == current) spilled.push_back(std::move(victim));
      }
    }
    if (!spilled.empty()) spill(std::move(spilled));
    return true;
  }

  /// The cached output for `input`, or `compute`'s, which is then cached at the model version read
  /// before it ran. `compute` may take that version (`compute(std::uint64_t version)`): a model
  /// whose version can change while requests run must compute with the version it is given, or
  /// an output of another version would be cached under this one. A `compute()` without it is for
  /// models whose version does not change concurrently.
  template <class F>
  requires std::convertible_to<std::invoke_result_t<F&, std::uint64_t>, Output> ||
      std::convertible_to<std::invoke_result_t<F&>, Output>
          Output get_or_compute(std::span<const std::byte> input, F&& compute) {
    const std::uint64_t version = model_version();
    if (auto hit = get(version, input)) return std::move(*hit);
    Output out = [&]() -> Output {
      if constexpr (std::is_invocable_v<F&, std::uint64_t>) {
        return compute(version);
      } else {
        return compute();
      }
    }();
    put(version, input, out);
    return out;
  }

  /// Removes every RAM entry (the disk tier keeps its files).
  void clear() {
    for (std::size_t i = 0; i < opt_.shards; ++i) {
      shard& s = shards_[i];
      const std::lock_guard lock(s.mutex);
      s.index.clear();
      s.ring.clear();
      s.free_slots.clear();
      s.hand = 0;
      s.bytes = 0;
    }
  }

  [[nodiscard]] prediction_cache_stats stats() const {
    prediction_cache_stats r;
    for (std::size_t i = 0; i < opt_.shards; ++i) {
      const shard& s = shards_[i];
      const std::lock_guard lock(s.mutex);
      r.hits += s.hits;
      r.misses += s.misses;
      r.collisions += s.collisions;
      r.evictions += s.evictions;
      r.expired += s.expired;
      r.stale += s.stale;
      r.puts += s.puts;
      r.rejected_puts += s.rejected;
      r.entries += s.index.size();
      r.ram_bytes += s.bytes;
    }
    if (disk_) {
      const detail::disk_counters d = disk_->counters();
      // A RAM miss answered from disk is a hit.
      r.hits += d.hits;
      r.misses -= d.hits;
      r.disk_hits = d.hits;
      r.collisions += d.collisions;
      r.expired += d.expired;
      r.damaged = d.damaged;
      r.disk_writes = d.writes;
      r.disk_write_errors = d.write_errors;
      r.disk_evictions = d.evictions;
      r.disk_files = d.files;
      r.disk_bytes = d.bytes;
    }
    return r;
  }

  [[nodiscard]] const prediction_cache_options& options() const noexcept { return opt_; }
  /// The file an entry of `key` has in the disk tier (tests, tools); empty without a disk tier.
  [[nodiscard]] std::filesystem::path disk_path(std::uint64_t version,
                                                std::span<const std::byte> input) const {
    return disk_ ? disk_->path_of(hash_(version, input)) : std::filesystem::path{};
  }

 private:
  struct entry {
    prediction_key key;
    std::uint64_t version;
    time_point expiry;
    std::vector<std::byte> input;
    Output output;
    std::size_t charge;
    std::uint32_t slot;  // its place in the shard's ring
    bool referenced;     // CLOCK's bit: set by a hit, cleared by the hand
  };
  struct alignas(64) shard {
    mutable std::mutex mutex;
    std::unordered_map<prediction_key, entry*, detail::prediction_key_hash> index;
    std::vector<std::unique_ptr<entry>> ring;  // CLOCK's circle; empty slots are reused
    std::vector<std::uint32_t> free_slots;
    std::size_t hand = 0;
    std::size_t bytes = 0;
    std::uint64_t hits = 0, misses = 0, collisions = 0, evictions = 0, expired = 0, stale = 0,
                  puts = 0, rejected = 0;
  };

  shard& shard_of(const prediction_key& key) noexcept {
    return shards_[static_cast<std::size_t>(key.hi) & (opt_.shards - 1)];
  }
  time_point expiry_from(time_point now) const noexcept {
    if (opt_.ttl.count() == 0) return time_point{};
    return now + std::chrono::duration_cast<typename Clock::duration>(opt_.ttl);
  }
  std::unique_ptr<entry> erase_locked(shard& s, std::uint32_t slot) {
    std::unique_ptr<entry> e = std::move(s.ring[slot]);
    s.index.erase(e->key);
    s.bytes -= e->charge;
    s.free_slots.push_back(slot);
    return e;
  }
  /// CLOCK: the hand passes over referenced entries, clearing their bit, and takes the first
  /// entry without it (never `keep`, the entry just stored). At most two turns.
  std::unique_ptr<entry> evict_one_locked(shard& s, std::uint32_t keep) {
    for (;;) {
      if (s.hand >= s.ring.size()) s.hand = 0;
      const auto slot = static_cast<std::uint32_t>(s.hand++);
      entry* e = s.ring[slot].get();
      if (e == nullptr || slot == keep) continue;
      if (e->referenced) {
        e->referenced = false;
        continue;
      }
      return erase_locked(s, slot);
    }
  }

  std::optional<Output> get_from_disk(const prediction_key& key, std::uint64_t version,
                                      std::span<const std::byte> input, bool ttl, time_point now) {
    std::vector<std::byte> bytes;
    const std::int64_t ttl_ticks =
        std::chrono::duration_cast<typename Clock::duration>(opt_.ttl).count();
    const detail::disk_outcome r = disk_->load(
        key, version, input, ttl, static_cast<std::int64_t>(now.time_since_epoch().count()),
        static_cast<std::int64_t>(ttl_ticks), bytes);
    if (r != detail::disk_outcome::hit) return std::nullopt;
    std::optional<Output> out = codec::decode(bytes);
    if (!out) {  // checksummed but undecodable: another output type's file
      disk_->hit_was_damaged();
      return std::nullopt;
    }
    put(version, input, *out);  // back to RAM (the file is gone)
    return out;
  }

  void spill(std::vector<std::unique_ptr<entry>> victims) {
    std::vector<std::byte> buf;
    for (const auto& v : victims) {
      buf.resize(codec::size(v->output));
      codec::encode(v->output, buf);
      const std::int64_t expiry =
          opt_.ttl.count() == 0 ? 0
                                : static_cast<std::int64_t>(v->expiry.time_since_epoch().count());
      disk_->store(v->key, v->version, expiry, v->input, buf);
    }
  }

  prediction_cache_options opt_;
  Hash hash_;
  std::atomic<std::uint64_t> version_;
  std::mutex version_mutex_;
  std::mutex advance_mutex_;
  std::size_t shard_budget_ = 0;
  std::unique_ptr<shard[]> shards_;
  std::unique_ptr<detail::prediction_disk_tier> disk_;
};

// ---------------------------------------------------------------------------------------------
// In front of a model served by the dynamic batcher

/// A batch model that answers from `cache` the requests it holds and runs `model` on the others
/// only (one smaller batch; none when all are cached), storing their outputs. `bytes(request)`
/// gives a request's input bytes (a std::span<const std::byte>, or something convertible).
/// Serve it with dynamic_batcher<cached_model<...>, Request>. Requests are copied for the model's
/// batch of misses. Clients that want a hit without queueing can also call cache.get() before
/// submit() (docs/serve.md).
template <class Model, class Request, class Bytes, class Hash = xxh3_prediction_hash,
          class Clock = std::chrono::steady_clock>
requires batch_model<Model, Request> && std::copy_constructible<Request>
class cached_model {
 public:
  using output_type = response_t<Model, Request>;
  using cache_type = prediction_cache<output_type, Hash, Clock>;

  cached_model(Model& model, cache_type& cache, Bytes bytes)
      : model_(&model), cache_(&cache), bytes_(std::move(bytes)) {}

  std::vector<output_type> infer(std::span<const Request> batch) {
    const std::uint64_t version = cache_->model_version();
    std::vector<std::optional<output_type>> found(batch.size());
    std::vector<Request> misses;
    std::vector<std::size_t> where;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      found[i] = cache_->get(version, to_bytes(batch[i]));
      if (!found[i]) {
        misses.push_back(batch[i]);
        where.push_back(i);
      }
    }
    if (!misses.empty()) {
      auto outs = model_->infer(std::span<const Request>(misses));
      if (std::ranges::size(outs) != misses.size()) {
        throw error("hone::serve::cached_model: the model returned " +
                    std::to_string(std::ranges::size(outs)) + " outputs for a batch of " +
                    std::to_string(misses.size()) + " requests; infer must return one per request");
      }
      std::size_t j = 0;
      for (auto&& o : outs) {
        cache_->put(version, to_bytes(misses[j]), o);
        found[where[j++]].emplace(std::forward<decltype(o)>(o));
      }
    }
    std::vector<output_type> result;
    result.reserve(batch.size());
    for (auto& f : found) result.push_back(std::move(*f));
    return result;
  }

 private:
  std::span<const std::byte> to_bytes(const Request& r) {
    return std::span<const std::byte>(bytes_(r));
  }
  Model* model_;
  cache_type* cache_;
  Bytes bytes_;
};

}  // namespace serve
HONE_NAMESPACE_END
