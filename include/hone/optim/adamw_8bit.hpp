// hone/optim/adamw_8bit.hpp: AdamW with both moments stored in 8 bits, block-wise quantized
// (bitsandbytes' AdamW8bit, block size 256 since bitsandbytes 0.44).
//
// The update is AdamW's (hone/optim/adamw.hpp), applied to moments dequantized from 8-bit codes:
// per block of `block` elements, m and v are decoded (code -> dynamic map entry * block absmax),
// updated in fp32 with the block's parameters, the parameters written, and the new moments
// re-encoded with the block's new absmax: m with the signed dynamic map (keeping its sign), v with
// the unsigned map. See hone/optim/quantization.hpp for the maps.
//
// Tensors (slots) with fewer than min_8bit_size elements keep fp32 moments and take exactly the
// fp32 AdamW path (bit-identical to hone::adamw), as bitsandbytes does for tensors under 4096
// elements. State memory: 2 bytes per element of the quantized slots plus 2 floats per block,
// i.e. 2 + 8/256 = 2.03 bytes per parameter against 8 for fp32 AdamW (0.254x).
//
// State tensors (for checkpoints): "exp_avg_codes", "exp_avg_sq_codes" (uint8, one byte per element
// of the quantized slots), "exp_avg_absmax", "exp_avg_sq_absmax" (float, one per block of the
// quantized slots), "exp_avg", "exp_avg_sq" (float, the small slots). Each arena's layout names
// the slots it holds, with the master layout's slot names. AMSGrad is not offered.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "hone/core/arena.hpp"
#include "hone/core/config.hpp"
#include "hone/core/error.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/core/roles.hpp"
#include "hone/core/space.hpp"
#include "hone/optim/adamw.hpp"
#include "hone/optim/detail/simd.hpp"
#include "hone/optim/optimizer.hpp"
#include "hone/optim/quantization.hpp"

HONE_NAMESPACE_BEGIN

template <class Space>
class adamw_8bit_state;

/// 8-bit AdamW hyperparameters: AdamW's (PyTorch defaults) plus the quantization block and the
/// size under which a tensor keeps fp32 moments (bitsandbytes' defaults).
struct adamw_8bit {
  using role = roles::optimizer;
  template <class Space = host_space>
  using state = adamw_8bit_state<Space>;

  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
  std::size_t block = 256;           // power of two in [64, 4096]
  std::size_t min_8bit_size = 4096;  // slots with fewer elements keep fp32 moments
};

/// A quantized slot as the update passes see it (offsets in elements).
struct quantized_slot {
  std::size_t offset;         // in the master / grad arenas
  std::size_t count;          // elements
  std::size_t code_offset;    // in the code arenas
  std::size_t absmax_offset;  // in the absmax arenas (blocks)
};

