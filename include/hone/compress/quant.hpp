// hone/compress/quant.hpp: symmetric int8 weight quantization (per output row or per tensor, fp32
// scales), ggml's Q8_0 block format, and observers that pick a quantization range for activations
// (min-max, moving-average min-max, percentile, MSE-optimal). docs/quant.md.
//
// Conventions (the tests hold the code to them exactly):
//  - symmetric int8: scale = max|w| / 127 over the group (a row or the whole tensor);
//    q = clamp(round_half_even(w / scale), -127, 127); a group of zeros gets scale 0 and q = 0.
//    Dequantized values q * scale are within scale / 2 of w.
//  - Q8_0 (ggml): blocks of 32 values along a row, each {fp16 d, int8 qs[32]} (34 bytes, d first,
//    little-endian); d = amax / 127 in fp32, stored as fp16 rounded to nearest even; the values use
//    the fp32 d: q = round_half_away_from_zero(x * (1 / d)) (ggml's quantize_row_q8_0_ref).
//  - Non-finite inputs are refused with a sentence naming the index: a NaN or infinity has no int8
//    code and would poison the scale of its whole group.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/detail/no_contract.hpp"
#include "hone/core/error.hpp"
#include "hone/core/half.hpp"

HONE_NAMESPACE_BEGIN
namespace compress {

/// Which values share one scale.
enum class quant_granularity {
  per_tensor,   // one scale for the whole matrix
  per_channel,  // one scale per output row
};

/// A [rows, cols] row-major matrix of symmetric int8 codes with fp32 scales (1 or `rows` of them).
struct quantized_weights {
  std::size_t rows = 0, cols = 0;
  quant_granularity granularity = quant_granularity::per_channel;
  std::vector<std::int8_t> values;  // rows * cols codes in [-127, 127]
  std::vector<float> scales;        // per_tensor: 1; per_channel: rows

  /// The scale of row r.
  [[nodiscard]] float scale(std::size_t r) const noexcept {
    return granularity == quant_granularity::per_tensor ? scales[0] : scales[r];
  }
};

namespace detail {

inline std::string quant_index(std::size_t i, std::size_t cols) {
  if (cols == 0) return std::to_string(i);
  return std::to_string(i) + " (row " + std::to_string(i / cols) + ", column " +
         std::to_string(i % cols) + ")";
}

/// Throws naming the first non-finite value of `w`.
inline void require_finite(std::span<const float> w, std::size_t cols, const char* who) {
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (!std::isfinite(w[i])) [[unlikely]] {
      ::hone::detail::config_failure(
          std::string(who) + ": the value at index " + quant_index(i, cols) + " is " +
          (std::isnan(w[i]) ? "NaN" : "infinite") +
          "; int8 quantization needs finite values (check the weights or the "
          "activations before quantizing).");
    }
  }
}

/// max |v| over v (v finite).
inline float abs_max(std::span<const float> v) noexcept {
  float m = 0.0f;
  for (const float x : v) m = std::max(m, std::fabs(x));
  return m;
}

/// clamp(round_half_even(x / scale), -127, 127); 0 when scale is 0. Uses the current rounding mode,
/// which is round to nearest even unless the program changed it.
inline std::int8_t quantize_symmetric(float x, float scale) noexcept {
  if (scale == 0.0f) return 0;
  const float q = std::nearbyint(x / scale);
  return static_cast<std::int8_t>(std::clamp(q, -127.0f, 127.0f));
}

}  // namespace detail

/// Quantizes the [rows, cols] row-major fp32 matrix `w` to symmetric int8 (see the header comment).
/// Empty shapes are allowed (no codes; per_channel then holds `rows` zero scales, per_tensor one).
[[nodiscard]] inline quantized_weights quantize_weights(
    std::span<const float> w, std::size_t rows, std::size_t cols,
    quant_granularity granularity = quant_granularity::per_channel) {
  constexpr const char* who = "hone::compress::quantize_weights";
  HONE_REQUIRE(rows == 0 || cols <= std::numeric_limits<std::size_t>::max() / rows,
               std::string(who) + ": rows * cols overflows.");
  HONE_REQUIRE(w.size() == rows * cols, std::string(who) + ": the weights hold " +
                                            std::to_string(w.size()) + " values, but the shape [" +
                                            std::to_string(rows) + ", " + std::to_string(cols) +
                                            "] needs " + std::to_string(rows * cols) + ".");
  detail::require_finite(w, cols, who);
  quantized_weights q;
  q.rows = rows;
  q.cols = cols;
  q.granularity = granularity;
  q.values.resize(w.size());
  if (granularity == quant_granularity::per_tensor) {
    q.scales.assign(1, detail::abs_max(w) / 127.0f);
  } else {
    q.scales.resize(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      q.scales[r] = detail::abs_max(w.subspan(r * cols, cols)) / 127.0f;
    }
  }
  for (std::size_t r = 0; r < rows; ++r) {
    const float s = q.scale(r);
    for (std::size_t c = 0; c < cols; ++c) {
      q.values[r * cols + c] = detail::quantize_symmetric(w[r * cols + c], s);
    }
  }
  return q;
}

