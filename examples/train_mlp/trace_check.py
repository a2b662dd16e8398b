#!/usr/bin/env python3
"""The flagship's trace read with Perfetto's own schema (CTest example_train_mlp_trace, label
interop).

    trace_check.py <train_mlp> <work dir>

Runs train_mlp for 60 steps (3 micro-batches each, validation and an async checkpoint every 20
steps) with --trace, parses the file with perfetto.protos.perfetto.trace.perfetto_trace_pb2.Trace
(the schema of the `perfetto` pip package) and checks: a "main" thread whose 60 "step" zones hold
the trainer's phases (3 forward_backward and 3 unscale, then check and optimizer), 60
"train_mlp.batches" zones, 3 "train_mlp.validate" zones and 3 "hone.checkpoint.save" zones each
holding a "hone.checkpoint.snapshot"; a "hone.checkpoint.writer" thread with 3
"hone.checkpoint.write" zones. Exits 77 (skipped) without the perfetto or protobuf package.
"""
import os
import subprocess
import sys

try:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
except ImportError as e:  # pragma: no cover
    print(f"HONE_SKIPPED: {e}; install the pip packages of scripts/deps.sh (perfetto, protobuf)")
    sys.exit(77)

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAIL: {what}")


def main():
    exe, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "run.pftrace")
    ck = os.path.join(work, "ck")
    subprocess.run(["rm", "-rf", ck, path], check=True)
    subprocess.run([exe, "--device", "cpu", "--precision", "bf16", "--accumulate", "3",
                    "--steps", "60", "--eval-every", "20", "--patience", "1000",
                    "--checkpoint-dir", ck, "--checkpoint-async", "--checkpoint-every", "20",
                    "--trace", path, "--out", os.path.join(work, "out")], check=True)
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    names, threads, slices = {}, {}, {}
    for p in trace.packet:
        for en in p.interned_data.event_names:
            names[en.iid] = en.name
        if p.HasField("track_descriptor") and p.track_descriptor.HasField("thread"):
            threads[p.track_descriptor.uuid] = p.track_descriptor.thread.thread_name
    for p in trace.packet:
        if p.HasField("track_event"):
            te = p.track_event
            if te.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
                slices.setdefault(te.track_uuid, []).append(("B", names.get(te.name_iid)))
            elif te.type == pb.TrackEvent.TYPE_SLICE_END:
                slices.setdefault(te.track_uuid, []).append(("E", None))
    by_name = {n: u for u, n in threads.items()}
    check("main" in by_name, f"no thread named main: {sorted(threads.values())}")
    check("hone.checkpoint.writer" in by_name, "no thread named hone.checkpoint.writer")
    if FAILURES:
        return 1

    def tree(uuid):
        """Top-level zones as (name, [children names])."""
        out, stack = [], []
        for kind, name in slices.get(uuid, []):
            if kind == "B":
                stack.append((name, []))
            else:
                name, kids = stack.pop()
                if stack:
                    stack[-1][1].append(name)
                else:
                    out.append((name, kids))
        check(not stack, f"zones left open: {stack}")
        return out

    main_zones = tree(by_name["main"])
    count = lambda zs, n: sum(1 for z in zs if z[0] == n)  # noqa: E731
    steps = [kids for name, kids in main_zones if name == "step"]
    check(len(steps) == 60, f"main: {len(steps)} step zones, want 60")
    want = ["checkpoint"] + ["forward_backward", "unscale"] * 3 + ["check", "optimizer",
                                                                    "checkpoint"]
    check(all(kids == want for kids in steps),
          f"main: step phases {steps[0] if steps else None}, want {want}")
    check(count(main_zones, "train_mlp.batches") == 60, "main: train_mlp.batches zones != 60")
    check(count(main_zones, "train_mlp.validate") == 3, "main: train_mlp.validate zones != 3")
    saves = [kids for name, kids in main_zones if name == "hone.checkpoint.save"]
    check(len(saves) == 3 and all(k == ["hone.checkpoint.snapshot"] for k in saves),
          f"main: checkpoint saves {saves}")
    writes = tree(by_name["hone.checkpoint.writer"])
    check([n for n, _ in writes] == ["hone.checkpoint.write"] * 3,
          f"writer thread: {[n for n, _ in writes]}")
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed")
        return 1
    print(f"train_mlp trace: {len(trace.packet)} packets, {len(threads)} threads: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
