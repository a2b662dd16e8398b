// hone/core/multi_tensor.hpp: lists of tensors processed together. A tensor_lists<Ts...> holds
// `depth` parallel lists (for AdamW: params, grads, exp_avg, exp_avg_sq); entry t of every list
// has the same number of elements. for_each / transform_reduce run one element functor over all
// of them in a single pass, chunked across oneTBB workers (the CPU twin of apex's and PyTorch's
// multi_tensor_apply, which core/cuda/multi_tensor_apply.cuh provides on the GPU). Each chunk runs
// the inner loop of core/parallel.hpp: the functor's vector form where it offers one (hone's
// optimizer functors do; their steps over arenas are this very loop), else the element loop.
//
// The lists hold raw pointers only: they work for host and device memory alike.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/detail/separate_compilation.hpp"
#include "hone/core/device_span.hpp"
#include "hone/core/error.hpp"
#include "hone/core/parallel.hpp"

HONE_NAMESPACE_BEGIN

namespace detail {
// The messages of tensor_lists, out of line: every instantiation shares them.
[[noreturn, gnu::cold]] inline void null_tensor_error(std::size_t n) {
  throw config_error("hone::tensor_lists::add: a tensor of " + std::to_string(n) +
                     " elements has a null pointer; allocate it before adding");
}
[[noreturn, gnu::cold]] inline void list_size_error(std::size_t n, std::size_t m,
                                                    std::size_t list) {
  throw config_error("hone::tensor_lists::add_spans: list " + std::to_string(list) + " has " +
                     std::to_string(m) + " elements but list 0 has " + std::to_string(n) +
                     "; every list must hold a tensor of the same size");
}
}  // namespace detail

template <class... Ts>
class tensor_lists {
  static_assert(sizeof...(Ts) > 0, "hone::tensor_lists needs at least one list");

 public:
  static constexpr std::size_t depth = sizeof...(Ts);
  using pointers = std::tuple<Ts*...>;

  tensor_lists() = default;

  /// Appends one tensor to every list: `n` elements at each pointer. Empty tensors are skipped.
  void add(std::size_t n, Ts*... p) {
    if (n == 0) return;
    if ((... || !p)) detail::null_tensor_error(n);
    sizes_.push_back(n);
    ptrs_.push_back({static_cast<const void*>(p)...});
    total_ += n;
  }
  /// Appends one tensor to every list from spans (std::span or hone::device_span); every span must
  /// have the same size, else config_error names both sizes.
  template <class... Spans>
  requires(sizeof...(Spans) == sizeof...(Ts)) void add_spans(Spans... s) {
    const std::size_t n = std::get<0>(std::forward_as_tuple(s...)).size();
    std::size_t index = 0;
    (check_size(n, s.size(), index++), ...);
    add(n, s.data()...);
  }

  [[nodiscard]] std::size_t size() const noexcept { return sizes_.size(); }
  [[nodiscard]] bool empty() const noexcept { return sizes_.empty(); }
  [[nodiscard]] std::size_t numel(std::size_t t) const { return sizes_.at(t); }
  [[nodiscard]] std::size_t total_numel() const noexcept { return total_; }
  /// The element count of every tensor, in order.
  [[nodiscard]] std::span<const std::size_t> sizes() const noexcept { return sizes_; }
  /// The pointers of tensor t, one per list (std::out_of_range past the end).
  [[nodiscard]] pointers at(std::size_t t) const {
    return typed(ptrs_.at(t), std::index_sequence_for<Ts...>{});
  }
  /// The pointers of tensor t without their element types, as stored (hone's loops over chunks
  /// read them here and cast them back; at() gives them typed).
  [[nodiscard]] const std::array<const void*, depth>& erased(std::size_t t) const {
    return ptrs_.at(t);
  }
  template <std::size_t K>
  [[nodiscard]] auto* pointer(std::size_t t) const {
    using element = std::tuple_element_t<K, std::tuple<Ts...>>;
    return static_cast<element*>(const_cast<void*>(ptrs_.at(t)[K]));
  }

 private:
  template <std::size_t... K>
  static pointers typed(const std::array<const void*, depth>& p, std::index_sequence<K...>) {
    return pointers(static_cast<Ts*>(const_cast<void*>(p[K]))...);
  }
  void check_size(std::size_t n, std::size_t m, std::size_t list) const {
    if (n != m) detail::list_size_error(n, m, list);
  }

  std::vector<std::size_t> sizes_;
  // The pointers are stored without their element types (at() and pointer<K>() give them back):
  // every tensor_lists of the same depth shares one std::vector instantiation, instead of one
  // per combination of element types (a trainer in three precisions had nine).
  std::vector<std::array<const void*, depth>> ptrs_;
  std::size_t total_ = 0;
};

