#!/usr/bin/env python3
"""Peer: PyTorch's optimizer steps on the tensors of hone's bench_optim workloads (the same sizes,
read from the hone benchmark program), in PyTorch's own fused implementations:

  adamw_fp32_{1M,16M,64M}  torch.optim.AdamW(fused=True).step()
  adamw_bf16grad_64M       fp32 parameters whose gradients arrive in bf16: torch's fused AdamW
                           takes one dtype, so the bf16 gradients are copied into the fp32 .grad
                           (torch._foreach_copy_), then the fused step
  unscale_check_64M        torch._amp_foreach_non_finite_check_and_unscale_ on fp32 gradients
                           (what GradScaler.unscale_ runs), in place
  sgd_momentum_64M         torch.optim.SGD(momentum=0.9, fused=True).step()
  full_step_64M            the sequence PyTorch users run for an fp16 step: scaler.unscale_(opt),
                           clip_grad_norm_(params, max_norm), scaler.step(opt) (fused AdamW),
                           scaler.update()
  trainer_fp16_64M         against hone::trainer's whole fp16 step: full_step_64M's sequence (AMP
                           keeps fp32 weights and gradients; its casts to fp16 happen in autocast's
                           forward, outside the step)
  trainer_bf16_64M         against hone::trainer's whole bf16 step: clip_grad_norm_ and the fused
                           AdamW step (bf16 autocast needs no loss scaler)

Every row reports the bytes hone's row of the same workload reports (bytes_per_iter), so its GB/s
compare as times do: "vs hone" is hone's time / torch's time. The in-place passes keep their data
in range from one iteration to the next: the loss scale alternates between 2 and 1/2 (GradScaler's
update(new_scale=...)), and full_step's max_norm (1e6) lies above the norm, so clip_grad_norm_
multiplies by the clamped coefficient 1 (it multiplies whatever the coefficient), as in hone.

Writes results in the results.json format (see bench/report.py); when torch cannot be imported it
writes {"impl": "torch", "available": false, "note": ...} per workload and exits 0.

Options: --sizes-dir DIR (files <workload>.txt, one size per line, as scripts/bench writes them
with `bench_optim --hone_print_sizes=<workload>`), --threads (default: all CPUs, like oneTBB),
--repetitions, --min-time (seconds per repetition), --device cpu|cuda (cuda names the workloads
<workload>_cuda, as bench_optim_gpu does), --filter REGEX (on "<workload>/torch"), --out FILE.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

LR = 1e-3
WEIGHT_DECAY = 1e-2  # hone::adamw's default, as torch.optim.AdamW's
MAX_NORM = 1e6       # bench/optim.cpp full_step_max_norm

# workload: (bytes per element hone counts, description)
WORKLOADS = {
    "adamw_fp32_1M": (28, "AdamW step, fp32 params and grads: AdamW(fused=True).step()"),
    "adamw_fp32_16M": (28, "AdamW step, fp32 params and grads: AdamW(fused=True).step()"),
    "adamw_fp32_64M": (28, "AdamW step, fp32 params and grads: AdamW(fused=True).step()"),
    "adamw_bf16grad_64M": (26, "bf16 grads copied into the fp32 .grad (_foreach_copy_), then "
                               "AdamW(fused=True).step()"),
    "unscale_check_64M": (8, "torch._amp_foreach_non_finite_check_and_unscale_ on fp32 grads, "
                             "in place"),
    "sgd_momentum_64M": (20, "SGD(momentum=0.9, fused=True).step()"),
    "full_step_64M": (32, "scaler.unscale_(opt); clip_grad_norm_(params, max_norm); "
                          "scaler.step(opt) (AdamW fused=True); scaler.update()"),
    # hone's row reads fp16 gradients; torch's AMP keeps fp32 .grad, so its sequence is
    # full_step_64M's (the bytes are hone's count, so the GB/s ratio is the time ratio).
    "full_step_fp16grad_64M": (28, "the full_step_64M sequence (AMP keeps fp32 gradients)"),
    # hone's rows are the whole trainer step in fp16/bf16 (30 bytes per parameter); torch's AMP
    # step on fp32 weights and gradients.
    "trainer_fp16_64M": (30, "AMP fp16 step: scaler.unscale_(opt); clip_grad_norm_; "
                             "scaler.step(opt) (AdamW fused=True); scaler.update()"),
    "trainer_bf16_64M": (30, "AMP bf16 step: clip_grad_norm_; AdamW(fused=True).step()"),
}
# The workloads bench_optim_gpu (bench/optim_gpu.cu) also runs, as <workload>_cuda.
CUDA_WORKLOADS = ("adamw_fp32_1M", "adamw_fp32_16M", "adamw_fp32_64M", "sgd_momentum_64M",
                  "full_step_64M")


def filled(torch, n: int, base: float, dtype, dev):
    """A tensor of n elements holding base + (i % 1024) / 1024, as hone's tensors."""
    return (torch.arange(n, device=dev).remainder_(1024).to(torch.float32).mul_(1.0 / 1024)
            .add_(base).to(dtype))


