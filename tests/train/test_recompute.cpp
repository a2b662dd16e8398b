// tests/train/test_recompute.cpp: hone::sequential_recompute (activation recompute, gradient
// checkpointing).
//
// Method. The segments are MLP layers y = relu(x W^T + b) (W 64x64, batch 32) plus a few
// parameter-free or element-wise layers for the heterogeneous tuple. The activation type
// allocates its storage through a counting allocator (live and peak bytes, global), so activation
// memory is measured by the allocator, not derived from K. For N = 8 and 16 segments:
//  1. K = 1 (plain backprop) matches an independent, hand-written backprop loop bit for bit, and
//     K = 2, 3, ceil(sqrt(N)), N and N+1 match K = 1 bit for bit: output, input gradient and
//     every segment's parameter gradients (forward is deterministic, so recompute is exact);
//  2. the measured peak of live activation bytes over forward + backward (input, kept and
//     recomputed activations, the flowing gradients) is at least N+1 activations and at most N+2
//     for K = 1, at most ceil(N/K) + K + 1 for K > 1, and strictly below K = 1 for K = 2, 3 and
//     ceil(sqrt(N)). The peaks are printed at log level message (--log_level=message);
//  3. segment call counts: N + (N - ceil(N/K)) forwards and N backwards;
//  4. errors: keep_every = 0, an empty segment list, backward without forward, forward twice,
//     a changed segment count, and a segment that throws (all activations released).
// A dropout segment shows why segments must be pure: drawing a fresh mask per call changes the
// gradients under recompute; re-deriving the mask from a per-step seed keeps them identical.
#define BOOST_TEST_MODULE hone_train_recompute
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "hone/core/error.hpp"
#include "hone/train/recompute.hpp"

namespace {

// ---- activation memory, counted by the allocator ----
struct activation_memory {
  static inline std::size_t live = 0;
  static inline std::size_t peak = 0;
  static void reset_peak() { peak = live; }
};

template <class T>
struct counting_allocator {
  using value_type = T;
  counting_allocator() = default;
  template <class U>
  counting_allocator(const counting_allocator<U>&) noexcept {}  // NOLINT: rebind
  T* allocate(std::size_t n) {
    activation_memory::live += n * sizeof(T);
    activation_memory::peak = std::max(activation_memory::peak, activation_memory::live);
    return std::allocator<T>{}.allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    activation_memory::live -= n * sizeof(T);
    std::allocator<T>{}.deallocate(p, n);
  }
  template <class U>
  bool operator==(const counting_allocator<U>&) const noexcept {
    return true;
  }
};

constexpr std::size_t k_batch = 32;
constexpr std::size_t k_width = 64;
constexpr std::size_t k_act_bytes = k_batch * k_width * sizeof(float);  // one activation

// A batch of rows x cols floats. Move-only: the engine must never copy an activation.
struct act {
  std::size_t rows = 0, cols = 0;
  std::vector<float, counting_allocator<float>> v;
  act() = default;
  act(std::size_t r, std::size_t c) : rows(r), cols(c), v(r * c) {}
  act(const act&) = delete;
  act& operator=(const act&) = delete;
  act(act&&) noexcept = default;
  act& operator=(act&&) noexcept = default;
  [[nodiscard]] act clone() const {
    act a(rows, cols);
    std::copy(v.begin(), v.end(), a.v.begin());
    return a;
  }
  [[nodiscard]] std::size_t size_bytes() const { return v.size() * sizeof(float); }
  float& at(std::size_t r, std::size_t c) { return v[r * cols + c]; }
  [[nodiscard]] float at(std::size_t r, std::size_t c) const { return v[r * cols + c]; }
};

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}
std::span<const float> view(const act& a) {
  return {a.v.data(), a.v.size()};
}

// y = relu(x W^T + b): W out x in, row-major. backward recomputes the pre-activation from x.
struct dense_relu {
  std::size_t in = k_width, out = k_width;
  std::vector<float> w, b, gw, gb;
  std::size_t forwards = 0, backwards = 0;  // call counts (state that does not affect results)

