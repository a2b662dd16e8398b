// bench/rl.cpp (bench_rl): the replay-buffer benchmarks. One core throughout (a buffer call runs
// on the calling thread; every limit runs in a one-thread oneTBB arena).
//
// per_sample_256_{1M,16M,64M}: one sample(256) from a full prioritized buffer of 2^20, 2^24,
//   2^26 CartPole-sized transitions (obs float[4], action int32, reward float, next_obs float[4],
//   terminated, truncated: 42 bytes) whose priorities are random (|TD| uniform in [0, 1),
//   alpha 0.6, beta 0.4): 256 stratified draws, their keys, importance weights and the gathered
//   columns. Microseconds per call. `hone` is the default storage (hone::auto_storage, which
//   picks hone::packed_storage for CartPole: one 44-byte record per item); variants: hone_columns
//   (the same buffer on hone::ring_storage named explicitly: six columns, the same data,
//   priorities and draws), hone_sampler (the 16-ary sampler alone: slots and weights, no data)
//   and hone_sampler_binary (the same with a binary tree).
// per_sample_256_obs{32,64,128,256}_1M: the same call on 2^20 larger transitions, obs and next_obs
//   float[N] (records of 266, 522, 1034 and 2058 bytes; 268, 524, 1036 and 2060 packed), each
//   storage named explicitly: hone_packed and hone_columns (the default, hone::auto_storage, packs
//   records of at most 2048 bytes): what hone::auto_storage's threshold stands on.
// per_update_256_{1M,16M,64M}: one update_priorities(256 keys, 256 values) on the same buffers,
//   keys drawn uniformly over the buffer (1024 pre-drawn batches, cycled). `hone` on the
//   default storage, and the sampler variants.
// uniform_add (on hone::ring_storage, named): add_batch of 65536 transitions of 522 bytes (obs
//   and next_obs float[64], action, reward, terminated, truncated) from a 34 MB source batch into a
//   full uniform ring of 2^20 (522 MB), wrapping around it; bytes = read + written. Limit:
//   stream_limit<uint32, 1, 0, 1> moving the same bytes (a streaming copy: the pattern of the
//   workload).
// uniform_sample_256: sample(256) from that ring: 256 uniform draws and the gather of their
//   columns; bytes = 2 x 256 x 522 (read + written). Limit: the same bytes gathered as 256
//   random 522-byte rows of one contiguous 522 MB row-major table (the best case of any layout:
//   each row is one contiguous run of 9 lines where hone's columns touch 12), every line
//   prefetched before the copies, indices from the same generator.
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <hone/core/buffer.hpp>
#include <hone/rl/packed_storage.hpp>
#include <hone/rl/replay_buffer.hpp>
#include <hone/rl/ring_storage.hpp>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "support/harness.hpp"
#include "support/limit.hpp"

