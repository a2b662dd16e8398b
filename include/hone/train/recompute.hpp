// hone/train/recompute.hpp: activation recompute (gradient checkpointing) for a model made of a
// sequence of user segments: keep every K-th activation during forward, recompute the others
// during backward (torch.utils.checkpoint.checkpoint_sequential semantics; Chen et al. 2016,
// "Training Deep Nets with Sublinear Memory Cost", K = ceil(sqrt(N))).
//
//   std::vector<my_block> blocks(16);   // static_assert(hone::segment<my_block, act>)
//   auto seq = hone::make_sequential_recompute<act>(blocks, hone::recompute::sqrt_n);
//   act y = seq.forward(std::move(x));  // keeps the inputs of segments 0, K, 2K, ... only
//   act dy = loss_gradient(y);
//   act dx = seq.backward(std::move(dy));  // block by block, in reverse: recompute, then backward
//
// A segment is a user type with
//   Act forward(const Act& in);                        // pure: same input -> same output
//   Act backward(const Act& in, const Act& grad_out);  // returns grad_in, ADDS parameter grads
// (or a hone::segment_traits<S> specialization for a type the user cannot change). The segments
// come as a std::tuple (different types, fixed at compile time) or as a random-access sized range
// of one type (std::vector, std::array, std::span: the count is known at run time).
//
// Memory and compute, for N segments and K = keep_every (blocks of K segments):
//   kept during forward:  ceil(N/K) activations (the input of each block);
//   held during backward: those, plus the K-1 recomputed activations of one block;
//   extra compute:        N - ceil(N/K) more segment forwards (each non-kept segment once more).
// K = 1 is plain backprop (nothing recomputed); K = ceil(sqrt(N)) minimizes N/K + K.
//
// Purity: forward must give bit-identical output for the same input every time it is called,
// because the backward pass of a segment sees the RECOMPUTED input, not the one of the first
// forward. A segment with randomness (dropout) must draw from a state that it resets for each
// call (e.g. a per-step seed) instead of advancing a generator; a segment with running statistics
// (batch norm) must update them in only one of the calls. With pure segments the gradients are
// bit-identical to K = 1 (tests/train/test_recompute.cpp checks this).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <optional>
#include <ranges>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN

// ---------------------------------------------------------------------------------------------
// Activations
// ---------------------------------------------------------------------------------------------

/// Customization point: how many bytes an activation occupies, for hone's own memory report
/// (recompute_stats::peak_held_bytes). The primary template uses `a.size_bytes()` when the type
/// has it, else size * sizeof(element) for a contiguous sized range (std::vector<float>, ...).
/// Specialize it for other types:
///
///   template <> struct hone::activation_traits<my_act> {
///     static std::size_t bytes(const my_act& a) { return a.data.size_bytes(); }
///   };
namespace detail {
template <class A>
concept has_size_bytes = requires(const A& a) {
  { a.size_bytes() } -> std::convertible_to<std::size_t>;
};
template <class A>
concept contiguous_without_size_bytes =
    !has_size_bytes<A> && std::ranges::contiguous_range<const A> &&
    std::ranges::sized_range<const A>;
}  // namespace detail

template <class Act>
struct activation_traits {
  template <class U = Act>
  requires detail::has_size_bytes<U>
  static std::size_t bytes(const U& a) { return static_cast<std::size_t>(a.size_bytes()); }

  template <class U = Act>
  requires detail::contiguous_without_size_bytes<U>
  static std::size_t bytes(const U& a) {
    return static_cast<std::size_t>(std::ranges::size(a)) *
           sizeof(std::ranges::range_value_t<const U>);
  }
};

/// activation_traits<Act>::bytes is available: hone reports activation memory in bytes too.
template <class Act>
concept activation_bytes_known = requires(const Act& a) {
  { activation_traits<Act>::bytes(a) } -> std::convertible_to<std::size_t>;
};

/// An activation: a movable object type (hone moves activations, never copies them).
template <class Act>
concept activation = std::is_object_v<Act> && std::movable<Act>;

// ---------------------------------------------------------------------------------------------
// Segments
// ---------------------------------------------------------------------------------------------

