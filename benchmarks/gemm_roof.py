"""The engine's GEMMs at real shapes against this CPU's peaks.

    python benchmarks/gemm_roof.py [--rows 16 64 128 512] [--threads 2]

For SmolLM2-135M's and Qwen2.5-Coder-0.5B's linears (q/k/v and gate/up fused, as the engine
runs them) and each row count: GFLOP/s (a multiply-add counted as two operations) and the
fraction of the peak of the arithmetic it runs on, for each kernel the engine uses there:

- fp32: oneDNN's packed linear (`--dtype float32`), against the fp32 FMA peak;
- bf16 stored (panel_gemm.c: `--dtype bfloat16` without AVX512-BF16), fp32 arithmetic:
  against the fp32 FMA peak;
- int8 (int8_gemm.c: `--quantization int8`, groups of 32): against the int8 peak of
  its instructions (VNNI's vpdpbusd where the CPU has it, else AVX2's vpmaddubsw mix);
- GGUF blocks (gguf_repacked.c), Qwen2.5-Coder-0.5B's real Q4_K_M tensors (Q5_0, Q8_0,
  Q6_K): against the same int8 peak.

The peaks are measured here (minivllm/bench/peaks.py: each instruction in 10 independent
register chains on all threads). Run it on a quiet machine; the load is printed.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.bench.peaks import measure_peaks
from minivllm.bench.timing import call_seconds
from minivllm.model.kernels import library
from minivllm.model.linear.gguf import BlockWeight, GGUFLinear, cat_rows
from minivllm.model.linear.int8 import Int8Linear
from minivllm.model.linear.onednn import Linear
from minivllm.model.linear.panels import PanelLinear

# (out, in) of the engine's fused linears
SHAPES = {"smollm2": {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576),
                      "down": (576, 1536)},
          "qwen": {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896),
                   "down": (896, 4864)}}
# Qwen's GGUF tensors (layer 0) behind each fused linear
GGUF_PARTS = {"qkv": ["attn_q", "attn_k", "attn_v"], "o": ["attn_output"],
              "gate_up": ["ffn_gate", "ffn_up"], "down": ["ffn_down"]}


def gguf_layers() -> dict[str, tuple[GGUFLinear, str]]:
    """Qwen2.5-Coder-0.5B Q4_K_M's layer-0 linears, fused as the engine fuses them."""
    from minivllm.bench.qwen25_coder import qwen25_coder_gguf
    from minivllm.model.gguf import open_gguf
    from minivllm.model.kernels.gguf_blocks import TYPE_NAMES

    tensors = {t.name: t for t in open_gguf(qwen25_coder_gguf()).tensors}
    layers = {}
    for name, parts in GGUF_PARTS.items():
        blocks = [tensors[f"blk.0.{p}.weight"] for p in parts]
        weights = [BlockWeight(int(t.tensor_type),
                               torch.from_numpy(np.array(t.data, dtype=np.uint8)))
                   for t in blocks]
        types = "+".join(dict.fromkeys(TYPE_NAMES[int(t.tensor_type)] for t in blocks))
        layers[name] = (GGUFLinear(cat_rows(weights)), types)
    return layers


def gflops(fn, rows: int, n: int, k: int) -> float:
    seconds = statistics.median(call_seconds(fn, repeats=5, min_seconds=0.3))
    return 2 * rows * n * k / seconds / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64, 128, 512])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-gguf", action="store_true", help="skip Qwen's GGUF tensors")
    args = parser.parse_args()
    if not library.available(torch.device("cpu"), torch.float32):
        raise SystemExit("the C kernels are not available here: nothing to measure")
    torch.set_num_threads(args.threads)
    peaks = measure_peaks(args.threads)
    int8_peak = peaks.get("int8_vnni", peaks["int8_avx2"])
    int8_kind = "VNNI vpdpbusd" if "int8_vnni" in peaks else "AVX2 vpmaddubsw mix"
    print(f"CPU: {cpu_description()}; kernels: {library.isa_summary()}; {args.threads} threads")
    print(f"peaks: fp32 FMA {peaks['fp32']:.0f} GFLOP/s; int8 ({int8_kind}) {int8_peak:.0f} "
          f"GOP/s")
    gguf = {} if args.no_gguf else gguf_layers()
    print("| model | linear | N x K | kernel | " + " | ".join(f"{r} rows" for r in args.rows)
          + " |")
    print("|---|---|---|---|" + "---|" * len(args.rows))
    torch.manual_seed(0)
    for model, shapes in SHAPES.items():
        for name, (n, k) in shapes.items():
            weight = torch.randn(n, k) * 0.05
            kernels = {"fp32 oneDNN": (Linear(weight), peaks["fp32"]),
                       "bf16 stored": (PanelLinear(weight), peaks["fp32"]),
                       "int8": (Int8Linear(weight), int8_peak)}
            if model == "qwen" and name in gguf:
                layer, types = gguf[name]
                kernels[f"GGUF {types}"] = (layer, int8_peak)
            for kernel, (layer, peak) in kernels.items():
                cells = []
                for rows in args.rows:
                    x = torch.randn(rows, k)
                    rate = gflops(lambda layer=layer, x=x: layer(x), rows, n, k)
                    cells.append(f"{rate:.0f} ({rate / peak:.0%})")
                print(f"| {model} | {name} | {n} x {k} | {kernel} | " + " | ".join(cells)
                      + " |")
    print(f"measured {when_and_load()}")


if __name__ == "__main__":
    main()
