#!/usr/bin/env python3
"""Peer of mpi_bench_zero (bench/zero.cpp): the same step over torch.distributed on the CPU
(gloo), with torch's ZeRO stage 1, torch.distributed.optim.ZeroRedundancyOptimizer, and its ZeRO
stage 2, FullyShardedDataParallel with ShardingStrategy.SHARD_GRAD_OP.

The model is mpi_bench_zero's: --params fp32 values (16 Mi) in --tensors tensors (8; the first
params % tensors hold one more), every value 0.01; its backward is g = x * w (one pass, x = 1 +
0.5 * rank), written as an autograd Function whose forward does no work, so that a step is the
reduction, the update and the parameters' exchange, as in mpi_bench_zero. torch.optim.AdamW
(lr 1e-3, weight decay 0.01: hone::adamw's defaults) and clip_grad_norm_(max_norm 1.0), one
thread (--threads). Rows, interleaved, the order rotated each repetition (--rotate shifts it):

  ddp    DistributedDataParallel (25 MiB buckets, as hone's --bucket-mb default) + AdamW
  zero1  the same DDP module + ZeroRedundancyOptimizer(optimizer_class=AdamW): DDP all-reduces
         the gradients, each rank steps the tensors it owns (whole tensors, assigned by size),
         and each tensor is broadcast from its owner after the step (torch's ZeRO-1)
  zero2  FullyShardedDataParallel(SHARD_GRAD_OP, use_orig_params, on the CPU) + AdamW over its
         shards and FSDP's clip_grad_norm_ (the global norm): the module's tensors are one flat
         parameter cut into equal shards by elements; backward reduce-scatters the gradients,
         each rank steps its shard, and the next forward all-gathers the parameters (torch's
         ZeRO-2; --bucket-mb does not apply: the one flat parameter of the wrapped module moves
         in one collective each way)

A sample is --steps steps between a barrier and a MAX all-reduce of the time (the slowest
rank's), as mpi_bench_zero's. Memory: the optimizer state's bytes on this rank (every tensor in
the optimizer's state), the largest rank's, per parameter: 8 for AdamW without sharding, about
8 / d with ZeRO-1 (whole tensors, so not exactly). Rank 0 prints the table; with --json FILE it
appends one JSON object (the samples in ms; scripts/bench-zero reads them); with --out FILE it
writes results.json records (workloads zero_step_ddp, zero_step_zero1 and zero_step_zero2, impl
torch; --filter
selecting none of them: [] is written and nothing runs). bench/driver.py
(scripts/bench --peers) starts every peer with --serve: this one needs all of its ranks at once,
so it serves no workload there.

  mpirun -np 2 build/bench/peers-venv/bin/python bench/peers/torch_zero.py --repetitions 3
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    init_gloo, launched_rank, parser, select, serve_nothing, time_ms, write)

ROWS = ("ddp", "zero1", "zero2")
WORKLOADS = {"ddp": "zero_step_ddp", "zero1": "zero_step_zero1",
             "zero2": "zero_step_zero2"}  # scripts/bench-zero's names
PEERS = {"ddp": "DistributedDataParallel",
         "zero1": "ZeroRedundancyOptimizer + DistributedDataParallel",
         "zero2": "FullyShardedDataParallel(SHARD_GRAD_OP)"}


def options(argv: list[str] | None = None):
    ap = parser(__doc__, threads=1)  # scripts/bench's options (--repetitions among them)
    ap.add_argument("--params", type=int, default=16 << 20, help="fp32 values in all")
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5, help="steps per sample")
    ap.add_argument("--bucket-mb", type=int, default=25, help="DDP's bucket_cap_mb")
    ap.add_argument("--rotate", type=int, default=0, help="shift the rows' order")
    ap.add_argument("--json", type=Path, help="append one JSON object (rank 0)")
    ap.add_argument("--port", type=int, default=29527, help="MASTER_PORT of the process group")
    args = ap.parse_args(argv)
    if args.tensors < 1 or args.params < args.tensors:
        ap.error("give --params >= --tensors >= 1")
    for name in ("steps", "repetitions", "bucket_mb"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def run(torch, dist, args, rank: int, size: int) -> None:
    from torch import nn  # noqa: PLC0415
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy  # noqa: PLC0415
    from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: PLC0415
    from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415

    class GradIsXW(torch.autograd.Function):
        """forward: nothing (a zero loss); backward: dL/dw = x * w for every tensor."""

        @staticmethod
        def forward(ctx, x, *ws):
            ctx.x = x
            ctx.save_for_backward(*ws)
            return ws[0].new_zeros(())

        @staticmethod
        def backward(ctx, g):
            scale = ctx.x * g
            return (None, *(w * scale for w in ctx.saved_tensors))

    sizes = [args.params // args.tensors + (1 if t < args.params % args.tensors else 0)
             for t in range(args.tensors)]

    class Flat(nn.Module):
        def __init__(self):
            super().__init__()
            self.ws = nn.ParameterList(nn.Parameter(torch.full((n,), 0.01)) for n in sizes)

        def forward(self, x):
            return GradIsXW.apply(x, *self.ws)

    x = 1.0 + 0.5 * rank
    models = {row: DistributedDataParallel(Flat(), bucket_cap_mb=args.bucket_mb)
              for row in ("ddp", "zero1")}
    models["zero2"] = FullyShardedDataParallel(
        Flat(), sharding_strategy=ShardingStrategy.SHARD_GRAD_OP, device_id=torch.device("cpu"),
        use_orig_params=True)
    opts = {"ddp": torch.optim.AdamW(models["ddp"].parameters(), lr=1e-3, weight_decay=0.01),
            "zero1": ZeroRedundancyOptimizer(models["zero1"].parameters(),
                                             optimizer_class=torch.optim.AdamW, lr=1e-3,
                                             weight_decay=0.01),
            "zero2": torch.optim.AdamW(models["zero2"].parameters(), lr=1e-3, weight_decay=0.01)}

    def step(row: str) -> None:
        model, o = models[row], opts[row]
        o.zero_grad()
        model(x).backward()
        if row == "zero2":
            model.clip_grad_norm_(1.0)  # the norm over every rank's shard
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        o.step()

    def sample(row: str) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step(row)
        t = torch.tensor([(time.perf_counter() - t0) / args.steps], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    for row in ROWS:  # warm-up: the optimizer state, gloo's connections, DDP's buckets
        sample(row)

    def state_bytes(o) -> int:
        inner = o.optim if isinstance(o, ZeroRedundancyOptimizer) else o
        return sum(v.numel() * v.element_size() for s in inner.state.values()
                   for v in s.values() if torch.is_tensor(v))

    mem = torch.tensor([state_bytes(opts[row]) / args.params for row in ROWS],
                       dtype=torch.float64)
    dist.all_reduce(mem, op=dist.ReduceOp.MAX)

    times: dict[str, list[float]] = {row: [] for row in ROWS}
    for r in range(args.repetitions):
        for k in range(len(ROWS)):
            row = ROWS[(k + r + args.rotate) % len(ROWS)]
            times[row].append(sample(row))
    if rank != 0:
        return
    def ratio(row: str) -> float:
        return statistics.median(d / z for d, z in zip(times["ddp"], times[row]))

    print(f"zero_step (torch {torch.__version__}, gloo): {size} ranks x 1 thread, {args.params} "
          f"fp32 parameters in {args.tensors} tensors, AdamW, clipping, {args.steps} steps per "
          f"sample, {args.repetitions} repetitions")
    print(f"{'row':<8} {'state B/param':>14} {'step ms':>10} {'ddp/row (median)':>17}")
    print(f"{'ddp':<8} {mem[0].item():14.2f} {statistics.median(times['ddp']) * 1e3:10.2f} "
          f"{'1.00':>17}")
    for k, row in enumerate(ROWS[1:], start=1):
        print(f"{row:<8} {mem[k].item():14.2f} {statistics.median(times[row]) * 1e3:10.2f} "
              f"{ratio(row):17.2f}", flush=True)
    if args.json:
        record = {"impl": "torch", "ranks": size, "parameters": args.params,
                  "tensors": args.tensors, "steps_per_sample": args.steps,
                  "bucket_mb": args.bucket_mb, "rotate": args.rotate,
                  "torch": torch.__version__, "backend": "gloo",
                  "ddp_ms": [v * 1e3 for v in times["ddp"]],
                  "zero1_ms": [v * 1e3 for v in times["zero1"]],
                  "zero2_ms": [v * 1e3 for v in times["zero2"]],
                  "state_bytes_per_param": {row: mem[k].item() for k, row in enumerate(ROWS)}}
        with open(args.json, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    if args.out:
        write([time_ms(WORKLOADS[row], "torch", times[row], args.threads, ranks=size,
                       peer=f"torch {torch.__version__} {PEERS[row]}, gloo",
                       counters={"optimizer_state_bytes_per_param": float(mem[k].item())})
               for k, row in enumerate(ROWS) if select([WORKLOADS[row]], "torch", args.filter)],
              args.out)


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    if args.serve:
        return serve_nothing("torch_zero", "scripts/bench-zero")
    if not select(WORKLOADS.values(), "torch", args.filter):
        return write([], args.out)
    launched = launched_rank()
    if launched is None:
        sys.exit("torch_zero.py: start it under mpirun (or torchrun): it needs all of its ranks")
    rank, size = launched
    status = 0
    try:
        import torch  # noqa: PLC0415
        import torch.distributed as dist  # noqa: PLC0415

        init_gloo(torch, dist, rank, size, args.port, args.threads)
        try:
            run(torch, dist, args, rank, size)
            dist.barrier()  # every rank done before any tears its process group down
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001  (printed, then the exit status says it)
        import traceback  # noqa: PLC0415
        traceback.print_exc()
        status = 1
    # Without the interpreter's teardown: torch 2.15's gloo process group sometimes leaves a
    # joinable std::thread behind (SIGABRT at exit), as torch_ddp.py notes; the work is written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
