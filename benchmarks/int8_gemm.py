"""The int8 GEMMs torch 2.13 offers on this CPU against minivllm's, bf16, and the peaks.

    python benchmarks/int8_gemm.py [--rows 1 16 64 256] [--threads 2]

For each SmolLM-135M linear shape (qkv, o, gate_up, down, lm_head) and row count: the
milliseconds per call of the fp32 oneDNN linear the engine uses (packed weights), the same
Linear with bf16 weights and input (oneDNN's packed bf16 where the CPU has bf16 hardware,
else F.linear: what dtype=bfloat16 runs without AMX), on a CPU with AMX minivllm's bf16
linear on AMX tiles (what dtype=bfloat16 runs there, fp32 in and out), minivllm's
W8A8 kernel (int8_gemm.c, activations quantized inside the call, per group of 32; VNNI
where the library was built for it), torch._int_mm (with per-token quantization in torch
ops), torch._weight_int8pack_mm (weight-only int8), fbgemm's
quantized.linear_dynamic and oneDNN's qlinear_pointwise (u8 activations, zero point 128),
each with its largest error against the fp32 product relative to that product's largest
value. Then the peaks (minivllm/bench/peaks.py): fp32 FMA, AVX2's int8 instruction mix
(vpmaddubsw, vpmaddwd, vpaddd: the AVX2 variant's, less its vpsignb) and, where the CPU has
it, VNNI's vpdpbusd, in independent register chains on all threads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from minivllm.bench.peaks import measure_peaks
from minivllm.bench.timing import call_seconds
from minivllm.model.kernels import library
from minivllm.model.linear.amx import AmxBf16Linear
from minivllm.model.linear.int8 import Int8Linear
from minivllm.model.linear.onednn import Linear

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
          "lm_head": (49152, 576)}

def per_call_ms(fn) -> float:
    """The mean of as many calls as 0.3 s holds, after a warm-up."""
    return statistics.mean(call_seconds(fn, min_seconds=0.3)) * 1e3


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (int8 [N, K], fp32 scales [N]): one symmetric scale per output
    channel, what torch's int8 GEMMs take (minivllm's kernel scales groups of 32)."""
    scales = weight.abs().amax(dim=1).clamp_min(1e-12) / 127
    return torch.round(weight / scales[:, None]).to(torch.int8), scales


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (int8 [T, K], fp32 scales [T]): one symmetric scale per row, what torch's
    int8 GEMMs take (minivllm's kernel scales each group of 32 values of a row)."""
    scales = x.abs().amax(dim=1).clamp_min(1e-12) / 127
    return torch.round(x / scales[:, None]).to(torch.int8), scales


def candidates(weight: torch.Tensor, x: torch.Tensor) -> dict:
    """name -> a function computing x @ weight.T its way."""
    n, k = weight.shape
    fp32 = Linear(weight)
    bf16, x_bf16 = Linear(weight.bfloat16()), x.bfloat16()
    ours = Int8Linear(weight)
    q, scales = quantize_per_channel(weight)
    q_t = q.t().contiguous()

    def int_mm():
        xq, x_scales = quantize_per_token(x)
        return torch._int_mm(xq, q_t) * (x_scales[:, None] * scales)

    torch.backends.quantized.engine = "fbgemm"
    fbgemm = torch.ops.quantized.linear_prepack(
        torch.quantize_per_channel(weight, scales.double(), torch.zeros(n, dtype=torch.long),
                                   0, torch.qint8), None)
    onednn = torch.ops.onednn.qlinear_prepack(q, list(x.shape))
    zero_points = torch.zeros(n, dtype=torch.long)

    def qlinear():
        xq, x_scales = quantize_per_token(x)
        u8 = (xq.to(torch.int16) + 128).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise(u8, 1.0, 128, onednn, scales, zero_points,
                                                   None, 1.0, 0, torch.float32, "none", [],
                                                   "") * x_scales[:, None]

    found = {"fp32 oneDNN": lambda: fp32(x), "bf16": lambda: bf16(x_bf16).float()}
    if library.amx():  # what dtype=bfloat16 runs on such a CPU, fp32 in and out
        amx_bf16 = AmxBf16Linear(weight)
        found["minivllm bf16 AMX"] = lambda: amx_bf16(x)
    return {**found, "minivllm int8": lambda: ours(x),
            "_int_mm": int_mm, "weight-only int8": lambda: torch._weight_int8pack_mm(
                x, q, scales), "fbgemm dynamic": lambda: torch.ops.quantized.linear_dynamic(
                x, fbgemm, False), "oneDNN qlinear": qlinear}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--skip", nargs="*", default=[],
                        help="candidates to leave out (the slow ones at many rows)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {args.threads} threads")
    peaks = measure_peaks(args.threads)
    print(f"peaks (minivllm.bench.peaks): fp32 FMA {peaks['fp32']:.0f} GFLOP/s, int8 AVX2 "
          f"(vpmaddubsw + vpmaddwd + vpaddd) {peaks['int8_avx2']:.0f} GOP/s"
          + (f", int8 VNNI (vpdpbusd) {peaks['int8_vnni']:.0f} GOP/s"
             if "int8_vnni" in peaks else ""))
    print("| shape | rows | candidate | ms / call | GOP/s | max error / max |y| |")
    print("|---|---|---|---|---|---|")
    torch.manual_seed(0)
    for shape in args.shapes:
        n, k = SHAPES[shape]
        weight = torch.randn(n, k) * 0.05
        for rows in args.rows:
            x = torch.randn(rows, k)
            exact = x @ weight.t()
            for name, fn in candidates(weight, x).items():
                if name in args.skip:
                    continue
                ms = per_call_ms(fn)
                error = ((fn() - exact).abs().max() / exact.abs().max()).item()
                print(f"| {shape} {n}x{k} | {rows} | {name} | {ms:.3f} | "
                      f"{2 * rows * n * k / ms / 1e6:.0f} | {error:.4f} |", flush=True)


if __name__ == "__main__":
    main()
