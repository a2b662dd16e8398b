#!/usr/bin/env python3
"""Peer: the safetensors package (safetensors.torch.save_file / load_file) on the tensors of
hone's ckpt_save_1G / ckpt_load_1G workloads (1 GiB of fp32 in bench_checkpoint's model-like mix,
a state dict {"t<i>": 1-D tensor}).

  ckpt_save_1G_{tmpfs,disk}  save_file(sd, path), then open + os.fsync + close (fsync included,
                             as hone's write_tensors and the limit do); the file is removed
                             between repetitions (untimed).
  ckpt_load_1G_{tmpfs,disk}  load_file(path) (new CPU tensors). Cache-warm, as hone's.

Same destinations, options and result format as bench/peers/torch_checkpoint.py.
The workload loop is bench/peers/_common/checkpoint.py's, shared with the other checkpoint peer.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common.checkpoint import run_peer  # noqa: E402


def make_ops(torch):
    import os  # noqa: PLC0415

    import safetensors  # noqa: PLC0415
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    def save(sd, path):
        save_file(sd, str(path))
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def load(path):
        return load_file(str(path))

    what = f"safetensors {safetensors.__version__}: save_file (+ fsync) / load_file"
    return save, load, what, ".safetensors"


if __name__ == "__main__":
    sys.exit(run_peer("safetensors", make_ops, __doc__, sys.argv[1:]))
