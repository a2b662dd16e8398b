// dqn_cartpole: Double DQN with prioritized replay, 3-step returns, a target network and parallel
// actors under a policy-lag bound, on CartPole-v1 (cartpole.hpp), with the rl-baselines3-zoo
// hyperparameters (dqn.hpp). It trains until an evaluation (100 greedy episodes, fixed seeds, every
// 2000 environment steps once learning has started) reaches a mean return of 475, or until
// --max-steps, and prints the training time to solve (evaluations excluded) and the environment
// steps. Writes DIR/metrics.csv (one row per evaluation), DIR/episodes.csv (one row per training
// episode) and DIR/curves.png (training returns and evaluation means against environment steps).
//
// --algorithm dqn trains Stable-Baselines3's plain DQN (uniform replay, 1-step returns, no Double
// DQN) instead; --profile prints the time per phase (dqn.hpp's HONE_ZONEs) at the end, and
// --trace FILE also writes them as a Perfetto trace.
//
// --actors-over-mpi (built with MPI): the multi-process mode, e.g. `mpirun -np 3 dqn_cartpole
// --actors-over-mpi`: rank 0 learns (and writes the outputs), ranks 1..N-1 run CartPole actors
// that send their steps to rank 0's replay buffer and receive its versioned parameters
// (hone/rl/dist_actors.hpp over hone::dist::mpi_comm). An actor rank that dies or hangs makes
// the learner end the job with an error naming it after --mpi-timeout seconds (a learner that
// dies: the actors after twice that).
//
// Exit status: 0 solved, 1 runtime error, 2 bad flags, 3 not solved within --max-steps.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <hone/core/error.hpp>
#include <hone/profile.hpp>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#if defined(DQN_CARTPOLE_MPI)
#include <chrono>
#include <hone/dist/mpi/mpi_comm.hpp>
#endif

#include "common/chart.hpp"
#include "common/png.hpp"
#include "common/progress.hpp"
#include "dqn.hpp"

namespace {

struct options {
  dqn_cartpole::dqn_config cfg;
  std::filesystem::path out = "dqn_cartpole_out";
  bool profile = false;
  std::filesystem::path trace;
  bool over_mpi = false;
  std::uint64_t mpi_timeout_s = 60;
  bool actors_given = false, pull_every_given = false, mpi_timeout_given = false;
};

constexpr const char* usage_text =
    "usage: dqn_cartpole [flags]\n"
    "  --algorithm A       double-per-nstep (default: Double DQN, prioritized replay, 3-step\n"
    "                      returns) or dqn (SB3's DQN: uniform replay, 1-step, no Double DQN)\n"
    "  --seed N            seed of the network, the actors and the replay sampling (default 0)\n"
    "  --actors N          parallel actors, 1..256 (default 1; 1 is deterministic)\n"
    "  --buffer-size N     replay capacity, 64..100000000 (default 100000)\n"
    "  --max-steps N       give up after N environment steps (default 100000)\n"
    "  --pull-every K      an actor looks for new parameters at most every K of its steps\n"
    "                      (default 1)\n"
    "  --policy-lag L      drop transitions acted with parameters more than L versions older\n"
    "                      than the learner's (one version per training round; default 1)\n"
    "  --out DIR           where metrics.csv, episodes.csv and curves.png go\n"
    "                      (default dqn_cartpole_out)\n"
    "  --profile           print the time spent in each phase of training at the end\n"
    "  --trace FILE        also write those phases as a Perfetto trace to FILE (implies\n"
    "                      --profile)\n"
    "  --actors-over-mpi   multi-process mode, under mpirun -np N (N >= 2): rank 0 learns,\n"
    "                      ranks 1..N-1 run the actors and send their steps to it"
#if !defined(DQN_CARTPOLE_MPI)
    "\n                      (not in this build: CMake found no MPI)"
#endif
    "\n"
    "  --mpi-timeout S     with --actors-over-mpi: an actor rank missing for S seconds (the\n"
    "                      learner: 2 S) ends the job with an error naming it, 1..86400\n"
    "                      (default 60)\n"
    "  --help              print this text\n";

[[noreturn]] void bad_flag(const std::string& why) {
  std::fprintf(stderr, "dqn_cartpole: %s\nrun 'dqn_cartpole --help' for the list of flags\n",
               why.c_str());
  std::exit(2);
}

std::uint64_t parse_integer(std::string_view flag, std::string_view text, std::uint64_t lo,
                            std::uint64_t hi) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size() || v < lo || v > hi) {
    bad_flag(std::string(flag) + " needs an integer in [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "], got '" + std::string(text) + "'");
  }
  return v;
}

