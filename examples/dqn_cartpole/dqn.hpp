// examples/dqn_cartpole/dqn.hpp: Double DQN with prioritized replay, 3-step returns, a target
// network and parallel actors under a policy-lag bound, on CartPole (cartpole.hpp). The training
// loop is the user's; hone brings the replay buffer (hone::replay_buffer with hone::prioritized<>,
// hone::n_step<3> and hone::many_writers), the actors and the lag bound (hone/rl/actors.hpp), the
// optimizer (hone::adamw with weight_decay 0: Adam) and the clipping (hone::clip_grad_norm).
//
// The schedule is Stable-Baselines3's DQN with the rl-baselines3-zoo CartPole-v1 hyperparameters
// (dqn_config's defaults): uniform random actions for the first learning_starts steps, then
// epsilon-greedy with epsilon falling linearly from 1 to 0.04 over the first 16% of 5e4 steps;
// every train_freq (256) environment steps, gradient_steps (128) updates on batches of 64; the
// target network copies the online one every target_update_interval (10) environment steps.
//
// One round: the actors collect train_freq steps between them (hone::actor_pool::run, one
// oneTBB task per actor; each actor owns its CartPole, its RNG and its local copy of the
// parameters, which it pulls from hone::versioned_params at most every pull_every steps, and tags
// every step with the version it acted with); the steps go through each actor's
// hone::gated_writer (the learner-side staleness gate drops those acted with a version older than
// current - max_lag) into the shared buffer; then the learner trains and publishes the new
// parameters (one version per round). Collection and learning alternate, as in SB3, so with
// pull_every <= the steps an actor makes per round every step is acted with the latest version
// (lag 0); a larger pull_every makes actors act with older parameters and max_lag bounds how old.
//
// Multi-process mode (main.cpp's --actors-over-mpi): basic_agent::train_learner runs the learner
// on rank 0 of a communicator and run_remote_actor the actors on ranks 1..N-1
// (hone/rl/dist_actors.hpp): each round the actor ranks send their shares of train_freq steps,
// the learner trains on them while the actors collect the next round's with the parameters of
// the round (so steps arrive one version old), and the zone dqn.round holds the learner's wait.
//
// One update (Double DQN, van Hasselt et al. 2016, with PER, Schaul et al. 2016):
//   a*  = argmax_a Q_online(s', a)
//   y   = R + discount * (1 - terminated) * Q_target(s', a*)  (R, discount from hone::n_step<3>)
//   td  = Q_online(s, a) - y
//   L   = mean_i w_i * huber(td_i)          (w: PER importance weights; Huber = smooth L1, beta 1)
// then clip_grad_norm(10), Adam, and the sampled items' priorities set to |td|.
//
// --algorithm dqn (algorithm::dqn) is Stable-Baselines3's DQN exactly: uniform replay
// (hone::uniform), 1-step returns (hone::one_step: discount = gamma), the target network's max
// over actions (no Double DQN), the plain mean Huber loss (weights 1) and no priority updates.
//
// The Q-network is a plain 4-256-256-2 MLP (ReLU) over one flat parameter vector laid out by a
// hone::arena_layout. Its matrix products go through the CBLAS sgemm of the BLAS that CMake found
// at configure time (DQN_CARTPOLE_BLAS, OpenBLAS preferred; DQN_CARTPOLE_OPENBLAS when it is
// OpenBLAS, which is then held to one thread), else through the loops below, which run over
// contiguous memory and vectorize. The phases of a step are HONE_ZONEs (dqn.* names); main.cpp's
// --profile prints their summary.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <hone/core/arena.hpp>
#include <hone/core/config.hpp>
#include <hone/core/error.hpp>
#include <hone/optim/adamw.hpp>
#include <hone/optim/clipping.hpp>
#include <hone/profile.hpp>
#include <hone/rl/actors.hpp>
#include <hone/rl/dist_actors.hpp>
#include <hone/rl/replay_buffer.hpp>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "cartpole.hpp"

#if defined(DQN_CARTPOLE_BLAS)
#include <cblas.h>
#endif

