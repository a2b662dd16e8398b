// examples/compress_mlp/train.hpp: the training pieces of the example: shuffled in-memory batches,
// train_mlp's recipe on hone::trainer, the distilled student and the LoRA-adapted network.
//
// Every model here is a user model in hone's sense (parameters() + forward_backward(batch,
// loss_scale)), trained by the same hone::trainer composition as train_mlp: AdamW (weight decay
// 0.01, none on biases), gradient clipping at norm 1 and a OneCycle schedule. The matrix products
// are train_mlp's kernels (train_mlp/mlp.hpp); the losses are hone's fused distillation loss
// (hone/compress/distill.hpp), which with alpha = 0 is the plain cross-entropy.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <hone/compress/distill.hpp>
#include <hone/compress/lora.hpp>
#include <hone/core/arena.hpp>
#include <hone/core/error.hpp>
#include <hone/core/model.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/optim/param_group.hpp>
#include <hone/precision/policies.hpp>
#include <hone/schedule/one_cycle.hpp>
#include <hone/train/trainer.hpp>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "net.hpp"
#include "train_mlp/dataset.hpp"
#include "train_mlp/mlp.hpp"
#include "train_mlp/mlp_common.hpp"

namespace compress_mlp {

/// A batch with the teacher's logits of its samples ([count, classes]; empty when not distilling).
struct distill_batch {
  std::span<const float> x;
  std::span<const std::int32_t> y;
  std::span<const float> teacher;
  [[nodiscard]] std::size_t count() const noexcept { return y.size(); }
  [[nodiscard]] train_mlp::batch plain() const noexcept { return {x, y}; }
};

/// `batch` samples at a time from a split, without replacement within an epoch, in a new shuffled
/// order every epoch (train_mlp::random_source, so the order is the same on every platform).
/// With teacher logits ([split size, classes]) the batches carry those of their samples.
class shuffled_batches {
 public:
  shuffled_batches(const train_mlp::split& s, std::size_t features, std::size_t batch,
                   std::uint64_t seed, std::span<const float> teacher = {}, std::size_t classes = 0)
      : split_(&s),
        features_(features),
        batch_(batch),
        classes_(classes),
        teacher_(teacher),
        rng_(seed),
        order_(s.size()),
        x_(batch * features),
        y_(batch),
        t_(teacher.empty() ? 0 : batch * classes) {
    HONE_REQUIRE(batch > 0 && batch <= s.size(),
                 "compress_mlp: a batch of " + std::to_string(batch) + " samples from a split of " +
                     std::to_string(s.size()) + "; --batch must lie in [1, split size]");
    HONE_REQUIRE(teacher.empty() || teacher.size() == s.size() * classes,
                 "compress_mlp: the teacher logits do not cover the split");
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    pos_ = order_.size();  // shuffle on the first call
  }

  distill_batch next() {
    for (std::size_t i = 0; i < batch_; ++i) {
      if (pos_ == order_.size()) {
        rng_.shuffle(order_);
        pos_ = 0;
      }
      const std::size_t j = order_[pos_++];
      std::copy_n(split_->x.begin() + static_cast<std::ptrdiff_t>(j * features_), features_,
                  x_.begin() + static_cast<std::ptrdiff_t>(i * features_));
      y_[i] = split_->y[j];
      if (!t_.empty()) {
        std::copy_n(teacher_.begin() + static_cast<std::ptrdiff_t>(j * classes_), classes_,
                    t_.begin() + static_cast<std::ptrdiff_t>(i * classes_));
      }
    }
    return {x_, y_, t_};
  }

