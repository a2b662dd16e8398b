#!/usr/bin/env python3
"""Interop test (CTest label interop): hone's fake quantizer state files against torch.

    qat_checkpoint_interop.py <qat_checkpoint_interop_helper> <work dir>

hone -> torch: the helper trains quantizers (hone/compress/qat_activations.hpp) over batches, saves
each one's state with hone/compress/qat_checkpoint.hpp under a prefix (none for one of them, as a
bare FakeQuantize's state_dict), checks that hone reads the file back to the same state, and
records what the saved quantizer does, uninterrupted, over the next batches. The file must hold exactly torch's FakeQuantize state_dict keys with
torch's dtypes and shapes (plus hone's metadata); with torch, FakeQuantize(...).load_state_dict()
of the file's tensors under the prefix (safetensors.torch.load_file, strict) must take it, hold the
switches hone saved, and continue over the same batches equal BIT FOR BIT to hone: the observer's
min and max, scale and zero point of every step, every forward value, the gradient (hence the mask).

torch -> hone: a torch FakeQuantize trains over batches, its state_dict goes through
safetensors.torch.save_file (under a prefix), the helper restores a hone quantizer from that file
and runs the next batches; torch's quantizer continues over the same batches: again equal bit for
bit, step by step.

Without torch the same files are checked with numpy and plain parsing of the safetensors format:
hone's file layout against torch's names, dtypes and shapes (as listed in
hone/compress/qat_checkpoint.hpp, taken from torch 2.x), the continuation against a numpy float32
twin of torch's formulas (qat_activations_interop.py's) started from the file's values; and for
torch -> hone a file in torch's layout written here from the twin's state; the first line says so.
Exits 77 (CTest: skipped) without numpy.
"""
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qat_activations_interop as base  # noqa: E402  (exits 77 without numpy)

np = base.np
PEER = base.PEER
if PEER:
    import torch
    from torch.ao.quantization import FakeQuantize  # noqa: F401
    try:
        import safetensors.torch as st_torch
        PEER += f", safetensors {__import__('safetensors').__version__}"
    except Exception:  # safetensors missing: the files go through the plain reader / writer here
        st_torch = None

# torch's FakeQuantize state_dict (torch 2.x): key, safetensors dtype, shape
TORCH_LAYOUT = [
    ("fake_quant_enabled", "U8", [1]),
    ("observer_enabled", "U8", [1]),
    ("scale", "F32", [1]),
    ("zero_point", "I32", [1]),
    ("activation_post_process.eps", "F32", [1]),
    ("activation_post_process.min_val", "F32", []),
    ("activation_post_process.max_val", "F32", []),
]
HONE_METADATA = ["observations", "observer", "averaging_constant", "qscheme", "quant_min",
                 "quant_max"]
NP_OF = {"U8": np.uint8, "I8": np.int8, "I32": np.int32, "I64": np.int64, "F32": np.float32,
         "F64": np.float64, "BOOL": np.bool_}
ST_OF = {np.dtype(v).str: k for k, v in NP_OF.items()}


def read_safetensors(path):
    """(tensors {name: (dtype string, shape, numpy array)}, metadata) by plain parsing."""
    data = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        a = np.frombuffer(data[8 + n + b:8 + n + e], NP_OF[t["dtype"]]).reshape(t["shape"])
        out[name] = (t["dtype"], list(t["shape"]), a.copy())
    return out, meta


