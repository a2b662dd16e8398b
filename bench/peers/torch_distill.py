#!/usr/bin/env python3
"""Peer: the distillation loss of hone's bench_compress workloads composed in PyTorch, forward and
backward, on the same shapes (batch and classes from `bench_compress --hone_print_sizes=<workload>`,
two lines):

  distill_loss_b<batch>_c<classes>
      s: student logits [batch, classes] (requires_grad), t: teacher logits, y: labels; T = 2,
      alpha = 0.5:
        loss = alpha * T*T * F.kl_div(F.log_softmax(s / T, 1), F.log_softmax(t / T, 1),
                                      log_target=True, reduction="batchmean")
               + (1 - alpha) * F.cross_entropy(s, y)
        loss.backward()   (s.grad set to None before each call, so it is written, not summed)

  sparse24_linear_m<M>_k<K>_n<N>
      F.linear(X, W) with X [M, K] and the dense 2:4-pruned W [N, K] (the two largest magnitudes of
      every group of 4 kept; torch's dense GEMM does not use the zeros), under torch.no_grad().

  structured50_mlp_m<M>_d<d>
      F.linear(F.linear(X, W1), W2) with the shapes prune_neurons(net, 0.5) leaves: W1 [d/2, d],
      W2 [d, d/2] (the hidden layer halved), under torch.no_grad().

Logits uniform in [-8, 8] (as hone's), fp32, on the CPU with --threads threads. Writes results in
the results.json format; when torch cannot be imported the workloads are reported unavailable.

Options: --sizes-dir DIR (files <workload>.txt), --threads, --repetitions, --min-time, --filter
REGEX (on "<workload>/torch"), --out FILE, --serve.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

TEMPERATURE = 2.0
ALPHA = 0.5
WORKLOADS = ("distill_loss_b256_c32000", "distill_loss_b32_c1000",
             "sparse24_linear_m64_k4096_n4096", "sparse24_linear_m1_k4096_n4096",
             "structured50_mlp_m64_d2048")


def main(argv: list[str]) -> int:
    args = _common.parser(__doc__).parse_args(argv)
    workloads = _common.select(WORKLOADS, "torch", args.filter)
    torch, unavailable = _common.import_torch(workloads, "torch")
    if torch is None:
        return _common.run(args, [], unavailable, "torch_distill")
    import torch.nn.functional as F  # noqa: N812, PLC0415
    dev, sync = _common.torch_device(torch, args.threads)

    def setup_linear(w: str) -> _common.Bench:
        m, k, n = _common.read_sizes(args.sizes_dir, w, "bench_compress")
        gen = torch.Generator().manual_seed(2)
        x = torch.randn(m, k, generator=gen)
        weight = torch.randn(n, k, generator=gen)
        groups = weight.view(n, k // 4, 4)
        keep = groups.abs().topk(2, dim=2).indices
        mask = torch.zeros_like(groups).scatter_(2, keep, 1.0)
        weight = (groups * mask).view(n, k)

        def step():
            with torch.no_grad():
                return F.linear(x, weight)

        step()

        def record(times: list[float]) -> dict:
            return _common.time_ms(w, "torch", times, torch.get_num_threads(),
                                   peer=f"torch {torch.__version__}",
                                   what="F.linear(X, W) with the dense 2:4-pruned W")

        return _common.Bench(_common.repeat(step, args.min_time, sync), record)

    def setup_structured(w: str) -> _common.Bench:
        m, d = _common.read_sizes(args.sizes_dir, w, "bench_compress")
        gen = torch.Generator().manual_seed(5)
        x = torch.randn(m, d, generator=gen)
        w1 = torch.randn(d // 2, d, generator=gen)
        w2 = torch.randn(d, d // 2, generator=gen)

        def step():
            with torch.no_grad():
                return F.linear(F.linear(x, w1), w2)

        step()

        def record(times: list[float]) -> dict:
            return _common.time_ms(w, "torch", times, torch.get_num_threads(),
                                   peer=f"torch {torch.__version__}",
                                   what="F.linear(F.linear(X, W1), W2), hidden layer halved")

        return _common.Bench(_common.repeat(step, args.min_time, sync), record)

    def setup(w: str) -> _common.Bench:
        if w.startswith("sparse24_"):
            return setup_linear(w)
        if w.startswith("structured50_"):
            return setup_structured(w)
        batch, classes = _common.read_sizes(args.sizes_dir, w, "bench_compress")
        gen = torch.Generator().manual_seed(1)
        s = (torch.rand(batch, classes, generator=gen) * 16 - 8).requires_grad_(True)
        t = torch.rand(batch, classes, generator=gen) * 16 - 8
        y = torch.randint(0, classes, (batch,), generator=gen)
        T = TEMPERATURE

        def step():
            s.grad = None
            kl = F.kl_div(F.log_softmax(s / T, dim=1), F.log_softmax(t / T, dim=1),
                          log_target=True, reduction="batchmean")
            loss = ALPHA * T * T * kl + (1 - ALPHA) * F.cross_entropy(s, y)
            loss.backward()
            return loss

        step()

        def record(times: list[float]) -> dict:
            return _common.time_ms(w, "torch", times, torch.get_num_threads(),
                                   peer=f"torch {torch.__version__}",
                                   what="kl_div(log_softmax(s/T), log_softmax(t/T), "
                                        "log_target=True, batchmean)*T^2 blended with "
                                        "cross_entropy, + backward()")

        return _common.Bench(_common.repeat(step, args.min_time, sync), record)

    return _common.run(args, [_common.Workload(w, "torch", lambda w=w: setup(w))
                              for w in workloads], unavailable, "torch_distill")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
