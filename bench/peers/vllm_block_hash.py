#!/usr/bin/env python3
"""Peer: vLLM's prefix-cache block hashing, for bench_serve_kv's kv_prefix_lookup workload.

  kv_prefix_lookup   the 128 block hashes of a 2048-token prompt (blocks of 16 tokens) and a dict
                     lookup of each, per token

vLLM itself is not installed here (it pins its own torch and CUDA builds); this peer runs the
algorithm of vLLM v1's vllm/v1/core/kv_cache_utils.py with the standard library, as vLLM does in
Python: hash_block_tokens(sha256, parent_hash, block_tokens, extra_keys=None) =
int.from_bytes(hashlib.sha256(pickle.dumps((parent_hash, tuple(tokens), None),
protocol=pickle.HIGHEST_PROTOCOL)).digest(), "big"), chained from a random NONE_HASH, then
cached_block_hash_to_block[hash] (a dict) per block. Records the time per prompt and
"ns_per_token". Stated in docs/benchmarks.md as vLLM's algorithm, not vLLM's package.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Bench, Workload, parser, repeat, run, select, time_us  # noqa: E402

IMPL = "vllm_sha256"
WORKLOADS = ["kv_prefix_lookup"]
TOKENS, BLOCK = 2048, 16


def sha256(obj) -> int:
    return int.from_bytes(hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
                          .digest(), byteorder="big")


NONE_HASH = int.from_bytes(os.urandom(32), byteorder="big")


def hash_block_tokens(parent_hash, tokens, extra_keys=None) -> int:
    if not parent_hash:
        parent_hash = NONE_HASH
    return sha256((parent_hash, tuple(tokens), extra_keys))


def main(argv: list[str]) -> int:
    args = parser(__doc__, threads=1).parse_args(argv)
    workloads = select(WORKLOADS, IMPL, args.filter)

    def setup(w: str) -> Bench:
        rng = random.Random(1)
        prompt = [rng.randrange(32000) for _ in range(TOKENS)]
        blocks = [prompt[i:i + BLOCK] for i in range(0, TOKENS, BLOCK)]
        cached: dict[int, int] = {}
        parent = None
        for i, b in enumerate(blocks):
            parent = hash_block_tokens(parent, b)
            cached[parent] = i

        def lookup() -> int:
            parent, found = None, 0
            for b in blocks:
                parent = hash_block_tokens(parent, b)
                if cached.get(parent) is None:
                    break
                found += BLOCK
            if found != TOKENS:
                raise SystemExit("vllm_block_hash.py: the cached prompt was not found")
            return found

        return Bench(repeat(lookup, args.min_time), lambda seconds: time_us(
            w, IMPL, seconds, 1, ns_per_token=min(seconds) * 1e9 / TOKENS,
            ns_per_token_median=sorted(seconds)[len(seconds) // 2] * 1e9 / TOKENS,
            peer=f"vLLM v1's hash_block_tokens algorithm (sha256 of pickle), Python "
                 f"{sys.version.split()[0]}", what=f"{TOKENS} tokens, blocks of {BLOCK}"))

    return run(args, [Workload(w, IMPL, lambda w=w: setup(w)) for w in workloads], [], IMPL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