namespace dqn_cartpole {

/// Where the Q-network's matrix products go (chosen at configure time).
#if defined(DQN_CARTPOLE_OPENBLAS)
inline constexpr const char* matrix_products = "OpenBLAS cblas_sgemm (1 thread)";
#elif defined(DQN_CARTPOLE_BLAS)
inline constexpr const char* matrix_products = "BLAS cblas_sgemm";
#else
inline constexpr const char* matrix_products = "the example's own loops (no BLAS found)";
#endif

/// What the learner does: the default (Double DQN + PER + 3-step returns) or SB3's plain DQN
/// (uniform replay, 1-step returns, max over the target network's Q).
enum class algorithm { double_per_nstep, dqn };

/// The flag spelling of an algorithm ("double-per-nstep", "dqn").
inline const char* to_string(algorithm a) noexcept {
  return a == algorithm::dqn ? "dqn" : "double-per-nstep";
}

/// Hyperparameters: the rl-zoo CartPole-v1 settings, plus PER, n-step and the actors.
struct dqn_config {
  algorithm algo = algorithm::double_per_nstep;
  std::uint64_t seed = 0;
  double learning_rate = 2.3e-3;
  std::size_t batch_size = 64;
  std::size_t buffer_size = 100000;
  std::uint64_t learning_starts = 1000;
  double gamma = 0.99;
  std::uint64_t target_update_interval = 10;  // environment steps
  std::uint64_t train_freq = 256;             // environment steps per round
  std::size_t gradient_steps = 128;           // updates per round
  double exploration_fraction = 0.16;
  double exploration_initial_eps = 1.0;
  double exploration_final_eps = 0.04;
  std::uint64_t exploration_timesteps = 50000;  // rl-zoo's n_timesteps: the schedule's horizon
  float max_grad_norm = 10.0f;
  // PER.
  double per_alpha = 0.6;
  double per_beta = 0.4;
  double per_eps = 1e-6;
  // Actors and the policy-lag bound.
  std::size_t actors = 1;
  std::size_t pull_every = 1;
  std::uint64_t max_lag = 1;
  // The benchmark's protocol.
  std::uint64_t max_steps = 100000;
  std::uint64_t eval_every = 2000;
  std::size_t eval_episodes = 100;
  double solve_return = 475.0;
  std::uint64_t eval_seed =
      1000003;  // episode e of every evaluation starts from seed eval_seed + e
};

/// The transition an actor writes (3-step returns fill reward and discount).
using transition =
    hone::transition<hone::field<"obs", float, 4>, hone::field<"action", std::int32_t>,
                     hone::field<"reward", float>, hone::field<"next_obs", float, 4>,
                     hone::field<"terminated", bool>, hone::field<"truncated", bool>,
                     hone::field<"discount", float>, hone::field<"policy_version", std::uint64_t>>;
using replay =
    hone::replay_buffer<transition, hone::prioritized<>, hone::n_step<3>, hone::many_writers>;
using uniform_replay =
    hone::replay_buffer<transition, hone::uniform, hone::one_step, hone::many_writers>;

/// epsilon at environment step t (SB3's linear schedule).
inline double epsilon_at(const dqn_config& c, std::uint64_t t) {
  const double end = c.exploration_fraction * static_cast<double>(c.exploration_timesteps);
  const double progress = end <= 0.0 ? 1.0 : std::min(1.0, static_cast<double>(t) / end);
  return c.exploration_initial_eps +
         progress * (c.exploration_final_eps - c.exploration_initial_eps);
}

/// The settings of the multi-process mode (--actors-over-mpi) with `actors` actor ranks: rank 0
/// learns; each round an actor rank sends its share of train_freq steps (at most
/// ceil(train_freq / actors)), and the learner's lag bound is max_lag.
inline hone::dist_actor_options remote_options(const dqn_config& c, std::size_t actors) {
  hone::require(actors >= 1 && actors <= c.train_freq,
                "dqn: --actors-over-mpi needs between 2 and train_freq + 1 ranks (rank 0 learns, "
                "the others act); run it under mpirun -np 3 (or more)");
  return {.block = static_cast<std::size_t>((c.train_freq + actors - 1) / actors),
          .max_lag = c.max_lag,
          .learner = 0};
}

// ---- the Q-network ---------------------------------------------------------------------------

namespace kernels {
// Row-major matrices; every width is a compile-time constant, so each inner loop has a known trip
// count (a multiple of the vector width) and vectorizes even at -O2 (GCC's "very cheap" model).

/// out[m x N] = a[m x K] * w[K x N] + bias[N] by loops; zero inputs (ReLU) are skipped.
template <std::size_t K, std::size_t N>
void linear_loops(const float* HONE_RESTRICT a, const float* HONE_RESTRICT w,
                  const float* HONE_RESTRICT bias, float* HONE_RESTRICT out, std::size_t m) {
  for (std::size_t i = 0; i < m; ++i) {
    float* HONE_RESTRICT o = out + i * N;
    for (std::size_t j = 0; j < N; ++j) o[j] = bias[j];
    for (std::size_t p = 0; p < K; ++p) {
      const float av = a[i * K + p];
      if (av == 0.0f) continue;
      const float* HONE_RESTRICT wr = w + p * N;
      for (std::size_t j = 0; j < N; ++j) o[j] += av * wr[j];
    }
  }
}
/// out[m x N] = a[m x K] * w[K x N] + bias[N]. With BLAS, batches of 4 rows or more go through
/// sgemm; a single row (an actor's greedy action) stays in the loops, which take 3.6 us for the
/// whole 4-256-256-2 network there against OpenBLAS's 16 us (measured with --profile).
template <std::size_t K, std::size_t N>
void linear(const float* HONE_RESTRICT a, const float* HONE_RESTRICT w,
            const float* HONE_RESTRICT bias, float* HONE_RESTRICT out, std::size_t m) {
#if defined(DQN_CARTPOLE_BLAS)
  if (m >= 4) {
    for (std::size_t i = 0; i < m; ++i) std::copy(bias, bias + N, out + i * N);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(N),
                static_cast<int>(K), 1.0f, a, static_cast<int>(K), w, static_cast<int>(N), 1.0f,
                out, static_cast<int>(N));
    return;
  }
#endif
  linear_loops<K, N>(a, w, bias, out, m);
}
template <std::size_t N>
void relu(float* x, std::size_t m) {
  for (std::size_t i = 0; i < m * N; ++i) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
/// g[K x N] += a^T * d with a[m x K], d[m x N] (a weight gradient).
template <std::size_t K, std::size_t N>
void add_at_b(const float* HONE_RESTRICT a, const float* HONE_RESTRICT d, float* HONE_RESTRICT g,
              std::size_t m) {
#if defined(DQN_CARTPOLE_BLAS)
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(K), static_cast<int>(N),
              static_cast<int>(m), 1.0f, a, static_cast<int>(K), d, static_cast<int>(N), 1.0f, g,
              static_cast<int>(N));
#else
  for (std::size_t i = 0; i < m; ++i) {
    const float* HONE_RESTRICT dr = d + i * N;
    for (std::size_t p = 0; p < K; ++p) {
      const float av = a[i * K + p];
      if (av == 0.0f) continue;
      float* HONE_RESTRICT gr = g + p * N;
      for (std::size_t j = 0; j < N; ++j) gr[j] += av * dr[j];
    }
  }
#endif
}
/// e[m x K] = (d[m x N] * w^T) where a > 0, else 0 (the input gradient through a ReLU), with
/// w[K x N]; wt: scratch of N * K floats (w transposed, so the loops' inner loop is an axpy).
template <std::size_t K, std::size_t N>
void back_relu(const float* HONE_RESTRICT d, const float* HONE_RESTRICT w,
               const float* HONE_RESTRICT a, float* HONE_RESTRICT e, float* HONE_RESTRICT wt,
               std::size_t m) {
#if defined(DQN_CARTPOLE_BLAS)
  static_cast<void>(wt);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(K),
              static_cast<int>(N), 1.0f, d, static_cast<int>(N), w, static_cast<int>(N), 0.0f, e,
              static_cast<int>(K));
  for (std::size_t i = 0; i < m * K; ++i) e[i] = a[i] > 0.0f ? e[i] : 0.0f;
#else
  for (std::size_t p = 0; p < K; ++p) {
    for (std::size_t j = 0; j < N; ++j) wt[j * K + p] = w[p * N + j];
  }
  for (std::size_t i = 0; i < m; ++i) {
    float* HONE_RESTRICT er = e + i * K;
    for (std::size_t p = 0; p < K; ++p) er[p] = 0.0f;
    for (std::size_t j = 0; j < N; ++j) {
      const float dv = d[i * N + j];
      if (dv == 0.0f) continue;
      const float* HONE_RESTRICT wr = wt + j * K;
      for (std::size_t p = 0; p < K; ++p) er[p] += dv * wr[p];
    }
    const float* HONE_RESTRICT ar = a + i * K;
    for (std::size_t p = 0; p < K; ++p) er[p] = ar[p] > 0.0f ? er[p] : 0.0f;
  }
#endif
}
/// out[N] += column sums of d[m x N].
template <std::size_t N>
void add_column_sums(const float* HONE_RESTRICT d, float* HONE_RESTRICT out, std::size_t m) {
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < N; ++j) out[j] += d[i * N + j];
  }
}
}  // namespace kernels

