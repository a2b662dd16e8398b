// hone/rl/sum_tree.hpp: the sum tree (and min tree) behind prioritized replay.
//
// Layout. Leaves are float priorities. Above them, levels of Arity-ary nodes (Arity a power of
// two: 2 for the classic binary tree, 16 for capacities beyond the cache): entry e of a level is
// the sum of entries [e * Arity, e * Arity + Arity) of the level below (or of the leaves), kept in
// double; the top level has exactly Arity entries and their sum is the total. A min tree with the
// same shape keeps, in float, the smallest positive priority below each entry (0 counts as +inf:
// an item with priority 0 is never sampled and does not bound the importance weights). A node's
// Arity entries are contiguous, so one node is one (float) or two (double, Arity 16) cache lines.
//
// No drift. An update never adds a delta to a sum: every entry on the path is recomputed from its
// children (a fixed pairwise order), so a sum is always the rounded sum of the current leaves, and
// its error does not grow with the number of updates (float/double delta trees drift: Reverb #43,
// flashbax #52). The relative error of the total is bounded by ~(log2 Arity) * depth * 2^-53 of
// the sum of the leaves, whatever happened before.
//
// Sampling. find(target) walks from the top to the leaf whose prefix interval contains target.
// find_batch walks B targets level by level together: the B node reads of one level are
// independent, so their cache misses overlap (and the next level's nodes are prefetched). On the
// top levels, which have few nodes for B walks (1, Arity, ...), the interval ends of every node
// are formed once per batch and each walk only compares its target with them: the in-node search
// is mostly those ends (a chain of dependent adds and shuffles), so the stratified descent of 256
// samples over 2^20 leaves (5 levels, 2 of them shared) costs about a third less. An
// entry equal to 0 is never chosen, even when rounding puts the target at or past the end of a
// node (then the last positive child is taken), so zero-priority items are never sampled.
//
// The reductions and the in-node search are HONE_HOST_DEVICE functions: the CUDA sampler
// (hone/rl/cuda/per.cuh) runs the very same arithmetic and reaches the same bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>

#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"

#if !HONE_CUDA_COMPILER
#include "hone/core/detail/simd.hpp"  // the target attributes, HONE_DETAIL_HAS_AVX512, active_isa
#endif
// The AVX-512 twins of the in-node search and reductions exist where hone's loops have an
// AVX-512 target: in every optimized x86-64 build (chosen at run time, core/isa.hpp) or when the
// flags target AVX-512. Not in CUDA device code (the scalar functions run there).
#if defined(HONE_DETAIL_HAS_AVX512) && !HONE_CUDA_COMPILER
#define HONE_DETAIL_SUM_TREE_AVX512 1
#else
#define HONE_DETAIL_SUM_TREE_AVX512 0
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__GNUC__) || defined(__clang__)
#define HONE_PREFETCH(p) __builtin_prefetch(p)
#define HONE_PREFETCH_WRITE(p) __builtin_prefetch(p, 1)
#else
#define HONE_PREFETCH(p) ((void)(p))
#define HONE_PREFETCH_WRITE(p) ((void)(p))
#endif

HONE_NAMESPACE_BEGIN

