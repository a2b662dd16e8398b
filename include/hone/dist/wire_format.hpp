// hone/dist/wire_format.hpp: hone::wire_format, the element type of gradients on the wire, shared
// by hone::data_parallel (data_parallel_options::wire) and hone::zero (zero_options::wire); and
// what a communicator needs for a 16-bit wire (reduce_scatter and all_gather on spans of
// hone::bfloat16 or hone::half). Included by hone/dist/data_parallel.hpp and hone/dist/zero.hpp.
#pragma once

#include <span>

#include "hone/core/config.hpp"
#include "hone/dist/communicator.hpp"

HONE_NAMESPACE_BEGIN

/// The element type of the gradients on the wire (data_parallel_options::wire,
/// zero_options::wire).
enum class wire_format {
  fp32,  ///< the fp32 gradients as they are (the default)
  bf16,  ///< rounded to hone::bfloat16 (float's range, 8 significant bits)
  fp16   ///< rounded to hone::half (11 significant bits; beyond 65504 becomes inf)
};

[[nodiscard]] constexpr const char* to_string(wire_format w) noexcept {
  return w == wire_format::fp32 ? "fp32" : w == wire_format::bf16 ? "bf16" : "fp16";
}

namespace dist::detail {
/// The communicator runs reduce_scatter (sum) and all_gather on spans of T.
template <class C, class T>
concept carries = requires(C& c, std::span<T> out, std::span<const T> in) {
  { c.reduce_scatter(in, out, reduce_op::sum) } -> request;
  { c.all_gather(in, out) } -> request;
};

/// x = T(float(x) / by) (T = hone::bfloat16 or hone::half; by > 0): the average of a 16-bit
/// wire's reduced block, as an element functor of hone::for_each's vector loop (widened exactly
/// on load, divided in float, rounded to nearest even on store: the scalar form's bits).
struct divide_in_float {
  float by;
  template <class T>
  void operator()(T& x) const noexcept {
    x = T(static_cast<float>(x) / by);
  }
  template <class V>
  void apply(V& x) const noexcept {
    x = x / V(by);
  }
};
}  // namespace dist::detail

HONE_NAMESPACE_END
