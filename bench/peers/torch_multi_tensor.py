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

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORKLOADS = {
    # workload: (bytes per element, description)
    "multi_tensor_axpy_64M": (12, "y += a * x over fp32 tensor lists: read x, y; write y"),
}
ROOT = Path(__file__).resolve().parents[2]


def read_sizes(workload: str, sizes_dir: Path | None, suffix: str = "") -> list[int]:
    if sizes_dir is not None:
        for name in (workload + suffix, workload):  # the GPU program names it <workload>_cuda
            path = sizes_dir / f"{name}.txt"
            if path.exists():
                return [int(line) for line in path.read_text().split()]
    # Fall back to asking the benchmark program directly.
    binary = ROOT / "build" / "bench" / "bench" / "bench_core"
    out = subprocess.run([str(binary), f"--hone_print_sizes={workload}"], check=True,
                         capture_output=True, text=True).stdout
    return [int(line) for line in out.split()]


def unavailable(workloads: list[str], note: str, device: str) -> list[dict]:
    suffix = "_cuda" if device == "cuda" else ""
    return [{"name": w + suffix, "impl": "torch", "available": False, "note": note}
            for w in workloads]


def measure(fn, sync, min_time: float, repetitions: int) -> list[float]:
    """Seconds per call, one value per repetition (each runs for at least min_time)."""
    fn()  # warm-up
    sync()
    # Calibrate the number of calls per repetition, as Google Benchmark does.
    calls = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
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
        sync()
        per_call.append((time.perf_counter() - t0) / calls)
    return per_call


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes-dir", type=Path)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--filter", default=".")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    suffix = "_cuda" if args.device == "cuda" else ""
    pattern = re.compile(args.filter)
    workloads = [w for w in WORKLOADS if pattern.search(f"{w}{suffix}/torch")]
    results: list[dict] = []
    try:
        import torch  # noqa: PLC0415  (optional dependency)
    except Exception as e:  # ImportError, or a broken install
        results = unavailable(workloads, f"torch could not be imported: {e}", args.device)
        torch = None
    if torch is not None and args.device == "cuda" and not torch.cuda.is_available():
        results = unavailable(workloads, "no CUDA device visible to torch", args.device)
        torch = None

    if torch is not None:
        torch.set_num_threads(args.threads)
        dev = torch.device(args.device)
        sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
        for w in workloads:
            bytes_per_elem, what = WORKLOADS[w]
            sizes = read_sizes(w, args.sizes_dir, suffix)
            total = sum(sizes)
            with torch.no_grad():
                ys = [torch.empty(n, dtype=torch.float32, device=dev) for n in sizes]
                xs = [torch.empty(n, dtype=torch.float32, device=dev) for n in sizes]
                # First touch (and the same values as the hone benchmark: base + (i % 1024)/1024).
                for lst, base in ((ys, 0.25), (xs, 0.5)):
                    for t in lst:
                        t.copy_(torch.arange(t.numel(), device=dev).remainder_(1024)
                                .to(torch.float32).mul_(1.0 / 1024).add_(base))
                a = 1e-3
                times = measure(lambda: torch._foreach_add_(ys, xs, alpha=a), sync,
                                args.min_time, args.repetitions)
            t = statistics.median(times)
            nbytes = total * bytes_per_elem
            results.append({
                "name": w + suffix, "impl": "torch", "metric": "throughput",
                "value": nbytes / t / 1e9, "unit": "GB/s", "best": nbytes / min(times) / 1e9,
                "time_ms": t * 1e3, "repetitions": len(times),
                "samples_ms": [x * 1e3 for x in times], "bytes_per_iter": nbytes,
                "threads": torch.get_num_threads(), "tensors": len(sizes),
                "peer": f"torch {torch.__version__}: torch._foreach_add_(ys, xs, alpha=a)",
                "what": what,
            })
            del ys, xs

    text = json.dumps(results, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
