#!/usr/bin/env python3
"""Peer of bench_data_gpu (bench/data_gpu.cpp): PyTorch's DataLoader with pin_memory=True over
the records of bench_loader, each batch copied to the GPU with .to("cuda", non_blocking=True),
with num_workers 0, 1 and 2.

  staging_samples_per_s_2k   32768 records of 2 KiB (1024 uint16 tokens), batches of 64
  staging_samples_per_s_64k  1024 records of 64 KiB (32768 uint16 tokens), batches of 64

The dataset and loader are torch_loader.py's (numpy.memmap records, shuffled, default collate,
persistent workers, 2 prefetched batches per worker), plus pin_memory=True: the loader's pin
thread copies each collated batch into page-locked memory, as a user who stages batches to a
GPU with PyTorch does. Each batch is then copied to the device on the current stream
(non_blocking) and followed by the trivial consumer, a one-element zero_() of the device batch
(bench_data_gpu's consumer is a one-byte cudaMemsetAsync). One call is one epoch and ends with
torch.cuda.synchronize(), so its time covers every copy. Records GB/s of record bytes and
samples_per_s, as bench_data_gpu does. Set HONE_BENCH_LOADER_DIR to the folder bench_data_gpu
uses to read the same files.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Bench, Workload, import_torch, parser, repeat, run, select  # noqa: E402
from torch_loader import epoch_record, make_loader  # noqa: E402

WORKLOADS = {"staging_samples_per_s_2k": (32768, 1024), "staging_samples_per_s_64k": (1024, 32768)}
WORKERS = (0, 1, 2)


def main(argv: list[str]) -> int:
    args = parser(__doc__).parse_args(argv)
    impls = {f"torch_pin_w{w}": w for w in WORKERS}
    chosen = [(w, impl) for impl in impls for w in select(WORKLOADS, impl, args.filter)]
    if not chosen:
        return run(args, [], [], "torch_staging")
    missing = []
    torch = None
    for impl in impls:
        torch, gone = import_torch([w for w, i in chosen if i == impl], impl, "cuda")
        missing += gone
    if torch is None:
        return run(args, [], missing, "torch_staging")
    import numpy as np  # noqa: PLC0415
    torch.set_num_threads(1)
    dev = torch.device("cuda")

    def setup(w: str, impl: str) -> Bench:
        records, width = WORKLOADS[w]
        workers = impls[impl]
        loader = make_loader(torch, np, records, width, workers, pin_memory=True)

        def epoch():
            for b in loader:
                d = b.to(dev, non_blocking=True)
                d[0, :1].zero_()
            torch.cuda.synchronize()

        def close():
            nonlocal loader
            loader = None  # a persistent loader's workers end with it

        return Bench(repeat(epoch, args.min_time), close=close, record=lambda seconds: epoch_record(
            w, impl, seconds, records, width, workers,
            peer=f"torch {torch.__version__} DataLoader(num_workers={workers}, pin_memory=True, "
                 f"persistent_workers={workers > 0}) + .to('cuda', non_blocking=True), "
                 f"{torch.cuda.get_device_name(0)}",
            what=", staged to the GPU"))

    return run(args, [Workload(w, impl, lambda w=w, impl=impl: setup(w, impl))
                      for w, impl in chosen], [], "torch_staging")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
