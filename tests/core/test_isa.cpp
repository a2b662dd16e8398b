// Tests of the run-time choice of instruction set (hone/core/isa.hpp, core/detail/simd.hpp): the
// vector loops give the bits of the scalar element loop on every target this CPU supports, for the
// optimizers (over tensor lists and over arenas, fp32/bf16/fp16 gradients, special values), for a
// user's functor whose vector form is not inlined, and for every fp16 and bf16 bit pattern widened
// on load; the targets offered match the CPU's flags in /proc/cpuinfo; HONE_ISA and force_isa
// reject unknown and unsupported targets with a sentence.
#define BOOST_TEST_MODULE hone_core_isa
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <hone/core/arena.hpp>
#include <hone/core/bfloat16.hpp>
#include <hone/core/half.hpp>
#include <hone/core/isa.hpp>
#include <hone/core/multi_tensor.hpp>
#include <hone/core/parallel.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/adamw_8bit.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/optim/sgd.hpp>
#include <hone/precision/unscale.hpp>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

// Vector bodies and tails at every width (4, 8, 16), one element, and a tensor over the default
// grain (64 Ki) so it is cut into chunks.
const std::vector<std::size_t> sizes = {1, 3, 17, 31, 1000, 70001};

const std::vector<hone::isa> all_targets = {hone::isa::scalar, hone::isa::sse2, hone::isa::avx2,
                                            hone::isa::avx512, hone::isa::neon};

std::vector<hone::isa> supported_targets() {
  std::vector<hone::isa> out;
  for (hone::isa t : all_targets) {
    if (hone::isa_supported(t)) out.push_back(t);
  }
  return out;
}

template <class T>
std::uint64_t bits_of(T x) {
  std::uint64_t u = 0;
  std::memcpy(&u, &x, sizeof(T));
  return u;
}

/// Random values with a sprinkling of the special ones a gradient can hold: zeros of both signs,
/// subnormals (of T), infinities and NaNs (quiet, and signalling where T has them).
template <class T>
std::vector<T> values(std::size_t n, std::mt19937& rng, float scale, bool special) {
  std::normal_distribution<float> nd;
  std::vector<T> out(n);
  for (auto& x : out) x = T(scale * nd(rng));
  if (special && n > 8) {
    out[1] = T(-0.0f);
    out[2] = std::numeric_limits<T>::denorm_min();
    out[3] = std::numeric_limits<T>::infinity();
    out[4] = T(-std::numeric_limits<float>::infinity());
    out[5] = std::numeric_limits<T>::quiet_NaN();
    out[6] = std::numeric_limits<T>::signaling_NaN();
    out[n - 1] = T(-scale);
  }
  return out;
}

/// Fixed random parameters, gradients and states for the optimizers, one vector per tensor.
template <class G>
struct problem {
  std::vector<std::vector<float>> p, m, v, vmax;
  std::vector<std::vector<G>> g;
  explicit problem(bool special) {
    std::mt19937 rng(17);
    for (std::size_t n : sizes) {
      p.push_back(values<float>(n, rng, 1.0f, false));
      g.push_back(values<G>(n, rng, 1e-2f, special));
      m.push_back(values<float>(n, rng, 1e-3f, false));
      auto vv = values<float>(n, rng, 1e-5f, false);
      for (auto& x : vv) x = std::fabs(x);
      v.push_back(vv);
      vmax.push_back(vv);
      for (auto& x : vmax.back()) x *= 1.5f;
    }
  }
  bool operator==(const problem& o) const {
    return same(p, o.p) && same(m, o.m) && same(v, o.v) && same(vmax, o.vmax);
  }
  static bool same(const std::vector<std::vector<float>>& a,
                   const std::vector<std::vector<float>>& b) {
    for (std::size_t t = 0; t < a.size(); ++t) {
      if (std::memcmp(a[t].data(), b[t].data(), a[t].size() * sizeof(float)) != 0) return false;
    }
    return true;
  }
};

