// The composed trainer: policy picking, accumulation (the 2024 normalization bug), fault
// injection (an inf/NaN gradient skips the step and leaves every piece of state bit-identical),
// mixed precision, clipping, and parity with the same math written by hand.
#define BOOST_TEST_MODULE hone_train_trainer
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <hone/offload/optimizer_to_host.hpp>
#include <hone/optim/param_group.hpp>
#include <hone/optim/sgd.hpp>
#include <hone/schedule/one_cycle.hpp>
#include <hone/train/trainer.hpp>
#include <limits>
#include <random>
#include <string_view>
#include <vector>

#include "../support/linear_model.hpp"

namespace {
// y = w . x + b with mean squared error, in working type T. Storage either one contiguous block
// laid out like hone's arena (zero-copy for fp32) or separate vectors.

/// linear<T> whose weights and gradients live in two arenas laid out like the trainer's
/// (bind_parameters style): in fp32 the trainer uses them in place (zero copy).
template <class T>
struct arena_linear {
  hone::arena_layout layout{sizeof(T)};
  hone::arena<T> values, grads;
  linear<T> m;
  explicit arena_linear(std::size_t d) : m(d) {
    layout.add("w", d);
    layout.add("bias", 1);
    values = hone::arena<T>(layout);
    grads = hone::arena<T>(layout);
    std::copy(m.w.begin(), m.w.end(), values.view(0).begin());
    values.view(1)[0] = m.b[0];
  }
  std::vector<hone::parameter<T>> parameters() {
    return {{"w", {m.dim}, values.view(0), grads.view(0)},
            {"bias", {1}, values.view(1), grads.view(1)}};
  }
  float forward_backward(const batch& bt, float scale) {
    std::copy(values.view(0).begin(), values.view(0).end(), m.w.begin());
    m.b[0] = values.view(1)[0];
    const float loss = m.forward_backward(bt, scale);
    std::copy(m.gw.begin(), m.gw.end(), grads.view(0).begin());
    grads.view(1)[0] = m.gb[0];
    return loss;
  }
  std::vector<float> weights() const {  // w then bias (the arena's padding left out)
    std::vector<float> v;
    for (std::size_t i = 0; i < layout.size(); ++i) {
      for (const T& x : values.view(i)) v.push_back(static_cast<float>(x));
    }
    return v;
  }
};

using bound_linear = arena_linear<float>;

batch concat(const std::vector<batch>& parts) {
  batch all;
  for (const auto& p : parts) {
    all.x.insert(all.x.end(), p.x.begin(), p.x.end());
    all.y.insert(all.y.end(), p.y.begin(), p.y.end());
  }
  return all;
}

template <class T>
std::vector<float> snapshot(std::span<T> s) {
  std::vector<float> v;
  for (const auto& x : s) v.push_back(static_cast<float>(x));
  return v;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
}  // namespace

// ---- composition ----
using default_trainer = hone::trainer<linear<float>>;
static_assert(std::is_same_v<default_trainer::precision_type, hone::fp32>);
static_assert(std::is_same_v<default_trainer::accumulation_type, hone::accumulate::none>);
static_assert(std::is_same_v<default_trainer::optimizer_type, hone::adamw>);
static_assert(std::is_same_v<default_trainer::clipping_type, hone::no_clipping>);
static_assert(std::is_same_v<default_trainer::schedule_type, hone::constant_lr>);
using ordered = hone::trainer<linear<hone::bfloat16>, hone::bf16_mixed, hone::sgd,
                              hone::accumulate::steps<2>, hone::one_cycle>;
using shuffled = hone::trainer<linear<hone::bfloat16>, hone::one_cycle, hone::accumulate::steps<2>,
                               hone::sgd, hone::bf16_mixed>;
static_assert(std::is_same_v<ordered::optimizer_type, shuffled::optimizer_type>);
static_assert(std::is_same_v<ordered::schedule_type, hone::one_cycle>);
static_assert(std::is_same_v<shuffled::accumulation_type, hone::accumulate::steps<2>>);
static_assert(std::is_same_v<shuffled::precision_type, hone::bf16_mixed>);

BOOST_AUTO_TEST_CASE(by_count_accumulation_equals_one_big_batch) {
  const std::size_t dim = 6;
  // Uneven micro-batches: 3, 17 and 44 rows.
  const std::vector<batch> parts{make_batch(3, dim, 1), make_batch(17, dim, 2),
                                 make_batch(44, dim, 3)};
  const batch all = concat(parts);

  linear<float> m1(dim), m2(dim), m3(dim);
  hone::trainer acc(m1, hone::accumulate::by_count{}, hone::sgd{},
                    hone::constant_lr{.base_lr = 1e-3});
  hone::trainer big(m2, hone::sgd{}, hone::constant_lr{.base_lr = 1e-3});
  hone::trainer naive(m3, hone::accumulate::steps<3>{}, hone::sgd{},
                      hone::constant_lr{.base_lr = 1e-3});
  acc.step(std::span<const batch>(parts));
  big.step(all);
  naive.step(std::span<const batch>(parts));
  const auto ga = acc.master_gradients();
  const auto gb = big.master_gradients();
  const auto gn = naive.master_gradients();
  double worst = 0, naive_err = 0;
  for (std::size_t i = 0; i < ga.size(); ++i) {
    worst = std::max(worst, double(std::abs(ga[i] - gb[i])) / (1e-6 + std::abs(gb[i])));
    naive_err = std::max(naive_err, double(std::abs(gn[i] - gb[i])) / (1e-6 + std::abs(gb[i])));
  }
  BOOST_TEST(worst < 1e-5);
  // The mean of per-micro-batch means (the 2024 bug) is visibly different here.
  BOOST_TEST(naive_err > 1e-2);
}

BOOST_AUTO_TEST_CASE(steps_n_is_the_mean_and_checks_the_count) {
  const std::size_t dim = 4;
  const std::vector<batch> parts{make_batch(8, dim, 4), make_batch(8, dim, 5)};
  linear<float> m1(dim), m2(dim);
  hone::trainer acc(m1, hone::accumulate::steps<2>{}, hone::sgd{},
                    hone::constant_lr{.base_lr = 1e-3});
  hone::trainer big(m2, hone::sgd{}, hone::constant_lr{.base_lr = 1e-3});
  acc.step(std::span<const batch>(parts));
  big.step(concat(parts));
  for (std::size_t i = 0; i < acc.master_gradients().size(); ++i) {
    BOOST_TEST(acc.master_gradients()[i] == big.master_gradients()[i],
               boost::test_tools::tolerance(1e-5f));
  }
  BOOST_CHECK_THROW(acc.step(parts[0]), hone::config_error);  // 1 micro-batch for steps<2>
}

BOOST_AUTO_TEST_CASE(fp32_zero_copy_matches_hand_written_adamw) {
  const std::size_t dim = 5;
  bound_linear model(dim);
  hone::trainer t(model, hone::adamw{.weight_decay = 0.1f}, hone::constant_lr{.base_lr = 0.01});
  BOOST_TEST(t.zero_copy());
  BOOST_TEST(t.master_weights().data() == model.values.all().data());

  // Reference: the same model math, AdamW (PyTorch formula) in double, by hand.
  linear<float> ref(dim);
  std::vector<double> p(ref.w.begin(), ref.w.end()), m(dim + 1, 0.0), v(dim + 1, 0.0);
  p.push_back(ref.b[0]);
  for (int s = 1; s <= 5; ++s) {
    const batch bt = make_batch(16, dim, static_cast<unsigned>(10 + s));
    const auto r = t.step(bt);
    BOOST_TEST(!r.skipped);
    for (std::size_t i = 0; i < dim; ++i) ref.w[i] = static_cast<float>(p[i]);
    ref.b[0] = static_cast<float>(p[dim]);
    ref.forward_backward(bt, 1.0f);
    for (std::size_t i = 0; i <= dim; ++i) {
      const double g = i < dim ? ref.gw[i] : ref.gb[0];
      p[i] *= 1 - 0.01 * 0.1;
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      const double mh = m[i] / (1 - std::pow(0.9, s)), vh = v[i] / (1 - std::pow(0.999, s));
      p[i] -= 0.01 * mh / (std::sqrt(vh) + 1e-8);
    }
  }
  for (std::size_t i = 0; i < dim; ++i) {
    BOOST_TEST(model.values.view(0)[i] == p[i], boost::test_tools::tolerance(1e-4));
  }
  BOOST_TEST(t.steps_done() == 5u);
}

BOOST_AUTO_TEST_CASE(nan_gradient_skips_step_and_leaves_state_bit_identical) {
  const std::size_t dim = 8;
  for (float poison :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    linear<float> model(dim);
    hone::trainer t(model, hone::adamw{}, hone::one_cycle{.max_lr = 0.01, .total_steps = 100});
    const batch bt = make_batch(16, dim, 7);
    t.step(bt);
    t.step(bt);
    const auto weights = snapshot(t.master_weights());
    const auto model_w = snapshot(std::span<float>(model.w));
    const auto m = snapshot(t.optimizer_state().exp_avg().all());
    const auto v = snapshot(t.optimizer_state().exp_avg_sq().all());
    const auto steps = t.steps_done();
    model.nan_in_grad = poison;
    const auto r = t.step(bt);
    BOOST_TEST(r.skipped);
    BOOST_TEST(!std::isfinite(r.grad_norm));
    BOOST_TEST(same_bits(weights, snapshot(t.master_weights())));
    BOOST_TEST(same_bits(model_w, snapshot(std::span<float>(model.w))));
    BOOST_TEST(same_bits(m, snapshot(t.optimizer_state().exp_avg().all())));
    BOOST_TEST(same_bits(v, snapshot(t.optimizer_state().exp_avg_sq().all())));
    BOOST_TEST(t.steps_done() == steps);
    BOOST_TEST(t.scaler().state().skipped_steps == 1u);
    // The schedule did not move: the next good step uses the lr the skipped one would have.
    model.nan_in_grad = 0;
    const auto next = t.step(bt);
    BOOST_TEST(next.lr == r.lr);
    BOOST_TEST(!next.skipped);
  }
}

BOOST_AUTO_TEST_CASE(bf16_overflow_check_keeps_inf_out_of_the_moments) {
  const std::size_t dim = 8;
  linear<hone::bfloat16> model(dim);
  hone::trainer t(model, hone::bf16_mixed{}, hone::adamw{});
  BOOST_TEST(!t.zero_copy());
  const batch bt = make_batch(16, dim, 9);
  BOOST_TEST(!t.step(bt).skipped);
  const auto m = snapshot(t.optimizer_state().exp_avg().all());
  const auto master = snapshot(t.master_weights());
  model.nan_in_grad = std::numeric_limits<float>::infinity();
  BOOST_TEST(t.step(bt).skipped);
  BOOST_TEST(same_bits(m, snapshot(t.optimizer_state().exp_avg().all())));
  BOOST_TEST(same_bits(master, snapshot(t.master_weights())));
  // Working weights are the master weights rounded to bf16.
  for (std::size_t i = 0; i < dim; ++i) {
    BOOST_TEST(model.w[i].bits() == hone::bfloat16(t.master_weights()[i]).bits());
  }
}

BOOST_AUTO_TEST_CASE(fp16_dynamic_scale_backs_off_and_unscales) {
  const std::size_t dim = 4;
  linear<hone::half> model(dim);
  hone::trainer t(model, hone::fp16_mixed<>{.scaler = {.init_scale = 1024, .growth_interval = 2}},
                  hone::sgd{}, hone::constant_lr{.base_lr = 1e-3});
  const batch bt = make_batch(8, dim, 11);
  // Master gradients are unscaled: compare with an fp32 run from the same (fp16) weights.
  linear<float> ref(dim);
  for (std::size_t i = 0; i < dim; ++i) ref.w[i] = static_cast<float>(model.w[i]);
  ref.b[0] = static_cast<float>(model.b[0]);
  ref.forward_backward(bt, 1.0f);
  auto r = t.step(bt);
  BOOST_TEST(r.loss_scale == 1024.0f);
  for (std::size_t i = 0; i < dim; ++i) {
    BOOST_TEST(t.master_gradients()[i] == ref.gw[i], boost::test_tools::tolerance(2e-3f));
  }
  t.step(bt);
  BOOST_TEST(t.scaler().scale() == 2048.0f);  // grew after 2 good steps
  model.nan_in_grad = std::numeric_limits<float>::infinity();
  r = t.step(bt);
  BOOST_TEST(r.skipped);
  BOOST_TEST(t.scaler().scale() == 1024.0f);
}

BOOST_AUTO_TEST_CASE(global_norm_clipping_reports_and_applies) {
  const std::size_t dim = 6;
  linear<float> a(dim), b(dim);
  const batch bt = make_batch(32, dim, 12);
  hone::trainer clipped(a, hone::sgd{}, hone::clip_grad_norm{.max_norm = 0.01f},
                        hone::constant_lr{.base_lr = 0.1});
  hone::trainer plain(b, hone::sgd{}, hone::constant_lr{.base_lr = 0.1});
  const auto rc = clipped.step(bt);
  const auto rp = plain.step(bt);
  // Reference norm of the gradient.
  linear<float> ref(dim);
  ref.forward_backward(bt, 1.0f);
  double sq = ref.gb[0] * double(ref.gb[0]);
  for (float g : ref.gw) sq += double(g) * g;
  BOOST_TEST(rc.grad_norm == std::sqrt(sq), boost::test_tools::tolerance(1e-6));
  BOOST_TEST(rp.grad_norm == rc.grad_norm);
  const double coef = 0.01 / (std::sqrt(sq) + 1e-6);
  linear<float> init(dim);
  for (std::size_t i = 0; i < dim; ++i) {
    const double moved = double(init.w[i]) - a.w[i];
    BOOST_TEST(moved == 0.1 * coef * ref.gw[i], boost::test_tools::tolerance(1e-3));
  }
}

// ---- the offload role (hone::offload::optimizer_to_host) ----
// A host model's memory plays the device: the trainer runs its optimizer step through
// hone::offload::engine with the host transport, exactly as it would for a CUDA model.
namespace {
namespace off = hone::offload;

template <class Trainer>
std::vector<std::vector<float>> state_tensors(Trainer& t) {
  std::vector<std::vector<float>> out;
  t.optimizer_state().for_each_tensor(
      [&](std::string_view, const auto& a) { out.emplace_back(a.all().begin(), a.all().end()); });
  return out;
}

bool same_reports(const hone::step_report& a, const hone::step_report& b) {
  return std::memcmp(&a.loss, &b.loss, sizeof(float)) == 0 &&
         std::memcmp(&a.grad_norm, &b.grad_norm, sizeof(double)) == 0 && a.lr == b.lr &&
         a.loss_scale == b.loss_scale && a.skipped == b.skipped && a.step == b.step;
}

/// Two trainers' master weights, master gradients and optimizer state tensors are the same bits.
template <class A, class B>
void check_same_trainer_state(A& a, B& b) {
  BOOST_TEST(same_bits(snapshot(a.master_weights()), snapshot(b.master_weights())));
  BOOST_TEST(same_bits(snapshot(a.master_gradients()), snapshot(b.master_gradients())));
  const auto sa = state_tensors(a);
  const auto sb = state_tensors(b);
  BOOST_TEST(sa.size() == sb.size());
  for (std::size_t i = 0; i < sa.size() && i < sb.size(); ++i) {
    BOOST_TEST(same_bits(sa[i], sb[i]), "state tensor " << i);
  }
}

template <class T>
std::vector<float> model_weights(const linear<T>& m) {
  std::vector<float> v;
  for (const auto& x : m.w) v.push_back(static_cast<float>(x));
  v.push_back(static_cast<float>(m.b[0]));
  return v;
}

/// Runs `steps` accumulated steps (two uneven micro-batches each) on a trainer with and one
/// without the offload role (same other policies); an inf is injected at step `poison_at`.
/// Everything must stay bit-identical: reports, master weights, moments, working weights.
template <class T, class Precision, class Opt>
void check_offload_parity(Precision prec, Opt opt, std::size_t bucket_bytes, int steps,
                          int poison_at) {
  BOOST_TEST_CONTEXT("bucket_bytes " << bucket_bytes << ", working size " << sizeof(T)) {
    const std::size_t dim = 37;
    linear<T> a(dim), b(dim);
    const auto sched = hone::one_cycle{.max_lr = 0.02, .total_steps = 200};
    hone::trainer plain(a, prec, opt, hone::accumulate::by_count{},
                        hone::clip_grad_norm{.max_norm = 0.5f}, sched);
    hone::trainer offl(b, off::optimizer_to_host{.bucket_bytes = bucket_bytes}, sched,
                       hone::clip_grad_norm{.max_norm = 0.5f}, hone::accumulate::by_count{}, opt,
                       prec);
    static_assert(decltype(offl)::offloaded && !decltype(plain)::offloaded);
    BOOST_TEST(!offl.zero_copy());
    const std::size_t per = bucket_bytes / sizeof(float);
    BOOST_TEST(offl.offload_engine().buckets().size() == (offl.layout().total() + per - 1) / per);
    // No decay on the bias: param groups reach the engine.
    const auto groups = hone::make_param_groups(plain.layout(), {{hone::is_no_decay_name, 1, 0}});
    plain.set_param_groups(groups);
    offl.set_param_groups(groups);
    for (int s = 0; s < steps; ++s) {
      const std::vector<batch> parts{make_batch(5, dim, static_cast<unsigned>(100 + 2 * s)),
                                     make_batch(11, dim, static_cast<unsigned>(101 + 2 * s))};
      const float poison = s == poison_at ? std::numeric_limits<float>::infinity() : 0.0f;
      a.nan_in_grad = poison;
      b.nan_in_grad = poison;
      const auto ra = plain.step(std::span<const batch>(parts));
      const auto rb = offl.step(std::span<const batch>(parts));
      // fp16's dynamic scale also overflows by itself now and then (then backs off).
      if (s == poison_at || !std::is_same_v<Precision, hone::fp16_mixed<>>) {
        BOOST_TEST(ra.skipped == (s == poison_at));
      }
      BOOST_TEST(same_reports(ra, rb), "step " << s);
      BOOST_TEST(same_bits(model_weights(a), model_weights(b)), "step " << s);
    }
    check_same_trainer_state(plain, offl);
    BOOST_TEST(plain.steps_done() == offl.steps_done());
    BOOST_TEST((offl.scaler().state() == plain.scaler().state()));
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(offload_immediate_is_bit_identical_to_the_plain_trainer) {
  // Buckets of 3 floats cut inside every tensor; 64 floats: a few buckets; 1 MiB: one bucket.
  for (std::size_t bytes : {std::size_t{12}, std::size_t{256}, std::size_t{1} << 20}) {
    check_offload_parity<float>(hone::fp32{}, hone::adamw{.weight_decay = 0.1f}, bytes, 40, 17);
    check_offload_parity<hone::bfloat16>(hone::bf16_mixed{}, hone::adamw{.weight_decay = 0.1f},
                                         bytes, 40, 23);
  }
  check_offload_parity<float>(hone::fp32{}, hone::sgd{.momentum = 0.9f, .nesterov = true}, 20, 30,
                              5);
  check_offload_parity<hone::half>(
      hone::fp16_mixed<>{.scaler = {.init_scale = 256, .growth_interval = 3}},
      hone::adamw{.amsgrad = true}, 40, 30, 11);
}

BOOST_AUTO_TEST_CASE(offload_of_a_model_bound_to_one_arena_publishes_in_place) {
  // fp32 tensors laid out like the arena: the engine publishes straight into them.
  const std::size_t dim = 9;
  bound_linear a(dim), b(dim);
  hone::trainer plain(a, hone::adamw{}, hone::constant_lr{.base_lr = 0.01});
  hone::trainer offl(b, hone::adamw{}, hone::constant_lr{.base_lr = 0.01},
                     off::optimizer_to_host{.bucket_bytes = 16});
  BOOST_TEST(plain.zero_copy());
  BOOST_TEST(!offl.zero_copy());
  BOOST_TEST(offl.master_weights().data() != b.values.all().data());
  for (int s = 0; s < 12; ++s) {
    const batch bt = make_batch(8, dim, static_cast<unsigned>(300 + s));
    BOOST_TEST(same_reports(plain.step(bt), offl.step(bt)));
    BOOST_TEST(same_bits(snapshot(a.values.all()), snapshot(b.values.all())));
  }
}

BOOST_AUTO_TEST_CASE(offload_delayed_follows_the_one_step_delayed_recursion) {
  // Reference, written from the documented recursion (docs/offload.md) with the plain host
  // optimizer: the forward/backward of step k sees the weights the "device" holds; an applied
  // step first publishes the previous update (if any), then computes its own on the host; a
  // skipped step only publishes the pending update.
  const std::size_t dim = 13;
  const int steps = 25, poison_at = 9;
  const double lr = 0.02;
  hone::adamw opt{.weight_decay = 0.05f};
  linear<float> model(dim);
  hone::trainer t(model, opt, hone::constant_lr{.base_lr = lr},
                  off::optimizer_to_host{.bucket_bytes = 20, .delayed_update = true});

  const hone::arena_layout& l = t.layout();
  hone::optimizer_state_t<hone::adamw> ref_state(opt, l);
  std::vector<float> master(l.total(), 0.0f), grad(l.total(), 0.0f);
  linear<float> ref(dim);  // its weights are what the reference "device" holds
  for (std::size_t i = 0; i < dim; ++i) master[l[0].offset + i] = ref.w[i];
  master[l[1].offset] = ref.b[0];
  std::vector<float> pending;  // the reference's pending update (empty: none)
  auto publish = [&](const std::vector<float>& m) {
    for (std::size_t i = 0; i < dim; ++i) ref.w[i] = m[l[0].offset + i];
    ref.b[0] = m[l[1].offset];
  };
  std::uint64_t applied = 0;
  for (int k = 0; k < steps; ++k) {
    const batch bt = make_batch(7, dim, static_cast<unsigned>(500 + k));
    const bool poison = k == poison_at;
    model.nan_in_grad = poison ? std::numeric_limits<float>::infinity() : 0.0f;
    // reference step
    const float ref_loss = ref.forward_backward(bt, 1.0f);
    if (poison) {
      if (!pending.empty()) publish(pending);
      pending.clear();
    } else {
      for (std::size_t i = 0; i < dim; ++i) grad[l[0].offset + i] = ref.gw[i];
      grad[l[1].offset] = ref.gb[0];
      if (!pending.empty()) publish(pending);
      ++applied;
      ref_state.step(opt, {.step = applied, .lr = static_cast<float>(lr), .grad_scale = 1.0f},
                     master.data(), grad.data());
      pending = master;
    }
    // trainer step
    const auto r = t.step(bt);
    BOOST_TEST(r.skipped == poison);
    BOOST_TEST(r.step == applied);
    BOOST_TEST(std::memcmp(&r.loss, &ref_loss, sizeof(float)) == 0, "step " << k);
    BOOST_TEST(same_bits(model_weights(model), model_weights(ref)), "step " << k);
    BOOST_TEST(t.offload_engine().pending() == !poison);
  }
  // master_weights() waits for the host step; the model keeps the delayed weights until flush.
  BOOST_TEST(same_bits(snapshot(t.master_weights()), master));
  BOOST_TEST(same_bits(snapshot(t.optimizer_state().exp_avg().all()),
                       snapshot(ref_state.exp_avg().all())));
  BOOST_TEST(same_bits(snapshot(t.optimizer_state().exp_avg_sq().all()),
                       snapshot(ref_state.exp_avg_sq().all())));
  {
    linear<float> newest(dim);  // the model still holds the weights before the last update
    const auto before_flush = model_weights(model);
    std::swap(newest, ref);
    publish(master);
    BOOST_TEST(!same_bits(before_flush, model_weights(ref)));
    std::swap(newest, ref);
  }
  t.flush();
  publish(master);
  BOOST_TEST(same_bits(model_weights(model), model_weights(ref)));
  BOOST_TEST(!t.offload_engine().pending());
}

BOOST_AUTO_TEST_CASE(offload_skipped_step_leaves_everything_bit_identical) {
  const std::size_t dim = 8;
  for (bool delayed : {false, true}) {
    BOOST_TEST_CONTEXT("delayed " << delayed) {
      linear<hone::half> model(dim);
      hone::trainer t(model, hone::fp16_mixed<>{.scaler = {.init_scale = 1024}}, hone::adamw{},
                      off::optimizer_to_host{.bucket_bytes = 8, .delayed_update = delayed});
      const batch bt = make_batch(16, dim, 21);
      BOOST_TEST(!t.step(bt).skipped);
      t.flush();  // delayed: no pending update before the snapshot
      const auto weights = snapshot(t.master_weights());
      const auto model_w = model_weights(model);
      const auto moments = state_tensors(t);
      model.nan_in_grad = std::numeric_limits<float>::quiet_NaN();
      const auto r = t.step(bt);
      BOOST_TEST(r.skipped);
      BOOST_TEST(r.step == 1u);
      BOOST_TEST(t.scaler().scale() == 512.0f);
      BOOST_TEST(t.scaler().state().skipped_steps == 1u);
      BOOST_TEST(same_bits(weights, snapshot(t.master_weights())));
      BOOST_TEST(same_bits(model_w, model_weights(model)));
      const auto after = state_tensors(t);
      for (std::size_t i = 0; i < moments.size(); ++i) BOOST_TEST(same_bits(moments[i], after[i]));
      model.nan_in_grad = 0;
      BOOST_TEST(!t.step(bt).skipped);
      BOOST_TEST(t.steps_done() == 2u);
    }
  }
}

BOOST_AUTO_TEST_CASE(offload_restore_and_bad_configuration) {
  const std::size_t dim = 6;
  linear<hone::bfloat16> model(dim);
  // A bucket must hold one fp32 gradient.
  BOOST_CHECK_THROW(
      hone::trainer(model, hone::bf16_mixed{}, off::optimizer_to_host{.bucket_bytes = 2}),
      hone::config_error);
  hone::trainer t(model, hone::bf16_mixed{}, hone::sgd{},
                  off::optimizer_to_host{.bucket_bytes = 8});
  const batch bt = make_batch(4, dim, 31);
  t.step(bt);
  // A checkpoint restore writes the master weights and publishes them into the model.
  auto m = t.master_weights();
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = 0.25f * static_cast<float>(i % 7);
  t.publish_weights();
  for (std::size_t i = 0; i < dim; ++i) {
    BOOST_TEST(model.w[i].bits() == hone::bfloat16(m[t.layout()[0].offset + i]).bits());
  }
  // The user changes the model: reload brings the change into the master weights.
  model.b[0] = hone::bfloat16(3.5f);
  t.reload_weights_from_model();
  BOOST_TEST(t.master_weights()[t.layout()[1].offset] == 3.5f);
}

// ---- the host backend's direct route ----
namespace {
/// Trainers on arena_linear (one arena: zero-copy in fp32) and on linear<T> (separate vectors)
/// taking the direct route on one micro-batch, against the same policies on linear<T> with the
/// route forbidden (the master-gradient route): every report, the working and master weights,
/// the master gradients and the optimizer state must be the same bits, step after step, with an
/// inf injected at `poison_at`; a step of two micro-batches leaves the direct route.
template <class T, class... Policies>
void check_direct_route(int steps, int poison_at, Policies... policies) {
  const std::size_t dim = 1003;  // vector loops with a tail
  arena_linear<T> a(dim);
  linear<T> b(dim), c(dim);
  hone::trainer direct(a, policies..., hone::accumulate::by_count{});
  hone::trainer ref(b, policies..., hone::accumulate::by_count{});
  hone::trainer scattered(c, policies..., hone::accumulate::by_count{});
  ref.backend().set_direct_route(false);
  const auto groups = hone::make_param_groups(ref.layout(), {{hone::is_no_decay_name, 1, 0}});
  direct.set_param_groups(groups);
  ref.set_param_groups(groups);
  scattered.set_param_groups(groups);
  for (int s = 0; s < steps; ++s) {
    BOOST_TEST_CONTEXT("step " << s) {
      const float poison = s == poison_at ? std::numeric_limits<float>::infinity() : 0.0f;
      a.m.nan_in_grad = poison;
      b.nan_in_grad = poison;
      c.nan_in_grad = poison;
      std::vector<batch> parts{make_batch(16, dim, static_cast<unsigned>(500 + 2 * s))};
      if (s == steps - 1) parts.push_back(make_batch(7, dim, static_cast<unsigned>(501 + 2 * s)));
      const auto ra = direct.step(std::span<const batch>(parts));
      const auto rb = ref.step(std::span<const batch>(parts));
      const auto rc = scattered.step(std::span<const batch>(parts));
      const bool took_direct = direct.backend().direct();
      const bool took_scattered = scattered.backend().direct();
      const bool one_part = parts.size() == 1u;
      BOOST_TEST(took_direct == one_part);
      BOOST_TEST(took_scattered == one_part);
      BOOST_TEST(!ref.backend().direct());
      BOOST_TEST(same_reports(rc, rb));
      BOOST_TEST(same_bits(model_weights(c), model_weights(b)));
      check_same_trainer_state(scattered, ref);
      if (s == poison_at) BOOST_TEST(ra.skipped);  // fp16's scale also overflows by itself
      BOOST_TEST(same_reports(ra, rb));
      BOOST_TEST(same_bits(a.weights(), model_weights(b)));
      check_same_trainer_state(direct, ref);
    }
  }
  BOOST_TEST(direct.steps_done() == ref.steps_done());
  BOOST_TEST((direct.scaler().state() == ref.scaler().state()));
}
}  // namespace

BOOST_AUTO_TEST_CASE(direct_route_is_the_master_gradient_route_bit_for_bit) {
  const auto sched = hone::one_cycle{.max_lr = 0.02, .total_steps = 200};
  // fp32: the model's weights are the master weights (zero-copy); the optimizer reads the model's
  // gradients.
  check_direct_route<float>(8, 3, hone::fp32{}, hone::adamw{.weight_decay = 0.1f}, sched);
  check_direct_route<float>(8, 5, hone::fp32{}, hone::sgd{.momentum = 0.9f}, sched,
                            hone::clip_grad_norm{.max_norm = 0.05f});
  // bf16 and fp16: the optimizer writes the working weights in its pass; fp16's loss scale is
  // folded into the gradient scale (and backs off at the poisoned step).
  check_direct_route<hone::bfloat16>(8, 2, hone::bf16_mixed{}, hone::adamw{}, sched,
                                     hone::clip_grad_norm{.max_norm = 0.05f});
  check_direct_route<hone::bfloat16>(8, -1, hone::bf16_mixed{},
                                     hone::sgd{.momentum = 0.9f, .nesterov = true}, sched);
  check_direct_route<hone::half>(
      10, 4, hone::fp16_mixed<>{.scaler = {.init_scale = 1024, .growth_interval = 2}},
      hone::adamw{.weight_decay = 0.01f}, sched, hone::clip_grad_norm{.max_norm = 0.05f});
  check_direct_route<hone::half>(8, 6, hone::fp16_mixed<>{}, hone::sgd{},
                                 hone::constant_lr{.base_lr = 0.01});
}

BOOST_AUTO_TEST_CASE(direct_route_needs_local_l2_clipped_gradients) {
  // Clipping by value and by a non-L2 norm need the master gradients: the route stays off.
  const std::size_t dim = 64;
  arena_linear<hone::bfloat16> a(dim), b(dim);
  hone::trainer by_value(a, hone::bf16_mixed{}, hone::clip_grad_value{.clip_value = 0.01f});
  hone::trainer by_inf(
      b, hone::bf16_mixed{},
      hone::clip_grad_norm{.max_norm = 0.5f, .norm_type = std::numeric_limits<float>::infinity()});
  const batch bt = make_batch(8, dim, 77);
  (void)by_value.step(bt);
  (void)by_inf.step(bt);
  BOOST_TEST(!by_value.backend().direct());
  BOOST_TEST(!by_inf.backend().direct());
  // The route is taken with L2 clipping on the same model.
  arena_linear<hone::bfloat16> c(dim);
  hone::trainer l2(c, hone::bf16_mixed{}, hone::clip_grad_norm{.max_norm = 0.5f});
  (void)l2.step(bt);
  BOOST_TEST(l2.backend().direct());
}
