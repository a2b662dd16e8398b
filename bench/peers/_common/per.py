"""The prioritized-replay peers' shared driver (bench/peers/cpprb_per.py,
bench/peers/torchrl_per.py): hone's per_sample_256_* and per_update_256_* workloads of bench_rl
(bench/rl.cpp) through a peer's buffer.

  per_sample_256_<N>  one sample of 256 from a full buffer of N CartPole-sized transitions with
                      random priorities (alpha 0.6, eps 1e-6, beta 0.4).
  per_update_256_<N>  one priority update of 256 (index, value) pairs, indexes uniform over the
                      buffer (KEY_POOL pre-drawn batches, cycled).
N is 2^20, 2^24 and 2^26 (1M, 16M, 64M); one core. Microsecond records ("time_unit": "us").
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from . import Bench, Slot, Workload, read_sizes, repeat, time_us

CAPACITIES = {"1M": 1 << 20, "16M": 1 << 24, "64M": 1 << 26}
BATCH = 256
KEY_POOL = 1024


def workloads() -> list[str]:
    return [f"{kind}_{BATCH}_{suffix}" for suffix in CAPACITIES for kind in ("per_sample",
                                                                              "per_update")]


def capacity_and_batch(workload: str, sizes_dir: Path | None) -> tuple[int, int]:
    """Capacity and batch size from sizes_dir/<workload>.txt (as `bench_rl
    --hone_print_sizes=<workload>` prints them), else the defaults above."""
    sizes = read_sizes(sizes_dir, workload)
    if sizes is not None:
        return sizes[0], sizes[1]
    return CAPACITIES[workload.rsplit("_", 1)[1]], BATCH


def workload_list(impl: str, wanted: list[str], sizes_dir: Path | None, min_time: float,
                  build: Callable, peer: str, what: dict) -> list[Workload]:
    """The wanted workloads as Workloads for _common.run. build(cap, batch) fills a buffer of cap
    transitions with random priorities and returns (sample(), update(i)): update(i) applies
    pre-drawn batch i < KEY_POOL of indexes and priorities. The sample and update workloads of
    one capacity share its buffer (kept in a Slot while they run one after the other). what =
    {"sample": ..., "update": ...}."""
    slot = Slot()

    def setup(w: str) -> Bench:
        cap, batch = capacity_and_batch(w, sizes_dir)
        sample, update = slot.get((cap, batch), lambda: build(cap, batch))
        kind = "sample" if w.startswith("per_sample") else "update"
        if kind == "sample":
            fn = sample
        else:
            state = {"i": 0}

            def fn():
                i = state["i"] % KEY_POOL
                state["i"] += 1
                update(i)
        return Bench(repeat(fn, min_time),
                     lambda times: time_us(w, impl, times, 1, peer=peer, what=what[kind]))

    return [Workload(w, impl, lambda w=w: setup(w)) for w in wanted]