/// Three steps of every host optimizer functor through hone::for_each on target `t`.
template <class G>
problem<G> run_optimizers(hone::isa t, bool special) {
  const hone::scoped_isa on(t);
  problem<G> pr(special);
  for (std::uint64_t step = 1; step <= 3; ++step) {
    hone::optimizer_step_args args{.step = step, .lr = 1e-3f, .grad_scale = 0.5f};
    const auto c = hone::adamw_coefficients::make(0.9f, 0.999f, 1e-8f, args, args.lr, 0.05f);
    hone::tensor_lists<float, const G, float, float> adam;
    hone::tensor_lists<float, const G, float, float, float> ams;
    hone::tensor_lists<float, const G> plain;
    hone::tensor_lists<float, const G, float> momentum;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      adam.add(sizes[k], pr.p[k].data(), pr.g[k].data(), pr.m[k].data(), pr.v[k].data());
      ams.add(sizes[k], pr.p[k].data(), pr.g[k].data(), pr.m[k].data(), pr.v[k].data(),
              pr.vmax[k].data());
      plain.add(sizes[k], pr.p[k].data(), pr.g[k].data());
      momentum.add(sizes[k], pr.p[k].data(), pr.g[k].data(), pr.m[k].data());
    }
    hone::for_each(adam, hone::adamw_functor<G>{c});
    hone::for_each(ams, hone::adamw_amsgrad_functor<G>{c});
    hone::for_each(plain, hone::sgd_functor<G>{1e-2f, 1e-4f, 0.5f});
    hone::for_each(momentum, hone::sgd_momentum_functor<G>{
                                 1e-2f, 1e-4f, 0.5f, step == 1 ? 0.0f : 0.9f, 1.0f, 0.0f, 1.0f});
  }
  return pr;
}

template <class G>
void check_optimizers_on_every_target(bool special) {
  const auto reference = run_optimizers<G>(hone::isa::scalar, special);
  // The steps did something (a comparison of untouched arrays would pass trivially).
  BOOST_TEST(!(reference == problem<G>(special)));
  for (hone::isa t : supported_targets()) {
    BOOST_TEST_CONTEXT("target " << hone::to_string(t)) {
      BOOST_TEST((run_optimizers<G>(t, special) == reference));
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_offered_targets_match_the_cpu_flags) {
  const auto targets = supported_targets();
  BOOST_TEST_MESSAGE("targets: " << hone::detail::supported_isa_list()
                                 << "; active: " << hone::to_string(hone::active_isa()));
  BOOST_TEST(hone::isa_supported(hone::isa::scalar));
  BOOST_TEST(hone::isa_supported(hone::active_isa()));
  BOOST_TEST((hone::best_isa() == targets.back() || targets.back() == hone::isa::neon));
  if (const char* env = std::getenv("HONE_ISA"); env != nullptr && *env != '\0') {
    BOOST_TEST((hone::active_isa() == hone::detail::parse_isa(env, "HONE_ISA")));
  } else {
    BOOST_TEST((hone::active_isa() == hone::best_isa()));
  }
#if defined(HONE_ISA_DISPATCH)
  // The independent reference: the kernel's list of the CPU's flags.
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::set<std::string> flags;
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string w; words >> w;) flags.insert(w);
    break;
  }
  if (flags.empty()) {
    BOOST_TEST_MESSAGE("no /proc/cpuinfo flags: the CPU check is skipped");
    return;
  }
  const bool avx2 = flags.count("avx2") && flags.count("fma") && flags.count("f16c");
  const bool avx512 = avx2 && flags.count("avx512f") && flags.count("avx512bw") &&
                      flags.count("avx512dq") && flags.count("avx512vl");
  BOOST_TEST(hone::isa_supported(hone::isa::sse2));
  BOOST_TEST(hone::isa_supported(hone::isa::avx2) == avx2);
  BOOST_TEST(hone::isa_supported(hone::isa::avx512) == (avx512 && hone::detail::avx512_allowed));
  BOOST_TEST(!hone::isa_supported(hone::isa::neon));
#endif
}

BOOST_AUTO_TEST_CASE(optimizers_give_the_scalar_bits_on_every_target_fp32_grads) {
  check_optimizers_on_every_target<float>(false);
  check_optimizers_on_every_target<float>(true);
}

BOOST_AUTO_TEST_CASE(optimizers_give_the_scalar_bits_on_every_target_bf16_grads) {
  check_optimizers_on_every_target<hone::bfloat16>(false);
  check_optimizers_on_every_target<hone::bfloat16>(true);
}

