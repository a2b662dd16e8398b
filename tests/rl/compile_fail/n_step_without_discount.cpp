// n-step returns need a discount field for gamma^k.
#include <hone/rl/replay_buffer.hpp>
using step = hone::transition<hone::field<"obs", float, 4>, hone::field<"reward", float>,
                              hone::field<"terminated", bool>, hone::field<"truncated", bool>>;
int main() {
  hone::replay_buffer<step, hone::n_step<3>> buffer(16);
  return static_cast<int>(buffer.capacity());
}
