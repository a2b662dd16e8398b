// Must not compile: hone::zero with a block-quantized optimizer (hone::adamw_8bit). A shard cuts
// tensors, so the state's blocks would not be those of one process; the error must be the
// trainer's sentence naming the element-wise optimizers.
#include <hone/dist/local_comm.hpp>
#include <hone/dist/zero.hpp>
#include <hone/optim/adamw_8bit.hpp>
#include <hone/train/trainer.hpp>

#include "dp_model.hpp"

int main() {
  mlp<float> m;
  hone::dist::local_comm c;
  hone::trainer t(m, hone::adamw_8bit{}, hone::zero<1>(c));
  return 0;
}
