// hone/offload/optimizer_to_host.hpp: ZeRO-Offload style optimizer offload.
//
// The fp32 master weights and the optimizer state live in host memory; the model's gradients
// (G: float, bfloat16 or half) and working parameters (W: float, bfloat16 or half) live on the
// device. One step:
//  1. the gradients stream device-to-host in buckets of `bucket_bytes` on the transport's side
//     stream, all buckets enqueued at once;
//  2. as soon as bucket b has landed, the host's fused optimizer (the same one the trainer uses)
//     updates the master weights and state of that bucket's elements, while later buckets are
//     still in flight;
//  3. the updated master elements are cast to W into a staging buffer and bucket b streams back.
// With `delayed_update` (ZeRO-Offload's one-step delayed parameter update) steps 2-3 of step k run
// on a host thread while the caller's forward/backward of step k+1 runs; update k reaches the
// device at the start of step k+1's call, after that forward/backward. So the forward/backward
// of step k+1 uses the parameters from before update k:
//   immediate: g_k = grad(p_{k-1}),  p_k = cast(m_k),  m_k = opt(m_{k-1}, g_k)
//   delayed:   g_1 = grad(p_0), g_k = grad(p_{k-2}) for k >= 2, same m_k recursion.
// Master weights and optimizer state are bit-identical to the optimizer applied to the same
// gradient sequence in one pass: the host optimizer is element-wise and gives the same bits
// wherever an element sits (see optim/detail/simd.hpp), so bucket boundaries, even inside a
// tensor, change nothing.
//
//   hone::arena_layout layout(sizeof(float));  ... layout.add(name, n) ...
//   hone::offload::engine<hone::adamw, hone::bfloat16, hone::bfloat16, cuda_transport> off(
//       hone::offload::optimizer_to_host{.bucket_bytes = 8 << 20, .delayed_update = true},
//       hone::adamw{}, layout, cuda_transport(compute_stream));
//   std::ranges::copy(initial, off.master().all().begin());  // fp32 initial weights
//   off.push_params(device_params);
//   for (...) { forward_backward(device_params, device_grads); off.step(args, device_grads,
//                                                                          device_params); }
//   off.flush(device_params);  // delayed mode: the last update reaches the device
//
// Device arrays hold layout.total() elements at the fp32 layout's element offsets (for example
// hone::arena<hone::bfloat16, hone::cuda_space>(layout)). Supported optimizers: the element-wise
// ones with a for_each_group (hone::adamw, hone::sgd); block-quantized states (adamw_8bit) are not.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "hone/core/arena.hpp"
#include "hone/core/bfloat16.hpp"
#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/half.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/core/parallel.hpp"
#include "hone/core/roles.hpp"
#include "hone/offload/transport.hpp"
#include "hone/optim/adamw.hpp"
#include "hone/optim/detail/simd.hpp"
#include "hone/optim/optimizer.hpp"
#include "hone/optim/param_group.hpp"
#include "hone/optim/sgd.hpp"
#include "hone/profile/zone.hpp"

