// hone/rl/frame_store.hpp: replay storage for image observations (Atari: 84x84 uint8 frames,
// stacks of the last k = 4) that keeps every frame once.
//
// Storing obs and next_obs as 4-stacks costs 8 frames (56 KB) per transition; consecutive stacks
// share 3 of their 4 frames and next_obs of step t is obs of step t + 1. So this store keeps one
// frame per environment step in a ring of frames (the layout of Dopamine's circular replay buffer)
// and assembles stacks when a batch is sampled: about 7.07 KB per transition uncompressed (one
// 7,056-byte frame + 12 bytes of metadata), plus one extra frame per episode (its reset frame).
//
// Recording: begin_episode(reset_frame), then add_step(action, reward, terminal, next_frame) per
// step. Frame sequence numbers (ids) count every frame ever pushed; frame id lives in slot
// id % capacity. The transition "from frame id" is (stack(id), action, reward, terminal,
// stack(id + 1)); it exists when add_step followed frame id in the same episode. An episode cut
// short (time limit) is simply followed by begin_episode: its last frame has no transition.
//
// Episode starts: stack(id) holds frames id-k+1 .. id; the ones before the episode's first frame
// are padding. frame_padding::zeros (the default) fills them with zero bytes, as Dopamine
// (`_add_zero_transition` pads each episode with k-1 zero frames) and Stable-Baselines3
// (VecFrameStack zeroes its stack on reset) do; frame_padding::repeat_first repeats the episode's
// first frame, as OpenAI baselines' FrameStack wrapper and Gymnasium's FrameStackObservation
// (padding_type="reset", its default) do. Choose the convention of the wrapper your agent acts
// with: the stacks it learns from must look like the ones it acts on.
//
// Overwriting: once `capacity` frames are stored, each new frame replaces the oldest. A transition
// is sampleable only while all the frames its two stacks need are live (sampleable(id)); the few
// whose history was just overwritten are skipped by sample_id().
//
// Compression (options.compress): each frame is one zstd frame (level options.zstd_level, 1 by
// default) in its own allocation; a frame that does not shrink is kept raw. compression_ratio()
// reports raw frame bytes / stored frame bytes over the live frames. Sampling decompresses with a
// per-thread context.
//
// Threads: one writer; const members (stack, gather, sample_id with the caller's generator) may
// run concurrently with each other, not with begin_episode/add_step.
#pragma once

#include <zstd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN

/// What fills the frames of a stack that lie before its episode's first frame.
enum class frame_padding {
  zeros,         ///< zero bytes (Dopamine, Stable-Baselines3 VecFrameStack)
  repeat_first,  ///< the episode's first frame (baselines FrameStack, Gymnasium
                 ///< FrameStackObservation)
};

struct frame_store_options {
  std::size_t stack = 4;  ///< frames per stacked observation (1..256)
  frame_padding padding = frame_padding::zeros;
  bool compress = false;  ///< zstd each frame
  int zstd_level = 1;
};

/// The metadata kept per frame (12 bytes).
struct frame_meta {
  std::int32_t action = 0;  ///< action taken from this frame (valid with has_transition)
  float reward = 0.0f;
  std::uint8_t flags = 0;
  std::uint8_t age = 0;  ///< frames since the episode's first frame, saturated at 255
  static constexpr std::uint8_t episode_start = 1;
  static constexpr std::uint8_t has_transition = 2;
  static constexpr std::uint8_t terminal = 4;
  static constexpr std::uint8_t raw = 8;  ///< stored uncompressed (compress mode)
};

