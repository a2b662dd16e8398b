// bench/frames.cpp (bench_frames): the frame store (hone/rl/frame_store.hpp) on synthetic
// Pong-like 84x84 uint8 frames (constant background, two walls, two paddles and a ball that move
// every step, a changing score pixel), stacks of 4, episodes of 1,000 steps, a full ring of
// 20,000 frames. One core.
//
// frame_store_add/{raw,zstd}: begin_episode/add_step of 20,000 frames (time per call batch);
//   counters frame_store_bytes_per_transition (stored bytes / live transitions: the issue's
//   budget is <= 7.1 KB uncompressed) and, for zstd, frame_store_zstd_ratio (raw frame bytes /
//   stored frame bytes, zstd level 1 per frame).
// frame_store_sample_32/{raw,zstd}: gather of 32 transitions (two 4-stacks each) from the full
//   store; bytes = 2 x 32 x 4 x 7,056 written.
#include <cstddef>
#include <cstdint>
#include <hone/rl/frame_store.hpp>
#include <random>
#include <string>
#include <vector>

#include "support/harness.hpp"

namespace {

constexpr std::size_t side = 84;
constexpr std::size_t frame_px = side * side;
constexpr std::size_t capacity = 20000;
constexpr std::size_t episode_len = 1000;

std::vector<std::uint8_t> pong_frame(std::uint64_t t, std::uint64_t episode) {
  std::vector<std::uint8_t> f(frame_px, 144);
  for (std::size_t x = 0; x < side; ++x) {
    f[(14 + x % 2) * side + x] = 236;
    f[(78 + x % 2) * side + x] = 236;
  }
  auto rect = [&](std::size_t x0, std::size_t y0, std::size_t w, std::size_t h, std::uint8_t v) {
    for (std::size_t y = y0; y < y0 + h && y < side; ++y)
      for (std::size_t x = x0; x < x0 + w && x < side; ++x) f[y * side + x] = v;
  };
  rect(8, 20 + (t * 3 + episode) % 50, 2, 8, 213);
  rect(74, 20 + (t * 5 + 7) % 50, 2, 8, 92);
  rect(10 + (t * 2) % 62, 18 + (t * 3) % 58, 2, 2, 236);
  f[0] = static_cast<std::uint8_t>(t);
  f[1] = static_cast<std::uint8_t>(episode);
  return f;
}

/// The frames of the workload, made once (frame generation is not what is timed).
const std::vector<std::vector<std::uint8_t>>& frames() {
  static const std::vector<std::vector<std::uint8_t>> all = [] {
    std::vector<std::vector<std::uint8_t>> v;
    for (std::uint64_t e = 0; v.size() < capacity; ++e) {
      for (std::uint64_t t = 0; t <= episode_len; ++t) v.push_back(pong_frame(t, e));
    }
    return v;
  }();
  return all;
}

void fill(hone::frame_store& fs) {
  const auto& all = frames();
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::size_t t = i % (episode_len + 1);
    if (t == 0) {
      fs.begin_episode(all[i]);
    } else {
      fs.add_step(0, 0.0f, t == episode_len, all[i]);
    }
  }
}

hone::frame_store_options opts(bool zstd) {
  hone::frame_store_options o;
  o.compress = zstd;
  return o;
}

void bench_add(benchmark::State& state, bool zstd) {
  (void)frames();
  double bpt = 0, ratio = 0;
  for (auto _ : state) {
    hone::frame_store fs(capacity, frame_px, opts(zstd));
    fill(fs);
    bpt = fs.bytes_per_transition();
    ratio = fs.compression_ratio();
    benchmark::DoNotOptimize(bpt);
  }
  hone_bench::report_bytes(state, frames().size() * frame_px);
  state.counters["threads"] = 1;
  state.counters["frame_store_bytes_per_transition"] = bpt;
  if (zstd) state.counters["frame_store_zstd_ratio"] = ratio;
}

void bench_sample(benchmark::State& state, bool zstd) {
  hone::frame_store fs(capacity, frame_px, opts(zstd));
  fill(fs);
  constexpr std::size_t batch = 32;
  std::vector<std::uint64_t> ids(batch);
  std::vector<std::uint8_t> obs(batch * 4 * frame_px), next(batch * 4 * frame_px), term(batch);
  std::vector<std::int32_t> act(batch);
  std::vector<float> rew(batch);
  std::mt19937_64 g(1);
  for (auto _ : state) {
    for (auto& id : ids) id = fs.sample_id(g);
    fs.gather(ids, obs, next, act, rew, term);
    benchmark::DoNotOptimize(obs.data());
  }
  hone_bench::report_bytes(state, 2 * batch * 4 * frame_px);
  state.counters["threads"] = 1;
  state.counters["frame_store_bytes_per_transition"] = fs.bytes_per_transition();
  if (zstd) state.counters["frame_store_zstd_ratio"] = fs.compression_ratio();
}

bool register_benchmarks() {
  for (const bool zstd : {false, true}) {
    const std::string impl = zstd ? "zstd" : "raw";
    hone_bench::add("frame_store_add", impl, [zstd](benchmark::State& s) { bench_add(s, zstd); });
    hone_bench::add("frame_store_sample_32", impl, [zstd](benchmark::State& s) {
      bench_sample(s, zstd);
    })->Unit(benchmark::kMicrosecond);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
