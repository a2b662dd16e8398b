#!/usr/bin/env python3
"""Peer: byte-plane shuffle (numpy) + zstd level 1 (the `zstandard` package), the method of the
ANCHORS compression figures and of Blosc / ZipNN byte grouping, on the very bytes hone compresses
in bench_checkpoint's ckpt_compress_* workloads.

  ckpt_compress_adam_v        fp32 Adam v (exp_avg_sq) of bench_checkpoint's trained model
  ckpt_compress_bf16_weights  its weights as bf16

The trained tensor (`bench_checkpoint --hone_print_data=<workload>`, written by scripts/bench
next to the sizes) is replicated to 64 MiB of raw bytes as hone does, every copy compressed on
its own: byte k of every element gathered into plane k (numpy), the planes concatenated, one zstd
frame at level 1 per copy. With --threads N > 1 the copies are compressed by
ZstdCompressor.multi_compress_to_buffer on N threads (zstandard's own batch API; the shuffles run
first, on one thread, and are timed). Records GB/s of raw bytes and "compress_ratio" (raw /
compressed), plus "compress_ratio_unshuffled" (zstd-1 on the raw bytes).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (Bench, Workload, package_version, parser, read_data,  # noqa: E402
                     repeat, run, select, throughput, unavailable)

IMPL = "zstd_shuffle"
WORKLOADS = {"ckpt_compress_adam_v": 4, "ckpt_compress_bf16_weights": 2}  # bytes per element
RAW_BYTES = 64 << 20  # bench_checkpoint's compress_raw_bytes


def main(argv: list[str]) -> int:
    args = parser(__doc__).parse_args(argv)
    workloads = select(WORKLOADS, IMPL, args.filter)
    if not workloads:
        return run(args, [], [], IMPL)
    try:
        import numpy as np  # noqa: PLC0415
        import zstandard  # noqa: PLC0415
    except Exception as e:  # ImportError, or a broken install
        return run(args, [], unavailable(workloads, IMPL, f"could not be imported: {e}"), IMPL)

    def setup(w: str) -> Bench:
        item = WORKLOADS[w]
        data = read_data(args.sizes_dir, w, "bench_checkpoint")
        if len(data) == 0 or len(data) % item != 0:
            raise SystemExit(f"zstd_shuffle.py: the data of {w} is {len(data)} bytes, not a whole "
                             f"number of {item}-byte elements")
        tensor = np.frombuffer(data, dtype=np.uint8)
        copies = RAW_BYTES // len(data)
        inputs = [tensor] * copies  # the same bytes per copy, as hone's tensors
        cctx = zstandard.ZstdCompressor(level=1)

        def shuffle(a):
            return np.ascontiguousarray(a.reshape(-1, item).T).tobytes()

        def compress():
            planes = [shuffle(a) for a in inputs]
            if args.threads > 1:
                out = cctx.multi_compress_to_buffer(planes, threads=args.threads)
                return sum(len(out[i]) for i in range(len(out)))
            return sum(len(cctx.compress(p)) for p in planes)

        stored = compress()
        unshuffled = len(cctx.compress(data)) * copies
        raw = len(data) * copies
        return Bench(repeat(compress, args.min_time), lambda seconds: throughput(
            w, IMPL, seconds, raw, args.threads, compress_ratio=raw / stored,
            compress_ratio_unshuffled=raw / unshuffled,
            peer=f"numpy {np.__version__} byte shuffle + zstandard "
                 f"{package_version(zstandard, 'zstandard')} level 1",
            what=f"{copies} copies of {len(data)} bytes, one frame per copy"))

    return run(args, [Workload(w, IMPL, lambda w=w: setup(w)) for w in workloads], [], IMPL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
