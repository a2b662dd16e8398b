// Compile-time benchmark, translation unit 2: a user's trainer file, with hone's trainer
// instantiated in three precisions (fp32, bf16_mixed, fp16_mixed) and the policies of README.md
// (accumulation by count, AdamW, global-norm clipping, OneCycle). The model is the user's own:
// a linear regressor written with plain loops, templated on its element type.
//
// It includes what a user includes: the module umbrellas of the modules it names when the
// installed hone has them, else the all-in-one <hone/hone.hpp> (older releases).
#if __has_include(<hone/train.hpp>)
#include <hone/optim.hpp>
#include <hone/precision.hpp>
#include <hone/schedule.hpp>
#include <hone/train.hpp>
#else
#include <hone/hone.hpp>
#endif

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

namespace user {

struct batch {
  std::size_t rows = 0, cols = 0;
  std::vector<float> x, y;  // rows * cols inputs (row-major), rows targets
  std::size_t count() const { return rows; }
};

template <class T>
class linear_regressor {
 public:
  explicit linear_regressor(std::size_t features)
      : w_(features, T(0.0f)), gw_(features, T(0.0f)), b_(1, T(0.0f)), gb_(1, T(0.0f)) {}

  std::vector<hone::parameter<T>> parameters() {
    return {{"weight", {w_.size()}, std::span<T>(w_), std::span<T>(gw_)},
            {"bias", {1}, std::span<T>(b_), std::span<T>(gb_)}};
  }

  float forward_backward(const batch& b, float loss_scale) {
    std::vector<float> gw(w_.size(), 0.0f);
    float gb = 0.0f;
    double loss = 0.0;
    const float inv_n = 1.0f / static_cast<float>(b.rows);
    for (std::size_t r = 0; r < b.rows; ++r) {
      float pred = static_cast<float>(b_[0]);
      for (std::size_t c = 0; c < b.cols; ++c) {
        pred += static_cast<float>(w_[c]) * b.x[r * b.cols + c];
      }
      const float err = pred - b.y[r];
      loss += static_cast<double>(err) * err;
      const float g = 2.0f * err * inv_n * loss_scale;
      for (std::size_t c = 0; c < b.cols; ++c) gw[c] += g * b.x[r * b.cols + c];
      gb += g;
    }
    for (std::size_t c = 0; c < gw.size(); ++c) gw_[c] = T(gw[c]);
    gb_[0] = T(gb);
    return static_cast<float>(loss / static_cast<double>(b.rows));
  }

 private:
  std::vector<T> w_, gw_, b_, gb_;
};

template <class T, class Precision>
float train(Precision precision, std::span<const batch> micro_batches, int steps) {
  static_assert(hone::trainable<linear_regressor<T>, batch>);
  linear_regressor<T> net(micro_batches.front().cols);
  hone::trainer t(
      net, precision, hone::accumulate::by_count{}, hone::adamw{.weight_decay = 0.01f},
      hone::clip_grad_norm{.max_norm = 1.0f},
      hone::one_cycle{.max_lr = 3e-3, .total_steps = static_cast<std::uint64_t>(steps)});
  float loss = 0.0f;
  for (int s = 0; s < steps; ++s) {
    const hone::step_report r = t.step(micro_batches);
    loss = r.loss;
  }
  return loss;
}

}  // namespace user

int main() {
  std::vector<user::batch> micro(3);
  for (std::size_t i = 0; i < micro.size(); ++i) {
    micro[i] = {4 + i, 8, std::vector<float>((4 + i) * 8, 0.5f), std::vector<float>(4 + i, 1.0f)};
  }
  const std::span<const user::batch> mb(micro);
  std::printf("%g\n", user::train<float>(hone::fp32{}, mb, 10));
  std::printf("%g\n", user::train<hone::bfloat16>(hone::bf16_mixed{}, mb, 10));
  std::printf("%g\n", user::train<hone::half>(hone::fp16_mixed<>{}, mb, 10));
}
