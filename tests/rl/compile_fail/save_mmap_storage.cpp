// A buffer on hone::mmap_storage lives in its own file: save_replay_buffer refuses it.
#include <hone/rl/mmap_storage.hpp>
#include <hone/rl/replay_buffer.hpp>
#include <hone/rl/replay_io.hpp>
using step = hone::transition<hone::field<"obs", float, 4>, hone::field<"reward", float>>;
int main() {
  hone::replay_buffer<step, hone::mmap_storage> buffer(
      16, hone::mmap_storage{.path = "never-created.ring"});
  hone::save_replay_buffer(buffer, "never-created-dir");
  return 0;
}