namespace {

using cartpole = hone::transition<hone::field<"obs", float, 4>, hone::field<"action", std::int32_t>,
                                  hone::field<"reward", float>, hone::field<"next_obs", float, 4>,
                                  hone::field<"terminated", bool>, hone::field<"truncated", bool>>;
template <std::size_t N>
using obs_n = hone::transition<hone::field<"obs", float, N>, hone::field<"action", std::int32_t>,
                               hone::field<"reward", float>, hone::field<"next_obs", float, N>,
                               hone::field<"terminated", bool>, hone::field<"truncated", bool>>;
using wide = hone::transition<hone::field<"obs", float, 64>, hone::field<"action", std::int32_t>,
                              hone::field<"reward", float>, hone::field<"next_obs", float, 64>,
                              hone::field<"terminated", bool>, hone::field<"truncated", bool>>;

constexpr std::size_t batch = 256;
constexpr std::size_t key_pool = 1024;
constexpr std::size_t add_rows = std::size_t{1} << 16;
constexpr std::size_t ring_capacity = std::size_t{1} << 20;

const hone::prioritized<16> per_config{.alpha = 0.6, .beta = 0.4};

template <std::size_t A>
hone::prioritized<A> config_of() {
  return hone::prioritized<A>{.alpha = 0.6, .beta = 0.4};
}

/// A batch of n CartPole-like transitions (row i derived from i).
template <class T>
hone::replay_batch<T> source_batch(std::size_t n, std::uint64_t seed) {
  hone::replay_batch<T> b(n);
  hone::replay_rng rng(seed);
  T::for_each_field([&](auto i) {
    using F = typename T::template field_at<i>;
    using E = typename F::element_type;
    auto col = b.template column<i>();
    for (std::size_t k = 0; k < col.size(); ++k) {
      if constexpr (std::is_same_v<E, bool>) {
        col[k] = rng.below(100) == 0;
      } else {
        col[k] = static_cast<E>(rng.below(1000));
      }
    }
  });
  return b;
}

/// Random raw priorities (|TD| in [0, 1)) for keys [0, n), applied in chunks.
template <class Fn>
void randomize_priorities(std::size_t n, std::uint64_t seed, Fn&& apply) {
  hone::replay_rng rng(seed);
  constexpr std::size_t chunk = 1 << 16;
  std::vector<std::uint64_t> keys(chunk);
  std::vector<float> prio(chunk);
  for (std::size_t first = 0; first < n; first += chunk) {
    const std::size_t m = std::min(chunk, n - first);
    for (std::size_t k = 0; k < m; ++k) {
      keys[k] = first + k;
      prio[k] = static_cast<float>(rng.uniform());
    }
    apply(std::span<const std::uint64_t>(keys.data(), m), std::span<const float>(prio.data(), m));
  }
}

// A full prioritized buffer of transitions T with random priorities; Storage... is empty for the
// default storage or names one.
template <class T, class... Storage>
struct per_fixture_on {
  using buffer_t = hone::replay_buffer<T, Storage..., hone::prioritized<16>>;
  explicit per_fixture_on(std::size_t capacity) : buffer(capacity, Storage{}..., per_config) {
    // At most 64 MiB of source rows (the rows repeat in larger buffers; the timing does not read
    // their values).
    const std::size_t rows =
        std::min({capacity, std::size_t{1} << 20, (std::size_t{64} << 20) / T::bytes});
    const auto src = source_batch<T>(rows, 1);
    while (buffer.total_added() < capacity) buffer.add_batch(src);  // full (keys 0..cap-1 +)
    randomize_priorities(capacity, 2, [&](auto keys, auto prio) {
      // Keys of the items in slots [first, first + m) after the fill.
      std::vector<std::uint64_t> k(keys.begin(), keys.end());
      const std::uint64_t base = buffer.total_added() - capacity;
      for (auto& x : k) x += base;
      buffer.update_priorities(k, prio);
    });
    hone::replay_rng rng(3);
    const std::uint64_t base = buffer.total_added() - capacity;
    update_keys.resize(key_pool * batch);
    update_values.resize(key_pool * batch);
    for (std::size_t i = 0; i < update_keys.size(); ++i) {
      update_keys[i] = base + rng.below(capacity);
      update_values[i] = static_cast<float>(rng.uniform());
    }
  }
  buffer_t buffer;
  std::vector<std::uint64_t> update_keys;
  std::vector<float> update_values;
};
using per_fixture = per_fixture_on<cartpole>;  // the default storage (auto: packed records)
using per_columns_fixture = per_fixture_on<cartpole, hone::ring_storage>;
static_assert(
    std::is_same_v<per_fixture::buffer_t::storage_type, hone::packed_records<cartpole>>,
    "bench_rl: the default storage of a CartPole buffer is expected to be packed records");

template <std::size_t A>
struct sampler_fixture {
  explicit sampler_fixture(std::size_t capacity) : sampler(capacity, config_of<A>()) {
    sampler.insert(0, capacity);
    std::vector<std::size_t> slots;
    randomize_priorities(capacity, 2, [&](auto keys, auto prio) {
      slots.assign(keys.begin(), keys.end());
      sampler.update(slots, prio);
    });
    hone::replay_rng rng(3);
    update_slots.resize(key_pool * batch);
    update_values.resize(key_pool * batch);
    for (std::size_t i = 0; i < update_slots.size(); ++i) {
      update_slots[i] = static_cast<std::size_t>(rng.below(capacity));
      update_values[i] = static_cast<float>(rng.uniform());
    }
  }
  hone::prioritized_sampler<A> sampler;
  std::vector<std::size_t> update_slots;
  std::vector<float> update_values;
};

// Fixtures live for the whole program (built on first use): repetitions and random interleaving
// re-enter the benchmarks without refilling.
template <class Fixture>
Fixture& fixture_for(std::size_t capacity) {
  static std::unique_ptr<Fixture> f[3];
  const int i = capacity == (std::size_t{1} << 20) ? 0 : capacity == (std::size_t{1} << 24) ? 1 : 2;
  if (!f[i]) f[i] = std::make_unique<Fixture>(capacity);
  return *f[i];
}

void set_one_core(benchmark::State& state) {
  state.counters["threads"] = 1;
}

template <class Fixture = per_fixture>
void per_sample_hone(benchmark::State& state, std::size_t capacity) {
  auto& f = fixture_for<Fixture>(capacity);
  typename Fixture::buffer_t::batch_type b;
  f.buffer.sample(batch, b);  // warm-up (and allocation of the batch)
  for (auto _ : state) {
    f.buffer.sample(batch, b);
    benchmark::DoNotOptimize(b.keys().data());
    benchmark::ClobberMemory();
  }
  set_one_core(state);
}

template <std::size_t A>
void per_sample_sampler(benchmark::State& state, std::size_t capacity) {
  auto& f = fixture_for<sampler_fixture<A>>(capacity);
  hone::replay_rng rng(4);
  std::vector<std::size_t> slots(batch);
  std::vector<float> weights(batch);
  const auto all = [](std::size_t) { return true; };
  f.sampler.sample(capacity, rng, slots, weights, all);
  for (auto _ : state) {
    f.sampler.sample(capacity, rng, slots, weights, all);
    benchmark::DoNotOptimize(slots.data());
    benchmark::ClobberMemory();
  }
  set_one_core(state);
}

void per_update_hone(benchmark::State& state, std::size_t capacity) {
  auto& f = fixture_for<per_fixture>(capacity);
  std::size_t i = 0;
  for (auto _ : state) {
    const std::size_t off = (i++ % key_pool) * batch;
    benchmark::DoNotOptimize(f.buffer.update_priorities(
        std::span<const std::uint64_t>(f.update_keys.data() + off, batch),
        std::span<const float>(f.update_values.data() + off, batch)));
    benchmark::ClobberMemory();
  }
  set_one_core(state);
}

template <std::size_t A>
void per_update_sampler(benchmark::State& state, std::size_t capacity) {
  auto& f = fixture_for<sampler_fixture<A>>(capacity);
  std::size_t i = 0;
  for (auto _ : state) {
    const std::size_t off = (i++ % key_pool) * batch;
    f.sampler.update(std::span<const std::size_t>(f.update_slots.data() + off, batch),
                     std::span<const float>(f.update_values.data() + off, batch));
    benchmark::ClobberMemory();
  }
  set_one_core(state);
}

// ---- uniform ring ------------------------------------------------------------------------------

struct ring_fixture {
  ring_fixture()
      : buffer(ring_capacity, hone::ring_storage{}), source(source_batch<wide>(add_rows, 5)) {
    while (buffer.total_added() < ring_capacity) buffer.add_batch(source);
  }
  // Columns named explicitly (the default, auto_storage, packs 522-byte records): uniform_add and
  // uniform_sample_256 measure the column ring against its limits, as they always have.
  hone::replay_buffer<wide, hone::ring_storage> buffer;
  hone::replay_batch<wide> source;
};
ring_fixture& ring() {
  static ring_fixture f;
  return f;
}
tbb::task_arena& one_thread() {
  static tbb::task_arena arena(1);
  return arena;
}

void uniform_add_hone(benchmark::State& state) {
  auto& f = ring();
  f.buffer.add_batch(f.source);
  for (auto _ : state) {
    f.buffer.add_batch(f.source);
    benchmark::ClobberMemory();
  }
  hone_bench::report_bytes(state, 2 * add_rows * wide::bytes);
  set_one_core(state);
}

void uniform_add_limit(benchmark::State& state, hone_bench::stream_kernel kernel) {
  // 2 arrays (read, written) of add_rows * wide::bytes bytes each, as 32-bit words.
  static auto* limit = one_thread().execute([] {
    return new hone_bench::stream_limit<std::uint32_t, 1, 0, 1>(add_rows * wide::bytes / 4);
  });
  one_thread().execute([kernel] { limit->run(kernel); });  // warm-up (the arena's first touch)
  for (auto _ : state) {
    one_thread().execute([kernel] { limit->run(kernel); });
    benchmark::ClobberMemory();
  }
  hone_bench::report_bytes(state, limit->bytes_per_pass());
  set_one_core(state);
}

void uniform_sample_hone(benchmark::State& state) {
  auto& f = ring();
  hone::replay_batch<wide> b;
  f.buffer.sample(batch, b);
  for (auto _ : state) {
    f.buffer.sample(batch, b);
    benchmark::DoNotOptimize(b.keys().data());
    benchmark::ClobberMemory();
  }
  hone_bench::report_bytes(state, 2 * batch * wide::bytes);
  set_one_core(state);
}

/// The gather limit: 256 random rows of a row-major table of ring_capacity rows of wide::bytes
/// (each row one contiguous memcpy) into a 256-row destination.
struct gather_limit {
  gather_limit() : table(ring_capacity * wide::bytes), out(batch * wide::bytes), rows(batch) {
    hone::detail::advise_huge_pages(table.data(), table.size_bytes());  // as hone's columns
    std::memset(table.data(), 1, table.size_bytes());
    std::memset(out.data(), 0, out.size_bytes());
  }
  void run() {
    for (std::size_t r = 0; r < batch; ++r) {
      rows[r] = static_cast<std::size_t>(rng.below(ring_capacity));
    }
    // Every line of every row requested first (as hone's gather does), then the copies.
    for (std::size_t r = 0; r < batch; ++r) {
      const std::byte* row = table.data() + rows[r] * wide::bytes;
      for (std::size_t b = 0; b < wide::bytes; b += 64) HONE_PREFETCH(row + b);
      HONE_PREFETCH(row + wide::bytes - 1);
    }
    for (std::size_t r = 0; r < batch; ++r) {
      std::memcpy(out.data() + r * wide::bytes, table.data() + rows[r] * wide::bytes, wide::bytes);
    }
  }
  hone::buffer<std::byte> table;
  hone::buffer<std::byte> out;
  std::vector<std::size_t> rows;
  hone::replay_rng rng{6};
};

void uniform_sample_limit(benchmark::State& state) {
  static gather_limit limit;
  limit.run();
  for (auto _ : state) {
    limit.run();
    benchmark::DoNotOptimize(limit.out.data());
    benchmark::ClobberMemory();
  }
  hone_bench::report_bytes(state, 2 * batch * wide::bytes);
  set_one_core(state);
}

const std::vector<std::pair<std::string, std::size_t>>& per_sizes() {
  static const std::vector<std::pair<std::string, std::size_t>> s{
      {"1M", std::size_t{1} << 20}, {"16M", std::size_t{1} << 24}, {"64M", std::size_t{1} << 26}};
  return s;
}

bool register_benchmarks() {
  for (const auto& [suffix, cap] : per_sizes()) {
    const std::size_t c = cap;
    const std::string sample = "per_sample_256_" + suffix;
    const std::string update = "per_update_256_" + suffix;
    hone_bench::add(sample, "hone", [c](benchmark::State& s) {
      per_sample_hone(s, c);
    })->Unit(benchmark::kMicrosecond);
    hone_bench::add(sample, "hone_columns", [c](benchmark::State& s) {
      per_sample_hone<per_columns_fixture>(s, c);
    })->Unit(benchmark::kMicrosecond);
    hone_bench::add(sample, "hone_sampler", [c](benchmark::State& s) {
      per_sample_sampler<16>(s, c);
    })->Unit(benchmark::kMicrosecond);
    hone_bench::add(sample, "hone_sampler_binary", [c](benchmark::State& s) {
      per_sample_sampler<2>(s, c);
    })->Unit(benchmark::kMicrosecond);
    hone_bench::add(update, "hone", [c](benchmark::State& s) {
      per_update_hone(s, c);
    })->Unit(benchmark::kMicrosecond);
    hone_bench::add(update, "hone_sampler", [c](benchmark::State& s) {
      per_update_sampler<16>(s, c);
    })->Unit(benchmark::kMicrosecond);
    hone_bench::add(update, "hone_sampler_binary", [c](benchmark::State& s) {
      per_update_sampler<2>(s, c);
    })->Unit(benchmark::kMicrosecond);
  }
  const auto add_record_size = [](auto n) {
    using T = obs_n<decltype(n)::value>;
    const std::string name = "per_sample_256_obs" + std::to_string(decltype(n)::value) + "_1M";
    constexpr std::size_t c = std::size_t{1} << 20;
    hone_bench::add(name, "hone_packed", [](benchmark::State& s) {
      per_sample_hone<per_fixture_on<T, hone::packed_storage>>(s, c);
    })->Unit(benchmark::kMicrosecond);
    hone_bench::add(name, "hone_columns", [](benchmark::State& s) {
      per_sample_hone<per_fixture_on<T, hone::ring_storage>>(s, c);
    })->Unit(benchmark::kMicrosecond);
  };
  add_record_size(std::integral_constant<std::size_t, 32>{});
  add_record_size(std::integral_constant<std::size_t, 64>{});
  add_record_size(std::integral_constant<std::size_t, 128>{});
  add_record_size(std::integral_constant<std::size_t, 256>{});
  hone_bench::add("uniform_add", "hone", uniform_add_hone);
  for (const hone_bench::stream_kernel k : hone_bench::stream_kernels) {
    hone_bench::add("uniform_add", hone_bench::limit_impl(k),
                    [k](benchmark::State& s) { uniform_add_limit(s, k); });
  }
  hone_bench::add("uniform_sample_256", "hone", uniform_sample_hone)->Unit(benchmark::kMicrosecond);
  hone_bench::add("uniform_sample_256", "limit", uniform_sample_limit)
      ->Unit(benchmark::kMicrosecond);
  return true;
}

// For the peers (--hone_print_sizes=<workload>): capacity, then batch size.
std::vector<hone_bench::workload_mix> mixes() {
  std::vector<hone_bench::workload_mix> m;
  for (const auto& [suffix, cap] : per_sizes()) {
    const std::size_t c = cap;
    for (const char* w : {"per_sample_256_", "per_update_256_"}) {
      m.push_back({w + suffix, [c] { return std::vector<std::size_t>{c, batch}; }});
    }
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, mixes(), register_benchmarks);
}
