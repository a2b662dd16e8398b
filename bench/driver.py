#!/usr/bin/env python3
"""Runs hone's benchmark programs and the peers interleaved, repetition by repetition.

Every program (build/bench/bench/bench_*, started with --hone_serve) and every peer
(bench/peers/*.py, started with --serve) runs as one long-lived process that sets up a
workload's data once and then answers "run <workload>/<impl>" with one sample (the line protocol
of bench/support/harness.hpp and bench/peers/_common). For each workload the driver then takes
repetition after repetition, and in each repetition every implementation of the workload (hone
and its variants, each limit kernel, each peer) runs once, in an order rotated from one
repetition to the next (or shuffled, --order random). So every ratio of the table comes from the
same minutes of the machine, not from "hone now, torch later in its own process".

  bench/driver.py --programs build/bench/bench/bench_core --peers bench/peers/torch_multi_tensor.py \\
      --python build/bench/peers-venv/bin/python --sizes-dir build/bench/raw/sizes \\
      --filter multi_tensor --repetitions 5 --out build/bench/raw/samples.json

Output (--out): a JSON list of records of one sample each, in the shape of results.json (see
bench/report.py; `bench/report.py --samples FILE --out results.json` pools them), each with
"round", "repetition", "position" (its place in its repetition's order) and "interleaved".
Rounds (--rounds N) repeat the whole sequence of workloads N times.

Standard library only (and bench/report.py, next to this file).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402


class Server:
    """One long-lived benchmark process speaking the line protocol."""

    def __init__(self, label: str, argv: list[str]):
        self.label = label
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        self.hello: dict | None = None
        self.dead = False

    def _read(self) -> dict | None:
        line = self.proc.stdout.readline()
        if not line:
            self.dead = True
            return None
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            print(f"driver.py: {self.label}: not an answer: {line.rstrip()[:200]}", file=sys.stderr)
            return {"error": "unreadable answer"}

    def start(self) -> bool:
        self.hello = self._read()
        return self.hello is not None and "hello" in self.hello

    def ask(self, request: str) -> dict | None:
        if self.dead:
            return None
        try:
            self.proc.stdin.write(request + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.dead = True
            return None
        return self._read()

    def close(self) -> None:
        if not self.dead and self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        if not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass


def samples_of(server: Server, answer: dict) -> list[dict]:
    """The sample records of one answer: a C++ program's runs (Google Benchmark's shape) or a
    peer's record."""
    if "runs" in answer:
        context = (server.hello or {}).get("context", {})
        return report.gbench_records(answer["runs"], context, server.label)
    record = answer.get("record")
    if record is None:
        return []
    record = dict(record)
    record.setdefault("source", server.label)
    return [record]


def order_of(impls: list, repetition: int, how: str, rng: random.Random) -> list:
    if how == "random":
        out = list(impls)
        rng.shuffle(out)
        return out
    k = repetition % len(impls)
    return impls[k:] + impls[:k]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", nargs="*", default=[], type=Path,
                    help="hone benchmark programs (run with --hone_serve)")
    ap.add_argument("--peers", nargs="*", default=[], type=Path,
                    help="peer scripts (run with --serve)")
    ap.add_argument("--python", default=sys.executable, help="the peers' Python")
    ap.add_argument("--sizes-dir", type=Path, help="the sizes and data files for the peers")
    ap.add_argument("--filter", default=".", help="regex on <workload>/<impl>")
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per repetition")
    ap.add_argument("--order", choices=("rotate", "random"), default="rotate",
                    help="order of the implementations within a repetition")
    ap.add_argument("--seed", type=int, default=1, help="seed of --order random")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.repetitions < 1 or args.rounds < 1:
        ap.error("--repetitions and --rounds must be positive")
    rx = re.compile(args.filter)

    servers: list[Server] = []
    for prog in args.programs:
        servers.append(Server(prog.name, [str(prog), "--hone_serve",
                                          f"--benchmark_min_time={args.min_time}",
                                          f"--hone_threads={args.threads}"]))
    for peer in args.peers:
        cmd = [args.python, str(peer), "--serve", "--threads", str(args.threads),
               "--min-time", str(args.min_time), "--filter", args.filter]
        if args.sizes_dir is not None:
            cmd += ["--sizes-dir", str(args.sizes_dir)]
        servers.append(Server(f"peer_{peer.stem}", cmd))

    # workload -> [(server, "<workload>/<impl>")], in the order the servers list them
    plan: dict[str, list[tuple[Server, str]]] = {}
    used: list[Server] = []
    for s in servers:
        if not s.start():
            print(f"driver.py: {s.label} did not start ({' '.join(s.argv)}); left out",
                  file=sys.stderr)
            s.close()
            continue
        listing = s.ask("list") or {}
        names = [n for n in listing.get("benchmarks", []) if rx.search(n)]
        if not names:
            s.close()
            continue
        used.append(s)
        for n in names:
            workload, _ = report.split_name(n)
            plan.setdefault(workload, []).append((s, n))

    how = (f"{args.rounds} round(s) x {args.repetitions} repetition(s); in each repetition every "
           f"implementation of the workload ran once, order "
           f"{'rotated' if args.order == 'rotate' else 'shuffled'} per repetition, "
           f"{args.min_time:g} s each (bench/driver.py)")
    rng = random.Random(args.seed)
    samples: list[dict] = []
    gone: set[str] = set()  # unavailable or failing implementations: asked no more
    print(f"load average before: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}"
          if Path("/proc/loadavg").exists() else "", file=sys.stderr)
    try:
        for rnd in range(1, args.rounds + 1):
            for workload, entries in plan.items():
                t0 = time.perf_counter()
                for rep in range(args.repetitions):
                    live = [e for e in entries if e[1] not in gone and not e[0].dead]
                    if not live:
                        break
                    for position, (server, name) in enumerate(order_of(live, rep, args.order,
                                                                       rng)):
                        answer = server.ask(f"run {name}")
                        if answer is None:
                            print(f"driver.py: {server.label} ended while running {name}",
                                  file=sys.stderr)
                            continue
                        if "error" in answer:
                            print(f"driver.py: {server.label}: {name}: {answer['error']}",
                                  file=sys.stderr)
                            gone.add(name)
                            continue
                        for r in samples_of(server, answer):
                            if r.get("available", True) is False:
                                gone.add(name)
                            r.update(round=rnd, repetition=rep, position=position,
                                     interleaved=how)
                            samples.append(r)
                print(f"== {workload} (round {rnd}/{args.rounds}): {len(entries)} "
                      f"implementation(s), {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    finally:
        for s in used:
            s.close()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(samples, indent=1) + "\n")
    print(f"load average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}"
          if Path("/proc/loadavg").exists() else "", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
