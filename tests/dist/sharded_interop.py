#!/usr/bin/env python3
"""Interop test (CTest label interop): a sharded checkpoint merged by `hone-ckpt convert --to file`
read by Python's safetensors.

    sharded_interop.py <dir>

<dir> is what test_zero_sharded_checkpoint keeps (HONE_TEST_SHARDED_OUT): merged.safetensors, the
sharded checkpoint of 2 thread ranks merged into one file, and consolidated/, the
consolidated capture of the same state. Python's safetensors loads every file; the merged file must
hold every tensor of consolidated/model.safetensors and consolidated/optimizer.safetensors with the
same dtype, shape and bits, and nothing else, with the model's shapes (exp_avg.layer1.weight is
8 x 6).

Exits 77 (CTest: skipped) when the safetensors or numpy package is missing.
"""
import os
import sys

try:
    import numpy as np
    from safetensors.numpy import load_file
    from safetensors import safe_open
except ImportError as e:  # pragma: no cover
    print(f"HONE_SKIPPED: {e}; install the pip packages of scripts/deps.sh (safetensors, numpy)")
    sys.exit(77)


def main():
    if len(sys.argv) != 2:
        print("usage: sharded_interop.py <dir>")
        return 2
    root = sys.argv[1]
    merged_path = os.path.join(root, "merged.safetensors")
    cdir = os.path.join(root, "consolidated")
    if not os.path.exists(merged_path):
        print(f"HONE_SKIPPED: no {merged_path} (test_zero_sharded_checkpoint writes it when the "
              "tools are built, HONE_BUILD_TOOLS)")
        return 77
    merged = load_file(merged_path)
    want = {}
    for name in ("model.safetensors", "optimizer.safetensors"):
        want.update(load_file(os.path.join(cdir, name)))
    failures = []
    if set(merged) != set(want):
        failures.append(f"tensor names differ: only merged {sorted(set(merged) - set(want))}, "
                        f"only consolidated {sorted(set(want) - set(merged))}")
    for name, w in want.items():
        m = merged.get(name)
        if m is None:
            continue
        if m.dtype != w.dtype or m.shape != w.shape:
            failures.append(f"{name}: {m.dtype}{m.shape} vs {w.dtype}{w.shape}")
        elif m.tobytes() != w.tobytes():
            failures.append(f"{name}: the bits differ")
    if merged.get("exp_avg.layer1.weight", np.zeros(0)).shape != (8, 6):
        failures.append("exp_avg.layer1.weight does not have the model's shape (8, 6)")
    with safe_open(merged_path, framework="numpy") as f:
        if f.metadata().get("format") != "pt":
            failures.append(f"metadata {f.metadata()} lacks format=pt")
    for f in failures:
        print("FAILED:", f)
    if failures:
        return 1
    print(f"ok: {len(merged)} tensors of the merged sharded checkpoint equal the consolidated "
          f"capture's, read by safetensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