/// Customization point. The primary template forwards to the segment's own members; specialize
/// it for a type you cannot change (as hone::model_traits):
///
///   template <> struct hone::segment_traits<their::layer> {
///     static act forward(their::layer& l, const act& in) { ... }
///     static act backward(their::layer& l, const act& in, const act& grad_out) { ... }
///   };
template <class S>
struct segment_traits {
  template <class Act, class U = S>
  requires requires(U& s, const Act& in) { s.forward(in); }
  static decltype(auto) forward(U& s, const Act& in) { return s.forward(in); }

  template <class Act, class U = S>
  requires requires(U& s, const Act& in, const Act& grad_out) { s.backward(in, grad_out); }
  static decltype(auto) backward(U& s, const Act& in, const Act& grad_out) {
    return s.backward(in, grad_out);
  }
};

template <class S>
using segment_traits_t = segment_traits<std::remove_cv_t<S>>;

/// S has forward(const Act&) returning (something convertible to) Act.
template <class S, class Act>
concept has_segment_forward = requires(S& s, const Act& in) {
  { segment_traits_t<S>::forward(s, in) } -> std::convertible_to<Act>;
};

/// S has backward(const Act& in, const Act& grad_out) returning the input's gradient as Act.
template <class S, class Act>
concept has_segment_backward = requires(S& s, const Act& in, const Act& grad_out) {
  { segment_traits_t<S>::backward(s, in, grad_out) } -> std::convertible_to<Act>;
};

/// One piece of a sequential model that hone can run forward, recompute and differentiate.
template <class S, class Act>
concept segment = activation<Act> && has_segment_forward<S, Act> && has_segment_backward<S, Act>;

/// Compile-time check with one sentence per missing piece; returns true when S is a segment.
template <class S, class Act>
consteval bool check_segment() {
  if constexpr (!activation<Act>) {
    static_assert(activation<Act>,
                  "hone::segment: the activation type must be a movable object type (move "
                  "constructible and move assignable): hone keeps some activations and hands "
                  "them between segments by move, never by copy. A struct holding a "
                  "hone::buffer<float> or a std::vector<float> is one.");
    return false;
  } else if constexpr (!has_segment_forward<S, Act>) {
    static_assert(has_segment_forward<S, Act>,
                  "hone::segment: this segment type has no member function forward(const Act&) "
                  "returning the activation type. Add `Act forward(const Act& in)`; it must be "
                  "pure (the same input gives the same output, bit for bit) because hone calls "
                  "it again during backward to recompute dropped activations. Or specialize "
                  "hone::segment_traits<YourSegment>::forward for a type you cannot change.");
    return false;
  } else if constexpr (!has_segment_backward<S, Act>) {
    static_assert(has_segment_backward<S, Act>,
                  "hone::segment: this segment type has no member function "
                  "backward(const Act& in, const Act& grad_out) returning the gradient of its "
                  "input as the activation type. Add it: it receives the segment's forward input "
                  "and the gradient of its output, ADDS its parameter gradients into the grad "
                  "storage the segment owns, and returns the gradient of its input. Or "
                  "specialize hone::segment_traits<YourSegment>::backward.");
    return false;
  } else {
    return true;
  }
}

namespace detail {
template <class T>
inline constexpr bool is_tuple_v = false;
template <class... T>
inline constexpr bool is_tuple_v<std::tuple<T...>> = true;

template <class Segs, class Act>
inline constexpr bool segment_tuple_v = false;
template <class... S, class Act>
inline constexpr bool segment_tuple_v<std::tuple<S...>, Act> =
    sizeof...(S) > 0 && (segment<std::remove_reference_t<S>, Act> && ...);

template <class Segs>
using range_segment_t = std::remove_reference_t<std::ranges::range_reference_t<Segs>>;
}  // namespace detail

/// A random-access, sized range of one segment type (std::vector, std::array, std::span, ...).
template <class Segs, class Act>
concept segment_range = std::ranges::random_access_range<Segs> && std::ranges::sized_range<Segs> &&
    segment<detail::range_segment_t<Segs>, Act>;

/// A non-empty std::tuple of segments (of different types; references allowed: std::tie(a, b)).
template <class Segs, class Act>
concept segment_tuple = detail::segment_tuple_v<Segs, Act>;

