#!/usr/bin/env python3
"""Peer: Stable-Baselines3's DQN on Gymnasium's CartPole-v1, the sb3 side of
dqn_cartpole_time_to_solve (the hone side is bench_dqn, bench/dqn.cpp): wall-clock training time
until the greedy policy solves CartPole.

  Hyperparameters: rl-baselines3-zoo's hyperparams/dqn.yml for CartPole-v1: n_timesteps 5e4,
  learning_rate 2.3e-3, batch_size 64, buffer_size 100000, learning_starts 1000, gamma 0.99,
  target_update_interval 10, train_freq 256, gradient_steps 128, exploration_fraction 0.16,
  exploration_final_eps 0.04 (initial 1.0), net_arch [256, 256]; SB3's defaults for the rest
  (ReLU, Adam, smooth L1 loss, max_grad_norm 10). Training may run past n_timesteps (up to
  --max-steps), and SB3 anneals epsilon over exploration_fraction of learn()'s total_timesteps,
  so the fraction passed is 0.16 * 5e4 / max_steps: epsilon reaches 0.04 after 8000 steps, as
  in the zoo's run.
  Solved: every 2000 environment steps once learning has started (steps 2000, 4000, ...; learning
  starts after step 1000), the clock stops and 100 greedy episodes (deterministic=True) run on
  separate CartPole-v1 environments, episode i from reset(seed=1000000 + i) at every evaluation;
  solved when their mean return is >= 475. Training stops at the first solving evaluation, or
  gives up at --max-steps (100000) environment steps (not solved).
  Time to solve: training seconds only (environment steps and learning, SB3's own bookkeeping
  included; evaluations excluded), from the start of learn()'s loop to the environment step
  before the solving evaluation. A seed that gives up contributes its time to give up.

One sample per seed (--seeds, default 0,1,2: DQN(seed=s), which seeds torch, numpy and the
training environment); torch on --threads threads (default 1), CPU. Writes one record in the
results.json format (see bench/report.py):
  {"name": "dqn_cartpole_time_to_solve", "impl": "sb3", "metric": "time", "unit": "ms",
   "samples_ms": [per seed], "env_steps_to_solve": median over the seeds (a seed that gives up
   counts its --max-steps, as bench_dqn's counter does),
   "solved": fraction of seeds solved, "seeds", "env_steps_per_seed", "solved_per_seed",
   "mean_return_per_seed" (of the last evaluation), ...}
When stable_baselines3 or gymnasium cannot be imported, or every seed fails, it writes
{"available": false, "note": ...} and exits 0; a seed that raises is listed in "errors".

Options: --seeds LIST, --threads N, --max-steps N, --filter REGEX (on
"dqn_cartpole_time_to_solve/sb3"), --out FILE; --sizes-dir, --repetitions, --min-time are
accepted (scripts/bench passes them to every peer) and ignored.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

WORKLOAD = "dqn_cartpole_time_to_solve"
IMPL = "sb3"
N_TIMESTEPS = 50_000  # the zoo's budget; sets the exploration schedule
HYPERPARAMS = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                   learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
                   gradient_steps=128, exploration_initial_eps=1.0, exploration_final_eps=0.04,
                   policy_kwargs=dict(net_arch=[256, 256]))
EXPLORATION_FRACTION = 0.16
EVAL_EVERY = 2000
EVAL_EPISODES = 100
EVAL_SEED_BASE = 1_000_000
SOLVED_RETURN = 475.0


def greedy_mean_return(policy, envs) -> float:
    """Mean return of one greedy episode on each of envs (episode i from reset(seed=base + i)),
    the episodes stepped side by side so the policy sees one batch of observations per step."""
    import numpy as np  # noqa: PLC0415

    obs = np.stack([env.reset(seed=EVAL_SEED_BASE + i)[0] for i, env in enumerate(envs)])
    returns = np.zeros(len(envs))
    active = np.ones(len(envs), dtype=bool)
    while active.any():
        idx = np.flatnonzero(active)
        actions, _ = policy.predict(obs[idx], deterministic=True)
        for j, a in zip(idx, actions):
            o, r, terminated, truncated, _ = envs[j].step(int(a))
            returns[j] += r
            obs[j] = o
            if terminated or truncated:
                active[j] = False
    return float(returns.mean())


def train_seed(seed: int, max_steps: int, sb3, gym) -> dict:
    """One DQN run: training seconds, environment steps, solved or not."""
    from stable_baselines3.common.callbacks import BaseCallback  # noqa: PLC0415

    eval_envs = [gym.make("CartPole-v1") for _ in range(EVAL_EPISODES)]
    learning_starts = HYPERPARAMS["learning_starts"]

    class SolveCallback(BaseCallback):
        def __init__(self):
            super().__init__()
            self.t0 = 0.0
            self.eval_seconds = 0.0
            self.train_seconds = 0.0
            self.steps = 0
            self.solved = False
            self.mean_return = float("nan")
            self.evaluations = 0

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            t = self.num_timesteps
            if t <= learning_starts or t % EVAL_EVERY != 0:
                return True
            paused = time.perf_counter()
            self.train_seconds = paused - self.t0 - self.eval_seconds
            self.steps = t
            self.mean_return = greedy_mean_return(self.model.policy, eval_envs)
            self.evaluations += 1
            self.eval_seconds += time.perf_counter() - paused
            self.solved = self.mean_return >= SOLVED_RETURN
            return not self.solved and t < max_steps

    model = sb3.DQN("MlpPolicy", gym.make("CartPole-v1"), seed=seed, device="cpu", verbose=0,
                    exploration_fraction=EXPLORATION_FRACTION * N_TIMESTEPS / max_steps,
                    **HYPERPARAMS)
    cb = SolveCallback()
    # SB3 collects whole train_freq rollouts, so the rollout holding step max_steps (a multiple of
    # EVAL_EVERY) reaches its evaluation, whose callback ends the run.
    model.learn(total_timesteps=max_steps, callback=cb)
    for env in eval_envs:
        env.close()
    if cb.evaluations == 0:
        raise RuntimeError(f"no evaluation ran in {max_steps} steps (evaluations every "
                           f"{EVAL_EVERY} steps after step {learning_starts})")
    return {"seconds": cb.train_seconds, "steps": cb.steps, "solved": cb.solved,
            "mean_return": cb.mean_return}


def main(argv: list[str]) -> int:
    ap = _common.parser(__doc__, threads=1)
    ap.add_argument("--seeds", default=os.environ.get("HONE_DQN_SEEDS", "0,1,2"),
                    help="comma-separated training seeds (default: $HONE_DQN_SEEDS, read by "
                    "bench_dqn too, else 0,1,2)")
    ap.add_argument("--max-steps", type=int, default=100_000,
                    help="give up after this many environment steps")
    args = ap.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--seeds takes comma-separated integers, got {args.seeds!r}")
    if not seeds:
        ap.error("--seeds names no seed")
    if args.max_steps < EVAL_EVERY or args.max_steps % EVAL_EVERY:
        ap.error(f"--max-steps must be a positive multiple of {EVAL_EVERY} (the evaluations' "
                 f"period), got {args.max_steps}")

    if not _common.select([WORKLOAD], IMPL, args.filter):
        return _common.run(args, [], [], IMPL)
    try:
        import gymnasium as gym  # noqa: PLC0415  (optional dependencies)
        import stable_baselines3 as sb3  # noqa: PLC0415
        import torch  # noqa: PLC0415
    except Exception as e:  # ImportError, or a broken install
        return _common.run(args, [], _common.unavailable(
            [WORKLOAD], IMPL, f"stable_baselines3/gymnasium could not be imported: {e}"), IMPL)

    torch.set_num_threads(args.threads)
    # One sample per seed. Measuring: every seed once (--repetitions is ignored). Serving: each
    # request trains the next seed of the list (cycling), as bench_dqn's repetitions do.
    runs: list[tuple[int, dict]] = []
    errors: list[str] = []
    turn = {"next": 0}

    def train_next() -> float:
        seed = seeds[turn["next"] % len(seeds)]
        turn["next"] += 1
        try:
            r = train_seed(seed, args.max_steps, sb3, gym)
        except Exception as e:  # noqa: BLE001  (reported, not fatal)
            errors.append(f"seed {seed}: {type(e).__name__}: {e}")
            raise
        runs.append((seed, r))
        print(f"sb3_dqn_cartpole: seed {seed}: {'solved' if r['solved'] else 'not solved'} "
              f"at {r['steps']} steps, {r['seconds']:.1f} s of training, mean return "
              f"{r['mean_return']:.1f}", file=sys.stderr)
        return r["seconds"]

    def record(seconds: list[float]) -> dict:
        done = runs[-len(seconds):]  # the runs these samples come from
        solved = [r["solved"] for _, r in done]
        steps = [r["steps"] for _, r in done]
        rec = _common.time_ms(
            WORKLOAD, IMPL, seconds, torch.get_num_threads(),
            env_steps_to_solve=statistics.median(steps),
            solved=sum(solved) / len(done),
            # Per sample, so that records of single samples (serve mode) pool correctly.
            counter_samples={"env_steps_to_solve": [float(x) for x in steps],
                             "solved": [1.0 if x else 0.0 for x in solved]},
            seeds=[s for s, _ in done],
            env_steps_per_seed=steps,
            solved_per_seed=solved,
            mean_return_per_seed=[r["mean_return"] for _, r in done],
            max_steps=args.max_steps,
            peer=(f"stable-baselines3 {sb3.__version__}, gymnasium {gym.__version__}, torch "
                  f"{torch.__version__}: DQN (rl-zoo CartPole-v1 hyperparameters), CPU"),
            what=(f"training time until {EVAL_EPISODES} greedy episodes average >= "
                  f"{SOLVED_RETURN:g} (evaluated every {EVAL_EVERY} steps, evaluation excluded), "
                  f"one sample per seed"))
        if errors:
            rec["errors"] = list(errors)
        return rec

    if args.serve:
        return _common.run(args, [_common.Workload(
            WORKLOAD, IMPL, lambda: _common.Bench(train_next, record))], [], IMPL)

    seconds = []
    for _ in seeds:
        try:
            seconds.append(train_next())
        except Exception:  # noqa: BLE001  (in errors)
            pass
    if not runs:
        return _common.write(_common.unavailable([WORKLOAD], IMPL, "; ".join(errors)), args.out)
    return _common.write([record(seconds)], args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
