#!/usr/bin/env python3
"""Peer: the resident memory of PyTorch's DataLoader with 1, 2 and 4 worker processes reading the
64 KiB records of bench_loader (bench/loader.cpp), the counterpart of its loader_rss_64k rows.

  loader_rss_64k  1024 records of 64 KiB (32768 uint16 tokens), batches of 64, two shuffled
                  epochs, in a new Python process per sample

Each sample starts this script again as a child (--child W): it imports torch and numpy, builds
torch_loader.py's dataset (numpy.memmap of the same .bin, torch.from_numpy(np.array(mm[i])) per
record) and a DataLoader(batch_size=64, shuffle=True, num_workers=W, persistent_workers=True,
prefetch_factor=2, its default), reads two epochs touching each batch, and, with the workers
still alive, reads /proc/<pid>/status (VmHWM, RssAnon, RssFile, RssShmem) and
/proc/<pid>/smaps_rollup (Pss) of itself and of each worker. The record's time is the child's
whole run (interpreter start, imports, two epochs); its figures are counters summed over the main
process and the workers (MB = 10^6 bytes):

  peak_rss_mb   the sum of VmHWM (each process's peak resident set; pages shared between them,
                the libraries and the forked interpreter, count once per process)
  rss_anon_mb, rss_file_mb, rss_shmem_mb   the sums of RssAnon, RssFile, RssShmem at the end
  pss_mb        the sum of Pss at the end: shared pages divided among the processes mapping
                them, so it adds up to what the processes hold together
  main_peak_rss_mb  VmHWM of the main process alone
  batches_mb    the batches in flight the DataLoader allows: num_workers x prefetch_factor (2)
                batches of 4 MiB (passed through shared memory)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Bench, Workload, parser, run, select, time_ms, unavailable  # noqa: E402

WORKLOAD = "loader_rss_64k"
RECORDS, WIDTH, BATCH, EPOCHS, PREFETCH = 1024, 32768, 64, 2, 2
WORKERS = (0, 1, 2, 4)
FIELDS = ("VmHWM", "RssAnon", "RssFile", "RssShmem")


def proc_kb(pid: int) -> dict[str, float]:
    """VmHWM, RssAnon, RssFile, RssShmem (status) and Pss (smaps_rollup) of pid, in kB."""
    out = dict.fromkeys((*FIELDS, "Pss"), 0.0)
    for path, keys in ((f"/proc/{pid}/status", FIELDS), (f"/proc/{pid}/smaps_rollup", ("Pss",))):
        with open(path, encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in keys:
                    out[name] = float(rest.split()[0])
    return out


def child(workers: int) -> int:
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from torch_loader import MemmapRecords, corpus_bin  # noqa: PLC0415
    torch.set_num_threads(1)
    ds = MemmapRecords(corpus_bin(np, RECORDS, WIDTH), RECORDS, WIDTH)
    g = torch.Generator()
    g.manual_seed(1)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers,
                                         generator=g, persistent_workers=workers > 0,
                                         prefetch_factor=PREFETCH if workers > 0 else None)
    total = 0
    for _ in range(EPOCHS):
        for b in loader:
            total += int(b[0, 0])
    pids = [os.getpid()]
    if workers > 0:
        pids += [w.pid for w in loader._iterator._workers]  # noqa: SLF001  (alive: persistent)
    each = [proc_kb(p) for p in pids]
    sums = {k: sum(e[k] for e in each) for k in each[0]}
    print(json.dumps({"processes": len(pids), "sums_kb": sums, "main_kb": each[0],
                      "check": total % 10, "torch": torch.__version__}))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--child":
        return child(int(argv[1]))
    args = parser(__doc__).parse_args(argv)
    impls = {f"torch_w{w}": w for w in WORKERS}
    chosen = [impl for impl in impls if select([WORKLOAD], impl, args.filter)]
    if not chosen:
        return run(args, [], [], "torch_loader_rss")
    try:
        import torch  # noqa: PLC0415, F401  (optional dependency)
        version = torch.__version__
    except Exception as e:  # ImportError, or a broken install
        return run(args, [], [r for impl in chosen for r in unavailable(
            [WORKLOAD], impl, f"could not be imported: {e}")], "torch_loader_rss")

    def setup(impl: str) -> Bench:
        workers = impls[impl]
        counters: dict[str, list[float]] = {}

        def sample() -> float:
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                                   str(workers)], capture_output=True, text=True, check=False)
            seconds = time.perf_counter() - t0
            if done.returncode != 0:
                raise RuntimeError(f"the child failed: {done.stderr.strip()[-500:]}")
            got = json.loads(done.stdout.strip().splitlines()[-1])
            s, m = got["sums_kb"], got["main_kb"]
            mb = 1024 / 1e6
            for key, value in (("peak_rss_mb", s["VmHWM"]), ("rss_anon_mb", s["RssAnon"]),
                               ("rss_file_mb", s["RssFile"]), ("rss_shmem_mb", s["RssShmem"]),
                               ("pss_mb", s["Pss"]), ("main_peak_rss_mb", m["VmHWM"])):
                counters.setdefault(key, []).append(value * mb)
            counters.setdefault("processes", []).append(got["processes"])
            return seconds

        def record(seconds: list[float]) -> dict:
            n = len(seconds)
            batches = [workers * PREFETCH * BATCH * WIDTH * 2 / 1e6] * n
            return time_ms(WORKLOAD, impl, seconds, workers, counter_samples={
                **{k: v[-n:] for k, v in counters.items()}, "batches_mb": batches},
                peer=f"torch {version} DataLoader(num_workers={workers}, persistent_workers=True,"
                     f" prefetch_factor={PREFETCH}), numpy memmap dataset, a new process per"
                     " sample",
                what=f"{EPOCHS} shuffled epochs of {RECORDS} records of {WIDTH * 2} bytes, batches"
                     f" of {BATCH}; memory summed over the main process and the workers")

        return Bench(sample, record)

    return run(args, [Workload(WORKLOAD, impl, lambda impl=impl: setup(impl)) for impl in chosen],
               [], "torch_loader_rss")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
