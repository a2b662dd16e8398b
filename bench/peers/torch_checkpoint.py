#!/usr/bin/env python3
"""Peer: torch.save / torch.load of the tensors of hone's ckpt_save_1G / ckpt_load_1G workloads
(1 GiB of fp32 in the model-like mix of bench_checkpoint, sizes from `bench_checkpoint
--hone_print_sizes=ckpt_1G`), a state dict {"t<i>": 1-D tensor}.

  ckpt_save_1G_{tmpfs,disk}  torch.save(sd, f) on an open file, f.flush(), os.fsync (fsync
                             included, as hone's write_tensors and the limit do); the file is
                             removed between repetitions (untimed).
  ckpt_load_1G_{tmpfs,disk}  torch.load(path, weights_only=True) (new tensors: torch allocates).
                             The page cache is not dropped: loads are cache-warm.

Destinations: /dev/shm (tmpfs) and build/bench/tmp (disk; HONE_BENCH_DISK_DIR overrides), as
bench_checkpoint. Same options and result format as bench/peers/torch_multi_tensor.py.
The workload loop is bench/peers/_common/checkpoint.py's, shared with the other checkpoint peer.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common.checkpoint import run_peer  # noqa: E402


def make_ops(torch):
    import os  # noqa: PLC0415

    def save(sd, path):
        with open(path, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())

    def load(path, _sd):  # new tensors: torch.load reads every byte into them
        return torch.load(path, weights_only=True)

    return save, load, f"torch {torch.__version__}: torch.save (+ fsync) / torch.load", ".pt"


if __name__ == "__main__":
    sys.exit(run_peer("torch", make_ops, __doc__, sys.argv[1:]))
