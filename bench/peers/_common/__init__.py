"""What the peer scripts of bench/peers/ share: their command line, the tensor sizes of a
workload, the timing loops, the result records and writing them.

Not a peer itself: scripts/bench runs bench/peers/*.py, and this package lives in a folder. A peer
imports it after putting its own folder on sys.path (so it runs as `python3 bench/peers/X.py` from
anywhere, also under `python3 -P`):

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _common  # noqa: E402

The records are those of results.json (see bench/report.py): a measured workload is
{"name", "impl", "metric", "value", "unit", "best", "time_ms", "repetitions", "samples_ms", ...},
one that could not run {"name", "impl", "available": false, "note"}.

A peer describes its workloads as Workload objects (a name, and a setup that builds the data and
returns a Bench: sample() runs one repetition, record(seconds) makes the record of a list of
samples) and hands them to run(), which either measures them one after the other
(--repetitions each, the result file of --out) or, with --serve, answers bench/driver.py's
requests on stdin, one JSON line each, keeping the current workload's data between requests:
  list        {"benchmarks": ["<workload>/<impl>", ...]}
  run <name>  one repetition of <workload>/<impl>: {"name": ..., "record": <a record of one
              sample>} (an unavailable record when the workload cannot run here)
  quit        exits (as does the end of stdin)
The first line is {"hello": <peer>, "protocol": 1}; anything else the peer prints goes to
stderr in this mode. The C++ benchmark programs speak the same protocol (--hone_serve,
bench/support/harness.hpp), with "runs" in Google Benchmark's JSON shape instead of "record".

Standard library only.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

ROOT = Path(__file__).resolve().parents[3]
"""The repository root (bench/peers/_common/ is three levels below it)."""


def parser(doc: str | None, threads: int | None = None, device: bool = False
           ) -> argparse.ArgumentParser:
    """The options every peer takes (scripts/bench passes all of them to every peer; a peer
    ignores those it does not use): --sizes-dir --threads --repetitions --min-time --filter --out,
    and --device cpu|cuda where the peer has a GPU path. `threads` is --threads' default (None:
    all CPUs, as oneTBB). A peer adds its own options to the parser it gets."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes-dir", type=Path)
    ap.add_argument("--threads", type=int, default=os.cpu_count() if threads is None else threads)
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.5)
    if device:
        ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--filter", default=".")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--serve", action="store_true",
                    help="answer bench/driver.py's requests on stdin (see bench/peers/_common)")
    return ap


def select(workloads: Iterable[str], impl: str, pattern: str, suffix: str = "") -> list[str]:
    """The workloads whose "<workload><suffix>/<impl>" matches the --filter regex."""
    rx = re.compile(pattern)
    return [w for w in workloads if rx.search(f"{w}{suffix}/{impl}")]


def read_sizes(sizes_dir: Path | None, workload: str, program: str | None = None,
               suffix: str = "") -> list[int] | None:
    """The numbers of sizes_dir/<workload><suffix>.txt or sizes_dir/<workload>.txt (one per line,
    as scripts/bench writes them with `<program> --hone_print_sizes=<workload>`); without such a
    file, the output of build/bench/bench/<program> --hone_print_sizes=<workload>, or None when no
    program is named."""
    if sizes_dir is not None:
        for name in dict.fromkeys((workload + suffix, workload)):  # the GPU programs add _cuda
            path = sizes_dir / f"{name}.txt"
            if path.exists():
                return [int(line) for line in path.read_text().split()]
    if program is None:
        return None
    binary = ROOT / "build" / "bench" / "bench" / program
    out = subprocess.run([str(binary), f"--hone_print_sizes={workload}"], check=True,
                         capture_output=True, text=True).stdout
    return [int(line) for line in out.split()]


def read_data(sizes_dir: Path | None, workload: str, program: str) -> bytes:
    """The raw bytes of a workload that has data: sizes_dir/<workload>.bin (as scripts/bench
    writes it with `<program> --hone_print_data=<workload>`), else that program's output."""
    if sizes_dir is not None:
        path = sizes_dir / f"{workload}.bin"
        if path.exists():
            return path.read_bytes()
    binary = ROOT / "build" / "bench" / "bench" / program
    return subprocess.run([str(binary), f"--hone_print_data={workload}"], check=True,
                          capture_output=True).stdout


def _no_sync() -> None:
    pass


def repeat(fn: Callable[[], object], min_time: float,
           sync: Callable[[], object] = _no_sync) -> Callable[[], float]:
    """A sampler of fn: each call of the returned function runs one repetition and returns the
    seconds per call of fn in it. A repetition runs for at least min_time; its number of calls
    is calibrated at the first repetition (one warm-up call, then 1, 4, 16, ... calls until
    min_time / 5 is spent, as Google Benchmark does). sync() (e.g. torch.cuda.synchronize) runs
    before every clock read."""
    state: dict[str, int] = {}

    def calibrate() -> int:
        fn()  # warm-up (creates lazily built state, e.g. an optimizer's)
        sync()
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
        return max(1, int(calls * min_time / max(dt, 1e-9)))

    def sample() -> float:
        if "calls" not in state:
            state["calls"] = calibrate()
        calls = state["calls"]
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        return (time.perf_counter() - t0) / calls

    return sample


