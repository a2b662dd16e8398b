// The trainer's gradient reduction and step observer roles: a reduction runs after the last
// micro-batch and before the norm, the inf/NaN check and clipping (which see the reduced
// gradients); an observer sees every phase of every step, balanced and in order.
#define BOOST_TEST_MODULE hone_train_trainer_roles
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <hone/optim/sgd.hpp>
#include <hone/schedule/constant.hpp>
#include <hone/train/accumulate.hpp>
#include <hone/train/trainer.hpp>
#include <limits>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "../support/linear_model.hpp"

namespace {
/// What a data-parallel mean over two ranks does when the other rank's gradients are zero: it
/// halves them.
struct halve_gradients {
  using role = hone::roles::gradient_reduction;
  int calls = 0;
  void reduce(std::span<float> g) {
    ++calls;
    for (float& x : g) x *= 0.5f;
  }
};

/// A reduction that receives a non-finite value from "another rank".
struct poisoned_reduction {
  using role = hone::roles::gradient_reduction;
  void reduce(std::span<float> g) { g[g.size() - 1] = std::numeric_limits<float>::infinity(); }
};

/// The reference for halve_gradients: the model itself writes half gradients.
struct halved_linear : linear<float> {
  using linear<float>::linear;
  float forward_backward(const batch& bt, float scale) {
    const float loss = linear<float>::forward_backward(bt, scale);
    for (float& g : gw) g *= 0.5f;
    gb[0] *= 0.5f;
    return loss;
  }
};

struct phase_event {
  bool begin;
  hone::step_phase phase;
  bool operator==(const phase_event&) const = default;
};

struct recording_observer {
  using role = hone::roles::step_observer;
  std::vector<phase_event> events;
  void phase_begin(hone::step_phase p) { events.push_back({true, p}); }
  void phase_end(hone::step_phase p) { events.push_back({false, p}); }
};

/// A model whose forward_backward throws on demand.
struct throwing_linear : linear<float> {
  using linear<float>::linear;
  bool fail = false;
  float forward_backward(const batch& bt, float scale) {
    if (fail) throw std::runtime_error("model failure");
    return linear<float>::forward_backward(bt, scale);
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<batch> micro_batches(unsigned seed) {
  return {make_batch(8, 6, seed), make_batch(5, 6, seed + 100)};
}

using hone::step_phase;
std::vector<phase_event> both(step_phase p) {
  return {{true, p}, {false, p}};
}
std::vector<phase_event> concat(std::initializer_list<std::vector<phase_event>> parts) {
  std::vector<phase_event> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
}  // namespace

static_assert(std::is_same_v<hone::trainer<linear<float>>::reduction_type, hone::local_gradients>);
static_assert(std::is_same_v<hone::trainer<linear<float>>::observer_type, hone::no_step_observer>);
static_assert(
    std::is_same_v<hone::trainer<linear<float>, halve_gradients>::reduction_type, halve_gradients>);
static_assert(!hone::plays_role_v<halve_gradients, hone::roles::step_observer>);

BOOST_AUTO_TEST_CASE(a_reduction_feeds_the_norm_the_clipping_and_the_update) {
  // Clipping at a norm between the halved and the full gradient norm: the trainer must clip by
  // the reduced gradients, exactly as if the model had produced them.
  const hone::sgd opt{};
  const hone::constant_lr lr{.base_lr = 0.05};
  const hone::clip_grad_norm clip{.max_norm = 0.8f};
  linear<float> m(6);
  halved_linear ref(6);
  hone::trainer t(m, opt, lr, clip, hone::accumulate::by_count{}, halve_gradients{});
  hone::trainer r(ref, opt, lr, clip, hone::accumulate::by_count{});
  bool clipped = false;
  for (unsigned s = 0; s < 6; ++s) {
    const auto mb = micro_batches(s);
    const auto a = t.step(std::span<const batch>(mb));
    const auto b = r.step(std::span<const batch>(mb));
    // The norm of the reduced gradients is summed in another order than the reference's fused
    // pass, so the last bits may differ; a missing or misplaced reduction is off by 2x.
    BOOST_TEST(a.grad_norm == b.grad_norm, boost::test_tools::tolerance(1e-12));
    BOOST_TEST(!a.skipped);
    clipped = clipped || a.grad_norm > clip.max_norm;
    BOOST_TEST(m.w == ref.w, boost::test_tools::tolerance(1e-6f)
                                 << boost::test_tools::per_element());
    BOOST_TEST(m.b[0] == ref.b[0], boost::test_tools::tolerance(1e-6f));
  }
  BOOST_TEST(clipped);  // the clip coefficient was exercised
  BOOST_TEST(t.gradient_reduction().calls == 6);
}

BOOST_AUTO_TEST_CASE(a_non_finite_reduced_gradient_skips_the_step) {
  linear<float> m(6);
  const std::vector<float> w0 = m.w;
  hone::trainer t(m, hone::sgd{}, hone::constant_lr{.base_lr = 0.05}, poisoned_reduction{},
                  hone::accumulate::by_count{});
  const auto mb = micro_batches(1);
  const auto r = t.step(std::span<const batch>(mb));
  BOOST_TEST(r.skipped);
  BOOST_TEST(!std::isfinite(r.grad_norm));
  BOOST_TEST(t.steps_done() == 0u);
  BOOST_TEST(same_bits(m.w, w0));
}

BOOST_AUTO_TEST_CASE(an_observer_sees_every_phase_in_order) {
  linear<float> m(6);
  hone::trainer t(m, hone::sgd{}, hone::constant_lr{.base_lr = 0.05}, recording_observer{},
                  halve_gradients{}, hone::accumulate::by_count{});
  const auto mb = micro_batches(2);
  (void)t.step(std::span<const batch>(mb));
  const auto want = concat(
      {both(step_phase::checkpoint), both(step_phase::forward_backward), both(step_phase::unscale),
       both(step_phase::forward_backward), both(step_phase::unscale), both(step_phase::reduce),
       both(step_phase::check), both(step_phase::optimizer), both(step_phase::checkpoint)});
  BOOST_TEST((t.observer().events == want));
  // Without a reduction there is no reduce phase.
  linear<float> m2(6);
  hone::trainer t2(m2, recording_observer{});
  (void)t2.step(mb[0]);
  const auto want2 = concat({both(step_phase::checkpoint), both(step_phase::forward_backward),
                             both(step_phase::unscale), both(step_phase::check),
                             both(step_phase::optimizer), both(step_phase::checkpoint)});
  BOOST_TEST((t2.observer().events == want2));
  BOOST_TEST(std::string_view(hone::to_string(step_phase::forward_backward)) == "forward_backward");
}

BOOST_AUTO_TEST_CASE(an_observer_sees_the_end_of_a_phase_that_throws) {
  throwing_linear m(6);
  hone::trainer t(m, recording_observer{});
  m.fail = true;
  BOOST_CHECK_THROW((void)t.step(make_batch(4, 6, 3)), std::runtime_error);
  const auto want = concat({both(step_phase::checkpoint), both(step_phase::forward_backward)});
  BOOST_TEST((t.observer().events == want));
  BOOST_TEST(t.steps_done() == 0u);
}