/// The 4-256-256-2 MLP's parameter layout and its forward and backward passes over a flat
/// parameter vector (the online net, the target net and every actor's copy share it).
class qnet {
 public:
  static constexpr std::size_t inputs = 4;
  static constexpr std::size_t hidden = 256;
  static constexpr std::size_t outputs = 2;

  qnet() : layout_(sizeof(float)) {
    layout_.add("fc1.weight", inputs * hidden);
    layout_.add("fc1.bias", hidden);
    layout_.add("fc2.weight", hidden * hidden);
    layout_.add("fc2.bias", hidden);
    layout_.add("fc3.weight", hidden * outputs);
    layout_.add("fc3.bias", outputs);
  }

  [[nodiscard]] const hone::arena_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] std::size_t size() const noexcept { return layout_.total(); }

  /// PyTorch's nn.Linear initialization (what SB3 gets): weights and biases uniform in
  /// +-1/sqrt(fan_in). Padding stays 0.
  [[nodiscard]] std::vector<float> init(hone::replay_rng& rng) const {
    std::vector<float> p(size(), 0.0f);
    const std::size_t fan_in[3] = {inputs, hidden, hidden};
    for (std::size_t s = 0; s < layout_.size(); ++s) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in[s / 2]));
      const auto& sl = layout_[s];
      for (std::size_t i = 0; i < sl.count; ++i) {
        p[sl.offset + i] = static_cast<float>(bound * (2.0 * rng.uniform() - 1.0));
      }
    }
    return p;
  }

  /// Activations of one forward pass (kept for backward).
  struct activations {
    std::vector<float> h1, h2, q;
    void resize(std::size_t m) {
      h1.resize(m * hidden);
      h2.resize(m * hidden);
      q.resize(m * outputs);
    }
  };
  /// Backward scratch.
  struct scratch {
    std::vector<float> d1, d2, wt;
  };

  /// q[m x 2] of observations x[m x 4].
  void forward(const float* params, const float* x, std::size_t m, activations& act) const {
    act.resize(m);
    kernels::linear<inputs, hidden>(x, w(params, 0), w(params, 1), act.h1.data(), m);
    kernels::relu<hidden>(act.h1.data(), m);
    kernels::linear<hidden, hidden>(act.h1.data(), w(params, 2), w(params, 3), act.h2.data(), m);
    kernels::relu<hidden>(act.h2.data(), m);
    kernels::linear<hidden, outputs>(act.h2.data(), w(params, 4), w(params, 5), act.q.data(), m);
  }

  /// Gradients (overwritten) of sum_i sum_a dq[i, a] q[i, a] for the forward pass `act` of x.
  void backward(const float* params, const float* x, std::size_t m, const activations& act,
                const float* dq, float* grad, scratch& s) const {
    std::fill(grad, grad + size(), 0.0f);
    s.d1.resize(m * hidden);
    s.d2.resize(m * hidden);
    s.wt.resize(hidden * hidden);
    kernels::add_at_b<hidden, outputs>(act.h2.data(), dq, gw(grad, 4), m);
    kernels::add_column_sums<outputs>(dq, gw(grad, 5), m);
    kernels::back_relu<hidden, outputs>(dq, w(params, 4), act.h2.data(), s.d2.data(), s.wt.data(),
                                        m);
    kernels::add_at_b<hidden, hidden>(act.h1.data(), s.d2.data(), gw(grad, 2), m);
    kernels::add_column_sums<hidden>(s.d2.data(), gw(grad, 3), m);
    kernels::back_relu<hidden, hidden>(s.d2.data(), w(params, 2), act.h1.data(), s.d1.data(),
                                       s.wt.data(), m);
    kernels::add_at_b<inputs, hidden>(x, s.d1.data(), gw(grad, 0), m);
    kernels::add_column_sums<hidden>(s.d1.data(), gw(grad, 1), m);
  }

 private:
  [[nodiscard]] const float* w(const float* params, std::size_t slot) const {
    return params + layout_[slot].offset;
  }
  [[nodiscard]] float* gw(float* grad, std::size_t slot) const {
    return grad + layout_[slot].offset;
  }

  hone::arena_layout layout_;
};

