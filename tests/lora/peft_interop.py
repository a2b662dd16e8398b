#!/usr/bin/env python3
"""Interop test (CTest label interop): hone's LoRA adapters against the `peft` package.

    peft_interop.py <lora_interop_helper> <work dir>

The model (both sides): x [5, 12] -> fc1 (nn.Linear 12 -> 10) -> ReLU -> block.proj (nn.Linear
10 -> 6, no bias).

With torch and peft:
1. hone writes the base weights, x, its adapters (adapter_model.safetensors + adapter_config.json)
   and its outputs. PeftModel.from_pretrained loads hone's adapters onto the torch module; its eval
   outputs must match hone's within max |peft - hone| <= 1e-5 * max |hone| (float32 sums in another
   order). merge_and_unload()'s weights and outputs must match hone's merge() the same way.
2. peft writes adapters of its own (r 3, lora_alpha 7, use_rslora, B nonzero) with
   save_pretrained; hone loads them (lora_model_from_pretrained) and its outputs must match peft's
   within the same tolerance (the helper's `check`).
Without torch or peft, the same files are checked at the format level with safetensors + numpy:
hone's files have PEFT's tensor names, shapes, dtype and config fields, a float64 numpy forward of
base + hone's adapters matches hone's outputs, and hone loads a PEFT-format directory written here
with safetensors.numpy (its config has the fields peft 0.21.2 writes). The first line printed says
which check ran. Exits 77 (CTest: skipped) without numpy or safetensors.
"""
import json
import os
import subprocess
import sys

try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
except ImportError as e:  # pragma: no cover
    print(f"HONE_SKIPPED: {e}; install numpy and safetensors (scripts/deps.sh)")
    sys.exit(77)

try:
    import torch
    from torch import nn
    import peft
    from peft import LoraConfig, PeftModel, get_peft_model
    PEER = f"peft {peft.__version__} with torch {torch.__version__}"
except Exception as e:  # ImportError, or torch failing to load
    PEER = None
    WHY = str(e)

TOL = 1e-5
TARGETS = ["fc1", "block.proj"]


def close(got, want, what):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    err = float(np.max(np.abs(got - want)))
    scale = float(np.max(np.abs(want)))
    print(f"  {what}: max |diff| = {err:.3g} (max |ref| {scale:.3g})")
    assert err <= TOL * scale, f"{what}: differs by {err} > {TOL} * {scale}"


def run_helper(helper, *args):
    r = subprocess.run([helper, *map(str, args)], capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"lora_interop_helper {args[0]} failed (exit {r.returncode})")


def check_hone_format(d):
    """hone's adapter directory has PEFT's names, shapes, dtype, metadata and config fields."""
    path = os.path.join(d, "adapter_model.safetensors")
    with safe_open(path, framework="np") as f:
        assert f.metadata() == {"format": "pt"}, f.metadata()
        keys = sorted(f.keys())
    want = {
        "base_model.model.fc1.lora_A.weight": (4, 12),
        "base_model.model.fc1.lora_B.weight": (10, 4),
        "base_model.model.block.proj.lora_A.weight": (4, 10),
        "base_model.model.block.proj.lora_B.weight": (6, 4),
    }
    assert keys == sorted(want), keys
    t = load_file(path)
    for k, shape in want.items():
        assert t[k].shape == shape and t[k].dtype == np.float32, (k, t[k].shape, t[k].dtype)
    c = json.load(open(os.path.join(d, "adapter_config.json")))
    expect = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "bias": "none",
              "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
              "task_type": None, "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}}
    for k, v in expect.items():
        assert c.get(k) == v, f"adapter_config.json: {k} = {c.get(k)!r}, expected {v!r}"
    assert abs(c["lora_dropout"] - 0.05) < 1e-7, c["lora_dropout"]
    assert sorted(c["target_modules"]) == sorted(TARGETS), c["target_modules"]
    print("  hone's adapter files: PEFT's names, shapes, F32, metadata and config fields")
    return t, c


def numpy_forward(base, adapters, x, scaling):
    """float64 reference of the adapted model (eval: no dropout)."""
    def lin(name, h, bias):
        w = base[f"{name}.weight"].astype(np.float64)
        a = adapters[f"base_model.model.{name}.lora_A.weight"].astype(np.float64)
        b = adapters[f"base_model.model.{name}.lora_B.weight"].astype(np.float64)
        y = h @ w.T + scaling * (h @ a.T) @ b.T
        return y + base[f"{name}.bias"].astype(np.float64) if bias else y
    h = np.maximum(lin("fc1", x.astype(np.float64), True), 0.0)
    return lin("block.proj", h, False)


