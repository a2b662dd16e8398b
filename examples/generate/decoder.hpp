// decoder.hpp: the user's model, a small decoder-only transformer written in plain C++.
//
// Character-level (tokens are ASCII codes, vocabulary 128), learned token and position embeddings,
// pre-LayerNorm blocks of causal multi-head attention and a GELU MLP, a final LayerNorm and an
// output projection. Weights are random (a fixed seed): the text it writes is gibberish, but the
// arithmetic is that of a real decoder, so the cost of recomputing a prefix against reading its K
// and V from a cache is the real one.
//
// One function computes one position: decoder::position(). It reads the K and V rows of the
// earlier positions through a table of pointers (past_rows), so the same compiled code serves the
// three ways of generating in main.cpp: recomputing every position from contiguous buffers, or
// reading the earlier positions from the blocks of hone::serve::kv_cache (with or without prefix
// sharing). The same code on the same inputs gives the same bits, which is what lets main.cpp
// demand identical tokens from every mode.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace generate_example {

struct decoder_config {
  std::size_t vocab = 128;  // ASCII
  std::size_t d_model = 64;
  std::size_t heads = 4;
  std::size_t layers = 2;
  std::size_t d_ff = 256;
  std::size_t max_len = 1024;  // positions with an embedding

  [[nodiscard]] std::size_t head_dim() const { return d_model / heads; }
  /// K (or V) floats of one position over every layer: layers * heads * head_dim.
  [[nodiscard]] std::size_t kv_floats() const { return layers * d_model; }
};

/// The K and V rows of positions 0..n-1 for every (layer, head): row(lh, p) is
/// k[lh * stride + p] (head_dim floats). The caller fills the pointers; decoder::position() adds
/// the row of the position it computes (at p = n) before reading, so the table needs room for it.
struct past_rows {
  std::vector<const float*> k, v;
  std::size_t stride = 0;  // positions of room per (layer, head)

  void reset(std::size_t layer_heads, std::size_t positions) {
    stride = positions;
    k.assign(layer_heads * positions, nullptr);
    v.assign(layer_heads * positions, nullptr);
  }
};

class decoder {
 public:
  decoder(decoder_config c, std::uint64_t seed) : c_(c) {
    if (c_.d_model % c_.heads != 0) {
      throw std::invalid_argument("decoder: d_model " + std::to_string(c_.d_model) +
                                  " is not a multiple of heads " + std::to_string(c_.heads));
    }
    std::mt19937_64 rng(seed);
    const auto fill = [&](std::vector<float>& w, std::size_t n, float scale) {
      std::normal_distribution<float> nd(0.0f, scale);
      w.resize(n);
      for (float& x : w) x = nd(rng);
    };
    const std::size_t d = c_.d_model;
    fill(tok_emb_, c_.vocab * d, 1.0f);
    fill(pos_emb_, c_.max_len * d, 0.5f);
    const float wscale = 1.0f / std::sqrt(static_cast<float>(d));
    layers_.resize(c_.layers);
    for (layer& l : layers_) {
      l.ln1_g.assign(d, 1.0f);
      l.ln1_b.assign(d, 0.0f);
      l.ln2_g.assign(d, 1.0f);
      l.ln2_b.assign(d, 0.0f);
      fill(l.wq, d * d, wscale);
      fill(l.wk, d * d, wscale);
      fill(l.wv, d * d, wscale);
      fill(l.wo, d * d, wscale);
      fill(l.w1, d * c_.d_ff, wscale);
      fill(l.b1, c_.d_ff, 0.1f);
      fill(l.w2, c_.d_ff * d, 1.0f / std::sqrt(static_cast<float>(c_.d_ff)));
      fill(l.b2, d, 0.1f);
    }
    lnf_g_.assign(d, 1.0f);
    lnf_b_.assign(d, 0.0f);
    fill(unembed_, d * c_.vocab, 2.0f * wscale);
  }

  [[nodiscard]] const decoder_config& config() const noexcept { return c_; }

  /// Per-thread scratch of position().
  struct scratch {
    std::vector<float> x, h, q, att, ff, scores;
  };