/// The greedy action of one observation (ties: action 0, as torch.argmax).
inline int greedy(const qnet& net, const float* params, const std::array<float, 4>& obs,
                  qnet::activations& act) {
  net.forward(params, obs.data(), 1, act);
  return act.q[1] > act.q[0] ? 1 : 0;
}

/// Mean, min and max return of `episodes` greedy episodes; episode e starts from
/// replay_rng(seed + e). The episodes run side by side (one batched forward per step).
struct evaluation {
  double mean = 0.0, min = 0.0, max = 0.0;
};
inline evaluation evaluate(const qnet& net, const float* params, std::size_t episodes,
                           std::uint64_t seed) {
  std::vector<cartpole> envs(episodes);
  std::vector<std::array<float, 4>> obs(episodes);
  std::vector<double> returns(episodes, 0.0);
  std::vector<std::size_t> live(episodes);
  for (std::size_t e = 0; e < episodes; ++e) {
    hone::replay_rng rng(seed + e);
    obs[e] = envs[e].reset(rng);
    live[e] = e;
  }
  qnet::activations act;
  std::vector<float> x;
  while (!live.empty()) {
    x.resize(live.size() * 4);
    for (std::size_t i = 0; i < live.size(); ++i) {
      std::copy(obs[live[i]].begin(), obs[live[i]].end(), x.begin() + static_cast<long>(i * 4));
    }
    net.forward(params, x.data(), live.size(), act);
    std::size_t kept = 0;
    for (std::size_t i = 0; i < live.size(); ++i) {
      const std::size_t e = live[i];
      const int a = act.q[i * 2 + 1] > act.q[i * 2] ? 1 : 0;
      const step_result r = envs[e].step(a);
      returns[e] += r.reward;
      obs[e] = r.obs;
      if (!r.terminated && !r.truncated) live[kept++] = e;
    }
    live.resize(kept);
  }
  evaluation ev;
  ev.mean = std::accumulate(returns.begin(), returns.end(), 0.0) / static_cast<double>(episodes);
  ev.min = *std::min_element(returns.begin(), returns.end());
  ev.max = *std::max_element(returns.begin(), returns.end());
  return ev;
}

/// One row of the training log (one per evaluation).
struct eval_record {
  std::uint64_t env_steps = 0;
  double train_seconds = 0.0;
  evaluation eval;
  double train_return_mean = 0.0;  // of the last (up to) 100 finished training episodes
  std::uint64_t episodes = 0;
  double epsilon = 0.0;
  double loss = 0.0;  // mean loss of the last round
  std::uint64_t version = 0;
  hone::gate_stats gate;
};

/// What a training run reports.
struct run_result {
  bool solved = false;
  std::uint64_t env_steps = 0;  // at the solving evaluation (or all steps made)
  double train_seconds = 0.0;   // training only, evaluations excluded
  double eval_seconds = 0.0;
  std::uint64_t gradient_steps = 0;
  std::vector<eval_record> evals;
  std::vector<std::pair<std::uint64_t, double>> episodes;  // (env step at its end, return)
  hone::gate_stats gate;
};

/// The agent: buffer, networks, optimizer, actors; Algo picks the learner (see algorithm).
template <algorithm Algo>
class basic_agent {
 public:
  static constexpr bool plain_dqn = Algo == algorithm::dqn;
  using replay_type = std::conditional_t<plain_dqn, uniform_replay, replay>;

  explicit basic_agent(const dqn_config& c)
      : cfg_(checked(c)),
        buffer_(make_buffer(c)),
        opt_{.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f},
        opt_state_(opt_, net_.layout()),
        lag_{.pull_every = c.pull_every, .max_lag = c.max_lag},
        pool_({.actors = c.actors}) {
#if defined(DQN_CARTPOLE_OPENBLAS)
    // Matrices of 64 x 256 gain nothing from OpenBLAS's threads (SB3's benchmark runs torch with
    // one thread too), and its pool would compete with the actors.
    openblas_set_num_threads(1);
#endif
    hone::replay_rng init_rng(c.seed * 0x9E3779B97F4A7C15ULL + 17);
    online_ = net_.init(init_rng);
    target_ = online_;
    grad_.assign(net_.size(), 0.0f);
    shared_ = std::make_unique<hone::versioned_params<std::vector<float>>>(online_);
    gate_ = std::make_unique<hone::staleness_gate>(*shared_, lag_);
    buffer_.seed(c.seed * 31 + 7);
    for (std::size_t a = 0; a < c.actors; ++a) {
      actors_.push_back(std::make_unique<actor>(*this, a));
    }
  }