def repeat_each(fn: Callable[[], object], before: Callable[[], object],
                min_time: float) -> Callable[[], float]:
    """A sampler of fn whose calls are timed one by one, before() run untimed ahead of each (for
    calls that need a reset, e.g. removing the file a save writes): each call of the returned
    function runs calls until min_time is spent and returns their mean time. One warm-up call
    at the first repetition."""
    warm = []

    def sample() -> float:
        if not warm:
            before()
            fn()  # warm-up
            warm.append(True)
        total, calls = 0.0, 0
        while total < min_time or calls == 0:
            before()
            t0 = time.perf_counter()
            fn()
            total += time.perf_counter() - t0
            calls += 1
        return total / calls

    return sample


def measure(fn: Callable[[], object], min_time: float, repetitions: int,
            sync: Callable[[], object] = _no_sync) -> list[float]:
    """Seconds per call of fn, one value per repetition of repeat(fn, min_time, sync)."""
    sample = repeat(fn, min_time, sync)
    return [sample() for _ in range(repetitions)]


def measure_each(fn: Callable[[], object], before: Callable[[], object], min_time: float,
                 repetitions: int) -> list[float]:
    """Seconds per call of fn, one value per repetition of repeat_each(fn, before, min_time)."""
    sample = repeat_each(fn, before, min_time)
    return [sample() for _ in range(repetitions)]


class Bench:
    """A workload set up: sample() runs one repetition and returns its seconds per call,
    record(seconds) makes the result record of a list of samples, close() (optional) releases
    what the data hold outside the process (files)."""

    def __init__(self, sample: Callable[[], float], record: Callable[[list[float]], dict],
                 close: Callable[[], object] | None = None):
        self.sample = sample
        self.record = record
        self.close = close or _no_sync


class Workload:
    """A workload of a peer: its name, the peer's impl name and setup(), which builds the data
    (allocation, first touch) and returns a Bench."""

    def __init__(self, name: str, impl: str, setup: Callable[[], Bench]):
        self.name = name
        self.impl = impl
        self.setup = setup


class Slot:
    """One piece of data kept between workloads that share it (a replay buffer of one capacity
    for its sample and update workloads): get(key, build) returns the kept value when its key is
    key, else drops it and keeps build()."""

    def __init__(self):
        self.key = None
        self.value = None

    def get(self, key, build: Callable[[], object]):
        if self.key != key or self.value is None:
            self.key, self.value = None, None
            gc.collect()
            self.value = build()
            self.key = key
        return self.value


def _failed(w: Workload, e: Exception) -> dict:
    return {"name": w.name, "impl": w.impl, "available": False,
            "note": f"{type(e).__name__}: {e}"}


def run(args, workloads: list[Workload], unavailable_records: list[dict] | None = None,
        peer: str = "") -> int:
    """Measures the workloads (--repetitions samples each, one workload set up at a time) and
    writes their records with the unavailable ones to --out, or with --serve answers requests
    (see the top of this file). A workload whose setup raises is reported unavailable."""
    unavailable_records = list(unavailable_records or [])
    if getattr(args, "serve", False):
        return serve(workloads, unavailable_records, peer)
    results = list(unavailable_records)
    for w in workloads:
        try:
            bench = w.setup()
        except Exception as e:  # noqa: BLE001  (an op this build lacks, a broken install)
            results.append(_failed(w, e))
            continue
        try:
            results.append(bench.record([bench.sample() for _ in range(args.repetitions)]))
        finally:
            bench.close()
            del bench
            gc.collect()
    return write(results, args.out)


def serve(workloads: list[Workload], unavailable_records: list[dict], peer: str = "",
          requests=None, answers=None) -> int:
    """Answers list / run / quit requests, one JSON line each (see the top of this file). By
    default requests come from stdin and answers go to the process's stdout, whose file
    descriptor is then pointed at stderr so that nothing else lands there."""
    if answers is None:
        sys.stdout.flush()
        answers = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
    requests = sys.stdin if requests is None else requests
    by_name = {f"{w.name}/{w.impl}": w for w in workloads}
    gone = {f"{r['name']}/{r['impl']}": r for r in unavailable_records}

    def reply(obj: dict) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    reply({"hello": peer or Path(sys.argv[0]).name, "protocol": 1})
    current: list = [None, None]  # name, Bench
    try:
        for line in requests:
            line = line.strip()
            if line == "quit":
                break
            if line == "list":
                reply({"benchmarks": list(by_name) + [n for n in gone if n not in by_name]})
            elif line.startswith("run "):
                name = line[4:]
                if name in gone:
                    reply({"name": name, "record": gone[name]})
                    continue
                w = by_name.get(name)
                if w is None:
                    reply({"name": name, "error": f"no benchmark named {name} (see list)"})
                    continue
                if current[0] != name:
                    if current[1] is not None:
                        current[1].close()
                    current[:] = [None, None]
                    gc.collect()
                    try:
                        current[:] = [name, w.setup()]
                    except Exception as e:  # noqa: BLE001
                        gone[name] = _failed(w, e)
                        reply({"name": name, "record": gone[name]})
                        continue
                bench = current[1]
                try:
                    seconds = bench.sample()
                except Exception as e:  # noqa: BLE001  (one failed repetition, e.g. a DQN seed)
                    reply({"name": name, "error": f"{type(e).__name__}: {e}"})
                    continue
                reply({"name": name, "record": bench.record([seconds])})
            elif line:
                reply({"error": f"unknown request {line!r} (list, run NAME, quit)"})
    finally:
        if current[1] is not None:
            current[1].close()
    return 0


