// Early stopping as a trainer role (hone::early_stopping_policy) travels in the trainer's
// checkpoints with no call from the training loop: a run checkpointed by
// hone::checkpoint::every_n_steps part way, after its best check, and restored into fresh model
// and trainer objects with hone::checkpoint::restore alone continues exactly as the uninterrupted
// run: the same counters and best value after every later check, the same stop step and reason,
// and the same best weights, bit for bit. Also: a checkpoint saved without early stopping starts
// it afresh, other options are refused before anything is loaded, best weights are kept only when
// asked for, and the offload role keeps them in its host copy.
#define BOOST_TEST_MODULE hone_checkpoint_resume_early_stopping
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <hone/checkpoint/policy.hpp>
#include <hone/checkpoint/trainer_checkpoint.hpp>
#include <hone/offload/optimizer_to_host.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/schedule/one_cycle.hpp>
#include <hone/train/early_stopping.hpp>
#include <hone/train/trainer.hpp>
#include <iterator>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "resume_data.hpp"

namespace fs = std::filesystem;
namespace ck = hone::checkpoint;

namespace {
using resume_data::batch;
using resume_data::make_batch;

// A two-layer fp32 model (dim -> hidden, tanh, -> 1) with squared error, its parameters in one
// block laid out like the trainer's arena (so the master weights are the model's own).
struct small_mlp {
  static constexpr std::size_t dim = 6, hidden = 5;
  static constexpr std::size_t n_w1 = dim * hidden, n_b1 = hidden, n_w2 = hidden;
  std::vector<float> value, grad;
  explicit small_mlp(unsigned seed) : value(n_w1 + n_b1 + n_w2), grad(n_w1 + n_b1 + n_w2) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0, 0.5f);
    for (std::size_t i = 0; i < n_w1; ++i) value[i] = n(rng);
    for (std::size_t i = 0; i < n_b1; ++i) value[n_w1 + i] = 0.01f;
    for (std::size_t i = 0; i < n_w2; ++i) value[n_w1 + n_b1 + i] = n(rng);
  }
  std::vector<hone::parameter<float>> parameters() {
    const std::span<float> v(value), g(grad);
    return {{"fc1.weight", {hidden, dim}, v.subspan(0, n_w1), g.subspan(0, n_w1)},
            {"fc1.bias", {hidden}, v.subspan(n_w1, n_b1), g.subspan(n_w1, n_b1)},
            {"fc2.weight", {1, hidden}, v.subspan(n_w1 + n_b1), g.subspan(n_w1 + n_b1)}};
  }
  /// The loss of `bt`; with scale != 0 also its gradients times scale.
  float forward_backward(const batch& bt, float scale) {
    const float* w1 = value.data();
    const float* b1 = w1 + n_w1;
    const float* w2 = b1 + n_b1;
    std::vector<float> gw1(n_w1, 0), gbb(hidden, 0), gw2(hidden, 0);
    float loss = 0;
    const std::size_t rows = bt.y.size();
    const float inv = 1.0f / static_cast<float>(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      float h[hidden];
      float pred = 0;
      for (std::size_t j = 0; j < hidden; ++j) {
        float a = b1[j];
        for (std::size_t c = 0; c < dim; ++c) a += w1[j * dim + c] * bt.x[r * dim + c];
        h[j] = std::tanh(a);
        pred += w2[j] * h[j];
      }
      const float e = pred - bt.y[r];
      loss += e * e * inv;
      for (std::size_t j = 0; j < hidden; ++j) {
        gw2[j] += 2 * e * h[j] * inv;
        const float dh = 2 * e * w2[j] * (1 - h[j] * h[j]) * inv;
        gbb[j] += dh;
        for (std::size_t c = 0; c < dim; ++c) gw1[j * dim + c] += dh * bt.x[r * dim + c];
      }
    }
    for (std::size_t i = 0; i < n_w1; ++i) grad[i] = gw1[i] * scale;
    for (std::size_t j = 0; j < hidden; ++j) {
      grad[n_w1 + j] = gbb[j] * scale;
      grad[n_w1 + n_b1 + j] = gw2[j] * scale;
    }
    return loss;
  }
};