 private:
  const train_mlp::split* split_;
  std::size_t features_, batch_, classes_;
  std::span<const float> teacher_;
  train_mlp::random_source rng_;
  std::vector<std::size_t> order_;
  std::size_t pos_ = 0;
  std::vector<float> x_;
  std::vector<std::int32_t> y_;
  std::vector<float> t_;
};

/// How long and how fast a model trains.
struct recipe {
  std::uint64_t steps = 600;
  double lr = 0.05;
};

/// Trains `model` for r.steps steps of hone::trainer with train_mlp's policies and any `extra`
/// ones (a weight constraint), `next()` giving each step's batch. `setup(trainer)` runs before the
/// first step. Returns the last step's loss.
template <class Model, class NextBatch, class Setup, class... Extra>
float train(Model& model, const recipe& r, NextBatch&& next, Setup&& setup, Extra... extra) {
  hone::trainer t(model, hone::adamw{.weight_decay = 0.01f}, hone::clip_grad_norm{.max_norm = 1.0f},
                  hone::one_cycle{.max_lr = r.lr, .total_steps = r.steps}, std::move(extra)...);
  t.set_param_groups(hone::make_param_groups(
      t.layout(), {{.match = hone::is_no_decay_name, .weight_decay = 0.0f}}));
  setup(t);
  float loss = 0.0f;
  for (std::uint64_t s = 0; s < r.steps; ++s) {
    const auto b = next();
    loss = t.step(b).loss;
  }
  return loss;
}

/// Mean softmax cross-entropy of logits [n, classes] with the labels, and its gradient times
/// `scale` in grad: hone's fused distillation loss with alpha = 0 is exactly that (its teacher
/// term has weight 0, so the logits stand in for the teacher).
inline double cross_entropy(std::size_t n, std::size_t classes, std::span<const float> logits,
                            std::span<const std::int32_t> labels, std::span<float> grad,
                            float scale) {
  return hc::distill_loss({n, classes}, logits, logits, labels, grad,
                          {.temperature = 1.0f, .alpha = 0.0f, .grad_scale = scale})
      .loss;
}

/// The student: train_mlp's architecture (inputs -> hidden -> ReLU -> hidden -> ReLU -> classes,
/// the same parameter layout and initialization), trained on
///   alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * CE
/// (hone::compress::distill_loss, fused with its gradient). alpha = 0 trains it on the labels
/// alone, the baseline that shows what the teacher adds.
class student_mlp {
 public:
  student_mlp(std::size_t inputs, std::size_t hidden, std::size_t classes, std::uint64_t seed,
              hc::distill_options loss)
      : sizes_{inputs, hidden, hidden, classes},
        layout_(train_mlp::mlp_layout(sizes_, sizeof(float))),
        values_(layout_),
        grads_(layout_),
        loss_(loss) {
    const auto init = train_mlp::initial_weights(sizes_, seed);
    for (std::size_t l = 0; l < layers; ++l)
      std::ranges::copy(init[l], values_.view(2 * l).begin());
  }
  student_mlp(const student_mlp&) = delete;
  student_mlp& operator=(const student_mlp&) = delete;

  /// As train_mlp::mlp: fc<l>.weight [in, out], fc<l>.bias [out].
  std::vector<hone::parameter<float>> parameters() {
    return train_mlp::mlp_parameters<float, hone::host_space>(layout_, sizes_, values_, grads_);
  }

  float forward_backward(const distill_batch& b, float loss_scale) {
    const std::size_t n = b.count(), k = sizes_[layers];
    forward(b.x, n);
    auto& d = delta_[layers - 1];
    hc::distill_options o = loss_;
    o.grad_scale = loss_scale;
    const std::span<const float> teacher =
        o.alpha > 0.0f ? b.teacher : std::span<const float>(pre_[layers - 1]).first(n * k);
    const hc::distill_value v =
        hc::distill_loss({n, k}, std::span<const float>(pre_[layers - 1]).first(n * k), teacher,
                         b.y, std::span(d).first(n * k), o);
    for (std::size_t l = layers; l-- > 0;) {
      const std::size_t in = sizes_[l], out = sizes_[l + 1];
      const float* input = l == 0 ? b.x.data() : post_[l - 1].data();
      train_mlp::kernels::matmul_at_b(input, delta_[l].data(), grads_.view(2 * l).data(), n, in,
                                      out);
      const auto gb = grads_.view(2 * l + 1);
      std::fill(gb.begin(), gb.end(), 0.0f);
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = 0; j < out; ++j) gb[j] += delta_[l][i * out + j];
      }
      if (l == 0) break;
      train_mlp::kernels::matmul_a_bt(delta_[l].data(), values_.view(2 * l).data(),
                                      delta_[l - 1].data(), transposed_.data(), n, in, out);
      for (std::size_t i = 0; i < n * in; ++i) {
        if (!(pre_[l - 1][i] > 0.0f)) delta_[l - 1][i] = 0.0f;  // ReLU'
      }
    }
    return static_cast<float>(v.loss);
  }

 private:
  static constexpr std::size_t layers = train_mlp::mlp_layers;

  void forward(std::span<const float> x, std::size_t n) {
    for (std::size_t l = 0; l < layers; ++l) {
      const std::size_t out = sizes_[l + 1];
      if (pre_[l].size() < n * out) {
        pre_[l].resize(n * out);
        post_[l].resize(n * out);
        delta_[l].resize(n * out);
      }
      transposed_.resize(std::max(transposed_.size(), sizes_[l] * out));
    }
    for (std::size_t l = 0; l < layers; ++l) {
      const std::size_t in = sizes_[l], out = sizes_[l + 1];
      const float* input = l == 0 ? x.data() : post_[l - 1].data();
      train_mlp::kernels::linear_forward(input, values_.view(2 * l).data(),
                                         values_.view(2 * l + 1).data(), pre_[l].data(), n, in,
                                         out);
      if (l + 1 < layers) {
        for (std::size_t i = 0; i < n * out; ++i) post_[l][i] = std::max(pre_[l][i], 0.0f);
      }
    }
  }

  train_mlp::layer_sizes sizes_;
  hone::arena_layout layout_;
  hone::arena<float> values_, grads_;
  hc::distill_options loss_;
  std::array<std::vector<float>, layers> pre_, post_, delta_;
  std::vector<float> transposed_;
};
static_assert(hone::trainable<student_mlp, distill_batch>);

