// hone/compress/lora.hpp: low-rank adapters (LoRA, Hu et al. 2021) on the user's own linear
// layers, with PEFT's semantics.
//
//   hone::compress::lora_model lora({{"fc1", w1, b1, 64, 32}, {"block.proj", w2, {}, 16, 64}},
//                                   {.r = 8, .alpha = 16, .dropout = 0.05f, .seed = 1});
//   static_assert(hone::model<hone::compress::lora_model>);   // only the adapters are parameters
//   lora.forward(0, x, rows, y, &tape);       // y = x W^T + b + scaling * dropout(x) A^T B^T
//   lora.backward(0, x, dy, rows, tape, dx);  // grads of A and B (accumulated), and dx
//   lora.merge();  ...  lora.unmerge();       // W += scaling B A, and back, bit for bit
//
// A layer's weight W [out, in] (row-major, PyTorch's nn.Linear layout) and bias b [out] are views
// of the user's storage: hone never copies or trains them. The adapters A [r, in] and B [out, r]
// of every layer live in one flat arena (and their gradients in a second one) laid out in the
// order of parameters(), so hone's trainer uses them in place (trainer::zero_copy()) and its
// optimizer state covers the adapters only. Initialization is PEFT's default: A from nn.Linear's
// default (Kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in))), B zero, so the
// adapted model starts as the base model. scaling = alpha / r (alpha / sqrt(r) with use_rslora).
//
// merge() adds scaling * B A to W in place (as PEFT's merge_adapter) after keeping the exact bytes
// of W; unmerge() puts those bytes back. Floating-point subtraction cannot undo a rounded addition
// (peft #1388: outputs change after merge/unmerge), so hone restores the kept copy instead: the
// base is bit for bit what it was. Saving and loading PEFT's files: hone/compress/lora_io.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hone/core/arena.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/model.hpp"
#include "hone/io/hash.hpp"
#include "hone/rl/rng.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

/// One of the user's linear layers, y = x W^T + b: views of the user's own storage.
struct linear_ref {
  /// The module path, as PyTorch names it ("encoder.layers.0.fc1"): it names the adapter's
  /// parameters and its tensors in PEFT's files.
  std::string name;
  /// W, [out_features, in_features] row-major. Writable: merge() changes it in place.
  std::span<float> weight;
  /// b, [out_features], or empty for a layer without bias.
  std::span<const float> bias;
  std::size_t out_features = 0;
  std::size_t in_features = 0;
};

/// The hyperparameters of PEFT's LoraConfig that hone implements.
struct lora_options {
  std::size_t r = 8;        // rank
  float alpha = 8.0f;       // lora_alpha
  float dropout = 0.0f;     // lora_dropout, on the adapter's input only, in [0, 1)
  bool use_rslora = false;  // scaling alpha / sqrt(r) instead of alpha / r
  std::uint64_t seed = 0;   // initialization of A, then the dropout masks
};

/// What a layer's forward keeps for its backward (reuse one per layer across steps: the vectors
/// keep their capacity).
struct lora_tape {
  std::size_t rows = 0;
  /// h = dropout(x) A^T, [rows, r].
  std::vector<float> h;
  /// The dropout mask, [rows, in]: 1 where the input element was kept (scaled by 1 / (1 - p)),
  /// 0 where it was dropped. Empty when no dropout was applied (evaluation, or p = 0).
  std::vector<std::uint8_t> keep;
};

namespace detail {

inline std::size_t lora_checked_product(std::size_t a, std::size_t b, std::string_view what) {
  HONE_REQUIRE(b == 0 || a <= static_cast<std::size_t>(-1) / b,
               "hone::compress::lora: " + std::string(what) + " overflows size_t");
  return a * b;
}

}  // namespace detail

/// A set of adapted linear layers. It models hone::model with the adapters as its only
/// parameters, named "<module path>.lora_A.weight" [r, in] and "<module path>.lora_B.weight"
/// [out, r], layer by layer in the order given. The user's trainable model holds one, calls
/// forward/backward from its own forward_backward, and returns its parameters().
class lora_model {
  using rl_rng = replay_rng;

