// Must not compile: hone::dist::join on a trainer whose gradient reduction is not
// hone::data_parallel (here the default, local gradients). The error must be join's sentence
// saying to build the trainer with hone::data_parallel(comm, {.uneven_inputs = true}).
#include <hone/dist/data_parallel.hpp>
#include <hone/train/trainer.hpp>

#include "dp_model.hpp"

int main() {
  mlp<float> m;
  hone::trainer t(m);
  (void)hone::dist::join(t);
  return 0;
}
