// hone/train.hpp: the train module: hone::trainer (one step skeleton, host backend), its
// accumulation policies and default roles, early stopping and activation recompute. It brings the
// parts of precision, optim and schedule the trainer composes by default; include those modules'
// umbrellas for the rest. The CUDA trainer (train/cuda/trainer.cuh) is included by .cu files only.
#pragma once

#include "hone/train/accumulate.hpp"
#include "hone/train/early_stopping.hpp"
#include "hone/train/host_backend.hpp"
#include "hone/train/policies.hpp"
#include "hone/train/recompute.hpp"
#include "hone/train/trainer.hpp"