  [[nodiscard]] const dqn_config& config() const noexcept {
    return cfg_;
  }
  [[nodiscard]] const qnet& net() const noexcept {
    return net_;
  }
  [[nodiscard]] const std::vector<float>& online() const noexcept {
    return online_;
  }

  /// epsilon at environment step t (SB3's linear schedule).
  [[nodiscard]] double epsilon(std::uint64_t t) const {
    return epsilon_at(cfg_, t);
  }

  /// Trains until solved or max_steps; on_eval(record) after every evaluation.
  run_result train(const std::function<void(const eval_record&)>& on_eval = {}) {
    using clock = std::chrono::steady_clock;
    run_result res;
    double train_s = 0.0, eval_s = 0.0;
    std::uint64_t next_eval = first_eval();
    double last_loss = 0.0;
    while (steps_ < cfg_.max_steps) {
      const auto t0 = clock::now();
      const std::uint64_t round = std::min<std::uint64_t>(cfg_.train_freq, cfg_.max_steps - steps_);
      collect(round);
      const auto t1 = clock::now();
      train_s += std::chrono::duration<double>(t1 - t0).count();
      // Evaluations due in this round's steps see the parameters it acted with (SB3: the
      // EvalCallback runs during collection, before the round's training).
      const bool solved = evaluate_due(next_eval, train_s, eval_s, last_loss, shared_->version(),
                                       gate_->stats(), res, on_eval);
      if (solved) {
        res.solved = true;
        break;
      }
      const auto t2 = clock::now();
      if (steps_ >= cfg_.learning_starts && round == cfg_.train_freq) {
        last_loss = learn();
        HONE_ZONE("dqn.publish");
        shared_->publish(online_);
      }
      train_s += std::chrono::duration<double>(clock::now() - t2).count();
    }
    if (!res.solved) res.env_steps = steps_;
    res.train_seconds = train_s;
    res.eval_seconds = eval_s;
    res.gradient_steps = gradient_steps_;
    res.episodes = episode_log_;
    res.gate = gate_->stats();
    return res;
  }

  /// The learner of the multi-process mode (--actors-over-mpi): this rank (rank 0 of comm) trains
  /// while ranks 1..N-1 run run_remote_actor. Each round (hone::dist_learner::round) receives
  /// train_freq steps from the actor ranks (their shares, in rank order: deterministic) into the
  /// buffer through the staleness gate and sends the parameters published after the previous
  /// round's training; then the learner evaluates when due, trains and publishes, while the
  /// actors collect the next round's steps with the parameters they just received (so those steps
  /// arrive one version old: lag 1, accepted by the default max_lag of 1). The last round tells
  /// the actors to stop. Throws hone::dist_error when an actor rank is missing for the
  /// communicator's timeout.
  template <class Comm>
  run_result train_learner(Comm& comm,
                           const std::function<void(const eval_record&)>& on_eval = {}) {
    using clock = std::chrono::steady_clock;
    hone::require(comm.size() >= 2,
                  "dqn: --actors-over-mpi needs at least 2 ranks (rank 0 learns, the others act); "
                  "run it under mpirun -np 3");
    const auto actor_ranks = static_cast<std::size_t>(comm.size() - 1);
    hone::dist_learner<Comm, replay_type> learner(comm, buffer_, std::span<const float>(online_),
                                                  remote_options(cfg_, actor_ranks));
    std::vector<double> returns(static_cast<std::size_t>(comm.size()), 0.0);
    const auto on_received = [&](int q, const transition::record& r, bool) {
      ++steps_;
      double& ret = returns[static_cast<std::size_t>(q)];
      ret += hone::get<"reward">(r);
      if (hone::get<"terminated">(r) || hone::get<"truncated">(r)) {
        episode_log_.emplace_back(steps_, ret);
        ++episodes_;
        ret = 0.0;
      }
    };
    run_result res;
    double train_s = 0.0, eval_s = 0.0;
    std::uint64_t next_eval = first_eval();
    double last_loss = 0.0;
    for (;;) {
      const auto t0 = clock::now();
      const std::uint64_t before = steps_;
      hone::dist_round_stats st;
      {
        HONE_ZONE("dqn.round");
        st = learner.round(false, on_received);
      }
      if (steps_ / cfg_.target_update_interval != before / cfg_.target_update_interval) {
        HONE_ZONE("dqn.target_copy");
        target_ = online_;
      }
      train_s += std::chrono::duration<double>(clock::now() - t0).count();
      if (evaluate_due(next_eval, train_s, eval_s, last_loss, learner.version(), learner.stats(),
                       res, on_eval)) {
        res.solved = true;
        break;
      }
      if (steps_ >= cfg_.max_steps) break;
      const auto t2 = clock::now();
      if (steps_ >= cfg_.learning_starts && st.received == cfg_.train_freq) {
        last_loss = learn();
        HONE_ZONE("dqn.publish");
        learner.publish(std::span<const float>(online_));
      }
      train_s += std::chrono::duration<double>(clock::now() - t2).count();
    }
    res.gate = learner.stats();
    // The stop round: the actors' last blocks arrive (and are stored) but are not counted.
    learner.round(true);
    if (!res.solved) res.env_steps = steps_;
    res.train_seconds = train_s;
    res.eval_seconds = eval_s;
    res.gradient_steps = gradient_steps_;
    res.episodes = episode_log_;
    return res;
  }

