// hone/precision/unscale.hpp: the one fused pass per micro-batch that unscales the working
// gradients, accumulates them into the fp32 master gradients and, in the same pass, sums the
// squares of the result (PyTorch's _amp_foreach_non_finite_check_and_unscale_, the accumulation
// and the first half of clip_grad_norm_, in one read of the gradients and one write of the master
// gradients).
//
// The sum doubles as the overflow check: squares of floats cannot overflow a double (and
// n * FLT_MAX^2 < DBL_MAX for any n that fits in memory), so the sum is non-finite exactly when
// some gradient was inf or NaN.
#pragma once

#include "hone/core/bfloat16.hpp"
#include "hone/core/config.hpp"
#include "hone/core/half.hpp"
#include "hone/core/multi_tensor.hpp"

HONE_NAMESPACE_BEGIN

/// master = factor * g (first micro-batch) or master += factor * g (the others); returns the
/// square of the new master value in double. `factor` = micro-batch weight / loss scale.
template <class G, bool Accumulate>
struct unscale_accumulate {
  float factor;
  HONE_HOST_DEVICE double operator()(float& master, const G& g) const {
#if defined(__CUDA_ARCH__)
    // One rounding per operation, as on the host: no fused multiply-add contraction, so the
    // device's master gradients are the host's bit for bit.
    const float x = __fmul_rn(factor, static_cast<float>(g));
    if constexpr (Accumulate) {
      master = __fadd_rn(master, x);
    } else {
      master = x;
    }
#else
    const float x = factor * static_cast<float>(g);
    if constexpr (Accumulate) {
      master += x;
    } else {
      master = x;
    }
#endif
    const auto m = static_cast<double>(master);
    return m * m;
  }
};

/// Runs unscale_accumulate over (master grads, working grads) lists on the host and returns the
/// sum of squares of the master gradients afterwards (non-finite when any gradient was).
template <class G>
double unscale_accumulate_into(const tensor_lists<float, const G>& lists, float factor,
                               bool accumulate, host_tuning tuning = {}) {
  return accumulate
             ? transform_reduce(lists, 0.0, unscale_accumulate<G, true>{factor}, plus{}, tuning)
             : transform_reduce(lists, 0.0, unscale_accumulate<G, false>{factor}, plus{}, tuning);
}

/// working = W(master): the cast back to the working precision after an update.
template <class W>
struct cast_to_working {
  HONE_HOST_DEVICE void operator()(W& working, const float& master) const {
    working = static_cast<W>(master);
  }
};

/// master = float(working): loading the master copy from the model's weights.
template <class W>
struct load_master {
  HONE_HOST_DEVICE void operator()(float& master, const W& working) const {
    master = static_cast<float>(working);
  }
};

HONE_NAMESPACE_END