namespace detail {

/// Asks Linux to back [p, p + bytes) with transparent huge pages (a hint; ignored elsewhere and on
/// failure). Replay buffers read random rows of arrays of hundreds of MB: with 4 KiB pages nearly
/// every read also misses the TLB. Call before the first touch. Only arrays of 4 MiB or more.
inline void advise_huge_pages(void* p, std::size_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::size_t huge = std::size_t{2} << 20;
  if (p == nullptr || bytes < 2 * huge) return;
  const auto begin = (reinterpret_cast<std::uintptr_t>(p) + huge - 1) & ~(huge - 1);
  const auto end = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(huge - 1);
  if (end > begin) {
    (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
#else
  (void)p;
  (void)bytes;
#endif
}

/// An uninitialized host buffer of n elements, advised to huge pages, then filled with `value`.
template <class T>
buffer<T> huge_buffer(std::size_t n, const T& value) {
  buffer<T> b(n);
  advise_huge_pages(b.data(), b.size_bytes());
  std::fill_n(b.data(), n, value);
  return b;
}

inline constexpr std::size_t sum_tree_max_levels = 48;

/// The shape of an Arity-ary tree over `capacity` leaves: how many levels of sums, where each
/// level starts in the one array holding them all, and how many entries it has (a multiple of
/// Arity). Plain data, copied into kernels as an argument.
struct sum_tree_layout {
  std::size_t arity = 0;
  std::size_t capacity = 0;  // leaves in use
  std::size_t leaves = 0;    // capacity rounded up to a multiple of arity
  std::size_t depth = 0;     // levels of sums; level 0 is the top (arity entries)
  std::size_t offset[sum_tree_max_levels] = {};  // first entry of each level in the sums array
  std::size_t size[sum_tree_max_levels] = {};    // entries of each level (a multiple of arity)
  std::size_t used[sum_tree_max_levels] = {};    // entries with children; the rest stay 0
  std::size_t entries = 0;                       // all levels together

  static sum_tree_layout make(std::size_t arity, std::size_t capacity) {
    HONE_REQUIRE(capacity > 0, "hone::sum_tree: the capacity must be positive");
    sum_tree_layout l;
    l.arity = arity;
    l.capacity = capacity;
    const auto up = [arity](std::size_t n) { return (n + arity - 1) / arity * arity; };
    l.leaves = up(capacity);
    std::size_t sizes[sum_tree_max_levels];
    std::size_t d = 0;
    std::size_t below = l.leaves;
    do {
      HONE_REQUIRE(d < sum_tree_max_levels,
                   "hone::sum_tree: capacity too large for the tree depth");
      sizes[d++] = up(below / arity);
      below = sizes[d - 1];
    } while (below > arity);
    l.depth = d;
    std::size_t off = 0;
    for (std::size_t i = 0; i < d; ++i) {  // sizes[] runs bottom-up; levels are top-down
      l.size[i] = sizes[d - 1 - i];
      l.offset[i] = off;
      off += l.size[i];
    }
    for (std::size_t i = 0; i < d; ++i) {
      l.used[i] = (i + 1 < d ? l.size[i + 1] : l.leaves) / arity;
    }
    l.entries = off;
    return l;
  }
};

/// Sum of Arity children in a fixed pairwise order (c[i] + c[i + Arity/2], then halves): the
/// order of a vector reduction, and the same on the host and the device.
template <std::size_t Arity, class T>
HONE_HOST_DEVICE double node_sum_scalar(const T* c) {
  if constexpr (Arity == 1) {
    return static_cast<double>(c[0]);
  } else {
    double t[Arity / 2];
    for (std::size_t i = 0; i < Arity / 2; ++i) {
      t[i] = static_cast<double>(c[i]) + static_cast<double>(c[i + Arity / 2]);
    }
    for (std::size_t w = Arity / 4; w >= 1; w /= 2) {
      for (std::size_t i = 0; i < w; ++i) t[i] += t[i + w];
    }
    return t[0];
  }
}

/// Smallest positive value among Arity children (+inf when none): the min tree's reduction.
/// `Leaves` maps values <= 0 (never sampled) to +inf.
template <std::size_t Arity, bool Leaves>
HONE_HOST_DEVICE float node_min_scalar(const float* c) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  float t[Arity];
  for (std::size_t i = 0; i < Arity; ++i) {
    const float v = c[i];
    t[i] = (Leaves && !(v > 0.0f)) ? inf : v;
  }
  for (std::size_t w = Arity / 2; w >= 1; w /= 2) {
    for (std::size_t i = 0; i < w; ++i) t[i] = t[i + w] < t[i] ? t[i + w] : t[i];
  }
  return t[0];
}

#if HONE_DETAIL_SUM_TREE_AVX512
/// node_sum_scalar<16> with AVX-512 (the same pairwise order: lanes i and i + 8, then halves).
template <class T>
HONE_DETAIL_TARGET_AVX512 inline double node_sum16_avx512(const T* c) {
  __m512d lo;
  __m512d hi;
  if constexpr (std::is_same_v<T, float>) {
    lo = _mm512_maskz_cvtps_pd(0xFF, _mm256_loadu_ps(c));
    hi = _mm512_maskz_cvtps_pd(0xFF, _mm256_loadu_ps(c + 8));
  } else {
    lo = _mm512_loadu_pd(c);
    hi = _mm512_loadu_pd(c + 8);
  }
  const __m512d t8 = _mm512_add_pd(lo, hi);
  const __m256d t4 = _mm256_add_pd(_mm512_maskz_extractf64x4_pd(0xFF, t8, 0),
                                   _mm512_maskz_extractf64x4_pd(0xFF, t8, 1));
  const __m128d t2 = _mm_add_pd(_mm256_castpd256_pd128(t4), _mm256_extractf128_pd(t4, 1));
  return _mm_cvtsd_f64(_mm_add_sd(t2, _mm_unpackhi_pd(t2, t2)));
}
/// node_min_scalar<16> with AVX-512 (a minimum does not depend on the order).
template <bool Leaves>
HONE_DETAIL_TARGET_AVX512 inline float node_min16_avx512(const float* c) {
  __m512 v = _mm512_loadu_ps(c);
  if constexpr (Leaves) {
    const __mmask16 positive = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ);
    v = _mm512_mask_blend_ps(positive, _mm512_set1_ps(std::numeric_limits<float>::infinity()), v);
  }
  const __m512d bits = _mm512_castps_pd(v);
  const __m256 m8 = _mm256_min_ps(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xFF, bits, 0)),
                                  _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xFF, bits, 1)));
  const __m128 m4 = _mm_min_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  const __m128 m2 = _mm_min_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_min_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
}
#endif