constexpr std::uint64_t check_every = 5;
constexpr std::uint64_t limit = 400;

hone::early_stopping_policy stopping(bool keep = true, std::uint64_t patience = 3) {
  return {.options = {.mode = hone::monitor_mode::min, .patience = patience, .min_delta = 2e-3},
          .keep_best_weights = keep};
}

/// The trainer of every run here: early stopping, and checkpoints every 5 steps under `root`.
auto make_trainer(small_mlp& m, const fs::path& root, hone::early_stopping_policy es = stopping()) {
  return hone::trainer(
      m, hone::adamw{.weight_decay = 0.01f}, hone::clip_grad_norm{.max_norm = 1.0f},
      hone::one_cycle{.max_lr = 0.05, .total_steps = 200},
      ck::every_n_steps{
          .root = root, .every = check_every, .writer = {.retention = {{.keep_last = 2}}}},
      es);
}
using trainer_type = decltype(make_trainer(std::declval<small_mlp&>(), fs::path()));

/// What early stopping says after one check.
struct check_record {
  std::uint64_t step, checks, wait_count;
  double best;
  std::optional<std::uint64_t> best_step;
  bool stop;
  bool operator==(const check_record&) const = default;
};
std::ostream& operator<<(std::ostream& os, const check_record& r) {
  return os << "{step " << r.step << ", checks " << r.checks << ", wait " << r.wait_count
            << ", best " << r.best << ", stop " << r.stop << "}";
}

/// The training loop: the validation loss is checked every 5 steps, at the top of the loop,
/// before the next step (a checkpoint written inside step() precedes the check after it, so a
/// resumed run makes that check again). Trains until early stopping says stop or step `until`.
/// Returns the records of the checks it made.
std::vector<check_record> train(trainer_type& t, small_mlp& m, std::uint64_t until) {
  const batch validation = make_batch(100000);
  std::vector<check_record> out;
  while (true) {
    const std::uint64_t s = t.steps_done();
    if (s > 0 && s % check_every == 0) {
      // forward_backward with scale 0 gives the loss; the next step overwrites its gradients.
      const bool stop = t.observe_metric(static_cast<double>(m.forward_backward(validation, 0)));
      const auto& es = t.early_stopping();
      out.push_back({s, es.checks(), es.wait_count(), es.best(), es.best_step(), stop});
      if (stop) break;
    }
    if (s >= until) break;
    (void)t.step(make_batch(s));
  }
  return out;
}

std::vector<std::uint32_t> bits(std::span<const float> s) {
  std::vector<std::uint32_t> out(s.size());
  std::memcpy(out.data(), s.data(), s.size_bytes());
  return out;
}
std::vector<std::uint32_t> state_bits(trainer_type& t) {
  std::vector<std::uint32_t> out = bits(t.master_weights());
  t.optimizer_state().for_each_tensor([&](std::string_view, const auto& a) {
    const auto b = bits(std::span<const float>(a.all()));
    out.insert(out.end(), b.begin(), b.end());
  });
  return out;
}

struct temp_root {
  fs::path path;
  explicit temp_root(const std::string& name)
      : path(fs::temp_directory_path() /
             ("hone-test-resume-es-role-" + name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
  }
  ~temp_root() { fs::remove_all(path); }
};
}  // namespace

static_assert(
    std::is_same_v<hone::trainer<small_mlp>::early_stopping_type, hone::no_early_stopping>);
static_assert(!hone::trainer<small_mlp>::stops_early);
static_assert(trainer_type::stops_early);
static_assert(hone::checkpoint_carries_early_stopping_v<ck::every_n_steps>);
static_assert(hone::checkpoint_carries_early_stopping_v<hone::no_checkpoint>);