/// The trained network with low-rank adapters on every linear layer (hone::compress::lora_model
/// over views of a dense_mlp's weights, named fc1, fc2, fc3 as in PyTorch): only the adapters are
/// parameters, so the trainer updates them in place and the base weights stay frozen.
class lora_mlp {
 public:
  /// `base` must outlive the adapter and keep its vectors (merge() writes into them).
  lora_mlp(dense_mlp& base, const hc::lora_options& o)
      : lora_(refs(base), o), n_(base.layers.size()), tapes_(n_), pre_(n_), post_(n_), delta_(n_) {}
  lora_mlp(const lora_mlp&) = delete;
  lora_mlp& operator=(const lora_mlp&) = delete;

  std::vector<hone::parameter<float>> parameters() { return lora_.parameters(); }

  float forward_backward(const train_mlp::batch& b, float loss_scale) {
    const std::size_t n = b.count();
    lora_.zero_grad();  // backward accumulates
    run(b.x, n, &tapes_);
    const std::size_t k = lora_.layer(n_ - 1).out_features;
    delta_[n_ - 1].resize(n * k);
    const double loss = cross_entropy(n, k, std::span<const float>(pre_[n_ - 1]).first(n * k), b.y,
                                      delta_[n_ - 1], loss_scale);
    for (std::size_t l = n_; l-- > 0;) {
      if (l == 0) {
        lora_.backward(0, b.x, delta_[0], n, tapes_[0]);  // no dx: the input needs no gradient
        break;
      }
      auto& dx = delta_[l - 1];
      dx.resize(n * lora_.layer(l).in_features);
      lora_.backward(l, post_[l - 1], delta_[l], n, tapes_[l], dx);
      for (std::size_t i = 0; i < dx.size(); ++i) {
        if (!(pre_[l - 1][i] > 0.0f)) dx[i] = 0.0f;  // ReLU'
      }
    }
    return static_cast<float>(loss);
  }

  /// logits [m, classes] through lora_model::forward: base + adapter while unmerged, the merged
  /// weight alone once merged. Call lora().eval() first (no dropout).
  void forward(std::span<const float> x, std::size_t m, std::span<float> logits) {
    run(x, m, nullptr);
    std::copy_n(pre_[n_ - 1].begin(), logits.size(), logits.begin());
  }
  [[nodiscard]] std::size_t classes() const { return lora_.layer(n_ - 1).out_features; }
  [[nodiscard]] hc::lora_model& lora() noexcept { return lora_; }

 private:
  static std::vector<hc::linear_ref> refs(dense_mlp& base) {
    std::vector<hc::linear_ref> r;
    for (std::size_t l = 0; l < base.layers.size(); ++l) {
      linear_layer& L = base.layers[l];
      r.push_back({"fc" + std::to_string(l + 1), L.w, L.b, L.out, L.in});
    }
    return r;
  }
  void run(std::span<const float> x, std::size_t n, std::vector<hc::lora_tape>* tapes) {
    std::span<const float> in = x;
    for (std::size_t l = 0; l < n_; ++l) {
      pre_[l].resize(n * lora_.layer(l).out_features);
      lora_.forward(l, in, n, pre_[l], tapes != nullptr ? &(*tapes)[l] : nullptr);
      if (l + 1 < n_) {
        post_[l].resize(pre_[l].size());
        for (std::size_t i = 0; i < pre_[l].size(); ++i) post_[l][i] = std::max(pre_[l][i], 0.0f);
        in = post_[l];
      }
    }
  }

  hc::lora_model lora_;
  std::size_t n_;
  std::vector<hc::lora_tape> tapes_;
  std::vector<std::vector<float>> pre_, post_, delta_;
};
static_assert(hone::trainable<lora_mlp, train_mlp::batch>);

}  // namespace compress_mlp