/// The AVX-512 twins' tag: true_type runs them (Arity 16; the caller runs under the AVX-512
/// target, sum_tree's with_isa), false_type the scalar functions.
template <bool Wide>
using wide_tag = std::bool_constant<Wide && HONE_DETAIL_SUM_TREE_AVX512>;

/// Sum of Arity children in a fixed pairwise order (see node_sum_scalar).
template <std::size_t Arity, class T, bool Wide>
HONE_HOST_DEVICE double node_sum(const T* c, std::bool_constant<Wide> /*wide*/) {
#if HONE_DETAIL_SUM_TREE_AVX512
  if constexpr (Wide && Arity == 16) return node_sum16_avx512(c);
#endif
  return node_sum_scalar<Arity>(c);
}
/// Smallest positive child (see node_min_scalar).
template <std::size_t Arity, bool Leaves, bool Wide>
HONE_HOST_DEVICE float node_min(const float* c, std::bool_constant<Wide> /*wide*/) {
#if HONE_DETAIL_SUM_TREE_AVX512
  if constexpr (Wide && Arity == 16) return node_min16_avx512<Leaves>(c);
#endif
  return node_min_scalar<Arity, Leaves>(c);
}

/// The end of the in-node search: given the interval ends (ends[j + 1] = P_j, ends[0] = 0) and
/// k = the number of P_j <= u, the chosen child (never a zero one) and u relative to it.
template <std::size_t Arity, class T>
HONE_HOST_DEVICE std::size_t finish_child(const T* c, const double* ends, std::size_t k,
                                          double& u) {
  if (k == Arity || !(c[k] > T(0))) {  // rare: past the end, or a zero child
    std::size_t j = k < Arity ? k : Arity - 1;
    while (j > 0 && !(c[j] > T(0))) --j;
    if (!(c[j] > T(0))) {  // nothing positive before: the first positive after
      j = k;
      while (j + 1 < Arity && !(c[j] > T(0))) ++j;
    }
    k = j;
  }
  u -= ends[k];
  if (u < 0.0) u = 0.0;
  return k;
}

/// The interval ends of a node's children in find_child_scalar's arithmetic (below; ends[0] = 0,
/// ends[j + 1] = P_j): computed once for a node that many walks visit (see sum_tree::find_batch).
template <std::size_t Arity, class T>
HONE_HOST_DEVICE void node_ends_scalar(const T* c, double* ends) {
  constexpr std::size_t group = Arity < 4 ? Arity : 4;
  constexpr std::size_t groups = Arity / group;
  ends[0] = 0.0;
  double base = 0.0;
  for (std::size_t q = 0; q < groups; ++q) {
    const T* g = c + q * group;
    double y[group];
    for (std::size_t i = 0; i < group; ++i) {
      y[i] = static_cast<double>(g[i]);
    }
    for (std::size_t i = group; i-- > 1;) y[i] = y[i] + y[i - 1];
    if constexpr (group == 4) {
      y[3] = y[3] + y[1];
      y[2] = y[2] + y[0];
    }
    for (std::size_t i = 0; i < group; ++i) ends[q * group + i + 1] = base + y[i];
    base = ends[q * group + group];
  }
}

