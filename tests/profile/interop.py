#!/usr/bin/env python3
"""Interop test (CTest label interop): hone's traces read by Perfetto's own trace schema and json.

    interop.py <profile_interop_helper> <work dir>

The helper records one run (a "loader" thread making 3 batches, a "trainer" thread consuming
them and running 3 trainer steps with hone::profile::phase_timer, the loss as a counter) into a
Perfetto protobuf trace and a Chrome JSON trace. This script parses the Perfetto file with
perfetto.protos.perfetto.trace.perfetto_trace_pb2.Trace (the schema the `perfetto` pip package
ships; its trace processor is not used: it downloads a binary) and checks the process and thread
tracks (pid, tid, names), the slices of each thread (names, nesting, begin/end order), the flows
from the loader's zones to the trainer's, and the counter track's values; then it checks the same
in the JSON file. The helper also feeds a synthetic device source (no GPU needed): its zones must
be on a track of their own, "GPU 0 stream 7" (a named track under the process, not a thread; in
JSON a thread with tid 2^30 + 1 of that name), nested gpu_step > gpu_kernel once per step, each
between the end of that step's "consume" zone and the next one's begin.

Exits 77 (CTest: skipped) when the perfetto or protobuf package is missing.
"""
import json
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


def one_step():
    """The zones of one trainer step as (depth, name) in begin order: phase_timer's "step" zone
    around the trainer's phases, 2 micro-batches, no gradient reduction."""
    phases = ["checkpoint", "forward_backward", "unscale", "forward_backward", "unscale",
              "check", "optimizer", "checkpoint"]
    return [(0, "step")] + [(1, p) for p in phases]


EXPECTED_TRAINER = []
for _ in range(3):
    EXPECTED_TRAINER += [(0, "consume")] + one_step()
EXPECTED_LOADER = [(0, "load")] * 3
EXPECTED_GPU = [(0, "gpu_step"), (1, "gpu_kernel")] * 3
GPU_TRACK = "GPU 0 stream 7"


def spans(events):
    """events: (ts, 'B'|'E', name) in file order -> [(name, begin, end)] in begin order."""
    out, stack = [], []
    for ts, kind, name in events:
        if kind == "B":
            stack.append(len(out))
            out.append([name, ts, None])
        elif stack:
            out[stack.pop()][2] = ts
    return out


def check_gpu_placement(gpu_events, trainer_events, where):
    """Each gpu_step lies between the end of its step's consume zone and the next one's begin."""
    consume = [s for s in spans(trainer_events) if s[0] == "consume"]
    steps = [s for s in spans(gpu_events) if s[0] == "gpu_step"]
    check(len(consume) == 3 and len(steps) == 3, f"{where}: 3 consume zones and 3 gpu_step slices")
    for i, (_, b, e) in enumerate(steps[:len(consume)]):
        lo = consume[i][2]
        hi = consume[i + 1][1] if i + 1 < len(consume) else float("inf")
        check(lo <= b and e is not None and e <= hi,
              f"{where}: gpu_step {i} [{b}, {e}] is not inside its step's interval [{lo}, {hi}]")


def nest(events, where):
    """events: (ts, 'B'|'E', name) in file order. Checks times never go back and every end closes
    the innermost open zone; returns the begins as (depth, name)."""
    out, stack, last = [], [], -1
    for ts, kind, name in events:
        check(ts >= last, f"{where}: time goes back at {name} ({ts} < {last})")
        last = ts
        if kind == "B":
            out.append((len(stack), name))
            stack.append((name, ts))
        else:
            check(bool(stack), f"{where}: an end with no open zone")
            if stack:
                bname, bts = stack.pop()
                check(name is None or name == bname, f"{where}: end of {name} closes {bname}")
                check(ts >= bts, f"{where}: {bname} ends before it begins")
    check(not stack, f"{where}: zones left open: {stack}")
    return out


