// Tests of the dqn_cartpole example's pieces:
// - CartPole against an independent reference: Gymnasium's published Euler equations evaluated
//   in Python (float64) for a few steps from a given state, termination after 9 pushes to the
//   right from rest, and truncation (not termination) at step 500 under a balancing controller;
// - the Q-network's backward pass against central finite differences (double precision);
// - the agent with one actor is deterministic: two runs with a seed give the same parameters and
//   evaluations, another seed does not;
// - the multi-process mode (--actors-over-mpi: train_learner on rank 0, run_remote_actor on the
//   others) with thread ranks (tests/dist/thread_comm.hpp): the learner receives exactly the
//   steps the actors sent, every round's train_freq, trains the same number of rounds as one
//   process, and two runs give the same parameters (the blocks arrive in rank order);
// - --algorithm dqn (dqn_agent) stores 1-step transitions (reward 1, discount gamma) and samples
//   them with weights 1, where the default agent stores 3-step returns; a configuration naming
//   the other algorithm is refused.
#define BOOST_TEST_MODULE dqn_cartpole
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <vector>

#include "cartpole.hpp"
#include "dqn.hpp"
#include "thread_comm.hpp"

using dqn_cartpole::cartpole;

BOOST_AUTO_TEST_CASE(cartpole_euler_steps_match_gymnasium) {
  cartpole env;
  env.reset_to({0.01, -0.02, 0.03, 0.04});
  // Gymnasium CartPole-v1 equations, computed in Python float64 from this state (actions 1, 0, 1).
  const double expected[3][4] = {
      {0.0096000000000000009, 0.17467919574755525, 0.030799999999999998, -0.24306871796000809},
      {0.013093583914951107, -0.020868848948191993, 0.025938625640799837, 0.059167999939416599},
      {0.012676206935987267, 0.17387177487348129, 0.027121985639588168, -0.22521957255967326}};
  const int actions[3] = {1, 0, 1};
  for (int s = 0; s < 3; ++s) {
    const dqn_cartpole::step_result r = env.step(actions[s]);
    for (int i = 0; i < 4; ++i) {
      BOOST_TEST(env.state()[i] == expected[s][i], boost::test_tools::tolerance(1e-12));
      BOOST_TEST(r.obs[i] == static_cast<float>(expected[s][i]));  // float32 observation
    }
    BOOST_TEST(r.reward == 1.0f);
    BOOST_TEST(!r.terminated);
    BOOST_TEST(!r.truncated);
  }
  // By hand, the first step: temp = 10/1.1 + 0.05 * 0.04^2 sin(0.03) / 1.1 and the x update
  // x + 0.02 * x_dot = 0.01 - 0.0004 = 0.0096 exactly as above.
  BOOST_TEST(expected[0][0] == 0.01 + 0.02 * -0.02, boost::test_tools::tolerance(1e-15));
}

