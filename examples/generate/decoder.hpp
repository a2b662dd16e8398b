// decoder.hpp: the user's model, a small decoder-only transformer written in plain C++.
//
// Character-level (tokens are ASCII codes, vocabulary 128), learned token and position embeddings,
// pre-LayerNorm blocks of causal multi-head attention and a GELU MLP, a final LayerNorm and an
// output projection. The weights are either random (a fixed seed: the text is gibberish, but the
// arithmetic is that of a real decoder, so the cost of recomputing a prefix against reading its K
// and V from a cache is the real one), or trained ones loaded from a safetensors file or a hone
// checkpoint directory (decoder::load; train_tiny.py trains this very model in PyTorch and writes
// such a file).
//
// One function computes one position: decoder::position(). It reads the K and V rows of the
// earlier positions through a table of pointers (past_rows), so the same compiled code serves the
// three ways of generating in main.cpp: recomputing every position from contiguous buffers, or
// reading the earlier positions from the blocks of hone::serve::kv_cache (with or without prefix
// sharing). The same code on the same inputs gives the same bits, which is what lets main.cpp
// demand identical tokens from every mode.
//
// The tensors of a weights file (every matrix stored [in][out], applied as y = x W):
//   tok_emb [vocab, d_model]        pos_emb [max_len, d_model]
//   layers.<i>.ln1.weight, .ln1.bias [d_model]     layers.<i>.wq, .wk, .wv, .wo [d_model, d_model]
//   layers.<i>.ln2.weight, .ln2.bias [d_model]     layers.<i>.w1 [d_model, d_ff]  .b1 [d_ff]
//   layers.<i>.w2 [d_ff, d_model]  .b2 [d_model]   (i = 0 .. layers-1)
//   ln_f.weight, ln_f.bias [d_model]               unembed [d_model, vocab]
// The shapes give vocab, d_model, max_len, d_ff and the layer count; the head count comes from the
// file's metadata entry "heads" or from the caller.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <hone/checkpoint/tensor_file.hpp>
#include <hone/checkpoint/verify.hpp>
#include <map>
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

