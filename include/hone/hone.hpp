// hone/hone.hpp: umbrella header for every host-compilable hone header. CUDA kernels live in
// .cuh headers under */cuda/ and are included by .cu files only.
#pragma once

#include "hone/core/arena.hpp"
#include "hone/core/buffer.hpp"
#include "hone/core/config.hpp"
#include "hone/core/device_span.hpp"
#include "hone/core/error.hpp"
#include "hone/core/model.hpp"
#include "hone/core/multi_tensor.hpp"
#include "hone/core/numeric.hpp"
#include "hone/core/parallel.hpp"
#include "hone/core/space.hpp"
#include "hone/schedule/schedule.hpp"
#include "hone/train/early_stopping.hpp"
