// hone/schedule.hpp: the schedule module: the schedule concept and the constant, linear warmup,
// cosine, OneCycle and warmup-stable-decay schedules.
#pragma once

#include "hone/schedule/common.hpp"
#include "hone/schedule/constant.hpp"
#include "hone/schedule/cosine.hpp"
#include "hone/schedule/linear_warmup.hpp"
#include "hone/schedule/one_cycle.hpp"
#include "hone/schedule/schedule.hpp"
#include "hone/schedule/wsd.hpp"