options parse_flags(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(usage_text, stdout);
      std::exit(0);
    }
    if (!flag.starts_with("--")) bad_flag("unexpected argument '" + std::string(flag) + "'");
    if (flag == "--profile") {
      o.profile = true;
      continue;
    }
    if (flag == "--actors-over-mpi") {
#if !defined(DQN_CARTPOLE_MPI)
      bad_flag(
          "--actors-over-mpi needs MPI, and this build has none (CMake found no MPI "
          "implementation: install Open MPI, e.g. libopenmpi-dev, and reconfigure)");
#endif
      o.over_mpi = true;
      continue;
    }
    static constexpr std::string_view known[] = {
        "--seed",       "--actors",    "--buffer-size", "--max-steps", "--pull-every",
        "--policy-lag", "--algorithm", "--out",         "--trace",     "--mpi-timeout"};
    bool is_known = false;
    for (auto k : known) is_known = is_known || k == flag;
    if (!is_known) bad_flag("unknown flag '" + std::string(flag) + "'");
    if (i + 1 >= argc) bad_flag("missing value after " + std::string(flag));
    const std::string_view v = argv[++i];
    constexpr std::uint64_t big = 1'000'000'000;
    if (flag == "--seed") {
      o.cfg.seed = parse_integer(flag, v, 0, std::numeric_limits<std::uint32_t>::max());
    } else if (flag == "--actors") {
      o.cfg.actors = parse_integer(flag, v, 1, 256);
      o.actors_given = true;
    } else if (flag == "--buffer-size") {
      o.cfg.buffer_size = parse_integer(flag, v, 64, 100'000'000);
    } else if (flag == "--max-steps") {
      o.cfg.max_steps = parse_integer(flag, v, 1, big);
    } else if (flag == "--pull-every") {
      o.cfg.pull_every = parse_integer(flag, v, 1, big);
      o.pull_every_given = true;
    } else if (flag == "--mpi-timeout") {
      o.mpi_timeout_s = parse_integer(flag, v, 1, 86400);
      o.mpi_timeout_given = true;
    } else if (flag == "--policy-lag") {
      o.cfg.max_lag = parse_integer(flag, v, 0, big);
    } else if (flag == "--algorithm") {
      if (v == "dqn") {
        o.cfg.algo = dqn_cartpole::algorithm::dqn;
      } else if (v == "double-per-nstep") {
        o.cfg.algo = dqn_cartpole::algorithm::double_per_nstep;
      } else {
        bad_flag("--algorithm needs 'double-per-nstep' or 'dqn', got '" + std::string(v) + "'");
      }
    } else if (flag == "--trace") {
      if (v.empty()) bad_flag("--trace needs a file name, got ''");
      o.trace = std::string(v);
      o.profile = true;
    } else if (flag == "--out") {
      if (v.empty()) bad_flag("--out needs a directory name, got ''");
      o.out = std::string(v);
    }
  }
  if (o.over_mpi && (o.actors_given || o.pull_every_given)) {
    bad_flag(std::string(o.actors_given ? "--actors" : "--pull-every") +
             " does not apply to --actors-over-mpi: the actors are the ranks 1..N-1 (mpirun -np "
             "N) and pick up the newest parameters at every round");
  }
  if (o.mpi_timeout_given && !o.over_mpi) {
    bad_flag("--mpi-timeout applies only to --actors-over-mpi");
  }
  return o;
}