/// find_child_scalar with the node's ends given (node_ends): the same child and the same `u`.
template <std::size_t Arity, class T>
HONE_HOST_DEVICE std::size_t child_from_ends_scalar(const T* c, const double* ends, double& u) {
  std::size_t k = 0;
  for (std::size_t j = 1; j <= Arity; ++j) k += (ends[j] <= u) ? 1 : 0;
  return finish_child<Arity>(c, ends, k, u);
}

/// In-node search: the child whose interval holds `u`, with `u` made relative to that child.
///
/// The children's interval ends P_j are fixed by this arithmetic (the CUDA sampler and any SIMD
/// variant must reproduce it bit for bit): children are taken in groups of 4 (of Arity when
/// Arity < 4); inside a group the prefix sums are formed in two doubling steps (y_i = c_i +
/// c_{i-1}, then y_i += y_{i-2}, as a 4-lane vector scan does); group totals are chained
/// sequentially into bases b_q (b_0 = 0, b_{q+1} = b_q + y_3 of group q); P_{4q+i} = b_q + y_i.
/// The P_j never decrease, so the child is the number of P_j <= u. It is branch-free in the common
/// case: a data-dependent branch per level would be mispredicted half the time and stall the
/// overlapped walks of find_batch.
///
/// A child equal to 0 is never chosen: when rounding leaves `u` at or past the end of the node,
/// or gives a zero child an interval one ulp wide, the nearest positive child before it is taken
/// (after it when there is none before).
template <std::size_t Arity, class T>
HONE_HOST_DEVICE std::size_t find_child_scalar(const T* c, double& u) {
  double ends[Arity + 1];  // ends[j + 1] = P_j, ends[0] = 0
  node_ends_scalar<Arity>(c, ends);
  return child_from_ends_scalar<Arity>(c, ends, u);
}

#if HONE_DETAIL_SUM_TREE_AVX512
/// The ends P_0..P_7 (p0) and P_8..P_15 (p1) of a 16-child node with AVX-512: the operations of
/// find_child_scalar<16> on the same operands (so the same bits), one 8-lane vector per two
/// groups.
template <class T>
HONE_DETAIL_TARGET_AVX512 inline void node_ends16_avx512(const T* c, __m512d& p0, __m512d& p1) {
  __m512d v0;
  __m512d v1;
  if constexpr (std::is_same_v<T, float>) {
    // (The maskz forms with an all-ones mask: GCC 12 warns about the unmasked intrinsics'
    // undefined pass-through operand under -Wmaybe-uninitialized.)
    v0 = _mm512_maskz_cvtps_pd(0xFF, _mm256_loadu_ps(c));
    v1 = _mm512_maskz_cvtps_pd(0xFF, _mm256_loadu_ps(c + 8));
  } else {
    v0 = _mm512_loadu_pd(c);
    v1 = _mm512_loadu_pd(c + 8);
  }
  const __m512i prev1 = _mm512_set_epi64(6, 5, 4, 3, 2, 1, 0, 0);
  const __m512i prev2 = _mm512_set_epi64(5, 4, 3, 2, 1, 0, 0, 0);
  // y_i = c_i + c_{i-1} (lanes 1-3 of each group), then y_i += y_{i-2} (lanes 2-3).
  __m512d y0 = _mm512_add_pd(v0, _mm512_maskz_permutexvar_pd(0xEE, prev1, v0));
  __m512d y1 = _mm512_add_pd(v1, _mm512_maskz_permutexvar_pd(0xEE, prev1, v1));
  y0 = _mm512_add_pd(y0, _mm512_maskz_permutexvar_pd(0xCC, prev2, y0));
  y1 = _mm512_add_pd(y1, _mm512_maskz_permutexvar_pd(0xCC, prev2, y1));
  // Bases: 0 for group 0, then the running end of the previous group.
  p0 = _mm512_add_pd(y0, _mm512_maskz_permutexvar_pd(0xF0, _mm512_set1_epi64(3), y0));
  const __m512d t = _mm512_add_pd(y1, _mm512_maskz_permutexvar_pd(0xFF, _mm512_set1_epi64(7), p0));
  p1 = _mm512_mask_add_pd(t, 0xF0, y1, _mm512_maskz_permutexvar_pd(0xFF, _mm512_set1_epi64(3), t));
}

