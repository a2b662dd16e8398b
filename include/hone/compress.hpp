// hone/compress.hpp: model compression on the user's own model types and hone's flat arenas: the
// fused distillation loss, magnitude pruning with masks the trainer re-applies, low-rank adapters,
// post-training int8 quantization of a whole model, quantization-aware training of weights and
// activations (docs/compress.md, docs/quant.md).
#pragma once

#include "hone/compress/distill.hpp"
#include "hone/compress/lora.hpp"
#include "hone/compress/lora_io.hpp"
#include "hone/compress/prune.hpp"
#include "hone/compress/prune_checkpoint.hpp"
#include "hone/compress/ptq.hpp"
#include "hone/compress/qat.hpp"
#include "hone/compress/qat_activations.hpp"
#include "hone/compress/qat_activations_per_channel.hpp"
#include "hone/compress/qat_checkpoint.hpp"
#include "hone/compress/quant.hpp"
#include "hone/compress/quant_checkpoint.hpp"
#include "hone/compress/quant_linear.hpp"
#include "hone/compress/sparse24.hpp"
#include "hone/compress/structured.hpp"
