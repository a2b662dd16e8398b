// Tests of the inner loop hone::for_each chooses per functor: the vector form (`apply`) of a
// functor that offers one, on every element, with the bits of the optimizer states' own steps over
// arenas and of the element functor run one element at a time; the element loop, with the scalar
// result, for a functor that offers none.
#define BOOST_TEST_MODULE hone_core_for_each
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <hone/core/arena.hpp>
#include <hone/core/bfloat16.hpp>
#include <hone/core/isa.hpp>
#include <hone/core/multi_tensor.hpp>
#include <hone/core/parallel.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/sgd.hpp>
#include <random>
#include <string>
#include <vector>

namespace {

// Odd sizes: vector bodies and tails at every SIMD width, a tensor of one element, and one
// larger than the default grain (64 Ki elements), so it is cut into two chunks.
const std::vector<std::size_t> sizes = {70001, 33, 7, 4099, 1000, 1, 3, 257};

hone::arena_layout make_layout() {
  hone::arena_layout layout(sizeof(float));
  for (std::size_t t = 0; t < sizes.size(); ++t) layout.add("t" + std::to_string(t), sizes[t]);
  return layout;
}

template <class T>
std::vector<T> random_values(std::size_t n, std::mt19937& rng, float scale, bool nonnegative) {
  std::normal_distribution<float> nd;
  std::vector<T> out(n);
  for (auto& x : out) {
    const float r = scale * nd(rng);
    x = T(nonnegative ? std::abs(r) : r);
  }
  return out;
}

/// Number of elements whose bits differ (0 when the vectors are identical).
template <class T>
std::size_t differing(const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return n + (a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

template <class T>
bool same_bits(const T* a, const T* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(T)) == 0;
}

/// One optimizer's arrays twice: as arenas (the state's step) and as separately allocated tensors
/// (for_each over tensor_lists), with the same initial values.
template <class G>
struct two_layouts {
  hone::arena_layout layout = make_layout();
  hone::arena<float> master{layout};
  hone::arena<G> grad{layout};
  // The same parameters and gradients as separately allocated tensors, one vector per tensor.
  std::vector<std::vector<float>> params;
  std::vector<std::vector<G>> grads;

  explicit two_layouts(unsigned seed) {
    std::mt19937 rng(seed);
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      params.push_back(random_values<float>(sizes[t], rng, 1.0f, false));
      grads.push_back(random_values<G>(sizes[t], rng, 1e-2f, false));
      std::memcpy(master.view(t).data(), params[t].data(), sizes[t] * sizeof(float));
      std::memcpy(grad.view(t).data(), grads[t].data(), sizes[t] * sizeof(G));
    }
  }
  /// Separate copies of the state arena `a` (as the state initialized it), one per tensor.
  std::vector<std::vector<float>> split(const hone::arena<float>& a) const {
    std::vector<std::vector<float>> out;
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      out.emplace_back(a.view(t).begin(), a.view(t).end());
    }
    return out;
  }
  /// Fills every slot of the state arena `a` with random values (nonnegative ones for second
  /// moments), so a step starts from a nontrivial state.
  void randomize(hone::arena<float>& a, unsigned seed, float scale, bool nonnegative) {
    std::mt19937 rng(seed);
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      const auto v = random_values<float>(sizes[t], rng, scale, nonnegative);
      std::memcpy(a.view(t).data(), v.data(), sizes[t] * sizeof(float));
    }
  }
};

bool same_as_arena(const std::vector<std::vector<float>>& separate, const hone::arena<float>& a) {
  bool ok = true;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    ok = ok && same_bits(separate[t].data(), a.view(t).data(), sizes[t]);
  }
  return ok;
}

