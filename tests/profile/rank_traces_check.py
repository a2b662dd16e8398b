#!/usr/bin/env python3
"""Checks the merged traces of test_mpi_trace (CTest label interop; run after it).

    rank_traces_check.py <dir>

<dir> holds merged.pftrace, merged.json and ranks.txt (the rank count), written by rank 0 of
test_mpi_trace after every rank traced 5 barriers. The Perfetto file is parsed with
perfetto.protos.perfetto.trace.perfetto_trace_pb2.Trace (the schema the `perfetto` pip package
ships): one packet sequence per rank, a process track named "rank <r>" per rank, each rank's 5
"after_barrier" slices on its own thread track, and, since every slice k begins right after the
k-th barrier and the times are on rank 0's time base, the begins of slice k on all ranks within
50 ms of each other. Then the same in the JSON file (pid = rank). Exits 77 (skipped) without the
perfetto or protobuf package.
"""
import json
import os
import sys

try:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
except ImportError as e:  # pragma: no cover
    print(f"HONE_SKIPPED: {e}; install the pip packages of scripts/deps.sh (perfetto, protobuf)")
    sys.exit(77)

FAILURES = []
SPREAD_NS = 50_000_000


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAIL: {what}")


def main():
    d = sys.argv[1]
    n = int(open(os.path.join(d, "ranks.txt")).read())
    trace = pb.Trace()
    with open(os.path.join(d, "merged.pftrace"), "rb") as f:
        trace.ParseFromString(f.read())
    seqs = {p.trusted_packet_sequence_id for p in trace.packet}
    check(seqs == set(range(1, n + 1)), f"perfetto: sequences {sorted(seqs)}, want 1..{n}")
    tracks, names_by_seq, process_of = {}, {}, {}
    begins = {}  # rank -> [ts of after_barrier]
    for p in trace.packet:
        seq = p.trusted_packet_sequence_id
        names = names_by_seq.setdefault(seq, {})
        for en in p.interned_data.event_names:
            names[en.iid] = en.name
        if p.HasField("track_descriptor"):
            td = p.track_descriptor
            check(td.uuid not in tracks or tracks[td.uuid][0] == seq,
                  f"perfetto: track {td.uuid} declared by two ranks")
            tracks[td.uuid] = (seq, td)
            if td.HasField("process"):
                process_of[seq] = td.process.process_name
    for p in trace.packet:
        if not p.HasField("track_event"):
            continue
        te, seq = p.track_event, p.trusted_packet_sequence_id
        check(te.track_uuid in tracks and tracks[te.track_uuid][0] == seq,
              f"perfetto: sequence {seq} writes on a track it did not declare")
        if te.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            name = names_by_seq[seq].get(te.name_iid)
            if name == "after_barrier":
                begins.setdefault(seq - 1, []).append(p.timestamp)
    for r in range(n):
        check(process_of.get(r + 1) == f"rank {r}",
              f"perfetto: process of sequence {r + 1} is {process_of.get(r + 1)!r}")
        check(len(begins.get(r, [])) == 5, f"perfetto: rank {r} has {len(begins.get(r, []))} "
              "after_barrier slices, want 5")
    if all(len(begins.get(r, [])) == 5 for r in range(n)):
        for k in range(5):
            ts = [sorted(begins[r])[k] for r in range(n)]
            check(max(ts) - min(ts) < SPREAD_NS,
                  f"perfetto: barrier {k}: begins spread over {max(ts) - min(ts)} ns")

    doc = json.load(open(os.path.join(d, "merged.json")))
    ev = doc["traceEvents"]
    pids = {e["pid"] for e in ev}
    check(pids == set(range(n)), f"json: pids {sorted(pids)}, want 0..{n - 1}")
    procs = {e["pid"]: e["args"]["name"] for e in ev
             if e["ph"] == "M" and e["name"] == "process_name"}
    for r in range(n):
        check(procs.get(r, "").startswith(f"rank {r} (pid "),
              f"json: process name of pid {r} is {procs.get(r)!r}")
    jb = {}
    for e in ev:
        if e["ph"] == "B" and e["name"] == "after_barrier":
            jb.setdefault(e["pid"], []).append(float(e["ts"]) * 1000.0)
    for k in range(5):
        if all(len(jb.get(r, [])) == 5 for r in range(n)):
            ts = [sorted(jb[r])[k] for r in range(n)]
            check(max(ts) - min(ts) < SPREAD_NS, f"json: barrier {k}: spread {max(ts) - min(ts)}")
        else:
            check(False, f"json: after_barrier counts {[len(jb.get(r, [])) for r in range(n)]}")
            break
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed")
        return 1
    print(f"merged traces of {n} ranks: {len(trace.packet)} packets, {len(ev)} JSON events: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
