#!/usr/bin/env python3
"""Peer: PyTorch's DataLoader over the records of bench_loader (bench/loader.cpp), from the page
cache, with num_workers 0, 1 and 2.

  loader_samples_per_s_2k   32768 records of 2 KiB (1024 uint16 tokens), batches of 64
  loader_samples_per_s_64k  1024 records of 64 KiB (32768 uint16 tokens), batches of 64

The records are the .bin of the Megatron corpus bench_loader writes under
build/bench/loader-data/ (HONE_BENCH_LOADER_DIR overrides; token j of record i is
(i * width + j) mod 65536); when it is not there yet this script writes the same bytes itself.
The dataset maps it with numpy.memmap (opened lazily in each worker) and returns
torch.from_numpy(np.array(mm[i])), a copy of record i, as a map-style dataset usually does; the
DataLoader shuffles (a new permutation per epoch), collates with its default collate (torch.stack
into a batch of 64) and, with workers, keeps them across epochs (persistent_workers=True) and
prefetches 2 batches per worker (its default). One call is one epoch; the consumer touches each
batch. Records GB/s of record bytes and samples_per_s.
"""
from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (ROOT, Bench, Workload, parser, repeat, run,  # noqa: E402
                     select, throughput, unavailable)

WORKLOADS = {"loader_samples_per_s_2k": (32768, 1024), "loader_samples_per_s_64k": (1024, 32768)}
WORKERS = (0, 1, 2)
BATCH = 64


def data_dir() -> Path:
    return Path(os.environ.get("HONE_BENCH_LOADER_DIR", ROOT / "build" / "bench" / "loader-data"))


def corpus_bin(np, records: int, width: int) -> Path:
    """bench_loader's .bin, written here with the same bytes when it does not exist yet."""
    path = data_dir() / f"records_{records}x{width}.bin"
    if path.exists() and path.stat().st_size == records * width * 2:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens = (np.arange(records * width, dtype=np.uint64) & 0xFFFF).astype("<u2")
    tmp = path.with_name(f"{path.name}.peer.{os.getpid()}")
    tokens.tofile(tmp)
    os.replace(tmp, path)
    return path


class MemmapRecords:
    """A map-style dataset over fixed-size uint16 records of a .bin (numpy.memmap)."""

    def __init__(self, path: Path, records: int, width: int):
        self.path, self.records, self.width = path, records, width
        self.mm = None

    def __len__(self) -> int:
        return self.records

    def __getitem__(self, i):
        import numpy as np  # noqa: PLC0415
        import torch  # noqa: PLC0415
        if self.mm is None:  # opened in the process that reads (each worker maps it itself)
            self.mm = np.memmap(self.path, dtype="<u2", mode="r",
                                shape=(self.records, self.width))
        return torch.from_numpy(np.array(self.mm[i]))


def make_loader(torch, np, records: int, width: int, workers: int, **options):
    """The DataLoader of the loader peers over bench_loader's corpus: shuffled (seed 1), default
    collate, persistent workers; `options` add to it (pin_memory for the staging peer)."""
    ds = MemmapRecords(corpus_bin(np, records, width), records, width)
    g = torch.Generator()
    g.manual_seed(1)
    return torch.utils.data.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=workers, generator=g,
        persistent_workers=workers > 0, drop_last=False, **options)


def epoch_record(w: str, impl: str, seconds: list[float], records: int, width: int, workers: int,
                 peer: str, what: str = "") -> dict:
    """The throughput record of one epoch's samples (GB/s of record bytes, samples_per_s)."""
    return throughput(
        w, impl, seconds, records * width * 2, workers,
        samples_per_s=records / statistics.median(seconds), peer=peer,
        what=f"one shuffled epoch of {records} records of {width * 2} bytes, batches of "
             f"{BATCH}{what}")


def main(argv: list[str]) -> int:
    args = parser(__doc__).parse_args(argv)
    impls = {f"torch_w{w}": w for w in WORKERS}
    chosen = [(w, impl) for impl in impls for w in select(WORKLOADS, impl, args.filter)]
    if not chosen:
        return run(args, [], [], "torch_loader")
    try:
        import numpy as np  # noqa: PLC0415
        import torch  # noqa: PLC0415  (optional dependency)
    except Exception as e:  # ImportError, or a broken install
        missing = [r for impl in impls for r in unavailable(
            [w for w, i in chosen if i == impl], impl, f"could not be imported: {e}")]
        return run(args, [], missing, "torch_loader")
    torch.set_num_threads(1)

    def setup(w: str, impl: str) -> Bench:
        records, width = WORKLOADS[w]
        workers = impls[impl]
        loader = make_loader(torch, np, records, width, workers)

        def epoch():
            total = 0
            for b in loader:
                total += int(b[0, 0])
            return total

        def close():
            nonlocal loader
            loader = None  # a persistent loader's workers end with it

        return Bench(repeat(epoch, args.min_time), close=close, record=lambda seconds: epoch_record(
            w, impl, seconds, records, width, workers,
            peer=f"torch {torch.__version__} DataLoader(num_workers={workers}, "
                 f"persistent_workers={workers > 0}), numpy {np.__version__} memmap dataset"))

    return run(args, [Workload(w, impl, lambda w=w, impl=impl: setup(w, impl))
                      for w, impl in chosen], [], "torch_loader")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