/// out[r, c] = values[r, c] * scale(r); out must hold rows * cols values.
inline void dequantize(const quantized_weights& q, std::span<float> out) {
  HONE_REQUIRE(out.size() == q.rows * q.cols,
               "hone::compress::dequantize: the output holds " + std::to_string(out.size()) +
                   " values, but the quantized matrix is [" + std::to_string(q.rows) + ", " +
                   std::to_string(q.cols) + "].");
  for (std::size_t r = 0; r < q.rows; ++r) {
    const float s = q.scale(r);
    for (std::size_t c = 0; c < q.cols; ++c) {
      out[r * q.cols + c] = static_cast<float>(q.values[r * q.cols + c]) * s;
    }
  }
}

// ---- ggml Q8_0 -------------------------------------------------------------------------------

inline constexpr std::size_t q8_0_block_size = 32;

/// One Q8_0 block, laid out as ggml's block_q8_0: the fp16 scale bits, then 32 codes.
struct block_q8_0 {
  std::uint16_t d;                  // fp16 bits of the scale
  std::int8_t qs[q8_0_block_size];  // codes
};
static_assert(sizeof(block_q8_0) == 34 && alignof(block_q8_0) == 2,
              "block_q8_0 must have ggml's 34-byte layout.");

/// Quantizes x (a multiple of 32 values, e.g. a row) into Q8_0 blocks, as ggml's reference does.
/// Refuses non-finite values and blocks whose scale overflows fp16 (max|x| above 65504 * 127).
[[nodiscard]] inline std::vector<block_q8_0> quantize_q8_0(std::span<const float> x) {
  constexpr const char* who = "hone::compress::quantize_q8_0";
  HONE_REQUIRE(x.size() % q8_0_block_size == 0,
               std::string(who) + ": " + std::to_string(x.size()) +
                   " values are not a whole number of 32-value blocks; pad the row to a multiple "
                   "of 32.");
  detail::require_finite(x, 0, who);
  std::vector<block_q8_0> out(x.size() / q8_0_block_size);
  for (std::size_t b = 0; b < out.size(); ++b) {
    const auto v = x.subspan(b * q8_0_block_size, q8_0_block_size);
    const float d = detail::abs_max(v) / 127.0f;
    const half hd(d);
    HONE_REQUIRE(std::isfinite(static_cast<float>(hd)),
                 std::string(who) + ": block " + std::to_string(b) +
                     " has max |x| = " + std::to_string(detail::abs_max(v)) +
                     ", whose scale does not fit in fp16 (max|x| must be at most 65504 * 127).");
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = hd.bits();
    for (std::size_t j = 0; j < q8_0_block_size; ++j) {
      out[b].qs[j] = static_cast<std::int8_t>(std::round(v[j] * id));
    }
  }
  return out;
}

/// out[32 b + j] = fp16(d_b) * qs_b[j] (ggml's dequantize_row_q8_0); out holds 32 values per block.
inline void dequantize_q8_0(std::span<const block_q8_0> blocks, std::span<float> out) {
  HONE_REQUIRE(out.size() == blocks.size() * q8_0_block_size,
               "hone::compress::dequantize_q8_0: the output holds " + std::to_string(out.size()) +
                   " values, but " + std::to_string(blocks.size()) + " blocks hold " +
                   std::to_string(blocks.size() * q8_0_block_size) + ".");
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    const float d = static_cast<float>(half::from_bits(blocks[b].d));
    for (std::size_t j = 0; j < q8_0_block_size; ++j) {
      out[b * q8_0_block_size + j] = static_cast<float>(blocks[b].qs[j]) * d;
    }
  }
}

/// The blocks as the bytes of a ggml tensor of type Q8_0 (little-endian hosts).
[[nodiscard]] inline std::span<const std::byte> q8_0_bytes(
    std::span<const block_q8_0> blocks) noexcept {
  static_assert(std::endian::native == std::endian::little,
                "the Q8_0 byte view assumes a little-endian host, as ggml files are.");
  return std::as_bytes(blocks);
}

// ---- observers -------------------------------------------------------------------------------

/// A range [lo, hi] of real values (lo <= 0 <= hi once widened to include zero).
struct quant_range {
  float lo = 0.0f, hi = 0.0f;
};