/// AdamW (or AMSGrad) through the state's step over arenas and through for_each over separate
/// tensors, 3 steps (the third with a schedule's beta1), then every array compared bit for bit.
template <class G>
void check_adamw(bool amsgrad, hone::host_tuning tuning) {
  two_layouts<G> d(amsgrad ? 11u : 7u);
  const hone::adamw policy{.weight_decay = 0.05f, .amsgrad = amsgrad};
  hone::adamw_state<> st(policy, d.layout);
  d.randomize(st.exp_avg(), 21, 1e-3f, false);
  d.randomize(st.exp_avg_sq(), 22, 1e-5f, true);
  if (amsgrad) d.randomize(st.max_exp_avg_sq(), 23, 1e-5f, true);
  auto m = d.split(st.exp_avg());
  auto v = d.split(st.exp_avg_sq());
  auto vmax = amsgrad ? d.split(st.max_exp_avg_sq()) : std::vector<std::vector<float>>{};
  // The reference: the element functor called on one element at a time by a plain loop.
  auto ref_p = d.params, ref_m = m, ref_v = v, ref_vmax = vmax;

  for (std::uint64_t step = 1; step <= 3; ++step) {
    hone::optimizer_step_args args{.step = step, .lr = 1e-3f, .grad_scale = 0.5f};
    if (step == 3) args.momentum = 0.85f;
    st.step(policy, args, d.master.all().data(), d.grad.all().data());

    const auto c = hone::adamw_coefficients::make(policy.beta1, policy.beta2, policy.eps, args,
                                                  args.lr, policy.weight_decay);
    if (amsgrad) {
      hone::tensor_lists<float, const G, float, float, float> lists;
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        lists.add(sizes[t], d.params[t].data(), d.grads[t].data(), m[t].data(), v[t].data(),
                  vmax[t].data());
      }
      const hone::adamw_amsgrad_functor<G> op{c};
      hone::for_each(lists, op, tuning);
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        for (std::size_t i = 0; i < sizes[t]; ++i) {
          op(ref_p[t][i], d.grads[t][i], ref_m[t][i], ref_v[t][i], ref_vmax[t][i]);
        }
      }
    } else {
      hone::tensor_lists<float, const G, float, float> lists;
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        lists.add(sizes[t], d.params[t].data(), d.grads[t].data(), m[t].data(), v[t].data());
      }
      const hone::adamw_functor<G> op{c};
      hone::for_each(lists, op, tuning);
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        for (std::size_t i = 0; i < sizes[t]; ++i) {
          op(ref_p[t][i], d.grads[t][i], ref_m[t][i], ref_v[t][i]);
        }
      }
    }
  }
  BOOST_TEST(same_as_arena(d.params, d.master));
  BOOST_TEST(same_as_arena(m, st.exp_avg()));
  BOOST_TEST(same_as_arena(v, st.exp_avg_sq()));
  if (amsgrad) BOOST_TEST(same_as_arena(vmax, st.max_exp_avg_sq()));
  BOOST_TEST(same_as_arena(ref_p, d.master));
  BOOST_TEST(same_as_arena(ref_m, st.exp_avg()));
  BOOST_TEST(same_as_arena(ref_v, st.exp_avg_sq()));
  if (amsgrad) BOOST_TEST(same_as_arena(ref_vmax, st.max_exp_avg_sq()));
  // The steps did something (a comparison of untouched arrays would pass trivially).
  const two_layouts<G> fresh(amsgrad ? 11u : 7u);
  BOOST_TEST(!same_bits(fresh.params[0].data(), d.params[0].data(), sizes[0]));
}