class frame_store {
 public:
  frame_store(std::size_t capacity, std::size_t frame_bytes, frame_store_options options = {})
      : capacity_(capacity), frame_bytes_(frame_bytes), options_(options), meta_(capacity) {
    HONE_REQUIRE(capacity >= 2, "hone::frame_store: the capacity must be at least 2 frames");
    HONE_REQUIRE(frame_bytes > 0, "hone::frame_store: the frame size must be positive");
    HONE_REQUIRE(options.stack >= 1 && options.stack <= 256,
                 "hone::frame_store: the stack size must be in [1, 256]");
    HONE_REQUIRE(options.stack < capacity, "hone::frame_store: the capacity must exceed the stack");
    if (options_.compress) {
      blobs_.resize(capacity);
      blob_size_.assign(capacity, 0);
      cctx_.reset(ZSTD_createCCtx());
      if (!cctx_) throw allocation_error("hone::frame_store: ZSTD_createCCtx failed", 0);
      scratch_.resize(ZSTD_compressBound(frame_bytes));
    } else {
      pixels_ = std::make_unique_for_overwrite<std::uint8_t[]>(capacity * frame_bytes);
    }
  }

  /// Stores an episode's first (reset) frame; returns its id.
  std::uint64_t begin_episode(std::span<const std::uint8_t> frame) {
    const std::uint64_t id = push_frame(frame, frame_meta::episode_start, 0);
    in_episode_ = true;
    return id;
  }

  /// Records a step from the last frame: `action` taken, `reward` received, `terminal` reached,
  /// `next_frame` observed. Returns the id of next_frame.
  std::uint64_t add_step(std::int32_t action, float reward, bool terminal,
                         std::span<const std::uint8_t> next_frame) {
    HONE_REQUIRE(
        in_episode_,
        "hone::frame_store::add_step: call begin_episode first (and after a terminal step)");
    const std::uint64_t prev = end_ - 1;
    frame_meta& m = meta_[slot(prev)];
    m.action = action;
    m.reward = reward;
    m.flags = static_cast<std::uint8_t>(m.flags | frame_meta::has_transition |
                                        (terminal ? frame_meta::terminal : 0));
    ++transitions_;
    const std::uint8_t age =
        m.age == 255 ? std::uint8_t{255} : static_cast<std::uint8_t>(m.age + 1);
    const std::uint64_t id = push_frame(next_frame, 0, age);
    if (terminal) in_episode_ = false;
    return id;
  }

  /// Whether the transition from frame `id` exists and all frames of its two stacks are live.
  [[nodiscard]] bool sampleable(std::uint64_t id) const noexcept {
    if (id < oldest() || id + 1 >= end_) return false;
    const frame_meta& m = meta_[slot(id)];
    if ((m.flags & frame_meta::has_transition) == 0) return false;
    const std::uint64_t back = std::min<std::uint64_t>(m.age, options_.stack - 1);
    return id - back >= oldest();
  }

  /// A uniformly drawn sampleable id (rejection over the live frames; config_error when none).
  /// `rng` is any uniform random bit generator.
  template <class URBG>
  [[nodiscard]] std::uint64_t sample_id(URBG& rng) const {
    HONE_REQUIRE(transitions_ > 0, "hone::frame_store::sample_id: the store holds no transition");
    std::uniform_int_distribution<std::uint64_t> pick(oldest(), end_ - 1);
    for (int attempt = 0; attempt < 1 << 20; ++attempt) {
      const std::uint64_t id = pick(rng);
      if (sampleable(id)) return id;
    }
    throw config_error("hone::frame_store::sample_id: no sampleable transition found");
  }

  /// Writes the k-stack ending at frame `id` into `out` (stack() * frame_bytes() bytes, oldest
  /// frame first), padding before the episode start. `id` must be live with its history.
  void stack(std::uint64_t id, std::span<std::uint8_t> out) const {
    HONE_REQUIRE(out.size() == options_.stack * frame_bytes_,
                 "hone::frame_store::stack: the output must be stack() * frame_bytes() bytes");
    HONE_REQUIRE(id >= oldest() && id < end_, "hone::frame_store::stack: frame id is not live");
    const std::size_t k = options_.stack;
    const std::uint64_t age = meta_[slot(id)].age;
    const std::uint64_t first = id - std::min<std::uint64_t>(age, k - 1);
    HONE_REQUIRE(first >= oldest(),
                 "hone::frame_store::stack: the stack's history was overwritten");
    for (std::size_t j = 0; j < k; ++j) {
      const std::uint64_t back = k - 1 - j;
      std::uint8_t* dst = out.data() + j * frame_bytes_;
      if (back <= age) {
        read_frame(id - back, dst);
      } else if (options_.padding == frame_padding::zeros) {
        std::memset(dst, 0, frame_bytes_);
      } else {
        read_frame(first, dst);  // age < k - 1 here, so `first` is the episode's first frame
      }
    }
  }

