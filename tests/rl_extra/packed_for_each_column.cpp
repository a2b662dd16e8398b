// Must not compile: a buffer on hone::packed_storage keeps each transition in one record and has no
// per-field columns, so replay_buffer::for_each_column refuses it with a sentence naming the
// storage to use instead (saving and loading work: test_rl_extra_replay_io).
#include <cstddef>
#include <hone/rl/packed_storage.hpp>
#include <hone/rl/replay_buffer.hpp>
#include <span>
#include <string_view>

using step = hone::transition<hone::field<"obs", float, 4>, hone::field<"action", int>>;

int main() {
  hone::replay_buffer<step, hone::packed_storage> buffer(16);
  buffer.for_each_column([](std::string_view, std::span<std::byte>) {});
}