namespace detail {
struct chunk {
  std::size_t tensor, begin, end;
};

/// Splits every tensor into chunks of at most `grain` elements (the task table of one pass).
/// With separate compilation, defined in hone::compiled (src/functions.cpp).
HONE_DETAIL_DECL std::vector<chunk> make_chunks(std::span<const std::size_t> sizes,
                                                std::size_t total, std::size_t grain);
#if HONE_DETAIL_DEFINITIONS
HONE_DETAIL_DECL std::vector<chunk> make_chunks(std::span<const std::size_t> sizes,
                                                std::size_t total, std::size_t grain) {
  std::vector<chunk> chunks;
  chunks.reserve(total / grain + sizes.size());
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const std::size_t n = sizes[t];
    for (std::size_t b = 0; b < n; b += grain)
      chunks.push_back({t, b, b + grain < n ? b + grain : n});
  }
  return chunks;
}
#endif
template <class... Ts>
std::vector<chunk> make_chunks(const tensor_lists<Ts...>& lists, std::size_t grain) {
  return make_chunks(lists.sizes(), lists.total_numel(), grain);
}

template <class Op, class Tuple, std::size_t... K>
inline void apply_chunk(const Op& op, const chunk& c, const Tuple& ptrs,
                        std::index_sequence<K...>) {
  apply_range(op, c.begin, c.end, std::get<K>(ptrs)...);
}
template <class R, class Op, class Reduce, class Tuple, std::size_t... K>
inline R reduce_chunk(const Op& op, const Reduce& reduce, R init, const chunk& c, const Tuple& ptrs,
                      std::index_sequence<K...>) {
  return reduce_range(op, reduce, init, c.begin, c.end, std::get<K>(ptrs)...);
}
// The same over chunk c of `lists`, reading the tensor's stored pointers in place.
template <class Op, class... Ts, std::size_t... K>
inline void apply_chunk(const Op& op, const chunk& c, const tensor_lists<Ts...>& lists,
                        std::index_sequence<K...>) {
  const auto& p = lists.erased(c.tensor);
  apply_range(op, c.begin, c.end, static_cast<Ts*>(const_cast<void*>(p[K]))...);
}
template <class R, class Op, class Reduce, class... Ts, std::size_t... K>
inline R reduce_chunk(const Op& op, const Reduce& reduce, R init, const chunk& c,
                      const tensor_lists<Ts...>& lists, std::index_sequence<K...>) {
  const auto& p = lists.erased(c.tensor);
  return reduce_range(op, reduce, init, c.begin, c.end,
                      static_cast<Ts*>(const_cast<void*>(p[K]))...);
}
}  // namespace detail

/// Runs `op(a[i], b[i], ...)` over every element of every tensor of the lists (host memory), in
/// chunks of tuning.grain elements spread over oneTBB workers. A functor with a vector form
/// (`template <class V> void apply(V&...) const`, see core/detail/simd.hpp) runs it on SIMD
/// registers when every list holds float, bfloat16 or half; then every element,
/// the tail of a tensor included, takes that form and gets the same bits wherever it sits.
template <class Op, class... Ts>
void for_each(const tensor_lists<Ts...>& lists, const Op& op, host_tuning tuning = {}) {
  static_assert(std::is_invocable_v<const Op&, Ts&...>,
                "hone::for_each(tensor_lists): the functor cannot be called with one element "
                "reference per list; its operator() must be const and take (T0&, T1&, ...).");
  if (lists.empty()) return;
  const auto chunks = detail::make_chunks(lists, tuning.grain);
  constexpr auto seq = std::index_sequence_for<Ts...>{};
  if (chunks.size() == 1) {
    detail::apply_chunk(op, chunks[0], lists, seq);
    return;
  }
  detail::parallel_ranges(chunks.size(), 1, [&](std::size_t begin, std::size_t end) {
    for (std::size_t c = begin; c != end; ++c) {
      detail::apply_chunk(op, chunks[c], lists, seq);
    }
  });
}

/// Reduces `op(a[i], ...)` over every element of every tensor with `reduce` (associative, `init`
/// its identity). Deterministic for a given grain, whatever the number of threads.
template <class R, class Op, class Reduce, class... Ts>
R transform_reduce(const tensor_lists<Ts...>& lists, R init, const Op& op, const Reduce& reduce,
                   host_tuning tuning = {}) {
  static_assert(std::is_invocable_r_v<R, const Op&, Ts&...>,
                "hone::transform_reduce(tensor_lists): the functor must take one element "
                "reference per list and return a value convertible to the result type.");
  if (lists.empty()) return init;
  const auto chunks = detail::make_chunks(lists, tuning.grain);
  constexpr auto seq = std::index_sequence_for<Ts...>{};
  return detail::parallel_reduce_ranges(
      chunks.size(), 1, init,
      [&](std::size_t begin, std::size_t end, R acc) {
        for (std::size_t c = begin; c != end; ++c) {
          acc = reduce(acc, detail::reduce_chunk(op, reduce, init, chunks[c], lists, seq));
        }
        return acc;
      },
      reduce);
}

HONE_NAMESPACE_END