HONE_NAMESPACE_BEGIN
namespace offload {

/// The offload policy (plays roles::offload).
struct optimizer_to_host {
  using role = roles::offload;
  /// Bytes of gradients per bucket (DDP's 25 MB by default). A bucket may end inside a tensor.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// One-step delayed parameter update: the host step of step k overlaps step k+1's
  /// forward/backward, which therefore sees the parameters from before update k.
  bool delayed_update = false;
};

/// A bucket: elements [begin, end) of the flat arena.
struct bucket_range {
  std::size_t begin, end;
  [[nodiscard]] std::size_t size() const noexcept { return end - begin; }
  friend bool operator==(const bucket_range&, const bucket_range&) = default;
};

/// Cuts [0, total) into buckets of bucket_bytes / element_size elements (the last one shorter).
/// Throws config_error when a bucket cannot hold one element.
inline std::vector<bucket_range> make_buckets(std::size_t total, std::size_t bucket_bytes,
                                              std::size_t element_size) {
  HONE_REQUIRE(element_size > 0, "hone::offload::make_buckets: element size must be positive");
  HONE_REQUIRE(bucket_bytes >= element_size,
               "hone::offload::optimizer_to_host: bucket_bytes is " + std::to_string(bucket_bytes) +
                   " but a bucket must hold at least one gradient element (" +
                   std::to_string(element_size) + " bytes); use a few MiB");
  const std::size_t per = bucket_bytes / element_size;
  std::vector<bucket_range> out;
  out.reserve(total / per + 1);
  for (std::size_t b = 0; b < total; b += per) out.push_back({b, std::min(total, b + per)});
  return out;
}

namespace detail {
/// The tensors of `lists` restricted to flat elements [r.begin, r.end), positions measured from
/// `base` through list 0 (the master weights).
template <class... Ts>
tensor_lists<Ts...> restrict_lists(const tensor_lists<Ts...>& lists, const float* base,
                                   bucket_range r) {
  tensor_lists<Ts...> out;
  for (std::size_t t = 0; t < lists.size(); ++t) {
    const auto& ptrs = lists.at(t);
    const auto off = static_cast<std::size_t>(std::get<0>(ptrs) - base);
    const std::size_t lo = std::max(off, r.begin);
    const std::size_t hi = std::min(off + lists.numel(t), r.end);
    if (lo >= hi) continue;
    std::apply([&](auto*... p) { out.add(hi - lo, (p + (lo - off))...); }, ptrs);
  }
  return out;
}

template <class T>
inline constexpr bool offload_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, bfloat16> || std::is_same_v<T, half>;

struct cast_from_master {
  template <class W>
  HONE_HOST_DEVICE void operator()(W& w, const float& m) const {
    w = W(m);
  }
};
}  // namespace detail

/// The offload engine: master weights and optimizer state of `Opt` on the host, gradients G and
/// working parameters W on the "device" reached through Transport.
template <class Opt, class G, class W, class Transport = host_transport>
class engine {
  static_assert(optimizer_policy<Opt>, "hone::offload::engine: Opt must be an optimizer policy");
  static_assert(std::is_same_v<Opt, adamw> || std::is_same_v<Opt, sgd>,
                "hone::offload::engine: the optimizer must be element-wise (hone::adamw or "
                "hone::sgd); block-quantized states cannot be cut into buckets");
  static_assert(detail::offload_element_v<G> && detail::offload_element_v<W>,
                "hone::offload::engine: gradients and working parameters must be float, "
                "hone::bfloat16 or hone::half");
  static_assert(transport<Transport>,
                "hone::offload::engine: Transport does not model hone::offload::transport");

 public:
  using optimizer_type = Opt;
  using state_type = optimizer_state_t<Opt, host_space>;
  using staging_space = typename Transport::staging_space;

  engine(const optimizer_to_host& policy, const Opt& opt, const arena_layout& layout,
         Transport transport = Transport{})
      : policy_(policy),
        opt_(opt),
        buckets_(make_buckets(layout.total(), policy.bucket_bytes, sizeof(G))),
        master_(layout),
        state_(opt, layout),
        transport_(std::move(transport)),
        grad_stage_(layout.total()),
        param_stage_(layout.total()) {
    transport_.prepare(buckets_.size());
    space_traits<staging_space>::zero(grad_stage_.data(), grad_stage_.size_bytes());
  }
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;
  /// Waits for a pending delayed update (its result is dropped if flush was not called).
  ~engine() {
    if (job_.joinable()) job_.join();
  }

  [[nodiscard]] const optimizer_to_host& policy() const noexcept { return policy_; }
  [[nodiscard]] const std::vector<bucket_range>& buckets() const noexcept { return buckets_; }
  /// fp32 master weights (host). Write the initial weights here, then call push_params.
  [[nodiscard]] arena<float, host_space>& master() noexcept { return master_; }
  [[nodiscard]] const arena<float, host_space>& master() const noexcept { return master_; }
  [[nodiscard]] state_type& state() noexcept { return state_; }
  [[nodiscard]] const state_type& state() const noexcept { return state_; }
  [[nodiscard]] Transport& transport() noexcept { return transport_; }
  /// Whether a delayed update is computed or waiting to be published. While it is, master() and
  /// state() are being written by the engine's worker thread: call flush() before reading them.
  [[nodiscard]] bool pending() const noexcept { return pending_; }

  /// Delayed mode: waits for the pending host step without publishing it (master() and state()
  /// may then be read or written; pending() stays true until flush or push_params). Rethrows an
  /// error of the host step. Immediate mode: nothing to do.
  void wait() { finish_job(); }

  /// Casts the master weights to W and copies them to `device_params` (waits for the copies).
  /// A pending delayed update is finished first.
  void push_params(W* device_params) {
    HONE_REQUIRE(device_params != nullptr, "hone::offload::engine::push_params: null parameters");
    finish_job();
    pending_ = false;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      transport_.wait_to_device(b);
      cast_bucket(buckets_[b]);
    }
    publish(device_params);
    transport_.synchronize();
  }