  /// The transition from frame `id` (sampleable(id) must hold).
  [[nodiscard]] const frame_meta& meta(std::uint64_t id) const noexcept { return meta_[slot(id)]; }

  /// Gathers a batch: obs and next_obs are [ids.size()][stack][frame_bytes], the others
  /// [ids.size()]. Every id must be sampleable (config_error otherwise).
  void gather(std::span<const std::uint64_t> ids, std::span<std::uint8_t> obs,
              std::span<std::uint8_t> next_obs, std::span<std::int32_t> actions,
              std::span<float> rewards, std::span<std::uint8_t> terminals) const {
    const std::size_t sb = options_.stack * frame_bytes_;
    HONE_REQUIRE(obs.size() == ids.size() * sb && next_obs.size() == ids.size() * sb &&
                     actions.size() == ids.size() && rewards.size() == ids.size() &&
                     terminals.size() == ids.size(),
                 "hone::frame_store::gather: output sizes do not match the batch");
    for (std::size_t i = 0; i < ids.size(); ++i) {
      HONE_REQUIRE(sampleable(ids[i]), "hone::frame_store::gather: id " + std::to_string(ids[i]) +
                                           " is not a sampleable transition");
      const frame_meta& m = meta_[slot(ids[i])];
      stack(ids[i], obs.subspan(i * sb, sb));
      stack(ids[i] + 1, next_obs.subspan(i * sb, sb));
      actions[i] = m.action;
      rewards[i] = m.reward;
      terminals[i] = (m.flags & frame_meta::terminal) != 0 ? 1 : 0;
    }
  }

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t frame_bytes() const noexcept { return frame_bytes_; }
  [[nodiscard]] std::size_t stack_size() const noexcept { return options_.stack; }
  [[nodiscard]] const frame_store_options& options() const noexcept { return options_; }
  /// Id of the oldest live frame, and one past the newest.
  [[nodiscard]] std::uint64_t oldest() const noexcept {
    return end_ > capacity_ ? end_ - capacity_ : 0;
  }
  [[nodiscard]] std::uint64_t end() const noexcept { return end_; }
  /// Live frames, and live frames that start a transition.
  [[nodiscard]] std::size_t frames() const noexcept {
    return static_cast<std::size_t>(end_ - oldest());
  }
  [[nodiscard]] std::size_t transitions() const noexcept { return transitions_; }

  /// Bytes the live frames take as stored (compressed or not; a frame's allocation counted at its
  /// stored size plus its 16-byte pointer and size) plus their metadata.
  [[nodiscard]] std::size_t stored_bytes() const noexcept {
    const std::size_t n = frames();
    const std::size_t pixels =
        options_.compress ? stored_frame_bytes_ + n * (sizeof(void*) + sizeof(std::uint32_t) + 4)
                          : n * frame_bytes_;
    return pixels + n * sizeof(frame_meta);
  }
  /// stored_bytes() / transitions().
  [[nodiscard]] double bytes_per_transition() const noexcept {
    return transitions_ == 0
               ? 0.0
               : static_cast<double>(stored_bytes()) / static_cast<double>(transitions_);
  }
  /// Raw frame bytes / stored frame bytes over the live frames (1 without compression).
  [[nodiscard]] double compression_ratio() const noexcept {
    if (!options_.compress || stored_frame_bytes_ == 0) return 1.0;
    return static_cast<double>(frames() * frame_bytes_) / static_cast<double>(stored_frame_bytes_);
  }