  explicit dense_relu(std::uint32_t seed, std::size_t n_in = k_width, std::size_t n_out = k_width)
      : in(n_in), out(n_out), w(n_in * n_out), b(n_out), gw(n_in * n_out, 0.0f), gb(n_out, 0.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, std::sqrt(2.0f / static_cast<float>(n_in)));
    for (float& x : w) x = nd(rng);
    for (float& x : b) x = 0.1f * nd(rng);
  }
  [[nodiscard]] float pre(const act& x, std::size_t r, std::size_t o) const {
    float z = b[o];
    for (std::size_t i = 0; i < in; ++i) z += x.at(r, i) * w[o * in + i];
    return z;
  }
  act forward(const act& x) {
    ++forwards;
    act y(x.rows, out);
    for (std::size_t r = 0; r < x.rows; ++r)
      for (std::size_t o = 0; o < out; ++o) y.at(r, o) = std::max(pre(x, r, o), 0.0f);
    return y;
  }
  act backward(const act& x, const act& gy) {
    ++backwards;
    std::vector<float> gz(x.rows * out);  // scratch: not an activation, not counted
    for (std::size_t r = 0; r < x.rows; ++r)
      for (std::size_t o = 0; o < out; ++o)
        gz[r * out + o] = pre(x, r, o) > 0.0f ? gy.at(r, o) : 0.0f;
    for (std::size_t o = 0; o < out; ++o) {
      for (std::size_t r = 0; r < x.rows; ++r) {
        const float g = gz[r * out + o];
        gb[o] += g;
        for (std::size_t i = 0; i < in; ++i) gw[o * in + i] += g * x.at(r, i);
      }
    }
    act gx(x.rows, in);
    for (std::size_t r = 0; r < x.rows; ++r)
      for (std::size_t i = 0; i < in; ++i) {
        float s = 0.0f;
        for (std::size_t o = 0; o < out; ++o) s += gz[r * out + o] * w[o * in + i];
        gx.at(r, i) = s;
      }
    return gx;
  }
  void zero_grad() {
    std::fill(gw.begin(), gw.end(), 0.0f);
    std::fill(gb.begin(), gb.end(), 0.0f);
  }
};

// y = a * x + c per feature (element-wise parameters).
struct scale_shift {
  std::vector<float> a, c, ga, gc;
  explicit scale_shift(std::uint32_t seed)
      : a(k_width), c(k_width), ga(k_width, 0.0f), gc(k_width, 0.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> ud(0.5f, 1.5f);
    for (float& x : a) x = ud(rng);
    for (float& x : c) x = ud(rng) - 1.0f;
  }
  act forward(const act& x) const {
    act y(x.rows, x.cols);
    for (std::size_t r = 0; r < x.rows; ++r)
      for (std::size_t j = 0; j < x.cols; ++j) y.at(r, j) = a[j] * x.at(r, j) + c[j];
    return y;
  }
  act backward(const act& x, const act& gy) {
    act gx(x.rows, x.cols);
    for (std::size_t r = 0; r < x.rows; ++r)
      for (std::size_t j = 0; j < x.cols; ++j) {
        ga[j] += gy.at(r, j) * x.at(r, j);
        gc[j] += gy.at(r, j);
        gx.at(r, j) = gy.at(r, j) * a[j];
      }
    return gx;
  }
};

// y = tanh(x), no parameters.
struct tanh_layer {
  act forward(const act& x) const {
    act y(x.rows, x.cols);
    for (std::size_t i = 0; i < x.v.size(); ++i) y.v[i] = std::tanh(x.v[i]);
    return y;
  }
  act backward(const act& x, const act& gy) const {
    act gx(x.rows, x.cols);
    for (std::size_t i = 0; i < x.v.size(); ++i) {
      const float t = std::tanh(x.v[i]);
      gx.v[i] = gy.v[i] * (1.0f - t * t);
    }
    return gx;
  }
};

