// tests/checkpoint/fuzz_readers.cpp: libFuzzer target over hone's checkpoint readers: the
// safetensors header and data, the compressed tensor file (index and every chunk), the MANIFEST,
// state.json and the JSON parser under them. Each input is given to every reader. A reader may
// accept the input or throw hone::checkpoint_error; anything else (another exception, a crash, a
// sanitizer report, a leak) is a bug. Accepted inputs must also survive a round trip:
//  - a safetensors file re-written by tensor_writer (same order) reads back identical;
//  - a MANIFEST is canonical: to_string() gives back the input byte for byte;
//  - a state re-serialized by to_json() parses to an equal state.
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/checkpoint/fuzz_readers.cpp -lzstd -ltbb -o fuzz_readers
//   ./fuzz_readers -max_total_time=60 new_units/ tests/checkpoint/corpus tests/checkpoint/seeds
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "readers.hpp"

namespace {

namespace ck = hone::checkpoint;
namespace io = hone::io;

[[noreturn]] void bug() {
  __builtin_trap();
}

void safetensors_round_trip(std::span<const std::byte> in) {
  const auto f = ck::safetensors_file::view(in, "input.safetensors");
  ck::tensor_writer w;
  w.set_order(ck::tensor_order::as_added);
  for (const auto& t : f.tensors()) {
    if (t.name.empty() || t.name == "__metadata__") return;  // readable, but not writable
    w.add(t.name, t.type, t.shape, f.data(t));
  }
  for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
  const auto bytes = w.to_bytes();
  const auto g = ck::safetensors_file::view(bytes, "rewritten.safetensors");
  if (g.tensors().size() != f.tensors().size() || g.metadata() != f.metadata()) bug();
  for (std::size_t i = 0; i < f.tensors().size(); ++i) {
    const auto& a = f.tensors()[i];
    const auto& b = g.tensors()[i];
    if (!(a == b)) bug();
    const auto da = f.data(a);
    const auto db = g.data(b);
    if (da.size() != db.size() || !std::equal(da.begin(), da.end(), db.begin())) bug();
  }
}

void manifest_round_trip(std::string_view in) {
  const auto m = ck::manifest::parse(in, "input.manifest");
  if (m.to_string() != in) bug();
}

void state_round_trip(std::string_view in) {
  const auto s = ck::parse_state(in, "input.json");
  if (!(ck::parse_state(ck::to_json(s), "rewritten.json") == s)) bug();
}

template <class F>
void attempt(F&& f) {
  try {
    f();
  } catch (const hone::checkpoint_error&) {
    // A rejected input: what the readers must do with damage.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  attempt([&] { (void)io::json::parse(text, "input"); });
  attempt([&] { (void)hone_test::read_fully(hone_test::input_kind::safetensors, in); });
  attempt([&] { safetensors_round_trip(in); });
  attempt([&] { (void)hone_test::read_fully(hone_test::input_kind::compressed, in); });
  attempt([&] { manifest_round_trip(text); });
  attempt([&] { state_round_trip(text); });
  return 0;
}
