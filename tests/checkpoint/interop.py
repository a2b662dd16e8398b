#!/usr/bin/env python3
"""Interop test (CTest label interop): hone's checkpoint files against Python's safetensors.

    interop.py <interop_helper> <work dir>

1. hone writes files; Python's safetensors loads them and finds the same values, dtypes, shapes
   and metadata (every numpy dtype, a scalar, an empty tensor; F32 weights exported as BF16,
   compared with an independent round-to-nearest-even in numpy; a compressed file converted back
   to plain safetensors, byte-identical to the plain one).
2. Python's safetensors writes files; hone reads them (interop_helper check) and finds the same.
3. hone compresses a Python file and converts it back; Python loads the result.

Exits 77 (CTest: skipped) when the safetensors or numpy package is missing.
"""
import os
import subprocess
import sys

try:
    import numpy as np
    import safetensors
    from safetensors.numpy import load_file, save_file
except ImportError as e:  # pragma: no cover
    print(f"HONE_SKIPPED: {e}; install the pip packages of scripts/deps.sh (safetensors, numpy)")
    sys.exit(77)

SHAPES = {
    "f64": (np.float64, (3, 4)), "f32": (np.float32, (3, 4)), "f16": (np.float16, (2, 6)),
    "i64": (np.int64, (6,)), "i32": (np.int32, (2, 3)), "i16": (np.int16, (6,)),
    "i8": (np.int8, (6,)), "u64": (np.uint64, (6,)), "u32": (np.uint32, (6,)),
    "u16": (np.uint16, (6,)), "u8": (np.uint8, (6,)), "bool": (np.bool_, (7,)),
    "scalar": (np.float32, ()), "empty": (np.float32, (0, 4)),
}


def expected(name):
    """The Python twin of interop_helper.cpp's expected<T>()."""
    dt, shape = SHAPES[name]
    if name == "scalar":
        return np.array(42.5, dtype=np.float32)
    n = int(np.prod(shape)) if shape else 1
    k = np.arange(n, dtype=np.int64)
    if name == "bool":
        v = (k % 3) == 0
    elif name in ("f64", "f32"):
        v = k.astype(np.float64) * 0.25 - 3.0
    elif name == "f16":
        v = k.astype(np.float32) * 0.5 - 2.0
    elif np.issubdtype(dt, np.signedinteger):
        v = k * 37 - 100
    else:
        v = k * 37 + 5
    return v.astype(dt).reshape(shape)


def bf16_bits(f32):
    """Round-to-nearest-even float32 -> bfloat16 bits (finite inputs), independent of hone."""
    bits = np.ascontiguousarray(f32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def serialize_bf16(name, bits, shape):
    """A safetensors file with one BF16 tensor, written by the safetensors package itself."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    try:
        from safetensors import TensorSpec  # safetensors >= 0.8
        spec = TensorSpec(dtype="bfloat16", shape=list(shape), data_ptr=bits.ctypes.data,
                          data_len=bits.nbytes)
        return bytes(safetensors.serialize({name: spec}))
    except ImportError:  # older releases take plain dicts
        return bytes(safetensors.serialize(
            {name: {"dtype": "bfloat16", "shape": list(shape), "data": bits.tobytes()}}))


failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("MISMATCH:", what)


def check_numpy_dict(got, where):
    check(set(got) == set(SHAPES), f"{where}: tensors {sorted(got)}")
    for name in SHAPES:
        if name not in got:
            continue
        want = expected(name)
        a = got[name]
        check(a.dtype == want.dtype, f"{where}/{name}: dtype {a.dtype} != {want.dtype}")
        check(a.shape == want.shape, f"{where}/{name}: shape {a.shape} != {want.shape}")
        check(np.array_equal(a, want), f"{where}/{name}: values differ")


def main():
    helper, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    for f in os.listdir(work):
        os.remove(os.path.join(work, f))
    p = lambda name: os.path.join(work, name)  # noqa: E731

    # 1. hone writes, Python reads.
    subprocess.run([helper, "write", work], check=True)
    check_numpy_dict(load_file(p("hone_numpy.safetensors")), "hone_numpy")
    with safetensors.safe_open(p("hone_numpy.safetensors"), framework="np") as f:
        check(f.metadata() == {"framework": "hone", "step": "1200"}, f"metadata {f.metadata()}")
    raw = dict(safetensors.deserialize(open(p("hone_bf16.safetensors"), "rb").read()))
    check(raw["w"]["dtype"] == "BF16" and list(raw["w"]["shape"]) == [10, 100], "bf16 dtype/shape")
    check(raw["w_f32"]["dtype"] == "F32", "w_f32 dtype")
    w_f32 = np.frombuffer(bytes(raw["w_f32"]["data"]), dtype=np.float32)
    w_bf16 = np.frombuffer(bytes(raw["w"]["data"]), dtype=np.uint16)
    check(np.array_equal(w_bf16, bf16_bits(w_f32)), "hone's F32 -> BF16 export differs from RNE")
    check_numpy_dict(load_file(p("hone_roundtrip.safetensors")), "hone_roundtrip")
    check(open(p("hone_roundtrip.safetensors"), "rb").read()
          == open(p("hone_numpy.safetensors"), "rb").read(),
          "compressed -> plain conversion is not byte-identical to the plain file")

    # 2. Python writes, hone reads.
    save_file({name: expected(name) for name in SHAPES}, p("py_numpy.safetensors"),
              metadata={"framework": "python"})
    with open(p("py_bf16.safetensors"), "wb") as out:
        out.write(serialize_bf16("w", bf16_bits(w_f32), (10, 100)))
    r = subprocess.run([helper, "check", work])
    check(r.returncode == 0, "hone could not read Python's files (see above)")

    # 3. hone compresses Python's file and converts it back; Python reads the result.
    subprocess.run([helper, "recompress", p("py_numpy.safetensors"), p("py_recompressed.safetensors")],
                   check=True)
    check_numpy_dict(load_file(p("py_recompressed.safetensors")), "py_recompressed")
    with safetensors.safe_open(p("py_recompressed.safetensors"), framework="np") as f:
        check(f.metadata() == {"framework": "python"}, f"recompressed metadata {f.metadata()}")

    print(f"interop with safetensors {safetensors.__version__}, numpy {np.__version__}: "
          f"{'OK' if not failures else str(len(failures)) + ' failures'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
