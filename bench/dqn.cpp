// bench/dqn.cpp (bench_dqn): dqn_cartpole_time_to_solve, the hone side (the peer is
// bench/peers/sb3_dqn_cartpole.py, Stable-Baselines3 DQN with the same hyperparameters).
//
// Definition (docs/rl_actors.md, "DQN CartPole"): the examples/dqn_cartpole agent (Double DQN,
// PER, 3-step returns, target network, one actor: deterministic) with the rl-zoo CartPole-v1
// hyperparameters trains on CartPole-v1; every 2000 environment steps once learning has started,
// 100 greedy episodes with fixed seeds are evaluated; it is solved at the first evaluation whose
// mean return is >= 475, and given up at 100000 steps. The time is the training wall-clock time
// only (environment steps and learning, evaluations excluded) up to the solving evaluation.
//
// Two rows, each with manual time: one repetition per seed, each of one iteration whose time is
// that seed's training seconds (so results.json's samples_ms has one sample per seed):
//   dqn_cartpole_time_to_solve/hone      the example's default (Double DQN + PER + 3-step);
//   dqn_cartpole_time_to_solve/hone_dqn  --algorithm dqn: SB3's DQN exactly (uniform replay,
//                                        1-step returns, no Double DQN), the like-for-like row.
// Counters: env_steps_to_solve (the steps at the solving evaluation, or 100000 when not solved),
// solved (1 or 0; their mean over the repetitions is the fraction of seeds solved) and
// ms_per_env_step (training seconds / environment steps, training included: hone's speed apart
// from how many steps its algorithm needs). Seeds: 0,1,2 by default; --seeds=0,1,2,3,4 or the
// environment variable HONE_DQN_SEEDS=0,1,2,3,4 (read by the SB3 peer too) to choose.
// Under bench/driver.py (--hone_serve) a request trains one seed, the next of the list.
// The Q-network's matrix products go through OpenBLAS when CMake found it
// (examples/dqn_cartpole/blas.cmake); the program prints which at the start.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "dqn_cartpole/dqn.hpp"
#include "support/harness.hpp"

namespace {

std::vector<std::uint64_t> seeds = {0, 1, 2};
// Under bench/driver.py (--hone_serve) each request trains the next seed, as the SB3 peer's
// serve mode does, so that the driver interleaves hone and SB3 seed by seed; otherwise one
// repetition per seed.
bool serving = false;

bool parse_seeds(std::string_view text) {
  std::vector<std::uint64_t> out;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string part(text.substr(0, comma));
    char* end = nullptr;
    const unsigned long long v = std::strtoull(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0') return false;
    out.push_back(v);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
    if (text.empty()) return false;
  }
  if (out.empty()) return false;
  seeds = out;
  return true;
}

template <dqn_cartpole::algorithm Algo>
void time_to_solve(benchmark::State& state) {
  static std::size_t next = 0;  // repetition r runs seeds[r % seeds.size()] (one per row)
  const std::uint64_t seed = seeds[next++ % seeds.size()];
  double steps = 0.0, solved = 0.0, ms_per_step = 0.0;
  for (auto _ : state) {
    dqn_cartpole::dqn_config c;
    c.seed = seed;
    c.algo = Algo;
    const dqn_cartpole::run_result r = dqn_cartpole::train(c);
    state.SetIterationTime(r.train_seconds);
    steps = static_cast<double>(r.env_steps);
    solved = r.solved ? 1.0 : 0.0;
    ms_per_step = r.env_steps > 0 ? 1e3 * r.train_seconds / static_cast<double>(r.env_steps) : 0.0;
  }
  state.counters["env_steps_to_solve"] = steps;
  state.counters["solved"] = solved;
  state.counters["ms_per_env_step"] = ms_per_step;
  state.counters["seed"] = static_cast<double>(seed);
  state.counters["threads"] = 1;
}

bool register_benchmarks() {
  // Not hone_bench::add: that one times in real time, this one reports the training time only.
  std::fprintf(stderr, "bench_dqn: Q-network matrix products through %s\n",
               dqn_cartpole::matrix_products);
  hone_bench::register_named("dqn_cartpole_time_to_solve/hone",
                             time_to_solve<dqn_cartpole::algorithm::double_per_nstep>)
      ->UseManualTime()
      ->Iterations(1)
      ->Repetitions(serving ? 1 : static_cast<int>(seeds.size()))
      ->Unit(benchmark::kMillisecond);
  hone_bench::register_named("dqn_cartpole_time_to_solve/hone_dqn",
                             time_to_solve<dqn_cartpole::algorithm::dqn>)
      ->UseManualTime()
      ->Iterations(1)
      ->Repetitions(serving ? 1 : static_cast<int>(seeds.size()))
      ->Unit(benchmark::kMillisecond);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // The seeds: HONE_DQN_SEEDS (the environment, which bench/driver.py passes on to every program
  // and peer, so one setting gives hone and the SB3 peer the same list), then --seeds=LIST (or
  // --seeds LIST), this program's own flag; the rest goes to the harness.
  if (const char* env = std::getenv("HONE_DQN_SEEDS"); env != nullptr && !parse_seeds(env)) {
    std::fprintf(stderr, "%s: HONE_DQN_SEEDS needs a comma-separated list of integers, got '%s'\n",
                 argv[0], env);
    return 2;
  }
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--hone_serve") serving = true;
    std::string_view list;
    if (arg.starts_with("--seeds=")) {
      list = arg.substr(8);
    } else if (arg == "--seeds") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: --seeds needs a list such as 0,1,2\n", argv[0]);
        return 2;
      }
      list = argv[++i];
    } else {
      rest.push_back(argv[i]);
      continue;
    }
    if (!parse_seeds(list)) {
      std::fprintf(stderr, "%s: --seeds needs a comma-separated list of integers, got '%.*s'\n",
                   argv[0], static_cast<int>(list.size()), list.data());
      return 2;
    }
  }
  int n = static_cast<int>(rest.size());
  rest.push_back(nullptr);
  return hone_bench::main(n, rest.data(), {}, register_benchmarks);
}