/// SGD (plain or with Nesterov momentum) through the state's step and through for_each.
template <class G>
void check_sgd(bool momentum, hone::host_tuning tuning) {
  two_layouts<G> d(momentum ? 31u : 37u);
  const hone::sgd policy{
      .momentum = momentum ? 0.9f : 0.0f, .nesterov = momentum, .weight_decay = 0.01f};
  hone::sgd_state<> st(policy, d.layout);
  auto b = momentum ? d.split(st.momentum_buffer()) : std::vector<std::vector<float>>{};
  auto ref_p = d.params, ref_b = b;  // the element functor, one element at a time

  for (std::uint64_t step = 1; step <= 3; ++step) {
    const hone::optimizer_step_args args{.step = step, .lr = 0.1f, .grad_scale = 0.5f};
    st.step(policy, args, d.master.all().data(), d.grad.all().data());
    if (momentum) {
      const float mu = policy.momentum;
      const bool first = step == 1;
      const hone::sgd_momentum_functor<G> op{.lr = args.lr,
                                             .weight_decay = policy.weight_decay,
                                             .grad_scale = args.grad_scale,
                                             .keep = first ? 0.0f : mu,
                                             .take = first ? 1.0f : 1.0f - policy.dampening,
                                             .nesterov_grad = 1.0f,
                                             .nesterov_buf = mu};
      hone::tensor_lists<float, const G, float> lists;
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        lists.add(sizes[t], d.params[t].data(), d.grads[t].data(), b[t].data());
      }
      hone::for_each(lists, op, tuning);
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        for (std::size_t i = 0; i < sizes[t]; ++i) op(ref_p[t][i], d.grads[t][i], ref_b[t][i]);
      }
    } else {
      hone::tensor_lists<float, const G> lists;
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        lists.add(sizes[t], d.params[t].data(), d.grads[t].data());
      }
      const hone::sgd_functor<G> op{args.lr, policy.weight_decay, args.grad_scale};
      hone::for_each(lists, op, tuning);
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        for (std::size_t i = 0; i < sizes[t]; ++i) op(ref_p[t][i], d.grads[t][i]);
      }
    }
  }
  BOOST_TEST(same_as_arena(d.params, d.master));
  if (momentum) BOOST_TEST(same_as_arena(b, st.momentum_buffer()));
  BOOST_TEST(same_as_arena(ref_p, d.master));
  if (momentum) BOOST_TEST(same_as_arena(ref_b, st.momentum_buffer()));
  const two_layouts<G> fresh(momentum ? 31u : 37u);
  BOOST_TEST(!same_bits(fresh.params[0].data(), d.params[0].data(), sizes[0]));
}

// A functor whose two forms differ on purpose: the vector form adds 1, the element form adds 2.
// So the result shows which form ran on each element.
struct probe {
  float one = 1.0f;
  template <class V>
  HONE_HOST_DEVICE void apply(V& y, const V& x) const {
    y = y + x + V(one);
  }
  HONE_HOST_DEVICE void operator()(float& y, const float& x) const { y = y + x + 2.0f * one; }
};
// The same with an int output: the vector form cannot store it, so the element form runs.
struct probe_int_out {
  template <class V>
  HONE_HOST_DEVICE void apply(V& y, const V& x) const {
    y = y + x + V(1.0f);
  }
  HONE_HOST_DEVICE void operator()(int& y, const float& x) const { y += static_cast<int>(x) + 2; }
};

// Plain user functors (no vector form), written with no product that a compiler could fuse into
// an FMA, so the element loop and the reference loop below must agree bit for bit at any -march.
struct user_math {
  float a;
  HONE_HOST_DEVICE void operator()(float& y, const float& x, const float& z) const {
    y = (y - x) / (z + a) + (x > y ? x : y);
  }
};
struct user_table {  // not trivially copyable: run through the caller's reference
  std::vector<float> table;
  void operator()(float& y, const std::uint8_t& k) const { y = y + table[k]; }
};

}  // namespace

// The optimizer functors and the probe offer a vector form for these lists; the plain functors do
// not. Without SIMD (HONE_NO_SIMD, a CUDA compiler, an unknown CPU) nothing does.
static_assert(
    hone::detail::simd_functor<hone::adamw_functor<float>, float, const float, float, float> ==
    static_cast<bool>(HONE_SIMD));
static_assert(hone::detail::simd_functor<hone::adamw_functor<hone::bfloat16>, float,
                                         const hone::bfloat16, float, float> ==
              static_cast<bool>(HONE_SIMD));
static_assert(hone::detail::simd_functor<hone::sgd_functor<float>, float, const float> ==
              static_cast<bool>(HONE_SIMD));
static_assert(hone::detail::simd_functor<probe, float, const float> ==
              static_cast<bool>(HONE_SIMD));
static_assert(!hone::detail::simd_functor<probe_int_out, int, const float>);
static_assert(!hone::detail::simd_functor<user_math, float, const float, const float>);

BOOST_AUTO_TEST_CASE(adamw_functor_over_separate_tensors_gives_the_bits_of_the_arena_step) {
  for (const hone::host_tuning tuning : {hone::host_tuning{}, hone::host_tuning{.grain = 37}}) {
    BOOST_TEST_CONTEXT("grain " << tuning.grain) {
      check_adamw<float>(false, tuning);
      check_adamw<float>(true, tuning);
      check_adamw<hone::bfloat16>(false, tuning);
    }
  }
}

