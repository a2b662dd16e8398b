// hone::compress pruning: the cubic schedule against hand-computed values of Zhu & Gupta's formula;
// magnitude_prune against a scalar oracle (sort (|w|, index), prune the first floor(s * n)), global
// and per tensor, with ties and unprunable tensors; the trainer policy: after every step the pruned
// weights are exactly zero (master and bf16 working weights), the sparsity follows the schedule and
// each pruning matches the oracle on the weights it saw; masks through a checkpoint; errors.
#define BOOST_TEST_MODULE hone_compress_prune
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <hone/checkpoint.hpp>
#include <hone/compress.hpp>
#include <hone/train.hpp>
#include <random>
#include <string>
#include <vector>

#include "../support/linear_model.hpp"
#include "../support/temp_dir.hpp"

namespace hc = hone::compress;
namespace ck = hone::checkpoint;

namespace {

/// y = b + w1 . x[0:d1] + w2 . x[d1:]: two prunable tensors of different sizes and a bias.
template <class T>
struct two_layer {
  std::size_t d1, d2;
  std::vector<T> w1, g1, w2, g2, b, gb;
  two_layer(std::size_t a, std::size_t c) : d1(a), d2(c), w1(a), g1(a), w2(c), g2(c), b(1), gb(1) {
    std::mt19937 rng(3);
    std::normal_distribution<float> n(0.0f, 0.5f);
    for (auto& v : w1) v = T(n(rng));
    for (auto& v : w2) v = T(n(rng));
    b[0] = T(0.1f);
  }
  std::vector<hone::parameter<T>> parameters() {
    return {{"fc1.weight", {d1}, w1, g1}, {"fc2.weight", {d2}, w2, g2}, {"fc2.bias", {1}, b, gb}};
  }
  float forward_backward(const batch& bt, float scale) {
    const std::size_t dim = d1 + d2, rows = bt.y.size();
    std::vector<float> g(dim, 0.0f);
    float gbias = 0, loss = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      float pred = static_cast<float>(b[0]);
      for (std::size_t c = 0; c < d1; ++c) pred += static_cast<float>(w1[c]) * bt.x[r * dim + c];
      for (std::size_t c = 0; c < d2; ++c) {
        pred += static_cast<float>(w2[c]) * bt.x[r * dim + d1 + c];
      }
      const float e = pred - bt.y[r];
      loss += e * e / static_cast<float>(rows);
      for (std::size_t c = 0; c < dim; ++c)
        g[c] += 2 * e * bt.x[r * dim + c] / static_cast<float>(rows);
      gbias += 2 * e / static_cast<float>(rows);
    }
    for (std::size_t c = 0; c < d1; ++c) g1[c] = T(g[c] * scale);
    for (std::size_t c = 0; c < d2; ++c) g2[c] = T(g[d1 + c] * scale);
    gb[0] = T(gbias * scale);
    return loss;
  }
};

/// The oracle: in each group (the flat indices of its prunable elements), the already-pruned
/// elements first, then the kept ones sorted by (|w|, index); the first floor(s * n) are pruned.
std::vector<std::uint8_t> oracle_masks(const std::vector<float>& w,
                                       const std::vector<std::uint8_t>& previous,
                                       const std::vector<std::vector<std::size_t>>& groups,
                                       double s) {
  std::vector<std::uint8_t> keep = previous;
  for (const auto& g : groups) {
    std::vector<std::size_t> order = g;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const bool pa = previous[a] == 0, pb = previous[b] == 0;
      if (pa != pb) return pa;
      if (std::fabs(w[a]) != std::fabs(w[b])) return std::fabs(w[a]) < std::fabs(w[b]);
      return a < b;
    });
    const auto k = static_cast<std::size_t>(std::floor(s * static_cast<double>(g.size())));
    for (std::size_t m = 0; m < order.size(); ++m) keep[order[m]] = m < k ? 0 : 1;
  }
  return keep;
}

std::vector<std::vector<std::size_t>> groups_of(const hc::mask_arena& m, hc::prune_scope scope) {
  std::vector<std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < m.layout().size(); ++i) {
    if (!m.prunable(i)) continue;
    if (scope == hc::prune_scope::per_tensor || groups.empty()) groups.emplace_back();
    const auto& s = m.layout()[i];
    for (std::size_t j = 0; j < s.count; ++j) groups.back().push_back(s.offset + j);
  }
  return groups;
}

hone::arena_layout layout_of(std::initializer_list<std::pair<const char*, std::size_t>> slots) {
  hone::arena_layout l(sizeof(float));
  for (const auto& [name, n] : slots) l.add(name, n);
  return l;
}

