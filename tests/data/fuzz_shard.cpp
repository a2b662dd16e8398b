// tests/data/fuzz_shard.cpp: libFuzzer target over hone's record shard reader
// (hone/data/shard.hpp). Each input is read as a shard twice: as it is, and "resealed": every
// checksum the layout holds (each frame's compressed and decoded XXH3-64, the index's, the
// footer's) recomputed over the damaged bytes, so the fuzzer gets past the checksums to the
// structural checks behind them (index entries, zstd frames, record tables). The reader may accept
// an input or throw hone::io::format_error; anything else (another exception, a crash, a sanitizer
// report, a leak) is a bug. An accepted shard must also be self-consistent: its records' sizes and
// record tables add up to its frames' decoded sizes, and a record read through a fresh
// shard_record equals the one read through a reused one.
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/data/fuzz_shard.cpp -lzstd -ltbb -o fuzz_shard
//   ./fuzz_shard -max_total_time=60 new_units/ tests/data/shard_seeds
#include <zstd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <hone/data/shard.hpp>
#include <hone/io/hash.hpp>
#include <span>
#include <vector>

namespace {

namespace data = hone::data;
namespace io = hone::io;

[[noreturn]] void bug() {
  __builtin_trap();
}

std::uint64_t get64(const std::vector<std::byte>& b, std::size_t at) {
  return data::detail::shard_get64(b.data() + at);
}
void put64(std::vector<std::byte>& b, std::size_t at, std::uint64_t v) {
  data::detail::shard_put64(b.data() + at, v);
}

/// Recomputes the checksums of a shard-shaped input in place (what a writer would have stored).
void reseal(std::vector<std::byte>& b) {
  constexpr std::size_t footer_bytes = data::detail::shard_footer_bytes;
  constexpr std::size_t entry = data::detail::shard_entry_bytes;
  if (b.size() < data::detail::shard_header_bytes + footer_bytes) return;
  const std::size_t footer = b.size() - footer_bytes;
  const std::uint64_t index = get64(b, footer + 8);
  if (index < data::detail::shard_header_bytes || index > footer || (footer - index) % entry != 0) {
    return;
  }
  std::vector<std::byte> decoded;
  for (std::size_t e = static_cast<std::size_t>(index); e < footer; e += entry) {
    const std::uint64_t off = get64(b, e), size = get64(b, e + 8), want = get64(b, e + 16);
    if (off > index || size > index - off) continue;
    const std::span<const std::byte> frame(b.data() + off, static_cast<std::size_t>(size));
    put64(b, e + 40, io::hash64(frame));
    if (want > (std::uint64_t{1} << 20)) continue;
    decoded.resize(static_cast<std::size_t>(want));
    const std::size_t r =
        ZSTD_decompress(decoded.data(), decoded.size(), frame.data(), frame.size());
    if (!ZSTD_isError(r) && r == want) put64(b, e + 48, io::hash64(decoded));
  }
  put64(b, footer + 32,
        io::hash64(std::span<const std::byte>(b.data() + index,
                                              footer - static_cast<std::size_t>(index))));
  put64(b, footer + 40, io::hash64(std::span<const std::byte>(b.data() + footer, 40)));
}

void read_everything(std::span<const std::byte> in) {
  const auto f = data::shard_file::view(in, "input.hshard");
  std::uint64_t decoded = 0, table_and_records = 0;
  for (const auto& e : f.frames()) decoded += e.decoded_bytes;
  data::shard_record r, fresh;
  for (std::size_t i = 0; i < f.size(); ++i) {
    f.get(i, r);
    table_and_records += 8 + r.size();
    if (i % 7 == 0) {
      data::shard_record other;
      f.get(i, other);
      if (other.view() != r.view()) bug();
    }
  }
  if (table_and_records != decoded) bug();
  f.verify();
}

template <class F>
void attempt(F&& f) {
  try {
    f();
  } catch (const io::format_error&) {
    // A rejected input: what the reader must do with damage.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  attempt([&] { read_everything(in); });
  std::vector<std::byte> sealed(in.begin(), in.end());
  reseal(sealed);
  attempt([&] { read_everything(sealed); });
  return 0;
}