namespace detail {
/// A restored observer state: seen needs a finite range with lo <= hi.
inline void check_observer_state(bool seen, quant_range r, const char* who) {
  HONE_REQUIRE(!seen || (std::isfinite(r.lo) && std::isfinite(r.hi) && r.lo <= r.hi),
               std::string(who) + ": the range [" + std::to_string(r.lo) + ", " +
                   std::to_string(r.hi) +
                   "] of an observer that has seen values must be finite with lo <= hi; restore "
                   "the state an observer saved (seen() and range()).");
}
}  // namespace detail

/// Symmetric int8 scale for a range: max(|lo|, |hi|) / 127.
[[nodiscard]] inline float symmetric_scale(quant_range r) noexcept {
  return std::max(std::fabs(r.lo), std::fabs(r.hi)) / 127.0f;
}

/// Asymmetric uint8 parameters: the range widened to include 0, scale = (hi - lo) / 255,
/// zero_point = clamp(round_half_even(-lo / scale), 0, 255); scale 1 and zero point 0 for {0, 0}.
struct affine_params {
  float scale = 1.0f;
  std::int32_t zero_point = 0;
};
[[nodiscard]] inline affine_params affine_uint8(quant_range r) noexcept {
  const float lo = std::min(r.lo, 0.0f), hi = std::max(r.hi, 0.0f);
  if (hi == lo) return {};
  const float s = (hi - lo) / 255.0f;
  const float zp = std::clamp(std::nearbyint(-lo / s), 0.0f, 255.0f);
  return {s, static_cast<std::int32_t>(zp)};
}

/// The running minimum and maximum of everything observed.
class minmax_observer {
 public:
  void observe(std::span<const float> x) {
    detail::require_finite(x, 0, "hone::compress::minmax_observer::observe");
    for (const float v : x) {
      lo_ = std::min(lo_, v);
      hi_ = std::max(hi_, v);
      seen_ = true;
    }
  }
  /// The range seen so far ({0, 0} before any value).
  [[nodiscard]] quant_range range() const noexcept {
    return seen_ ? quant_range{lo_, hi_} : quant_range{};
  }
  /// Whether a value has been observed (the observer's state is seen() and range()).
  [[nodiscard]] bool seen() const noexcept { return seen_; }
  /// Sets the state that seen() and range() read (a checkpoint's): not seen starts afresh (r is
  /// ignored); seen needs a finite r with lo <= hi (config_error otherwise). Later batches then
  /// continue bit for bit as in the observer the state was read from.
  void restore(bool seen, quant_range r) {
    detail::check_observer_state(seen, r, "hone::compress::minmax_observer::restore");
    *this = minmax_observer{};
    if (seen) {
      lo_ = r.lo;
      hi_ = r.hi;
      seen_ = true;
    }
  }

 private:
  float lo_ = std::numeric_limits<float>::max(), hi_ = std::numeric_limits<float>::lowest();
  bool seen_ = false;
};

namespace detail {
/// torch's moving-average update of an observer's bound, old + c * (batch - old), with torch's
/// float operations in torch's order; the product never fuses into the add (an FMA, which
/// -ffp-contract=fast makes on targets that have one, would change the bits).
[[nodiscard]] inline float moving_average_step(float old, float batch, float c) noexcept {
  float d = c * (batch - old);
  HONE_DETAIL_OPAQUE_FP(d);
  return old + d;
}
}  // namespace detail

/// Moving-average min-max (as torch's MovingAverageMinMaxObserver): the first batch sets the range,
/// each later batch moves it by `averaging_constant` towards the batch's own min and max.
class moving_average_minmax_observer {
 public:
  explicit moving_average_minmax_observer(float averaging_constant = 0.01f)
      : c_(averaging_constant) {
    HONE_REQUIRE(c_ > 0.0f && c_ <= 1.0f,
                 "hone::compress::moving_average_minmax_observer: the averaging constant is " +
                     std::to_string(c_) + "; it must lie in (0, 1].");
  }
  /// One batch; an empty batch changes nothing.
  void observe(std::span<const float> x) {
    detail::require_finite(x, 0, "hone::compress::moving_average_minmax_observer::observe");
    if (x.empty()) return;
    const auto [mn, mx] = std::minmax_element(x.begin(), x.end());
    if (!seen_) {
      lo_ = *mn;
      hi_ = *mx;
      seen_ = true;
    } else {
      lo_ = detail::moving_average_step(lo_, *mn, c_);
      hi_ = detail::moving_average_step(hi_, *mx, c_);
    }
  }
  [[nodiscard]] quant_range range() const noexcept {
    return seen_ ? quant_range{lo_, hi_} : quant_range{};
  }
  /// Whether a batch has been observed (the observer's state is seen() and range(); the averaging
  /// constant is an option, not state).
  [[nodiscard]] bool seen() const noexcept { return seen_; }
  [[nodiscard]] float averaging_constant() const noexcept { return c_; }
  /// Sets the state that seen() and range() read (a checkpoint's): not seen starts afresh (r is
  /// ignored); seen needs a finite r with lo <= hi (config_error otherwise). Later batches then
  /// continue bit for bit as in the observer the state was read from.
  void restore(bool seen, quant_range r) {
    detail::check_observer_state(seen, r,
                                 "hone::compress::moving_average_minmax_observer::restore");
    lo_ = seen ? r.lo : 0.0f;
    hi_ = seen ? r.hi : 0.0f;
    seen_ = seen;
  }

