// bench_serve: hone::serve::dynamic_batcher's own cost and its batch fill.
//
// dispatch_overhead/<mode>_b<B>: B requests submitted, batched and answered with a model that
// only copies its inputs, so the time is the batcher's: submit (promise, queue nodes, the mutex),
// forming the batch, the model call, setting the futures, and get(). Counters: per-request time
// of each round (round time / B), p50_ns and p99_ns over the rounds.
//   manual:  one thread submits, calls poll() and gets (no thread hand-off).
//   thread:  one client thread submits B and waits for them; the dispatcher thread forms the
//            batch (a wake-up of the dispatcher and of the client per round are included).
// fill_saturated/hone: two client threads keep 128 requests each in flight against a model that
// busy-waits 20 us per batch (cap 32, delay 500 us); counters: mean_fill (mean batch size / cap),
// batches, requests per second.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <hone/serve.hpp>
#include <span>
#include <thread>
#include <vector>

#include "support/harness.hpp"

namespace {

namespace hs = hone::serve;
using clk = std::chrono::steady_clock;

struct copy_model {
  std::vector<std::uint64_t> infer(std::span<const std::uint64_t> batch) {
    return {batch.begin(), batch.end()};
  }
};

struct busy_model {
  std::chrono::nanoseconds work;
  std::vector<std::uint64_t> infer(std::span<const std::uint64_t> batch) {
    const auto until = clk::now() + work;
    while (clk::now() < until) {
    }
    return {batch.begin(), batch.end()};
  }
};

void report_rounds(benchmark::State& state, const hone::profile::duration_stats& per_request) {
  state.counters["p50_ns"] = per_request.quantile(0.50);
  state.counters["p99_ns"] = per_request.quantile(0.99);
  state.counters["mean_ns"] = per_request.mean();
}

void dispatch_manual(benchmark::State& state, std::size_t b) {
  copy_model m;
  hs::dynamic_batcher<copy_model, std::uint64_t> batcher(
      m, {.max_batch_size = b, .queue_capacity = 4 * b, .mode = hs::dispatch_mode::manual});
  std::vector<hs::request_handle<std::uint64_t>> handles;
  handles.reserve(b);
  hone::profile::duration_stats per_request;
  std::uint64_t sum = 0;
  for (auto _ : state) {
    const auto t0 = clk::now();
    for (std::size_t i = 0; i < b; ++i) handles.push_back(batcher.submit(i));
    const std::size_t k = batcher.poll();
    for (auto& h : handles) sum += h.get();
    const auto t1 = clk::now();
    handles.clear();
    if (k != b) state.SkipWithError("a round did not form one full batch");
    per_request.add(static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count() /
        static_cast<std::int64_t>(b)));
  }
  benchmark::DoNotOptimize(sum);
  report_rounds(state, per_request);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * b));
}

void dispatch_thread(benchmark::State& state, std::size_t b) {
  copy_model m;
  hs::dynamic_batcher<copy_model, std::uint64_t> batcher(
      m, {.max_batch_size = b,
          .max_queue_delay = std::chrono::milliseconds(100),
          .queue_capacity = 4 * b});
  std::vector<hs::request_handle<std::uint64_t>> handles;
  handles.reserve(b);
  hone::profile::duration_stats per_request;
  std::uint64_t sum = 0;
  for (auto _ : state) {
    const auto t0 = clk::now();
    for (std::size_t i = 0; i < b; ++i) handles.push_back(batcher.submit(i));
    for (auto& h : handles) sum += h.get();
    const auto t1 = clk::now();
    handles.clear();
    per_request.add(static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count() /
        static_cast<std::int64_t>(b)));
  }
  benchmark::DoNotOptimize(sum);
  report_rounds(state, per_request);
  const auto s = batcher.stats();
  state.counters["mean_batch"] = s.mean_batch_size;
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * b));
}

void fill_saturated(benchmark::State& state) {
  constexpr std::size_t cap = 32;
  constexpr int clients = 2;
  constexpr std::size_t window = 128;
  constexpr std::size_t per_client = 20000;
  busy_model m{std::chrono::microseconds(20)};
  double fill = 0, batches = 0, seconds = 0, requests = 0;
  for (auto _ : state) {
    hs::dynamic_batcher<busy_model, std::uint64_t> batcher(
        m, {.max_batch_size = cap,
            .max_queue_delay = std::chrono::microseconds(500),
            .queue_capacity = 1024});
    const auto t0 = clk::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&] {
        std::deque<hs::request_handle<std::uint64_t>> inflight;
        std::uint64_t sum = 0;
        for (std::size_t i = 0; i < per_client; ++i) {
          if (inflight.size() == window) {
            sum += inflight.front().get();
            inflight.pop_front();
          }
          inflight.push_back(batcher.submit(i));
        }
        for (auto& h : inflight) sum += h.get();
        benchmark::DoNotOptimize(sum);
      });
    }
    for (auto& t : threads) t.join();
    const auto t1 = clk::now();
    const auto s = batcher.stats();
    fill = s.mean_fill;
    batches = static_cast<double>(s.batches);
    requests = static_cast<double>(s.run);
    seconds = std::chrono::duration<double>(t1 - t0).count();
  }
  state.counters["mean_fill"] = fill;
  state.counters["batches"] = batches;
  state.counters["requests_per_s"] = requests / seconds;
}

bool register_benchmarks() {
  for (const std::size_t b : {std::size_t{1}, std::size_t{32}}) {
    const std::string suffix = "_b" + std::to_string(b);
    hone_bench::register_named("dispatch_overhead/manual" + suffix, [b](benchmark::State& s) {
      dispatch_manual(s, b);
    })->Unit(benchmark::kMicrosecond);
    hone_bench::register_named("dispatch_overhead/thread" + suffix, [b](benchmark::State& s) {
      dispatch_thread(s, b);
    })->Unit(benchmark::kMicrosecond);
  }
  hone_bench::add("fill_saturated", "hone", fill_saturated)->Iterations(1);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