def check_perfetto(path, info):
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    packets = list(trace.packet)
    check(len(packets) > 0, "perfetto: no packets")
    first = packets[0]
    check(first.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED,
          "perfetto: the first packet does not clear the incremental state")
    check(first.first_packet_on_sequence, "perfetto: first_packet_on_sequence is not set")
    seqs = {p.trusted_packet_sequence_id for p in packets}
    check(seqs == {1}, f"perfetto: sequence ids {seqs}")

    tracks, names = {}, {}
    slices = {}      # track uuid -> [(ts, 'B'|'E', name)]
    flows_out, flows_in = {}, {}  # flow id -> (track uuid, ts)
    counters = {}    # track uuid -> [values]
    for p in packets:
        if p.HasField("track_descriptor"):
            td = p.track_descriptor
            tracks[td.uuid] = td  # a later descriptor (a rename) replaces the earlier
        for en in p.interned_data.event_names:
            check(en.iid not in names or names[en.iid] == en.name, f"perfetto: iid {en.iid} reused")
            names[en.iid] = en.name
        if not p.HasField("track_event"):
            continue
        te = p.track_event
        check(te.track_uuid in tracks, f"perfetto: event on undeclared track {te.track_uuid}")
        if te.type == pb.TrackEvent.TYPE_COUNTER:
            counters.setdefault(te.track_uuid, []).append(te.double_counter_value)
            continue
        check(p.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE,
              "perfetto: an event with interned names lacks SEQ_NEEDS_INCREMENTAL_STATE")
        if te.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            check(te.name_iid in names, f"perfetto: name iid {te.name_iid} used before interned")
            slices.setdefault(te.track_uuid, []).append((p.timestamp, "B", names.get(te.name_iid)))
        elif te.type == pb.TrackEvent.TYPE_SLICE_END:
            slices.setdefault(te.track_uuid, []).append((p.timestamp, "E", None))
        elif te.type == pb.TrackEvent.TYPE_INSTANT:
            check(names.get(te.name_iid) == "batch", "perfetto: the flow instants are named batch")
            for fid in te.flow_ids:
                flows_out[fid] = (te.track_uuid, p.timestamp)
            for fid in te.terminating_flow_ids:
                flows_in[fid] = (te.track_uuid, p.timestamp)

    gpu = [t for t in tracks.values() if t.name == GPU_TRACK]
    check(len(gpu) == 1, f"perfetto: one track named {GPU_TRACK}, got {len(gpu)}")
    procs = [t for t in tracks.values() if t.HasField("process")]
    check(len(procs) == 1 and procs[0].process.pid == info["pid"],
          f"perfetto: one process track with pid {info['pid']}")
    check(procs and procs[0].process.process_name == "profile_interop_helper",
          "perfetto: the process is named")
    threads = {t.thread.thread_name: t for t in tracks.values() if t.HasField("thread")}
    check(set(threads) >= {"loader", "trainer"}, f"perfetto: thread names {set(threads)}")
    if not {"loader", "trainer"} <= set(threads):
        return
    loader, trainer = threads["loader"], threads["trainer"]
    check(loader.thread.tid == info["loader_tid"], "perfetto: the loader's tid")
    check(trainer.thread.tid == info["trainer_tid"], "perfetto: the trainer's tid")
    for t in (loader, trainer):
        check(t.thread.pid == info["pid"] and t.parent_uuid == procs[0].uuid,
              f"perfetto: {t.thread.thread_name} belongs to the process")
    check(nest(slices.get(loader.uuid, []), "perfetto loader") == EXPECTED_LOADER,
          "perfetto: the loader's slices")
    got = nest(slices.get(trainer.uuid, []), "perfetto trainer")
    check(got == EXPECTED_TRAINER, f"perfetto: the trainer's slices: {got}")
    if len(gpu) == 1:
        g = gpu[0]
        check(not g.HasField("thread") and not g.HasField("process") and not g.HasField("counter"),
              "perfetto: the GPU track is a plain named track")
        check(procs and g.parent_uuid == procs[0].uuid, "perfetto: the GPU track is the process's")
        got = nest(slices.get(g.uuid, []), "perfetto gpu")
        check(got == EXPECTED_GPU, f"perfetto: the GPU track's slices: {got}")
        check_gpu_placement(slices.get(g.uuid, []), slices.get(trainer.uuid, []), "perfetto")

    check(set(flows_out) == {1, 2, 3} and set(flows_in) == {1, 2, 3}, "perfetto: flows 1, 2, 3")
    for fid in flows_out:
        if fid in flows_in:
            check(flows_out[fid][0] == loader.uuid and flows_in[fid][0] == trainer.uuid,
                  f"perfetto: flow {fid} goes from the loader to the trainer")
            check(flows_out[fid][1] <= flows_in[fid][1], f"perfetto: flow {fid} goes forward")

    ctracks = [t for t in tracks.values() if t.HasField("counter")]
    check([t.name for t in ctracks] == ["loss"], f"perfetto: counter tracks {[t.name for t in ctracks]}")
    if ctracks:
        vals = counters.get(ctracks[0].uuid, [])
        check(len(vals) == 3 and all(abs(a - b) <= 1e-6 * max(1, abs(b)) for a, b in zip(vals, info["losses"])),
              f"perfetto: loss values {vals} against {info['losses']}")


