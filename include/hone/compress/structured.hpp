// hone/compress/structured.hpp: structured pruning of neurons by norm that physically shrinks the
// user's matrices, through a model hook, so the pruned model is smaller and faster rather than
// zero-filled.
//
// The hook: a model exposes its layers of neurons (hidden units, channels) and shrinks one when
// told which neurons stay:
//
//   struct mlp {
//     std::size_t neuron_layer_count() const;                        // how many such layers
//     hone::compress::neuron_layer_view neuron_layer(std::size_t l) const;
//       // the weights that produce layer l's neurons (rows of `in`, [neurons, in_features]) and
//       // those that read them (columns of `out`, [out_features, neurons]; may be empty)
//     void keep_neurons(std::size_t l, std::span<const std::size_t> kept);
//       // keep only neurons `kept` (ascending) of layer l: drop the other rows of the producing
//       // matrix and bias, the other columns of the reading matrix (keep_rows / keep_cols below)
//   };
//   static_assert(hone::compress::check_neuron_prunable<mlp>());
//   hone::compress::prune_neurons(net, 0.5);   // half the neurons of every layer, smallest norm
//
// Scores: the L2 norm of a neuron's input row, or (neuron_score::in_and_out, the default) of its
// input row and output column together; the neurons of largest score stay (ties: lower index).
// Layers are pruned in order 0, 1, ...; a layer's view is read after the previous layer shrank, so
// a layer whose input matrix reads the previous layer's neurons sees them already removed.
//
// After structured pruning the model's parameters have new sizes: a hone::trainer bound to the old
// model must be rebuilt on the pruned one.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

/// One layer of neurons as the model shows it (row-major fp32 matrices).
struct neuron_layer_view {
  std::span<const float> in;  ///< [neurons, in_features]: row j produces neuron j
  std::size_t neurons = 0;
  std::size_t in_features = 0;
  std::span<const float> out{};  ///< [out_features, neurons]: column j reads neuron j (or empty)
  std::size_t out_features = 0;
};

/// How a neuron is scored.
enum class neuron_score : unsigned char {
  in_only,     ///< L2 norm of its input row
  in_and_out,  ///< L2 norm of its input row and its output column together
};

/// The structured-pruning hook (see the top of this file).
template <class M>
concept neuron_prunable = requires(M& m, const M& cm, std::size_t layer,
                                   std::span<const std::size_t> kept) {
  { cm.neuron_layer_count() } -> std::convertible_to<std::size_t>;
  { cm.neuron_layer(layer) } -> std::convertible_to<neuron_layer_view>;
  m.keep_neurons(layer, kept);
};

/// static_assert(check_neuron_prunable<M>()): says which member of the hook M lacks.
template <class M>
consteval bool check_neuron_prunable() {
  static_assert(
      requires(const M& m) {
        { m.neuron_layer_count() } -> std::convertible_to<std::size_t>;
      },
      "hone::compress: the model has no const member function neuron_layer_count() returning the "
      "number of its layers of neurons (see hone/compress/structured.hpp).");
  static_assert(
      requires(const M& m, std::size_t l) {
        { m.neuron_layer(l) } -> std::convertible_to<hone::compress::neuron_layer_view>;
      },
      "hone::compress: the model has no const member function neuron_layer(std::size_t) returning "
      "a hone::compress::neuron_layer_view (the matrices that produce and read a layer's "
      "neurons).");
  static_assert(
      requires(M & m, std::size_t l, std::span<const std::size_t> kept) {
        m.keep_neurons(l, kept);
      },
      "hone::compress: the model has no member function keep_neurons(std::size_t layer, "
      "std::span<const std::size_t> kept) that shrinks its matrices to the kept neurons.");
  return neuron_prunable<M>;
}

/// The score of every neuron of a layer (double sums). Throws hone::config_error when the view's
/// sizes do not match its spans.
inline std::vector<double> neuron_norms(const neuron_layer_view& v,
                                        neuron_score score = neuron_score::in_and_out) {
  HONE_REQUIRE(v.in.size() == v.neurons * v.in_features,
               "hone::compress::neuron_norms: the input matrix holds " +
                   std::to_string(v.in.size()) + " values, not neurons * in_features = " +
                   std::to_string(v.neurons) + " * " + std::to_string(v.in_features) + ".");
  HONE_REQUIRE(v.out.size() == v.out_features * v.neurons,
               "hone::compress::neuron_norms: the output matrix holds " +
                   std::to_string(v.out.size()) + " values, not out_features * neurons = " +
                   std::to_string(v.out_features) + " * " + std::to_string(v.neurons) + ".");
  std::vector<double> sq(v.neurons, 0.0);
  for (std::size_t j = 0; j < v.neurons; ++j) {
    for (std::size_t c = 0; c < v.in_features; ++c) {
      const double x = v.in[j * v.in_features + c];
      sq[j] += x * x;
    }
  }
  if (score == neuron_score::in_and_out) {
    for (std::size_t o = 0; o < v.out_features; ++o) {
      for (std::size_t j = 0; j < v.neurons; ++j) {
        const double x = v.out[o * v.neurons + j];
        sq[j] += x * x;
      }
    }
  }
  for (double& s : sq) s = std::sqrt(s);
  return sq;
}