BOOST_AUTO_TEST_CASE(optimizers_give_the_scalar_bits_on_every_target_fp16_grads) {
  check_optimizers_on_every_target<hone::half>(false);
  check_optimizers_on_every_target<hone::half>(true);
}

namespace {
/// A user's functor whose vector form the compiler is told not to inline: it is compiled for the
/// default target and calls the chosen target's register operations out of line.
struct user_functor {
  float a, b;
  template <class V>
  __attribute__((noinline)) void apply(V& y, const V& x) const {
    y = hone::detail::optim_sqrt(hone::detail::optim_max(y * V(a) + x, V(0.0f))) / V(b);
  }
  void operator()(float& y, const float& x) const {
    using hone::detail::sfloat;
    y = (hone::detail::optim_sqrt(
             hone::detail::optim_max(sfloat(y) * sfloat(a) + sfloat(x), sfloat(0.0f))) /
         sfloat(b))
            .v;
  }
};

/// Widens one element of an fp16 or bf16 array into a float array (every target's widening load).
template <class S>
struct widen {
  template <class V>
  void apply(V& out, const V& in) const {
    out = in;
  }
  void operator()(float& out, const S& in) const { out = hone::to_float(in); }
};

template <class S>
std::vector<float> widen_all_patterns(hone::isa t) {
  const hone::scoped_isa on(t);
  std::vector<S> in(65536);
  for (std::uint32_t u = 0; u < 65536; ++u) in[u] = S::from_bits(static_cast<std::uint16_t>(u));
  std::vector<float> out(in.size(), -1.0f);
  hone::tensor_lists<float, const S> lists;
  lists.add(in.size() - 5, out.data(), in.data());  // a tail at every width
  lists.add(5, out.data() + in.size() - 5, in.data() + in.size() - 5);
  hone::for_each(lists, widen<S>{});
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_users_functor_that_is_not_inlined_gives_the_scalar_bits) {
  std::vector<float> x(4099);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto& e : x) e = nd(rng);
  const auto run = [&](hone::isa t) {
    const hone::scoped_isa on(t);
    std::vector<float> y(x.size(), 0.25f);
    hone::tensor_lists<float, const float> lists;
    lists.add(y.size(), y.data(), x.data());
    hone::for_each(lists, user_functor{1.5f, 3.0f});
    return y;
  };
  const auto reference = run(hone::isa::scalar);
  for (hone::isa t : supported_targets()) {
    BOOST_TEST_CONTEXT("target " << hone::to_string(t)) {
      BOOST_TEST(std::memcmp(run(t).data(), reference.data(), x.size() * sizeof(float)) == 0);
    }
  }
}

BOOST_AUTO_TEST_CASE(every_fp16_and_bf16_pattern_widens_to_to_float_on_every_target) {
  for (hone::isa t : supported_targets()) {
    const auto h = widen_all_patterns<hone::half>(t);
    const auto b = widen_all_patterns<hone::bfloat16>(t);
    std::size_t wrong_h = 0, wrong_b = 0;
    for (std::uint32_t u = 0; u < 65536; ++u) {
      const auto hu = static_cast<std::uint16_t>(u);
      const float eh = hone::to_float(hone::half::from_bits(hu));
      const float eb = hone::to_float(hone::bfloat16::from_bits(hu));
      wrong_h += bits_of(h[u]) != bits_of(eh);  // NaN payloads and signalling-ness included
      wrong_b += bits_of(b[u]) != bits_of(eb);
    }
    BOOST_TEST_CONTEXT("target " << hone::to_string(t)) {
      BOOST_TEST(wrong_h == 0u);
      BOOST_TEST(wrong_b == 0u);
    }
  }
}

