#!/usr/bin/env python3
"""Peer: a feature cache as a Python data pipeline keeps one, cachetools.LRUCache of numpy arrays
behind a threading.Lock (cachetools' caches are not thread-safe on their own), the counterpart of
bench_feature_cache's RAM-hit workloads (bench/feature_cache.cpp):

  fc_hit_256B   4096 resident features of 64 float32 (256 bytes)
  fc_hit_16KB   4096 resident features of 4096 float32 (16 KiB)

One call looks up the 4096 keys (ints) once in a fixed shuffled order, each a hit (cache[k]
under the lock, which also moves the entry to the most recent end), and copies the feature into a
row of a 64-row batch array (rows[i % 64] = f), as bench_feature_cache's consumer does. Records
GB/s of feature bytes and lookups_per_s. One Python thread (the GIL serializes a second one).
"""
from __future__ import annotations

import random
import statistics
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (Bench, Workload, package_version, parser, repeat, run,  # noqa: E402
                     select, throughput, unavailable)

IMPL = "cachetools"
WORKLOADS = {"fc_hit_256B": 64, "fc_hit_16KB": 4096}
KEYS = 4096
ROWS = 64


def main(argv: list[str]) -> int:
    args = parser(__doc__).parse_args(argv)
    workloads = select(WORKLOADS, IMPL, args.filter)
    if not workloads:
        return run(args, [], [], IMPL)
    try:
        import cachetools  # noqa: PLC0415
        import numpy as np  # noqa: PLC0415
    except Exception as e:  # ImportError, or a broken install
        return run(args, [], unavailable(workloads, IMPL, f"could not be imported: {e}"), IMPL)
    peer = (f"cachetools {package_version(cachetools, 'cachetools')} LRUCache + threading.Lock, "
            f"numpy {np.__version__} arrays")

    def setup(w: str) -> Bench:
        width = WORKLOADS[w]
        rng = np.random.default_rng(width)
        cache = cachetools.LRUCache(maxsize=2 * KEYS)
        lock = threading.Lock()
        for k in range(KEYS):
            cache[k] = (rng.integers(0, 256, width) / 255).astype(np.float32)
        order = list(range(KEYS))
        random.Random(width).shuffle(order)
        rows = np.empty((ROWS, width), dtype=np.float32)

        def one_pass():
            for i, k in enumerate(order):
                with lock:
                    f = cache[k]
                rows[i % ROWS] = f
            return rows

        nbytes = KEYS * width * 4
        return Bench(repeat(one_pass, args.min_time), record=lambda seconds: throughput(
            w, IMPL, seconds, nbytes, 1, lookups_per_s=KEYS / statistics.median(seconds),
            peer=peer, what=f"{KEYS} lookups of resident {width * 4}-byte features, each copied"
                            f" into a row of a {ROWS}-row batch"))

    return run(args, [Workload(w, IMPL, lambda w=w: setup(w)) for w in workloads], [], IMPL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