def with_peft(helper, work):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(12, 10)
            self.block = nn.Module()
            self.block.proj = nn.Linear(10, 6, bias=False)

        def forward(self, x):
            return self.block.proj(torch.relu(self.fc1(x)))

    def base_net():
        net = Net()
        sd = {k: torch.from_numpy(v) for k, v in load_file(os.path.join(work, "base.safetensors")).items()}
        net.load_state_dict(sd)
        return net.eval()

    x = torch.from_numpy(load_file(os.path.join(work, "x.safetensors"))["x"])
    hone_out = load_file(os.path.join(work, "hone_out.safetensors"))
    check_hone_format(os.path.join(work, "hone_adapter"))

    # 1. peft loads hone's adapters.
    model = PeftModel.from_pretrained(base_net(), os.path.join(work, "hone_adapter")).eval()
    cfg = model.peft_config["default"]
    assert cfg.r == 4 and cfg.lora_alpha == 8 and abs(cfg.lora_dropout - 0.05) < 1e-7, cfg
    hone_ad = load_file(os.path.join(work, "hone_adapter", "adapter_model.safetensors"))
    for name in TARGETS:
        layer = model.base_model.model.get_submodule(name)
        for which in ("lora_A", "lora_B"):
            got = getattr(layer, which)["default"].weight.detach().numpy()
            assert np.array_equal(got, hone_ad[f"base_model.model.{name}.{which}.weight"]), (name, which)
    with torch.no_grad():
        y = model(x).numpy()
    close(y, hone_out["y"], "peft(hone's adapters) vs hone")
    merged = model.merge_and_unload()
    with torch.no_grad():
        y_merged = merged(x).numpy()
    close(merged.fc1.weight.detach().numpy(), hone_out["fc1.weight"], "fc1.weight merged: peft vs hone")
    close(merged.block.proj.weight.detach().numpy(), hone_out["block.proj.weight"],
          "block.proj.weight merged: peft vs hone")
    close(y_merged, hone_out["y_merged"], "merged outputs: peft vs hone")

    # 2. hone loads peft's adapters.
    torch.manual_seed(5)
    cfg2 = LoraConfig(r=3, lora_alpha=7, use_rslora=True, target_modules=TARGETS, lora_dropout=0.0)
    pm = get_peft_model(base_net(), cfg2)
    with torch.no_grad():
        for name in TARGETS:  # as if trained: B = 0 would hide a wrong B or scaling
            nn.init.normal_(pm.base_model.model.get_submodule(name).lora_B["default"].weight, std=0.4)
    pm.eval()
    with torch.no_grad():
        y_peft = pm(x).numpy()
    pm.save_pretrained(os.path.join(work, "peft_adapter"))
    save_file({"y": np.ascontiguousarray(y_peft)}, os.path.join(work, "peft_expected.safetensors"))
    run_helper(helper, "check", work, os.path.join(work, "peft_adapter"),
               os.path.join(work, "peft_expected.safetensors"))


def format_level(helper, work):
    base = load_file(os.path.join(work, "base.safetensors"))
    x = load_file(os.path.join(work, "x.safetensors"))["x"]
    hone_out = load_file(os.path.join(work, "hone_out.safetensors"))
    adapters, c = check_hone_format(os.path.join(work, "hone_adapter"))
    close(hone_out["y"], numpy_forward(base, adapters, x, c["lora_alpha"] / c["r"]),
          "hone vs numpy float64 reference")
    for name in TARGETS:
        a = adapters[f"base_model.model.{name}.lora_A.weight"].astype(np.float64)
        b = adapters[f"base_model.model.{name}.lora_B.weight"].astype(np.float64)
        close(hone_out[f"{name}.weight"], base[f"{name}.weight"] + 2.0 * b @ a,
              f"{name}.weight merged: hone vs numpy")

    # A PEFT-format directory written here: the key names and config of peft 0.21.2.
    rng = np.random.default_rng(7)
    d = os.path.join(work, "peft_adapter")
    os.makedirs(d, exist_ok=True)
    r, alpha = 3, 7
    ad = {}
    for name, (o, i) in {"fc1": (10, 12), "block.proj": (6, 10)}.items():
        ad[f"base_model.model.{name}.lora_A.weight"] = rng.uniform(-0.3, 0.3, (r, i)).astype(np.float32)
        ad[f"base_model.model.{name}.lora_B.weight"] = rng.normal(0, 0.4, (o, r)).astype(np.float32)
    save_file(ad, os.path.join(d, "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "alora_invocation_tokens": None, "alpha_pattern": {}, "arrow_config": None,
        "auto_mapping": {"base_model_class": "Net", "parent_library": "__main__"},
        "base_model_name_or_path": None, "bias": "none", "corda_config": None,
        "ensure_weight_tying": False, "eva_config": None, "exclude_modules": None,
        "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
        "kasa_config": None, "layer_replication": None, "layers_pattern": None,
        "layers_to_transform": None, "loftq_config": {}, "lora_alpha": alpha, "lora_bias": False,
        "lora_dropout": 0.0, "lora_ga_config": None, "megatron_config": None,
        "megatron_core": "megatron.core", "modules_to_save": None, "monteclora_config": None,
        "peft_type": "LORA", "peft_version": "0.21.2", "qalora_group_size": 16, "r": r,
        "rank_pattern": {}, "revision": None, "target_modules": sorted(TARGETS),
        "target_parameters": None, "task_type": None, "trainable_token_indices": None,
        "use_bdlora": None, "use_dora": False, "use_qalora": False, "use_rslora": True,
        "velora_config": None,
    }
    json.dump(config, open(os.path.join(d, "adapter_config.json"), "w"), indent=2)
    y = numpy_forward(base, ad, x, alpha / np.sqrt(r))
    save_file({"y": y.astype(np.float32)}, os.path.join(work, "peft_expected.safetensors"))
    run_helper(helper, "check", work, d, os.path.join(work, "peft_expected.safetensors"))


def main():
    helper, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    if PEER:
        print(f"LoRA interop with {PEER}")
    else:
        print(f"LoRA interop: FORMAT-LEVEL CHECK ONLY (safetensors + numpy); peft/torch unavailable: {WHY}")
    run_helper(helper, "write", work)
    if PEER:
        with_peft(helper, work)
    else:
        format_level(helper, work)
    print("ok")


if __name__ == "__main__":
    main()
