// The data of the resume tests (test_resume.cpp, test_resume_early_stopping.cpp): a regression
// batch of 16 rows x 6 features whose values depend only on the step, so a resumed run sees the
// same batches as an uninterrupted one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace resume_data {

struct batch {
  std::vector<float> x;  // rows * dim
  std::vector<float> y;
  std::size_t count() const { return y.size(); }
};

inline batch make_batch(std::uint64_t step) {
  std::mt19937 rng(static_cast<unsigned>(1000 + step));
  std::normal_distribution<float> n(0, 1);
  batch b{std::vector<float>(16 * 6), std::vector<float>(16)};
  for (auto& v : b.x) v = n(rng);
  for (std::size_t r = 0; r < 16; ++r) b.y[r] = 0.7f * b.x[r * 6] - 0.3f * b.x[r * 6 + 3] + 0.1f;
  return b;
}

}  // namespace resume_data
