// bench/support/fixed_grad_model.hpp: the model of the trainer-step benchmarks (bench_optim's
// trainer_overhead, bench_profile's trainer_step): its backward pass leaves precomputed gradients,
// so a step times the trainer itself. forward_backward copies the gradients from a fixed buffer
// into the gradient views; weights and gradients live in arenas laid out like the trainer's
// (optim_layout), so the trainer uses the fp32 weights as its master weights in place (zero
// copy). Weights start at 0.5 + (i % 1024) / 1024 and the fixed gradients at 0.25 + the same,
// written on the oneTBB workers (hone_bench::fill_pattern).
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <cstddef>
#include <hone/core/arena.hpp>
#include <hone/core/model.hpp>
#include <hone/core/multi_tensor.hpp>
#include <hone/core/parallel.hpp>
#include <vector>

#include "support/optim_data.hpp"

namespace hone_bench {

/// Fills p[0, n) with base + (i % 1024) / 1024 (the values of bench_core's tensors) on the oneTBB
/// workers.
template <class T>
void fill_pattern(T* p, std::size_t n, float base) {
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, std::size_t{1} << 16),
                    [p, base](const tbb::blocked_range<std::size_t>& r) {
                      for (std::size_t i = r.begin(); i != r.end(); ++i) {
                        p[i] = T(base + static_cast<float>(i % 1024) * (1.0f / 1024.0f));
                      }
                    });
}

/// The batch of fixed_grad_model: nothing (the gradients are fixed).
struct no_batch {};

/// See the top of this header.
struct fixed_grad_model {
  hone::arena_layout layout;
  hone::arena<float> weights;
  hone::arena<float> grads;
  hone::arena<float> fixed;
  std::size_t params = 0;

  explicit fixed_grad_model(const std::vector<std::size_t>& sizes)
      : layout(optim_layout(sizes)), weights(layout), grads(layout), fixed(layout) {
    for (std::size_t n : sizes) params += n;
    fill_pattern(weights.all().data(), layout.total(), 0.5f);
    fill_pattern(fixed.all().data(), layout.total(), 0.25f);
  }

  std::vector<hone::parameter<float>> parameters() {
    std::vector<hone::parameter<float>> ps;
    ps.reserve(layout.size());
    for (std::size_t i = 0; i < layout.size(); ++i) {
      ps.push_back({layout[i].name, {layout[i].count}, weights.view(i), grads.view(i)});
    }
    return ps;
  }

  float forward_backward(const no_batch&, float /*loss_scale*/) {
    struct copy {
      void operator()(float& g, const float& f) const { g = f; }
    };
    hone::for_each(layout.total(), copy{}, grads.all().data(),
                   static_cast<const float*>(fixed.all().data()));
    return 1.0f;
  }
};

}  // namespace hone_bench