def make_params(torch, sizes: list[int], dev):
    params = []
    for n in sizes:
        p = torch.nn.Parameter(filled(torch, n, 0.5, torch.float32, dev))
        p.grad = filled(torch, n, 0.25, torch.float32, dev)
        params.append(p)
    return params


def workload_fn(torch, w: str, sizes: list[int], dev):
    """The function one iteration calls, and the objects it keeps alive."""
    params = make_params(torch, sizes, dev)
    flip = [0]

    def next_scale() -> float:
        flip[0] ^= 1
        return 2.0 if flip[0] else 0.5

    if w.startswith("adamw_fp32_"):
        opt = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, fused=True)
        return opt.step, (params, opt)
    if w == "adamw_bf16grad_64M":
        opt = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, fused=True)
        bf16 = [filled(torch, n, 0.25, torch.bfloat16, dev) for n in sizes]
        grads = [p.grad for p in params]

        def step():
            torch._foreach_copy_(grads, bf16)
            opt.step()
        return step, (params, opt, bf16)
    if w == "unscale_check_64M":
        grads = [p.grad for p in params]
        found_inf = torch.zeros(1, device=dev)
        inv = {s: torch.full((1,), 1.0 / s, device=dev) for s in (2.0, 0.5)}

        def step():
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv[next_scale()])
        return step, (params, found_inf, inv)
    if w == "sgd_momentum_64M":
        opt = torch.optim.SGD(params, lr=LR, momentum=0.9, fused=True)
        return opt.step, (params, opt)
    if w == "trainer_bf16_64M":
        opt = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, fused=True)

        def step():
            torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
            opt.step()
        return step, (params, opt)
    if w in ("full_step_64M", "full_step_fp16grad_64M", "trainer_fp16_64M"):
        opt = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, fused=True)
        scaler = torch.amp.GradScaler(dev.type, init_scale=2.0)
        scaler.scale(torch.ones((), device=dev))  # creates the scale (the loss's .backward() would)

        def step():
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
            scaler.step(opt)
            scaler.update(new_scale=next_scale())
        return step, (params, opt, scaler)
    raise ValueError(w)


def main(argv: list[str]) -> int:
    args = _common.parser(__doc__, device=True).parse_args(argv)

    suffix = "_cuda" if args.device == "cuda" else ""
    workloads = [w for w in _common.select(WORKLOADS, "torch", args.filter, suffix)
                 if args.device == "cpu" or w in CUDA_WORKLOADS]
    names = [w + suffix for w in workloads]
    torch, unavailable = _common.import_torch(names, "torch", args.device)
    if torch is None:
        return _common.run(args, [], unavailable, "torch_optim")
    dev, sync = _common.torch_device(torch, args.threads, args.device)

    def setup(w: str) -> _common.Bench:
        # An op this torch build lacks (fused=True on CPU: >= 2.4) raises here or at the first
        # sample: the workload is reported unavailable.
        bytes_per_elem, what = WORKLOADS[w]
        sizes = _common.read_sizes(args.sizes_dir, w, "bench_optim", suffix)
        total = sum(sizes)
        fn, keep = workload_fn(torch, w, sizes, dev)
        fn()  # fails here rather than in the timing loop
        sync()

        def record(times: list[float]) -> dict:
            keep  # noqa: B018  (the data live as long as the bench)
            return _common.throughput(
                w + suffix, "torch", times, total * bytes_per_elem, torch.get_num_threads(),
                tensors=len(sizes), peer=f"torch {torch.__version__}", what=what)

        return _common.Bench(_common.repeat(fn, args.min_time, sync), record)

    return _common.run(args, [_common.Workload(w + suffix, "torch", lambda w=w: setup(w))
                              for w in workloads], unavailable, "torch_optim")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
