// bench_serve: hone::serve::dynamic_batcher's own cost, its batch fill, and its throughput
// against one request at a time at the same p95 latency.
//
// dispatch_overhead/<mode>_b<B>: B requests submitted, batched and answered with a model that
// only copies its inputs, so the time is the batcher's: submit (promise, queue nodes, the mutex),
// forming the batch, the model call, setting the futures, and get(). Counters: per-request time
// of each round (round time / B), p50_ns and p99_ns over the rounds.
//   manual:  one thread submits, calls poll() and gets (no thread hand-off).
//   thread:  one client thread submits B and waits for them; the dispatcher thread forms the
//            batch (a wake-up of the dispatcher and of the client per round are included).
//   caller_runs: thread with batcher_options::caller_runs (B = 1 only): the lone request finds
//            the dispatcher idle and the queue empty, and the cap of 1 forms its batch at once,
//            so submit() runs it on the client's thread (no wake-up); the dispatcher thread
//            exists and stays asleep.
// fill_saturated/hone: two client threads keep 128 requests each in flight against a model that
// busy-waits 20 us per batch (cap 32, delay 500 us); counters: mean_fill (mean batch size / cap),
// batches, requests per second.
// throughput_at_p95_f<F>_i<I>_L<L>/hone: the batcher against one request at a time at the same
// p95 latency. The model busy-waits F us per batch plus I us per request (a fixed part that
// batching amortizes, as a GEMM's launch and weight reads are, and a part that grows with the
// batch). Both modes use the same dynamic_batcher and model: "one" has max_batch_size 1 (each
// request runs as soon as the model is free), "batched" a cap of 32 and a max queue delay of
// 500 us. Open-loop load: one submitter thread submits at Poisson arrival times (seeded) whatever
// the completions, one collector thread waits on the futures in submission order (the batcher
// answers equal priorities in that order) and takes each request's latency from its intended
// arrival time to its future being ready, so a late submitter counts against the batcher. For
// each mode the arrival rate is doubled from 1000/s until a rate fails, then bisected 6 times. A
// rate is three trials (seeds differ) of max(1000, 0.4 s x rate) requests; it passes when the
// median trial has no request refused and a p95 (over the requests after the first 10%) <= L.
// Counters, from the highest passing rate's median trial: completed
// requests/s (one_rps, batched_rps), their p50/p95 (us), ratio = batched_rps / one_rps,
// ideal_ratio = (F + I) / (F / 32 + I) (the ratio of the model's own capacities), batched_fill
// (mean batch size / 32 at that rate), the share of the model's own capacity reached
// (one_of_capacity: rps x (F + I); batched_of_capacity: rps x (F / 32 + I)), and the submitter's
// lateness p95 (late_p95_us). HONE_BENCH_SERVE_TRACE=1 prints every trial to stderr. The target
// is a few milliseconds, the scale of a scheduler time slice: run it where nothing else competes
// for the cores, or under `chrt -f 10` on a shared machine (docs/benchmarks.md, "Serving").
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <hone/serve.hpp>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "support/harness.hpp"