def serve_nothing(peer: str, runner: str) -> int:
    """serve() for a peer that needs all of its ranks at once (under mpirun): it says so on stderr
    and serves no workload; `runner` is the script that runs it instead."""
    print(f"{peer}.py: needs all of its ranks at once; run by {runner}, not by bench/driver.py",
          file=sys.stderr)
    return serve([], [], peer)


def init_gloo(torch, dist, rank: int, size: int, port: int, threads: int) -> None:
    """torch.set_num_threads(threads) and a gloo process group over env:// at 127.0.0.1:port (the
    peers that run under mpirun: torch_ddp.py, torch_zero.py)."""
    torch.set_num_threads(threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(size)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=size)


def launched_rank() -> tuple[int, int] | None:
    """(rank, size) when a launcher started this process (Open MPI's mpirun, MPICH's, torchrun),
    else None."""
    for rank, size in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                       ("PMI_RANK", "PMI_SIZE"), ("RANK", "WORLD_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return None


def unavailable(workloads: Iterable[str], impl: str, note: str) -> list[dict]:
    """The records of workloads a peer could not run (its package is missing, no device)."""
    return [{"name": w, "impl": impl, "available": False, "note": note} for w in workloads]


def import_torch(names: list[str], impl: str, device: str = "cpu"):
    """(torch, []) where torch imports (and, for device "cuda", sees a device); else
    (None, unavailable records of names)."""
    try:
        import torch  # noqa: PLC0415  (optional dependency)
    except Exception as e:  # ImportError, or a broken install
        return None, unavailable(names, impl, f"torch could not be imported: {e}")
    if device == "cuda" and not torch.cuda.is_available():
        return None, unavailable(names, impl, "no CUDA device visible to torch")
    return torch, []


def torch_device(torch, threads: int, device: str = "cpu"):
    """Sets torch's CPU threads; returns the torch.device and the function that waits for it
    (torch.cuda.synchronize on a GPU, nothing on the CPU)."""
    torch.set_num_threads(threads)
    sync = torch.cuda.synchronize if device == "cuda" else _no_sync
    return torch.device(device), sync


def throughput(name: str, impl: str, seconds: list[float], nbytes: int, threads: int,
               **extra) -> dict:
    """A throughput record (GB/s, 1e9 bytes per second) of per-repetition seconds per call of a
    call moving nbytes; extra fields (tensors, peer, what) follow."""
    t = statistics.median(seconds)
    return {"name": name, "impl": impl, "metric": "throughput", "value": nbytes / t / 1e9,
            "unit": "GB/s", "best": nbytes / min(seconds) / 1e9, "time_ms": t * 1e3,
            "repetitions": len(seconds), "samples_ms": [x * 1e3 for x in seconds],
            "bytes_per_iter": nbytes, "threads": threads, **extra}


def time_us(name: str, impl: str, seconds: list[float], threads: int, **extra) -> dict:
    """A time record in microseconds ("time_unit": "us", for short calls) of per-repetition
    seconds per call; extra fields (peer, what) follow."""
    t = statistics.median(seconds)
    return {"name": name, "impl": impl, "metric": "time", "value": t * 1e6, "unit": "us",
            "time_unit": "us", "best": min(seconds) * 1e6, "time_ms": t * 1e3,
            "repetitions": len(seconds), "samples_ms": [x * 1e3 for x in seconds],
            "threads": threads, **extra}


def time_ms(name: str, impl: str, seconds: list[float], threads: int, **extra) -> dict:
    """A time record in milliseconds of per-repetition (or per-run) seconds; extra fields
    follow."""
    t = statistics.median(seconds)
    return {"name": name, "impl": impl, "metric": "time", "value": t * 1e3, "unit": "ms",
            "best": min(seconds) * 1e3, "time_ms": t * 1e3, "repetitions": len(seconds),
            "samples_ms": [x * 1e3 for x in seconds], "threads": threads, **extra}


def package_version(module, distribution: str) -> str:
    """module.__version__, else the installed distribution's version, else "?"."""
    version = getattr(module, "__version__", None)
    if version is not None:
        return str(version)
    try:
        from importlib.metadata import version as dist_version  # noqa: PLC0415
        return dist_version(distribution)
    except Exception:  # noqa: BLE001
        return "?"


def write(results: list[dict], out: Path | None) -> int:
    """Writes the records as a JSON list to out (stdout without one); returns the exit status."""
    text = json.dumps(results, indent=2) + "\n"
    if out:
        out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0
