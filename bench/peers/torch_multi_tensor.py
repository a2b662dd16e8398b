#!/usr/bin/env python3
"""Peer: PyTorch's multi-tensor axpy, torch._foreach_add_(ys, xs, alpha=a), on the tensors of
hone's multi_tensor_axpy_64M workload (the same sizes, read from the hone benchmark program).

Writes results in the results.json format (see bench/report.py):
  [{"name": "multi_tensor_axpy_64M", "impl": "torch", "metric": "throughput", "value": ...,
    "unit": "GB/s", "best": ..., "time_ms": ..., "repetitions": R, "samples_ms": [...],
    "bytes_per_iter": ..., "threads": N, ...}]
When torch cannot be imported it writes {"impl": "torch", "available": false, "note": ...} and
exits 0, so scripts/bench --peers keeps going.

Options: --sizes-dir DIR (files <workload>.txt, one size per line, as scripts/bench writes them
with `bench_core --hone_print_sizes=<workload>`), --threads (default: all CPUs, like oneTBB),
--repetitions, --min-time (seconds per repetition), --device cpu|cuda (cuda names the workload
<workload>_cuda, as bench_core_gpu does), --filter REGEX (on "<workload>/torch"), --out FILE.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

WORKLOADS = {
    # workload: (bytes per element, description)
    "multi_tensor_axpy_64M": (12, "y += a * x over fp32 tensor lists: read x, y; write y"),
}


def main(argv: list[str]) -> int:
    args = _common.parser(__doc__, device=True).parse_args(argv)

    suffix = "_cuda" if args.device == "cuda" else ""
    workloads = _common.select(WORKLOADS, "torch", args.filter, suffix)
    names = [w + suffix for w in workloads]
    torch, unavailable = _common.import_torch(names, "torch", args.device)
    if torch is None:
        return _common.run(args, [], unavailable, "torch_multi_tensor")
    dev, sync = _common.torch_device(torch, args.threads, args.device)

    def setup(w: str) -> _common.Bench:
        bytes_per_elem, what = WORKLOADS[w]
        sizes = _common.read_sizes(args.sizes_dir, w, "bench_core", suffix)
        total = sum(sizes)
        ys = [torch.empty(n, dtype=torch.float32, device=dev) for n in sizes]
        xs = [torch.empty(n, dtype=torch.float32, device=dev) for n in sizes]
        with torch.no_grad():
            # First touch (and the same values as the hone benchmark: base + (i % 1024)/1024).
            for lst, base in ((ys, 0.25), (xs, 0.5)):
                for t in lst:
                    t.copy_(torch.arange(t.numel(), device=dev).remainder_(1024)
                            .to(torch.float32).mul_(1.0 / 1024).add_(base))
        a = 1e-3

        def step():
            with torch.no_grad():
                torch._foreach_add_(ys, xs, alpha=a)

        return _common.Bench(
            _common.repeat(step, args.min_time, sync),
            lambda times: _common.throughput(
                w + suffix, "torch", times, total * bytes_per_elem, torch.get_num_threads(),
                tensors=len(sizes),
                peer=f"torch {torch.__version__}: torch._foreach_add_(ys, xs, alpha=a)",
                what=what))

    return _common.run(args, [_common.Workload(w + suffix, "torch", lambda w=w: setup(w))
                              for w in workloads], [], "torch_multi_tensor")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
