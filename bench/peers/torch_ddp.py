#!/usr/bin/env python3
"""Peer of mpi_bench_ddp (bench/ddp.cpp): ddp_step with torch's DistributedDataParallel over
gloo on the CPU, the same models, sizes and rows:

  train_mlp  Linear(2, 64) -> ReLU -> Linear(64, 64) -> ReLU -> Linear(64, 5), 64 samples per rank
  mlp_16m    Linear(1024, 3520) -> ReLU -> Linear(3520, 3520) -> ReLU -> Linear(3520, 10)
             (16,037,130 parameters), 32 samples per rank

fp32, cross-entropy, torch.optim.AdamW(lr 1e-3, weight decay 0.01) and
clip_grad_norm_(max_norm 1.0), one fixed random batch per rank, torch.set_num_threads(1). Rows,
interleaved, the order rotated each repetition (--rotate shifts it):

  ddp        zero_grad, forward, backward (DDP's bucketed all-reduce, 25 MiB buckets, overlapped
             with backward by gloo's thread), clipping, AdamW step
  local      the same on a plain (non-DDP) replica: the compute alone
  allreduce  torch.distributed.all_reduce of one flat fp32 tensor of the model's size, then / ranks

exposed = (ddp - local) / ddp per repetition. A sample is a batch of steps between a barrier and a
MAX all-reduce of the time (the slowest rank's), sized once from two warm-up DDP steps to about
--min-time seconds, as the C++ program does.

Launch, 2 ranks: under mpirun (rank and size from OMPI_COMM_WORLD_RANK/SIZE; scripts/bench-ddp
does this, alternating with mpi_bench_ddp), under torchrun (RANK/WORLD_SIZE), or alone (it spawns
--ranks processes with torch.multiprocessing). The process group is initialized from env://
(MASTER_ADDR 127.0.0.1, MASTER_PORT --port). Rank 0 prints the table; with --json FILE it
appends one JSON object per model (the samples, in ms; scripts/bench-ddp reads them), with --out
FILE it writes results.json records (workloads ddp_step_<model>, ..._local, ..._reduce).
--filter selects models by "ddp_step_<model>/torch" (none: [] is written); without torch and
gloo it writes unavailable records.

  mpirun -np 2 build/bench/peers-venv/bin/python bench/peers/torch_ddp.py --model train_mlp
  build/bench/peers-venv/bin/python bench/peers/torch_ddp.py --ranks 2 --repetitions 3

bench/driver.py (scripts/bench --peers) starts every peer with --serve: this one needs all of its
ranks at once, so it serves no workload there (scripts/bench-ddp runs it).
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    init_gloo, launched_rank, parser, select, serve_nothing, time_ms, unavailable, write)

MODELS = {  # name: (inputs, hidden, classes, samples per rank), as bench/ddp.cpp
    "train_mlp": (2, 64, 5, 64),
    "mlp_16m": (1024, 3520, 10, 32),
}
ROWS = ("ddp", "local", "allreduce")
SUFFIX = {"ddp_ms": "", "local_ms": "_local", "reduce_ms": "_reduce"}  # workload names


def options(argv: list[str] | None = None):
    ap = parser(__doc__, threads=1)
    ap.add_argument("--model", choices=(*MODELS, "all"), default="all")
    ap.add_argument("--hidden", type=int, default=0, help="override every model's hidden width")
    ap.add_argument("--batch", type=int, default=0, help="override the samples per rank")
    ap.add_argument("--rotate", type=int, default=0, help="shift the rows' order")
    ap.add_argument("--json", type=Path, help="append one JSON object per model (rank 0)")
    ap.add_argument("--port", type=int, default=29517, help="MASTER_PORT of the process group")
    ap.add_argument("--ranks", type=int, default=2,
                    help="processes to spawn when not started by mpirun or torchrun")
    ap.set_defaults(min_time=0.3)
    args = ap.parse_args(argv)
    for name in ("repetitions", "ranks", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.hidden < 0 or args.batch < 0:
        ap.error("--hidden and --batch must be positive (0 keeps the model's own)")
    if not args.min_time > 0:
        ap.error(f"--min-time must be a number of seconds > 0, got {args.min_time}")
    return args


def sample(torch, dist, steps: int, fn) -> float:
    """Seconds per call of `steps` calls of fn, the slowest rank's, after a barrier."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    t = torch.tensor([(time.perf_counter() - t0) / steps], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def run_model(torch, dist, name: str, args, rank: int, size: int) -> None:
    from torch import nn  # noqa: PLC0415
    from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415

    inputs, hidden, classes, batch = MODELS[name]
    hidden = args.hidden or hidden
    batch = args.batch or batch

    def make():
        torch.manual_seed(1)  # the same start on every rank (DDP broadcasts rank 0's anyway)
        return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                             nn.ReLU(), nn.Linear(hidden, classes))

    ddp_model = DistributedDataParallel(make())
    local_model = make()
    parameters = sum(p.numel() for p in local_model.parameters())
    opt = {"ddp": torch.optim.AdamW(ddp_model.parameters(), lr=1e-3, weight_decay=0.01),
           "local": torch.optim.AdamW(local_model.parameters(), lr=1e-3, weight_decay=0.01)}
    models = {"ddp": ddp_model, "local": local_model}
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.rand(batch, inputs, generator=g) * 2 - 1
    y = torch.randint(0, classes, (batch,), generator=g)
    flat = torch.zeros(parameters)

    def step(row: str) -> None:
        if row == "allreduce":
            dist.all_reduce(flat)
            flat.div_(size)
            return
        model, o = models[row], opt[row]
        o.zero_grad()
        loss_fn(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        o.step()

    for row in ROWS:  # warm-up: the optimizer state, gloo's connections, DDP's buckets
        step(row)
    one = sample(torch, dist, 1, lambda: step("ddp"))
    steps = max(1, math.ceil(args.min_time / max(one, 1e-9)))
    count = torch.tensor([steps], dtype=torch.int64)
    dist.broadcast(count, 0)
    steps = int(count.item())

    times: dict[str, list[float]] = {row: [] for row in ROWS}
    exposed = []
    for r in range(args.repetitions):
        t = {}
        for k in range(len(ROWS)):
            row = ROWS[(k + r + args.rotate) % len(ROWS)]
            t[row] = sample(torch, dist, steps, lambda row=row: step(row))
        for row in ROWS:
            times[row].append(t[row])
        exposed.append((t["ddp"] - t["local"]) / t["ddp"])
    if rank != 0:
        return
    cells = "".join(f" {statistics.median(times[row]) * 1e3:10.4f} "
                    f"{1 / statistics.median(times[row]):9.1f} |" for row in ROWS)
    print(f"{name:<10} {parameters:10d} {batch:5d} {steps:6d} {args.repetitions:3d} |{cells} "
          f"{statistics.median(exposed):7.3f}", flush=True)
    if args.json_files:
        record = {"impl": "torch", "model": name, "ranks": size, "threads": args.threads,
                  "inputs": inputs, "hidden": hidden, "classes": classes,
                  "batch_per_rank": batch, "parameters": parameters, "steps_per_sample": steps,
                  "rotate": args.rotate, "torch": torch.__version__, "backend": "gloo",
                  "ddp_ms": [v * 1e3 for v in times["ddp"]],
                  "local_ms": [v * 1e3 for v in times["local"]],
                  "reduce_ms": [v * 1e3 for v in times["allreduce"]]}
        for path in args.json_files:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


def worker(rank: int, size: int, args) -> None:
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    init_gloo(torch, dist, rank, size, args.port, args.threads)
    try:
        if rank == 0:
            print(f"ddp_step (torch {torch.__version__} DDP, gloo): {size} ranks x "
                  f"{args.threads} thread(s), fp32 AdamW + clipping; time per step (median over "
                  "repetitions, slowest rank), steps/s, exposed = median of (ddp - local) / ddp")
            head = "".join(f" {row[-6:]:>7} ms {'steps/s':>9} |" for row in ROWS)
            print(f"{'model':<10} {'params':>10} {'batch':>5} {'steps':>6} {'rep':>3} |{head} "
                  f"{'exposed':>7}", flush=True)
        for name in args.models:
            run_model(torch, dist, name, args, rank, size)
        dist.barrier()  # every rank done before any tears its process group down
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    if args.serve:
        return serve_nothing("torch_ddp", "scripts/bench-ddp")
    chosen = [m for m in MODELS if args.model in ("all", m)]
    args.models = [m for m in chosen if select([f"ddp_step_{m}"], "torch", args.filter)]
    if not args.models:
        return write([], args.out)
    try:
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415
        if not dist.is_available() or not dist.is_gloo_available():
            raise RuntimeError("this torch has no torch.distributed with gloo")
    except Exception as e:  # noqa: BLE001  (ImportError, or a broken install)
        print(f"torch_ddp.py: torch with gloo is not available: {e}", file=sys.stderr)
        return write(unavailable([f"ddp_step_{m}" for m in args.models], "torch", str(e)),
                     args.out)
    args.json_files, args.out_json = [args.json] if args.json else [], None
    if args.out:  # this run's objects, for the records
        fd, path = tempfile.mkstemp(prefix="torch_ddp-", suffix=".json")
        os.close(fd)
        args.out_json = Path(path)
        args.json_files.append(args.out_json)
    launched = launched_rank()
    if launched is not None:
        worker_then_exit(*launched, args)
    import torch.multiprocessing as mp  # noqa: PLC0415

    mp.spawn(spawned, args=(args.ranks, args), nprocs=args.ranks)
    return 0


def records(json_lines: str, threads: int) -> list[dict]:
    """results.json records (bench/report.py) of the objects run_model appended: workloads
    ddp_step_<model>, ..._local and ..._reduce, impl torch."""
    out = []
    for line in json_lines.splitlines():
        r = json.loads(line)
        exposed = statistics.median((d - lo) / d for d, lo in zip(r["ddp_ms"], r["local_ms"]))
        for key, suffix in SUFFIX.items():
            extra = {"counters": {"exposed_fraction": exposed}} if key == "ddp_ms" else {}
            out.append(time_ms(f"ddp_step_{r['model']}{suffix}", "torch",
                               [v / 1e3 for v in r[key]], threads, ranks=r["ranks"],
                               peer=f"torch {r['torch']} DistributedDataParallel, gloo",
                               what=f"{r['parameters']} parameters, {r['batch_per_rank']} "
                                    "samples per rank", **extra))
    return out


def worker_then_exit(rank: int, size: int, args) -> None:
    """worker(), rank 0's --out, then the end of the process without the interpreter's
    teardown: torch 2.15's gloo process group sometimes leaves a joinable std::thread to it after
    destroy_process_group ("terminate called without an active exception", SIGABRT), and the
    work is done and written by then."""
    status = 0
    try:
        worker(rank, size, args)
        if rank == 0 and args.out:
            write(records(args.out_json.read_text(), args.threads), args.out)
    except BaseException:  # noqa: BLE001  (printed, then the exit status says it)
        import traceback  # noqa: PLC0415
        traceback.print_exc()
        status = 1
    finally:
        if args.out_json is not None:
            args.out_json.unlink(missing_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def spawned(rank: int, size: int, args) -> None:  # torch.multiprocessing.spawn's entry
    worker_then_exit(rank, size, args)


if __name__ == "__main__":
    sys.exit(main())