std::string format(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), f, args...);
  return buf;
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  hone_examples::write_file_atomically(
      path, std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

void write_outputs(const std::filesystem::path& dir, const dqn_cartpole::run_result& r,
                   const dqn_cartpole::dqn_config& cfg) {
  std::string csv =
      "env_steps,train_seconds,eval_mean_return,eval_min_return,eval_max_return,"
      "train_return_mean100,episodes,epsilon,loss,policy_version,accepted,dropped,max_lag_seen\n";
  for (const auto& e : r.evals) {
    csv += format("%llu,%.4f,%.2f,%.0f,%.0f,%.2f,%llu,%.4f,%.6g,%llu,%llu,%llu,%llu\n",
                  static_cast<unsigned long long>(e.env_steps), e.train_seconds, e.eval.mean,
                  e.eval.min, e.eval.max, e.train_return_mean,
                  static_cast<unsigned long long>(e.episodes), e.epsilon, e.loss,
                  static_cast<unsigned long long>(e.version),
                  static_cast<unsigned long long>(e.gate.accepted),
                  static_cast<unsigned long long>(e.gate.dropped),
                  static_cast<unsigned long long>(e.gate.max_lag_seen));
  }
  write_text(dir / "metrics.csv", csv);
  std::string eps = "env_steps,return\n";
  for (const auto& [step, ret] : r.episodes) {
    eps += format("%llu,%.0f\n", static_cast<unsigned long long>(step), ret);
  }
  write_text(dir / "episodes.csv", eps);

  namespace ex = hone_examples;
  ex::series train{.label = "training episodes", .colour = ex::light_blue, .thickness = 1};
  for (const auto& [step, ret] : r.episodes) {
    train.x.push_back(static_cast<double>(step));
    train.y.push_back(ret);
  }
  ex::series eval{.label = "evaluation mean (100 greedy)", .colour = ex::orange, .markers = true};
  for (const auto& e : r.evals) {
    eval.x.push_back(static_cast<double>(e.env_steps));
    eval.y.push_back(e.eval.mean);
  }
  ex::series goal{.label = "solved (475)", .colour = ex::green, .thickness = 1};
  const double last = static_cast<double>(std::max<std::uint64_t>(r.env_steps, 1));
  goal.x = {0.0, last};
  goal.y = {cfg.solve_return, cfg.solve_return};
  ex::chart c{.title = "return",
              .x_label = "environment steps",
              .lines = {train, eval, goal},
              .x_min = 0.0,
              .x_max = last,
              .y_min = 0.0,
              .y_max = 520.0};
  ex::image img(1000, 480, ex::chart_palette());
  const std::string heading =
      r.solved ? format("dqn cartpole seed %llu: solved at %llu steps, %.1f s",
                        static_cast<unsigned long long>(cfg.seed),
                        static_cast<unsigned long long>(r.env_steps), r.train_seconds)
               : format("dqn cartpole seed %llu: not solved in %llu steps",
                        static_cast<unsigned long long>(cfg.seed),
                        static_cast<unsigned long long>(r.env_steps));
  ex::draw_text(img, 14, 12, heading, ex::black, 2);
  ex::draw_chart(img, {.left = 0, .top = 34, .width = 1000, .height = 446}, c);
  ex::write_png(dir / "curves.png", img);
}

/// The learner's side of a run (the whole run in one process): prints the settings, trains with
/// `train(on_eval)`, writes the outputs and prints the result; returns the exit status.
template <class Train>
int learn_and_report(const options& o, Train&& train) {
  {
    std::error_code ec;
    std::filesystem::create_directories(o.out, ec);
    if (ec || !std::filesystem::is_directory(o.out)) {
      throw hone::error("cannot create the output directory '" + o.out.string() +
                        "': " + (ec ? ec.message() : std::string("a file of that name exists")));
    }
    const auto& c = o.cfg;
    if (c.algo == dqn_cartpole::algorithm::dqn) {
      std::printf(
          "dqn_cartpole: DQN (uniform replay, 1-step returns, no Double DQN: SB3's DQN) on "
          "CartPole-v1, seed %llu\n",
          static_cast<unsigned long long>(c.seed));
    } else {
      std::printf(
          "dqn_cartpole: Double DQN + PER (alpha %g, beta %g -> 1) + 3-step returns on "
          "CartPole-v1, seed %llu\n",
          c.per_alpha, c.per_beta, static_cast<unsigned long long>(c.seed));
    }
    std::printf("  matrix products: %s\n", dqn_cartpole::matrix_products);
    std::printf(
        "  rl-zoo: lr %g, batch %zu, buffer %zu, learning_starts %llu, gamma %g, "
        "target_update %llu, train_freq %llu, gradient_steps %zu, eps 1 -> %g over %g "
        "of %llu steps, MLP 4-%zu-%zu-2, Adam, Huber, clip %g\n",
        c.learning_rate, c.batch_size, c.buffer_size,
        static_cast<unsigned long long>(c.learning_starts), c.gamma,
        static_cast<unsigned long long>(c.target_update_interval),
        static_cast<unsigned long long>(c.train_freq), c.gradient_steps, c.exploration_final_eps,
        c.exploration_fraction, static_cast<unsigned long long>(c.exploration_timesteps),
        dqn_cartpole::qnet::hidden, dqn_cartpole::qnet::hidden,
        static_cast<double>(c.max_grad_norm));
    const std::string actors =
        o.over_mpi ? std::string("actors on ranks 1..N-1 (new parameters every round)")
                   : format("actors %zu, pull every %zu steps", c.actors, c.pull_every);
    std::printf(
        "  %s, policy lag <= %llu versions; evaluation: %zu greedy episodes every %llu steps, "
        "solved at a mean >= %g\n",
        actors.c_str(), static_cast<unsigned long long>(c.max_lag), c.eval_episodes,
        static_cast<unsigned long long>(c.eval_every), c.solve_return);
    std::fflush(stdout);

    std::unique_ptr<hone::profile::trace> trace;
    if (o.profile) {
      trace = std::make_unique<hone::profile::trace>(
          hone::profile::trace_options{.perfetto = o.trace, .process_name = "dqn_cartpole"});
    }
    hone_examples::progress bar(c.max_steps);
    const dqn_cartpole::run_result r = train([&](const dqn_cartpole::eval_record& e) {
      bar.note(format(
          "steps %6llu  train %6.1f s  eval mean %6.1f (min %3.0f)  train mean100 "
          "%6.1f  eps %.3f  loss %.4f  v%llu  dropped %llu",
          static_cast<unsigned long long>(e.env_steps), e.train_seconds, e.eval.mean, e.eval.min,
          e.train_return_mean, e.epsilon, e.loss, static_cast<unsigned long long>(e.version),
          static_cast<unsigned long long>(e.gate.dropped)));
      bar.update(e.env_steps, format("eval %.1f", e.eval.mean));
    });
    bar.finish();
    if (trace) {
      trace->close();
      std::printf(
          "time per phase (HONE_ZONE; nested: dqn.learn holds dqn.sample ... dqn.priorities, "
          "dqn.collect holds the actor zones):\n");
      std::fflush(stdout);
      hone::profile::print_summary(std::cout, trace->summary());
      std::cout.flush();
      if (!o.trace.empty()) std::printf("wrote %s\n", o.trace.string().c_str());
    }
    write_outputs(o.out, r, c);
    std::printf(
        "transitions: %llu accepted, %llu dropped by the policy-lag bound (largest lag "
        "seen %llu, accepted %llu); %llu gradient steps; evaluation time %.1f s\n",
        static_cast<unsigned long long>(r.gate.accepted),
        static_cast<unsigned long long>(r.gate.dropped),
        static_cast<unsigned long long>(r.gate.max_lag_seen),
        static_cast<unsigned long long>(r.gate.max_lag_accepted),
        static_cast<unsigned long long>(r.gradient_steps), r.eval_seconds);
    std::printf("wrote %s, %s and %s\n", (o.out / "metrics.csv").string().c_str(),
                (o.out / "episodes.csv").string().c_str(), (o.out / "curves.png").string().c_str());
    if (!r.solved) {
      std::printf("not solved within %llu environment steps (best evaluation mean %.1f)\n",
                  static_cast<unsigned long long>(r.env_steps), [&] {
                    double best = 0.0;
                    for (const auto& e : r.evals) best = std::max(best, e.eval.mean);
                    return best;
                  }());
      return 3;
    }
    std::printf(
        "solved: time to solve %.3f s (training only), %llu environment steps, final "
        "evaluation mean %.1f\n",
        r.train_seconds, static_cast<unsigned long long>(r.env_steps), r.evals.back().eval.mean);
    return 0;
  }
}

#if defined(DQN_CARTPOLE_MPI)
/// --actors-over-mpi: rank 0 learns, the other ranks act. An error on any rank ends the whole job
/// (mpi_comm::abort): the others would otherwise wait for it until their timeout.
int run_over_mpi(int argc, char** argv, const options& o) {
  namespace hd = hone::dist;
  hd::mpi_environment env(argc, argv);
  // The actors wait twice as long as the learner, so that when an actor dies the learner's
  // error, which names the missing rank, is the one that ends the job.
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const std::chrono::seconds timeout(o.mpi_timeout_s * (world_rank == 0 ? 1 : 2));
  hd::mpi_comm comm(MPI_COMM_WORLD, timeout);
  try {
    if (comm.size() < 2) {
      throw hone::config_error(
          "--actors-over-mpi needs at least 2 ranks (rank 0 learns, the others act); run it as "
          "mpirun -np 3 dqn_cartpole --actors-over-mpi");
    }
    if (comm.rank() != 0) {
      const std::uint64_t sent = dqn_cartpole::run_remote_actor(o.cfg, comm);
      std::printf("dqn_cartpole: actor rank %d of %d sent %llu transitions\n", comm.rank(),
                  comm.size(), static_cast<unsigned long long>(sent));
      return 0;
    }
    std::printf("dqn_cartpole: learner on rank 0, actors on ranks 1..%d (MPI)\n", comm.size() - 1);
    return learn_and_report(
        o, [&](const auto& on_eval) { return dqn_cartpole::train_learner(o.cfg, comm, on_eval); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dqn_cartpole: rank %d: %s\n", comm.rank(), e.what());
    std::fflush(stderr);
    comm.abort(1);
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const options o = parse_flags(argc, argv);
  try {
#if defined(DQN_CARTPOLE_MPI)
    if (o.over_mpi) return run_over_mpi(argc, argv, o);
#endif
    return learn_and_report(
        o, [&](const auto& on_eval) { return dqn_cartpole::train(o.cfg, on_eval); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dqn_cartpole: %s\n", e.what());
    return 1;
  }
}
