// hone/compress/sparse24.hpp: 2:4 semi-structured sparsity: in every group of 4 consecutive weights
// of a row, 2 are zero. The pattern, a packed format (the 2 kept values of each group and their two
// 2-bit positions) and CPU kernels that multiply with it.
//
//   auto w24 = hone::compress::sparse24_matrix::prune(w, rows, cols);  // keep 2 of 4 by magnitude
//   hone::compress::sparse24_matmul(w24, x, m, y);                    // y[m, rows] = x w24^T
//
// Layout: a dense row-major matrix [rows, cols] (cols a multiple of 4; for a linear layer, rows =
// outputs and cols = inputs). Group g of row r is columns 4g..4g+3. values holds, per row, the two
// kept values of each group in column order (cols / 2 floats per row); positions holds the columns
// of those values within their group as 2-bit numbers, the first in bits 0-1 and the second in bits
// 2-3 of a nibble, two groups per byte (group 2j in the low nibble, 2j+1 in the high one),
// (cols / 4 + 1) / 2 bytes per row. This is the layout of NVIDIA's sparse tensor cores (values
// compressed to half the columns, 2-bit metadata per kept value); the weights take 9/16 of the
// dense bytes.
//
// Kernels: sparse24_matvec (y = W x) and sparse24_matmul (Y = X W^T for M rows of X: a linear
// layer's forward pass). The matmul works on X^T (transposed once into scratch) so that every kept
// weight is one axpy over the M rows: two axpys per group instead of the dense four. Rows of W are
// split over oneTBB; each output element is summed in group order, so results do not depend on the
// thread count.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/parallel.hpp"  // HONE_VECTORIZE_FUNCTION, HONE_RESTRICT

HONE_NAMESPACE_BEGIN
namespace compress {

/// A [rows, cols] matrix with 2 nonzeros in every group of 4 columns, packed (see the top of this
/// file).
class sparse24_matrix {
 public:
  sparse24_matrix() = default;

