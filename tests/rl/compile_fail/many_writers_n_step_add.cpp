// With many writers, n-step windows are per writer: buffer.add would mix streams.
#include <hone/rl/replay_buffer.hpp>
using step = hone::transition<hone::field<"obs", float, 4>, hone::field<"reward", float>,
                              hone::field<"terminated", bool>, hone::field<"truncated", bool>,
                              hone::field<"discount", float>>;
int main() {
  hone::replay_buffer<step, hone::many_writers, hone::n_step<3>> buffer(16);
  buffer.add(step::record{});
  return 0;
}