def write_safetensors(path, tensors):
    """Writes {name: numpy array} as safetensors (what safetensors.torch.save_file writes)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.array(tensors[name], copy=True, order="C")  # keeps 0-d arrays 0-d
        raw = a.tobytes()
        header[name] = {"dtype": ST_OF[a.dtype.str], "shape": list(a.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def key(prefix, k):
    return k if prefix == "" else prefix + "." + k


def check_layout(name, path, prefix, cfg):
    tensors, meta = read_safetensors(path)
    want = {key(prefix, k): (dt, shape) for k, dt, shape in TORCH_LAYOUT}
    assert set(tensors) == set(want), f"{name}: tensors {sorted(tensors)}, torch's {sorted(want)}"
    for k, (dt, shape) in want.items():
        assert tensors[k][:2] == (dt, shape), \
            f"{name}: {k} is {tensors[k][:2]}, torch's {(dt, shape)}"
    assert tensors[key(prefix, "activation_post_process.eps")][2][0] == np.finfo(np.float32).eps
    for m in HONE_METADATA:
        assert key(prefix, "hone." + m) in meta, f"{name}: no metadata {key(prefix, 'hone.' + m)}"
    assert int(meta[key(prefix, "hone.quant_min")]) == cfg["qmin"]
    assert int(meta[key(prefix, "hone.quant_max")]) == cfg["qmax"]
    assert meta[key(prefix, "hone.observer")] == ("minmax" if cfg["observer"] == 1
                                                  else "moving_average_minmax")
    assert meta[key(prefix, "hone.qscheme")] == ("per_tensor_symmetric" if cfg["scheme"] == 1
                                                 else "per_tensor_affine")
    assert np.float32(float(meta[key(prefix, "hone.averaging_constant")])) == np.float32(cfg["c"])
    return {k[len(prefix) + 1 if prefix else 0:]: v[2] for k, v in tensors.items()}


def torch_peer_from_file(cfg, path, prefix):
    peer = base.TorchPeer(cfg)
    # torch's own layout first: a fresh FakeQuantize of the same configuration
    ref = {k: (v.dtype, tuple(v.shape)) for k, v in peer.fq.state_dict().items()}
    if st_torch is not None:
        sd = st_torch.load_file(path)
    else:
        sd = {k: torch.from_numpy(v[2]) for k, v in read_safetensors(path)[0].items()}
    sd = {k[len(prefix) + 1 if prefix else 0:]: v for k, v in sd.items()
          if prefix == "" or k.startswith(prefix + ".")}
    got = {k: (v.dtype, tuple(v.shape)) for k, v in sd.items()}
    assert got == ref, f"{path}: hone's tensors {got}, torch's state_dict {ref}"
    peer.fq.load_state_dict(sd)  # strict: every key, nothing more
    return peer, bool(peer.fq.observer_enabled[0] == 1), bool(peer.fq.fake_quant_enabled[0] == 1)


def numpy_peer_from_file(cfg, t):
    peer = base.NumpyPeer(cfg)
    peer.lo = np.float32(t["activation_post_process.min_val"])
    peer.hi = np.float32(t["activation_post_process.max_val"])
    peer.scale = np.float32(t["scale"][0])
    peer.zp = int(t["zero_point"][0])
    return peer, bool(t["observer_enabled"][0] == 1), bool(t["fake_quant_enabled"][0] == 1)


def hone_to_torch(helper, work):
    print("hone -> torch: hone writes, the peer loads and continues")
    d = os.path.join(work, "hone_to_torch")
    os.makedirs(d, exist_ok=True)
    r = subprocess.run([helper, "save", d], capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"qat_checkpoint_interop_helper save failed (exit {r.returncode})")
    lines = open(os.path.join(d, "scenarios.txt")).read().split("\n")
    scenarios = [ln.split() for ln in lines if ln.strip()]
    assert len(scenarios) == 6, scenarios
    clipped = 0
    for name, prefix in scenarios:
        prefix = "" if prefix == "-" else prefix
        cfg, steps = base.read_scenario(os.path.join(d, name + ".bin"))
        path = os.path.join(d, name + ".safetensors")
        t = check_layout(name, path, prefix, cfg)
        if PEER:
            peer, obs_on, fq_on = torch_peer_from_file(cfg, path, prefix)
        else:
            peer, obs_on, fq_on = numpy_peer_from_file(cfg, t)
        assert (obs_on, fq_on) == (steps[0]["obs_on"], steps[0]["fq_on"]), \
            f"{name}: the loaded switches {(obs_on, fq_on)}, hone's " \
            f"{(steps[0]['obs_on'], steps[0]['fq_on'])}"
        seen = bool(np.isfinite(t["activation_post_process.min_val"]))
        print(f"  {name}: prefix '{prefix}', torch's layout, switches observer {int(obs_on)} "
              f"fake quant {int(fq_on)}, {'a range' if seen else 'fresh (min +inf, max -inf)'}")
        clipped += base.check(name, cfg, steps, lambda _cfg, p=peer: p)
    return clipped


def torch_to_hone(helper, work):
    print("torch -> hone: the peer writes its state_dict, hone loads and continues")
    d = os.path.join(work, "torch_to_hone")
    os.makedirs(d, exist_ok=True)
    quint8 = dict(scheme=0, qmin=0, qmax=255)
    cfgs = [  # name, prefix, configuration, batches before the save, switches at the save
        ("quint8_affine_moving_average", "act", dict(observer=0, c=0.01, **quint8), 14,
         (True, True)),
        ("quint8_affine_minmax_frozen", "", dict(observer=1, c=0.01, **quint8), 9, (False, True)),
        ("qint8_symmetric_moving_average_off", "net.fc2.act",
         dict(observer=0, c=0.01, scheme=1, qmin=-128, qmax=127), 11, (True, False)),
        ("qint8_affine_moving_average_c025", "q",
         dict(observer=0, c=0.25, scheme=0, qmin=-128, qmax=127), 6, (True, True)),
        ("quint8_affine_fresh", "fresh", dict(observer=0, c=0.01, **quint8), 0, (True, True)),
    ]
    rng = np.random.default_rng(1234)

    def batch(b):
        n = 1 if b % 7 == 3 else 1 + (b * 389) % 1500
        x = rng.normal(0.2 * (b % 5) - 0.3, 0.3 + 0.25 * (b % 9), n).astype(np.float32)
        if b % 3 == 1:
            x = np.maximum(x, np.float32(0))
        if b % 11 == 6:
            x[n // 2] = 19.0
        return x

    clipped = 0
    for name, prefix, cfg, before, (obs_on, fq_on) in cfgs:
        cfg = dict(cfg, c=float(np.float32(cfg["c"])))
        peer = (base.TorchPeer if PEER else base.NumpyPeer)(cfg)
        for b in range(before):
            x = batch(b)
            peer.step(dict(obs_on=True, fq_on=True, x=x, gy=np.ones_like(x)))
        path = os.path.join(d, name + ".safetensors")
        if PEER:
            peer.fq.enable_observer(obs_on)
            peer.fq.enable_fake_quant(fq_on)
            sd = {key(prefix, k): v.contiguous() for k, v in peer.fq.state_dict().items()}
            if st_torch is not None:
                st_torch.save_file(sd, path)
            else:
                write_safetensors(path, {k: v.numpy() for k, v in sd.items()})
        else:
            write_safetensors(path, {
                key(prefix, "fake_quant_enabled"): np.array([fq_on], np.uint8),
                key(prefix, "observer_enabled"): np.array([obs_on], np.uint8),
                key(prefix, "scale"): np.array([peer.scale], np.float32),
                key(prefix, "zero_point"): np.array([peer.zp], np.int32),
                key(prefix, "activation_post_process.eps"):
                    np.array([np.finfo(np.float32).eps], np.float32),
                key(prefix, "activation_post_process.min_val"): np.array(peer.lo, np.float32),
                key(prefix, "activation_post_process.max_val"): np.array(peer.hi, np.float32),
            })
        # the next batches: the first with the saved switches, then on, frozen, off
        flags = [(obs_on, fq_on)] + [(b < 7, b != 8) for b in range(1, 10)]
        xs = [batch(100 + b) for b in range(10)]
        inp = os.path.join(d, name + ".in")
        with open(inp, "wb") as f:
            f.write(b"HQATIN01" + struct.pack("<ifiiiI", cfg["observer"], cfg["c"], cfg["scheme"],
                                              cfg["qmin"], cfg["qmax"], len(xs)))
            for (o, q), x in zip(flags, xs):
                f.write(struct.pack("<BBHI", o, q, 0, len(x)) + x.astype("<f4").tobytes())
        out = os.path.join(d, name + ".bin")
        r = subprocess.run([helper, "continue", path, prefix or "-", inp, out],
                           capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            raise SystemExit(f"qat_checkpoint_interop_helper continue failed on {name} "
                             f"(exit {r.returncode})")
        cfg2, steps = base.read_scenario(out)
        assert (cfg2["observer"], cfg2["scheme"], cfg2["qmin"], cfg2["qmax"]) == \
            (cfg["observer"], cfg["scheme"], cfg["qmin"], cfg["qmax"])
        clipped += base.check(name, cfg, steps, lambda _cfg, p=peer: p)
    return clipped


def main():
    helper, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    if PEER:
        print(f"peer: {PEER}")
        torch.set_num_threads(1)
    else:
        print(f"peer: numpy and a plain safetensors parser; the layout is checked against torch's "
              f"as listed here, the values against a numpy float32 twin of torch's formulas "
              f"(torch unavailable: {base.WHY})")
    clipped = hone_to_torch(helper, work) + torch_to_hone(helper, work)
    assert clipped > 0, "no value was clipped: the mask was not exercised"
    print("OK")


if __name__ == "__main__":
    main()
