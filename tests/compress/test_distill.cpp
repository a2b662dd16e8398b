// hone::compress::distill_loss against the long double reference of distill_reference.hpp: random
// and extreme logits (1e4 apart), T in {1, 2, 4}, alpha in {0, 0.3, 1}, with and without labels and
// gradient; the same bits on 1, 2 and 4 threads and on every instruction set; non-finite logits
// (the error naming the row, or NaN propagated to that row only); wrong shapes and labels
// (sentences naming the row).
#define BOOST_TEST_MODULE hone_compress_distill
#include <boost/test/unit_test.hpp>

#include <oneapi/tbb/task_arena.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <hone/compress.hpp>
#include <limits>
#include <string>
#include <vector>

#include "distill_reference.hpp"

namespace hc = hone::compress;
using distill_test::compute;
using distill_test::random_labels;
using distill_test::random_logits;

namespace {

struct run_result {
  hc::distill_value value;
  std::vector<float> grad;
};

run_result run(std::size_t batch, std::size_t classes, const std::vector<float>& s,
               const std::vector<float>& t, const std::vector<std::int32_t>& labels,
               const hc::distill_options& o, bool with_grad = true) {
  run_result r;
  if (with_grad) r.grad.assign(batch * classes, -7.0f);  // overwritten, not accumulated
  r.value = hc::distill_loss({batch, classes}, s, t, labels, r.grad, o);
  return r;
}

/// Loss within 2e-5 of the reference's scale (1 + the largest |logit| / T: what the
/// log-sum-exp terms are made of), the two terms likewise, and every gradient element within
/// 1e-5 of the largest gradient an element can have ((alpha T + 1) / batch * grad_scale).
void check_against_reference(std::size_t batch, std::size_t classes, const std::vector<float>& s,
                             const std::vector<float>& t, const std::vector<std::int32_t>& labels,
                             const hc::distill_options& o, const std::string& what) {
  BOOST_TEST_CONTEXT(what << " batch " << batch << " classes " << classes << " T " << o.temperature
                          << " alpha " << o.alpha) {
    const run_result r = run(batch, classes, s, t, labels, o);
    const auto ref = compute(batch, classes, s, t, labels, o.temperature, o.alpha, o.grad_scale);
    float max_abs = 0.0f;
    for (std::size_t i = 0; i < s.size(); ++i) max_abs = std::fmax(max_abs, std::fabs(s[i]));
    for (std::size_t i = 0; i < t.size(); ++i) max_abs = std::fmax(max_abs, std::fabs(t[i]));
    const double T = o.temperature;
    const double scale = 1.0 + max_abs / T;
    BOOST_TEST(std::fabs(r.value.kl - static_cast<double>(ref.kl)) <= 2e-5 * scale);
    BOOST_TEST(std::fabs(r.value.ce - static_cast<double>(ref.ce)) <= 2e-5 * (1.0 + max_abs));
    BOOST_TEST(std::fabs(r.value.loss - static_cast<double>(ref.loss)) <=
               2e-5 * (T * T * scale + 1.0 + max_abs));
    const double gtol =
        1e-5 * (o.alpha * T + 1.0) / static_cast<double>(batch) * std::fabs(o.grad_scale);
    double worst = 0.0;
    std::size_t worst_at = 0;
    for (std::size_t i = 0; i < r.grad.size(); ++i) {
      const double d = std::fabs(static_cast<double>(r.grad[i]) - static_cast<double>(ref.grad[i]));
      if (!(d <= worst)) {
        worst = d;
        worst_at = i;
      }
    }
    BOOST_TEST(worst <= gtol, "gradient element " << worst_at << " is off by " << worst
                                                  << " (tolerance " << gtol << ")");
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(reference_gradient_matches_finite_differences) {
  // The oracle's gradient formula against central differences of the oracle's own loss.
  const std::size_t batch = 3, classes = 5;
  const auto t = random_logits(batch * classes, 3.0f, 11);
  const auto labels = random_labels(batch, classes, 12);
  for (const double T : {1.0, 2.0, 4.0}) {
    // Float logits: perturb in float by a step the float grid can carry, and compare with a
    // tolerance suited to that step.
    auto s = random_logits(batch * classes, 3.0f, 13);
    const auto ref = compute(batch, classes, s, t, labels, T, 0.3);
    for (std::size_t k = 0; k < s.size(); ++k) {
      const float x = s[k], h = 1.0f / 256.0f;
      s[k] = x + h;
      const long double up = compute(batch, classes, s, t, labels, T, 0.3).loss;
      s[k] = x - h;
      const long double down = compute(batch, classes, s, t, labels, T, 0.3).loss;
      s[k] = x;
      const long double fd = (up - down) / (2.0L * h);
      BOOST_TEST(std::fabs(static_cast<double>(fd - ref.grad[k])) <= 1e-4, "element " << k);
    }
  }
}

BOOST_AUTO_TEST_CASE(matches_reference_on_random_logits) {
  std::uint32_t seed = 100;
  for (const std::size_t classes :
       {std::size_t{1}, std::size_t{3}, std::size_t{17}, std::size_t{1000}, std::size_t{1029}}) {
    const std::size_t batch = 9;
    const auto s = random_logits(batch * classes, 5.0f, ++seed);
    const auto t = random_logits(batch * classes, 5.0f, ++seed, 1.5f);
    const auto labels = random_labels(batch, classes, ++seed);
    for (const float T : {1.0f, 2.0f, 4.0f}) {
      for (const float alpha : {0.0f, 0.3f, 1.0f}) {
        check_against_reference(batch, classes, s, t, labels, {T, alpha}, "random");
      }
      check_against_reference(batch, classes, s, t, {}, {T, 1.0f}, "no labels");
      check_against_reference(batch, classes, s, t, labels, {T, 0.7f, 1024.0f}, "grad_scale");
    }
  }
}

BOOST_AUTO_TEST_CASE(matches_reference_on_a_wide_vocabulary) {
  const std::size_t batch = 3, classes = 32000;
  const auto s = random_logits(batch * classes, 8.0f, 7);
  const auto t = random_logits(batch * classes, 8.0f, 8);
  const auto labels = random_labels(batch, classes, 9);
  for (const float T : {1.0f, 2.0f, 4.0f}) {
    check_against_reference(batch, classes, s, t, labels, {T, 0.5f}, "32000 classes");
  }
}

BOOST_AUTO_TEST_CASE(extreme_logits_stay_finite_and_exact) {
  const std::size_t batch = 6, classes = 257;
  // Logits spread over [-1e4, 1e4] around offsets up to 3e4, one row with all logits equal, one
  // with a single huge logit (a one-hot teacher), one where student and teacher are equal.
  auto s = random_logits(batch * classes, 1e4f, 21);
  auto t = random_logits(batch * classes, 1e4f, 22, 3e4f);
  for (std::size_t j = 0; j < classes; ++j) {
    s[1 * classes + j] = -2.5e4f;
    t[1 * classes + j] = 1e4f;
    t[2 * classes + j] = -1e4f;
    s[3 * classes + j] = t[3 * classes + j];
  }
  t[2 * classes + 5] = 1e4f;
  const auto labels = random_labels(batch, classes, 23);
  for (const float T : {1.0f, 2.0f, 4.0f}) {
    for (const float alpha : {0.0f, 0.5f, 1.0f}) {
      const run_result r = run(batch, classes, s, t, labels, {T, alpha});
      BOOST_TEST(std::isfinite(r.value.loss));
      check_against_reference(batch, classes, s, t, labels, {T, alpha}, "extreme");
    }
  }
  // Equal student and teacher: the KL term is exactly 0 and its gradient cancels exactly.
  const std::vector<float> row(s.begin() + 3 * classes, s.begin() + 4 * classes);
  const run_result same = run(1, classes, row, row, {}, {2.0f, 1.0f});
  BOOST_TEST(same.value.kl == 0.0);
  for (const float g : same.grad) BOOST_TEST(g == 0.0f);
}

BOOST_AUTO_TEST_CASE(same_bits_on_any_number_of_threads) {
  const std::size_t batch = 64, classes = 3001;
  const auto s = random_logits(batch * classes, 6.0f, 31);
  const auto t = random_logits(batch * classes, 6.0f, 32);
  const auto labels = random_labels(batch, classes, 33);
  for (const float T : {1.0f, 2.0f}) {
    std::vector<run_result> results;
    for (const int threads : {1, 2, 4}) {
      tbb::task_arena arena(threads);
      arena.execute([&] { results.push_back(run(batch, classes, s, t, labels, {T, 0.4f})); });
    }
    for (std::size_t k = 1; k < results.size(); ++k) {
      BOOST_TEST(results[k].value.loss == results[0].value.loss);
      BOOST_TEST(results[k].value.kl == results[0].value.kl);
      BOOST_TEST(results[k].value.ce == results[0].value.ce);
      BOOST_TEST(std::memcmp(results[k].grad.data(), results[0].grad.data(),
                             results[0].grad.size() * sizeof(float)) == 0);
    }
  }
}

BOOST_AUTO_TEST_CASE(same_bits_on_every_instruction_set) {
  // Each target the CPU runs (the build's own for scalar/sse2, AVX2, AVX-512 through run-time
  // dispatch) against the first: the kernel fuses no product into an add, so the bits agree.
  // Odd class counts leave tails after the 16-lane blocks; 1100 crosses a 1024-logit block.
  const hone::isa before = hone::active_isa();
  for (const std::size_t classes :
       {std::size_t{1}, std::size_t{15}, std::size_t{37}, std::size_t{1100}}) {
    const std::size_t batch = 9;
    const auto s = random_logits(batch * classes, 8.0f, 51);
    const auto t = random_logits(batch * classes, 8.0f, 52);
    const auto labels = random_labels(batch, classes, 53);
    for (const float T : {1.0f, 3.0f}) {
      std::vector<run_result> results;
      std::vector<hone::isa> targets;
      for (const hone::isa target : {hone::isa::sse2, hone::isa::avx2, hone::isa::avx512}) {
        if (!hone::isa_supported(target)) continue;
        hone::force_isa(target);
        results.push_back(run(batch, classes, s, t, labels, {T, 0.3f}));
        targets.push_back(target);
      }
      hone::force_isa(before);
      for (std::size_t k = 1; k < results.size(); ++k) {
        BOOST_TEST_CONTEXT("classes " << classes << " T " << T << ": "
                                      << hone::to_string(targets[k]) << " against "
                                      << hone::to_string(targets[0])) {
          BOOST_TEST(results[k].value.loss == results[0].value.loss);
          BOOST_TEST(results[k].value.kl == results[0].value.kl);
          BOOST_TEST(results[k].value.ce == results[0].value.ce);
          BOOST_TEST(std::memcmp(results[k].grad.data(), results[0].grad.data(),
                                 results[0].grad.size() * sizeof(float)) == 0);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(loss_alone_and_in_place_gradient_agree) {
  const std::size_t batch = 5, classes = 100;
  const auto s = random_logits(batch * classes, 4.0f, 41);
  const auto t = random_logits(batch * classes, 4.0f, 42);
  const auto labels = random_labels(batch, classes, 43);
  for (const float T : {1.0f, 4.0f}) {
    const hc::distill_options o{T, 0.6f};
    const run_result full = run(batch, classes, s, t, labels, o);
    const run_result alone = run(batch, classes, s, t, labels, o, false);
    BOOST_TEST(alone.value.loss == full.value.loss);
    std::vector<float> in_place = s;  // the gradient replaces the logits
    const auto v = hc::distill_loss({batch, classes}, in_place, t, labels, in_place, o);
    BOOST_TEST(v.loss == full.value.loss);
    BOOST_TEST(std::memcmp(in_place.data(), full.grad.data(), in_place.size() * sizeof(float)) ==
               0);
  }
}

BOOST_AUTO_TEST_CASE(nonfinite_logits_are_an_error_naming_the_row_or_propagate) {
  const std::size_t batch = 4, classes = 37;
  const auto s0 = random_logits(batch * classes, 4.0f, 51);
  const auto t0 = random_logits(batch * classes, 4.0f, 52);
  const auto labels = random_labels(batch, classes, 53);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct bad {
    bool student;
    float value;
    const char* says;
  };
  for (const bad b : {bad{true, nan, "NaN"}, bad{false, inf, "+infinity"},
                      bad{true, -inf, "-infinity"}, bad{false, nan, "NaN"}}) {
    auto s = s0, t = t0;
    (b.student ? s : t)[2 * classes + 30] = b.value;
    std::string message;
    try {
      run(batch, classes, s, t, labels, {2.0f, 0.5f});
    } catch (const hone::config_error& e) {
      message = e.what();
    }
    BOOST_TEST_CONTEXT(message) {
      BOOST_TEST(message.find(std::string("the ") + (b.student ? "student" : "teacher") +
                              " logit at row 2, class 30 is " + b.says) != std::string::npos);
    }
    hc::distill_options o{2.0f, 0.5f};
    o.nonfinite = hc::nonfinite_logits::propagate;
    const run_result p = run(batch, classes, s, t, labels, o);
    const run_result clean = run(batch, classes, s0, t0, labels, o);
    BOOST_TEST(std::isnan(p.value.loss));
    for (std::size_t i = 0; i < p.grad.size(); ++i) {
      if (i / classes == 2) {
        BOOST_TEST(std::isnan(p.grad[i]));
      } else {
        BOOST_TEST(p.grad[i] == clean.grad[i]);  // the other rows are untouched
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_sentences) {
  const std::size_t batch = 3, classes = 4;
  const std::vector<float> s(batch * classes, 0.5f), t(batch * classes, 0.25f);
  std::vector<float> g(batch * classes);
  const std::vector<std::int32_t> labels{0, 1, 2};
  auto message = [&](auto&& f) {
    try {
      f();
    } catch (const hone::config_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto has = [](const std::string& m, const std::string& part) {
    BOOST_TEST_CONTEXT(m) {
      BOOST_TEST(m.find(part) != std::string::npos);
    }
  };
  has(message([&] {
        hc::distill_loss({batch, 5}, s, t, labels, g);
      }),
      "the student logits hold 12 values but the shape [3, 5] needs 15");
  has(message([&] {
        hc::distill_loss({batch, classes}, s, std::span(t).first(8), labels, g);
      }),
      "the teacher logits hold 8 values");
  has(message([&] {
        hc::distill_loss({batch, classes}, s, t, labels, std::span(g).first(5));
      }),
      "the gradient buffer holds 5 values");
  has(message([&] {
        const std::vector<std::int32_t> l{0, 4, 1};
        hc::distill_loss({batch, classes}, s, t, l, g);
      }),
      "the label of row 1 is 4, outside [0, 4)");
  has(message([&] {
        const std::vector<std::int32_t> l{0, 1, -1};
        hc::distill_loss({batch, classes}, s, t, l, g);
      }),
      "the label of row 2 is -1");
  has(message([&] {
        hc::distill_loss({batch, classes}, s, t, std::span(labels).first(2), g);
      }),
      "there are 2 labels for 3 rows");
  has(message([&] {
        hc::distill_loss({batch, classes}, s, t, {}, g, {1.0f, 0.5f});
      }),
      "no labels were given but alpha is 0.5");
  has(message([&] {
        hc::distill_loss({batch, classes}, s, t, labels, g, {0.0f, 0.5f});
      }),
      "the temperature is 0");
  has(message([&] {
        hc::distill_loss({batch, classes}, s, t, labels, g, {1.0f, 1.5f});
      }),
      "alpha is 1.5");
  has(message([&] {
        hc::distill_loss({0, classes}, {}, {}, {}, {});
      }),
      "a batch needs at least one row");
}
