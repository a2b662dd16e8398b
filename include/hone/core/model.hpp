// hone/core/model.hpp: how a user's model plugs into hone.
//
//   static_assert(hone::model<MyNet>);             // the first line a user writes
//   static_assert(hone::trainable<MyNet, Batch>);
//
// A model exposes its trainable tensors through parameters(): a range of parameter-like objects
// (name, shape, value view, grad view, in the working precision). A trainable model also has
// forward_backward(batch, loss_scale), which returns the unscaled loss and writes the gradients
// of loss * loss_scale. Types the user cannot change plug in by specializing hone::model_traits.
// hone::check_model<M>() / check_trainable<M, B>() state each missing piece as a sentence.
#pragma once

#include <concepts>
#include <cstddef>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/config.hpp"
#include "hone/core/device_span.hpp"
#include "hone/core/space.hpp"

HONE_NAMESPACE_BEGIN

/// A ready-made parameter record a model's parameters() may return: `value` and `grad` are views
/// of the same length in the working precision T, in `Space` (std::span on the host,
/// hone::device_span on a GPU).
template <class T, class Space = host_space>
struct parameter {
  using value_type = T;
  using view_type = span_for<T, space_traits<Space>::host_accessible>;
  std::string name;
  std::vector<std::size_t> shape;
  view_type value;
  view_type grad;
};

/// What a model's backward may call to say that a parameter's gradient is final: ready(i) with i
/// the parameter's position in parameters(). A model that takes it as a third argument,
/// `float forward_backward(const Batch&, float loss_scale, hone::gradient_ready ready)`, lets a
/// data-parallel trainer start reducing the gradients of the last layers while backward computes
/// the earlier ones (PyTorch DDP's autograd hooks; docs/dist.md, "Overlap with backward").
/// Contract: call it from the thread that runs forward_backward, at most once per parameter and
/// backward, after that parameter's gradients are written, and write them no more in this
/// backward. Parameters never reported are handled after forward_backward returns; a model may
/// report none. A default-constructed gradient_ready does nothing (the model may call it anyway).
class gradient_ready {
 public:
  using callback = void (*)(void* context, std::size_t parameter);
  constexpr gradient_ready() noexcept = default;
  constexpr gradient_ready(callback fn, void* context) noexcept : fn_(fn), context_(context) {}
  /// Parameter `parameter` (its index in parameters()) holds its final gradient.
  void operator()(std::size_t parameter) const {
    if (fn_ != nullptr) fn_(context_, parameter);
  }
  /// Whether anyone listens (false: the calls cost a branch).
  [[nodiscard]] explicit operator bool() const noexcept { return fn_ != nullptr; }

 private:
  callback fn_ = nullptr;
  void* context_ = nullptr;
};

/// Customization point. The primary template forwards to the model's own members; specialize it
/// for a type you cannot change (as mp-units does with quantity_like_traits):
///
///   template <> struct hone::model_traits<their::Net> {
///     static auto parameters(their::Net& n) { ... }
///     static float forward_backward(their::Net& n, const Batch& b, float scale) { ... }
///   };
template <class M>
struct model_traits {
  template <class U = M>
  requires requires(U& m) { m.parameters(); }
  static decltype(auto) parameters(U& m) { return m.parameters(); }
  /// The model's forward_backward(batch, scale), or its forward_backward(batch, scale, ready)
  /// with a gradient_ready that does nothing.
  template <class Batch, class U = M>
  requires(
      requires(U& m, const Batch& b, float s) { m.forward_backward(b, s); } ||
      requires(U & m, const Batch& b, float s, gradient_ready r) {
        m.forward_backward(b, s, r);
      }) static decltype(auto) forward_backward(U& m, const Batch& b, float loss_scale) {
    if constexpr (requires { m.forward_backward(b, loss_scale); }) {
      return m.forward_backward(b, loss_scale);
    } else {
      return m.forward_backward(b, loss_scale, gradient_ready{});
    }
  }
  /// The model's forward_backward(batch, scale, ready), when it reports gradient readiness.
  template <class Batch, class U = M>
  requires requires(U& m, const Batch& b, float s, gradient_ready r) {
    m.forward_backward(b, s, r);
  }
  static decltype(auto) forward_backward(U& m, const Batch& b, float loss_scale,
                                         gradient_ready ready) {
    return m.forward_backward(b, loss_scale, ready);
  }
};

