"""The checkpoint peers' shared driver (bench/peers/torch_checkpoint.py,
bench/peers/safetensors_checkpoint.py): hone's ckpt_save_1G_* / ckpt_load_1G_* workloads of
bench_checkpoint (1 GiB of fp32 in the model-like mix `bench_checkpoint
--hone_print_sizes=ckpt_1G`, a state dict {"t<i>": 1-D tensor}) through a peer's save and load.

  ckpt_save_1G_{tmpfs,disk}  save(sd, path), fsync included; the file is removed between calls
                             (untimed).
  ckpt_load_1G_{tmpfs,disk}  load(path, sd): the peer's load; sd is the state dict the file was
                             written from (a peer that copies into existing tensors, as
                             load_state_dict does, copies into it). Cache-warm: the page cache
                             is not dropped.

Destinations: /dev/shm (tmpfs) and build/bench/tmp (disk; HONE_BENCH_DISK_DIR overrides), as
bench_checkpoint.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

from . import (ROOT, Bench, Workload, parser, read_sizes, repeat_each, run, select, throughput,
               unavailable)

WORKLOADS = ("ckpt_save_1G_tmpfs", "ckpt_load_1G_tmpfs", "ckpt_save_1G_disk", "ckpt_load_1G_disk")


def run_peer(impl: str, make_ops: Callable, doc: str | None, argv: list[str]) -> int:
    """Runs the selected workloads with the operations make_ops(torch) returns: (save(sd, path)
    with fsync, load(path, sd), the peer's description, the file extension). When torch or the
    peer's package cannot be imported (make_ops raises), writes unavailable records. With
    --serve, answers bench/driver.py's requests (see bench/peers/_common)."""
    args = parser(doc).parse_args(argv)

    workloads = select(WORKLOADS, impl, args.filter)
    ops = None
    if workloads:
        try:
            import torch  # noqa: PLC0415  (optional dependency)
            ops = make_ops(torch)
        except Exception as e:  # ImportError, or a broken install
            return run(args, [], unavailable(workloads, impl, f"could not be imported: {e}"),
                       impl)
    if ops is None:
        return run(args, [], [], impl)
    save, load, what, ext = ops
    torch.set_num_threads(args.threads)
    sizes = read_sizes(args.sizes_dir, "ckpt_1G", "bench_checkpoint")
    nbytes = sum(sizes) * 4
    state: dict = {}

    def state_dict() -> dict:  # 1 GiB, built once and kept for every workload
        if "sd" not in state:
            gen = torch.Generator().manual_seed(1)
            state["sd"] = {f"t{i}": (torch.rand(n, generator=gen, dtype=torch.float32) - 0.5) * 0.04
                           for i, n in enumerate(sizes)}
        return state["sd"]

    disk_parent = Path(os.environ.get("HONE_BENCH_DISK_DIR", ROOT / "build" / "bench" / "tmp"))
    dirs = {"tmpfs": Path("/dev/shm") / f"hone-bench-ckpt-{impl}-{os.getpid()}",
            "disk": disk_parent / f"ckpt-{impl}-{os.getpid()}"}

    def setup(w: str) -> Bench:
        sd = state_dict()
        where = w.rsplit("_", 1)[1]
        d = dirs[where]
        d.mkdir(parents=True, exist_ok=True)
        if "_save_" in w:
            path = d / ("save" + ext)
            sample = repeat_each(lambda: save(sd, path), lambda: path.unlink(missing_ok=True),
                                 args.min_time)
            kind = "save (fsync included)"
        else:
            path = d / ("load" + ext)
            if not path.exists():
                save(sd, path)
            sample = repeat_each(lambda: load(path, sd), lambda: None, args.min_time)
            kind = "load (page cache warm)"

        def record(times: list[float]) -> dict:
            return throughput(w, impl, times, nbytes, torch.get_num_threads(), tensors=len(sizes),
                              peer=what,
                              what=f"{kind} of 1 GiB fp32 in {len(sizes)} tensors, {where}")

        return Bench(sample, record, lambda: path.unlink(missing_ok=True))

    try:
        return run(args, [Workload(w, impl, lambda w=w: setup(w)) for w in workloads], [], impl)
    finally:
        for d in dirs.values():
            shutil.rmtree(d, ignore_errors=True)