// Dropout (p = 0.5, scale 2). pure = true: the mask is derived from (seed, step) on every call,
// so a recomputed forward sees the same mask. pure = false: every forward draws a new mask from a
// generator it advances and backward uses the latest one (the hazard the purity rule forbids).
struct dropout {
  bool pure = true;
  std::uint32_t seed = 0;
  std::uint64_t step = 0;
  std::mt19937 rng{1234};
  std::vector<float> mask;
  dropout(bool is_pure, std::uint32_t s) : pure(is_pure), seed(s) {}
  std::vector<float> make_mask(std::size_t n) {
    std::vector<float> m(n);
    std::mt19937 local(static_cast<std::uint32_t>(seed * 7919u + step));
    std::mt19937& g = pure ? local : rng;
    for (float& x : m) x = (g() & 1u) != 0 ? 2.0f : 0.0f;
    return m;
  }
  act forward(const act& x) {
    mask = make_mask(x.v.size());
    act y(x.rows, x.cols);
    for (std::size_t i = 0; i < x.v.size(); ++i) y.v[i] = x.v[i] * mask[i];
    return y;
  }
  act backward(const act& x, const act& gy) {
    if (pure) mask = make_mask(x.v.size());
    act gx(x.rows, x.cols);
    for (std::size_t i = 0; i < x.v.size(); ++i) gx.v[i] = gy.v[i] * mask[i];
    return gx;
  }
};

act make_input(std::uint32_t seed) {
  act x(k_batch, k_width);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& f : x.v) f = nd(rng);
  return x;
}

std::vector<dense_relu> make_mlp(std::size_t n) {
  std::vector<dense_relu> layers;
  layers.reserve(n);
  for (std::size_t i = 0; i < n; ++i) layers.emplace_back(static_cast<std::uint32_t>(100 + i));
  return layers;
}

// What one forward + backward produced.
struct result {
  std::vector<float> output, grad_input;
  std::vector<std::vector<float>> grads;  // each segment's parameter gradients, concatenated
  std::size_t peak_bytes = 0;             // allocator-measured peak of live activation bytes
  hone::recompute_stats stats;
};

std::vector<float> plain(std::span<const float> s) {
  return {s.begin(), s.end()};
}

template <class Segs>
std::vector<std::vector<float>> collect_grads(Segs& layers) {
  std::vector<std::vector<float>> g;
  for (const auto& l : layers) {
    std::vector<float> all(l.gw.begin(), l.gw.end());
    all.insert(all.end(), l.gb.begin(), l.gb.end());
    g.push_back(std::move(all));
  }
  return g;
}

// Loss 0.5 * ||y||^2, so dL/dy = y: the output becomes the gradient by move (no extra memory).
result run_engine(std::vector<dense_relu>& layers, hone::recompute_policy policy) {
  for (auto& l : layers) l.zero_grad();
  result r;
  BOOST_REQUIRE_EQUAL(activation_memory::live, 0u);
  activation_memory::reset_peak();
  {
    auto seq = hone::make_sequential_recompute<act>(layers, policy);
    act y = seq.forward(make_input(7));
    r.output = plain(view(y));
    act dx = seq.backward(std::move(y));
    r.grad_input = plain(view(dx));
    r.stats = seq.stats();
    BOOST_TEST(!seq.pending());
    BOOST_TEST(seq.held() == 0u);
  }
  r.peak_bytes = activation_memory::peak;
  BOOST_TEST(activation_memory::live == 0u);
  r.grads = collect_grads(layers);
  return r;
}

// Independent reference: plain backprop written out by hand (keeps every activation).
result run_reference(std::vector<dense_relu>& layers) {
  for (auto& l : layers) l.zero_grad();
  result r;
  {
    std::vector<act> a;
    a.push_back(make_input(7));
    for (auto& l : layers) a.push_back(l.forward(a.back()));
    r.output = plain(view(a.back()));
    act g = std::move(a.back());
    for (std::size_t i = layers.size(); i-- > 0;) g = layers[i].backward(a[i], g);
    r.grad_input = plain(view(g));
  }
  r.grads = collect_grads(layers);
  return r;
}

bool identical(const result& a, const result& b) {
  if (!same_bits(a.output, b.output) || !same_bits(a.grad_input, b.grad_input)) return false;
  if (a.grads.size() != b.grads.size()) return false;
  for (std::size_t i = 0; i < a.grads.size(); ++i)
    if (!same_bits(a.grads[i], b.grads[i])) return false;
  return true;
}