namespace detail {

/// One quantization block of an 8-bit AdamW step on the host: decode, update (vectorized with the
/// AdamW functor), new absmax, encode. `len` <= block <= 4096. (Moments are finite whenever the
/// gradients are -- the trainer skips a step with inf/NaN gradients; given NaN moments directly,
/// the absmax depends on where the lanes meet the NaN, as it does in the CUDA kernel's tree.)
template <class G>
inline void adamw_8bit_block(const adamw_coefficients& c, const quantization_index& sidx,
                             const quantization_index& uidx, float* p, const G* g, std::uint8_t* qm,
                             std::uint8_t* qv, float* am, float* av, std::size_t len) {
  alignas(64) float m[4096];
  alignas(64) float v[4096];
  len = std::min<std::size_t>(len, 4096);  // the caller guarantees it; tells the compiler too
  const float* smap = sidx.map();
  const float* umap = uidx.map();
  const float am0 = *am;
  const float av0 = *av;
  for (std::size_t j = 0; j < len; ++j) {
    m[j] = smap[qm[j]] * am0;
    v[j] = umap[qv[j]] * av0;
  }
  simd_apply_range(adamw_functor<G>{c}, 0, len,
                   std::tuple<float*, const G*, float*, float*>(p, g, m, v),
                   std::index_sequence_for<float, G, float, float>{});
  // The absmax of each moment over 8 interleaved lanes (8 independent max chains instead of one
  // dependent one; exact for finite moments in any order).
  constexpr std::size_t lanes = 8;
  float lm[lanes] = {};
  float lv[lanes] = {};
  const std::size_t whole = len - len % lanes;
  for (std::size_t i = 0; i < whole; i += lanes) {
    for (std::size_t l = 0; l < lanes; ++l) {
      lm[l] = optim_max(lm[l], std::fabs(m[i + l]));
      lv[l] = optim_max(lv[l], std::fabs(v[i + l]));
    }
  }
  for (std::size_t i = whole; i < len; ++i) {
    lm[0] = optim_max(lm[0], std::fabs(m[i]));
    lv[0] = optim_max(lv[0], std::fabs(v[i]));
  }
  float nm = 0.0f;
  float nv = 0.0f;
  for (std::size_t l = 0; l < lanes; ++l) {
    nm = optim_max(nm, lm[l]);
    nv = optim_max(nv, lv[l]);
  }
  *am = nm;
  *av = nv;
  const float im = nm > 0.0f ? 1.0f / nm : 0.0f;
  const float iv = nv > 0.0f ? 1.0f / nv : 0.0f;
  for (std::size_t j = 0; j < len; ++j) {
    qm[j] = sidx.nearest_keep_sign(m[j] * im, m[j]);
    qv[j] = uidx.nearest(v[j] * iv);
  }
}

}  // namespace detail

/// 8-bit AdamW state (see the file comment for its tensors).
template <class Space = host_space>
class adamw_8bit_state {
 public:
  using space_type = Space;

  adamw_8bit_state(const adamw_8bit& policy, const arena_layout& layout)
      : layout_(validated(policy, layout)),
        block_(policy.block),
        min_8bit_size_(policy.min_8bit_size),
        codes_layout_(1),
        absmax_layout_(sizeof(float)),
        fp32_layout_(sizeof(float)) {
    plan_.reserve(layout_.size());
    for (const auto& s : layout_.slots()) {
      if (s.count >= min_8bit_size_ && s.count > 0) {
        plan_.push_back({true, codes_layout_.add(s.name, s.count)});
        absmax_layout_.add(s.name, (s.count + block_ - 1) / block_);
      } else {
        plan_.push_back({false, fp32_layout_.add(s.name, s.count)});
      }
    }
    exp_avg_codes_ = arena<std::uint8_t, Space>(codes_layout_);
    exp_avg_sq_codes_ = arena<std::uint8_t, Space>(codes_layout_);
    exp_avg_absmax_ = arena<float, Space>(absmax_layout_);
    exp_avg_sq_absmax_ = arena<float, Space>(absmax_layout_);
    exp_avg_ = arena<float, Space>(fp32_layout_);
    exp_avg_sq_ = arena<float, Space>(fp32_layout_);
  }

