// examples/dqn_cartpole/cartpole.hpp: CartPole with Gymnasium CartPole-v1's dynamics, constants,
// limits and reward (gymnasium/envs/classic_control/cartpole.py, Euler integration):
//
//   force      = action == 1 ? +force_mag : -force_mag
//   temp       = (force + polemass_length * theta_dot^2 * sin(theta)) / total_mass
//   theta_acc  = (g sin(theta) - cos(theta) temp) / (length (4/3 - masspole cos^2(theta) /
//   total_mass)) x_acc      = temp - polemass_length * theta_acc * cos(theta) / total_mass x += tau
//   x_dot;  x_dot += tau x_acc;  theta += tau theta_dot;  theta_dot += tau theta_acc
//
// The episode terminates when |x| > 2.4 or |theta| > 12 degrees, and is truncated after 500 steps
// (TimeLimit, which sets truncated at step 500 even when that step also terminates); every step,
// the terminating one included, gives reward +1. reset() draws the state uniformly in [-0.05,
// 0.05]^4. The state is kept in double (Python floats) and observed as float (Gymnasium returns a
// float32 array).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <hone/rl/rng.hpp>
#include <numbers>

namespace dqn_cartpole {

/// The result of one step.
struct step_result {
  std::array<float, 4> obs{};
  float reward = 0.0f;
  bool terminated = false;
  bool truncated = false;
};

class cartpole {
 public:
  static constexpr double gravity = 9.8;
  static constexpr double masscart = 1.0;
  static constexpr double masspole = 0.1;
  static constexpr double total_mass = masspole + masscart;
  static constexpr double length = 0.5;  // half the pole's length
  static constexpr double polemass_length = masspole * length;
  static constexpr double force_mag = 10.0;
  static constexpr double tau = 0.02;
  static constexpr double theta_threshold = 12.0 * 2.0 * std::numbers::pi / 360.0;
  static constexpr double x_threshold = 2.4;
  static constexpr int max_episode_steps = 500;
  static constexpr int actions = 2;
  static constexpr int observations = 4;

  /// A new episode from `rng`: the state uniform in [-0.05, 0.05]^4.
  std::array<float, 4> reset(hone::replay_rng& rng) {
    for (double& s : state_) s = -0.05 + 0.1 * rng.uniform();
    steps_ = 0;
    return observation();
  }
  /// A new episode from a given state (tests).
  std::array<float, 4> reset_to(const std::array<double, 4>& s) {
    state_ = s;
    steps_ = 0;
    return observation();
  }

  /// One Euler step with action 0 (push left) or 1 (push right).
  step_result step(int action) {
    auto& [x, x_dot, theta, theta_dot] = state_;
    const double force = action == 1 ? force_mag : -force_mag;
    const double costheta = std::cos(theta);
    const double sintheta = std::sin(theta);
    const double temp = (force + polemass_length * theta_dot * theta_dot * sintheta) / total_mass;
    const double thetaacc = (gravity * sintheta - costheta * temp) /
                            (length * (4.0 / 3.0 - masspole * costheta * costheta / total_mass));
    const double xacc = temp - polemass_length * thetaacc * costheta / total_mass;
    x = x + tau * x_dot;
    x_dot = x_dot + tau * xacc;
    theta = theta + tau * theta_dot;
    theta_dot = theta_dot + tau * thetaacc;
    ++steps_;
    step_result r;
    r.obs = observation();
    r.reward = 1.0f;
    r.terminated =
        x < -x_threshold || x > x_threshold || theta < -theta_threshold || theta > theta_threshold;
    r.truncated = steps_ >= max_episode_steps;  // TimeLimit: may coincide with terminated
    return r;
  }

  [[nodiscard]] const std::array<double, 4>& state() const noexcept { return state_; }
  [[nodiscard]] int steps() const noexcept { return steps_; }

 private:
  [[nodiscard]] std::array<float, 4> observation() const noexcept {
    return {static_cast<float>(state_[0]), static_cast<float>(state_[1]),
            static_cast<float>(state_[2]), static_cast<float>(state_[3])};
  }

  std::array<double, 4> state_{};
  int steps_ = 0;
};

}  // namespace dqn_cartpole