  /// Environment steps made so far.
  [[nodiscard]] std::uint64_t steps() const noexcept {
    return steps_;
  }
  [[nodiscard]] replay_type& buffer() noexcept {
    return buffer_;
  }

 private:
  struct actor {
    actor(basic_agent& ag, std::size_t index)
        : params(*ag.shared_, ag.lag_),
          out(ag.buffer_, *ag.gate_),
          rng(ag.cfg_.seed * 1000003ULL + index * 7919ULL + 1) {
      obs = env.reset(rng);
    }
    cartpole env;
    std::array<float, 4> obs{};
    hone::actor_params<std::vector<float>> params;
    hone::gated_writer<replay_type> out;
    hone::replay_rng rng;
    qnet::activations act;
    double episode_return = 0.0;
    std::uint64_t quota = 0;  // steps left in this round
    std::uint64_t first_step = 0;
    std::uint64_t made = 0;
    std::vector<std::pair<std::uint64_t, double>> finished;  // episodes ended this round
  };

  static dqn_config checked(const dqn_config& c) {
    hone::require(c.algo == Algo, "dqn: the configuration's algorithm is not this agent's");
    hone::require(c.actors >= 1 && c.actors <= c.train_freq,
                  "dqn: the number of actors must be in [1, train_freq]");
    hone::require(c.batch_size >= 1 && c.buffer_size >= c.batch_size,
                  "dqn: the buffer must hold at least one batch");
    hone::require(c.eval_every >= 1 && c.eval_episodes >= 1, "dqn: bad evaluation settings");
    return c;
  }
  static replay_type make_buffer(const dqn_config& c) {
    if constexpr (plain_dqn) {
      return replay_type(c.buffer_size, hone::uniform{}, hone::one_step{}, hone::many_writers{});
    } else {
      return replay_type(c.buffer_size,
                         hone::prioritized<>{.alpha = c.per_alpha,
                                             .beta = c.per_beta,
                                             .beta_final = 1.0,
                                             .beta_steps = beta_steps(c),
                                             .epsilon = c.per_eps},
                         hone::n_step<3>{.gamma = c.gamma}, hone::many_writers{});
    }
  }
  static std::uint64_t beta_steps(const dqn_config& c) {
    // The PER beta schedule reaches 1 at the end of rl-zoo's 5e4 steps.
    const std::uint64_t rounds = c.exploration_timesteps > c.learning_starts
                                     ? (c.exploration_timesteps - c.learning_starts) /
                                           std::max<std::uint64_t>(c.train_freq, 1)
                                     : 1;
    return std::max<std::uint64_t>(1, rounds * c.gradient_steps);
  }
  [[nodiscard]] std::uint64_t first_eval() const {
    std::uint64_t e = cfg_.eval_every;
    while (e < cfg_.learning_starts) e += cfg_.eval_every;
    return e;
  }
  [[nodiscard]] double recent_return_mean() const {
    if (episode_log_.empty()) return 0.0;
    const std::size_t n = std::min<std::size_t>(100, episode_log_.size());
    double s = 0.0;
    for (std::size_t i = episode_log_.size() - n; i < episode_log_.size(); ++i) {
      s += episode_log_[i].second;
    }
    return s / static_cast<double>(n);
  }

  // Runs the evaluations due by steps_ (every eval_every steps from first_eval()); returns true
  // when one reaches solve_return (res.env_steps is then its step).
  bool evaluate_due(std::uint64_t& next_eval, double train_s, double& eval_s, double last_loss,
                    std::uint64_t version, const hone::gate_stats& gate, run_result& res,
                    const std::function<void(const eval_record&)>& on_eval) {
    using clock = std::chrono::steady_clock;
    while (next_eval <= steps_) {
      const auto e0 = clock::now();
      HONE_ZONE("dqn.evaluate");
      eval_record rec;
      rec.env_steps = next_eval;
      rec.train_seconds = train_s;
      rec.eval = evaluate(net_, online_.data(), cfg_.eval_episodes, cfg_.eval_seed);
      rec.train_return_mean = recent_return_mean();
      rec.episodes = episodes_;
      rec.epsilon = epsilon(next_eval);
      rec.loss = last_loss;
      rec.version = version;
      rec.gate = gate;
      res.evals.push_back(rec);
      eval_s += std::chrono::duration<double>(clock::now() - e0).count();
      if (on_eval) on_eval(rec);
      if (rec.eval.mean >= cfg_.solve_return) {
        res.env_steps = next_eval;
        return true;
      }
      next_eval += cfg_.eval_every;
    }
    return false;
  }