BOOST_AUTO_TEST_CASE(cartpole_terminates_past_12_degrees_with_reward_1) {
  cartpole env;
  env.reset_to({0.0, 0.0, 0.0, 0.0});
  // Pushing right from rest tips the pole left past 12 degrees on step 9 (Python reference:
  // theta = -0.21518604988500967 > 0.2094 rad).
  for (int s = 1; s <= 9; ++s) {
    const auto r = env.step(1);
    BOOST_TEST(r.reward == 1.0f);  // the terminating step is rewarded too
    BOOST_TEST(r.terminated == (s == 9));
    BOOST_TEST(!r.truncated);
  }
  BOOST_TEST(env.state()[2] == -0.21518604988500967, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(env.state()[0] == 0.14065097203306187, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(cartpole::theta_threshold == 12.0 * 2.0 * 3.141592653589793 / 360.0,
             boost::test_tools::tolerance(1e-15));
}

BOOST_AUTO_TEST_CASE(cartpole_truncates_at_500_steps) {
  cartpole env;
  env.reset_to({0.01, -0.02, 0.03, 0.04});
  for (int s = 1; s <= 500; ++s) {
    const auto& st = env.state();
    const int a = st[2] + 0.5 * st[3] + 0.01 * st[0] + 0.1 * st[1] > 0.0 ? 1 : 0;
    const auto r = env.step(a);
    BOOST_TEST_REQUIRE(!r.terminated);
    BOOST_TEST(r.truncated == (s == 500));
  }
  // Python reference of the same controller: x after 500 steps. The bang-bang controller chatters,
  // so last-bit differences (theta_dot**2 is pow() in Python) grow over 500 steps: 1e-3.
  BOOST_TEST(env.state()[0] == 1.3136904728097718, boost::test_tools::tolerance(1e-3));
  // reset draws the state uniformly in [-0.05, 0.05]^4 and restarts the step count.
  hone::replay_rng rng(3);
  for (int k = 0; k < 100; ++k) {
    const auto obs = env.reset(rng);
    BOOST_TEST(env.steps() == 0);
    for (float v : obs) BOOST_TEST((v >= -0.05f && v <= 0.05f));
  }
}

BOOST_AUTO_TEST_CASE(qnet_backward_matches_finite_differences) {
  using dqn_cartpole::qnet;
  const qnet net;
  hone::replay_rng rng(11);
  std::vector<float> p = net.init(rng);
  constexpr std::size_t m = 5;
  std::vector<float> x(m * 4), dq(m * 2);
  for (auto& v : x) v = static_cast<float>(2.0 * rng.uniform() - 1.0);
  for (auto& v : dq) v = static_cast<float>(2.0 * rng.uniform() - 1.0);
  qnet::activations act;
  qnet::scratch s;
  std::vector<float> grad(net.size());
  net.forward(p.data(), x.data(), m, act);
  net.backward(p.data(), x.data(), m, act, dq.data(), grad.data(), s);
  // f(p) = sum dq * q(p), evaluated by an independent scalar forward pass in double and
  // differentiated numerically for a sample of parameters of every slot.
  const auto f = [&](const std::vector<double>& q) {
    const auto& L = net.layout();
    const std::size_t h = qnet::hidden;
    double sum = 0.0;
    for (std::size_t r = 0; r < m; ++r) {
      std::vector<double> h1(h), h2(h);
      for (std::size_t j = 0; j < h; ++j) {
        double z = q[L[1].offset + j];
        for (std::size_t i = 0; i < 4; ++i) z += x[r * 4 + i] * q[L[0].offset + i * h + j];
        h1[j] = std::max(z, 0.0);
      }
      for (std::size_t j = 0; j < h; ++j) {
        double z = q[L[3].offset + j];
        for (std::size_t i = 0; i < h; ++i) z += h1[i] * q[L[2].offset + i * h + j];
        h2[j] = std::max(z, 0.0);
      }
      for (std::size_t a = 0; a < 2; ++a) {
        double z = q[L[5].offset + a];
        for (std::size_t i = 0; i < h; ++i) z += h2[i] * q[L[4].offset + i * 2 + a];
        sum += dq[r * 2 + a] * z;
      }
    }
    return sum;
  };
  const std::vector<double> pd(p.begin(), p.end());
  BOOST_TEST(f(pd) != 0.0);
  std::size_t checked = 0;
  for (std::size_t slot = 0; slot < net.layout().size(); ++slot) {
    const auto& sl = net.layout()[slot];
    for (std::size_t k = 0; k < 12; ++k) {
      const std::size_t i = sl.offset + (k * 7919) % sl.count;
      std::vector<double> plus = pd, minus = pd;
      const double h = 1e-6;
      plus[i] += h;
      minus[i] -= h;
      const double numeric = (f(plus) - f(minus)) / (2.0 * h);
      BOOST_TEST(std::abs(grad[i] - numeric) <= 1e-5 + 1e-3 * std::abs(numeric),
                 "slot " << slot << " element " << i << ": backward " << grad[i]
                         << ", finite differences " << numeric);
      if (std::abs(numeric) > 1e-6) ++checked;
    }
  }
  BOOST_TEST(checked > 30u);  // not all zero (dead ReLUs)
}

BOOST_AUTO_TEST_CASE(one_actor_is_deterministic) {
  dqn_cartpole::dqn_config c;
  c.max_steps = 1536;  // three training rounds of 128 updates once learning has started
  c.eval_every = 512;
  c.eval_episodes = 5;
  c.buffer_size = 4096;
  const auto run = [](const dqn_cartpole::dqn_config& cfg) {
    dqn_cartpole::agent a(cfg);
    const auto r = a.train();
    return std::make_pair(a.online(), r);
  };
  const auto [p1, r1] = run(c);
  const auto [p2, r2] = run(c);
  BOOST_TEST(r1.gradient_steps == 384u);  // rounds ending at 1024, 1280 and 1536
  BOOST_TEST(p1 == p2);
  BOOST_TEST_REQUIRE(r1.evals.size() == r2.evals.size());
  for (std::size_t i = 0; i < r1.evals.size(); ++i) {
    BOOST_TEST(r1.evals[i].eval.mean == r2.evals[i].eval.mean);
    BOOST_TEST(r1.evals[i].loss == r2.evals[i].loss);
  }
  BOOST_TEST(r1.episodes == r2.episodes);
  c.seed = 1;
  const auto [p3, r3] = run(c);
  BOOST_TEST((p3 != p1));
}

BOOST_AUTO_TEST_CASE(actors_on_other_ranks_deliver_every_step_and_are_deterministic) {
  dqn_cartpole::dqn_config c;
  c.max_steps = 1536;  // six rounds of 256 steps; training after the rounds ending at 1024, 1280
  c.eval_every = 512;
  c.eval_episodes = 5;
  c.buffer_size = 4096;
  struct outcome {
    std::vector<float> params;
    dqn_cartpole::run_result result;
    std::vector<std::uint64_t> sent;
  };
  const auto run = [](const dqn_cartpole::dqn_config& cfg, int ranks) {
    outcome out;
    out.sent.assign(static_cast<std::size_t>(ranks), 0);
    thread_group g(ranks);
    g.run([&](int r) {
      thread_comm comm(g, r);
      if (r == 0) {
        dqn_cartpole::agent a(cfg);
        out.result = a.train_learner(comm);
        out.params = a.online();
      } else {
        out.sent[static_cast<std::size_t>(r)] = dqn_cartpole::run_remote_actor(cfg, comm);
      }
    });
    return out;
  };
  const outcome one = run(c, 3);
  const outcome two = run(c, 3);
  BOOST_TEST(!one.result.solved);
  BOOST_TEST(one.result.env_steps == 1536u);
  BOOST_TEST(one.result.gradient_steps == 256u);  // after the rounds ending at 1024 and 1280
  // Six rounds of 256 steps, 128 per actor (the stop round's blocks are empty: at 1536 steps the
  // quota is 0).
  BOOST_TEST(one.sent[1] == 768u);
  BOOST_TEST(one.sent[2] == 768u);
  BOOST_TEST(one.result.gate.accepted == 1536u);
  BOOST_TEST(one.result.gate.dropped == 0u);
  BOOST_TEST(one.result.gate.max_lag_seen <= 1u);  // actors act one version behind at most
  BOOST_TEST(one.params == two.params);
  BOOST_TEST(one.result.episodes == two.result.episodes);
  BOOST_TEST_REQUIRE(one.result.evals.size() == two.result.evals.size());
  for (std::size_t i = 0; i < one.result.evals.size(); ++i) {
    BOOST_TEST(one.result.evals[i].eval.mean == two.result.evals[i].eval.mean);
    BOOST_TEST(one.result.evals[i].loss == two.result.evals[i].loss);
  }
  // The blocks of rounds 5 and 6 were acted with the version the actors got at rounds 4 and 5,
  // one publication before the learner's when they arrive: max_lag 0 drops exactly those.
  c.max_lag = 0;
  const outcome strict = run(c, 3);
  BOOST_TEST(strict.result.gate.dropped == 512u);
  BOOST_TEST(strict.result.gate.accepted == 1024u);
  BOOST_TEST(strict.result.gate.max_lag_seen == 1u);
  BOOST_TEST(strict.result.gradient_steps == 256u);
}

BOOST_AUTO_TEST_CASE(plain_dqn_stores_one_step_transitions_and_samples_uniformly) {
  dqn_cartpole::dqn_config c;
  c.max_steps = 1280;  // two training rounds once learning has started
  c.eval_every = 640;
  c.eval_episodes = 2;
  c.buffer_size = 4096;
  BOOST_CHECK_THROW(dqn_cartpole::dqn_agent{c}, std::exception);  // c.algo is the default
  const auto sampled = [](auto& agent) {
    const auto r = agent.train();
    BOOST_TEST(r.gradient_steps == 256u);
    hone::replay_batch<dqn_cartpole::transition> batch;
    agent.buffer().sample(512, batch);
    return std::make_pair(std::vector<float>(batch.template get<"reward">().begin(),
                                             batch.template get<"reward">().end()),
                          std::vector<float>(batch.template get<"discount">().begin(),
                                             batch.template get<"discount">().end()));
  };
  dqn_cartpole::agent per(c);
  const auto [per_rewards, per_discounts] = sampled(per);
  // 3-step returns: most items (those three or more steps from their episode's end) hold
  // 1 + gamma + gamma^2 and gamma^3.
  BOOST_TEST(*std::max_element(per_rewards.begin(), per_rewards.end()) > 2.9f);
  c.algo = dqn_cartpole::algorithm::dqn;
  dqn_cartpole::dqn_agent plain(c);
  const auto [rewards, discounts] = sampled(plain);
  const float gamma = static_cast<float>(c.gamma);
  BOOST_TEST(std::all_of(rewards.begin(), rewards.end(), [](float r) { return r == 1.0f; }));
  BOOST_TEST(
      std::all_of(discounts.begin(), discounts.end(), [gamma](float d) { return d == gamma; }));
  hone::replay_batch<dqn_cartpole::transition> batch;
  plain.buffer().sample(64, batch);
  const auto w = batch.weights();
  BOOST_TEST(std::all_of(w.begin(), w.end(), [](float x) { return x == 1.0f; }));
  // Its learning differs from the default agent's from the same seed.
  BOOST_TEST((plain.online() != per.online()));
}