 public:
  lora_model(std::vector<linear_ref> layers, lora_options options)
      : layers_(std::move(layers)), options_(options) {
    HONE_REQUIRE(!layers_.empty(),
                 "hone::compress::lora_model: no layers given; pass the linear layers to adapt");
    check_options(options_);
    arena_layout layout(sizeof(float));
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const linear_ref& l = layers_[i];
      const std::string who =
          "hone::compress::lora_model: layer " + std::to_string(i) + " '" + l.name + "'";
      HONE_REQUIRE(!l.name.empty(), who +
                                        " has no name; give each layer its module path "
                                        "(\"encoder.fc1\"), which names its adapters");
      HONE_REQUIRE(l.out_features > 0 && l.in_features > 0,
                   who + " has out_features " + std::to_string(l.out_features) +
                       " and in_features " + std::to_string(l.in_features) +
                       "; both must be positive");
      const std::size_t n = detail::lora_checked_product(l.out_features, l.in_features, who);
      HONE_REQUIRE(l.weight.size() == n,
                   who + ": the weight view has " + std::to_string(l.weight.size()) +
                       " elements, but [out, in] = [" + std::to_string(l.out_features) + ", " +
                       std::to_string(l.in_features) + "] needs " + std::to_string(n));
      HONE_REQUIRE(l.bias.empty() || l.bias.size() == l.out_features,
                   who + ": the bias view has " + std::to_string(l.bias.size()) +
                       " elements; it must be empty (no bias) or have out_features = " +
                       std::to_string(l.out_features));
      for (std::size_t j = 0; j < i; ++j) {
        HONE_REQUIRE(layers_[j].name != l.name, who + " has the same name as layer " +
                                                    std::to_string(j) +
                                                    "; module paths must be distinct");
      }
      layout.add(l.name + ".lora_A.weight",
                 detail::lora_checked_product(options_.r, l.in_features, who + " lora_A"));
      layout.add(l.name + ".lora_B.weight",
                 detail::lora_checked_product(l.out_features, options_.r, who + " lora_B"));
    }
    values_ = arena<float>(layout);
    grads_ = arena<float>(layout);
    merged_.resize(layers_.size());
    reset_parameters(options_.seed);
  }

  /// PEFT's initialization from `seed`: A_ij ~ U(-1/sqrt(in), 1/sqrt(in)) layer by layer (53-bit
  /// uniforms from xoshiro256++), B = 0. Restarts the dropout stream from the same seed.
  void reset_parameters(std::uint64_t seed) {
    require_unmerged("reset_parameters");
    rl_rng init(seed);
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(layers_[i].in_features));
      for (float& a : lora_A(i)) a = static_cast<float>((2.0 * init.uniform() - 1.0) * bound);
      std::fill(lora_B(i).begin(), lora_B(i).end(), 0.0f);
    }
    dropout_rng_ = rl_rng(seed ^ 0xd50b'0a7e'5eed'0001ULL);
  }

  // ---- structure ----
  [[nodiscard]] std::size_t size() const noexcept { return layers_.size(); }
  [[nodiscard]] const linear_ref& layer(std::size_t i) const { return layers_[checked(i)]; }
  /// The index of the layer called `name`; config_error naming it when absent.
  [[nodiscard]] std::size_t index(std::string_view name) const {
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      if (layers_[i].name == name) return i;
    }
    throw config_error("hone::compress::lora_model: no adapted layer named '" + std::string(name) +
                       "'");
  }
  [[nodiscard]] const lora_options& options() const noexcept { return options_; }
  [[nodiscard]] std::size_t rank() const noexcept { return options_.r; }
  /// alpha / r, or alpha / sqrt(r) with use_rslora.
  [[nodiscard]] float scaling() const noexcept { return scaling_of(options_); }
  /// Changes alpha, dropout and use_rslora (the rank is fixed by the arena).
  void set_options(const lora_options& o) {
    HONE_REQUIRE(o.r == options_.r, "hone::compress::lora_model::set_options: the rank " +
                                        std::to_string(o.r) + " differs from the model's " +
                                        std::to_string(options_.r) +
                                        "; build a new lora_model for another rank");
    check_options(o);
    require_unmerged("set_options");
    options_ = o;
  }

  // ---- adapters ----
  [[nodiscard]] std::span<float> lora_A(std::size_t i) { return values_.view(2 * checked(i)); }
  [[nodiscard]] std::span<const float> lora_A(std::size_t i) const {
    return values_.view(2 * checked(i));
  }
  [[nodiscard]] std::span<float> lora_B(std::size_t i) { return values_.view(2 * checked(i) + 1); }
  [[nodiscard]] std::span<const float> lora_B(std::size_t i) const {
    return values_.view(2 * checked(i) + 1);
  }
  [[nodiscard]] std::span<float> grad_A(std::size_t i) { return grads_.view(2 * checked(i)); }
  [[nodiscard]] std::span<float> grad_B(std::size_t i) { return grads_.view(2 * checked(i) + 1); }
  /// Every adapter in one arena (padding zero), and their gradients, laid out like parameters().
  [[nodiscard]] arena<float>& adapters() noexcept { return values_; }
  [[nodiscard]] const arena<float>& adapters() const noexcept { return values_; }
  [[nodiscard]] arena<float>& gradients() noexcept { return grads_; }

  /// The adapters only: what hone's trainer and optimizer see. The base weights stay frozen.
  [[nodiscard]] std::vector<parameter<float>> parameters() {
    std::vector<parameter<float>> p;
    p.reserve(2 * layers_.size());
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const auto& l = layers_[i];
      p.push_back(
          {values_.layout()[2 * i].name, {options_.r, l.in_features}, lora_A(i), grad_A(i)});
      p.push_back(
          {values_.layout()[2 * i + 1].name, {l.out_features, options_.r}, lora_B(i), grad_B(i)});
    }
    return p;
  }
  /// Zeroes every adapter gradient (backward accumulates into them).
  void zero_grad() noexcept {
    auto g = grads_.all();
    std::fill(g.begin(), g.end(), 0.0f);
  }

  /// Training mode applies dropout in forward (when p > 0); evaluation mode does not.
  void train(bool on = true) noexcept { training_ = on; }
  void eval() noexcept { training_ = false; }
  [[nodiscard]] bool training() const noexcept { return training_; }
  /// The dropout stream's state (save it with a checkpoint to resume the same masks).
  [[nodiscard]] rl_rng::state_type dropout_state() const noexcept { return dropout_rng_.state(); }
  void set_dropout_state(const rl_rng::state_type& s) noexcept { dropout_rng_.set_state(s); }

  // ---- compute (host, fp32) ----

  /// y = x W^T + b + scaling * dropout(x) A^T B^T for `rows` rows of x [rows, in]; y is [rows, out]
  /// (overwritten). In training mode with p > 0 a fresh mask is drawn from the dropout stream.
  /// `tape` (needed by backward) receives h and the mask. A merged layer computes x W^T + b only:
  /// its W already holds the adapter.
  void forward(std::size_t i, std::span<const float> x, std::size_t rows, std::span<float> y,
               lora_tape* tape = nullptr) {
    const linear_ref& l = layer(i);
    check_rows("forward", i, x.size(), rows, l.in_features, "x");
    check_rows("forward", i, y.size(), rows, l.out_features, "y");
    const std::size_t in = l.in_features, out = l.out_features, r = options_.r;
    for (std::size_t n = 0; n < rows; ++n) {
      const float* xn = x.data() + n * in;
      float* yn = y.data() + n * out;
      for (std::size_t o = 0; o < out; ++o) {
        yn[o] = dot(xn, l.weight.data() + o * in, in) + (l.bias.empty() ? 0.0f : l.bias[o]);
      }
    }
    if (merged_[i].active) {
      if (tape != nullptr) {
        tape->rows = rows;
        tape->h.clear();
        tape->keep.clear();
      }
      return;
    }
    lora_tape local;
    lora_tape& t = tape != nullptr ? *tape : local;
    t.rows = rows;
    t.h.assign(rows * r, 0.0f);
    const bool drop = training_ && options_.dropout > 0.0f;
    if (drop) {
      t.keep.resize(rows * in);
      for (auto& k : t.keep) k = dropout_rng_.uniform() >= options_.dropout ? 1 : 0;
    } else {
      t.keep.clear();
    }
    const float keep_scale = drop ? 1.0f / (1.0f - options_.dropout) : 1.0f;
    const auto A = lora_A(i);
    const auto B = lora_B(i);
    std::vector<float> u(drop ? in : 0);
    const float s = scaling();
    for (std::size_t n = 0; n < rows; ++n) {
      const float* xn = x.data() + n * in;
      if (drop) {
        for (std::size_t c = 0; c < in; ++c) {
          u[c] = t.keep[n * in + c] != 0 ? xn[c] * keep_scale : 0.0f;
        }
        xn = u.data();
      }
      float* hn = t.h.data() + n * r;
      for (std::size_t k = 0; k < r; ++k) hn[k] = dot(xn, A.data() + k * in, in);
      float* yn = y.data() + n * out;
      for (std::size_t o = 0; o < out; ++o) yn[o] += s * dot(hn, B.data() + o * r, r);
    }
  }

  /// Backward of forward for the same x and tape, with dy = dLoss/dy [rows, out]: adds the
  /// gradients of A and B to grad_A(i) / grad_B(i), and writes dx [rows, in] when dx is not empty
  /// (through W and through the adapter). The base W and b get no gradient (they are frozen).
  void backward(std::size_t i, std::span<const float> x, std::span<const float> dy,
                std::size_t rows, const lora_tape& tape, std::span<float> dx = {}) {
    const linear_ref& l = layer(i);
    HONE_REQUIRE(!merged_[i].active, "hone::compress::lora_model::backward: layer '" + l.name +
                                         "' is merged; unmerge() before training the adapters");
    check_rows("backward", i, x.size(), rows, l.in_features, "x");
    check_rows("backward", i, dy.size(), rows, l.out_features, "dy");
    if (!dx.empty()) check_rows("backward", i, dx.size(), rows, l.in_features, "dx");
    const std::size_t in = l.in_features, out = l.out_features, r = options_.r;
    HONE_REQUIRE(tape.rows == rows && tape.h.size() == rows * r &&
                     (tape.keep.empty() || tape.keep.size() == rows * in),
                 "hone::compress::lora_model::backward: layer '" + l.name +
                     "': the tape is not from this layer's forward over " + std::to_string(rows) +
                     " rows; pass the tape that forward filled");
    const bool drop = !tape.keep.empty();
    const float keep_scale = drop ? 1.0f / (1.0f - options_.dropout) : 1.0f;
    const float s = scaling();
    const auto A = lora_A(i);
    const auto B = lora_B(i);
    auto gA = grad_A(i);
    auto gB = grad_B(i);
    std::vector<float> dh(r), u(in);
    for (std::size_t n = 0; n < rows; ++n) {
      const float* dyn = dy.data() + n * out;
      const float* hn = tape.h.data() + n * r;
      // dh = scaling * dy B; grad_B += scaling * dy^T h.
      std::fill(dh.begin(), dh.end(), 0.0f);
      for (std::size_t o = 0; o < out; ++o) {
        const float g = s * dyn[o];
        const float* Bo = B.data() + o * r;
        float* gBo = gB.data() + o * r;
        for (std::size_t k = 0; k < r; ++k) {
          dh[k] += g * Bo[k];
          gBo[k] += g * hn[k];
        }
      }
      // grad_A += dh^T u, u = dropout(x).
      const float* xn = x.data() + n * in;
      for (std::size_t c = 0; c < in; ++c) {
        u[c] = !drop ? xn[c] : tape.keep[n * in + c] != 0 ? xn[c] * keep_scale : 0.0f;
      }
      for (std::size_t k = 0; k < r; ++k) {
        float* gAk = gA.data() + k * in;
        for (std::size_t c = 0; c < in; ++c) gAk[c] += dh[k] * u[c];
      }
      if (dx.empty()) continue;
      // dx = dy W + dropout'(dh A).
      float* dxn = dx.data() + n * in;
      std::fill(dxn, dxn + in, 0.0f);
      for (std::size_t k = 0; k < r; ++k) {
        const float* Ak = A.data() + k * in;
        for (std::size_t c = 0; c < in; ++c) dxn[c] += dh[k] * Ak[c];
      }
      if (drop) {
        for (std::size_t c = 0; c < in; ++c) {
          dxn[c] = tape.keep[n * in + c] != 0 ? dxn[c] * keep_scale : 0.0f;
        }
      }
      for (std::size_t o = 0; o < out; ++o) {
        const float g = dyn[o];
        const float* Wo = l.weight.data() + o * in;
        for (std::size_t c = 0; c < in; ++c) dxn[c] += g * Wo[c];
      }
    }
  }

  // ---- merge ----

  /// W_i += scaling * B_i A_i for every layer (each element: the product summed in double, rounded
  /// to float once, then added in float). The exact bytes of W are kept (out x in floats per
  /// layer) for unmerge. config_error if a layer is already merged.
  void merge() {
    for (std::size_t i = 0; i < layers_.size(); ++i) merge(i);
  }
  void merge(std::size_t i) {
    const linear_ref& l = layer(i);
    HONE_REQUIRE(!merged_[i].active, "hone::compress::lora_model::merge: layer '" + l.name +
                                         "' is already merged; unmerge() it first");
    merged_state& m = merged_[i];
    m.base.assign(l.weight.begin(), l.weight.end());
    const std::size_t in = l.in_features, out = l.out_features, r = options_.r;
    const double s = scaling();
    const auto A = lora_A(i);
    const auto B = lora_B(i);
    for (std::size_t o = 0; o < out; ++o) {
      for (std::size_t c = 0; c < in; ++c) {
        double d = 0.0;
        for (std::size_t k = 0; k < r; ++k) {
          d += static_cast<double>(B[o * r + k]) * static_cast<double>(A[k * in + c]);
        }
        l.weight[o * in + c] += static_cast<float>(s * d);
      }
    }
    m.merged_hash = io::hash64(std::as_bytes(l.weight));
    m.active = true;
  }

  /// Puts back the exact bytes W had before merge(), for every merged layer. config_error when W
  /// was changed while merged (its hash no longer matches what merge wrote): unmerging would
  /// throw that change away; call forget_merge(i) to keep the current W as the new base instead.
  void unmerge() {
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      if (merged_[i].active) unmerge(i);
    }
  }
  void unmerge(std::size_t i) {
    const linear_ref& l = layer(i);
    merged_state& m = merged_[i];
    HONE_REQUIRE(m.active, "hone::compress::lora_model::unmerge: layer '" + l.name +
                               "' is not merged; nothing to undo");
    HONE_REQUIRE(io::hash64(std::as_bytes(l.weight)) == m.merged_hash,
                 "hone::compress::lora_model::unmerge: the weight of layer '" + l.name +
                     "' changed after merge(), so restoring the pre-merge bytes would discard that "
                     "change; undo it, or call forget_merge(" +
                     std::to_string(i) + ") to keep the current weight as the base");
    std::copy(m.base.begin(), m.base.end(), l.weight.begin());
    m = merged_state{};
  }
  /// Drops the kept pre-merge bytes of layer i: W stays as it is and counts as unmerged (the
  /// adapter is then applied on top of it again by forward).
  void forget_merge(std::size_t i) { merged_[checked(i)] = merged_state{}; }
  [[nodiscard]] bool merged(std::size_t i) const { return merged_[checked(i)].active; }
  [[nodiscard]] bool any_merged() const noexcept {
    return std::any_of(merged_.begin(), merged_.end(), [](const auto& m) { return m.active; });
  }

  [[nodiscard]] static float scaling_of(const lora_options& o) noexcept {
    return o.use_rslora ? o.alpha / std::sqrt(static_cast<float>(o.r))
                        : o.alpha / static_cast<float>(o.r);
  }

 private:
  struct merged_state {
    bool active = false;
    std::vector<float> base;
    std::uint64_t merged_hash = 0;
  };

  static void check_options(const lora_options& o) {
    HONE_REQUIRE(o.r > 0, "hone::compress::lora_model: the rank r is 0; it must be at least 1");
    HONE_REQUIRE(std::isfinite(o.alpha),
                 "hone::compress::lora_model: alpha is not finite; give lora_alpha as a number");
    HONE_REQUIRE(o.dropout >= 0.0f && o.dropout < 1.0f,
                 "hone::compress::lora_model: dropout " + std::to_string(o.dropout) +
                     " is outside [0, 1); it is the probability of dropping an input element");
  }
  void require_unmerged(std::string_view what) const {
    HONE_REQUIRE(!any_merged(), "hone::compress::lora_model::" + std::string(what) +
                                    ": some layers are merged; unmerge() first");
  }
  std::size_t checked(std::size_t i) const {
    HONE_REQUIRE(i < layers_.size(), "hone::compress::lora_model: layer index " +
                                         std::to_string(i) + " is out of range (the model has " +
                                         std::to_string(layers_.size()) + " layers)");
    return i;
  }
  void check_rows(std::string_view fn, std::size_t i, std::size_t got, std::size_t rows,
                  std::size_t width, std::string_view what) const {
    HONE_REQUIRE(got == rows * width,
                 "hone::compress::lora_model::" + std::string(fn) + ": layer '" + layers_[i].name +
                     "': " + std::string(what) + " has " + std::to_string(got) + " elements, but " +
                     std::to_string(rows) + " rows of " + std::to_string(width) + " need " +
                     std::to_string(rows * width));
  }
  // Eight independent partial sums (a float reduction in one accumulator cannot be vectorized
  // without reassociation, which the compiler may not do by itself), then the tail.
  static float dot(const float* a, const float* b, std::size_t n) noexcept {
    float part[8] = {};
    std::size_t k = 0;
    for (; k + 8 <= n; k += 8) {
      for (std::size_t j = 0; j < 8; ++j) part[j] += a[k + j] * b[k + j];
    }
    float acc =
        ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
    for (; k < n; ++k) acc += a[k] * b[k];
    return acc;
  }

  std::vector<linear_ref> layers_;
  lora_options options_;
  arena<float> values_;
  arena<float> grads_;
  std::vector<merged_state> merged_;
  rl_rng dropout_rng_{0};
  bool training_ = true;
};

static_assert(model<lora_model>);

}  // namespace compress
HONE_NAMESPACE_END