bool any_nonzero(const std::vector<float>& v) {
  return std::any_of(v.begin(), v.end(), [](float x) { return x != 0.0f; });
}

std::string policy_name(hone::recompute_policy p, std::size_t n) {
  return p.sqrt_n ? "sqrt_n (K=" + std::to_string(p.interval(n)) + ")"
                  : "K=" + std::to_string(p.keep_every);
}

// A segment whose forward or backward throws on a chosen call.
struct throwing {
  int forward_calls = 0;
  int throw_on_forward = -1;
  act forward(const act& x) {
    if (forward_calls++ == throw_on_forward) throw std::runtime_error("boom");
    return x.clone();
  }
  act backward(const act&, const act& gy) { return gy.clone(); }
};

}  // namespace

// ---- concepts ----
namespace no_backward {
struct seg {
  act forward(const act& x) { return x.clone(); }
};
}  // namespace no_backward
namespace void_backward {
struct seg {
  act forward(const act& x) { return x.clone(); }
  void backward(const act&, const act&) {}
};
}  // namespace void_backward
namespace wrong_forward {
struct seg {
  int forward(const act&) { return 0; }
  act backward(const act& x, const act&) { return x.clone(); }
};
}  // namespace wrong_forward
namespace third_party {
struct layer {  // cannot be changed: different member names
  act run(const act& x) const { return x.clone(); }
  act grad(const act&, const act& gy) const { return gy.clone(); }
};
}  // namespace third_party
template <>
struct hone::segment_traits<third_party::layer> {
  static act forward(third_party::layer& l, const act& x) { return l.run(x); }
  static act backward(third_party::layer& l, const act& x, const act& gy) { return l.grad(x, gy); }
};
struct opaque_act {  // movable, but hone cannot tell its size
  std::vector<float> data;
};

static_assert(hone::segment<dense_relu, act>);
static_assert(hone::check_segment<dense_relu, act>());
static_assert(hone::segment<scale_shift, act>);
static_assert(hone::segment<const tanh_layer, act>);   // const members suffice
static_assert(!hone::segment<const dense_relu, act>);  // its forward is not const
static_assert(!hone::segment<int, act>);
static_assert(!hone::segment<no_backward::seg, act>);
static_assert(!hone::segment<void_backward::seg, act>);
static_assert(!hone::segment<wrong_forward::seg, act>);
static_assert(hone::segment<third_party::layer, act>);  // through hone::segment_traits
static_assert(!hone::segment<dense_relu, int>);
static_assert(hone::segment_sequence<std::vector<dense_relu>, act>);
static_assert(hone::segment_sequence<std::array<dense_relu, 3>, act>);
static_assert(hone::segment_sequence<std::span<dense_relu>, act>);
static_assert(hone::segment_sequence<std::tuple<dense_relu, tanh_layer, scale_shift>, act>);
static_assert(hone::segment_sequence<std::tuple<dense_relu&, tanh_layer&>, act>);
static_assert(!hone::segment_sequence<std::tuple<>, act>);
static_assert(!hone::segment_sequence<std::tuple<dense_relu, int>, act>);
static_assert(!hone::segment_sequence<std::vector<int>, act>);
static_assert(!hone::segment_sequence<dense_relu, act>);
static_assert(hone::activation_bytes_known<act>);
static_assert(hone::activation_bytes_known<std::vector<float>>);
static_assert(!hone::activation_bytes_known<opaque_act>);
static_assert(hone::activation<opaque_act>);
static_assert(hone::detail::ceil_sqrt(0) == 0 && hone::detail::ceil_sqrt(1) == 1);
static_assert(hone::detail::ceil_sqrt(8) == 3 && hone::detail::ceil_sqrt(9) == 3);
static_assert(hone::detail::ceil_sqrt(10) == 4 && hone::detail::ceil_sqrt(16) == 4);
static_assert(hone::detail::ceil_sqrt(std::numeric_limits<std::size_t>::max()) ==
              std::size_t{1} << (sizeof(std::size_t) * 4));

