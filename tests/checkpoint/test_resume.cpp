// Bitwise resume: training N+M steps straight equals training N, saving, building fresh model and
// trainer objects, restoring, and training M more, bit for bit: master weights, optimizer moments,
// step and loss scaler state (fp32 zero-copy, fp32 with separate storage, bf16_mixed, fp16_mixed
// with a dynamic scaler that grows and backs off), with the sync and the async writer.
#define BOOST_TEST_MODULE hone_checkpoint_resume
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <hone/checkpoint/trainer_checkpoint.hpp>
#include <hone/checkpoint/writer.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/schedule/one_cycle.hpp>
#include <hone/train/early_stopping.hpp>
#include <hone/train/trainer.hpp>
#include <random>
#include <string>
#include <vector>

#include "resume_data.hpp"

namespace fs = std::filesystem;
namespace ck = hone::checkpoint;
namespace io = hone::io;

namespace {
using resume_data::batch;
using resume_data::make_batch;

// A two-layer model (dim -> hidden, tanh, -> 1) with squared error, in working type T.
template <class T>
struct small_mlp {
  std::size_t dim = 6, hidden = 5;
  std::vector<T> w1, g1, b1, gb1, w2, g2;
  explicit small_mlp(unsigned seed)
      : w1(dim * hidden), g1(dim * hidden), b1(hidden), gb1(hidden), w2(hidden), g2(hidden) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0, 0.5f);
    for (auto& v : w1) v = T(n(rng));
    for (auto& v : b1) v = T(0.01f);
    for (auto& v : w2) v = T(n(rng));
  }
  std::vector<hone::parameter<T>> parameters() {
    return {{"fc1.weight", {hidden, dim}, w1, g1},
            {"fc1.bias", {hidden}, b1, gb1},
            {"fc2.weight", {1, hidden}, w2, g2}};
  }
  float forward_backward(const batch& bt, float scale) {
    std::vector<float> gw1(w1.size(), 0), gbb(hidden, 0), gw2(hidden, 0);
    float loss = 0;
    const std::size_t rows = bt.y.size();
    const float inv = 1.0f / static_cast<float>(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      std::vector<float> h(hidden);
      float pred = 0;
      for (std::size_t j = 0; j < hidden; ++j) {
        float a = static_cast<float>(b1[j]);
        for (std::size_t c = 0; c < dim; ++c)
          a += static_cast<float>(w1[j * dim + c]) * bt.x[r * dim + c];
        h[j] = std::tanh(a);
        pred += static_cast<float>(w2[j]) * h[j];
      }
      const float e = pred - bt.y[r];
      loss += e * e * inv;
      for (std::size_t j = 0; j < hidden; ++j) {
        gw2[j] += 2 * e * h[j] * inv;
        const float dh = 2 * e * static_cast<float>(w2[j]) * (1 - h[j] * h[j]) * inv;
        gbb[j] += dh;
        for (std::size_t c = 0; c < dim; ++c) gw1[j * dim + c] += dh * bt.x[r * dim + c];
      }
    }
    for (std::size_t i = 0; i < w1.size(); ++i) g1[i] = T(gw1[i] * scale);
    for (std::size_t j = 0; j < hidden; ++j) {
      gb1[j] = T(gbb[j] * scale);
      g2[j] = T(gw2[j] * scale);
    }
    return loss;
  }
};

template <class Precision>
auto make_trainer(small_mlp<typename Precision::working_type>& m, Precision p) {
  return hone::trainer(m, p, hone::adamw{.weight_decay = 0.01f},
                       hone::clip_grad_norm{.max_norm = 1.0f},
                       hone::one_cycle{.max_lr = 0.05, .total_steps = 200});
}

template <class Trainer>
std::vector<std::uint32_t> state_bits(Trainer& t) {
  std::vector<std::uint32_t> out;
  const auto push = [&](std::span<const float> s) {
    for (float f : s) {
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      out.push_back(u);
    }
  };
  push(t.master_weights());
  t.optimizer_state().for_each_tensor(
      [&](std::string_view, const auto& a) { push(std::span<const float>(a.all())); });
  return out;
}

