// examples/train_mlp/dataset.hpp: the example's dataset, generated in code (no files, no
// licence): a K-armed 2-D spiral, split into train, validation and test sets and standardized.
//
// Arm c (c = 0..K-1) of the spiral holds points at radius r = 0.1 + 0.9 t and angle
//   theta = 2 pi c / K + 2 pi * turns * t + noise * N(0, 1),      t ~ U(0, 1),
// i.e. (r cos theta, r sin theta). The arms wind around each other, so no linear model separates
// them (a linear classifier gets about 1/K of the points right near the centre), while a small
// MLP learns the curved boundaries. The angular noise makes neighbouring arms overlap a little,
// so 100% is out of reach.
//
// Every random number comes from std::mt19937_64, whose output the C++ standard fixes, turned into
// uniform and normal numbers by the code below (not by std::*_distribution, whose algorithms differ
// between standard libraries): the same seed gives the same dataset with any standard library.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <random>
#include <utility>
#include <vector>

namespace train_mlp {

/// Portable random numbers from the standard-specified mt19937_64.
class random_source {
 public:
  explicit random_source(std::uint64_t seed) : engine_(seed) {}
  /// Uniform in [0, 1).
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  /// Standard normal (Box-Muller).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]: log(u1) is finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  /// Uniform integer in [0, n) (n > 0), by rejection (no modulo bias).
  std::uint64_t below(std::uint64_t n) {
    constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
    const std::uint64_t limit = max - max % n;
    std::uint64_t v = engine_();
    while (v >= limit) v = engine_();
    return v % n;
  }
  /// Fisher-Yates shuffle.
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }
  /// The engine, for checkpoints (hone::checkpoint::rng_state / restore_rng).
  [[nodiscard]] std::mt19937_64& engine() noexcept { return engine_; }

 private:
  std::mt19937_64 engine_;
};

/// Samples of one split: `features` floats per sample, row-major, and one label each.
struct split {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  [[nodiscard]] std::size_t size() const noexcept { return y.size(); }
};

struct dataset {
  std::size_t features = 2;
  std::size_t classes = 0;
  split train, validation, test;
};

struct spiral_options {
  std::size_t classes = 5;        // arms
  std::size_t samples = 6000;     // in total, before the split
  std::size_t validation = 1000;  // samples held out for early stopping
  std::size_t test = 1000;        // samples held out for the final accuracy
  double turns = 1.5;             // turns of each arm
  double noise = 0.2;             // standard deviation of the angle, in radians
  std::uint64_t seed = 2024;
};

/// The spiral dataset described at the top of this file, shuffled, split (train gets what the
/// validation and test splits leave) and standardized with the training split's per-feature mean
/// and standard deviation.
inline dataset make_spiral(const spiral_options& o) {
  random_source rng(o.seed);
  const std::size_t n = o.samples;
  std::vector<float> x(2 * n);
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t c = i % o.classes;
    const double t = rng.uniform();
    const double r = 0.1 + 0.9 * t;
    const double theta =
        2.0 * std::numbers::pi *
            (static_cast<double>(c) / static_cast<double>(o.classes) + o.turns * t) +
        o.noise * rng.normal();
    x[2 * i] = static_cast<float>(r * std::cos(theta));
    x[2 * i + 1] = static_cast<float>(r * std::sin(theta));
    y[i] = static_cast<std::int32_t>(c);
  }

  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  rng.shuffle(order);
  dataset d;
  d.features = 2;
  d.classes = o.classes;
  for (std::size_t k = 0; k < n; ++k) {
    split& s = k < o.test ? d.test : k < o.test + o.validation ? d.validation : d.train;
    s.x.push_back(x[2 * order[k]]);
    s.x.push_back(x[2 * order[k] + 1]);
    s.y.push_back(y[order[k]]);
  }

  // Standardize both splits with the training split's statistics.
  for (std::size_t f = 0; f < d.features; ++f) {
    double sum = 0, sum_sq = 0;
    for (std::size_t i = 0; i < d.train.size(); ++i) {
      const double v = d.train.x[i * d.features + f];
      sum += v;
      sum_sq += v * v;
    }
    const double count = static_cast<double>(d.train.size());
    const double mean = sum / count;
    const double stddev = std::sqrt(std::max(sum_sq / count - mean * mean, 1e-12));
    for (split* s : {&d.train, &d.validation, &d.test}) {
      for (std::size_t i = 0; i < s->size(); ++i) {
        float& v = s->x[i * d.features + f];
        v = static_cast<float>((v - mean) / stddev);
      }
    }
  }
  return d;
}

}  // namespace train_mlp