BOOST_AUTO_TEST_CASE(resumed_run_continues_counters_best_weights_and_stop_exactly) {
  temp_root root_a("a"), root_b("b"), root_c("c");

  // The uninterrupted reference run.
  small_mlp ma(7);
  auto ta = make_trainer(ma, root_a.path);
  const std::vector<check_record> ref = train(ta, ma, limit);
  const auto& ea = ta.early_stopping();
  BOOST_REQUIRE_MESSAGE(ea.should_stop(), "the scenario must stop early: " << ea.message());
  BOOST_TEST((ea.reason() == hone::stop_reason::patience));
  BOOST_REQUIRE(ea.best_step().has_value());
  // Interrupt two checks after the best one: the wait count is 2 and the weights have moved on
  // from the best ones, so both must come from the checkpoint.
  const std::uint64_t n = *ea.best_step() + 2 * check_every;
  BOOST_REQUIRE(n < *ea.stop_step());

  // The interrupted run: checkpointed every 5 steps by its checkpoint policy, stopped at step n
  // (its check at n comes after the save at n).
  std::vector<std::uint32_t> weights_at_n;
  {
    small_mlp mb(7);
    auto tb = make_trainer(mb, root_b.path);
    const auto before = train(tb, mb, n);
    BOOST_TEST(tb.steps_done() == n);
    BOOST_TEST(!tb.early_stopping().should_stop());
    BOOST_TEST(tb.early_stopping().wait_count() == 2u);
    BOOST_TEST(std::equal(before.begin(), before.end(), ref.begin()));
    weights_at_n = bits(tb.master_weights());
  }

  // Resumed: fresh model (other weights) and trainer, restored by hone::checkpoint::restore alone.
  small_mlp mc(12345);
  auto tc = make_trainer(mc, root_c.path);
  const auto newest = ck::newest_valid(root_b.path);
  BOOST_REQUIRE(newest.has_value());
  BOOST_TEST(newest->step == n);
  BOOST_TEST(fs::exists(newest->path / ck::early_stopping_best_file));
  (void)ck::restore(tc, newest->path);
  // The state after the check before n (the last one the checkpoint saw).
  const auto at = std::find_if(ref.begin(), ref.end(), [&](const auto& r) { return r.step == n; });
  BOOST_REQUIRE(at != ref.end() && at != ref.begin());
  const auto& ec = tc.early_stopping();
  BOOST_TEST(ec.checks() == std::prev(at)->checks);
  BOOST_TEST(ec.wait_count() == std::prev(at)->wait_count);
  BOOST_TEST(ec.wait_count() == 1u);
  BOOST_TEST(ec.best() == ea.best());
  BOOST_TEST((ec.best_step() == ea.best_step()));
  BOOST_TEST(tc.early_stopper().keeper().has_snapshot());
  BOOST_TEST((bits(tc.master_weights()) == weights_at_n));

  const std::vector<check_record> after = train(tc, mc, limit);
  // Every later check says what the uninterrupted run's said.
  const std::vector<check_record> expected(at, ref.end());
  BOOST_TEST(after.size() == expected.size());
  for (std::size_t i = 0; i < std::min(after.size(), expected.size()); ++i) {
    BOOST_TEST(after[i] == expected[i]);
  }
  BOOST_TEST(tc.steps_done() == ta.steps_done());
  BOOST_TEST((ec.stop_step() == ea.stop_step()));
  BOOST_TEST((ec.reason() == ea.reason()));
  BOOST_TEST((ec.state().stop_wait == ea.state().stop_wait));
  BOOST_TEST(ec.message() == ea.message());
  BOOST_TEST((state_bits(tc) == state_bits(ta)));  // the same weights and moments at the stop
  // The same best weights, bit for bit, and they are not the weights at the stop.
  const auto at_stop = bits(ta.master_weights());
  ta.restore_best_weights();
  tc.restore_best_weights();
  BOOST_TEST((bits(ta.master_weights()) == bits(tc.master_weights())));
  BOOST_TEST((bits(ta.master_weights()) != at_stop));
  BOOST_TEST((ma.value == mc.value));  // published into the model
}

