// tests/offload/problem.hpp: a fake model for the offload tests. Its "backward" makes gradients
// (type G) from the working parameters (type W) deterministically, and writes a poison value into
// the arena's padding, which the optimizer must never read into a slot.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <hone/core/arena.hpp>
#include <hone/core/bfloat16.hpp>
#include <hone/core/half.hpp>
#include <hone/optim/optimizer.hpp>
#include <vector>

namespace offload_test {

inline hone::arena_layout layout() {
  hone::arena_layout l(sizeof(float));
  l.add("embed.weight", 1000);
  l.add("block.0.norm.weight", 37);
  l.add("block.0.attn.bias", 5);
  l.add("block.0.mlp.weight", 4099);
  l.add("head.weight", 1);
  l.add("head.bias", 300);
  return l;
}

/// Initial fp32 master weights (padding zero, as an arena's).
inline std::vector<float> initial(const hone::arena_layout& l) {
  std::vector<float> m(l.total(), 0.0f);
  for (std::size_t s = 0; s < l.size(); ++s) {
    for (std::size_t i = 0; i < l[s].count; ++i) {
      m[l[s].offset + i] = 0.5f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(s));
    }
  }
  return m;
}

inline bool in_slot(const hone::arena_layout& l, std::size_t e) {
  for (const auto& s : l.slots()) {
    if (e >= s.offset && e < s.offset + s.count) return true;
  }
  return false;
}

/// grads = backward(params) at step k: a smooth function of the parameter and its position.
template <class G, class W>
void backward(const hone::arena_layout& l, const W* params, G* grads, std::uint64_t k) {
  for (std::size_t e = 0; e < l.total(); ++e) {
    if (!in_slot(l, e)) {
      grads[e] = G(1.0e6f);  // poison in the padding
      continue;
    }
    const float p = static_cast<float>(params[e]);
    grads[e] = G(std::cos(3.0f * p + 0.01f * static_cast<float>(e)) + 0.1f * static_cast<float>(k) -
                 0.2f * p);
  }
}

inline hone::optimizer_step_args args(std::uint64_t k) {
  return {.step = k, .lr = 1e-2f * (1.0f + 0.1f * static_cast<float>(k % 3)), .grad_scale = 0.5f};
}

template <class W>
std::vector<W> cast(const std::vector<float>& m) {
  std::vector<W> w(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) w[i] = W(m[i]);
  return w;
}

template <class T>
bool same_bits(const T* a, const T* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(T)) == 0;
}

/// The reference: the plain host optimizer on the whole arena, with the parameters each
/// forward/backward sees (immediate: p_{k-1}; delayed: p_0 for k = 1, then p_{k-2}).
/// Returns the master weights after n steps; `state` is left as after the last step.
template <class Opt, class G, class W>
std::vector<float> reference(const Opt& opt, hone::optimizer_state_t<Opt>& state,
                             const hone::arena_layout& l, std::uint64_t n, bool delayed,
                             const std::vector<hone::param_group>& groups,
                             std::vector<std::vector<W>>* seen = nullptr) {
  std::vector<float> master = initial(l);
  std::vector<std::vector<W>> p{cast<W>(master)};  // p[j] = cast(m_j)
  std::vector<G> grads(l.total());
  for (std::uint64_t k = 1; k <= n; ++k) {
    const std::size_t used = delayed ? (k >= 2 ? k - 2 : 0) : k - 1;
    if (seen != nullptr) seen->push_back(p[used]);
    backward(l, p[used].data(), grads.data(), k);
    state.step(opt, args(k), master.data(), grads.data(), groups);
    p.push_back(cast<W>(master));
  }
  return master;
}

}  // namespace offload_test