/// The number of ends P_j <= u (the child before the zero-child rule of finish_child).
HONE_DETAIL_TARGET_AVX512 inline std::size_t count_ends16_avx512(__m512d p0, __m512d p1, double u) {
  const __m512d uu = _mm512_set1_pd(u);
  return static_cast<std::size_t>(__builtin_popcount(_mm512_cmp_pd_mask(p0, uu, _CMP_LE_OQ)) +
                                  __builtin_popcount(_mm512_cmp_pd_mask(p1, uu, _CMP_LE_OQ)));
}

/// find_child_scalar<16> with AVX-512 (the same child and the same `u`, bit for bit).
template <class T>
HONE_DETAIL_TARGET_AVX512 inline std::size_t find_child_avx512(const T* c, double& u) {
  __m512d p0;
  __m512d p1;
  node_ends16_avx512(c, p0, p1);
  const std::size_t k = count_ends16_avx512(p0, p1, u);
  double ends[17];
  ends[0] = 0.0;
  _mm512_storeu_pd(ends + 1, p0);
  _mm512_storeu_pd(ends + 9, p1);
  return finish_child<16>(c, ends, k, u);
}

/// child_from_ends_scalar<16> with AVX-512.
template <class T>
HONE_DETAIL_TARGET_AVX512 inline std::size_t child_from_ends_avx512(const T* c, const double* ends,
                                                                    double& u) {
  const std::size_t k =
      count_ends16_avx512(_mm512_loadu_pd(ends + 1), _mm512_loadu_pd(ends + 9), u);
  return finish_child<16>(c, ends, k, u);
}
/// node_ends_scalar<16> with AVX-512, into ends[0..16].
template <class T>
HONE_DETAIL_TARGET_AVX512 inline void node_ends16_store_avx512(const T* c, double* ends) {
  __m512d p0;
  __m512d p1;
  node_ends16_avx512(c, p0, p1);
  ends[0] = 0.0;
  _mm512_storeu_pd(ends + 1, p0);
  _mm512_storeu_pd(ends + 9, p1);
}
#endif

/// node_ends_scalar, or its AVX-512 twin for 16 children.
template <std::size_t Arity, class T, bool Wide>
HONE_HOST_DEVICE void node_ends(const T* c, double* ends, std::bool_constant<Wide> /*wide*/) {
#if HONE_DETAIL_SUM_TREE_AVX512
  if constexpr (Wide && Arity == 16) {
    node_ends16_store_avx512(c, ends);
    return;
  }
#endif
  node_ends_scalar<Arity>(c, ends);
}

/// child_from_ends_scalar, or its AVX-512 twin for 16 children.
template <std::size_t Arity, class T, bool Wide>
HONE_HOST_DEVICE std::size_t child_from_ends(const T* c, const double* ends, double& u,
                                             std::bool_constant<Wide> /*wide*/) {
#if HONE_DETAIL_SUM_TREE_AVX512
  if constexpr (Wide && Arity == 16) return child_from_ends_avx512(c, ends, u);
#endif
  return child_from_ends_scalar<Arity>(c, ends, u);
}

/// The in-node search: find_child_scalar, or its AVX-512 twin for 16 children.
template <std::size_t Arity, class T, bool Wide>
HONE_HOST_DEVICE std::size_t find_child(const T* c, double& u, std::bool_constant<Wide> /*wide*/) {
#if HONE_DETAIL_SUM_TREE_AVX512
  if constexpr (Wide && Arity == 16) return find_child_avx512(c, u);
#endif
  return find_child_scalar<Arity>(c, u);
}

/// Target of sample i of n stratified samples: (i + uniform) * total / n.
HONE_HOST_DEVICE double stratified_target(std::size_t i, double uniform, double total,
                                          std::size_t n) {
  return (static_cast<double>(i) + uniform) * total / static_cast<double>(n);
}

}  // namespace detail

