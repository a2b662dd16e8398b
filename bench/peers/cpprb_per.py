#!/usr/bin/env python3
"""Peer: cpprb's PrioritizedReplayBuffer (C++ float sum/min segment tree behind a Cython API) on
hone's per_sample_256_* and per_update_256_* workloads of bench_rl (bench/rl.cpp):

  per_sample_256_<N>  rb.sample(256, beta=0.4) from a full buffer of N CartPole-sized transitions
                      (obs float[4], act int32, rew float, next_obs float[4], terminated,
                      truncated) with random priorities (|TD| uniform in [0, 1), alpha 0.6,
                      eps 1e-6): indexes, weights and the gathered fields, as hone's sample does.
  per_update_256_<N>  rb.update_priorities(256 indexes, 256 values), indexes uniform over the
                      buffer (1024 pre-drawn batches, cycled).
N is 2^20, 2^24 and 2^26 (1M, 16M, 64M); one core (cpprb's calls are single-threaded).

Writes results in the results.json format (see bench/report.py) with "time_unit": "us". When
cpprb cannot be imported it writes {"impl": "cpprb", "available": false, "note": ...} records and
exits 0, so scripts/bench --peers keeps going.

Options: --sizes-dir DIR (files <workload>.txt: capacity and batch size, one per line, as
scripts/bench writes them with `bench_rl --hone_print_sizes=<workload>`), --threads (ignored: one
core), --repetitions, --min-time (seconds per repetition), --filter REGEX (on
"<workload>/cpprb"), --out FILE.
The workload loop is bench/peers/_common/per.py's, shared with the other prioritized-replay peer.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from _common import per  # noqa: E402

IMPL = "cpprb"


def main(argv: list[str]) -> int:
    args = _common.parser(__doc__, threads=1).parse_args(argv)

    wanted = _common.select(per.workloads(), IMPL, args.filter)
    results: list[dict] = []
    try:
        import cpprb  # noqa: PLC0415  (optional dependency)
        import numpy as np  # noqa: PLC0415
    except Exception as e:  # ImportError, or a broken install
        results = _common.unavailable(wanted, IMPL, f"cpprb could not be imported: {e}")
        cpprb = None

    if cpprb is not None:
        def build(cap: int, batch: int):
            rng = np.random.default_rng(1)
            rb = cpprb.PrioritizedReplayBuffer(
                cap, {"obs": {"shape": 4}, "act": {"dtype": np.int32}, "rew": {},
                      "next_obs": {"shape": 4}, "terminated": {"dtype": np.bool_},
                      "truncated": {"dtype": np.bool_}}, alpha=0.6, eps=1e-6)
            chunk = min(cap, 1 << 20)
            for first in range(0, cap, chunk):
                rb.add(obs=rng.random((chunk, 4), dtype=np.float32),
                       act=rng.integers(0, 2, chunk, dtype=np.int32),
                       rew=rng.random(chunk, dtype=np.float32),
                       next_obs=rng.random((chunk, 4), dtype=np.float32),
                       terminated=np.zeros(chunk, np.bool_), truncated=np.zeros(chunk, np.bool_))
                rb.update_priorities(np.arange(first, first + chunk), rng.random(chunk))
            idx = rng.integers(0, cap, (per.KEY_POOL, batch))
            pri = rng.random((per.KEY_POOL, batch))
            return (lambda: rb.sample(batch, beta=0.4),
                    lambda i: rb.update_priorities(idx[i], pri[i]))

        version = _common.package_version(cpprb, "cpprb")
        return _common.run(args, per.workload_list(
            IMPL, wanted, args.sizes_dir, args.min_time, build,
            f"cpprb {version}: PrioritizedReplayBuffer (alpha 0.6, eps 1e-6)",
            {"sample": "rb.sample(256, beta=0.4): indexes, weights, gathered fields",
             "update": "rb.update_priorities(256 indexes, 256 values)"}), [], IMPL)

    return _common.run(args, [], results, IMPL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
