#!/usr/bin/env python3
"""Interop test (CTest label interop): hone's activation fake quantization against torch.

    qat_activations_interop.py <qat_activations_interop_helper> <work dir>

The helper runs hone's activation_fake_quant (hone/compress/qat_activations.hpp) over sequences of
batches (training-like sequences of 1 to 4096 values with the observer frozen late and fake
quantization switched off and on; hand-made ties on .5 boundaries) and writes, per step, the
batch, hone's forward values, its gradient mask, the gradient fed to backward and backward's
result, the scale and zero point, and the observer's min and max.

With torch, each scenario runs through torch.ao.quantization.FakeQuantize with the same observer
(MovingAverageMinMaxObserver with the same averaging constant, or MinMaxObserver), quant_min,
quant_max, dtype (quint8 for an unsigned range, qint8 for a signed one) and qscheme
(per_tensor_affine / per_tensor_symmetric), the same enable_observer / enable_fake_quant switches
per step, and autograd's backward of the same gradient. Everything must be equal BIT FOR BIT: the
observer's min and max, the scale and zero point of every step, every forward value, the gradient
(hence the mask: the gradients fed are nonzero). Exact, not within a quantum: hone performs torch's
float operations in torch's order (x * (1 / scale), round half to even, the zero point added in
float, the clamp, (q - zero_point) * scale rounded once; the observer update lo + c * (min - lo)
in float, c = float(0.01)); min and max do not depend on the summation order.

Without torch, the same files are checked against a numpy float32 twin of torch's formulas
written here from torch's source (observer.py's _calculate_qparams, fake_quantize.py, the CPU
kernel of fake_quantize_per_tensor_affine), and the first line says so. Exits 77 (CTest: skipped)
without numpy.
"""
import os
import struct
import subprocess
import sys

try:
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"HONE_SKIPPED: {e}; install numpy (scripts/deps.sh)")
    sys.exit(77)

try:
    import torch
    from torch.ao.quantization import FakeQuantize, MinMaxObserver, MovingAverageMinMaxObserver
    PEER = f"torch {torch.__version__} (torch.ao.quantization.FakeQuantize)"
except Exception as e:  # ImportError, or torch failing to load
    PEER = None
    WHY = str(e)


def read_scenario(path):
    data = open(path, "rb").read()
    assert data[:8] == b"HQATACT1", f"{path}: bad magic"
    observer, c, scheme, qmin, qmax, steps = struct.unpack_from("<ifiiiI", data, 8)
    off = 8 + 24
    cfg = dict(observer=observer, c=c, scheme=scheme, qmin=qmin, qmax=qmax)
    out = []
    for _ in range(steps):
        obs_on, fq_on, _pad, n = struct.unpack_from("<BBHI", data, off)
        off += 8

        def take(dtype, count):
            nonlocal off
            a = np.frombuffer(data, dtype, count, off).copy()
            off += a.nbytes
            return a

        x = take(np.float32, n)
        y = take(np.float32, n)
        mask = take(np.uint8, n).astype(bool)
        gy = take(np.float32, n)
        gx = take(np.float32, n)
        scale, zp, lo, hi = struct.unpack_from("<fiff", data, off)
        off += 16
        out.append(dict(obs_on=bool(obs_on), fq_on=bool(fq_on), x=x, y=y, mask=mask, gy=gy, gx=gx,
                        scale=np.float32(scale), zp=zp, lo=np.float32(lo), hi=np.float32(hi)))
    assert off == len(data), f"{path}: {len(data) - off} trailing bytes"
    return cfg, out


def same_bits(a, b):
    a = np.asarray(a, np.float32).reshape(-1)
    b = np.asarray(b, np.float32).reshape(-1)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def first_diff(a, b, x):
    a = np.asarray(a, np.float32).reshape(-1)
    b = np.asarray(b, np.float32).reshape(-1)
    i = int(np.nonzero(a.view(np.uint32) != b.view(np.uint32))[0][0])
    return f"first at {i}: x = {x[i]!r}, hone {a[i]!r}, peer {b[i]!r}"


class TorchPeer:
    def __init__(self, cfg):
        kw = dict(quant_min=cfg["qmin"], quant_max=cfg["qmax"],
                  dtype=torch.qint8 if cfg["qmin"] < 0 else torch.quint8,
                  qscheme=torch.per_tensor_symmetric if cfg["scheme"] == 1
                  else torch.per_tensor_affine)
        if cfg["observer"] == 0:
            # the constant as hone holds it (a float), so that both sides use the same float
            self.fq = FakeQuantize(observer=MovingAverageMinMaxObserver,
                                   averaging_constant=float(np.float32(cfg["c"])), **kw)
        else:
            self.fq = FakeQuantize(observer=MinMaxObserver, **kw)

    def step(self, s):
        self.fq.enable_observer(s["obs_on"])
        self.fq.enable_fake_quant(s["fq_on"])
        x = torch.from_numpy(s["x"].copy()).requires_grad_(True)
        y = self.fq(x)
        y.backward(torch.from_numpy(s["gy"].copy()))
        obs = self.fq.activation_post_process
        return dict(y=y.detach().numpy(), gx=x.grad.numpy(),
                    scale=np.float32(self.fq.scale.item()), zp=int(self.fq.zero_point.item()),
                    lo=np.float32(obs.min_val.item()), hi=np.float32(obs.max_val.item()))


