"""bf16-stored weights with fp32 arithmetic (panel_gemm.c) against oneDNN's fp32 linear, at
Qwen2.5-Coder-0.5B's and SmolLM2-135M's shapes.

    python benchmarks/bf16_gemm.py [--rows 1 8 128] [--threads 2]

For each shape and row count: milliseconds per call (the median of several), GFLOP/s, and
the GB/s of weights read (bf16: 2 bytes a weight, fp32: 4), beside a large copy's bandwidth
on the same threads: at one row both stream their weights, so bf16 should take about half
fp32's time; from a few rows on both are bound by their arithmetic. Run it on a quiet
machine; the load is printed.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.bench.timing import call_seconds
from minivllm.model.kernels import library
from minivllm.model.linear.onednn import Linear
from minivllm.model.linear.panels import PanelLinear

SHAPES = {"qwen qkv": (1152, 896), "qwen gate_up": (9728, 896), "qwen down": (896, 4864),
          "qwen lm_head": (151936, 896), "smollm2 gate_up": (3072, 576),
          "smollm2 lm_head": (49152, 576)}


def copy_bandwidth(mib: int = 512) -> float:
    src = torch.ones(mib << 18)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / min(call_seconds(lambda: dst.copy_(src), repeats=5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 8, 128])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not library.panel_width():
        raise SystemExit("panel_gemm.c does not run here (no C kernels at AVX2 or above)")
    print(f"# {cpu_description()}; kernels {library._library().isa_summary}; "
          f"{args.threads} threads; {when_and_load()}")
    print(f"# copy bandwidth (read + write): {copy_bandwidth() / 1e9:.1f} GB/s")
    print("| shape | N x K | rows | bf16 ms | GFLOP/s | GB/s | fp32 oneDNN ms | GFLOP/s | GB/s "
          "| fp32 / bf16 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, (n, k) in SHAPES.items():
        weight = torch.randn(n, k)
        engines = {"bf16": PanelLinear(weight), "fp32": Linear(weight)}
        for rows in args.rows:
            x = torch.randn(rows, k)
            ms = {e: 1e3 * statistics.median(call_seconds(lambda f=f, x=x: f(x), repeats=5,
                                                          min_seconds=0.3))
                  for e, f in engines.items()}
            flops = 2 * n * k * rows / 1e9
            cells = [f"{ms[e]:.3f} | {flops / ms[e] * 1e3:.0f} | "
                     f"{n * k * size / ms[e] / 1e6:.1f}" for e, size in (("bf16", 2),
                                                                        ("fp32", 4))]
            print(f"| {name} | {n}x{k} | {rows} | {cells[0]} | {cells[1]} | "
                  f"{ms['fp32'] / ms['bf16']:.2f}x |")
    print(f"# {when_and_load()} (end)")


if __name__ == "__main__":
    main()