template <class Precision>
void check_resume(Precision p, bool async, std::uint64_t n, std::uint64_t extra) {
  using T = typename Precision::working_type;
  const fs::path root =
      fs::temp_directory_path() / ("hone-test-resume-" + std::to_string(::getpid()));
  fs::remove_all(root);

  // Straight: N + M steps.
  small_mlp<T> ma(7);
  auto ta = make_trainer(ma, p);
  for (std::uint64_t s = 0; s < n + extra; ++s) (void)ta.step(make_batch(s));

  // Interrupted: N steps, save, then everything is thrown away.
  {
    small_mlp<T> mb(7);
    auto tb = make_trainer(mb, p);
    for (std::uint64_t s = 0; s < n; ++s) (void)tb.step(make_batch(s));
    ck::checkpoint_writer w({.root = root, .async = async});
    const ck::shape_map shapes = ck::parameter_shapes(mb);
    ck::training_state extra_state;
    extra_state.data.set("next_batch", n);
    BOOST_TEST(w.save(tb.steps_done(), [&](ck::snapshot& s) {
      ck::capture(tb, s, extra_state, {.shapes = &shapes});
    }));
    // The trainer moves on while the background write runs: the snapshot is a copy.
    for (int i = 0; i < 3; ++i) (void)tb.step(make_batch(999 + static_cast<std::uint64_t>(i)));
    w.wait();
  }

  // Resumed: fresh objects (another seed: everything must come from the checkpoint).
  small_mlp<T> mc(12345);
  auto tc = make_trainer(mc, p);
  const auto c = ck::newest_valid(root);
  BOOST_REQUIRE(c.has_value());
  const ck::training_state st = ck::restore(tc, c->path);
  BOOST_TEST(st.step == tc.steps_done());
  const std::uint64_t next = st.data.at("next_batch").as_u64();
  // Skipped (overflowed) steps do not count: the data position is the caller's, not the step.
  for (std::uint64_t s = next; s < n + extra; ++s) (void)tc.step(make_batch(s));

  BOOST_TEST(tc.steps_done() == ta.steps_done());
  BOOST_TEST((state_bits(tc) == state_bits(ta)));
  const hone::loss_scale_state sa = ta.scaler().state(), sc = tc.scaler().state();
  BOOST_TEST(sa.scale == sc.scale);
  BOOST_TEST(sa.growth_tracker == sc.growth_tracker);
  BOOST_TEST(sa.hysteresis_tracker == sc.hysteresis_tracker);
  BOOST_TEST(sa.skipped_steps == sc.skipped_steps);
  // The model's working weights match too.
  for (std::size_t i = 0; i < ma.w1.size(); ++i) {
    BOOST_TEST(std::memcmp(&ma.w1[i], &mc.w1[i], sizeof(T)) == 0);
  }
  // The saved tensors carry the model's shapes.
  const auto f = ck::tensor_file::open(c->path / ck::files::weights);
  BOOST_TEST((f.at("fc1.weight").shape == ck::shape_type{5, 6}));
  BOOST_TEST((f.at("fc1.weight").type == io::dtype::f32));
  const auto o = ck::tensor_file::open(c->path / ck::files::optimizer);
  BOOST_TEST((o.at("exp_avg_sq.fc2.weight").shape == ck::shape_type{1, 5}));
  fs::remove_all(root);
}
}  // namespace

BOOST_AUTO_TEST_CASE(resume_fp32_is_bitwise) {
  check_resume(hone::fp32{}, false, 20, 15);
}
BOOST_AUTO_TEST_CASE(resume_fp32_async_is_bitwise) {
  check_resume(hone::fp32{}, true, 20, 15);
}
BOOST_AUTO_TEST_CASE(resume_bf16_mixed_is_bitwise) {
  check_resume(hone::bf16_mixed{}, false, 25, 20);
}
BOOST_AUTO_TEST_CASE(resume_fp16_dynamic_scaler_is_bitwise) {
  // A huge initial scale overflows fp16 gradients (skipped steps, backoff), and a short growth
  // interval makes the scale grow again: the scaler's trackers are mid-flight at the save.
  hone::fp16_mixed<> p{.scaler = {.init_scale = 1.0e6f, .growth_interval = 4}};
  small_mlp<hone::half> probe(7);
  auto tp = make_trainer(probe, p);
  for (std::uint64_t s = 0; s < 30; ++s) (void)tp.step(make_batch(s));
  BOOST_TEST(tp.scaler().state().skipped_steps > 0u);  // the scenario really backs off
  check_resume(p, false, 23, 20);
  check_resume(p, true, 9, 30);
}

