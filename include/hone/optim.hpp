// hone/optim.hpp: the optimizer module: SGD, AdamW, 8-bit AdamW, gradient clipping, parameter
// groups and the optimizer-state concept. Device code (optim/cuda/) is included by .cu files only.
#pragma once

#include "hone/optim/adamw.hpp"
#include "hone/optim/adamw_8bit.hpp"
#include "hone/optim/clipping.hpp"
#include "hone/optim/optimizer.hpp"
#include "hone/optim/param_group.hpp"
#include "hone/optim/quantization.hpp"
#include "hone/optim/sgd.hpp"