  // The actors make `total` steps between them (actor a: total / N, +1 for the first total % N);
  // the global step number of actor a's j-th step is first + j * N + a (the epsilon schedule and
  // the target-update clock use it).
  void collect(std::uint64_t total) {
    const std::size_t n = actors_.size();
    const std::uint64_t first = steps_;
    std::uint64_t most = 0;
    for (std::size_t a = 0; a < n; ++a) {
      actor& ac = *actors_[a];
      ac.quota = total / n + (a < total % n ? 1 : 0);
      ac.first_step = first;
      ac.made = 0;
      ac.finished.clear();
      most = std::max(most, ac.quota);
    }
    {
      HONE_ZONE("dqn.collect");
      pool_.run(most, [this, n](std::size_t a) { return act(*actors_[a], a, n); });
    }
    // Episodes in actor order, then the step clock and the target network.
    for (std::size_t a = 0; a < n; ++a) {
      for (const auto& e : actors_[a]->finished) {
        episode_log_.push_back(e);
        ++episodes_;
      }
    }
    const std::uint64_t before = steps_;
    steps_ += total;
    if (steps_ / cfg_.target_update_interval != before / cfg_.target_update_interval) {
      HONE_ZONE("dqn.target_copy");
      target_ = online_;  // at least one target update fell in this round; the online net did
                          // not change during it, so this is the copy SB3 would hold
    }
  }

  // One step of actor `a` (on its oneTBB task).
  bool act(actor& ac, std::size_t a, std::size_t n) {
    if (ac.made == ac.quota) return false;
    const std::uint64_t t = ac.first_step + ac.made * n + a;
    {
      HONE_ZONE("dqn.actor_pull");
      ac.params.tick();
    }
    int action;
    if (t < cfg_.learning_starts || ac.rng.uniform() < epsilon(t)) {
      action = static_cast<int>(ac.rng.below(2));
    } else {
      HONE_ZONE("dqn.actor_forward");
      action = greedy(net_, ac.params.get().data(), ac.obs, ac.act);
    }
    HONE_ZONE("dqn.env_and_add");
    const step_result r = ac.env.step(action);
    transition::record rec{};
    hone::get<"obs">(rec) = ac.obs;
    hone::get<"action">(rec) = action;
    hone::get<"reward">(rec) = r.reward;
    hone::get<"next_obs">(rec) = r.obs;
    hone::get<"terminated">(rec) = r.terminated;
    hone::get<"truncated">(rec) = r.truncated;
    // n_step<3> sets discount to gamma^k; with one_step the writer's value is stored as is.
    hone::get<"discount">(rec) = plain_dqn ? static_cast<float>(cfg_.gamma) : 1.0f;
    hone::get<"policy_version">(rec) = ac.params.version();
    ac.out.add(rec);
    ac.episode_return += r.reward;
    ++ac.made;
    if (r.terminated || r.truncated) {
      ac.finished.emplace_back(t + 1, ac.episode_return);
      ac.episode_return = 0.0;
      ac.obs = ac.env.reset(ac.rng);
    } else {
      ac.obs = r.obs;
    }
    return true;
  }

  // gradient_steps updates; returns the mean loss.
  double learn() {
    HONE_ZONE("dqn.learn");
    const std::size_t b = cfg_.batch_size;
    const float* const tgt = target_.data();
    double loss_sum = 0.0;
    for (std::size_t g = 0; g < cfg_.gradient_steps; ++g) {
      {
        HONE_ZONE("dqn.sample");
        buffer_.sample(b, batch_);
      }
      const auto obs = batch_.get<"obs">();
      const auto next = batch_.get<"next_obs">();
      const auto actions = batch_.get<"action">();
      const auto rewards = batch_.get<"reward">();
      const auto discounts = batch_.get<"discount">();
      const auto terminated = batch_.get<"terminated">();
      const auto weights = batch_.weights();
      {
        // Double DQN: the online net picks a*, the target net values it; plain DQN: the target
        // net's max.
        HONE_ZONE("dqn.forward_target");
        net_.forward(tgt, next.data(), b, next_target_);
        if constexpr (!plain_dqn) net_.forward(online_.data(), next.data(), b, next_online_);
        y_.resize(b);
        for (std::size_t i = 0; i < b; ++i) {
          const float* const qt = next_target_.q.data() + i * 2;
          float v;
          if constexpr (plain_dqn) {
            v = std::max(qt[0], qt[1]);
          } else {
            v = qt[next_online_.q[i * 2 + 1] > next_online_.q[i * 2] ? 1 : 0];
          }
          y_[i] = rewards[i] + (terminated[i] ? 0.0f : discounts[i] * v);
        }
      }
      {
        HONE_ZONE("dqn.forward");
        net_.forward(online_.data(), obs.data(), b, cur_);
      }
      dq_.assign(b * 2, 0.0f);
      td_.resize(b);
      double loss = 0.0;
      const float inv_b = 1.0f / static_cast<float>(b);
      for (std::size_t i = 0; i < b; ++i) {
        const float q = cur_.q[i * 2 + static_cast<std::size_t>(actions[i])];
        const float d = q - y_[i];
        const float ad = std::abs(d);
        loss += weights[i] * (ad < 1.0f ? 0.5f * d * d : ad - 0.5f);
        dq_[i * 2 + static_cast<std::size_t>(actions[i])] =
            weights[i] * std::clamp(d, -1.0f, 1.0f) * inv_b;
        td_[i] = ad;
      }
      loss_sum += loss / static_cast<double>(b);
      {
        HONE_ZONE("dqn.backward");
        net_.backward(online_.data(), obs.data(), b, cur_, dq_.data(), grad_.data(), scratch_);
      }
      hone::clip_result clip;
      {
        HONE_ZONE("dqn.clip");
        clip =
            hone::clip_grad_norm{.max_norm = cfg_.max_grad_norm}.clip(grad_.data(), grad_.size());
      }
      if (!clip.nonfinite) {
        HONE_ZONE("dqn.adam");
        opt_state_.step(opt_,
                        {.step = ++updates_,
                         .lr = static_cast<float>(cfg_.learning_rate),
                         .grad_scale = clip.coefficient},
                        online_.data(), grad_.data());
      }
      if constexpr (!plain_dqn) {
        HONE_ZONE("dqn.priorities");
        buffer_.update_priorities(batch_.keys(), td_);
      }
      ++gradient_steps_;
    }
    return loss_sum / static_cast<double>(cfg_.gradient_steps);
  }