BOOST_AUTO_TEST_CASE(weights_only_export) {
  const fs::path root =
      fs::temp_directory_path() / ("hone-test-weights-only-" + std::to_string(::getpid()));
  fs::remove_all(root);
  small_mlp<hone::bfloat16> m(3);
  auto t = make_trainer(m, hone::bf16_mixed{});
  for (std::uint64_t s = 0; s < 5; ++s) (void)t.step(make_batch(s));
  ck::checkpoint_writer w({.root = root});
  (void)w.save(5, [&](ck::snapshot& s) {
    ck::capture(t, s, {}, {.content = ck::content_policy::weights_only});
  });
  const auto c = ck::newest_valid(root);
  BOOST_REQUIRE(c.has_value());
  BOOST_TEST(!fs::exists(c->path / ck::files::optimizer));
  const auto f = ck::tensor_file::open(c->path / ck::files::weights);
  BOOST_TEST((f.at("fc1.bias").type == io::dtype::bf16));
  // The exported bf16 weights are the model's working weights exactly.
  const auto v = f.read_as<hone::bfloat16>("fc1.weight");
  BOOST_TEST(std::memcmp(v.data(), m.w1.data(), v.size() * 2) == 0);
  fs::remove_all(root);
}

namespace {
/// Trains with early stopping checked every 5 steps on a fixed validation batch (patience 3, the
/// keeper tracking the master weights) from step `from` until it says stop or step `until`.
/// Returns the step after the last one trained.
template <class Trainer>
std::uint64_t train_with_early_stopping(Trainer& t, small_mlp<float>& m, hone::early_stopping& es,
                                        hone::best_weights_keeper& keeper, std::uint64_t from,
                                        std::uint64_t until) {
  const batch validation = make_batch(100000);
  for (std::uint64_t s = from; s < until; ++s) {
    (void)t.step(make_batch(s));
    if ((s + 1) % 5 != 0) continue;
    // forward_backward with scale 0 computes the loss; the zero gradients it leaves are
    // overwritten by the next step.
    if (es.update(static_cast<double>(m.forward_backward(validation, 0.0f)), s + 1, keeper)) {
      return s + 1;
    }
  }
  return until;
}
hone::early_stopping make_early_stopping() {
  return hone::early_stopping({.mode = hone::monitor_mode::min, .patience = 3, .min_delta = 2e-3});
}
}  // namespace

BOOST_AUTO_TEST_CASE(resume_with_early_stopping_stops_at_the_same_step_with_the_same_best) {
  const fs::path root =
      fs::temp_directory_path() / ("hone-test-resume-es-" + std::to_string(::getpid()));
  fs::remove_all(root);
  constexpr std::uint64_t limit = 400;

  // Straight.
  small_mlp<float> ma(7);
  auto ta = make_trainer(ma, hone::fp32{});
  auto ea = make_early_stopping();
  hone::best_weights_keeper ka;
  ka.track(ta.master_weights());
  const std::uint64_t stop_a = train_with_early_stopping(ta, ma, ea, ka, 0, limit);
  BOOST_REQUIRE_MESSAGE(ea.should_stop(), "the scenario must stop early: " << ea.message());
  BOOST_REQUIRE(ea.best_step().has_value());
  // Save one check after the last improvement: the wait count is 1 and the weights have moved
  // on from the best ones, so both must come from the checkpoint.
  const std::uint64_t n = *ea.best_step() + 5;
  BOOST_REQUIRE(n < stop_a);

  {
    small_mlp<float> mb(7);
    auto tb = make_trainer(mb, hone::fp32{});
    auto eb = make_early_stopping();
    hone::best_weights_keeper kb;
    kb.track(tb.master_weights());
    BOOST_TEST(train_with_early_stopping(tb, mb, eb, kb, 0, n) == n);
    BOOST_TEST(!eb.should_stop());
    BOOST_TEST(eb.wait_count() == 1u);
    ck::checkpoint_writer w({.root = root});
    ck::training_state extra;
    extra.data.set("next_batch", n);
    BOOST_TEST(w.save(tb.steps_done(), [&](ck::snapshot& s) {
      ck::capture(tb, s, extra);
      ck::capture_early_stopping(eb, s, &kb);
    }));
  }

  // Resumed with fresh objects.
  small_mlp<float> mc(12345);
  auto tc = make_trainer(mc, hone::fp32{});
  auto ec = make_early_stopping();
  hone::best_weights_keeper kc;
  kc.track(tc.master_weights());
  const auto c = ck::newest_valid(root);
  BOOST_REQUIRE(c.has_value());
  BOOST_TEST(fs::exists(c->path / ck::early_stopping_best_file));
  const ck::training_state st = ck::restore(tc, c->path);
  ck::restore_early_stopping(ec, c->path, st, &kc);
  BOOST_TEST(ec.wait_count() == 1u);
  BOOST_TEST(ec.best() == ea.best());
  const std::uint64_t stop_c =
      train_with_early_stopping(tc, mc, ec, kc, st.data.at("next_batch").as_u64(), limit);

  BOOST_TEST(stop_c == stop_a);
  BOOST_TEST((ec.stop_step() == ea.stop_step()));
  BOOST_TEST((ec.best_step() == ea.best_step()));
  BOOST_TEST((ec.state().reason == ea.state().reason));
  BOOST_TEST(ec.checks() == ea.checks());
  BOOST_TEST((state_bits(tc) == state_bits(ta)));  // same weights and moments at the stop
  ka.restore();
  kc.restore();
  BOOST_TEST((state_bits(tc) == state_bits(ta)));  // the same best weights, bit for bit

  // A different patience, or a keeper of another size, is refused with a sentence.
  auto other = hone::early_stopping({.patience = 4});
  BOOST_CHECK_THROW(ck::restore_early_stopping(other, c->path, st), hone::checkpoint_error);
  std::vector<float> smaller(3);
  hone::best_weights_keeper wrong;
  wrong.track(smaller);
  auto ed = make_early_stopping();
  BOOST_CHECK_THROW(ck::restore_early_stopping(ed, c->path, st, &wrong), hone::checkpoint_error);
  ck::training_state none;
  BOOST_CHECK_THROW(ck::restore_early_stopping(ed, c->path, none), hone::checkpoint_error);
  fs::remove_all(root);
}

