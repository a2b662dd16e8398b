#!/usr/bin/env python3
"""Peer: TorchRL's TensorDictPrioritizedReplayBuffer (LazyTensorStorage, C++ segment trees) on
hone's per_sample_256_* and per_update_256_* workloads of bench_rl (bench/rl.cpp):

  per_sample_256_<N>  rb.sample() (batch_size 256, beta 0.4) from a full buffer of N
                      CartPole-sized transitions (obs float[4], action int32, reward float,
                      next_obs float[4], terminated, truncated) with random priorities (|TD|
                      uniform in [0, 1), alpha 0.6, eps 1e-6): a TensorDict with the gathered
                      fields, "index" and the importance weights.
  per_update_256_<N>  rb.update_priority(256 indexes, 256 values), indexes uniform over the
                      buffer (1024 pre-drawn batches, cycled).
N is 2^20, 2^24 and 2^26 (1M, 16M, 64M); one core (torch.set_num_threads(1)).

Writes results in the results.json format (see bench/report.py) with "time_unit": "us". When
torchrl cannot be imported it writes {"impl": "torchrl", "available": false, "note": ...} records
and exits 0, so scripts/bench --peers keeps going.

Options: --sizes-dir DIR (files <workload>.txt: capacity and batch size, as scripts/bench writes
them with `bench_rl --hone_print_sizes=<workload>`), --threads (ignored: one core),
--repetitions, --min-time (seconds per repetition), --filter REGEX (on "<workload>/torchrl"),
--out FILE.
The workload loop is bench/peers/_common/per.py's, shared with the other prioritized-replay peer.
"""
from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from _common import per  # noqa: E402

IMPL = "torchrl"


def main(argv: list[str]) -> int:
    args = _common.parser(__doc__, threads=1).parse_args(argv)

    wanted = _common.select(per.workloads(), IMPL, args.filter)
    results: list[dict] = []
    torch = None
    if wanted:
        try:
            warnings.filterwarnings("ignore")
            logging.disable(logging.WARNING)
            import torch  # noqa: PLC0415  (optional dependency)
            import torchrl  # noqa: PLC0415
            from tensordict import TensorDict  # noqa: PLC0415
            from torchrl.data import (  # noqa: PLC0415
                LazyTensorStorage, TensorDictPrioritizedReplayBuffer)
        except Exception as e:  # ImportError, or a broken install
            results = _common.unavailable(wanted, IMPL, f"torchrl could not be imported: {e}")
            torch = None

    if torch is not None:
        torch.set_num_threads(1)

        def build(cap: int, batch: int):
            gen = torch.Generator().manual_seed(1)
            rb = TensorDictPrioritizedReplayBuffer(
                alpha=0.6, beta=0.4, eps=1e-6, priority_key="td_error",
                storage=LazyTensorStorage(cap), batch_size=batch)
            chunk = min(cap, 1 << 20)
            for first in range(0, cap, chunk):
                td = TensorDict({
                    "obs": torch.rand(chunk, 4, generator=gen),
                    "action": torch.randint(0, 2, (chunk,), dtype=torch.int32, generator=gen),
                    "reward": torch.rand(chunk, generator=gen),
                    "next_obs": torch.rand(chunk, 4, generator=gen),
                    "terminated": torch.zeros(chunk, dtype=torch.bool),
                    "truncated": torch.zeros(chunk, dtype=torch.bool)}, batch_size=[chunk])
                rb.extend(td)
                rb.update_priority(torch.arange(first, first + chunk),
                                   torch.rand(chunk, generator=gen))
            idx = torch.randint(0, cap, (per.KEY_POOL, batch), generator=gen)
            pri = torch.rand(per.KEY_POOL, batch, generator=gen)
            return rb.sample, lambda i: rb.update_priority(idx[i], pri[i])

        return _common.run(args, per.workload_list(
            IMPL, wanted, args.sizes_dir, args.min_time, build,
            f"torchrl {torchrl.__version__} (torch {torch.__version__}): "
            "TensorDictPrioritizedReplayBuffer + LazyTensorStorage (alpha 0.6, eps 1e-6)",
            {"sample": "rb.sample(): 256 rows, index and importance weights",
             "update": "rb.update_priority(256 indexes, 256 values)"}), [], IMPL)

    return _common.run(args, [], results, IMPL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