BOOST_AUTO_TEST_CASE(policy_intervals) {
  const hone::recompute_policy every3 = hone::recompute::every<3>{};
  BOOST_TEST(every3.keep_every == 3u);
  BOOST_TEST(!every3.sqrt_n);
  const hone::recompute_policy s = hone::recompute::sqrt_n;
  BOOST_TEST(s.interval(8) == 3u);
  BOOST_TEST(s.interval(16) == 4u);
  BOOST_TEST(s.interval(17) == 5u);
  BOOST_TEST(s.interval(1) == 1u);
  BOOST_TEST(hone::recompute_policy{}.interval(8) == 1u);
  BOOST_TEST(hone::recompute_policy(hone::recompute::none{}).interval(8) == 1u);
  BOOST_TEST(hone::recompute_policy{.keep_every = 100}.interval(8) == 8u);  // K > N acts as N
}

// (1) identical gradients, (2) peak activation memory from the allocator, (3) call counts.
BOOST_AUTO_TEST_CASE(mlp_identical_gradients_and_lower_peak) {
  for (const std::size_t n : {std::size_t{8}, std::size_t{16}}) {
    auto layers = make_mlp(n);
    const result reference = run_reference(layers);
    BOOST_TEST(any_nonzero(reference.grad_input));
    for (const auto& g : reference.grads) BOOST_TEST(any_nonzero(g));

    const result plain_bp = run_engine(layers, hone::recompute::none{});
    BOOST_TEST(identical(plain_bp, reference), "K=1 differs from hand-written backprop, N=" << n);
    BOOST_TEST(plain_bp.peak_bytes >= (n + 1) * k_act_bytes);
    BOOST_TEST(plain_bp.peak_bytes <= (n + 2) * k_act_bytes);
    BOOST_TEST(plain_bp.stats.recomputed == 0u);
    BOOST_TEST_MESSAGE("N=" << n << " K=1: peak " << plain_bp.peak_bytes
                            << " bytes = " << plain_bp.peak_bytes / k_act_bytes
                            << " activations (bound N+2), 0 recomputed forwards, hone held at most "
                            << plain_bp.stats.peak_held);

    const std::vector<hone::recompute_policy> policies = {
        hone::recompute::every<2>{}, hone::recompute::every<3>{}, hone::recompute::sqrt_n,
        hone::recompute_policy{.keep_every = n}, hone::recompute_policy{.keep_every = n + 1}};
    for (const auto& p : policies) {
      for (auto& l : layers) l.forwards = l.backwards = 0;
      const result r = run_engine(layers, p);
      const std::size_t k = p.interval(n);
      const std::size_t kept = (n + k - 1) / k;
      BOOST_TEST(identical(r, plain_bp),
                 "gradients differ from K=1 for N=" << n << ", " << policy_name(p, n));
      // Memory, measured by the allocator.
      const std::size_t bound = (kept + k + 1) * k_act_bytes;
      BOOST_TEST(r.peak_bytes <= bound, "N=" << n << ", " << policy_name(p, n));
      if (k >= 2 && k <= 4) BOOST_TEST(r.peak_bytes < plain_bp.peak_bytes);
      BOOST_TEST(r.stats.peak_held_bytes <= r.peak_bytes);  // hone's own report is consistent
      BOOST_TEST(r.stats.peak_held_bytes == r.stats.peak_held * k_act_bytes);
      // Compute: each non-kept activation is produced once more.
      BOOST_TEST(r.stats.segments == n);
      BOOST_TEST(r.stats.keep_every == k);
      BOOST_TEST(r.stats.kept == kept);
      BOOST_TEST(r.stats.recomputed == n - kept);
      BOOST_TEST(r.stats.forward_calls == n + (n - kept));
      BOOST_TEST(r.stats.backward_calls == n);
      std::size_t forwards = 0;
      for (const auto& l : layers) {
        forwards += l.forwards;
        BOOST_TEST(l.backwards == 1u);
      }
      BOOST_TEST(forwards == r.stats.forward_calls);
      BOOST_TEST_MESSAGE("N=" << n << " " << policy_name(p, n) << ": peak " << r.peak_bytes
                              << " bytes = " << r.peak_bytes / k_act_bytes
                              << " activations (bound ceil(N/K)+K+1 = " << bound / k_act_bytes
                              << "; K=1: " << plain_bp.peak_bytes / k_act_bytes << "), "
                              << r.stats.recomputed << " recomputed forwards, hone held at most "
                              << r.stats.peak_held);
    }
  }
}