/// two_layer<float> with its tensors in one arena laid out as the trainer's: bound zero-copy (the
/// master weights are the model's own).
struct bound_two_layer {
  hone::arena_layout layout{sizeof(float)};
  hone::arena<float> values, grads;
  two_layer<float> net;
  bound_two_layer(std::size_t a, std::size_t c) : net(a, c) {
    layout.add("fc1.weight", a);
    layout.add("fc2.weight", c);
    layout.add("fc2.bias", 1);
    values = hone::arena<float>(layout);
    grads = hone::arena<float>(layout);
    std::copy(net.w1.begin(), net.w1.end(), values.view(0).begin());
    std::copy(net.w2.begin(), net.w2.end(), values.view(1).begin());
    values.view(2)[0] = net.b[0];
  }
  std::vector<hone::parameter<float>> parameters() {
    return {{"fc1.weight", {net.d1}, values.view(0), grads.view(0)},
            {"fc2.weight", {net.d2}, values.view(1), grads.view(1)},
            {"fc2.bias", {1}, values.view(2), grads.view(2)}};
  }
  float forward_backward(const batch& bt, float scale) {
    std::copy(values.view(0).begin(), values.view(0).end(), net.w1.begin());
    std::copy(values.view(1).begin(), values.view(1).end(), net.w2.begin());
    net.b[0] = values.view(2)[0];
    const float loss = net.forward_backward(bt, scale);
    std::copy(net.g1.begin(), net.g1.end(), grads.view(0).begin());
    std::copy(net.g2.begin(), net.g2.end(), grads.view(1).begin());
    grads.view(2)[0] = net.gb[0];
    return loss;
  }
};

