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
// skipped step (fp16 overflow) changes nothing. The master weights must be a copy of the model's
// (fp32 weights bound zero-copy are the master itself, and fake quantization would overwrite the
// fp32 weights QAT must keep: give the trainer a model whose tensors are not laid out as its
// arena, or train in bf16_mixed / fp16_mixed); checked with a sentence.
//
// hone::zero with sharded master weights (each rank holds a shard, trainer::
// master_weights_sharded()): the same scales and working weights, from one all_reduce (max) of
// the ranges each rank finds in its shard and the trainer's gather of the fake-quantized shards
// (see apply_sharded); every rank calls apply.
//
// CUDA trainers (a model in cuda_space): the same policy runs on the GPU, on the trainer's stream,
// with no host synchronization (hone/compress/cuda/qat.cuh, which this header includes itself
// when nvcc compiles it): the same scales, codes and bits as the host. A master weight that is
// NaN or infinite is found on the device and reported by the next apply (the next step's update)
// or by check(), with the tensor's name and the step; the host path reports it at once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
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
#include "hone/core/space.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

namespace detail {
/// The shape checks of fake_quantize and fake_quantize_async (compress/cuda/qat.cuh).
inline void require_fake_quant_shape(const char* who, std::size_t weights, std::size_t outputs,
                                     std::size_t rows, std::size_t cols) {
  HONE_REQUIRE(rows == 0 || cols <= std::numeric_limits<std::size_t>::max() / rows,
               std::string(who) + ": rows * cols overflows.");
  HONE_REQUIRE(weights == rows * cols && outputs == weights,
               std::string(who) + ": the weights hold " + std::to_string(weights) +
                   " values and the output " + std::to_string(outputs) + ", but the shape [" +
                   std::to_string(rows) + ", " + std::to_string(cols) + "] needs " +
                   std::to_string(rows * cols) + " each.");
}
}  // namespace detail

