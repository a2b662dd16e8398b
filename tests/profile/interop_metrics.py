#!/usr/bin/env python3
"""Interop test (CTest label interop): hone's metrics read by the tensorboard package and csv.

    interop_metrics.py <metrics_interop_helper> <work dir>

The helper runs 5 trainer steps and logs their step reports, a memory reading, tags that need CSV
quoting and special values (NaN, +-inf, -0, a float32 subnormal, values float32 rounds) through
hone::profile::metrics_sink, and prints what it logged. This script reads the event file with
tensorboard's LegacyEventFileLoader (its TFRecord reader checks both masked CRC-32Cs of every
record; it parses each tensorboard.Event as written, where EventFileLoader would migrate
simple_value into a tensor) and with EventAccumulator (what TensorBoard's scalar dashboard is
built on), and checks the first event's file_version, every tag, step and value bit for bit as float32,
and the order; then it reads the CSV file with csv.DictReader and checks the same with the values
as doubles.

Exits 77 (CTest: skipped) when the tensorboard package is missing.
"""
import csv
import json
import math
import os
import struct
import subprocess
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
except ImportError as e:  # pragma: no cover
    print(f"HONE_SKIPPED: {e}; install the pip packages of scripts/deps.sh (tensorboard)")
    sys.exit(77)

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAIL: {what}")


def f32_bits(x):
    """The float32 bit pattern of x, rounded as a C++ static_cast<float> rounds it (a NaN is any
    NaN: its payload is not checked)."""
    if math.isnan(x):
        return "nan"
    try:
        return struct.pack("<f", x).hex()
    except OverflowError:  # struct refuses what rounds to infinity; C++ gives +-inf
        return struct.pack("<f", math.copysign(math.inf, x)).hex()


def f64_bits(x):
    return "nan" if math.isnan(x) else struct.pack("<d", x).hex()


def main():
    helper, work = sys.argv[1], sys.argv[2]
    out = subprocess.run([helper, work], check=True, capture_output=True, text=True).stdout
    info = json.loads(out.strip().splitlines()[-1])
    expected = [(tag, step, float.fromhex(v) if v not in ("nan", "inf", "-inf") else float(v))
                for tag, step, v in info["scalars"]]
    check(len(expected) > 40, f"the helper logged only {len(expected)} scalars")

    # -- the event file, record by record --
    tb_dir = os.path.join(work, "tb")
    files = os.listdir(tb_dir)
    check(len(files) == 1 and files[0].startswith("events.out.tfevents."),
          f"tb: expected one events.out.tfevents.* file, found {files}")
    check(os.path.join(tb_dir, files[0]) == info["event_file"], "tb: the sink named another file")
    events = list(LegacyEventFileLoader(info["event_file"]).Load())
    check(len(events) == len(expected) + 1,
          f"tb: {len(events)} events, expected {len(expected) + 1}")
    if events:
        check(events[0].file_version == "brain.Event:2",
              f"tb: first event's file_version is {events[0].file_version!r}")
    got = []
    for ev in events[1:]:
        check(ev.HasField("summary") and len(ev.summary.value) == 1,
              f"tb: event at step {ev.step} does not hold one summary value")
        check(ev.wall_time > 1.6e9, f"tb: wall_time {ev.wall_time} is not seconds since 1970")
        for v in ev.summary.value:
            check(v.WhichOneof("value") == "simple_value", f"tb: {v.tag} is not a simple_value")
            got.append((v.tag, ev.step, f32_bits(v.simple_value)))
    want = [(tag, step, f32_bits(v)) for tag, step, v in expected]
    check(got == want, "tb: tags, steps or float32 values differ from those logged:\n"
          + "\n".join(f"  got {g} want {w}" for g, w in zip(got, want) if g != w))

    # -- the same through EventAccumulator, per tag --
    acc = event_accumulator.EventAccumulator(tb_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = sorted(acc.Tags()["scalars"])
    check(tags == sorted({t for t, _, _ in expected}), f"accumulator: tags {tags}")
    for tag in tags:
        got = [(s.step, f32_bits(s.value)) for s in acc.Scalars(tag)]
        want = [(step, f32_bits(v)) for t, step, v in expected if t == tag]
        check(got == want, f"accumulator: {tag}: {got} != {want}")

    # -- the CSV file --
    with open(os.path.join(work, "metrics.csv"), newline="") as f:
        reader = csv.DictReader(f)
        check(reader.fieldnames == ["step", "tag", "value", "wall_time"],
              f"csv: header {reader.fieldnames}")
        rows = list(reader)
    got = [(r["tag"], int(r["step"]), f64_bits(float(r["value"]))) for r in rows]
    want = [(tag, step, f64_bits(v)) for tag, step, v in expected]
    check(got == want, "csv: rows differ from those logged:\n"
          + "\n".join(f"  got {g} want {w}" for g, w in zip(got, want) if g != w))
    for r in rows:
        check(float(r["wall_time"]) > 1.6e9, f"csv: wall_time {r['wall_time']}")
    check(any("quotes" in t for t, _, _ in got), "csv: the quoted tag is missing")

    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print(f"ok: {len(expected)} scalars read back from {info['event_file']} and metrics.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