/// A weights file that does not hold this decoder (decoder::load).
class weights_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class decoder {
 public:
  /// Random weights from `seed` (normal, scaled by fan-in; LayerNorms at identity).
  decoder(decoder_config c, std::uint64_t seed) : decoder(c) {
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

  /// Loads trained weights from `path`: a safetensors file (or hone's compressed .hct), or a hone
  /// checkpoint directory (its MANIFEST is verified, then its model.safetensors or model.hct is
  /// read). The configuration comes from the shapes (see the top of this file); `heads` is the head
  /// count, 0 to take it from the metadata entry "heads" (both given: they must agree). Floating
  /// tensors of any width (F32, BF16, F16, F64) are converted to float. Throws weights_error naming
  /// the file and the missing tensor, the wrong shape (expected and found) or the wrong dtype.
  static decoder load(const std::filesystem::path& path, std::size_t heads = 0) {
    namespace ck = hone::checkpoint;
    std::filesystem::path file = path;
    if (std::filesystem::is_directory(path)) {
      ck::verify_directory(path).require_ok(path.string());
      file = path / ck::files::weights;
      if (!std::filesystem::exists(file)) file = path / ck::files::weights_compressed;
      if (!std::filesystem::exists(file)) {
        throw weights_error("decoder: checkpoint directory '" + path.string() + "' has neither " +
                            std::string(ck::files::weights) + " nor " +
                            std::string(ck::files::weights_compressed));
      }
    } else if (!std::filesystem::exists(path)) {
      throw weights_error("decoder: weights file '" + path.string() + "' does not exist");
    }
    const ck::tensor_file f = ck::tensor_file::open(file);
    const std::string where = "decoder: '" + file.string() + "': ";
    const auto fail = [&](const std::string& why) -> weights_error {
      return weights_error(where + why);
    };

    // The configuration, from the shapes of a few tensors.
    const auto need = [&](const std::string& name) -> const ck::tensor_info& {
      const ck::tensor_info* t = f.find(name);
      if (t == nullptr) throw fail("tensor '" + name + "' is missing");
      return *t;
    };
    const auto dim = [&](const std::string& name, std::size_t rank, std::size_t i) {
      const ck::tensor_info& t = need(name);
      if (t.shape.size() != rank) {
        throw fail("tensor '" + name + "' has shape " + ck::shape_string(t.shape) +
                   ", expected a tensor of rank " + std::to_string(rank));
      }
      return static_cast<std::size_t>(t.shape[i]);
    };
    decoder_config c;
    c.vocab = dim("tok_emb", 2, 0);
    c.d_model = dim("tok_emb", 2, 1);
    c.max_len = dim("pos_emb", 2, 0);
    c.d_ff = dim("layers.0.w1", 2, 1);
    c.layers = 0;
    while (f.find("layers." + std::to_string(c.layers) + ".wq") != nullptr) ++c.layers;
    if (c.vocab == 0 || c.d_model == 0 || c.max_len == 0 || c.d_ff == 0) {
      throw fail("a dimension is 0 (vocab " + std::to_string(c.vocab) + ", d_model " +
                 std::to_string(c.d_model) + ", max_len " + std::to_string(c.max_len) + ", d_ff " +
                 std::to_string(c.d_ff) + "): the model would compute nothing");
    }
    const auto meta = f.metadata().find("heads");
    std::size_t meta_heads = 0;
    if (meta != f.metadata().end()) {
      const std::string& v = meta->second;
      if (v.empty() || v.size() > 6 || v.find_first_not_of("0123456789") != std::string::npos ||
          std::stoul(v) == 0) {
        throw fail("metadata \"heads\" is '" + v + "', expected a positive integer");
      }
      meta_heads = std::stoul(v);
    }
    if (heads != 0 && meta_heads != 0 && heads != meta_heads) {
      throw fail("the file's metadata says " + std::to_string(meta_heads) + " heads, the caller " +
                 std::to_string(heads) + ": drop one or make them agree");
    }
    c.heads = heads != 0 ? heads : meta_heads;
    if (c.heads == 0) {
      throw fail(
          "the head count is not in the file (no metadata entry \"heads\"): give it (--heads)");
    }
    if (c.d_model % c.heads != 0) {
      throw fail("d_model " + std::to_string(c.d_model) + " is not a multiple of " +
                 std::to_string(c.heads) + " heads");
    }

    // Every tensor: present, of the shape the configuration gives, floating point; no other.
    decoder net(c);
    std::map<std::string, bool, std::less<>> used;
    for (const ck::tensor_info& t : f.tensors()) used[t.name] = false;
    const auto read = [&](const std::string& name, std::vector<std::uint64_t> shape,
                          std::vector<float>& out) {
      const ck::tensor_info& t = need(name);
      if (t.shape != shape) {
        throw fail("tensor '" + name + "' has shape " + ck::shape_string(t.shape) + ", expected " +
                   ck::shape_string(shape) + " (vocab " + std::to_string(c.vocab) + ", d_model " +
                   std::to_string(c.d_model) + ", d_ff " + std::to_string(c.d_ff) + ", max_len " +
                   std::to_string(c.max_len) + ")");
      }
      if (!hone::io::is_convertible_float(t.type)) {
        throw fail("tensor '" + name + "' is " + std::string(hone::io::dtype_name(t.type)) +
                   ", expected a floating-point dtype (F32, BF16, F16 or F64)");
      }
      out = f.read_as<float>(name);
      used[name] = true;
    };
    const std::uint64_t v = c.vocab, d = c.d_model, ff = c.d_ff, ml = c.max_len;
    read("tok_emb", {v, d}, net.tok_emb_);
    read("pos_emb", {ml, d}, net.pos_emb_);
    for (std::size_t li = 0; li < c.layers; ++li) {
      layer& l = net.layers_[li];
      const std::string p = "layers." + std::to_string(li) + ".";
      read(p + "ln1.weight", {d}, l.ln1_g);
      read(p + "ln1.bias", {d}, l.ln1_b);
      read(p + "wq", {d, d}, l.wq);
      read(p + "wk", {d, d}, l.wk);
      read(p + "wv", {d, d}, l.wv);
      read(p + "wo", {d, d}, l.wo);
      read(p + "ln2.weight", {d}, l.ln2_g);
      read(p + "ln2.bias", {d}, l.ln2_b);
      read(p + "w1", {d, ff}, l.w1);
      read(p + "b1", {ff}, l.b1);
      read(p + "w2", {ff, d}, l.w2);
      read(p + "b2", {d}, l.b2);
    }
    read("ln_f.weight", {d}, net.lnf_g_);
    read("ln_f.bias", {d}, net.lnf_b_);
    read("unembed", {d, v}, net.unembed_);
    for (const auto& [name, was_used] : used) {
      if (!was_used) {
        throw fail("tensor '" + name + "' is not one of the decoder's (" +
                   std::to_string(c.layers) +
                   " layers found: layers.0 .. layers.N-1 must be numbered without gaps)");
      }
    }
    return net;
  }

  [[nodiscard]] const decoder_config& config() const noexcept { return c_; }

  /// Per-thread scratch of position().
  struct scratch {
    std::vector<float> x, h, q, att, ff, scores;
    std::vector<float> logits;  // after position(): the vocab logits of the position computed
  };

  /// Computes position `pos` (token `token`) through every layer. `past` holds the rows of
  /// positions 0..pos-1; this position's K and V are written to k_out and v_out (kv_floats() each,
  /// [layer][head][dim], the layout of one token in the KV cache) and entered in `past` at pos.
  /// Returns the index of the largest logit (greedy decoding; the first on ties); the logits are
  /// left in s.logits.
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
    s.logits.resize(c_.vocab);
    matvec(s.h.data(), unembed_.data(), d, c_.vocab, s.logits.data());
    for (std::size_t t = 0; t < c_.vocab; ++t) {
      if (s.logits[t] > best_logit) {
        best_logit = s.logits[t];
        best = static_cast<std::int32_t>(t);
      }
    }
    return best;
  }

 private:
  struct layer {
    std::vector<float> ln1_g, ln1_b, wq, wk, wv, wo, ln2_g, ln2_b, w1, b1, w2, b2;
  };

  explicit decoder(decoder_config c) : c_(c) {
    if (c_.heads == 0 || c_.d_model % c_.heads != 0) {
      throw std::invalid_argument("decoder: d_model " + std::to_string(c_.d_model) +
                                  " is not a multiple of heads " + std::to_string(c_.heads));
    }
    layers_.resize(c_.layers);
  }

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