namespace {
/// One matrix parameter of a given shape (24 elements) whose gradient is the weight itself.
struct matrix_model {
  std::vector<std::size_t> shape;
  std::vector<float> w, g;
  explicit matrix_model(std::vector<std::size_t> s) : shape(std::move(s)), w(24), g(24) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(i) - 0.1f;
  }
  std::vector<hone::parameter<float>> parameters() { return {{"w", shape, w, g}}; }
  float forward_backward(const batch& /*b*/, float scale) {
    for (std::size_t i = 0; i < w.size(); ++i) g[i] = w[i] * scale;
    return 0.0f;
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(shapes_come_from_the_model_and_a_mismatch_is_refused) {
  const fs::path root =
      fs::temp_directory_path() / ("hone-test-shapes-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  matrix_model a({4, 6});
  hone::trainer ta(a, hone::adamw{});
  (void)ta.step(batch{});
  ck::snapshot s;
  ck::capture(ta, s);  // no shapes passed: the model's
  const fs::path dir =
      ck::write_snapshot(root, ta.steps_done(), s, {.compression = std::nullopt, .sync = false});
  const ck::tensor_file wf = ck::tensor_file::open(dir / ck::files::weights);
  BOOST_TEST((wf.find("w")->shape == ck::shape_type{4, 6}));
  const ck::tensor_file of = ck::tensor_file::open(dir / ck::files::optimizer);
  BOOST_TEST((of.find("exp_avg.w")->shape == ck::shape_type{4, 6}));

  // The same elements, transposed shape: refused, naming the tensor, both shapes and the file.
  matrix_model b({6, 4});
  hone::trainer tb(b, hone::adamw{});
  const std::vector<float> before = b.w;
  try {
    (void)ck::restore(tb, dir);
    BOOST_ERROR("no checkpoint_error thrown");
  } catch (const hone::checkpoint_error& e) {
    const std::string msg = e.what();
    for (const char* frag : {"'w'", "[4, 6]", "[6, 4]", "flat = true"}) {
      BOOST_TEST(msg.find(frag) != std::string::npos, msg << " lacks " << frag);
    }
    BOOST_TEST(msg.find(dir.string()) != std::string::npos, msg);
  }
  BOOST_TEST(b.w == before);  // nothing was loaded
  BOOST_TEST(tb.steps_done() == 0u);
  // Asked for explicitly, the flat restore loads element by element.
  (void)ck::restore(tb, dir, ck::trainer_restore_options{.flat = true});
  BOOST_TEST(b.w == a.w);
  BOOST_TEST(tb.steps_done() == 1u);
  // The same shape restores as before.
  matrix_model c({4, 6});
  hone::trainer tc(c, hone::adamw{});
  (void)ck::restore(tc, dir);
  BOOST_TEST(c.w == a.w);
  fs::remove_all(root);
}