  /// The 2:4 pattern of `w` by magnitude: in each group the two values of largest |w| are kept
  /// (ties: the lower column first), packed. Throws hone::config_error for a shape that does not
  /// match or cols not a multiple of 4, and for a NaN weight (naming row and column).
  static sparse24_matrix prune(std::span<const float> w, std::size_t rows, std::size_t cols) {
    check_shape(w.size(), rows, cols, "prune");
    sparse24_matrix m(rows, cols);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t g = 0; g < cols / 4; ++g) {
        const float* q = w.data() + r * cols + 4 * g;
        float a[4];
        for (int k = 0; k < 4; ++k) {
          HONE_REQUIRE(!std::isnan(q[k]),
                       "hone::compress::sparse24_matrix::prune: the weight at "
                       "row " +
                           std::to_string(r) + ", column " +
                           std::to_string(4 * g + static_cast<std::size_t>(k)) +
                           " is NaN; magnitudes of NaN cannot be ranked.");
          a[k] = std::fabs(q[k]);
        }
        // The two largest: first the largest (lowest column on ties), then the largest of the rest.
        int i0 = 0;
        for (int k = 1; k < 4; ++k) i0 = a[k] > a[i0] ? k : i0;
        int i1 = i0 == 0 ? 1 : 0;
        for (int k = 0; k < 4; ++k) i1 = (k != i0 && a[k] > a[i1]) ? k : i1;
        if (i1 < i0) std::swap(i0, i1);
        m.set_group(r, g, i0, q[i0], i1, q[i1]);
      }
    }
    return m;
  }

  /// Packs a matrix that already has the 2:4 pattern (at most 2 nonzeros per group, e.g. one
  /// pruned elsewhere); a group with 3 or 4 nonzeros is an error naming its row and columns.
  static sparse24_matrix pack(std::span<const float> w, std::size_t rows, std::size_t cols) {
    check_shape(w.size(), rows, cols, "pack");
    sparse24_matrix m(rows, cols);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t g = 0; g < cols / 4; ++g) {
        const float* q = w.data() + r * cols + 4 * g;
        int at[2] = {0, 0}, n = 0;
        for (int k = 0; k < 4; ++k) {
          if (q[k] != 0.0f) {
            if (n < 2) at[n] = k;
            ++n;
          }
        }
        HONE_REQUIRE(n <= 2, "hone::compress::sparse24_matrix::pack: row " + std::to_string(r) +
                                 ", columns " + std::to_string(4 * g) + "-" +
                                 std::to_string(4 * g + 3) + " hold " + std::to_string(n) +
                                 " nonzeros; a 2:4 matrix has at most 2 in every group of 4 (use "
                                 "prune() to choose them by magnitude).");
        // Fill up to two positions: the nonzeros, then the lowest free columns (holding zeros).
        int i0 = n > 0 ? at[0] : 0;
        int i1 = n > 1 ? at[1] : -1;
        if (i1 < 0) {
          for (int k = 0; k < 4; ++k) {
            if (k != i0) {
              i1 = k;
              break;
            }
          }
        }
        if (i1 < i0) std::swap(i0, i1);
        m.set_group(r, g, i0, q[i0], i1, q[i1]);
      }
    }
    return m;
  }

  [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::size_t cols() const noexcept { return cols_; }
  /// The kept values, cols / 2 per row.
  [[nodiscard]] std::span<const float> values() const noexcept { return values_; }
  /// The 2-bit positions, (cols / 4 + 1) / 2 bytes per row.
  [[nodiscard]] std::span<const std::uint8_t> positions() const noexcept { return positions_; }
  /// Bytes of the packed matrix (values and positions).
  [[nodiscard]] std::size_t bytes() const noexcept {
    return values_.size() * sizeof(float) + positions_.size();
  }
  /// The columns (0-3) within group g of row r of its two kept values.
  [[nodiscard]] std::pair<int, int> group_positions(std::size_t r, std::size_t g) const {
    const std::uint8_t b = positions_[r * pos_stride_ + g / 2];
    const int nib = (g % 2 == 0) ? (b & 0x0F) : (b >> 4);
    return {nib & 3, (nib >> 2) & 3};
  }

  /// The dense [rows, cols] matrix (zeros where pruned).
  [[nodiscard]] std::vector<float> to_dense() const {
    std::vector<float> d(rows_ * cols_, 0.0f);
    for (std::size_t r = 0; r < rows_; ++r) {
      for (std::size_t g = 0; g < cols_ / 4; ++g) {
        const auto [i0, i1] = group_positions(r, g);
        d[r * cols_ + 4 * g + static_cast<std::size_t>(i0)] = values_[r * (cols_ / 2) + 2 * g];
        d[r * cols_ + 4 * g + static_cast<std::size_t>(i1)] = values_[r * (cols_ / 2) + 2 * g + 1];
      }
    }
    return d;
  }

 private:
  sparse24_matrix(std::size_t rows, std::size_t cols)
      : rows_(rows),
        cols_(cols),
        pos_stride_((cols / 4 + 1) / 2),
        values_(rows * (cols / 2)),
        positions_(rows * pos_stride_, std::uint8_t{0}) {}

  static void check_shape(std::size_t size, std::size_t rows, std::size_t cols, const char* fn) {
    const std::string f = std::string("hone::compress::sparse24_matrix::") + fn + ": ";
    HONE_REQUIRE(rows > 0 && cols > 0 && cols % 4 == 0,
                 f + "the shape is [" + std::to_string(rows) + ", " + std::to_string(cols) +
                     "]; 2:4 sparsity needs at least one row and a column count that is a "
                     "multiple of 4.");
    HONE_REQUIRE(size == rows * cols, f + "the matrix holds " + std::to_string(size) +
                                          " values but the shape [" + std::to_string(rows) + ", " +
                                          std::to_string(cols) + "] needs " +
                                          std::to_string(rows * cols) + ".");
  }

  void set_group(std::size_t r, std::size_t g, int i0, float v0, int i1, float v1) {
    values_[r * (cols_ / 2) + 2 * g] = v0;
    values_[r * (cols_ / 2) + 2 * g + 1] = v1;
    const auto nib = static_cast<std::uint8_t>(i0 | (i1 << 2));
    std::uint8_t& b = positions_[r * pos_stride_ + g / 2];
    b = static_cast<std::uint8_t>(g % 2 == 0 ? ((b & 0xF0) | nib) : ((b & 0x0F) | (nib << 4)));
  }

  std::size_t rows_ = 0, cols_ = 0, pos_stride_ = 0;
  std::vector<float> values_;
  std::vector<std::uint8_t> positions_;
};

namespace detail {
/// a[i] += v0 * x0[i] + v1 * x1[i] for i < m: the two kept weights of one group over m inputs.
HONE_VECTORIZE_FUNCTION inline void sparse24_axpy2(float* HONE_RESTRICT a, float v0,
                                                   const float* HONE_RESTRICT x0, float v1,
                                                   const float* HONE_RESTRICT x1, std::size_t m) {
  for (std::size_t i = 0; i < m; ++i) a[i] += v0 * x0[i] + v1 * x1[i];
}
}  // namespace detail

