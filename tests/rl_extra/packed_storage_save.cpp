// Must not compile: a buffer on hone::packed_storage has no per-field columns, so
// hone::save_replay_buffer refuses it with a sentence naming the storage to use instead.
#include <hone/rl/packed_storage.hpp>
#include <hone/rl/replay_buffer.hpp>
#include <hone/rl/replay_io.hpp>

using step = hone::transition<hone::field<"obs", float, 4>, hone::field<"action", int>>;

int main() {
  hone::replay_buffer<step, hone::packed_storage> buffer(16);
  hone::save_replay_buffer(buffer, "replay");
}
