// hone/compress/qat.hpp: quantization-aware training. The trainer policy fake_quant_training keeps
// the fp32 master weights as they are and gives the model fake-quantized working weights
// (quantized to symmetric int8 and back, exactly as quantize_weights and dequantize do), so the
// forward and backward passes see the int8 model while the optimizer updates the fp32 weights with
// the gradient taken at the quantized point: the straight-through estimator (Bengio et al. 2013;
// PyTorch's FakeQuantize for weights, with a per-channel min-max observer updated every step).
//
//   hone::trainer t(net, hone::adamw{}, hone::compress::fake_quant_training({
//       .granularity = hone::compress::quant_granularity::per_channel,
//       .begin_step = 1000}));                 // fp32 warm-up, then QAT
//   t.weight_constraint().apply(t);            // optional: quantize before the first forward
//   ...                                        // t.step(batch) as usual
//   auto q = hone::compress::quantize_weights(master_of_fc1, rows, cols);  // the deployed int8
//
// Which tensors: a predicate on the names, by default every tensor but biases and normalization
// parameters (hone::compress::prunable_by_default). A tensor of shape [rows, ...] is a matrix of
// `rows` output channels (one scale each with per_channel); a 1-D tensor has one scale
// (per-tensor), as a vector has no output channels.
//
// The policy (role weight_constraint, so it composes with everything else of the trainer; not
// with magnitude_pruning, which holds the same role) runs after every applied update, from step
// begin_step on: it reads the updated master weights, computes the scales (max |w| / 127 per row
// or per tensor) and writes q * scale, cast to the working type, into the model's weights. A
// skipped step (fp16 overflow) changes nothing. Requirements, each checked with a sentence: host
// trainers (the CUDA trainer's master weights are device memory), and master weights that are a
// copy of the model's (fp32 weights bound zero-copy are the master itself, and fake quantization
// would overwrite the fp32 weights QAT must keep: give the trainer a model whose tensors are not
// laid out as its arena, or train in bf16_mixed / fp16_mixed).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/compress/prune.hpp"
#include "hone/compress/quant.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/model.hpp"
#include "hone/core/roles.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

/// out = dequantize(quantize_weights(w, rows, cols, granularity)) without the int8 matrix: the
/// same scales and codes, the same bits (a zero group stays zero). `w` must be finite; `out` may
/// be `w` (in place).
inline void fake_quantize(std::span<const float> w, std::size_t rows, std::size_t cols,
                          quant_granularity granularity, std::span<float> out) {
  constexpr const char* who = "hone::compress::fake_quantize";
  HONE_REQUIRE(rows == 0 || cols <= std::numeric_limits<std::size_t>::max() / rows,
               std::string(who) + ": rows * cols overflows.");
  HONE_REQUIRE(w.size() == rows * cols && out.size() == w.size(),
               std::string(who) + ": the weights hold " + std::to_string(w.size()) +
                   " values and the output " + std::to_string(out.size()) + ", but the shape [" +
                   std::to_string(rows) + ", " + std::to_string(cols) + "] needs " +
                   std::to_string(rows * cols) + " each.");
  detail::require_finite(w, cols, who);
  const float tensor_scale =
      granularity == quant_granularity::per_tensor ? detail::abs_max(w) / 127.0f : 0.0f;
  for (std::size_t r = 0; r < rows; ++r) {
    const auto row = w.subspan(r * cols, cols);
    const float s =
        granularity == quant_granularity::per_tensor ? tensor_scale : detail::abs_max(row) / 127.0f;
    for (std::size_t c = 0; c < cols; ++c) {
      out[r * cols + c] = static_cast<float>(detail::quantize_symmetric(row[c], s)) * s;
    }
  }
}

/// The options of fake_quant_training.
struct fake_quant_options {
  /// One scale per output row (per_channel, PyTorch's default for weights) or per tensor.
  quant_granularity granularity = quant_granularity::per_channel;
  /// Which tensors are fake-quantized (by name): by default all but biases and norms.
  prunable_predicate quantized = prunable_by_default;
  /// The first step after which the working weights are fake-quantized (0: from the first
  /// update on). Before it the model trains in full precision (a warm-up, as is usual for QAT).
  std::uint64_t begin_step = 0;
};

/// The trainer policy for quantization-aware training (role weight_constraint; see the top of
/// this file).
class fake_quant_training {
 public:
  using role = roles::weight_constraint;

  explicit fake_quant_training(fake_quant_options o = {}) : o_(std::move(o)) {
    HONE_REQUIRE(static_cast<bool>(o_.quantized),
                 "hone::compress::fake_quant_training: the `quantized` predicate is empty; pass "
                 "one, or leave the default (every tensor but biases and norms).");
  }