  dqn_config cfg_;
  qnet net_;
  replay_type buffer_;
  hone::adamw opt_;
  hone::optimizer_state_t<hone::adamw> opt_state_;
  hone::policy_lag lag_;
  hone::actor_pool pool_;
  std::vector<float> online_, target_, grad_;
  std::unique_ptr<hone::versioned_params<std::vector<float>>> shared_;
  std::unique_ptr<hone::staleness_gate> gate_;
  std::vector<std::unique_ptr<actor>> actors_;
  std::uint64_t steps_ = 0;
  std::uint64_t updates_ = 0;
  std::uint64_t gradient_steps_ = 0;
  std::uint64_t episodes_ = 0;
  std::vector<std::pair<std::uint64_t, double>> episode_log_;
  // Learner scratch.
  hone::replay_batch<transition> batch_;
  qnet::activations next_online_, next_target_, cur_;
  qnet::scratch scratch_;
  std::vector<float> y_, dq_, td_;
};

/// The default agent (Double DQN + PER + 3-step returns) and SB3's plain DQN.
using agent = basic_agent<algorithm::double_per_nstep>;
using dqn_agent = basic_agent<algorithm::dqn>;

/// Builds the agent that c.algo names and trains it (basic_agent::train).
inline run_result train(const dqn_config& c,
                        const std::function<void(const eval_record&)>& on_eval = {}) {
  if (c.algo == algorithm::dqn) return dqn_agent(c).train(on_eval);
  return agent(c).train(on_eval);
}

/// The learner of the multi-process mode for the algorithm c.algo names
/// (basic_agent::train_learner); call it on rank 0 while the other ranks call run_remote_actor.
template <class Comm>
run_result train_learner(const dqn_config& c, Comm& comm,
                         const std::function<void(const eval_record&)>& on_eval = {}) {
  if (c.algo == algorithm::dqn) return dqn_agent(c).train_learner(comm, on_eval);
  return agent(c).train_learner(comm, on_eval);
}

/// An actor rank of the multi-process mode (ranks 1..N-1; rank 0 runs train_learner): its own
/// CartPole, RNG and copy of the parameters (hone::dist_actor). Every round it makes its share
/// of the round's train_freq steps (actor a of A makes the global steps clock + a, clock + a + A,
/// ..., where clock is the learner's step count at the last round, so the epsilon schedule is the
/// one-process one), tags them with the version it holds, sends them, and picks up the newest
/// parameters; it ends when the learner says so. Returns the transitions it sent.
template <class Comm>
std::uint64_t run_remote_actor(const dqn_config& c, Comm& comm) {
  hone::require(comm.size() >= 2 && comm.rank() >= 1,
                "dqn: run_remote_actor runs on ranks 1..N-1 of at least 2 (rank 0 learns)");
  const auto n = static_cast<std::uint64_t>(comm.size() - 1);
  const auto a = static_cast<std::uint64_t>(comm.rank() - 1);
  hone::dist_actor<Comm, transition> actor(comm, remote_options(c, n));
  const qnet net;
  qnet::activations act;
  cartpole env;
  hone::replay_rng rng(c.seed * 1000003ULL + a * 7919ULL + 1);
  std::array<float, 4> obs = env.reset(rng);
  // n_step<3> sets discount to gamma^k at the learner; with one_step it is stored as sent.
  const float discount = c.algo == algorithm::dqn ? static_cast<float>(c.gamma) : 1.0f;
  do {
    const std::uint64_t clock = actor.learner_received();
    const std::uint64_t total =
        clock >= c.max_steps ? 0 : std::min<std::uint64_t>(c.train_freq, c.max_steps - clock);
    const std::uint64_t quota = total / n + (a < total % n ? 1 : 0);
    for (std::uint64_t j = 0; j < quota; ++j) {
      const std::uint64_t t = clock + j * n + a;
      int action;
      if (t < c.learning_starts || rng.uniform() < epsilon_at(c, t)) {
        action = static_cast<int>(rng.below(2));
      } else {
        HONE_ZONE("dqn.actor_forward");
        action = greedy(net, actor.params().data(), obs, act);
      }
      const step_result r = env.step(action);
      transition::record rec{};
      hone::get<"obs">(rec) = obs;
      hone::get<"action">(rec) = action;
      hone::get<"reward">(rec) = r.reward;
      hone::get<"next_obs">(rec) = r.obs;
      hone::get<"terminated">(rec) = r.terminated;
      hone::get<"truncated">(rec) = r.truncated;
      hone::get<"discount">(rec) = discount;
      hone::get<"policy_version">(rec) = actor.version();
      actor.add(rec);
      obs = (r.terminated || r.truncated) ? env.reset(rng) : r.obs;
    }
  } while (actor.round());
  return actor.sent();
}

}  // namespace dqn_cartpole
