#!/usr/bin/env python3
"""Peer: the safetensors package (safetensors.torch.save_file / load_file) on the tensors of
hone's ckpt_save_1G / ckpt_load_1G workloads (1 GiB of fp32 in bench_checkpoint's model-like mix,
a state dict {"t<i>": 1-D tensor}).

  ckpt_save_1G_{tmpfs,disk}  save_file(sd, path), then open + os.fsync + close (fsync included,
                             as hone's write_tensors and the limit do); the file is removed
                             between repetitions (untimed).
  ckpt_load_1G_{tmpfs,disk}  load_file(path), then each tensor copied into the state dict's own
                             tensor (what model.load_state_dict(load_file(path)) does). Cache-warm,
                             as hone's. load_file alone returns CPU tensors over the mapped file
                             and reads no byte until someone touches them; hone's load copies
                             every byte into the caller's memory, so the copy is what makes the
                             two the same work (and the row comparable with the limit, a read()
                             of the whole file).

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

    def load(path, sd):
        loaded = load_file(str(path))
        with torch.no_grad():
            for name, t in loaded.items():
                sd[name].copy_(t)
        return sd

    what = (f"safetensors {safetensors.__version__}: save_file (+ fsync) / load_file + copy into "
            "the state dict")
    return save, load, what, ".safetensors"


if __name__ == "__main__":
    sys.exit(run_peer("safetensors", make_ops, __doc__, sys.argv[1:]))
