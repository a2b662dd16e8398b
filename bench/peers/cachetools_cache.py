#!/usr/bin/env python3
"""Peer: a prediction cache as a Python server keeps one, cachetools.LRUCache (keys: the request's
input bytes) behind a threading.Lock (cachetools' caches are not thread-safe on their own), the
counterpart of bench_prediction_cache's workloads:

  pc_hit_1KB        one lookup of a cached 1 KB input (1024 distinct random inputs, visited in a
                    fixed shuffled order): the request's bytes object is made from the received
                    buffer (bytes(memoryview)), hashed by the dict, compared on the hit
  pc_miss_put_1KB   a lookup that misses and the insertion of the new entry in a cache held at
                    4096 entries (every insertion evicts the least recently used one)

Records the time per call in microseconds. Python's bytes hash is SipHash-1-3 over the whole
input; the dict compares the stored key with the request's bytes on a hash match, as hone does.
"""
from __future__ import annotations

import random
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (Bench, Workload, package_version, parser, repeat, run,  # noqa: E402
                     select, time_us, unavailable)

IMPL = "cachetools"
WORKLOADS = ["pc_hit_1KB", "pc_miss_put_1KB"]
INPUT_BYTES = 1024
N_INPUTS = 1024
HELD = 4096


def main(argv: list[str]) -> int:
    args = parser(__doc__).parse_args(argv)
    workloads = select(WORKLOADS, IMPL, args.filter)
    if not workloads:
        return run(args, [], [], IMPL)
    try:
        import cachetools  # noqa: PLC0415
    except Exception as e:  # ImportError, or a broken install
        return run(args, [], unavailable(workloads, IMPL, f"could not be imported: {e}"), IMPL)
    peer = f"cachetools {package_version(cachetools, 'cachetools')} LRUCache + threading.Lock"
    rng = random.Random(42)
    buffers = [bytearray(rng.randbytes(INPUT_BYTES)) for _ in range(N_INPUTS)]
    order = list(range(N_INPUTS))
    rng.shuffle(order)
    output = tuple(float(i) for i in range(16))

    def setup_hit() -> Bench:
        cache = cachetools.LRUCache(maxsize=1 << 20)
        lock = threading.Lock()
        for b in buffers:
            cache[bytes(b)] = output
        views = [memoryview(buffers[i]) for i in order]
        state = {"i": 0}

        def hit():
            i = state["i"]
            state["i"] = (i + 1) & (N_INPUTS - 1)
            key = bytes(views[i])
            with lock:
                out = cache.get(key)
            if out is None:
                raise SystemExit("cachetools_cache.py: a cached input missed")

        return Bench(repeat(hit, args.min_time), lambda s: time_us(
            "pc_hit_1KB", IMPL, s, 1, peer=peer, what="1 KB inputs, 1024 cached"))

    def setup_miss_put() -> Bench:
        cache = cachetools.LRUCache(maxsize=HELD)
        lock = threading.Lock()
        buf = bytearray(buffers[0])
        view = memoryview(buf)
        state = {"n": 0}

        def miss_put():
            state["n"] += 1
            buf[0:8] = state["n"].to_bytes(8, "little")
            key = bytes(view)
            with lock:
                if cache.get(key) is not None:
                    raise SystemExit("cachetools_cache.py: a new input hit")
                cache[key] = output

        for _ in range(2 * HELD):
            miss_put()
        return Bench(repeat(miss_put, args.min_time), lambda s: time_us(
            "pc_miss_put_1KB", IMPL, s, 1, peer=peer, what="1 KB inputs, 4096 held"))

    setups = {"pc_hit_1KB": setup_hit, "pc_miss_put_1KB": setup_miss_put}
    return run(args, [Workload(w, IMPL, setups[w]) for w in workloads], [], IMPL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
