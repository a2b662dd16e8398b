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
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

IMPL = "torchrl"
CAPACITIES = {"1M": 1 << 20, "16M": 1 << 24, "64M": 1 << 26}
BATCH = 256
KEY_POOL = 1024


def workloads() -> list[str]:
    return [f"{kind}_{BATCH}_{suffix}" for suffix in CAPACITIES for kind in ("per_sample",
                                                                              "per_update")]


def read_sizes(workload: str, sizes_dir: Path | None) -> tuple[int, int]:
    if sizes_dir is not None and (sizes_dir / f"{workload}.txt").exists():
        cap, batch = (int(x) for x in (sizes_dir / f"{workload}.txt").read_text().split()[:2])
        return cap, batch
    return CAPACITIES[workload.rsplit("_", 1)[1]], BATCH


def measure(fn, min_time: float, repetitions: int) -> list[float]:
    """Seconds per call, one value per repetition (each runs for at least min_time)."""
    fn()  # warm-up
    calls = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_time * 0.2 or calls >= 1 << 20:
            break
        calls *= 4
    calls = max(1, int(calls * min_time / max(dt, 1e-9)))
    per_call = []
    for _ in range(repetitions):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls)
    return per_call


def record(name: str, times: list[float], what: str, peer: str) -> dict:
    t = statistics.median(times)
    return {"name": name, "impl": IMPL, "metric": "time", "value": t * 1e6, "unit": "us",
            "time_unit": "us", "best": min(times) * 1e6, "time_ms": t * 1e3,
            "repetitions": len(times), "samples_ms": [x * 1e3 for x in times], "threads": 1,
            "peer": peer, "what": what}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes-dir", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--filter", default=".")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    pattern = re.compile(args.filter)
    wanted = [w for w in workloads() if pattern.search(f"{w}/{IMPL}")]
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
            results = [{"name": w, "impl": IMPL, "available": False,
                        "note": f"torchrl could not be imported: {e}"} for w in wanted]
            torch = None

    if torch is not None:
        torch.set_num_threads(1)
        peer = (f"torchrl {torchrl.__version__} (torch {torch.__version__}): "
                "TensorDictPrioritizedReplayBuffer + LazyTensorStorage (alpha 0.6, eps 1e-6)")
        for suffix in CAPACITIES:
            mine = [w for w in wanted if w.endswith("_" + suffix)]
            if not mine:
                continue
            cap, batch = read_sizes(mine[0], args.sizes_dir)
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
            for w in mine:
                if w.startswith("per_sample"):
                    times = measure(rb.sample, args.min_time, args.repetitions)
                    what = "rb.sample(): 256 rows, index and importance weights"
                else:
                    idx = torch.randint(0, cap, (KEY_POOL, batch), generator=gen)
                    pri = torch.rand(KEY_POOL, batch, generator=gen)
                    state = {"i": 0}

                    def update():
                        i = state["i"] % KEY_POOL
                        state["i"] += 1
                        rb.update_priority(idx[i], pri[i])

                    times = measure(update, args.min_time, args.repetitions)
                    what = "rb.update_priority(256 indexes, 256 values)"
                results.append(record(w, times, what, peer))
            del rb

    text = json.dumps(results, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
