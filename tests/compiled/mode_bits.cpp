// The same training and reductions, printed bit for bit (FNV-1a of the bytes, and the losses in
// hex). tests/compiled builds this file twice, header-only (hone::hone) and with separate
// compilation (hone::compiled), and compare_modes.cmake requires both outputs to be identical:
// where the shared code is compiled must not change a single bit. The tensors span several chunks
// of the default grain (64 Ki elements), so the parallel passes and the reduction tree are the
// multi-task ones.
#include <array>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include <hone/optim.hpp>
#include <hone/precision.hpp>
#include <hone/schedule.hpp>
#include <hone/train.hpp>

#include "../support/linear_model.hpp"

namespace {

std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
template <class T>
std::uint64_t hash_of(std::span<const T> s) {
  return fnv1a(s.data(), s.size_bytes());
}
std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

constexpr std::size_t dim = 150000;  // about 2.3 chunks of 64 Ki elements

template <class T, class Precision, class... Policies>
void train(const char* name, Precision precision, const std::vector<batch>& micro,
           Policies... policies) {
  linear<T> net(dim);
  hone::trainer t(net, precision, hone::accumulate::by_count{}, policies...);
  std::printf("%s", name);
  for (int s = 0; s < 6; ++s) {
    const hone::step_report r = t.step(std::span<const batch>(micro));
    std::printf(" %08" PRIx32 "/%08" PRIx32, bits(r.loss), bits(static_cast<float>(r.grad_norm)));
  }
  std::printf(" master %016" PRIx64 " working %016" PRIx64 " %016" PRIx64 "\n",
              hash_of<float>(t.master_weights()), hash_of<T>(net.w), hash_of<T>(net.b));
}

struct wide_sum {  // a reduction value of 96 bytes (held on the heap by the erased route)
  std::array<double, 12> v{};
};

}  // namespace

int main() {
  std::vector<batch> micro{make_batch(3, dim, 1), make_batch(2, dim, 2), make_batch(4, dim, 3)};
  for (batch& b : micro) {
    for (float& x : b.x) x *= 0.003f;  // inputs and targets of order 1: fp16 gradients stay finite
    for (float& y : b.y) y *= 0.003f;  // once the loss scale has come down
  }
  const hone::one_cycle sched{.max_lr = 3e-3, .total_steps = 10};
  train<float>("fp32 adamw l2", hone::fp32{}, micro, hone::adamw{.weight_decay = 0.01f},
               hone::clip_grad_norm{.max_norm = 0.5f}, sched);
  train<hone::bfloat16>("bf16 adamw l2", hone::bf16_mixed{}, micro,
                        hone::adamw{.weight_decay = 0.01f}, hone::clip_grad_norm{.max_norm = 0.5f},
                        sched);
  train<hone::half>("fp16 adamw l2", hone::fp16_mixed<>{}, micro,
                    hone::adamw{.weight_decay = 0.01f}, hone::clip_grad_norm{.max_norm = 0.5f},
                    sched);
  train<float>(
      "fp32 amsgrad linf", hone::fp32{}, micro, hone::adamw{.amsgrad = true},
      hone::clip_grad_norm{.max_norm = 0.5f, .norm_type = std::numeric_limits<float>::infinity()},
      sched);
  train<hone::bfloat16>("bf16 amsgrad l1", hone::bf16_mixed{}, micro, hone::adamw{.amsgrad = true},
                        hone::clip_grad_norm{.max_norm = 0.5f, .norm_type = 1.0f}, sched);

  // The norms and reductions on their own, over data with a wide spread of magnitudes.
  std::vector<float> g(3 * dim);
  for (std::size_t i = 0; i < g.size(); ++i) {
    g[i] = std::sin(static_cast<float>(i) * 0.37f) * std::exp2(static_cast<float>(i % 29) - 14.0f);
  }
  for (const float p : {1.0f, 2.0f, 3.0f, std::numeric_limits<float>::infinity()}) {
    const hone::clip_result r =
        hone::clip_grad_norm{.max_norm = 1.0f, .norm_type = p}.clip(g.data(), g.size());
    std::printf("norm %g %08" PRIx32 " %08" PRIx32 "\n", static_cast<double>(p), bits(*r.norm),
                bits(r.coefficient));
  }
  const float fmax = hone::transform_reduce(
      g.size(), -std::numeric_limits<float>::infinity(), [](const float& x) { return x; },
      [](float a, float b) { return a > b ? a : b; }, g.data());
  const wide_sum w = hone::transform_reduce(
      g.size(), wide_sum{},
      [](const float& x) {
        wide_sum s;
        for (std::size_t k = 0; k < s.v.size(); ++k) s.v[k] = static_cast<double>(x) * (k + 1);
        return s;
      },
      [](const wide_sum& a, const wide_sum& b) {
        wide_sum s;
        for (std::size_t k = 0; k < s.v.size(); ++k) s.v[k] = a.v[k] + b.v[k];
        return s;
      },
      g.data());
  std::printf("reduce max %08" PRIx32 " wide %016" PRIx64 "\n", bits(fmax),
              fnv1a(w.v.data(), sizeof w.v));
  return 0;
}