/// A sum tree with float leaves, double sums and a float min tree; Arity-ary (a power of two from
/// 2 to 64). Not thread-safe: the replay buffer's concurrency policy serializes access.
template <std::size_t Arity = 16>
class sum_tree {
  static_assert(Arity >= 2 && Arity <= 64 && (Arity & (Arity - 1)) == 0,
                "hone::sum_tree<Arity>: Arity must be a power of two from 2 to 64 (2: binary; "
                "16: one float node per cache line, best beyond the cache).");

 public:
  static constexpr std::size_t arity = Arity;
  /// Samples walked together by find_batch (and updates by set_batch) per chunk.
  static constexpr std::size_t batch_chunk = 512;
  /// How many items ahead set_batch prefetches the lines it will write.
  static constexpr std::size_t prefetch_distance = 16;

  sum_tree() = default;
  /// A tree over `capacity` leaves, all 0.
  explicit sum_tree(std::size_t capacity)
      : layout_(detail::sum_tree_layout::make(Arity, capacity)),
        leaves_(detail::huge_buffer(layout_.leaves, 0.0f)),
        sums_(detail::huge_buffer(layout_.entries, 0.0)),
        mins_(detail::huge_buffer(layout_.entries, std::numeric_limits<float>::infinity())) {}

  [[nodiscard]] std::size_t capacity() const noexcept { return layout_.capacity; }
  [[nodiscard]] std::size_t depth() const noexcept { return layout_.depth; }
  [[nodiscard]] const detail::sum_tree_layout& layout() const noexcept { return layout_; }

  /// Sum of all leaves.
  [[nodiscard]] double total() const noexcept { return total_; }
  /// Smallest positive leaf; +inf when every leaf is 0.
  [[nodiscard]] float min() const noexcept { return min_; }
  [[nodiscard]] float get(std::size_t i) const noexcept { return leaves_[i]; }

  /// Sets leaf i to p (p >= 0, finite; checked by the samplers) and recomputes its path.
  void set(std::size_t i, float p) noexcept {
    with_isa([&](auto wide) {
      leaves_[i] = p;
      std::size_t e = i / Arity;
      for (std::size_t l = layout_.depth; l-- > 0;) {
        recompute(l, e, wide);
        e /= Arity;
      }
      recompute_top(wide);
    });
  }

  /// Sets leaves idx[k] to p[k] (in order: a repeated index keeps its last value), then
  /// recomputes the touched entries level by level (each once per level when a level has fewer
  /// entries than the batch).
  void set_batch(std::span<const std::size_t> idx, std::span<const float> p) noexcept {
    const std::size_t n = idx.size();
    for (std::size_t k = 0; k < n; ++k) {
      if (k + prefetch_distance < n)
        HONE_PREFETCH_WRITE(leaves_.data() + idx[k + prefetch_distance]);
      leaves_[idx[k]] = p[k];
    }
    with_isa([&](auto wide) { recompute_paths(idx, wide); });
  }

  /// Sets n leaves from `first` on (no wrap) to the same value: the adds of a batch.
  void fill(std::size_t first, std::size_t n, float p) noexcept {
    if (n == 0) return;
    std::fill_n(leaves_.data() + first, n, p);
    with_isa([&](auto wide) {
      std::size_t lo = first / Arity;
      std::size_t hi = (first + n - 1) / Arity;
      for (std::size_t l = layout_.depth; l-- > 0;) {
        for (std::size_t e = lo; e <= hi; ++e) recompute(l, e, wide);
        lo /= Arity;
        hi /= Arity;
      }
      recompute_top(wide);
    });
  }

  /// Replaces every leaf (values.size() == capacity()) and rebuilds all sums in O(N): restoring a
  /// saved buffer.
  void assign(std::span<const float> values) {
    HONE_REQUIRE(values.size() == layout_.capacity,
                 "hone::sum_tree::assign: expected " + std::to_string(layout_.capacity) +
                     " priorities, got " + std::to_string(values.size()));
    std::copy(values.begin(), values.end(), leaves_.data());
    std::fill(leaves_.data() + layout_.capacity, leaves_.data() + layout_.leaves, 0.0f);
    rebuild();
  }