/// y = W x: x holds W.cols() values, y W.rows() (overwritten). Each y[r] is summed in group order.
inline void sparse24_matvec(const sparse24_matrix& w, std::span<const float> x,
                            std::span<float> y) {
  HONE_REQUIRE(x.size() == w.cols() && y.size() == w.rows(),
               "hone::compress::sparse24_matvec: x holds " + std::to_string(x.size()) +
                   " values and y " + std::to_string(y.size()) + ", but the matrix is [" +
                   std::to_string(w.rows()) + ", " + std::to_string(w.cols()) +
                   "]: x needs cols values, y rows.");
  const std::size_t half = w.cols() / 2, groups = w.cols() / 4;
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, w.rows(), 16),
                    [&](const tbb::blocked_range<std::size_t>& rr) {
                      for (std::size_t r = rr.begin(); r != rr.end(); ++r) {
                        const float* v = w.values().data() + r * half;
                        float acc = 0.0f;
                        for (std::size_t g = 0; g < groups; ++g) {
                          const auto [i0, i1] = w.group_positions(r, g);
                          acc += v[2 * g] * x[4 * g + static_cast<std::size_t>(i0)] +
                                 v[2 * g + 1] * x[4 * g + static_cast<std::size_t>(i1)];
                        }
                        y[r] = acc;
                      }
                    });
}

/// Y = X W^T: X is [m, W.cols()] row-major (m inputs of a linear layer), Y [m, W.rows()]
/// (overwritten). Y[i, r] is summed in group order, whatever the thread count.
inline void sparse24_matmul(const sparse24_matrix& w, std::span<const float> x, std::size_t m,
                            std::span<float> y) {
  HONE_REQUIRE(m > 0 && x.size() == m * w.cols() && y.size() == m * w.rows(),
               "hone::compress::sparse24_matmul: X holds " + std::to_string(x.size()) +
                   " values and Y " + std::to_string(y.size()) + " for m = " + std::to_string(m) +
                   " rows and a [" + std::to_string(w.rows()) + ", " + std::to_string(w.cols()) +
                   "] matrix: X needs m * cols values, Y m * rows (m > 0).");
  if (m == 1) {  // one input: the matrix-vector product (no transpose, no axpys of length 1)
    sparse24_matvec(w, x, y);
    return;
  }
  const std::size_t k = w.cols(), n = w.rows(), half = k / 2, groups = k / 4;
  // X^T [k, m]: column j of X as one contiguous row, so each kept weight is one axpy over m.
  std::vector<float> xt(k * m);
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, k, 64),
                    [&](const tbb::blocked_range<std::size_t>& rr) {
                      for (std::size_t j = rr.begin(); j != rr.end(); ++j) {
                        for (std::size_t i = 0; i < m; ++i) xt[j * m + i] = x[i * k + j];
                      }
                    });
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, n, 32), [&](const tbb::blocked_range<std::size_t>& rr) {
        // Cache blocking: the rows of a task sweep X^T one block of 64 groups (256 columns of X)
        // at a time, so a block of X^T is read from cache by every row of the task instead of
        // streaming all of X^T once per row. Each output still sums its groups in order.
        constexpr std::size_t block = 64;
        const std::size_t r0 = rr.begin(), rows = rr.end() - rr.begin();
        std::vector<float> acc(rows * m, 0.0f);
        for (std::size_t gb = 0; gb < groups; gb += block) {
          const std::size_t ge = groups - gb < block ? groups : gb + block;
          for (std::size_t r = r0; r != rr.end(); ++r) {
            const float* v = w.values().data() + r * half;
            float* a = acc.data() + (r - r0) * m;
            for (std::size_t g = gb; g < ge; ++g) {
              const auto [i0, i1] = w.group_positions(r, g);
              detail::sparse24_axpy2(
                  a, v[2 * g], xt.data() + (4 * g + static_cast<std::size_t>(i0)) * m, v[2 * g + 1],
                  xt.data() + (4 * g + static_cast<std::size_t>(i1)) * m, m);
            }
          }
        }
        for (std::size_t r = r0; r != rr.end(); ++r) {
          for (std::size_t i = 0; i < m; ++i) y[i * n + r] = acc[(r - r0) * m + i];
        }
      });
}

}  // namespace compress
HONE_NAMESPACE_END