namespace {

namespace hs = hone::serve;
using clk = std::chrono::steady_clock;

struct copy_model {
  std::vector<std::uint64_t> infer(std::span<const std::uint64_t> batch) {
    return {batch.begin(), batch.end()};
  }
};

// copy_model that counts the batches run on a thread other than the one constructing it (the
// caller_runs row checks that every batch ran on the client's thread).
struct caller_check_model {
  std::thread::id client = std::this_thread::get_id();
  std::atomic<std::uint64_t> elsewhere{0};
  std::vector<std::uint64_t> infer(std::span<const std::uint64_t> batch) {
    if (std::this_thread::get_id() != client) elsewhere.fetch_add(1, std::memory_order_relaxed);
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

template <class Model>
void dispatch_thread(benchmark::State& state, std::size_t b, bool caller_runs) {
  Model m;
  hs::dynamic_batcher<Model, std::uint64_t> batcher(
      m, {.max_batch_size = b,
          .max_queue_delay = std::chrono::milliseconds(100),
          .queue_capacity = 4 * b,
          .caller_runs = caller_runs});
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
  if constexpr (std::is_same_v<Model, caller_check_model>) {
    if (m.elsewhere.load() != 0)
      state.SkipWithError("caller_runs: a batch ran on the dispatcher, not in submit()");
  }
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

// The model of throughput_at_p95: busy-waits fixed + per_item x batch size.
struct cost_model {
  std::chrono::nanoseconds fixed;
  std::chrono::nanoseconds per_item;
  std::vector<std::uint64_t> infer(std::span<const std::uint64_t> batch) {
    const auto until = clk::now() + fixed + per_item * static_cast<std::int64_t>(batch.size());
    while (clk::now() < until) {
    }
    return {batch.begin(), batch.end()};
  }
};

// One arrival rate of one mode.
struct load_point {
  double offered = 0;    // requests/s asked for
  double completed = 0;  // requests/s answered, over the measured requests
  double p50_us = 0, p95_us = 0, p99_us = 0;
  double late_p95_us = 0;  // the submitter's lateness against the intended arrival times
  double mean_batch = 0;
  std::uint64_t refused = 0;
  bool pass = false;
};

double quantile_us(std::vector<std::int64_t> ns, double q) {
  if (ns.empty()) return 0;
  const auto k = static_cast<std::size_t>(q * static_cast<double>(ns.size() - 1) + 0.5);
  std::nth_element(ns.begin(), ns.begin() + static_cast<std::ptrdiff_t>(k), ns.end());
  return static_cast<double>(ns[k]) / 1e3;
}

load_point run_load(cost_model& model, const hs::batcher_options& options, double rate,
                    std::chrono::nanoseconds target, std::uint64_t seed) {
  using handle = hs::request_handle<std::uint64_t>;
  const std::size_t n = std::max<std::size_t>(1000, static_cast<std::size_t>(rate * 0.4));
  const std::size_t warm = n / 10;
  std::vector<clk::time_point> intended(n);
  std::vector<clk::time_point> submitted(n);
  std::vector<clk::time_point> done(n);
  std::vector<std::optional<handle>> handles(n);
  std::vector<char> refused(n, 0);
  std::atomic<std::size_t> published{0};

  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  const clk::time_point t0 = clk::now() + std::chrono::milliseconds(2);
  double at = 0;
  for (std::size_t i = 0; i < n; ++i) {
    intended[i] = t0 + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(at));
    at += gap(rng);
  }

  load_point p;
  p.offered = rate;
  {
    hs::dynamic_batcher<cost_model, std::uint64_t> batcher(model, options);
    std::thread collector([&] {
      for (std::size_t i = 0; i < n; ++i) {
        std::size_t seen = published.load(std::memory_order_acquire);
        while (seen <= i) {
          published.wait(seen, std::memory_order_acquire);
          seen = published.load(std::memory_order_acquire);
        }
        if (refused[i] != 0) continue;
        handles[i]->future().wait();
        done[i] = clk::now();
      }
    });
    std::thread submitter([&] {
#ifdef __linux__
      prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);  // wake at the arrival time, not 50 us later
#endif
      for (std::size_t i = 0; i < n; ++i) {
        if (clk::now() < intended[i]) std::this_thread::sleep_until(intended[i]);
        submitted[i] = clk::now();
        try {
          handles[i].emplace(batcher.submit(i));
        } catch (const hs::queue_full_error&) {
          refused[i] = 1;
        }
        published.store(i + 1, std::memory_order_release);
        published.notify_one();
      }
    });
    submitter.join();
    collector.join();
    p.mean_batch = batcher.stats().mean_batch_size;
  }

  std::vector<std::int64_t> latency, late;
  latency.reserve(n - warm);
  late.reserve(n - warm);
  clk::time_point last = intended[warm];
  for (std::size_t i = warm; i < n; ++i) {
    if (refused[i] != 0) {
      ++p.refused;
      continue;
    }
    latency.push_back(
        std::chrono::duration_cast<std::chrono::nanoseconds>(done[i] - intended[i]).count());
    late.push_back(
        std::chrono::duration_cast<std::chrono::nanoseconds>(submitted[i] - intended[i]).count());
    last = std::max(last, done[i]);
  }
  for (std::size_t i = 0; i < warm; ++i) p.refused += refused[i] != 0 ? 1 : 0;
  const double span_s = std::chrono::duration<double>(last - intended[warm]).count();
  p.completed = span_s > 0 ? static_cast<double>(latency.size()) / span_s : 0;
  p.p50_us = quantile_us(latency, 0.50);
  p.p95_us = quantile_us(latency, 0.95);
  p.p99_us = quantile_us(latency, 0.99);
  p.late_p95_us = quantile_us(late, 0.95);
  p.pass = p.refused == 0 && p.p95_us * 1e3 <= static_cast<double>(target.count());
  if (std::getenv("HONE_BENCH_SERVE_TRACE") != nullptr) {
    std::fprintf(stderr,
                 "cap %zu offered %.0f/s: completed %.0f/s p50 %.0f us p95 %.0f us p99 %.0f us "
                 "late p95 %.0f us mean batch %.2f refused %llu %s\n",
                 options.max_batch_size, p.offered, p.completed, p.p50_us, p.p95_us, p.p99_us,
                 p.late_p95_us, p.mean_batch, static_cast<unsigned long long>(p.refused),
                 p.pass ? "pass" : "FAIL");
  }
  return p;
}

// Three trials of one rate (seeds differ); the one with the median p95 (a trial that refused a
// request counts as the worst), so the rate passes when two of the three trials pass.
load_point median_of_3(cost_model& model, const hs::batcher_options& options, double rate,
                       std::chrono::nanoseconds target, std::uint64_t seed, int& points) {
  std::vector<load_point> trials;
  for (int t = 0; t < 3; ++t)
    trials.push_back(run_load(model, options, rate, target, seed + 100 * points++));
  std::sort(trials.begin(), trials.end(), [](const load_point& a, const load_point& b) {
    return a.refused != b.refused ? a.refused < b.refused : a.p95_us < b.p95_us;
  });
  return trials[1];
}

// The highest arrival rate whose median p95 stays within target: doubling from 1000/s, then 6
// bisections. Returns that rate's median trial (offered 0 when even 1000/s fails).
load_point max_rate_at_p95(cost_model& model, const hs::batcher_options& options,
                           std::chrono::nanoseconds target, std::uint64_t seed, int& points) {
  load_point best;
  double lo = 0, hi = 0;
  for (double rate = 1000; rate <= 1.024e6; rate *= 2) {
    const load_point p = median_of_3(model, options, rate, target, seed, points);
    if (!p.pass) {
      hi = rate;
      break;
    }
    best = p;
    lo = rate;
  }
  if (lo == 0 || hi == 0) return best;
  for (int step = 0; step < 6; ++step) {
    const double mid = 0.5 * (lo + hi);
    const load_point p = median_of_3(model, options, mid, target, seed, points);
    if (p.pass) {
      best = p;
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return best;
}

void throughput_at_p95(benchmark::State& state, std::chrono::microseconds fixed,
                       std::chrono::microseconds per_item, std::chrono::microseconds target) {
  constexpr std::size_t cap = 32;
  cost_model m{fixed, per_item};
  const hs::batcher_options one{.max_batch_size = 1,
                                .max_queue_delay = std::chrono::nanoseconds::zero(),
                                .queue_capacity = 8192};
  const hs::batcher_options batched{.max_batch_size = cap,
                                    .max_queue_delay = std::chrono::microseconds(500),
                                    .queue_capacity = 8192};
  load_point a, b;
  int points = 0;
  for (auto _ : state) {
    a = max_rate_at_p95(m, one, target, 1000, points);
    b = max_rate_at_p95(m, batched, target, 2000, points);
  }
  if (a.offered == 0 || b.offered == 0) {
    state.SkipWithError("no arrival rate of 1000/s or more met the p95 target in one mode");
    return;
  }
  const double f = static_cast<double>(fixed.count());
  const double i = static_cast<double>(per_item.count());
  state.counters["L_us"] = static_cast<double>(target.count());
  state.counters["one_rps"] = a.completed;
  state.counters["one_p50_us"] = a.p50_us;
  state.counters["one_p95_us"] = a.p95_us;
  state.counters["one_late_p95_us"] = a.late_p95_us;
  state.counters["batched_rps"] = b.completed;
  state.counters["batched_p50_us"] = b.p50_us;
  state.counters["batched_p95_us"] = b.p95_us;
  state.counters["batched_late_p95_us"] = b.late_p95_us;
  state.counters["batched_fill"] = b.mean_batch / static_cast<double>(cap);
  state.counters["ratio"] = b.completed / a.completed;
  state.counters["ideal_ratio"] = (f + i) / (f / static_cast<double>(cap) + i);
  // The share of the model's own capacity reached: 1 / (F + I) one at a time, 32 / (F + 32 I)
  // in full batches.
  state.counters["one_of_capacity"] = a.completed * (f + i) * 1e-6;
  state.counters["batched_of_capacity"] = b.completed * (f / static_cast<double>(cap) + i) * 1e-6;
  state.counters["points"] = points;
}

bool register_benchmarks() {
  for (const std::size_t b : {std::size_t{1}, std::size_t{32}}) {
    const std::string suffix = "_b" + std::to_string(b);
    hone_bench::register_named("dispatch_overhead/manual" + suffix, [b](benchmark::State& s) {
      dispatch_manual(s, b);
    })->Unit(benchmark::kMicrosecond);
    hone_bench::register_named("dispatch_overhead/thread" + suffix, [b](benchmark::State& s) {
      dispatch_thread<copy_model>(s, b, false);
    })->Unit(benchmark::kMicrosecond);
  }
  // The caller-runs fast path applies to lone requests only (a batch of 32 waits for the 32nd).
  hone_bench::register_named("dispatch_overhead/caller_runs_b1", [](benchmark::State& s) {
    dispatch_thread<caller_check_model>(s, 1, true);
  })->Unit(benchmark::kMicrosecond);
  hone_bench::add("fill_saturated", "hone", fill_saturated)->Iterations(1);
  using us = std::chrono::microseconds;
  struct cost {
    int fixed, per_item, target;
  };
  for (const cost c : {cost{200, 4, 2000}, cost{200, 4, 5000}, cost{100, 20, 2000}}) {
    const std::string workload = "throughput_at_p95_f" + std::to_string(c.fixed) + "_i" +
                                 std::to_string(c.per_item) + "_L" +
                                 std::to_string(c.target / 1000) + "ms";
    hone_bench::add(workload, "hone",
                    [c](benchmark::State& s) {
                      throughput_at_p95(s, us(c.fixed), us(c.per_item), us(c.target));
                    })
        ->Iterations(1)
        ->Unit(benchmark::kSecond);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return hone_bench::main(argc, argv, {}, register_benchmarks);
}
