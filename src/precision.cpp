// hone::compiled: the precision passes every trainer of a working type shares, instantiated once
// (the headers declare them `extern template` with separate compilation): the fused
// unscale-accumulate-norm pass and the casts between the fp32 master weights and the working
// weights, for float, bfloat16 and half.
#include "hone/core/bfloat16.hpp"
#include "hone/core/half.hpp"
#include "hone/precision/unscale.hpp"

HONE_NAMESPACE_BEGIN

#define HONE_PRECISION_INSTANTIATE(W)                                                          \
  template double unscale_accumulate_into<W>(const tensor_lists<float, const W>&, float, bool, \
                                             host_tuning);                                     \
  template double unscaled_sum_of_squares<W>(const tensor_lists<float, const W>&, float,       \
                                             host_tuning);                                     \
  template void for_each<cast_to_working<W>, W, const float>(                                  \
      const tensor_lists<W, const float>&, const cast_to_working<W>&, host_tuning);            \
  template void for_each<load_master<W>, float, const W>(const tensor_lists<float, const W>&,  \
                                                         const load_master<W>&, host_tuning);
HONE_PRECISION_INSTANTIATE(float)
HONE_PRECISION_INSTANTIATE(bfloat16)
HONE_PRECISION_INSTANTIATE(half)
#undef HONE_PRECISION_INSTANTIATE

HONE_NAMESPACE_END