  /// Computes position `pos` (token `token`) through every layer. `past` holds the rows of
  /// positions 0..pos-1; this position's K and V are written to k_out and v_out (kv_floats() each,
  /// [layer][head][dim], the layout of one token in the KV cache) and entered in `past` at pos.
  /// Returns the index of the largest logit (greedy decoding; the first on ties).
  std::int32_t position(std::int32_t token, std::size_t pos, past_rows& past, float* k_out,
                        float* v_out, scratch& s) const {
    const std::size_t d = c_.d_model, hd = c_.head_dim(), nh = c_.heads;
    if (token < 0 || static_cast<std::size_t>(token) >= c_.vocab) {
      throw std::out_of_range("decoder: token " + std::to_string(token) + " is outside [0, " +
                              std::to_string(c_.vocab) + ")");
    }
    if (pos >= c_.max_len || pos >= past.stride) {
      throw std::out_of_range("decoder: position " + std::to_string(pos) +
                              " is beyond the model's " + std::to_string(c_.max_len) +
                              " positions or the table's " + std::to_string(past.stride));
    }
    s.x.resize(d);
    s.h.resize(d);
    s.q.resize(d);
    s.att.resize(d);
    s.ff.resize(c_.d_ff);
    s.scores.resize(pos + 1);
    const float* te = tok_emb_.data() + static_cast<std::size_t>(token) * d;
    const float* pe = pos_emb_.data() + pos * d;
    for (std::size_t i = 0; i < d; ++i) s.x[i] = te[i] + pe[i];
    const float inv_sqrt_hd = 1.0f / std::sqrt(static_cast<float>(hd));

    for (std::size_t li = 0; li < c_.layers; ++li) {
      const layer& l = layers_[li];
      layer_norm(s.x.data(), l.ln1_g.data(), l.ln1_b.data(), s.h.data());
      float* k = k_out + li * d;
      float* v = v_out + li * d;
      matvec(s.h.data(), l.wq.data(), d, d, s.q.data());
      matvec(s.h.data(), l.wk.data(), d, d, k);
      matvec(s.h.data(), l.wv.data(), d, d, v);
      for (std::size_t h = 0; h < nh; ++h) {
        const std::size_t lh = li * nh + h;
        past.k[lh * past.stride + pos] = k + h * hd;
        past.v[lh * past.stride + pos] = v + h * hd;
        const float* const* krow = past.k.data() + lh * past.stride;
        const float* const* vrow = past.v.data() + lh * past.stride;
        const float* q = s.q.data() + h * hd;
        float mx = -INFINITY;
        for (std::size_t p = 0; p <= pos; ++p) {  // causal: this position and the earlier ones
          float dot = 0.0f;
          for (std::size_t j = 0; j < hd; ++j) dot += q[j] * krow[p][j];
          s.scores[p] = dot * inv_sqrt_hd;
          mx = std::max(mx, s.scores[p]);
        }
        float sum = 0.0f;
        for (std::size_t p = 0; p <= pos; ++p) {
          s.scores[p] = std::exp(s.scores[p] - mx);
          sum += s.scores[p];
        }
        float* out = s.att.data() + h * hd;
        std::fill(out, out + hd, 0.0f);
        for (std::size_t p = 0; p <= pos; ++p) {
          const float w = s.scores[p] / sum;
          for (std::size_t j = 0; j < hd; ++j) out[j] += w * vrow[p][j];
        }
      }
      matvec_add(s.att.data(), l.wo.data(), d, d, s.x.data());  // residual
      layer_norm(s.x.data(), l.ln2_g.data(), l.ln2_b.data(), s.h.data());
      matvec(s.h.data(), l.w1.data(), d, c_.d_ff, s.ff.data());
      for (std::size_t i = 0; i < c_.d_ff; ++i) s.ff[i] = gelu(s.ff[i] + l.b1[i]);
      for (std::size_t i = 0; i < d; ++i) s.x[i] += l.b2[i];
      matvec_add(s.ff.data(), l.w2.data(), c_.d_ff, d, s.x.data());  // residual
    }
    layer_norm(s.x.data(), lnf_g_.data(), lnf_b_.data(), s.h.data());
    // Greedy: the argmax of the logits h * unembed, one column at a time.
    std::int32_t best = 0;
    float best_logit = -INFINITY;
    s.ff.assign(c_.vocab, 0.0f);
    matvec(s.h.data(), unembed_.data(), d, c_.vocab, s.ff.data());
    for (std::size_t t = 0; t < c_.vocab; ++t) {
      if (s.ff[t] > best_logit) {
        best_logit = s.ff[t];
        best = static_cast<std::int32_t>(t);
      }
    }
    return best;
  }

 private:
  struct layer {
    std::vector<float> ln1_g, ln1_b, wq, wk, wv, wo, ln2_g, ln2_b, w1, b1, w2, b2;
  };

  /// y = x W with W stored [in][out] (the inner loop runs over outputs and vectorizes).
  static void matvec(const float* x, const float* w, std::size_t in, std::size_t out, float* y) {
    std::fill(y, y + out, 0.0f);
    matvec_add(x, w, in, out, y);
  }
  static void matvec_add(const float* x, const float* w, std::size_t in, std::size_t out,
                         float* y) {
    for (std::size_t i = 0; i < in; ++i) {
      const float xi = x[i];
      const float* wi = w + i * out;
      for (std::size_t o = 0; o < out; ++o) y[o] += xi * wi[o];
    }
  }
  void layer_norm(const float* x, const float* g, const float* b, float* y) const {
    const std::size_t d = c_.d_model;
    float mean = 0.0f;
    for (std::size_t i = 0; i < d; ++i) mean += x[i];
    mean /= static_cast<float>(d);
    float var = 0.0f;
    for (std::size_t i = 0; i < d; ++i) var += (x[i] - mean) * (x[i] - mean);
    var /= static_cast<float>(d);
    const float inv = 1.0f / std::sqrt(var + 1e-5f);
    for (std::size_t i = 0; i < d; ++i) y[i] = (x[i] - mean) * inv * g[i] + b[i];
  }
  static float gelu(float x) {
    return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
  }

  decoder_config c_;
  std::vector<float> tok_emb_, pos_emb_, lnf_g_, lnf_b_, unembed_;
  std::vector<layer> layers_;
};

}  // namespace generate_example