  /// Recomputes every sum from the leaves.
  void rebuild() noexcept {
    with_isa([&](auto wide) {
      for (std::size_t l = layout_.depth; l-- > 0;) {
        for (std::size_t e = 0; e < layout_.used[l]; ++e) recompute(l, e, wide);
      }
      recompute_top(wide);
    });
  }

  /// The leaf whose prefix interval holds `target` (0 <= target < total(); a target at or past
  /// the end gives the last positive leaf). total() must be positive.
  [[nodiscard]] std::size_t find(double target) const noexcept {
    return with_isa([&](auto wide) {
      double u = target;
      std::size_t node = 0;
      for (std::size_t l = 0; l < layout_.depth; ++l) {
        node = node * Arity +
               detail::find_child<Arity>(sums_.data() + layout_.offset[l] + node * Arity, u, wide);
      }
      return node * Arity + detail::find_child<Arity>(leaves_.data() + node * Arity, u, wide);
    });
  }

  /// find() for every target, the walks advanced level by level together (their memory reads
  /// overlap), with the next level's nodes prefetched. On a level with few nodes (the top ones:
  /// 1, Arity, ... nodes for hundreds of walks) each node's interval ends are formed once and
  /// every walk through it only compares: the same arithmetic, so the same leaves, bit for bit.
  void find_batch(std::span<const double> targets, std::span<std::size_t> out) const noexcept {
    with_isa([&](auto wide) { find_batch(targets, out, wide); });
  }

 private:
  template <bool Wide>
  void find_batch(std::span<const double> targets, std::span<std::size_t> out,
                  std::bool_constant<Wide> wide) const noexcept {
    for (std::size_t begin = 0; begin < targets.size(); begin += batch_chunk) {
      const std::size_t n = std::min(batch_chunk, targets.size() - begin);
      double u[batch_chunk];
      std::size_t* node = out.data() + begin;
      for (std::size_t s = 0; s < n; ++s) {
        u[s] = targets[begin + s];
        node[s] = 0;
      }
      for (std::size_t l = 0; l < layout_.depth; ++l) {
        const double* level = sums_.data() + layout_.offset[l];
        const bool next_is_leaves = l + 1 == layout_.depth;
        const double* next = next_is_leaves ? nullptr : sums_.data() + layout_.offset[l + 1];
        const std::size_t nodes = layout_.size[l] / Arity;
        if (shares_nodes(nodes, n)) {
          double ends[shared_nodes_max * (Arity + 1)];
          for (std::size_t x = 0; x < nodes; ++x) {
            detail::node_ends<Arity>(level + x * Arity, ends + x * (Arity + 1), wide);
          }
          for (std::size_t s = 0; s < n; ++s) {
            const std::size_t child =
                node[s] * Arity + detail::child_from_ends<Arity>(level + node[s] * Arity,
                                                                 ends + node[s] * (Arity + 1), u[s],
                                                                 wide);
            node[s] = child;
            prefetch_child(next, child);
          }
        } else {
          for (std::size_t s = 0; s < n; ++s) {
            const std::size_t child =
                node[s] * Arity + detail::find_child<Arity>(level + node[s] * Arity, u[s], wide);
            node[s] = child;
            prefetch_child(next, child);
          }
        }
      }
      for (std::size_t s = 0; s < n; ++s) {
        node[s] = node[s] * Arity +
                  detail::find_child<Arity>(leaves_.data() + node[s] * Arity, u[s], wide);
      }
    }
  }

 public:
  /// Read-only views of the arrays (tests, the GPU parity test, saving a buffer).
  [[nodiscard]] std::span<const float> leaves() const noexcept {
    return {leaves_.data(), layout_.capacity};
  }
  [[nodiscard]] std::span<const double> sums() const noexcept { return sums_.view(); }
  [[nodiscard]] std::span<const float> mins() const noexcept { return mins_.view(); }

