#!/usr/bin/env python3
"""Peer: the safetensors package (safetensors.torch.save_file / load_file) on the tensors of
hone's ckpt_save_1G / ckpt_load_1G workloads (1 GiB of fp32 in bench_checkpoint's model-like mix,
a state dict {"t<i>": 1-D tensor}).

  ckpt_save_1G_{tmpfs,disk}  save_file(sd, path), then open + os.fsync + close (fsync included,
                             as hone's write_tensors and the limit do); the file is removed
                             between repetitions (untimed).
  ckpt_load_1G_{tmpfs,disk}  load_file(path) (new CPU tensors). Cache-warm, as hone's.

Same destinations, options and result format as bench/peers/torch_checkpoint.py.
"""
from __future__ import annotations

import sys
from pathlib import Path
import argparse
import json
import os
import re
import statistics
import subprocess
import time

WORKLOADS = ("ckpt_save_1G_tmpfs", "ckpt_load_1G_tmpfs", "ckpt_save_1G_disk", "ckpt_load_1G_disk")
ROOT = Path(__file__).resolve().parents[2]


def read_sizes(sizes_dir: Path | None) -> list[int]:
    if sizes_dir is not None and (sizes_dir / "ckpt_1G.txt").exists():
        return [int(line) for line in (sizes_dir / "ckpt_1G.txt").read_text().split()]
    binary = ROOT / "build" / "bench" / "bench" / "bench_checkpoint"
    out = subprocess.run([str(binary), "--hone_print_sizes=ckpt_1G"], check=True,
                         capture_output=True, text=True).stdout
    return [int(line) for line in out.split()]


def measure(fn, before, min_time: float, repetitions: int) -> list[float]:
    """Seconds per call, one value per repetition; `before` runs untimed before every call."""
    before()
    fn()  # warm-up
    samples = []
    for _ in range(repetitions):
        total, calls = 0.0, 0
        while total < min_time or calls == 0:
            before()
            t0 = time.perf_counter()
            fn()
            total += time.perf_counter() - t0
            calls += 1
        samples.append(total / calls)
    return samples


def run_peer(impl: str, make_ops, argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes-dir", type=Path)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--filter", default=".")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    pattern = re.compile(args.filter)
    workloads = [w for w in WORKLOADS if pattern.search(f"{w}/{impl}")]
    results: list[dict] = []
    ops = None
    if workloads:
        try:
            import torch  # noqa: PLC0415  (optional dependency)
            ops = make_ops(torch)
        except Exception as e:  # ImportError, or a broken install
            results = [{"name": w, "impl": impl, "available": False,
                        "note": f"could not be imported: {e}"} for w in workloads]
    if ops is not None:
        save, load, what, ext = ops
        torch.set_num_threads(args.threads)
        sizes = read_sizes(args.sizes_dir)
        nbytes = sum(sizes) * 4
        gen = torch.Generator().manual_seed(1)
        sd = {f"t{i}": (torch.rand(n, generator=gen, dtype=torch.float32) - 0.5) * 0.04
              for i, n in enumerate(sizes)}
        disk_parent = Path(os.environ.get("HONE_BENCH_DISK_DIR", ROOT / "build" / "bench" / "tmp"))
        dirs = {"tmpfs": Path("/dev/shm") / f"hone-bench-ckpt-{impl}-{os.getpid()}",
                "disk": disk_parent / f"ckpt-{impl}-{os.getpid()}"}
        try:
            for w in workloads:
                where = w.rsplit("_", 1)[1]
                d = dirs[where]
                d.mkdir(parents=True, exist_ok=True)
                if "_save_" in w:
                    path = d / ("save" + ext)
                    times = measure(lambda: save(sd, path), lambda: path.unlink(missing_ok=True),
                                    args.min_time, args.repetitions)
                    path.unlink(missing_ok=True)
                    kind = "save (fsync included)"
                else:
                    path = d / ("load" + ext)
                    if not path.exists():
                        save(sd, path)
                    times = measure(lambda: load(path), lambda: None, args.min_time,
                                    args.repetitions)
                    kind = "load (page cache warm)"
                t = statistics.median(times)
                results.append({
                    "name": w, "impl": impl, "metric": "throughput",
                    "value": nbytes / t / 1e9, "unit": "GB/s", "best": nbytes / min(times) / 1e9,
                    "time_ms": t * 1e3, "repetitions": len(times),
                    "samples_ms": [x * 1e3 for x in times], "bytes_per_iter": nbytes,
                    "threads": torch.get_num_threads(), "tensors": len(sizes),
                    "peer": what, "what": f"{kind} of 1 GiB fp32 in {len(sizes)} tensors, {where}",
                })
        finally:
            import shutil  # noqa: PLC0415
            for d in dirs.values():
                shutil.rmtree(d, ignore_errors=True)

    text = json.dumps(results, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def make_ops(torch):
    import os  # noqa: PLC0415

    import safetensors  # noqa: PLC0415
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    def save(sd, path):
        save_file(sd, str(path))
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def load(path):
        return load_file(str(path))

    what = f"safetensors {safetensors.__version__}: save_file (+ fsync) / load_file"
    return save, load, what, ".safetensors"


if __name__ == "__main__":
    sys.exit(run_peer("safetensors", make_ops, sys.argv[1:]))
