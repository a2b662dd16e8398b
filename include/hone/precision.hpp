// hone/precision.hpp: the precision module: the fp32, bf16_mixed and fp16_mixed policies, static
// and dynamic loss scaling, and the fused unscale pass. Device code (precision/cuda/) is included
// by .cu files only.
#pragma once

#include "hone/precision/loss_scale.hpp"
#include "hone/precision/policies.hpp"
#include "hone/precision/unscale.hpp"