def check_json(path, info):
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    check(names.get((info["pid"], info["loader_tid"])) == "loader", "json: the loader's name")
    check(names.get((info["pid"], info["trainer_tid"])) == "trainer", "json: the trainer's name")

    def thread_slices(tid):
        return [(e["ts"], e["ph"], e["name"]) for e in events
                if e["tid"] == tid and e["ph"] in ("B", "E")]

    check(nest(thread_slices(info["loader_tid"]), "json loader") == EXPECTED_LOADER,
          "json: the loader's slices")
    got = nest(thread_slices(info["trainer_tid"]), "json trainer")
    check(got == EXPECTED_TRAINER, f"json: the trainer's slices: {got}")
    gpu_tid = (1 << 30) + 1
    check(names.get((info["pid"], gpu_tid)) == GPU_TRACK, f"json: tid {gpu_tid} is named {GPU_TRACK}")
    got = nest(thread_slices(gpu_tid), "json gpu")
    check(got == EXPECTED_GPU, f"json: the GPU track's slices: {got}")
    check_gpu_placement(thread_slices(gpu_tid), thread_slices(info["trainer_tid"]), "json")
    loss = [e["args"]["value"] for e in events if e["ph"] == "C" and e["name"] == "loss"]
    check(len(loss) == 3 and all(abs(a - b) <= 1e-6 * max(1, abs(b)) for a, b in zip(loss, info["losses"])),
          f"json: loss values {loss}")
    s = {e["id"]: e["tid"] for e in events if e["ph"] == "s"}
    fin = {e["id"]: e["tid"] for e in events if e["ph"] == "f"}
    check(s == {1: info["loader_tid"], 2: info["loader_tid"], 3: info["loader_tid"]},
          f"json: flow starts {s}")
    check(fin == {1: info["trainer_tid"], 2: info["trainer_tid"], 3: info["trainer_tid"]},
          f"json: flow ends {fin}")
    check(all(e.get("cat") == "flow" and (e["ph"] == "s" or e.get("bp") == "e")
              for e in events if e["ph"] in ("s", "f")), "json: flows carry cat and binding")


def main():
    helper, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    out = subprocess.run([helper, work], check=True, capture_output=True, text=True).stdout
    info = json.loads(out.strip().splitlines()[-1])
    check_perfetto(os.path.join(work, "trace.pftrace"), info)
    check_json(os.path.join(work, "trace.json"), info)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed")
        return 1
    print("profile interop: Perfetto and JSON traces read back as written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