BOOST_AUTO_TEST_CASE(arena_steps_give_the_scalar_bits_on_every_target) {
  hone::arena_layout layout(sizeof(float));
  for (std::size_t k = 0; k < sizes.size(); ++k) layout.add("t" + std::to_string(k), sizes[k]);
  const auto run = [&](hone::isa t) {
    const hone::scoped_isa on(t);
    std::mt19937 rng(5);
    std::normal_distribution<float> nd;
    hone::arena<float> p32(layout), p8(layout), grad(layout);
    for (auto& x : p32.all()) x = nd(rng);
    for (std::size_t i = 0; i < p8.all().size(); ++i) p8.all()[i] = p32.all()[i];
    const hone::adamw o32{.weight_decay = 0.05f, .amsgrad = true};
    const hone::adamw_8bit o8{.weight_decay = 0.05f, .min_8bit_size = 64};
    hone::adamw_state<> s32(o32, layout);
    hone::adamw_8bit_state<> s8(o8, layout);
    for (std::uint64_t step = 1; step <= 3; ++step) {
      for (auto& x : grad.all()) x = 0.01f * nd(rng);
      const hone::optimizer_step_args args{.step = step, .lr = 1e-3f, .grad_scale = 0.5f};
      s32.step(o32, args, p32.all().data(), static_cast<const float*>(grad.all().data()));
      s8.step(o8, args, p8.all().data(), static_cast<const float*>(grad.all().data()));
    }
    std::vector<float> out(p32.all().begin(), p32.all().end());
    out.insert(out.end(), p8.all().begin(), p8.all().end());
    return out;
  };
  const auto reference = run(hone::isa::scalar);
  for (hone::isa t : supported_targets()) {
    BOOST_TEST_CONTEXT("target " << hone::to_string(t)) {
      BOOST_TEST(std::memcmp(run(t).data(), reference.data(), reference.size() * 4) == 0);
    }
  }
}

BOOST_AUTO_TEST_CASE(unknown_and_unsupported_targets_are_config_errors_with_a_sentence) {
  try {
    hone::detail::parse_isa("avx9000", "the environment variable HONE_ISA");
    BOOST_FAIL("an unknown name was accepted");
  } catch (const hone::config_error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("HONE_ISA") != std::string::npos);
    BOOST_TEST(what.find("\"avx9000\"") != std::string::npos);
    BOOST_TEST(what.find("use one of scalar, sse2, avx2, avx512, neon") != std::string::npos);
  }
  BOOST_TEST((hone::detail::parse_isa("avx2", "x") == hone::isa::avx2));
  const hone::isa before = hone::active_isa();
  for (hone::isa t : all_targets) {
    if (hone::isa_supported(t)) continue;
    BOOST_TEST_CONTEXT("target " << hone::to_string(t)) {
      try {
        hone::force_isa(t);
        BOOST_FAIL("an unsupported target was accepted");
      } catch (const hone::config_error& e) {
        const std::string what = e.what();
        BOOST_TEST(what.find(std::string(hone::to_string(t))) != std::string::npos);
        BOOST_TEST(what.find("it supports: scalar") != std::string::npos);
      }
      BOOST_TEST((hone::active_isa() == before));  // a refused choice changes nothing
    }
  }
  {
    const hone::scoped_isa on(hone::isa::scalar);
    BOOST_TEST((hone::active_isa() == hone::isa::scalar));
  }
  BOOST_TEST((hone::active_isa() == before));
}

namespace {
/// Float bit patterns covering every exponent with many mantissas, the rounding boundaries of
/// fp16 and bf16 (ties, the overflow threshold, the subnormal range) and every kind of NaN.
std::vector<float> float_patterns() {
  std::vector<std::uint32_t> bits;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 65521) {
    bits.push_back(static_cast<std::uint32_t>(u));
  }
  for (std::uint32_t e = 0; e < 256; ++e) {
    for (std::uint32_t low : {0x0u, 0x1u, 0xfffu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7fffu,
                              0x8000u, 0x8001u, 0x18000u, 0x7fffffu, 0x400000u, 0x400001u}) {
      for (std::uint32_t sign : {0x0u, 0x80000000u}) bits.push_back(sign | (e << 23) | low);
    }
  }
  for (std::uint32_t b : {0x477fefffu, 0x477ff000u, 0x477ff001u, 0x7f7fffffu, 0x7f7f8000u,
                          0x33000000u, 0x33000001u, 0x387fe000u, 0x387ff000u, 0x38800000u}) {
    bits.push_back(b);
  }
  std::vector<float> out(bits.size());
  std::memcpy(out.data(), bits.data(), bits.size() * sizeof(float));
  return out;
}

template <class W>
std::vector<W> cast_on(hone::isa t, const std::vector<float>& in) {
  const hone::scoped_isa on(t);
  std::vector<W> out(in.size());
  hone::tensor_lists<W, const float> lists;
  lists.add(in.size() - 3, out.data(), in.data());
  lists.add(3, out.data() + in.size() - 3, in.data() + in.size() - 3);
  hone::for_each(lists, hone::cast_to_working<W>{});
  return out;
}