 private:
  /// Most nodes of one level whose ends find_batch forms once per batch (a 17 x 64 doubles
  /// scratch for Arity 16).
  static constexpr std::size_t shared_nodes_max = 1024 / Arity;
  /// Whether find_batch forms the ends of a level's `nodes` once for `walks` walks: when there
  /// are at least 4 walks per node (with fewer, most nodes would be visited once or never).
  static constexpr bool shares_nodes(std::size_t nodes, std::size_t walks) noexcept {
    return nodes <= shared_nodes_max && nodes * 4 <= walks;
  }
  // Prefetches node `child` of the level `next` (its leaves when next is null).
  void prefetch_child(const double* next, std::size_t child) const noexcept {
    if (next == nullptr) {
      HONE_PREFETCH(leaves_.data() + child * Arity);
    } else {
      HONE_PREFETCH(next + child * Arity);
      if constexpr (Arity * sizeof(double) > 64) HONE_PREFETCH(next + child * Arity + 8);
    }
  }

  /// Runs f(wide) once: with the AVX-512 tag when the instruction set hone's loops run on
  /// (hone::active_isa: the CPU's best, or HONE_ISA / force_isa) is AVX-512, inside a function
  /// compiled for it into which the tree's loops and the in-node functions are inlined
  /// (flatten); else with the scalar tag. The two give the same bits (test_rl_avx512).
  template <class F>
  static decltype(auto) with_isa(F&& f) {
#if HONE_DETAIL_SUM_TREE_AVX512
    if (active_isa() == isa::avx512) return run_avx512(f);
#endif
    return f(detail::wide_tag<false>{});
  }
#if HONE_DETAIL_SUM_TREE_AVX512
  template <class F>
  HONE_DETAIL_TARGET_AVX512 HONE_DETAIL_FLATTEN static decltype(auto) run_avx512(F& f) {
    return f(detail::wide_tag<true>{});
  }
#endif

  // Entry e of level l from its Arity children (level l + 1, or the leaves under the last level).
  template <bool Wide>
  void recompute(std::size_t l, std::size_t e, std::bool_constant<Wide> wide) noexcept {
    double* s = sums_.data() + layout_.offset[l];
    float* m = mins_.data() + layout_.offset[l];
    if (l + 1 == layout_.depth) {
      const float* c = leaves_.data() + e * Arity;
      s[e] = detail::node_sum<Arity>(c, wide);
      m[e] = detail::node_min<Arity, true>(c, wide);
    } else {
      const std::size_t child = layout_.offset[l + 1] + e * Arity;
      s[e] = detail::node_sum<Arity>(sums_.data() + child, wide);
      m[e] = detail::node_min<Arity, false>(mins_.data() + child, wide);
    }
  }
  template <bool Wide>
  void recompute_top(std::bool_constant<Wide> wide) noexcept {
    total_ = detail::node_sum<Arity>(sums_.data(), wide);
    min_ = detail::node_min<Arity, false>(mins_.data(), wide);
  }
  template <bool Wide>
  void recompute_paths(std::span<const std::size_t> idx, std::bool_constant<Wide> wide) noexcept {
    std::size_t e[batch_chunk];
    for (std::size_t begin = 0; begin < idx.size(); begin += batch_chunk) {
      const std::size_t n = std::min(batch_chunk, idx.size() - begin);
      for (std::size_t k = 0; k < n; ++k) e[k] = idx[begin + k] / Arity;
      for (std::size_t l = layout_.depth; l-- > 0;) {
        if (layout_.used[l] <= n) {
          for (std::size_t x = 0; x < layout_.used[l]; ++x) recompute(l, x, wide);  // small level
        } else {
          double* s = sums_.data() + layout_.offset[l];
          float* m = mins_.data() + layout_.offset[l];
          std::size_t last = ~std::size_t{0};
          for (std::size_t k = 0; k < n; ++k) {
            if (k + prefetch_distance < n) {
              HONE_PREFETCH_WRITE(s + e[k + prefetch_distance]);
              HONE_PREFETCH_WRITE(m + e[k + prefetch_distance]);
            }
            if (e[k] != last) recompute(l, e[k], wide);
            last = e[k];
          }
        }
        for (std::size_t k = 0; k < n; ++k) e[k] /= Arity;
      }
    }
    recompute_top(wide);
  }

  detail::sum_tree_layout layout_{};
  buffer<float> leaves_;
  buffer<double> sums_;
  buffer<float> mins_;
  double total_ = 0.0;
  float min_ = std::numeric_limits<float>::infinity();
};

HONE_NAMESPACE_END
