#!/usr/bin/env python3
"""Turns Google Benchmark JSON output and peer results into results.json and prints a table.

Usage:
  bench/report.py --samples build/bench/raw/samples.json --out build/bench/results.json
  bench/report.py --gbench build/bench/raw/bench_core.json [...] \
                  [--peer build/bench/raw/peer_torch_multi_tensor.json ...] \
                  --out build/bench/results.json [--markdown]
  bench/report.py --table build/bench/results.json [--markdown]

results.json is a JSON list of objects, one per (workload, implementation):
  {"name": "multi_tensor_axpy_64M", "impl": "hone", "metric": "throughput",
   "value": 48.1, "unit": "GB/s", "best": 49.0, "time_ms": 16.7, "repetitions": 5,
   "samples_ms": [...], "bytes_per_iter": 805306368, "threads": 2, "source": "bench_core",
   "fraction_of_limit": 0.97, "ratio_vs_hone": 1.0, ...}
Google Benchmark names are "<workload>/<impl>" (Google Benchmark's own suffixes such as
"/real_time" are dropped); a benchmark with a bytes_per_iter counter becomes a throughput in
GB/s (1e9 bytes per second), one without becomes a time in ms (in us when the benchmark uses
->Unit(benchmark::kMicrosecond), or a peer record has "time_unit": "us"). With repetitions (and rounds:
several files holding the same benchmark), the value is the median over all of them and "best"
the best one; "samples_ms" keeps every repetition's time per iteration. Every user counter of a
Google Benchmark run (state.counters[...], e.g. bench_optim's "state_ratio") goes into the
record's "counters" dict, the median over the repetitions (for "solved", a 0/1 outcome per
repetition, the mean: the fraction solved); Google Benchmark's own fields are not counters. Peers write the same objects, with samples_ms and bytes_per_iter (see bench/peers/); a
peer that could not run writes {"name", "impl", "available": false, "note"}. bench/driver.py
(what scripts/bench runs) writes every sample of every implementation as such a record of one
sample, with "interleaved" saying how the samples were taken; records of one (workload, impl) are
pooled.

A workload's limit is the best of its limit rows ("limit", "limit_nt", "limit_arena": one per
streaming kernel, bench/support/limit.hpp); fraction_of_limit is against it, and "limit_impl"
names it.

The table gets a "notes" column when a record holds one of NOTE_KEYS (in "counters", or at the
top level of a peer's record, e.g. the DQN peer's "env_steps_to_solve" and "solved"): the
figures the goals are stated in that a time or a throughput does not show.

Standard library only.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

# Google Benchmark appends these to a benchmark's name; they are not part of "<workload>/<impl>".
_GB_SUFFIX = re.compile(
    r"^(real_time|manual_time|process_time|"
    r"(min_time|min_warmup_time|iterations|repeats|threads):[0-9.e+-]+s?)$"
)
_TIME_SCALE = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
# The fields Google Benchmark writes into every run of its JSON output; the other numeric fields
# are the benchmark's user counters ("threads" is both: hone's counter overwrites the field).
_GB_FIELDS = frozenset((
    "name", "family_index", "per_family_instance_index", "run_name", "run_type", "repetitions",
    "repetition_index", "threads", "iterations", "real_time", "cpu_time", "time_unit",
    "bytes_per_second", "items_per_second", "label", "error_occurred", "error_message", "skipped",
    "skip_message", "aggregate_name", "aggregate_unit", "big_o", "rms", "complexity_n",
    "allocs_per_iter", "max_bytes_used", "total_allocated_bytes", "net_heap_growth",
    "memory_iterations"))
# Counters whose repetitions are 0/1 outcomes (bench_dqn's "solved", one repetition per seed):
# their mean, the fraction of repetitions that succeeded, stands for them instead of the median.
_MEAN_COUNTERS = frozenset(("solved",))
# Counters (or peer fields) shown in the table's notes column, in this order: the figures goals are
# stated in. state_ratio: 8-bit AdamW's state bytes / fp32 AdamW's (bench_optim, adamw8bit_*);
# paired_ratio: trainer step / hand-written step, measured in interleaved pairs (trainer_overhead);
# compress_ratio: raw / stored checkpoint bytes (bench_checkpoint; the zstd_shuffle peer adds
# compress_ratio_unshuffled, zstd on the bytes as they are); frame_store_zstd_ratio and
# frame_store_bytes_per_transition (bench_frames); env_steps_to_solve and solved (fraction of seeds)
# of dqn_cartpole_time_to_solve.
NOTE_KEYS = ("state_ratio", "paired_ratio", "compress_ratio", "compress_ratio_unshuffled",
             "frame_store_zstd_ratio",
             "frame_store_bytes_per_transition", "env_steps_to_solve", "solved",
             "index_bytes_per_record", "peak_rss_mb", "pss_mb", "rss_anon_mb", "batches_mb")


def split_name(run_name: str) -> tuple[str, str]:
    parts = run_name.split("/")
    while len(parts) > 2 and _GB_SUFFIX.match(parts[-1]):
        parts.pop()
    if len(parts) < 2:
        return run_name, "hone"
    return "/".join(parts[:-1]), parts[-1]


def _seconds(entry: dict) -> float:
    return float(entry["real_time"]) * _TIME_SCALE[entry.get("time_unit", "ns")]


def gbench_records(benchmarks: list[dict], context: dict, source: str) -> list[dict]:
    """One record per benchmark of a list of Google Benchmark JSON entries (its "benchmarks"),
    with its per-repetition times."""
    runs: dict[str, list[dict]] = {}
    medians: dict[str, dict] = {}
    order: list[str] = []
    for b in benchmarks:
        run_name = b.get("run_name", b["name"])
        if b.get("error_occurred"):
            print(f"report.py: {run_name}: {b.get('error_message', 'error')}", file=sys.stderr)
            continue
        if run_name not in order:
            order.append(run_name)
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[run_name] = b
        else:
            runs.setdefault(run_name, []).append(b)
    records = []
    for run_name in order:
        reps = runs.get(run_name) or ([medians[run_name]] if run_name in medians else [])
        if not reps:
            continue
        workload, impl = split_name(run_name)
        r: dict = {"name": workload, "impl": impl,
                   "samples_ms": [_seconds(x) * 1e3 for x in reps], "source": source}
        counters: dict[str, list[float]] = {}
        for x in reps:
            for key, value in x.items():
                if key not in _GB_FIELDS and isinstance(value, (int, float)) \
                        and not isinstance(value, bool):
                    counters.setdefault(key, []).append(float(value))
        if counters:
            r["counter_samples"] = counters  # per repetition; combine() makes "counters"
        if reps[0].get("bytes_per_iter"):
            r["bytes_per_iter"] = int(reps[0]["bytes_per_iter"])
        if "threads" in reps[0]:
            r["threads"] = int(reps[0]["threads"])
        if reps[0].get("time_unit") == "us":  # ->Unit(kMicrosecond): report times in us
            r["time_unit"] = "us"
        for key in ("hone_compiler", "hone_gpu"):
            if key in context:
                r[key[5:]] = context[key]
        records.append(r)
    return records


def load_gbench(path: Path) -> list[dict]:
    """One record per benchmark of a Google Benchmark JSON file (--benchmark_out)."""
    doc = json.loads(path.read_text())
    return gbench_records(doc.get("benchmarks", []), doc.get("context", {}), path.stem)


def load_peer(path: Path) -> list[dict]:
    doc = json.loads(path.read_text())
    if isinstance(doc, dict):
        doc = [doc]
    for r in doc:
        r.setdefault("source", path.stem)
    return doc


def combine(records: list[dict]) -> list[dict]:
    """Merges the records of one (workload, impl) from several files (scripts/bench --rounds) and
    turns per-repetition times (samples_ms) into value (median), best and time_ms."""
    merged: dict[tuple[str, str], dict] = {}
    for r in records:
        key = (r["name"], r["impl"])
        if key not in merged:
            merged[key] = dict(r)
            if "samples_ms" in r:
                merged[key]["samples_ms"] = list(r["samples_ms"])
            if "counter_samples" in r:
                merged[key]["counter_samples"] = {k: list(v)
                                                  for k, v in r["counter_samples"].items()}
        elif "samples_ms" in r and "samples_ms" in merged[key]:
            merged[key]["samples_ms"] += r["samples_ms"]
            pooled = merged[key].setdefault("counter_samples", {})
            for k, v in r.get("counter_samples", {}).items():
                pooled.setdefault(k, []).extend(v)
        elif merged[key].get("available", True) is False:
            merged[key] = dict(r)  # a later round that could run replaces an unavailable one
    results = []
    for r in merged.values():
        counter_samples = r.pop("counter_samples", None)
        if counter_samples:
            r["counters"] = {k: statistics.fmean(v) if k in _MEAN_COUNTERS
                             else statistics.median(v) for k, v in counter_samples.items()}
        samples = r.get("samples_ms")
        if samples:
            t = statistics.median(samples) * 1e-3
            fastest = min(samples) * 1e-3
            if r.get("bytes_per_iter"):
                n = r["bytes_per_iter"]
                r.update(metric="throughput", value=n / t / 1e9, unit="GB/s", best=n / fastest / 1e9)
            elif r.get("time_unit") == "us":  # short calls (e.g. a replay buffer's sample)
                r.update(metric="time", value=t * 1e6, unit="us", best=fastest * 1e6)
            else:
                r.update(metric="time", value=t * 1e3, unit="ms", best=fastest * 1e3)
            r["time_ms"] = t * 1e3
            r["repetitions"] = len(samples)
        results.append(r)
    return results


_KEY_ORDER = ("name", "impl", "metric", "value", "unit", "best", "fraction_of_limit",
              "ratio_vs_hone", "time_ms", "repetitions", "threads", "bytes_per_iter")


def ordered(r: dict) -> dict:
    """The required fields first, the per-repetition samples last."""
    head = {k: r[k] for k in _KEY_ORDER if k in r}
    rest = {k: v for k, v in r.items() if k not in head and k != "samples_ms"}
    tail = {"samples_ms": r["samples_ms"]} if "samples_ms" in r else {}
    return head | rest | tail


def _higher_is_better(r: dict) -> bool:
    return r.get("metric") != "time"


def is_limit(impl: str) -> bool:
    """A limit row: "limit" or one of its kernels ("limit_nt", "limit_arena", ...)."""
    return impl == "limit" or impl.startswith("limit_")


def best_limit(rows: dict[str, dict]) -> dict | None:
    """The limit of a workload: the best of its limit rows (highest throughput, shortest time),
    so that the ceiling is the fastest way of streaming the workload's bytes that was measured."""
    limits = [r for impl, r in rows.items() if is_limit(impl) and r.get("value")]
    if not limits:
        return None
    pick = max if _higher_is_better(limits[0]) else min
    return pick(limits, key=lambda r: r["value"])


