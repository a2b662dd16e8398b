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
// Registered as "dqn_cartpole_time_to_solve/hone" with manual time: one repetition per seed,
// each of one iteration whose time is that seed's training seconds (so results.json's samples_ms
// has one sample per seed). Counters: env_steps_to_solve (the steps at the solving evaluation, or
// 100000 when not solved) and solved (1 or 0; their mean over the repetitions is the fraction of
// seeds solved). Seeds: 0,1,2 by default; --seeds=0,1,2,3,4 to choose.
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

void time_to_solve(benchmark::State& state) {
  static std::size_t next = 0;  // repetition r runs seeds[r % seeds.size()]
  const std::uint64_t seed = seeds[next++ % seeds.size()];
  double steps = 0.0, solved = 0.0;
  for (auto _ : state) {
    dqn_cartpole::dqn_config c;
    c.seed = seed;
    dqn_cartpole::agent agent(c);
    const dqn_cartpole::run_result r = agent.train();
    state.SetIterationTime(r.train_seconds);
    steps = static_cast<double>(r.env_steps);
    solved = r.solved ? 1.0 : 0.0;
  }
  state.counters["env_steps_to_solve"] = steps;
  state.counters["solved"] = solved;
  state.counters["seed"] = static_cast<double>(seed);
  state.counters["threads"] = 1;
}

bool register_benchmarks() {
  // Not hone_bench::add: that one times in real time, this one reports the training time only.
  hone_bench::register_named("dqn_cartpole_time_to_solve/hone", time_to_solve)
      ->UseManualTime()
      ->Iterations(1)
      ->Repetitions(static_cast<int>(seeds.size()))
      ->Unit(benchmark::kMillisecond);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // --seeds=LIST (or --seeds LIST) is this program's own flag; the rest goes to the harness.
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg = argv[i];
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