BOOST_AUTO_TEST_CASE(sgd_functors_over_separate_tensors_give_the_bits_of_the_arena_step) {
  for (const hone::host_tuning tuning : {hone::host_tuning{}, hone::host_tuning{.grain = 37}}) {
    BOOST_TEST_CONTEXT("grain " << tuning.grain) {
      check_sgd<float>(false, tuning);
      check_sgd<float>(true, tuning);
      check_sgd<hone::bfloat16>(true, tuning);
    }
  }
}

BOOST_AUTO_TEST_CASE(for_each_takes_the_vector_form_on_every_element_when_offered) {
  // Which form must have run: the vector form, unless there is none (no SIMD) or the scalar
  // target was chosen (HONE_ISA=scalar, hone::force_isa), which runs the element form.
  const float expected_add = HONE_SIMD && hone::active_isa() != hone::isa::scalar ? 1.0f : 2.0f;
  std::mt19937 rng(5);
  std::vector<std::vector<float>> ys, xs;
  hone::tensor_lists<float, const float> lists;
  for (std::size_t n : sizes) {
    ys.push_back(random_values<float>(n, rng, 1.0f, false));
    xs.push_back(random_values<float>(n, rng, 1.0f, false));
  }
  auto expected = ys;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    for (std::size_t i = 0; i < sizes[t]; ++i) {
      expected[t][i] = expected[t][i] + xs[t][i] + expected_add;
    }
    lists.add(sizes[t], ys[t].data(), static_cast<const float*>(xs[t].data()));
  }
  hone::for_each(lists, probe{}, hone::host_tuning{.grain = 37});
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    BOOST_TEST(differing(ys[t], expected[t]) == 0u, "tensor " << t);
  }

  // The flat form, hone::for_each(n, op, p...), over a range cut into uneven chunks.
  const std::size_t n = 70001;
  auto y = random_values<float>(n, rng, 1.0f, false);
  const auto x = random_values<float>(n, rng, 1.0f, false);
  auto ref = y;
  for (std::size_t i = 0; i < n; ++i) ref[i] = ref[i] + x[i] + expected_add;
  hone::for_each(n, probe{}, hone::host_tuning{.grain = 1001}, y.data(), x.data());
  BOOST_TEST(differing(y, ref) == 0u);

  // An output the vector form cannot store: the element form, on every element.
  std::vector<int> iy(n, 3);
  std::vector<float> fx(n, 4.0f);
  hone::for_each(n, probe_int_out{}, iy.data(), static_cast<const float*>(fx.data()));
  BOOST_TEST(differing(iy, std::vector<int>(n, 9)) == 0u);
}

BOOST_AUTO_TEST_CASE(a_plain_functor_gives_the_scalar_result) {
  std::mt19937 rng(9);
  const user_math op{3.5f};
  std::vector<std::vector<float>> ys, xs, zs;
  hone::tensor_lists<float, const float, const float> lists;
  for (std::size_t n : sizes) {
    ys.push_back(random_values<float>(n, rng, 1.0f, false));
    xs.push_back(random_values<float>(n, rng, 1.0f, false));
    zs.push_back(random_values<float>(n, rng, 1.0f, true));
  }
  auto expected = ys;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    for (std::size_t i = 0; i < sizes[t]; ++i) op(expected[t][i], xs[t][i], zs[t][i]);
    lists.add(sizes[t], ys[t].data(), static_cast<const float*>(xs[t].data()),
              static_cast<const float*>(zs[t].data()));
  }
  hone::for_each(lists, op);
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    BOOST_TEST(same_bits(ys[t].data(), expected[t].data(), sizes[t]), "tensor " << t);
  }

  // A functor that is not trivially copyable runs through the caller's reference.
  user_table tab{std::vector<float>(256)};
  for (std::size_t k = 0; k < 256; ++k) tab.table[k] = 0.25f * static_cast<float>(k);
  const std::size_t n = 100003;
  std::vector<std::uint8_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = static_cast<std::uint8_t>(i * 7);
  std::vector<float> y(n, 1.0f);
  auto ref = y;
  for (std::size_t i = 0; i < n; ++i) tab(ref[i], keys[i]);
  hone::for_each(n, tab, y.data(), static_cast<const std::uint8_t*>(keys.data()));
  BOOST_TEST(differing(y, ref) == 0u);
}