  /// One optimizer step on the gradients at `device_grads` (G, layout.total() elements). Immediate
  /// mode: returns when the updated parameters are in `device_params`. Delayed mode: publishes
  /// the previous step's update to `device_params`, copies these gradients to the host and
  /// returns while the host step runs. Argument errors are thrown here, in both modes; an error
  /// inside a delayed host step is rethrown by the next step, flush or push_params.
  void step(const optimizer_step_args& args, const G* device_grads, W* device_params,
            const std::vector<param_group>& groups = {}) {
    HONE_REQUIRE(device_grads != nullptr && device_params != nullptr,
                 "hone::offload::engine::step: device gradients and parameters must not be null");
    HONE_ZONE("hone.offload.step");
    if (policy_.delayed_update) flush(device_params);
    validate(args, groups);
    {
      HONE_ZONE("hone.offload.to_host");  // the copies are issued (async transports)
      transport_.begin_to_host();
      for (std::size_t b = 0; b < buckets_.size(); ++b) {
        const auto r = buckets_[b];
        transport_.to_host(grad_stage_.data() + r.begin, device_grads + r.begin,
                           r.size() * sizeof(G), b);
      }
      transport_.end_to_host();
    }
    if (!policy_.delayed_update) {
      transport_.begin_to_device();
      for (std::size_t b = 0; b < buckets_.size(); ++b) {
        update_bucket(b, args, groups);
        const auto r = buckets_[b];
        transport_.to_device(device_params + r.begin, param_stage_.data() + r.begin,
                             r.size() * sizeof(W), b);
      }
      transport_.end_to_device();
      transport_.synchronize();
      return;
    }
    pending_ = true;
    job_ = std::thread([this, args, groups] {
      profile::set_thread_name("hone.offload.host_step");
      try {
        for (std::size_t b = 0; b < buckets_.size(); ++b) update_bucket(b, args, groups);
      } catch (...) {
        job_error_ = std::current_exception();
      }
    });
  }

  /// Delayed mode: waits for the pending host step and copies its parameters to `device_params`
  /// (stream-ordered after the caller's work; call before the next forward or at the end of
  /// training). Rethrows an error of the host step. Immediate mode: nothing to do.
  void flush(W* device_params) {
    HONE_REQUIRE(device_params != nullptr, "hone::offload::engine::flush: null parameters");
    finish_job();
    if (!pending_) return;
    pending_ = false;
    publish(device_params);
  }

 private:
  void validate(const optimizer_step_args& args, const std::vector<param_group>& groups) {
    // A dry run of the optimizer's checks and group resolution, on the caller's thread.
    state_.for_each_group(opt_, args, master_.all().data(), grad_stage_.data(), groups,
                          [](const auto&, const auto&) {});
  }

  void update_bucket(std::size_t b, const optimizer_step_args& args,
                     const std::vector<param_group>& groups) {
    HONE_ZONE("hone.offload.update");  // wait for the bucket's gradients, step, cast
    const auto r = buckets_[b];
    transport_.wait_to_host(b);
    float* base = master_.all().data();
    state_.for_each_group(opt_, args, base, grad_stage_.data(), groups,
                          [&](const auto& lists, const auto& op) {
                            hone::detail::simd_for_each(detail::restrict_lists(lists, base, r), op);
                          });
    transport_.wait_to_device(b);  // the previous upload of this bucket has left the staging
    cast_bucket(r);
  }

  void cast_bucket(bucket_range r) {
    const float* m = master_.all().data() + r.begin;
    W* w = param_stage_.data() + r.begin;
    if constexpr (std::is_same_v<W, float>) {
      std::copy_n(m, r.size(), w);
    } else {
      hone::for_each(r.size(), detail::cast_from_master{}, w, m);
    }
  }

  void publish(W* device_params) {
    HONE_ZONE("hone.offload.publish");
    transport_.begin_to_device();
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const auto r = buckets_[b];
      transport_.to_device(device_params + r.begin, param_stage_.data() + r.begin,
                           r.size() * sizeof(W), b);
    }
    transport_.end_to_device();
  }

  void finish_job() {
    if (job_.joinable()) job_.join();
    if (job_error_) {
      pending_ = false;
      std::rethrow_exception(std::exchange(job_error_, nullptr));
    }
  }

  optimizer_to_host policy_;
  Opt opt_;
  std::vector<bucket_range> buckets_;
  arena<float, host_space> master_;
  state_type state_;
  Transport transport_;
  buffer<G, staging_space> grad_stage_;
  buffer<W, staging_space> param_stage_;
  std::thread job_;
  std::exception_ptr job_error_;
  bool pending_ = false;
};

}  // namespace offload
HONE_NAMESPACE_END
