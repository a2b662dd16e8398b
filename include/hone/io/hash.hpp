// hone/io/hash.hpp: the content hashes of the files hone writes. XXH3-128 (xxHash 0.8) for whole
// files (a checkpoint's MANIFEST, a saved replay buffer's), XXH3-64 for small records (the chunks
// of compressed tensor files, the header of a memory-mapped replay ring, a field layout).
//
// Why XXH3 and not SHA-256: these hashes guard against corruption (torn writes, bit rot,
// truncated copies), not against an adversary who forges files, and they are computed on every
// save and every load. XXH3 runs at ~20-30 GB/s on one core; a software SHA-256 runs at ~0.5 GB/s,
// which would dominate the save time of a 1 GB checkpoint (2 s of hashing against ~0.5 s of
// writing). The digests printed here are xxHash's canonical (big-endian) form, the same text
// `xxh128sum` prints, so a MANIFEST line can be checked with stock tools.
//
// xxHash is used header-only (XXH_INLINE_ALL): nothing to link, and the functions inline into
// hone's loops. It comes from the distribution (Debian: libxxhash-dev; vcpkg: xxhash; Conan:
// xxhash), found by cmake/FindxxHash.cmake.
#pragma once

#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

#include "hone/core/config.hpp"

#if !defined(XXH_INLINE_ALL)
#define XXH_INLINE_ALL
#define HONE_UNDEF_XXH_INLINE_ALL
#endif
// GCC 12 with AVX-512 enabled (-march=native) reports -Wmaybe-uninitialized false positives
// inside xxhash.h's XXH3 AVX-512 code (_mm512_undefined_epi32); silence them for that header only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <xxhash.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#if defined(HONE_UNDEF_XXH_INLINE_ALL)
#undef XXH_INLINE_ALL
#undef HONE_UNDEF_XXH_INLINE_ALL
#endif

#if XXH_VERSION_NUMBER < 800
#error "hone needs xxHash 0.8 or newer (XXH3-128 is stable since 0.8.0)"
#endif

HONE_NAMESPACE_BEGIN
namespace io {

namespace detail {
inline constexpr char hex_digits[] = "0123456789abcdef";

/// Value of a lowercase hexadecimal digit, or -1. Uppercase is rejected: a MANIFEST has one
/// spelling per digest, so two files that differ only in case cannot both be valid.
constexpr int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}
}  // namespace detail

/// A 128-bit XXH3 digest in canonical (big-endian) byte order.
struct digest128 {
  std::array<std::uint8_t, 16> bytes{};

  /// 32 lowercase hexadecimal digits, as `xxh128sum` prints them.
  [[nodiscard]] std::string hex() const {
    std::string s(32, '0');
    for (std::size_t i = 0; i < 16; ++i) {
      s[2 * i] = detail::hex_digits[bytes[i] >> 4];
      s[2 * i + 1] = detail::hex_digits[bytes[i] & 0xf];
    }
    return s;
  }
  /// Parses exactly 32 lowercase hexadecimal digits; nullopt for anything else.
  [[nodiscard]] static std::optional<digest128> from_hex(std::string_view text) noexcept {
    if (text.size() != 32) return std::nullopt;
    digest128 d;
    for (std::size_t i = 0; i < 16; ++i) {
      const int hi = detail::hex_value(text[2 * i]);
      const int lo = detail::hex_value(text[2 * i + 1]);
      if (hi < 0 || lo < 0) return std::nullopt;
      d.bytes[i] = static_cast<std::uint8_t>(hi * 16 + lo);
    }
    return d;
  }
  friend bool operator==(const digest128&, const digest128&) = default;
};

/// Streaming XXH3-128: update() any number of times, digest() at any point.
class hasher {
 public:
  hasher() noexcept { reset(); }
  void reset() noexcept { XXH3_128bits_reset(&state_); }
  void update(std::span<const std::byte> bytes) noexcept {
    if (!bytes.empty()) XXH3_128bits_update(&state_, bytes.data(), bytes.size());
  }
  [[nodiscard]] digest128 digest() const noexcept {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(&state_));
    digest128 d;
    for (std::size_t i = 0; i < 16; ++i) d.bytes[i] = canonical.digest[i];
    return d;
  }

 private:
  XXH3_state_t state_;
};

