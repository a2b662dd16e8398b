// A type that is not a replay policy is caught, not ignored.
#include <hone/rl/replay_buffer.hpp>
using step = hone::transition<hone::field<"obs", float, 4>>;
struct fast {};
int main() {
  hone::replay_buffer<step, fast> buffer(16);
  return static_cast<int>(buffer.capacity());
}
