// Must not compile: a weight constraint policy without after_update(trainer&) is refused with a
// sentence when the trainer steps.
#include <hone/train.hpp>

#include "../support/linear_model.hpp"

struct no_hook {
  using role = hone::roles::weight_constraint;
};

int main() {
  linear<float> net(4);
  hone::trainer<linear<float>, hone::sgd, no_hook> t(net, hone::sgd{0.1f}, no_hook{});
  t.step(make_batch(2, 4, 1));
}