class NumpyPeer:
    """torch's formulas in float32, written from torch's source."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.lo = np.float32(np.inf)
        self.hi = np.float32(-np.inf)
        self.scale = np.float32(1.0)
        self.zp = 0
        self.obs_on = self.fq_on = True

    def qparams(self):
        f32 = np.float32
        qmin, qmax = self.cfg["qmin"], self.cfg["qmax"]
        lo = min(self.lo, f32(0))
        hi = max(self.hi, f32(0))
        eps = np.finfo(np.float32).eps
        if self.cfg["scheme"] == 1:
            scale = max(f32(max(-lo, hi) / f32((qmax - qmin) / 2)), eps)
            zp = 0
        else:
            scale = max(f32((hi - lo) / f32(qmax - qmin)), eps)
            zp = qmin - int(np.round(f32(lo / scale)))  # numpy rounds half to even, as torch
            zp = min(max(zp, qmin), qmax)
        return f32(scale), zp

    def step(self, s):
        f32 = np.float32
        x = s["x"]
        if s["obs_on"]:
            mn, mx = f32(x.min()), f32(x.max())
            if self.lo == np.inf and self.hi == -np.inf:
                self.lo, self.hi = mn, mx
            elif self.cfg["observer"] == 0:
                c = f32(self.cfg["c"])
                self.lo = f32(self.lo + f32(c * f32(mn - self.lo)))
                self.hi = f32(self.hi + f32(c * f32(mx - self.hi)))
            else:
                self.lo, self.hi = min(self.lo, mn), max(self.hi, mx)
            self.scale, self.zp = self.qparams()
        if s["fq_on"]:
            inv = f32(1) / self.scale
            q = f32(self.zp) + np.rint(x * inv).astype(np.float32)
            mask = (q >= self.cfg["qmin"]) & (q <= self.cfg["qmax"])
            y = ((np.clip(q, self.cfg["qmin"], self.cfg["qmax"]) - f32(self.zp)) *
                 self.scale).astype(np.float32)
        else:
            y, mask = x.copy(), np.ones(x.shape, bool)
        gx = np.where(mask, s["gy"], f32(0)).astype(np.float32)
        return dict(y=y, gx=gx, scale=self.scale, zp=self.zp, lo=self.lo, hi=self.hi)


def check(name, cfg, steps, peer_class):
    peer = peer_class(cfg)
    values = clipped = 0
    for k, s in enumerate(steps):
        p = peer.step(s)
        where = f"{name}, step {k}"
        assert same_bits(s["lo"], p["lo"]) and same_bits(s["hi"], p["hi"]), \
            f"{where}: observer range hone [{s['lo']!r}, {s['hi']!r}], " \
            f"peer [{p['lo']!r}, {p['hi']!r}]"
        assert same_bits(s["scale"], p["scale"]) and s["zp"] == p["zp"], \
            f"{where}: qparams hone ({s['scale']!r}, {s['zp']}), peer ({p['scale']!r}, {p['zp']})"
        assert same_bits(s["y"], p["y"]), f"{where}: forward values differ, " + \
            first_diff(s["y"], p["y"], s["x"])
        assert same_bits(s["gx"], p["gx"]), f"{where}: gradients differ, " + \
            first_diff(s["gx"], p["gx"], s["x"])
        peer_mask = p["gx"] != 0  # the gradients fed are in [0.5, 2]
        assert np.array_equal(s["mask"], peer_mask), f"{where}: masks differ"
        values += len(s["x"])
        clipped += int((~s["mask"]).sum())
    print(f"  {name}: {len(steps)} steps, {values} values ({clipped} clipped), final scale "
          f"{steps[-1]['scale']!r}, zero point {steps[-1]['zp']}: equal bit for bit")
    return clipped


def main():
    helper, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    r = subprocess.run([helper, work], capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"qat_activations_interop_helper failed (exit {r.returncode})")
    if PEER:
        print(f"peer: {PEER}")
        torch.set_num_threads(1)
        peer_class = TorchPeer
    else:
        print(f"peer: a numpy float32 twin of torch's formulas (torch unavailable: {WHY})")
        peer_class = NumpyPeer
    names = open(os.path.join(work, "scenarios.txt")).read().split()
    assert len(names) == 8, names
    clipped = 0
    for name in names:
        cfg, steps = read_scenario(os.path.join(work, name + ".bin"))
        clipped += check(name, cfg, steps, peer_class)
    assert clipped > 0, "no value was clipped: the mask was not exercised"
    print("OK")


if __name__ == "__main__":
    main()