/// M reports gradient readiness for a Batch: forward_backward(batch, loss_scale, gradient_ready).
template <class M, class Batch>
concept reports_gradient_ready = requires(M& m, const Batch& b, float s, gradient_ready r) {
  { model_traits<M>::forward_backward(m, b, s, r) } -> std::convertible_to<float>;
};

/// A parameter record: a name, a shape, and value/grad views of one element type.
template <class P>
concept parameter_like = requires(const P& p) {
  { p.name } -> std::convertible_to<std::string_view>;
  requires std::ranges::range<decltype(p.shape)>;
  { p.value.data() } -> std::same_as<decltype(p.grad.data())>;
  { p.value.size() } -> std::convertible_to<std::size_t>;
  { p.grad.size() } -> std::convertible_to<std::size_t>;
};

/// M has a parameters() function (member, or via model_traits<M>).
template <class M>
concept has_parameters = requires(M& m) {
  { model_traits<M>::parameters(m) } -> std::ranges::input_range;
};

template <class M>
requires has_parameters<M>
using parameter_range_t = decltype(model_traits<M>::parameters(std::declval<M&>()));

/// parameters() yields parameter-like records.
template <class M>
concept parameters_are_parameter_like =
    has_parameters<M> && parameter_like<std::ranges::range_value_t<parameter_range_t<M>>>;

/// A model hone can train: it lists its parameters.
template <class M>
concept model = has_parameters<M> && parameters_are_parameter_like<M>;

/// M can compute gradients for a Batch: forward_backward(batch, loss_scale) -> loss.
template <class M, class Batch>
concept has_forward_backward = requires(M& m, const Batch& b, float s) {
  { model_traits<M>::forward_backward(m, b, s) } -> std::convertible_to<float>;
};

template <class M, class Batch>
concept trainable = model<M> && has_forward_backward<M, Batch>;

/// Compile-time check with one sentence per missing piece; returns true when M is a model.
/// Trainers call it so that the first error a user sees says what to add.
template <class M>
consteval bool check_model() {
  if constexpr (!has_parameters<M>) {
    static_assert(has_parameters<M>,
                  "hone::model: this model type has no member function parameters(). Add "
                  "`std::vector<hone::parameter<float>> parameters()` returning each trainable "
                  "tensor's name, shape, value and grad views, or specialize "
                  "hone::model_traits<YourModel>::parameters for a type you cannot change.");
    return false;
  } else if constexpr (!parameters_are_parameter_like<M>) {
    static_assert(parameters_are_parameter_like<M>,
                  "hone::model: parameters() must return a range whose elements have the members "
                  "`name`, `shape`, `value` and `grad` (value and grad: contiguous views with "
                  "data() and size() of the same element type). hone::parameter<T> has them.");
    return false;
  } else {
    return true;
  }
}

template <class M, class Batch>
consteval bool check_trainable() {
  if constexpr (!check_model<M>()) {
    return false;
  } else if constexpr (!has_forward_backward<M, Batch>) {
    static_assert(has_forward_backward<M, Batch>,
                  "hone::trainable: this model has no member function "
                  "forward_backward(const Batch&, float loss_scale) returning the loss. Add it: "
                  "it runs forward and backward on the batch, writes the gradients of "
                  "loss * loss_scale into the grad views and returns the unscaled loss as float "
                  "(or specialize hone::model_traits<YourModel>::forward_backward).");
    return false;
  } else {
    return true;
  }
}

HONE_NAMESPACE_END
