// hone/core/numeric.hpp: the 16-bit floating-point types, hone::bfloat16 and hone::half.
#pragma once

#include "hone/core/bfloat16.hpp"
#include "hone/core/half.hpp"