 private:
  struct cctx_deleter {
    void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); }
  };
  struct dctx_deleter {
    void operator()(ZSTD_DCtx* c) const noexcept { ZSTD_freeDCtx(c); }
  };

  [[nodiscard]] std::size_t slot(std::uint64_t id) const noexcept {
    return static_cast<std::size_t>(id % capacity_);
  }

  std::uint64_t push_frame(std::span<const std::uint8_t> frame, std::uint8_t flags,
                           std::uint8_t age) {
    HONE_REQUIRE(frame.size() == frame_bytes_,
                 "hone::frame_store: a frame must be exactly frame_bytes() bytes");
    const std::uint64_t id = end_;
    const std::size_t s = slot(id);
    if (id >= capacity_) {  // overwriting frame id - capacity
      if ((meta_[s].flags & frame_meta::has_transition) != 0) --transitions_;
    }
    std::uint8_t stored_flags = flags;
    if (options_.compress) {
      const std::size_t c = ZSTD_compressCCtx(cctx_.get(), scratch_.data(), scratch_.size(),
                                              frame.data(), frame.size(), options_.zstd_level);
      if (ZSTD_isError(c) != 0u) {
        throw error(std::string("hone::frame_store: zstd compression failed: ") +
                    ZSTD_getErrorName(c));
      }
      const bool raw = c >= frame_bytes_;
      const std::size_t n = raw ? frame_bytes_ : c;
      stored_frame_bytes_ -= blob_size_[s];
      blobs_[s] = std::make_unique_for_overwrite<std::uint8_t[]>(n);
      std::memcpy(blobs_[s].get(), raw ? frame.data() : scratch_.data(), n);
      blob_size_[s] = static_cast<std::uint32_t>(n);
      stored_frame_bytes_ += n;
      if (raw) stored_flags = static_cast<std::uint8_t>(stored_flags | frame_meta::raw);
    } else {
      std::memcpy(pixels_.get() + s * frame_bytes_, frame.data(), frame_bytes_);
    }
    meta_[s] = frame_meta{};
    meta_[s].flags = stored_flags;
    meta_[s].age = age;
    end_ = id + 1;
    return id;
  }

  void read_frame(std::uint64_t id, std::uint8_t* dst) const {
    const std::size_t s = slot(id);
    if (!options_.compress) {
      std::memcpy(dst, pixels_.get() + s * frame_bytes_, frame_bytes_);
      return;
    }
    if ((meta_[s].flags & frame_meta::raw) != 0) {
      std::memcpy(dst, blobs_[s].get(), frame_bytes_);
      return;
    }
    thread_local std::unique_ptr<ZSTD_DCtx, dctx_deleter> dctx(ZSTD_createDCtx());
    if (!dctx) throw allocation_error("hone::frame_store: ZSTD_createDCtx failed", 0);
    const std::size_t d =
        ZSTD_decompressDCtx(dctx.get(), dst, frame_bytes_, blobs_[s].get(), blob_size_[s]);
    if (ZSTD_isError(d) != 0u || d != frame_bytes_) {
      throw error("hone::frame_store: a stored frame failed to decompress (memory corruption?)");
    }
  }

  std::size_t capacity_;
  std::size_t frame_bytes_;
  frame_store_options options_;
  std::vector<frame_meta> meta_;
  std::unique_ptr<std::uint8_t[]> pixels_;              // uncompressed mode
  std::vector<std::unique_ptr<std::uint8_t[]>> blobs_;  // compressed mode
  std::vector<std::uint32_t> blob_size_;                // compressed mode
  std::unique_ptr<ZSTD_CCtx, cctx_deleter> cctx_;
  std::vector<std::uint8_t> scratch_;
  std::size_t stored_frame_bytes_ = 0;
  std::uint64_t end_ = 0;
  std::size_t transitions_ = 0;
  bool in_episode_ = false;
};

HONE_NAMESPACE_END