BOOST_AUTO_TEST_CASE(checkpoint_without_early_stopping_starts_it_afresh) {
  temp_root root("plain"), own("own");
  small_mlp m(7);
  hone::trainer plain(m, hone::adamw{}, ck::every_n_steps{.root = root.path, .every = 5});
  for (std::uint64_t s = 0; s < 5; ++s) (void)plain.step(make_batch(s));
  const auto c = ck::newest_valid(root.path);
  BOOST_REQUIRE(c.has_value());
  BOOST_TEST(!fs::exists(c->path / ck::early_stopping_best_file));

  // A trainer that has already checked a metric is reset by the restore.
  small_mlp mr(8);
  auto t = make_trainer(mr, own.path);
  (void)t.observe_metric(1.0);
  BOOST_TEST(t.early_stopping().checks() == 1u);
  (void)ck::restore(t, c->path);
  BOOST_TEST(t.early_stopping().checks() == 0u);
  BOOST_TEST(!t.early_stopping().best_step().has_value());
  BOOST_TEST(!t.early_stopper().keeper().has_snapshot());
  BOOST_CHECK_THROW(t.restore_best_weights(), hone::config_error);
}

BOOST_AUTO_TEST_CASE(other_options_are_refused_before_anything_is_loaded) {
  temp_root root("saved"), own("own");
  small_mlp m(7);
  {
    auto t = make_trainer(m, root.path);
    (void)train(t, m, 20);
  }
  const auto c = ck::newest_valid(root.path);
  BOOST_REQUIRE(c.has_value());
  small_mlp other(9);
  auto u = make_trainer(other, own.path, stopping(true, /*patience=*/4));
  const auto weights = other.value;
  BOOST_CHECK_THROW((void)ck::restore(u, c->path), hone::checkpoint_error);
  BOOST_TEST((other.value == weights));  // nothing was loaded
  BOOST_TEST(u.steps_done() == 0u);
  BOOST_TEST(u.early_stopping().checks() == 0u);
}

BOOST_AUTO_TEST_CASE(best_weights_are_kept_only_when_asked) {
  temp_root root("nokeep"), own("own");
  small_mlp m(7);
  auto t = make_trainer(m, root.path, stopping(/*keep=*/false));
  (void)train(t, m, 10);
  BOOST_TEST(t.early_stopping().checks() == 2u);
  BOOST_TEST(t.early_stopper().keeper().bytes() == 0u);
  BOOST_CHECK_THROW(t.restore_best_weights(), hone::config_error);
  const auto c = ck::newest_valid(root.path);
  BOOST_REQUIRE(c.has_value());
  BOOST_TEST(!fs::exists(c->path / ck::early_stopping_best_file));
  // Restoring it (saved at step 10, before the check at 10) into a trainer that keeps best
  // weights continues the counters, with no best weights until the next improvement.
  BOOST_TEST(c->step == 10u);
  small_mlp mr(8);
  auto u = make_trainer(mr, own.path);
  (void)ck::restore(u, c->path);
  BOOST_TEST(u.early_stopping().checks() == 1u);
  BOOST_TEST(!u.early_stopper().keeper().has_snapshot());
}

BOOST_AUTO_TEST_CASE(offloaded_trainer_keeps_best_weights_in_its_host_copy) {
  for (const bool delayed : {false, true}) {
    small_mlp m(7);
    hone::trainer t(m, hone::adamw{}, hone::constant_lr{.base_lr = 0.05},
                    hone::offload::optimizer_to_host{.bucket_bytes = 32, .delayed_update = delayed},
                    stopping());
    for (std::uint64_t s = 0; s < 3; ++s) (void)t.step(make_batch(s));
    t.flush();
    const auto best = m.value;
    BOOST_TEST(!t.observe_metric(0.5));  // the first check is a best: the weights are kept
    for (std::uint64_t s = 3; s < 6; ++s) (void)t.step(make_batch(s));
    t.flush();
    BOOST_TEST(!t.observe_metric(0.75));  // not a best
    BOOST_TEST((m.value != best));
    t.restore_best_weights();
    BOOST_TEST((m.value == best), "delayed " << delayed);
    std::size_t at = 0;  // the master weights too (the arena may pad between parameters)
    for (const auto& slot : t.layout().slots()) {
      BOOST_TEST((bits(t.master_weights().subspan(slot.offset, slot.count)) ==
                  bits(std::span(best).subspan(at, slot.count))));
      at += slot.count;
    }
  }
}