  /// Called by the trainer after every applied update: from begin_step on, the model's weights
  /// become the fake-quantized master weights.
  template <class Trainer>
  void after_update(Trainer& t) {
    if (t.steps_done() < o_.begin_step) return;
    apply(t);
  }

  /// Writes the fake-quantized master weights into the model's weights now (e.g. before the
  /// first step, so that the first forward already sees the int8 model, or after a restore).
  template <class Trainer>
  void apply(Trainer& t) {
    auto master = t.master_weights();
    static_assert(std::is_same_v<decltype(master), std::span<float>>,
                  "hone::compress::fake_quant_training: the trainer's master weights are not in "
                  "host memory (a CUDA model); fake quantization runs on host trainers only.");
    HONE_REQUIRE(!t.zero_copy(),
                 "hone::compress::fake_quant_training: the model's fp32 weights are the trainer's "
                 "master weights (bound zero-copy: its tensors are laid out as the trainer's "
                 "arena), so fake quantization would overwrite the fp32 weights that QAT keeps. "
                 "Give the trainer a model whose tensors are separate buffers, or train in "
                 "bf16_mixed or fp16_mixed.");
    if (!bound_) bind(t);
    for (const auto& x : targets_) {
      const std::span<const float> w(master.data() + x.offset, x.rows * x.cols);
      buffer_.resize(w.size());  // grows to the largest tensor once, then reused every step
      fake_quantize(w, x.rows, x.cols, o_.granularity, buffer_);
      x.write(x.weights, buffer_);
    }
  }

  [[nodiscard]] const fake_quant_options& options() const noexcept { return o_; }
  /// The names of the tensors fake-quantized (known after the first apply).
  [[nodiscard]] std::vector<std::string> quantized_tensors() const {
    std::vector<std::string> names;
    for (const auto& x : targets_) names.push_back(x.name);
    return names;
  }

  // The trainer copies its policies: a copy forgets the bound tensors (it binds on first use).
  fake_quant_training(const fake_quant_training& o) : o_(o.o_) {}
  fake_quant_training& operator=(const fake_quant_training& o) {
    o_ = o.o_;
    targets_.clear();
    bound_ = false;
    return *this;
  }
  fake_quant_training(fake_quant_training&&) noexcept = default;
  fake_quant_training& operator=(fake_quant_training&&) noexcept = default;

 private:
  struct target {
    std::string name;
    std::size_t offset = 0;  // in the master arena
    std::size_t rows = 0, cols = 0;
    void* weights = nullptr;  // the model's working weights
    void (*write)(void*, std::span<const float>) = nullptr;
  };

  template <class T>
  static void write_as(void* dst, std::span<const float> v) {
    T* out = static_cast<T*>(dst);
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<T>(v[i]);
  }

  template <class Trainer>
  void bind(Trainer& t) {
    auto params = model_traits<std::remove_cvref_t<decltype(t.model())>>::parameters(t.model());
    const auto& layout = t.layout();
    for (auto& p : params) {
      if (!o_.quantized(p.name)) continue;
      using value_type = typename std::remove_cvref_t<decltype(p)>::value_type;
      const std::size_t slot = layout.find(p.name);
      const std::size_t n = p.value.size();
      HONE_REQUIRE(layout[slot].count == n,
                   "hone::compress::fake_quant_training: the tensor '" + p.name + "' holds " +
                       std::to_string(n) + " values but the trainer's layout has " +
                       std::to_string(layout[slot].count) +
                       " for it; parameters() must describe the same tensors at every call.");
      target x;
      x.name = p.name;
      x.offset = layout[slot].offset;
      x.rows = p.shape.size() >= 2 && n > 0 ? p.shape[0] : (n > 0 ? 1 : 0);
      x.cols = x.rows > 0 ? n / x.rows : 0;
      HONE_REQUIRE(x.rows * x.cols == n,
                   "hone::compress::fake_quant_training: the tensor '" + p.name +
                       "' has a shape whose first extent does not divide its " + std::to_string(n) +
                       " values; describe its shape in parameters().");
      x.weights = static_cast<void*>(p.value.data());
      x.write = &write_as<value_type>;
      targets_.push_back(std::move(x));
    }
    bound_ = true;
  }

  fake_quant_options o_;
  std::vector<target> targets_;
  bool bound_ = false;
  std::vector<float> buffer_;  // one tensor's fake-quantized values before the cast
};

}  // namespace compress
HONE_NAMESPACE_END
