// The disk ring appends in sequence order from one thread: many_writers cannot use it.
#include <hone/rl/mmap_storage.hpp>
#include <hone/rl/replay_buffer.hpp>
using step = hone::transition<hone::field<"obs", float, 4>, hone::field<"reward", float>>;
int main() {
  hone::replay_buffer<step, hone::mmap_storage, hone::many_writers> buffer(
      16, hone::mmap_storage{.path = "never-created.ring"}, hone::many_writers{});
  return 0;
}
