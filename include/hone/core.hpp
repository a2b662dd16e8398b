// hone/core.hpp: the core module, all of it: configuration macros, bfloat16 and half, memory
// spaces, buffers and arenas, device spans, errors, the model concept, the role vocabulary of
// composed types, and hone::for_each over tensor lists on oneTBB. Every other module builds on it.
// Device code (core/cuda/) is included by .cu files only.
#pragma once

#include "hone/core/arena.hpp"
#include "hone/core/bfloat16.hpp"
#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/device_span.hpp"
#include "hone/core/error.hpp"
#include "hone/core/half.hpp"
#include "hone/core/isa.hpp"
#include "hone/core/model.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/core/numeric.hpp"
#include "hone/core/parallel.hpp"
#include "hone/core/roles.hpp"
#include "hone/core/space.hpp"