/// XXH3-128 of a stream hashed on a thread of its own, behind the caller that writes the stream: a
/// file writer hands each span to add() after writing it, and the hash of everything up to that
/// span is formed while the next one is written, so the hash costs the writer no time when a
/// second core is free (the same digest as hasher, bit for bit). add() borrows the span until it
/// is hashed: it must stay alive and unchanged until digest() returns. add_now() hashes a span the
/// caller is about to reuse (a staging buffer, a header string) on the calling thread, once the
/// spans before it are done. Without a thread to run on (hardware_concurrency() < 2, or the thread
/// cannot be started), every span is hashed inside add(). Not thread-safe: one writer calls it.
class background_hasher {
 public:
  background_hasher() {
    if (std::thread::hardware_concurrency() < 2) return;
    try {
      worker_ = std::thread([this] { run(); });
    } catch (const std::system_error&) {  // no thread: hash inline
    }
  }
  background_hasher(const background_hasher&) = delete;
  background_hasher& operator=(const background_hasher&) = delete;
  ~background_hasher() { stop(); }

  /// Queues `bytes` (borrowed until digest() returns) to be hashed after the spans before it.
  void add(std::span<const std::byte> bytes) {
    if (bytes.empty()) return;
    if (!worker_.joinable()) {
      state_.update(bytes);
      return;
    }
    {
      const std::lock_guard lock(mutex_);
      queue_.push_back(bytes);
    }
    ready_.notify_one();
  }
  /// Hashes `bytes` now, on the calling thread, after every span queued before it.
  void add_now(std::span<const std::byte> bytes) {
    if (bytes.empty()) return;
    drain();
    state_.update(bytes);
  }
  /// The digest of everything added (waits for the queued spans; the hasher stays usable).
  [[nodiscard]] digest128 digest() {
    drain();
    return state_.digest();
  }

 private:
  // Waits until the worker has hashed every queued span and is idle again. The mutex orders the
  // worker's updates of state_ before the caller's next use of it.
  void drain() {
    if (!worker_.joinable()) return;
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }
  void stop() noexcept {
    if (!worker_.joinable()) return;
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_one();
    worker_.join();
  }
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      const std::span<const std::byte> next = queue_.front();
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      state_.update(next);
      lock.lock();
      busy_ = false;
      if (queue_.empty()) idle_.notify_all();
    }
  }

  hasher state_;
  std::mutex mutex_;
  std::condition_variable ready_;  // the worker: a span was queued, or stop
  std::condition_variable idle_;   // the writer: the queue is empty and the worker idle
  std::deque<std::span<const std::byte>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::thread worker_;  // last: started once the members above exist
};

/// XXH3-128 of `bytes` in one call.
[[nodiscard]] inline digest128 hash128(std::span<const std::byte> bytes) noexcept {
  hasher h;
  h.update(bytes);
  return h.digest();
}

/// XXH3-64 of `bytes` (seed 0).
[[nodiscard]] inline std::uint64_t hash64(std::span<const std::byte> bytes) noexcept {
  return XXH3_64bits(bytes.data(), bytes.size());
}

/// 16 lowercase hexadecimal digits of a 64-bit hash, most significant first (`xxh64sum -H3`).
[[nodiscard]] inline std::string hex64(std::uint64_t h) {
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i) {
    s[static_cast<std::size_t>(i)] = detail::hex_digits[h & 0xf];
    h >>= 4;
  }
  return s;
}

/// Parses exactly 16 lowercase hexadecimal digits; nullopt for anything else.
[[nodiscard]] inline std::optional<std::uint64_t> parse_hex64(std::string_view text) noexcept {
  if (text.size() != 16) return std::nullopt;
  std::uint64_t h = 0;
  for (char c : text) {
    const int v = detail::hex_value(c);
    if (v < 0) return std::nullopt;
    h = (h << 4) | static_cast<std::uint64_t>(v);
  }
  return h;
}

}  // namespace io
HONE_NAMESPACE_END