// Heterogeneous segments in a tuple (compile-time sequence), by value and by reference.
BOOST_AUTO_TEST_CASE(tuple_of_segments) {
  using net = std::tuple<dense_relu, scale_shift, tanh_layer, dense_relu, scale_shift, dense_relu>;
  const auto make = [] {
    return net{dense_relu(1), scale_shift(2), tanh_layer{},
               dense_relu(3), scale_shift(4), dense_relu(5)};
  };
  const auto grads_of = [](const net& t) {
    std::vector<float> g;
    const auto add = [&](const std::vector<float>& v) { g.insert(g.end(), v.begin(), v.end()); };
    add(std::get<0>(t).gw), add(std::get<0>(t).gb), add(std::get<1>(t).ga), add(std::get<1>(t).gc);
    add(std::get<3>(t).gw), add(std::get<3>(t).gb), add(std::get<4>(t).ga), add(std::get<4>(t).gc);
    add(std::get<5>(t).gw), add(std::get<5>(t).gb);
    return g;
  };
  // Hand-written reference.
  net ref = make();
  std::vector<float> ref_dx, ref_y;
  {
    auto& [l0, l1, l2, l3, l4, l5] = ref;
    std::vector<act> a;
    a.push_back(make_input(3));
    a.push_back(l0.forward(a[0]));
    a.push_back(l1.forward(a[1]));
    a.push_back(l2.forward(a[2]));
    a.push_back(l3.forward(a[3]));
    a.push_back(l4.forward(a[4]));
    a.push_back(l5.forward(a[5]));
    ref_y = plain(view(a[6]));
    act g = a[6].clone();
    g = l5.backward(a[5], g);
    g = l4.backward(a[4], g);
    g = l3.backward(a[3], g);
    g = l2.backward(a[2], g);
    g = l1.backward(a[1], g);
    g = l0.backward(a[0], g);
    ref_dx = plain(view(g));
  }
  const std::vector<float> ref_grads = grads_of(ref);
  BOOST_TEST(any_nonzero(ref_dx));

  for (const std::size_t k : {1, 2, 3, 4, 6}) {
    net t = make();
    auto seq = hone::make_sequential_recompute<act>(t, {.keep_every = k});
    act y = seq.forward(make_input(3));
    BOOST_TEST(same_bits(view(y), ref_y));
    act dx = seq.backward(std::move(y));
    BOOST_TEST(same_bits(view(dx), ref_dx), "tuple, K=" << k);
    BOOST_TEST(same_bits(grads_of(t), ref_grads), "tuple, K=" << k);
    BOOST_TEST(seq.stats().recomputed == 6 - (6 + k - 1) / k);
  }
  {  // segments referenced through std::tie
    net t = make();
    auto& [l0, l1, l2, l3, l4, l5] = t;
    auto refs = std::tie(l0, l1, l2, l3, l4, l5);
    auto seq = hone::make_sequential_recompute<act>(refs, hone::recompute::sqrt_n);
    act y = seq.forward(make_input(3));
    act dx = seq.backward(std::move(y));
    BOOST_TEST(same_bits(view(dx), ref_dx));
    BOOST_TEST(same_bits(grads_of(t), ref_grads));
  }
}