def add_ratios(results: list[dict]) -> None:
    """fraction_of_limit (against the best limit row, named in "limit_impl") and ratio_vs_hone
    (> 1: better than the reference) per workload."""
    by_name: dict[str, dict[str, dict]] = {}
    for r in results:
        if r.get("available", True) and "value" in r:
            by_name.setdefault(r["name"], {})[r["impl"]] = r
    for r in results:
        if not r.get("available", True) or "value" not in r:
            continue
        rows = by_name[r["name"]]
        for ref, key in ((best_limit(rows), "fraction_of_limit"),
                         (rows.get("hone"), "ratio_vs_hone")):
            if ref is None or ref.get("metric") != r.get("metric") or not ref["value"]:
                continue
            ratio = r["value"] / ref["value"]
            r[key] = ratio if _higher_is_better(r) else 1.0 / ratio
            if key == "fraction_of_limit":
                r["limit_impl"] = ref["impl"]


def _number(v: float) -> str:
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"


def note_text(r: dict) -> str:
    """The NOTE_KEYS a record holds, "key=value" separated by spaces (counters first)."""
    counters = r.get("counters", {})
    out = []
    for key in NOTE_KEYS:
        value = counters.get(key, r.get(key))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(f"{key}={_number(float(value))}")
    return " ".join(out)