/// The `keep` neurons of largest score (ties: lower index first), in ascending index order.
inline std::vector<std::size_t> select_neurons(std::span<const double> scores, std::size_t keep) {
  HONE_REQUIRE(keep <= scores.size(), "hone::compress::select_neurons: cannot keep " +
                                          std::to_string(keep) + " of " +
                                          std::to_string(scores.size()) + " neurons.");
  std::vector<std::size_t> order(scores.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return scores[a] > scores[b]; });
  order.resize(keep);
  std::sort(order.begin(), order.end());
  return order;
}

/// Rows `kept` of a row-major [rows, cols] matrix (a producing matrix or a bias with cols = 1).
inline std::vector<float> keep_rows(std::span<const float> m, std::size_t rows, std::size_t cols,
                                    std::span<const std::size_t> kept) {
  HONE_REQUIRE(m.size() == rows * cols,
               "hone::compress::keep_rows: the matrix holds " + std::to_string(m.size()) +
                   " values, not " + std::to_string(rows) + " * " + std::to_string(cols) + ".");
  std::vector<float> out;
  out.reserve(kept.size() * cols);
  for (const std::size_t r : kept) {
    HONE_REQUIRE(r < rows, "hone::compress::keep_rows: row " + std::to_string(r) +
                               " is outside the matrix's " + std::to_string(rows) + " rows.");
    out.insert(out.end(), m.begin() + static_cast<std::ptrdiff_t>(r * cols),
               m.begin() + static_cast<std::ptrdiff_t>((r + 1) * cols));
  }
  return out;
}

/// Columns `kept` of a row-major [rows, cols] matrix (a reading matrix).
inline std::vector<float> keep_cols(std::span<const float> m, std::size_t rows, std::size_t cols,
                                    std::span<const std::size_t> kept) {
  HONE_REQUIRE(m.size() == rows * cols,
               "hone::compress::keep_cols: the matrix holds " + std::to_string(m.size()) +
                   " values, not " + std::to_string(rows) + " * " + std::to_string(cols) + ".");
  for (const std::size_t c : kept) {
    HONE_REQUIRE(c < cols, "hone::compress::keep_cols: column " + std::to_string(c) +
                               " is outside the matrix's " + std::to_string(cols) + " columns.");
  }
  std::vector<float> out;
  out.reserve(rows * kept.size());
  for (std::size_t r = 0; r < rows; ++r) {
    for (const std::size_t c : kept) out.push_back(m[r * cols + c]);
  }
  return out;
}

/// Removes floor(fraction * neurons) neurons of smallest score from every layer of the model
/// (at least one neuron stays), through its keep_neurons hook. Returns the kept neurons of each
/// layer (indices into the layer before it shrank). Throws hone::config_error for a fraction
/// outside [0, 1) and for a layer whose view's sizes do not match (naming the layer).
template <class M>
std::vector<std::vector<std::size_t>> prune_neurons(M& model, double fraction,
                                                    neuron_score score = neuron_score::in_and_out) {
  static_assert(check_neuron_prunable<M>());
  HONE_REQUIRE(fraction >= 0.0 && fraction < 1.0,
               "hone::compress::prune_neurons: the fraction is " + std::to_string(fraction) +
                   "; it must lie in [0, 1) (the share of each layer's neurons to remove).");
  const std::size_t layers = model.neuron_layer_count();
  std::vector<std::vector<std::size_t>> kept_all;
  kept_all.reserve(layers);
  for (std::size_t l = 0; l < layers; ++l) {
    const neuron_layer_view v = model.neuron_layer(l);
    std::vector<double> scores;
    try {
      scores = neuron_norms(v, score);
    } catch (const config_error& e) {
      throw config_error("hone::compress::prune_neurons: layer " + std::to_string(l) + ": " +
                         e.what());
    }
    const auto drop =
        static_cast<std::size_t>(std::floor(fraction * static_cast<double>(v.neurons)));
    const std::size_t keep =
        v.neurons - drop > 0 ? v.neurons - drop : std::min<std::size_t>(1, v.neurons);
    std::vector<std::size_t> kept = select_neurons(scores, keep);
    model.keep_neurons(l, std::span<const std::size_t>(kept));
    kept_all.push_back(std::move(kept));
  }
  return kept_all;
}

}  // namespace compress
HONE_NAMESPACE_END