  [[nodiscard]] const arena_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] std::size_t block() const noexcept { return block_; }
  [[nodiscard]] std::size_t min_8bit_size() const noexcept { return min_8bit_size_; }
  /// Whether slot i (of the master layout) has 8-bit moments.
  [[nodiscard]] bool quantized(std::size_t slot) const { return plan_.at(slot).quantized; }

  [[nodiscard]] arena<std::uint8_t, Space>& exp_avg_codes() noexcept { return exp_avg_codes_; }
  [[nodiscard]] arena<std::uint8_t, Space>& exp_avg_sq_codes() noexcept {
    return exp_avg_sq_codes_;
  }
  [[nodiscard]] arena<float, Space>& exp_avg_absmax() noexcept { return exp_avg_absmax_; }
  [[nodiscard]] arena<float, Space>& exp_avg_sq_absmax() noexcept { return exp_avg_sq_absmax_; }
  [[nodiscard]] arena<float, Space>& exp_avg() noexcept { return exp_avg_; }
  [[nodiscard]] arena<float, Space>& exp_avg_sq() noexcept { return exp_avg_sq_; }

  /// Calls f(name, arena) for every state arena (uint8 and float arenas: f must accept both).
  template <class F>
  void for_each_tensor(F&& f) {
    visit(*this, f);
  }
  template <class F>
  void for_each_tensor(F&& f) const {
    visit(*this, f);
  }

  /// Bytes of optimizer state held.
  [[nodiscard]] std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for_each_tensor([&](std::string_view, const auto& a) { n += a.all().size_bytes(); });
    return n;
  }

  /// The fp32 values of slot `slot`'s moments (decoded for quantized slots), host only.
  void read_moments(std::size_t slot, float* m, float* v) const
      requires(space_traits<Space>::host_accessible) {
    const auto& pl = plan_.at(slot);
    const std::size_t n = layout_[slot].count;
    if (pl.quantized) {
      const auto& cs = codes_layout_[pl.index];
      const auto& as = absmax_layout_[pl.index];
      dequantize_blockwise(exp_avg_codes_.all().data() + cs.offset,
                           exp_avg_absmax_.all().data() + as.offset, n, block_, dynamic_map(true),
                           m);
      dequantize_blockwise(exp_avg_sq_codes_.all().data() + cs.offset,
                           exp_avg_sq_absmax_.all().data() + as.offset, n, block_,
                           dynamic_map(false), v);
    } else {
      const auto& fs = fp32_layout_[pl.index];
      std::copy_n(exp_avg_.all().data() + fs.offset, n, m);
      std::copy_n(exp_avg_sq_.all().data() + fs.offset, n, v);
    }
  }

  /// One 8-bit AdamW step on the host (see adamw_state::step for the arguments).
  template <class G>
  void step(
      const adamw_8bit& policy, const optimizer_step_args& args, float* master, const G* grad,
      const std::vector<param_group>& groups = {}) requires(space_traits<Space>::host_accessible) {
    const quantization_index& sidx = dynamic_map_index(true);
    const quantization_index& uidx = dynamic_map_index(false);
    std::uint8_t* qm = exp_avg_codes_.all().data();
    std::uint8_t* qv = exp_avg_sq_codes_.all().data();
    float* am = exp_avg_absmax_.all().data();
    float* av = exp_avg_sq_absmax_.all().data();
    const std::size_t block = block_;
    for_each_group(
        policy, args, master, grad, groups,
        [](const auto& lists, const auto& op) { detail::simd_for_each(lists, op); },
        [&](const std::vector<quantized_slot>& slots, const adamw_coefficients& c) {
          // Tasks of up to 256 blocks (64 Ki elements at block 256), as the fp32 grain.
          struct task {
            std::size_t slot, first_block, last_block;
          };
          std::vector<task> tasks;
          constexpr std::size_t blocks_per_task = 256;
          for (std::size_t s = 0; s < slots.size(); ++s) {
            const std::size_t nb = (slots[s].count + block - 1) / block;
            for (std::size_t b = 0; b < nb; b += blocks_per_task)
              tasks.push_back({s, b, std::min(nb, b + blocks_per_task)});
          }
          hone::detail::parallel_ranges(tasks.size(), 1, [&](std::size_t first, std::size_t last) {
            for (std::size_t t = first; t != last; ++t) {
              const auto& tk = tasks[t];
              const auto& sl = slots[tk.slot];
              for (std::size_t b = tk.first_block; b < tk.last_block; ++b) {
                const std::size_t e = b * block;
                const std::size_t len = std::min(block, sl.count - e);
                detail::adamw_8bit_block(c, sidx, uidx, master + sl.offset + e,
                                         grad + sl.offset + e, qm + sl.code_offset + e,
                                         qv + sl.code_offset + e, am + sl.absmax_offset + b,
                                         av + sl.absmax_offset + b, len);
              }
            }
          });
        });
  }

  /// Validates, resolves the groups, and per group calls run_fp32(lists, adamw_functor) for the
  /// small slots and run_8bit(quantized slots, coefficients) for the others.
  template <class G, class RunFp32, class Run8bit>
  void for_each_group(const adamw_8bit& policy, const optimizer_step_args& args, float* master,
                      const G* grad, const std::vector<param_group>& groups, RunFp32&& run_fp32,
                      Run8bit&& run_8bit) {
    detail::check_step_args(args, "hone::adamw_8bit");
    detail::check_adam_hyperparameters(detail::step_momentum(args, policy.beta1), policy.beta2,
                                       policy.eps, policy.weight_decay, "hone::adamw_8bit");
    HONE_REQUIRE(policy.block == block_ && policy.min_8bit_size == min_8bit_size_,
                 "hone::adamw_8bit: the policy's block or min_8bit_size differs from the one this "
                 "state was built with; build the state from the same policy");
    HONE_REQUIRE(master != nullptr && grad != nullptr,
                 "hone::adamw_8bit::step: master and grad must point to arenas laid out like the "
                 "state");
    float* m = exp_avg_.all().data();
    float* v = exp_avg_sq_.all().data();
    for (const auto& grp : detail::resolve_groups(layout_, groups, args.lr, policy.weight_decay,
                                                  "hone::adamw_8bit")) {
      const auto c = adamw_coefficients::make(policy.beta1, policy.beta2, policy.eps, args, grp.lr,
                                              grp.weight_decay);
      tensor_lists<float, const G, float, float> small;
      std::vector<quantized_slot> quantized;
      for (std::size_t s : grp.slots) {
        const auto& sl = layout_[s];
        const auto& pl = plan_[s];
        if (pl.quantized) {
          quantized.push_back({sl.offset, sl.count, codes_layout_[pl.index].offset,
                               absmax_layout_[pl.index].offset});
        } else {
          const std::size_t f = fp32_layout_[pl.index].offset;
          small.add(sl.count, master + sl.offset, grad + sl.offset, m + f, v + f);
        }
      }
      if (!small.empty()) run_fp32(small, adamw_functor<G>{c});
      if (!quantized.empty()) run_8bit(quantized, c);
    }
  }

 private:
  struct slot_plan {
    bool quantized;
    std::size_t index;  // in codes_layout_ / absmax_layout_ when quantized, else fp32_layout_
  };

  static const arena_layout& validated(const adamw_8bit& policy, const arena_layout& layout) {
    detail::check_adam_hyperparameters(policy.beta1, policy.beta2, policy.eps, policy.weight_decay,
                                       "hone::adamw_8bit");
    detail::check_block(policy.block, "hone::adamw_8bit");
    return layout;
  }

  template <class Self, class F>
  static void visit(Self& self, F& f) {
    f(std::string_view("exp_avg_codes"), self.exp_avg_codes_);
    f(std::string_view("exp_avg_absmax"), self.exp_avg_absmax_);
    f(std::string_view("exp_avg_sq_codes"), self.exp_avg_sq_codes_);
    f(std::string_view("exp_avg_sq_absmax"), self.exp_avg_sq_absmax_);
    f(std::string_view("exp_avg"), self.exp_avg_);
    f(std::string_view("exp_avg_sq"), self.exp_avg_sq_);
  }

  arena_layout layout_;
  std::size_t block_;
  std::size_t min_8bit_size_;
  arena_layout codes_layout_;
  arena_layout absmax_layout_;
  arena_layout fp32_layout_;
  std::vector<slot_plan> plan_;
  arena<std::uint8_t, Space> exp_avg_codes_;
  arena<std::uint8_t, Space> exp_avg_sq_codes_;
  arena<float, Space> exp_avg_absmax_;
  arena<float, Space> exp_avg_sq_absmax_;
  arena<float, Space> exp_avg_;
  arena<float, Space> exp_avg_sq_;
};

HONE_NAMESPACE_END