/// What hone::sequential_recompute runs: a tuple or a range of segments.
template <class Segs, class Act>
concept segment_sequence = segment_tuple<Segs, Act> || segment_range<Segs, Act>;

namespace detail {
template <class Act, class... S>
consteval bool check_segment_tuple(std::type_identity<std::tuple<S...>>) {
  return (check_segment<std::remove_reference_t<S>, Act>() && ...);
}
}  // namespace detail

/// Compile-time check of a segment container, with a sentence for what is wrong.
template <class Segs, class Act>
consteval bool check_segment_sequence() {
  if constexpr (detail::is_tuple_v<Segs>) {
    if constexpr (std::tuple_size_v<Segs> == 0) {
      static_assert(std::tuple_size_v<Segs> != 0,
                    "hone::sequential_recompute: the tuple of segments is empty; give it at least "
                    "one segment.");
      return false;
    } else {
      return detail::check_segment_tuple<Act>(std::type_identity<Segs>{});
    }
  } else if constexpr (std::ranges::random_access_range<Segs> && std::ranges::sized_range<Segs>) {
    return check_segment<detail::range_segment_t<Segs>, Act>();
  } else {
    static_assert(segment_sequence<Segs, Act>,
                  "hone::sequential_recompute: the segments must be a (non-const) std::tuple of "
                  "segments, whose types may differ, or a random-access sized range of one "
                  "segment type (std::vector, std::array, std::span).");
    return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Policy
// ---------------------------------------------------------------------------------------------

namespace detail {
/// ceil(sqrt(n)), exact for every size_t (no floating-point rounding surprises).
constexpr std::size_t ceil_sqrt(std::size_t n) noexcept {
  if (n <= 1) return n;
  std::size_t lo = 1, hi = std::size_t{1} << (sizeof(std::size_t) * 4);  // hi * hi > n
  while (lo < hi) {  // smallest r with r * r >= n
    const std::size_t mid = lo + (hi - lo) / 2;
    if (mid >= n / mid + (n % mid != 0)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}
}  // namespace detail

/// Which activations survive the forward pass. keep_every = K keeps the input of segments 0, K,
/// 2K, ... and recomputes the others during backward (1: keep all, plain backprop). sqrt_n = true
/// picks K = ceil(sqrt(N)) for N segments (keep_every is then ignored). K larger than N acts as N
/// (only the input is kept).
struct recompute_policy {
  std::size_t keep_every = 1;
  bool sqrt_n = false;

  /// Throws config_error when the policy cannot work.
  void validate() const {
    if (!sqrt_n && keep_every == 0) {
      throw config_error(
          "hone::recompute_policy: keep_every is 0; it must be at least 1. keep_every = 1 keeps "
          "every activation (plain backprop), k > 1 keeps every k-th and recomputes the others "
          "during backward, and hone::recompute::sqrt_n picks k = ceil(sqrt(N)) for N segments.");
    }
  }
  /// The interval K for N segments, in [1, N] (N > 0).
  [[nodiscard]] std::size_t interval(std::size_t segments) const {
    validate();
    const std::size_t k = sqrt_n ? detail::ceil_sqrt(segments) : keep_every;
    return std::clamp<std::size_t>(k, 1, std::max<std::size_t>(segments, 1));
  }
};

namespace recompute {
/// Compile-time interval: recompute::every<1> keeps every activation, every<K> every K-th.
template <std::size_t K>
struct every {
  static_assert(K >= 1,
                "hone::recompute::every<K>: K must be at least 1 (every<1> keeps every "
                "activation: plain backprop; every<K> keeps every K-th).");
  static constexpr std::size_t keep_every = K;
  constexpr operator recompute_policy() const noexcept {  // NOLINT: implicit on purpose
    return recompute_policy{.keep_every = K, .sqrt_n = false};
  }
};
/// No recompute: keep every activation.
using none = every<1>;

/// K = ceil(sqrt(N)) (Chen et al. 2016): about 2 sqrt(N) activations instead of N.
struct sqrt_n_t {
  constexpr operator recompute_policy() const noexcept {  // NOLINT: implicit on purpose
    return recompute_policy{.keep_every = 1, .sqrt_n = true};
  }
};
inline constexpr sqrt_n_t sqrt_n{};
}  // namespace recompute

/// What the last forward + backward did. Counts of activations and segment calls; bytes from
/// hone::activation_traits (0 when the activation type does not report its size).
struct recompute_stats {
  std::size_t segments = 0;        // N
  std::size_t keep_every = 0;      // K in effect
  std::size_t kept = 0;            // activations kept through forward: ceil(N/K), input included
  std::size_t forward_calls = 0;   // segment forward calls: N + recomputed
  std::size_t recomputed = 0;      // of which during backward: N - ceil(N/K)
  std::size_t backward_calls = 0;  // N after a complete backward
  /// Most forward activations hone held at once (kept + recomputed + the one being produced).
  /// Gradients, the caller's output and the segments' own scratch are not counted.
  std::size_t peak_held = 0;
  std::size_t peak_held_bytes = 0;
};

// ---------------------------------------------------------------------------------------------
// The engine
// ---------------------------------------------------------------------------------------------

namespace detail {
template <class Segs, class Act>
struct segment_list;

template <class Segs, class Act>
requires segment_range<Segs, Act>
struct segment_list<Segs, Act> {
  static std::size_t size(Segs& s) { return static_cast<std::size_t>(std::ranges::size(s)); }
  static Act forward(Segs& s, std::size_t i, const Act& in) {
    auto& seg = std::ranges::begin(s)[static_cast<std::ranges::range_difference_t<Segs>>(i)];
    return static_cast<Act>(segment_traits_t<range_segment_t<Segs>>::forward(seg, in));
  }
  static Act backward(Segs& s, std::size_t i, const Act& in, const Act& grad_out) {
    auto& seg = std::ranges::begin(s)[static_cast<std::ranges::range_difference_t<Segs>>(i)];
    return static_cast<Act>(segment_traits_t<range_segment_t<Segs>>::backward(seg, in, grad_out));
  }
};

template <class... S, class Act>
struct segment_list<std::tuple<S...>, Act> {
  using tuple_type = std::tuple<S...>;
  static constexpr std::size_t count = sizeof...(S);

  template <std::size_t I>
  static Act forward_at(tuple_type& t, const Act& in) {
    auto& seg = std::get<I>(t);
    return static_cast<Act>(
        segment_traits_t<std::remove_reference_t<decltype(seg)>>::forward(seg, in));
  }
  template <std::size_t I>
  static Act backward_at(tuple_type& t, const Act& in, const Act& grad_out) {
    auto& seg = std::get<I>(t);
    return static_cast<Act>(
        segment_traits_t<std::remove_reference_t<decltype(seg)>>::backward(seg, in, grad_out));
  }

  static std::size_t size(tuple_type&) { return count; }
  static Act forward(tuple_type& t, std::size_t i, const Act& in) {
    // One indirect call through a table built at compile time: O(1) for any tuple size.
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      constexpr std::array<Act (*)(tuple_type&, const Act&), count> table{&forward_at<I>...};
      return table[i](t, in);
    }
    (std::index_sequence_for<S...>{});
  }
  static Act backward(tuple_type& t, std::size_t i, const Act& in, const Act& grad_out) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      constexpr std::array<Act (*)(tuple_type&, const Act&, const Act&), count> table{
          &backward_at<I>...};
      return table[i](t, in, grad_out);
    }
    (std::index_sequence_for<S...>{});
  }
};
}  // namespace detail

/// Runs a sequence of segments forward keeping every K-th activation, and backward recomputing
/// the others block by block. Holds a reference to the segments (they must outlive it and keep
/// their count between forward() and backward()). Not thread-safe; one forward() is matched by
/// one backward().
template <class Act, class Segments>
class sequential_recompute {
  static_assert(check_segment_sequence<Segments, Act>());
  using list = detail::segment_list<Segments, Act>;

 public:
  using activation_type = Act;
  using segments_type = Segments;

  /// Throws config_error for an invalid policy (keep_every = 0) or an empty segment range.
  explicit sequential_recompute(Segments& segments, recompute_policy policy = {})
      : segments_(&segments), policy_(policy) {
    policy_.validate();
    require_segments(list::size(*segments_));
  }
  /// The segments are referenced, not copied: a temporary container would dangle.
  sequential_recompute(Segments&& segments, recompute_policy policy = {}) = delete;

  sequential_recompute(const sequential_recompute&) = delete;
  sequential_recompute& operator=(const sequential_recompute&) = delete;
  /// Moves the pending state too; the moved-from object has nothing pending.
  sequential_recompute(sequential_recompute&& other) noexcept
      : segments_(other.segments_), policy_(other.policy_) {
    take(other);
  }
  sequential_recompute& operator=(sequential_recompute&& other) noexcept {
    if (this != &other) {
      segments_ = other.segments_;
      policy_ = other.policy_;
      take(other);
    }
    return *this;
  }
  ~sequential_recompute() = default;

  /// Runs every segment on `input` (moved in: it is the first kept activation) and returns the
  /// last segment's output. Keeps the inputs of segments 0, K, 2K, ... for backward(); every
  /// other activation is freed as soon as the next segment has consumed it.
  [[nodiscard]] Act forward(Act input) {
    if (pending_) {
      throw config_error(
          "hone::sequential_recompute::forward: the previous forward() still waits for its "
          "backward(). Call backward(grad_output) to finish it, or reset() to drop its kept "
          "activations (evaluate() runs a forward pass that keeps nothing).");
    }
    const std::size_t n = list::size(*segments_);
    require_segments(n);
    const std::size_t k = policy_.interval(n);
    clear();
    n_ = n;
    k_ = k;
    stats_ = recompute_stats{};
    stats_.segments = n;
    stats_.keep_every = k;
    stats_.kept = (n + k - 1) / k;
    kept_.resize(stats_.kept);
    block_.resize(k);
    try {
      note_new(input);
      kept_[0].emplace(std::move(input));
      std::optional<Act> current;  // the latest activation that is not kept
      const Act* in = &*kept_[0];
      for (std::size_t i = 0;; ++i) {
        Act out = list::forward(*segments_, i, *in);
        ++stats_.forward_calls;
        note_new(out);
        drop(current);  // its only reader, segment i, is done
        if (i + 1 == n) {
          note_gone(out);  // handed to the caller
          pending_ = true;
          return out;
        }
        if ((i + 1) % k == 0) {
          auto& slot = kept_[(i + 1) / k];
          slot.emplace(std::move(out));
          in = &*slot;
        } else {
          current.emplace(std::move(out));
          in = &*current;
        }
      }
    } catch (...) {
      clear();
      throw;
    }
  }

  /// Takes the gradient of forward()'s output and returns the gradient of its input. For each
  /// block of K segments, last block first: recomputes the block's activations from its kept
  /// input, then runs backward through the block's segments in reverse, freeing each activation
  /// right after the backward that reads it. The segments add their parameter gradients.
  [[nodiscard]] Act backward(Act grad_output) {
    if (!pending_) {
      throw config_error(
          "hone::sequential_recompute::backward: no forward() waits for its backward(). Call "
          "forward(input) first; each forward() is matched by exactly one backward().");
    }
    const std::size_t n = list::size(*segments_);
    if (n != n_) {
      clear();
      throw config_error(
          "hone::sequential_recompute::backward: the number of segments changed "
          "from " +
          std::to_string(n_) + " at forward() to " + std::to_string(n) +
          "; keep the segment container unchanged until backward() returns.");
    }
    try {
      Act g = std::move(grad_output);
      for (std::size_t b = kept_.size(); b-- > 0;) {
        const std::size_t s = b * k_;
        const std::size_t e = std::min(s + k_, n_);
        for (std::size_t i = s; i + 1 < e; ++i) {  // recompute the block's inner activations
          Act out = list::forward(*segments_, i, input(b, s, i));
          ++stats_.forward_calls;
          ++stats_.recomputed;
          note_new(out);
          block_[i + 1 - s].emplace(std::move(out));
        }
        for (std::size_t i = e; i-- > s;) {
          Act grad_in = list::backward(*segments_, i, input(b, s, i), g);
          ++stats_.backward_calls;
          drop(i == s ? kept_[b] : block_[i - s]);
          g = std::move(grad_in);
        }
      }
      clear();
      return g;
    } catch (...) {
      clear();
      throw;
    }
  }

  /// A forward pass that keeps nothing (validation, inference). Independent of forward/backward.
  [[nodiscard]] Act evaluate(Act input) {
    const std::size_t n = list::size(*segments_);
    require_segments(n);
    Act current = std::move(input);
    for (std::size_t i = 0; i < n; ++i) {
      Act next = list::forward(*segments_, i, current);
      current = std::move(next);
    }
    return current;
  }

  /// Drops the activations kept by a forward() that will not get its backward().
  void reset() noexcept { clear(); }

  /// True between forward() and backward().
  [[nodiscard]] bool pending() const noexcept { return pending_; }
  /// N, the number of segments.
  [[nodiscard]] std::size_t size() const { return list::size(*segments_); }
  /// K in effect for the current number of segments.
  [[nodiscard]] std::size_t keep_every() const { return policy_.interval(size()); }
  [[nodiscard]] const recompute_policy& policy() const noexcept { return policy_; }
  /// Changes the policy for the next forward(); not allowed while a backward() is pending.
  void set_policy(recompute_policy policy) {
    if (pending_) {
      throw config_error(
          "hone::sequential_recompute::set_policy: a forward() waits for its backward(); change "
          "the policy after backward() (or reset()).");
    }
    policy.validate();
    policy_ = policy;
  }
  /// Counts of the last forward() and backward().
  [[nodiscard]] const recompute_stats& stats() const noexcept { return stats_; }
  /// Forward activations hone holds right now (kept, between forward() and backward()).
  [[nodiscard]] std::size_t held() const noexcept { return held_; }
  [[nodiscard]] std::size_t held_bytes() const noexcept { return held_bytes_; }

 private:
  static void require_segments(std::size_t n) {
    if (n == 0) {
      throw config_error(
          "hone::sequential_recompute: the segment range is empty; it needs at least one "
          "segment to run forward and backward.");
    }
  }
  static std::size_t bytes_of(const Act& a) {
    if constexpr (activation_bytes_known<Act>) {
      return static_cast<std::size_t>(activation_traits<Act>::bytes(a));
    } else {
      return 0;
    }
  }
  /// The input of segment i, in the block of kept boundary b that starts at segment s.
  const Act& input(std::size_t b, std::size_t s, std::size_t i) const {
    return i == s ? *kept_[b] : *block_[i - s];
  }
  void note_new(const Act& a) {
    ++held_;
    held_bytes_ += bytes_of(a);
    stats_.peak_held = std::max(stats_.peak_held, held_);
    stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, held_bytes_);
  }
  void note_gone(const Act& a) noexcept {
    --held_;
    held_bytes_ -= bytes_of(a);
  }
  void drop(std::optional<Act>& slot) noexcept {
    if (slot) {
      note_gone(*slot);
      slot.reset();
    }
  }
  void take(sequential_recompute& other) noexcept {
    n_ = other.n_;
    k_ = other.k_;
    pending_ = std::exchange(other.pending_, false);
    kept_ = std::move(other.kept_);
    block_ = std::move(other.block_);
    held_ = std::exchange(other.held_, 0);
    held_bytes_ = std::exchange(other.held_bytes_, 0);
    stats_ = other.stats_;
    other.kept_.clear();
    other.block_.clear();
  }
  void clear() noexcept {
    for (auto& a : kept_) a.reset();
    for (auto& a : block_) a.reset();
    held_ = 0;
    held_bytes_ = 0;
    pending_ = false;
  }

  Segments* segments_;
  recompute_policy policy_;
  std::size_t n_ = 0;
  std::size_t k_ = 1;
  bool pending_ = false;
  std::vector<std::optional<Act>> kept_;   // kept_[b]: input of segment b * K
  std::vector<std::optional<Act>> block_;  // block_[j]: recomputed input of segment s + j (j > 0)
  std::size_t held_ = 0;
  std::size_t held_bytes_ = 0;
  recompute_stats stats_;
};

/// Deduces the segment container: `auto seq = hone::make_sequential_recompute<act>(blocks,
/// hone::recompute::every<4>{});`
template <class Act, class Segments>
[[nodiscard]] sequential_recompute<Act, Segments> make_sequential_recompute(
    Segments& segments, recompute_policy policy = {}) {
  return sequential_recompute<Act, Segments>(segments, policy);
}
template <class Act, class Segments>
void make_sequential_recompute(const Segments&& segments, recompute_policy policy = {}) = delete;

HONE_NAMESPACE_END