/// out = dequantize(quantize_weights(w, rows, cols, granularity)) without the int8 matrix: the
/// same scales and codes, the same bits (a zero group stays zero). `w` must be finite; `out` may
/// be `w` (in place).
inline void fake_quantize(std::span<const float> w, std::size_t rows, std::size_t cols,
                          quant_granularity granularity, std::span<float> out) {
  constexpr const char* who = "hone::compress::fake_quantize";
  detail::require_fake_quant_shape(who, w.size(), out.size(), rows, cols);
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

namespace detail {
class fake_quant_device;
/// One tensor fake_quant_training writes.
struct fake_quant_target {
  std::string name;
  std::size_t offset = 0;  // in the master arena
  std::size_t rows = 0, cols = 0;
  void* weights = nullptr;  // the model's working weights (host or device memory)
  void (*write)(void*, std::span<const float>) = nullptr;  // host models
  // Device models: enqueues the fake quantization of `rows * cols` master values into the
  // working weights (compress/cuda/qat.cuh): (master, target, granularity, stream, device, slot).
  void (*device_write)(const float*, const fake_quant_target&, quant_granularity, void*,
                       fake_quant_device&, std::size_t) = nullptr;
};
/// The device side of fake_quant_training (defined in compress/cuda/qat.cuh): a workspace of one
/// non-finite flag per tensor and the state of the last round.
class fake_quant_device {
 public:
  virtual ~fake_quant_device() = default;
  /// Clears the flags on the stream (before a round).
  virtual void begin(void* stream) = 0;
  /// Copies the flags to host memory and marks the round (after a round, at step `step`).
  virtual void end(void* stream, std::uint64_t step) = 0;
  /// Waits for the last round and throws a config_error naming the first flagged tensor.
  virtual void check(const std::vector<fake_quant_target>& targets) = 0;
};
template <class T>
void fake_quant_device_write(const float* master, const fake_quant_target& x,
                             quant_granularity granularity, void* stream, fake_quant_device& device,
                             std::size_t slot);
template <int = 0>
std::shared_ptr<fake_quant_device> make_fake_quant_device(std::size_t slots);
}  // namespace detail

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
    constexpr bool on_host = std::is_same_v<decltype(master), std::span<float>>;
    static_assert(!on_host || std::is_same_v<typename Trainer::space_type, host_space>,
                  "hone::compress::fake_quant_training: this CUDA model's master weights live in "
                  "host memory (the offload role keeps them there), so its working weights could "
                  "only be written from the host after each update; fake quantization with the "
                  "offload role runs on host models only. Train the CUDA model without the "
                  "offload role, or keep the model on the host.");
    HONE_REQUIRE(!t.zero_copy(),
                 "hone::compress::fake_quant_training: the model's fp32 weights are the trainer's "
                 "master weights (bound zero-copy: its tensors are laid out as the trainer's "
                 "arena), so fake quantization would overwrite the fp32 weights that QAT keeps. "
                 "Give the trainer a model whose tensors are separate buffers, or train in "
                 "bf16_mixed or fp16_mixed.");
    if (!bound_) bind<!on_host>(t);
    if constexpr (on_host) {
      if constexpr (requires { t.gradient_reduction().all_reduce_max(std::span<float>(), ""); }) {
        if (t.master_weights_sharded()) return apply_sharded(t, master);
      }
      for (const auto& x : targets_) {
        const std::span<const float> w(master.data() + x.offset, x.rows * x.cols);
        buffer_.resize(w.size());  // grows to the largest tensor once, then reused every step
        fake_quantize(w, x.rows, x.cols, o_.granularity, buffer_);
        x.write(x.weights, buffer_);
      }
    } else {
      // The previous round's flags (its stream work finished at this step's check), then this
      // round: one kernel (per_channel) or two (per_tensor) per tensor, and the flags' copy.
      device_->check(targets_);
      void* stream = static_cast<void*>(t.exec().stream);
      device_->begin(stream);
      for (std::size_t i = 0; i < targets_.size(); ++i) {
        targets_[i].device_write(master.data(), targets_[i], o_.granularity, stream, *device_, i);
      }
      device_->end(stream, t.steps_done());
    }
  }

  /// CUDA trainers: waits for the last round of fake quantization and throws a config_error naming
  /// the tensor if a master weight it read was NaN or infinite (each apply checks the round
  /// before it; call this after the last step). Host trainers: nothing to do (apply throws at
  /// once).
  void check() {
    if (device_) device_->check(targets_);
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
    device_.reset();
    bound_ = false;
    return *this;
  }
  fake_quant_training(fake_quant_training&&) noexcept = default;
  fake_quant_training& operator=(fake_quant_training&&) noexcept = default;

 private:
  using target = detail::fake_quant_target;

  /// f(target, row, first, end) for each row piece of the targets within arena elements [lo, hi):
  /// row `row` of targets_[target], its arena elements [first, end).
  template <class F>
  void for_row_pieces(std::size_t lo, std::size_t hi, F&& f) const {
    for (std::size_t i = 0; i < targets_.size(); ++i) {
      const target& x = targets_[i];
      const std::size_t a = std::max(lo, x.offset), b = std::min(hi, x.offset + x.rows * x.cols);
      for (std::size_t j = a; j < b;) {
        const std::size_t row = (j - x.offset) / x.cols;
        const std::size_t end = std::min(b, x.offset + (row + 1) * x.cols);
        f(i, row, j, end);
        j = end;
      }
    }
  }

  /// hone::zero with sharded master weights: each rank holds arena elements [lo, lo +
  /// master.size()) of the master weights. Each computes max |w| of the row pieces (or tensor
  /// pieces) in its shard; one all_reduce (max) over the ranks gives every rank the ranges of
  /// whole rows and tensors, so the scales and codes are those of fake_quantize on whole tensors
  /// (a maximum has the same bits in any order). Each rank fake-quantizes its shard into a copy,
  /// and the copies are gathered into the model's weights (trainer::publish_weights(values)),
  /// the master weights untouched. One more slot of the all_reduce carries a non-finite weight:
  /// the index + 1 of a tensor holding one, so every rank throws the same error.
  template <class Trainer>
  void apply_sharded(Trainer& t, std::span<float> master) {
    const std::size_t lo = t.master_weights_offset(), hi = lo + master.size();
    const bool per_channel = o_.granularity == quant_granularity::per_channel;
    first_.resize(targets_.size());
    std::size_t slots = 0;
    for (std::size_t i = 0; i < targets_.size(); ++i) {
      first_[i] = slots;
      slots += per_channel ? targets_[i].rows : 1;
    }
    ranges_.assign(slots + 1, 0.0f);
    const auto slot = [&](std::size_t i, std::size_t row) {
      return first_[i] + (per_channel ? row : 0);
    };
    for_row_pieces(lo, hi, [&](std::size_t i, std::size_t row, std::size_t a, std::size_t b) {
      const std::span<const float> piece(master.data() + (a - lo), b - a);
      for (const float v : piece) {
        if (!std::isfinite(v) && ranges_[slots] == 0.0f) {
          ranges_[slots] = static_cast<float>(i + 1);
        }
      }
      float& m = ranges_[slot(i, row)];
      m = std::max(m, detail::abs_max(piece));
    });
    t.gradient_reduction().all_reduce_max(
        std::span<float>(ranges_), "the all_reduce (max) of fake quantization's weight ranges");
    if (ranges_[slots] != 0.0f) {
      const auto bad = static_cast<std::size_t>(ranges_[slots]) - 1;
      HONE_REQUIRE(false, "hone::compress::fake_quant_training: a master weight of tensor '" +
                              targets_[bad].name + "' is NaN or infinite after step " +
                              std::to_string(t.steps_done()) +
                              " (found in a rank's shard); int8 quantization needs finite "
                              "values (the training diverged).");
    }
    buffer_.assign(master.begin(), master.end());
    for_row_pieces(lo, hi, [&](std::size_t i, std::size_t row, std::size_t a, std::size_t b) {
      const float sc = ranges_[slot(i, row)] / 127.0f;
      for (std::size_t j = a; j < b; ++j) {
        buffer_[j - lo] = static_cast<float>(detail::quantize_symmetric(master[j - lo], sc)) * sc;
      }
    });
    t.publish_weights(std::span<const float>(buffer_));
  }

  template <class T>
  static void write_as(void* dst, std::span<const float> v) {
    T* out = static_cast<T*>(dst);
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<T>(v[i]);
  }

  template <bool OnDevice, class Trainer>
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
      if constexpr (OnDevice) {
        x.device_write = &detail::fake_quant_device_write<value_type>;
      } else {
        x.write = &write_as<value_type>;
      }
      targets_.push_back(std::move(x));
    }
    if constexpr (OnDevice) device_ = detail::make_fake_quant_device<>(targets_.size());
    bound_ = true;
  }

  fake_quant_options o_;
  std::vector<target> targets_;
  std::shared_ptr<detail::fake_quant_device> device_;  // CUDA trainers
  bool bound_ = false;
  std::vector<float> buffer_;       // one tensor's fake-quantized values before the cast (sharded:
                                    // the shard's)
  std::vector<std::size_t> first_;  // sharded: each target's first slot in ranges_
  std::vector<float> ranges_;       // sharded: max |w| per channel (or tensor), then a flag
};

}  // namespace compress
HONE_NAMESPACE_END

#if defined(__CUDACC__)
#include "hone/compress/cuda/qat.cuh"
#endif
