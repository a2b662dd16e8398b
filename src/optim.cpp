// hone::compiled: the optimizer code every trainer shares, instantiated once (the headers declare
// these specializations `extern template` with separate compilation): the AdamW host step (with
// and without AMSGrad, each parameter group resolved, the fused pass over the arenas) for
// float, bfloat16 and half gradients, and the gradient norms of clip_grad_norm.
#include "hone/core/bfloat16.hpp"
#include "hone/core/half.hpp"
#include "hone/optim/adamw.hpp"
#include "hone/optim/clipping.hpp"

HONE_NAMESPACE_BEGIN

template void adamw_state<host_space>::step<float>(const adamw&, const optimizer_step_args&, float*,
                                                   const float*, const std::vector<param_group>&);
template void adamw_state<host_space>::step<bfloat16>(const adamw&, const optimizer_step_args&,
                                                      float*, const bfloat16*,
                                                      const std::vector<param_group>&);
template void adamw_state<host_space>::step<half>(const adamw&, const optimizer_step_args&, float*,
                                                  const half*, const std::vector<param_group>&);

#define HONE_CLIPPING_INSTANTIATE(G)                                                     \
  template grad_stats grad_norm_and_check<G>(const G*, std::size_t, float, host_tuning); \
  template clip_result clip_grad_norm::clip<G>(const G*, std::size_t, float, host_tuning) const;
HONE_CLIPPING_INSTANTIATE(float)
HONE_CLIPPING_INSTANTIATE(bfloat16)
HONE_CLIPPING_INSTANTIATE(half)
#undef HONE_CLIPPING_INSTANTIATE

HONE_NAMESPACE_END