// Other runtime containers: std::array and std::span; the evaluate() pass keeps nothing.
BOOST_AUTO_TEST_CASE(array_span_and_evaluate) {
  std::array<dense_relu, 5> arr{dense_relu(11), dense_relu(12), dense_relu(13), dense_relu(14),
                                dense_relu(15)};
  std::vector<dense_relu> vec(arr.begin(), arr.end());
  std::span<dense_relu> sp(vec);
  auto a = hone::make_sequential_recompute<act>(arr, hone::recompute::every<2>{});
  auto s = hone::make_sequential_recompute<act>(sp, hone::recompute::none{});
  BOOST_TEST(a.size() == 5u);
  BOOST_TEST(a.keep_every() == 2u);
  act ya = a.forward(make_input(5));
  act ys = s.forward(make_input(5));
  BOOST_TEST(same_bits(view(ya), view(ys)));
  BOOST_TEST(a.pending());
  BOOST_TEST(a.held() == 3u);  // inputs of segments 0, 2, 4
  BOOST_TEST(a.held_bytes() == 3 * k_act_bytes);
  BOOST_TEST(s.held() == 5u);
  act dxa = a.backward(std::move(ya));
  act dxs = s.backward(std::move(ys));
  BOOST_TEST(same_bits(view(dxa), view(dxs)));
  for (std::size_t i = 0; i < 5; ++i) BOOST_TEST(same_bits(arr[i].gw, vec[i].gw));

  const std::size_t before = activation_memory::live;
  activation_memory::reset_peak();
  act e = a.evaluate(make_input(5));
  BOOST_TEST(a.held() == 0u);
  BOOST_TEST(!a.pending());
  BOOST_TEST(activation_memory::peak <= before + 2 * k_act_bytes);  // input and output only
  act y2 = a.forward(make_input(5));
  BOOST_TEST(same_bits(view(e), view(y2)));
  a.reset();
  BOOST_TEST(!a.pending());
  BOOST_TEST(a.held() == 0u);

  // Moving the engine moves the pending state.
  act y3 = s.forward(make_input(5));
  auto moved = std::move(s);
  BOOST_TEST(moved.pending());
  BOOST_TEST(!s.pending());  // NOLINT(bugprone-use-after-move): documented moved-from state
  act dx3 = moved.backward(std::move(y3));
  BOOST_TEST(same_bits(view(dx3), view(dxs)));
}

// An activation type without a size: counts are still reported, bytes are 0.
BOOST_AUTO_TEST_CASE(activation_without_size) {
  struct copy_seg {
    opaque_act forward(const opaque_act& x) { return {x.data}; }
    opaque_act backward(const opaque_act&, const opaque_act& g) { return {g.data}; }
  };
  std::vector<copy_seg> segs(4);
  hone::sequential_recompute<opaque_act, std::vector<copy_seg>> seq(segs, {.keep_every = 2});
  opaque_act y = seq.forward(opaque_act{{1.0f, 2.0f}});
  BOOST_TEST(seq.held() == 2u);
  BOOST_TEST(seq.held_bytes() == 0u);
  opaque_act dx = seq.backward(std::move(y));
  BOOST_TEST(dx.data.size() == 2u);
  BOOST_TEST(seq.stats().peak_held_bytes == 0u);
  BOOST_TEST(seq.stats().peak_held >= 2u);

  std::vector<third_party::layer> tp(3);
  auto seq2 = hone::make_sequential_recompute<act>(tp, hone::recompute::every<2>{});
  act y2 = seq2.forward(make_input(1));
  act dx2 = seq2.backward(std::move(y2));
  BOOST_TEST(same_bits(view(dx2), view(make_input(1))));
}

// Purity: a dropout mask drawn fresh on every call breaks recompute; one derived from a per-step
// seed does not.
BOOST_AUTO_TEST_CASE(purity_requirement) {
  const auto run = [](bool pure, std::size_t k) {
    std::tuple<dense_relu, dropout, dense_relu, dropout, dense_relu, dense_relu> t{
        dense_relu(21),   dropout(pure, 1), dense_relu(22),
        dropout(pure, 2), dense_relu(23),   dense_relu(24)};
    auto seq = hone::make_sequential_recompute<act>(t, {.keep_every = k});
    act y = seq.forward(make_input(9));
    act dx = seq.backward(std::move(y));
    std::vector<float> out = plain(view(dx));
    out.insert(out.end(), std::get<0>(t).gw.begin(), std::get<0>(t).gw.end());
    return out;
  };
  const std::vector<float> pure1 = run(true, 1);
  BOOST_TEST(same_bits(run(true, 3), pure1));
  BOOST_TEST(same_bits(run(true, 6), pure1));
  // A fresh mask per call: harmless without recompute (backward sees the forward's mask), wrong
  // with it (the recomputed activations and masks differ from those of the first forward).
  const std::vector<float> impure1 = run(false, 1);
  BOOST_TEST(same_bits(run(false, 1), impure1));
  BOOST_TEST(!same_bits(run(false, 3), impure1));
}