/// The policy, recording the master weights each call sees (before it prunes and masks them).
struct recording : hc::magnitude_pruning {
  std::vector<std::vector<float>>* seen = nullptr;
  using hc::magnitude_pruning::magnitude_pruning;
  template <class Trainer>
  void after_update(Trainer& t) {
    seen->emplace_back(t.master_weights().begin(), t.master_weights().end());
    hc::magnitude_pruning::after_update(t);
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(cubic_schedule_follows_zhu_and_gupta) {
  // s_i = 0, s_f = 0.8, t0 = 100, dt = 10, n = 4: s = 0.8 - 0.8 (1 - k/4)^3.
  const hc::cubic_sparsity_schedule s{0.0, 0.8, 100, 10, 4};
  BOOST_TEST(s.at(0) == 0.0);
  BOOST_TEST(s.at(99) == 0.0);
  BOOST_TEST(s.at(100) == 0.0);
  BOOST_TEST(std::fabs(s.at(110) - 0.4625) < 1e-15);
  BOOST_TEST(std::fabs(s.at(119) - 0.4625) < 1e-15);  // constant between pruning steps
  BOOST_TEST(std::fabs(s.at(120) - 0.7) < 1e-15);
  BOOST_TEST(std::fabs(s.at(130) - 0.7875) < 1e-15);
  BOOST_TEST(s.at(140) == 0.8);
  BOOST_TEST(s.at(100000) == 0.8);
  const hc::cubic_sparsity_schedule from_half{0.5, 0.9, 0, 1, 2};
  BOOST_TEST(from_half.at(0) == 0.5);
  BOOST_TEST(std::fabs(from_half.at(1) - (0.9 - 0.4 * 0.125)) < 1e-15);
}

BOOST_AUTO_TEST_CASE(magnitude_prune_matches_the_sorting_oracle) {
  const auto layout = layout_of({{"a.weight", 37}, {"a.bias", 5}, {"b.weight", 100}});
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> q(-20, 20);  // few distinct magnitudes: many ties, zeros
  std::vector<float> w(layout.total(), 0.0f);
  for (std::size_t i = 0; i < layout.size(); ++i) {
    for (std::size_t j = 0; j < layout[i].count; ++j) {
      w[layout[i].offset + j] = 0.125f * static_cast<float>(q(rng));
    }
  }
  for (const auto scope : {hc::prune_scope::global, hc::prune_scope::per_tensor}) {
    hc::mask_arena m(layout, hc::prunable_by_default);
    BOOST_TEST(!m.prunable(1));
    BOOST_TEST(m.prunable_count() == 137u);
    const auto groups = groups_of(m, scope);
    std::vector<std::uint8_t> previous(m.all().begin(), m.all().end());
    for (const double s : {0.1, 0.33, 0.5, 0.5, 0.77, 1.0}) {
      // Between prunings the weights change (pruned ones stay zero, as the policy keeps them).
      for (std::size_t k = 0; k < w.size(); ++k) {
        if (previous[k] != 0) w[k] += 0.0625f * static_cast<float>(q(rng) % 3);
      }
      hc::magnitude_prune(w, m, s, scope);
      const auto expect = oracle_masks(w, previous, groups, s);
      BOOST_TEST(std::vector<std::uint8_t>(m.all().begin(), m.all().end()) == expect,
                 "sparsity " << s);
      for (const std::size_t j : {37u, 38u, 39u, 40u, 41u}) {  // a.bias: never pruned
        BOOST_TEST(m.all()[layout[1].offset + (j - 37)] == 1);
      }
      previous.assign(m.all().begin(), m.all().end());
      m.apply(w);
    }
    BOOST_TEST(m.sparsity() == 1.0);
  }
}

BOOST_AUTO_TEST_CASE(policy_keeps_pruned_weights_zero_and_follows_the_schedule) {
  for (const auto scope : {hc::prune_scope::global, hc::prune_scope::per_tensor}) {
    two_layer<float> net(40, 23);
    hc::magnitude_pruning_options o;
    o.schedule = {0.1, 0.75, 3, 4, 5};  // prunes at steps 3, 7, 11, 15, 19, 23
    o.scope = scope;
    std::vector<std::vector<float>> seen;
    recording policy(o);
    policy.seen = &seen;
    hone::trainer<two_layer<float>, hone::adamw, recording> t(net, hone::adamw{0.05f}, policy);
    std::vector<std::uint8_t> previous;
    for (std::uint64_t step = 1; step <= 30; ++step) {
      t.step(make_batch(16, 63, static_cast<unsigned>(step)));
      const hc::mask_arena& m = t.weight_constraint().masks();
      if (previous.empty()) previous.assign(m.all().size(), 1);
      const double s = o.schedule.at(step);
      std::vector<std::uint8_t> expect = previous;
      if (s > o.schedule.at(step - 1) || step == 3) {
        expect = oracle_masks(seen.back(), previous, groups_of(m, scope), s);
      }
      BOOST_TEST_CONTEXT("step " << step) {
        BOOST_TEST(std::vector<std::uint8_t>(m.all().begin(), m.all().end()) == expect);
        std::size_t want = 0;
        for (const auto& g : groups_of(m, scope)) {
          want += static_cast<std::size_t>(std::floor(s * static_cast<double>(g.size())));
        }
        BOOST_TEST(m.pruned() == want);
        for (std::size_t j = 0; j < net.w1.size(); ++j) {
          if (m.tensor(0)[j] == 0) BOOST_TEST(net.w1[j] == 0.0f);
        }
        for (std::size_t j = 0; j < net.w2.size(); ++j) {
          if (m.tensor(1)[j] == 0) BOOST_TEST(net.w2[j] == 0.0f);
        }
      }
      previous.assign(m.all().begin(), m.all().end());
    }
    BOOST_TEST(std::fabs(t.weight_constraint().level() - 0.75) < 1e-15);
  }
}

BOOST_AUTO_TEST_CASE(zero_copy_model_weights_are_zero) {
  bound_two_layer net(48, 16);
  hc::magnitude_pruning_options o;
  o.schedule = {0.25, 0.5, 1, 2, 2};  // 0.25 at step 1, 0.4375 at 3, 0.5 from 5
  hone::trainer<bound_two_layer, hone::adamw, hc::magnitude_pruning> t(net, hone::adamw{0.05f},
                                                                       hc::magnitude_pruning(o));
  BOOST_TEST(t.zero_copy());
  for (unsigned step = 1; step <= 8; ++step) {
    t.step(make_batch(8, 64, step));
    const hc::mask_arena& m = t.weight_constraint().masks();
    BOOST_TEST(m.pruned() == static_cast<std::size_t>(std::floor(o.schedule.at(step) * 64.0)));
    for (std::size_t i = 0; i < 2; ++i) {
      for (std::size_t j = 0; j < m.tensor(i).size(); ++j) {
        if (m.tensor(i)[j] == 0) BOOST_TEST(net.values.view(i)[j] == 0.0f);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(bf16_working_weights_are_zero_too) {
  two_layer<hone::bfloat16> net(64, 64);
  hc::magnitude_pruning_options o;
  o.schedule = {0.5, 0.5, 1, 1, 1};
  hone::trainer<two_layer<hone::bfloat16>, hone::bf16_mixed, hone::adamw, hc::magnitude_pruning> t(
      net, hone::bf16_mixed{}, hone::adamw{0.05f}, hc::magnitude_pruning(o));
  BOOST_TEST(!t.zero_copy());
  for (unsigned step = 1; step <= 5; ++step) {
    t.step(make_batch(8, 128, step));
    const hc::mask_arena& m = t.weight_constraint().masks();
    BOOST_TEST(m.pruned() == 64u);
    std::size_t zeros = 0;
    for (std::size_t j = 0; j < 64; ++j) {
      if (m.tensor(0)[j] == 0) {
        BOOST_TEST(static_cast<float>(net.w1[j]) == 0.0f);
        ++zeros;
      }
      if (m.tensor(1)[j] == 0) {
        BOOST_TEST(static_cast<float>(net.w2[j]) == 0.0f);
        ++zeros;
      }
    }
    BOOST_TEST(zeros == 64u);
  }
}

BOOST_AUTO_TEST_CASE(masks_travel_in_checkpoints) {
  hone_test::temp_dir dir("compress_prune");
  hc::magnitude_pruning_options o;
  o.schedule = {0.2, 0.6, 2, 3, 3};
  two_layer<float> a(30, 30), b(30, 30);
  hone::trainer<two_layer<float>, hone::adamw, hc::magnitude_pruning> ta(a, hone::adamw{0.05f},
                                                                         hc::magnitude_pruning(o));
  for (unsigned s = 1; s <= 6; ++s) ta.step(make_batch(8, 60, s));
  ck::snapshot snap;
  ck::capture(ta, snap);
  hc::capture_pruning(ta, snap);
  const auto path = ck::write_snapshot(dir.path, ta.steps_done(), snap);
  hone::trainer<two_layer<float>, hone::adamw, hc::magnitude_pruning> tb(b, hone::adamw{0.05f},
                                                                         hc::magnitude_pruning(o));
  ck::restore(tb, path);
  hc::restore_pruning(tb, path);
  const auto& ma = ta.weight_constraint().masks();
  const auto& mb = tb.weight_constraint().masks();
  BOOST_TEST(std::vector<std::uint8_t>(ma.all().begin(), ma.all().end()) ==
             std::vector<std::uint8_t>(mb.all().begin(), mb.all().end()));
  BOOST_TEST(tb.weight_constraint().level() == ta.weight_constraint().level());
  // Both continue identically: same masks and weights, bit for bit, through the next prunings.
  for (unsigned s = 7; s <= 14; ++s) {
    ta.step(make_batch(8, 60, s));
    tb.step(make_batch(8, 60, s));
  }
  BOOST_TEST(a.w1 == b.w1);
  BOOST_TEST(a.w2 == b.w2);
  BOOST_TEST(std::vector<std::uint8_t>(ma.all().begin(), ma.all().end()) ==
             std::vector<std::uint8_t>(mb.all().begin(), mb.all().end()));
  // A checkpoint without masks is refused with a sentence.
  ck::snapshot plain;
  ck::capture(ta, plain);
  const auto p2 = ck::write_snapshot(dir.path, 100, plain);
  std::string m;
  try {
    hc::restore_pruning(tb, p2);
  } catch (const hone::checkpoint_error& e) {
    m = e.what();
  }
  BOOST_TEST(m.find("saved without capture_pruning()") != std::string::npos, m);
}

BOOST_AUTO_TEST_CASE(bad_input_is_a_sentence) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const hone::error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto has = [](const std::string& m, const std::string& part) {
    BOOST_TEST_CONTEXT(m) {
      BOOST_TEST(m.find(part) != std::string::npos);
    }
  };
  const auto layout = layout_of({{"w", 10}});
  hc::mask_arena m(layout, hc::prunable_by_default);
  std::vector<float> w(layout.total(), 1.0f);
  w[4] = std::nanf("");
  has(message([&] { hc::magnitude_prune(w, m, 0.5); }), "weight 4 of tensor 'w' is nan");
  w[4] = 1.0f;
  has(message([&] { hc::magnitude_prune(w, m, 1.5); }), "the sparsity is 1.5");
  has(message([&] { hc::magnitude_prune(std::span(w).first(3), m, 0.5); }),
      "the weights hold 3 elements");
  has(message([&] { hc::cubic_sparsity_schedule{0.5, 0.2}.check(); }), "target is 0.2");
  has(message([&] { hc::cubic_sparsity_schedule{0.0, 0.5, 0, 0, 1}.check(); }), "every is 0");
  has(message([&] { hc::cubic_sparsity_schedule{0.0, 0.5, 0, 1, 0}.check(); }), "prunings is 0");
}
