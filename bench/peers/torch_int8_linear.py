#!/usr/bin/env python3
"""Peer: PyTorch's dynamic int8 linear layer on hone's bench_quant workloads (sizes M, K, N from
`bench_quant --hone_print_sizes=<workload>`, three lines):

  int8_linear_m<M>_k<K>_n<N>
      torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(K, N)), {nn.Linear},
      dtype=torch.qint8) (int8 weights packed once, activations quantized per call, fbgemm on
      x86), called on X [M, K] under torch.no_grad(). X, W, b normal(0, 1), fp32, on the CPU with
      --threads threads.

Writes results in the results.json format; when torch cannot be imported the workloads are
reported unavailable.

Options: --sizes-dir DIR (files <workload>.txt), --threads, --repetitions, --min-time, --filter
REGEX (on "<workload>/torch"), --out FILE, --serve.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

WORKLOADS = tuple(f"int8_linear_m{m}_k{k}_n{k}" for k in (1024, 4096) for m in (1, 32, 256))


def main(argv: list[str]) -> int:
    args = _common.parser(__doc__).parse_args(argv)
    workloads = _common.select(WORKLOADS, "torch", args.filter)
    torch, unavailable = _common.import_torch(workloads, "torch")
    if torch is None:
        return _common.run(args, [], unavailable, "torch_int8_linear")
    # quantize_dynamic's deprecation notices (torchao replaces it) on every setup: the API is the one
    # measured, as users of torch.ao still call it.
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from torch import nn  # noqa: PLC0415
    from torch.ao.quantization import quantize_dynamic  # noqa: PLC0415
    _, sync = _common.torch_device(torch, args.threads)

    def setup(w: str) -> _common.Bench:
        m, k, n = _common.read_sizes(args.sizes_dir, w, "bench_quant")
        gen = torch.Generator().manual_seed(7)
        x = torch.randn(m, k, generator=gen)
        lin = nn.Linear(k, n)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(n, k, generator=gen))
            lin.bias.copy_(torch.randn(n, generator=gen))
        model = quantize_dynamic(nn.Sequential(lin).eval(), {nn.Linear}, dtype=torch.qint8)

        def step():
            with torch.no_grad():
                return model(x)

        step()

        def record(times: list[float]) -> dict:
            return _common.time_ms(w, "torch", times, torch.get_num_threads(),
                                   peer=f"torch {torch.__version__}",
                                   what="quantize_dynamic(nn.Linear, qint8) forward "
                                        f"(engine {torch.backends.quantized.engine})")

        return _common.Bench(_common.repeat(step, args.min_time, sync), record)

    return _common.run(args, [_common.Workload(w, "torch", lambda w=w: setup(w))
                              for w in workloads], unavailable, "torch_int8_linear")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