 private:
  float c_;
  float lo_ = 0.0f, hi_ = 0.0f;
  bool seen_ = false;
};

namespace detail {
/// The q-quantile of v (0 <= q <= 1) with linear interpolation between order statistics (numpy's
/// default): position q * (n - 1). Reorders v.
inline float quantile_inplace(std::vector<float>& v, double q) {
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto i = static_cast<std::size_t>(std::floor(pos));
  const double frac = pos - static_cast<double>(i);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  const double a = v[i];
  if (frac == 0.0 || i + 1 >= v.size()) return static_cast<float>(a);
  const double b = *std::min_element(v.begin() + static_cast<std::ptrdiff_t>(i) + 1, v.end());
  return static_cast<float>(a + frac * (b - a));
}
}  // namespace detail

/// Percentile range: [quantile(1 - p), quantile(p)] of every observed value (linear interpolation,
/// as numpy.quantile), which ignores the outermost (1 - p) tails. Keeps the observed values, so it
/// suits calibration sets, not endless streams.
class percentile_observer {
 public:
  explicit percentile_observer(double p = 0.999) : p_(p) {
    HONE_REQUIRE(p_ >= 0.5 && p_ <= 1.0, "hone::compress::percentile_observer: p is " +
                                             std::to_string(p_) + "; it must lie in [0.5, 1].");
  }
  void observe(std::span<const float> x) {
    detail::require_finite(x, 0, "hone::compress::percentile_observer::observe");
    values_.insert(values_.end(), x.begin(), x.end());
  }
  [[nodiscard]] quant_range range() const {
    if (values_.empty()) return {};
    std::vector<float> v = values_;
    const float lo = detail::quantile_inplace(v, 1.0 - p_);
    const float hi = detail::quantile_inplace(v, p_);
    return {lo, hi};
  }

 private:
  double p_;
  std::vector<float> values_;
};

/// Mean squared error of symmetric int8 quantization of v with clipping threshold t (> 0):
/// scale = t / 127, codes clamped to [-127, 127].
[[nodiscard]] inline double symmetric_quant_mse(std::span<const float> v, float t) {
  const float s = t / 127.0f;
  double sum = 0.0;
  for (const float x : v) {
    const double e = static_cast<double>(detail::quantize_symmetric(x, s)) * s - x;
    sum += e * e;
  }
  return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
}

/// MSE-optimal symmetric range: the clipping threshold t (from `candidates` evenly spaced values in
/// (0, max|x|]) that minimizes symmetric_quant_mse over every observed value; range() is {-t, t}.
/// Keeps the observed values (a calibration set).
class mse_observer {
 public:
  explicit mse_observer(std::size_t candidates = 256) : candidates_(candidates) {
    HONE_REQUIRE(candidates_ >= 1, "hone::compress::mse_observer: needs at least one candidate.");
  }
  void observe(std::span<const float> x) {
    detail::require_finite(x, 0, "hone::compress::mse_observer::observe");
    values_.insert(values_.end(), x.begin(), x.end());
  }
  /// The best threshold and its MSE.
  [[nodiscard]] std::pair<float, double> best_threshold() const {
    const float amax = detail::abs_max(values_);
    if (amax == 0.0f) return {0.0f, 0.0};
    float best_t = amax;
    double best = symmetric_quant_mse(values_, amax);
    for (std::size_t i = 1; i < candidates_; ++i) {
      const float t = amax * static_cast<float>(i) / static_cast<float>(candidates_);
      if (t <= 0.0f) continue;
      const double m = symmetric_quant_mse(values_, t);
      if (m < best) {
        best = m;
        best_t = t;
      }
    }
    return {best_t, best};
  }
  [[nodiscard]] quant_range range() const {
    const float t = best_threshold().first;
    return {-t, t};
  }

 private:
  std::size_t candidates_;
  std::vector<float> values_;
};

/// A calibration pass: feeds every batch of `batches` (each a contiguous range of float) to the
/// observer and returns its range.
template <class Observer, class Batches>
quant_range calibrate(Observer& observer, Batches&& batches) {
  for (const auto& b : batches) observer.observe(std::span<const float>(b));
  return observer.range();
}

}  // namespace compress
HONE_NAMESPACE_END