BOOST_AUTO_TEST_CASE(errors) {
  auto layers = make_mlp(3);
  const auto says = [](const char* part) {
    return [part](const hone::config_error& e) {
      return std::string(e.what()).find(part) != std::string::npos;
    };
  };
  // keep_every = 0
  BOOST_CHECK_EXCEPTION((void)hone::make_sequential_recompute<act>(layers, {.keep_every = 0}),
                        hone::config_error, says("keep_every is 0; it must be at least 1"));
  BOOST_CHECK_EXCEPTION((void)hone::recompute_policy{.keep_every = 0}.interval(4),
                        hone::config_error, says("keep_every is 0"));
  BOOST_CHECK_NO_THROW((void)hone::recompute_policy({.keep_every = 0, .sqrt_n = true}).interval(4));
  // empty segment list
  std::vector<dense_relu> none;
  BOOST_CHECK_EXCEPTION((void)hone::make_sequential_recompute<act>(none), hone::config_error,
                        says("segment range is empty"));
  {  // a range that becomes empty after construction
    std::vector<dense_relu> shrinking = make_mlp(2);
    auto seq = hone::make_sequential_recompute<act>(shrinking);
    shrinking.clear();
    BOOST_CHECK_EXCEPTION((void)seq.forward(make_input(1)), hone::config_error,
                          says("segment range is empty"));
  }

  auto seq = hone::make_sequential_recompute<act>(layers, hone::recompute::every<2>{});
  // backward without forward
  BOOST_CHECK_EXCEPTION((void)seq.backward(make_input(1)), hone::config_error,
                        says("no forward() waits"));
  // forward twice
  act y = seq.forward(make_input(1));
  BOOST_CHECK_EXCEPTION((void)seq.forward(make_input(1)), hone::config_error,
                        says("still waits for its backward()"));
  BOOST_CHECK_EXCEPTION(seq.set_policy({.keep_every = 3}), hone::config_error,
                        says("waits for its backward()"));
  // changed segment count
  layers.emplace_back(99);
  BOOST_CHECK_EXCEPTION((void)seq.backward(std::move(y)), hone::config_error,
                        says("number of segments changed from 3 at forward() to 4"));
  BOOST_TEST(!seq.pending());
  BOOST_TEST(seq.held() == 0u);
  BOOST_CHECK_EXCEPTION(seq.set_policy({.keep_every = 0}), hone::config_error,
                        says("keep_every is 0"));
  BOOST_CHECK_NO_THROW(seq.set_policy(hone::recompute::sqrt_n));
  BOOST_TEST(seq.keep_every() == 2u);  // ceil(sqrt(4))

  // A segment that throws during recompute: the exception passes through, nothing stays held.
  activation_memory::reset_peak();
  const std::size_t live_before = activation_memory::live;
  std::vector<throwing> th(4);
  th[1].throw_on_forward = 1;  // its second forward call: the recompute during backward
  auto tseq = hone::make_sequential_recompute<act>(th, hone::recompute::every<4>{});
  act ty = tseq.forward(make_input(2));
  BOOST_CHECK_THROW((void)tseq.backward(std::move(ty)), std::runtime_error);
  BOOST_TEST(!tseq.pending());
  BOOST_TEST(tseq.held() == 0u);
  BOOST_TEST(activation_memory::live == live_before);
  // and during forward
  std::vector<throwing> th2(4);
  th2[2].throw_on_forward = 0;
  auto fseq = hone::make_sequential_recompute<act>(th2, hone::recompute::every<2>{});
  BOOST_CHECK_THROW((void)fseq.forward(make_input(2)), std::runtime_error);
  BOOST_TEST(!fseq.pending());
  BOOST_TEST(fseq.held() == 0u);
  BOOST_TEST(activation_memory::live == live_before);
  act fy = fseq.forward(make_input(2));  // usable again
  BOOST_TEST(fseq.pending());
  act fdx = fseq.backward(std::move(fy));
  BOOST_TEST(same_bits(view(fdx), view(make_input(2))));
}