def _impl_rank(impl: str) -> tuple[int, str]:
    return (0 if is_limit(impl) else 1 if impl == "hone" else 2, impl)


def table(results: list[dict], markdown: bool = False) -> str:
    rows = [("workload", "impl", "median", "best", "unit", "vs limit", "vs hone", "threads",
             "reps")]
    order = {}
    for r in results:
        order.setdefault(r["name"], len(order))
    row_notes = [""]
    for r in sorted(results, key=lambda r: (order[r["name"]], _impl_rank(r["impl"]))):
        if not r.get("available", True):
            rows.append((r["name"], r["impl"], "unavailable", "", "", "", "", "", ""))
            row_notes.append("")
            continue
        frac = r.get("fraction_of_limit")
        vs = r.get("ratio_vs_hone")
        best = r.get("best")
        rows.append((r["name"], r["impl"], f"{r['value']:.2f}",
                     f"{best:.2f}" if best is not None else "", r.get("unit", ""),
                     f"{frac:.1%}" if frac is not None else "",
                     f"{vs:.2f}x" if vs is not None else "",
                     str(r.get("threads", "")), str(r.get("repetitions", ""))))
        row_notes.append(note_text(r))
    if any(row_notes):  # the notes column only where a record has notes
        row_notes[0] = "notes"
        rows = [row + (n,) for row, n in zip(rows, row_notes)]
    notes = [f"  {r['impl']} ({r['name']}): {r['note']}" for r in results
             if not r.get("available", True) and r.get("note")]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {2, 3, 5, 6, 7, 8}

    def fmt(row):
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths))]
        return ("| " + " | ".join(cells) + " |") if markdown else "  ".join(cells).rstrip()

    lines = [fmt(rows[0])]
    if markdown:
        lines.append("|" + "|".join(("-" * (w + 1) + ":") if i in right else ("-" * (w + 2))
                                    for i, w in enumerate(widths)) + "|")
    else:
        lines.append("  ".join("-" * w for w in widths))
    lines += [fmt(row) for row in rows[1:]]
    if any(is_limit(r["impl"]) and r["impl"] != "limit" for r in results):
        lines += ["", "vs limit: against the best limit row of the workload (limit_*: other "
                  "kernels moving the same bytes; docs/benchmarks.md, The limit)"]
    rounds = {r.get("interleaved") for r in results if r.get("interleaved")}
    if rounds:
        lines += ["", "samples interleaved: " + "; ".join(sorted(rounds))]
    if notes:
        lines += ["", "unavailable:"] + notes
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gbench", nargs="*", default=[], type=Path,
                    help="Google Benchmark JSON files (--benchmark_out)")
    ap.add_argument("--peer", nargs="*", default=[], type=Path, help="peer result files")
    ap.add_argument("--samples", nargs="*", default=[], type=Path,
                    help="bench/driver.py's samples (records of single samples, any impl)")
    ap.add_argument("--out", type=Path, help="write results.json here")
    ap.add_argument("--table", type=Path, help="print the table of an existing results.json")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = ap.parse_args(argv)

    if args.table:
        print(table(json.loads(args.table.read_text()), args.markdown))
        return 0
    records: list[dict] = []
    for path in args.gbench:
        if path.exists() and path.stat().st_size > 0:
            records += load_gbench(path)
    for path in [*args.peer, *args.samples]:
        if path.exists() and path.stat().st_size > 0:
            records += load_peer(path)
    results = combine(records)
    add_ratios(results)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps([ordered(r) for r in results], indent=2) + "\n")
    print(table(results, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