template <class W>
void check_casts(const std::vector<float>& in) {
  std::vector<W> expected(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) expected[i] = static_cast<W>(in[i]);
  for (hone::isa t : supported_targets()) {
    const auto got = cast_on<W>(t, in);
    std::size_t wrong = 0, first = in.size();
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (bits_of(got[i]) != bits_of(expected[i])) {
        ++wrong;
        if (first == in.size()) first = i;
      }
    }
    BOOST_TEST_CONTEXT("target " << hone::to_string(t) << ", first wrong input bits "
                                 << (first < in.size() ? bits_of(in[first]) : 0)) {
      BOOST_TEST(wrong == 0u);
    }
  }
}

/// An element functor without a vector form, with a product followed by an add (which an FMA
/// would change): its element loop gives the same bits on every target.
struct axpby_element {
  float a, b;
  void operator()(float& y, const float& x) const { y = a * x + b * y; }
};
}  // namespace

BOOST_AUTO_TEST_CASE(casts_to_fp16_and_bf16_round_as_hone_on_every_target) {
  const auto in = float_patterns();
  BOOST_TEST_MESSAGE(in.size() << " float patterns");
  check_casts<hone::half>(in);
  check_casts<hone::bfloat16>(in);
  check_casts<float>(in);
}

BOOST_AUTO_TEST_CASE(unscale_norms_and_element_loops_give_the_same_bits_on_every_target) {
  std::mt19937 rng(9);
  const std::size_t n = 100003;
  const auto gf = values<float>(n, rng, 3.0f, false);
  const auto gh = values<hone::half>(n, rng, 3.0f, false);
  const auto gb = values<hone::bfloat16>(n, rng, 3.0f, false);
  auto x = values<float>(n, rng, 1.0f, false);
  struct result {
    std::vector<float> masters;
    std::vector<double> sums;
    std::vector<float> y;
  };
  const auto run = [&](hone::isa t) {
    const hone::scoped_isa on(t);
    result r;
    const auto unscale = [&](const auto& g) {
      using G = typename std::decay_t<decltype(g)>::value_type;
      std::vector<float> master(n, 0.5f);
      hone::tensor_lists<float, const G> lists;
      lists.add(n, master.data(), g.data());
      r.sums.push_back(hone::unscale_accumulate_into(lists, 0.125f, true));
      r.sums.push_back(hone::unscale_accumulate_into(lists, 0.25f, false));
      // The first micro-batch's blocked loop gives the bits of the element functor's reduction.
      std::vector<float> master2(n, 0.5f);
      hone::tensor_lists<float, const G> lists2;
      lists2.add(n, master2.data(), g.data());
      const double by_functor = hone::transform_reduce(
          lists2, 0.0, hone::unscale_accumulate<G, false>{0.25f}, hone::plus{});
      BOOST_TEST(bits_of(by_functor) == bits_of(r.sums.back()));
      BOOST_TEST(std::memcmp(master2.data(), master.data(), n * sizeof(float)) == 0);
      r.sums.push_back(hone::transform_reduce(n, 0.0, hone::detail::square_to_double{},
                                              hone::plus{}, hone::host_tuning{}, g.data()));
      r.masters.insert(r.masters.end(), master.begin(), master.end());
    };
    unscale(gf);
    unscale(gh);
    unscale(gb);
    r.y.assign(n, 0.75f);
    hone::tensor_lists<float, const float> lists;
    lists.add(n, r.y.data(), x.data());
    hone::for_each(lists, axpby_element{1.1f, 0.3f});
    return r;
  };
  const auto reference = run(hone::isa::scalar);
  BOOST_TEST(reference.sums[0] > 0.0);
  for (hone::isa t : supported_targets()) {
    BOOST_TEST_CONTEXT("target " << hone::to_string(t)) {
      const auto r = run(t);
      BOOST_TEST(std::memcmp(r.masters.data(), reference.masters.data(),
                             r.masters.size() * sizeof(float)) == 0);
      BOOST_TEST(
          std::memcmp(r.sums.data(), reference.sums.data(), r.sums.size() * sizeof(double)) == 0);
      BOOST_TEST(std::memcmp(r.y.data(), reference.y.data(), n * sizeof(float)) == 0);
    }
  }
}
