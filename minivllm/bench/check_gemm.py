"""`minivllm check-kernels MODEL --gemm`: the model's linear shapes, each way this CPU can run
them, timed as the engine's measured choice times them (linear/choice.time_ways), per row
count: GFLOP/s (a multiply-add counted as two), the way `--kernel-choice measure` runs, and
its fraction of the roof.

The roof of a GEMM is the lower of two: the arithmetic peak of the instructions the way
runs on (measured here, peaks.py: fp32 FMA for fp32 and the bf16 panels' fp32
arithmetic, vpdpbusd or AVX2's mix for int8; none is measured for AMX or oneDNN's bf16,
whose roof is then the memory's alone), and the memory's: the bandwidth of a large copy
times the operations per byte the call must move (weights once, x and y once).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.bench.peaks import measure_peaks, memory_bandwidth
from minivllm.model.linear.choice import time_ways

DEFAULT_ROWS = (1, 4, 16, 64, 256, 512)
WEIGHT_BYTES = {"float32": 4.0, "bf16": 2.0, "int8": 1 + 4 / 32}  # int8: a scale per 32


@dataclass
class Shape:
    name: str
    n: int  # out_features
    k: int  # in_features


def model_shapes(cfg) -> list[Shape]:
    """The linears the engine runs (q/k/v and gate/up fused), and the LM head."""
    hidden = cfg.hidden_size
    head_dim = getattr(cfg, "head_dim", None) or hidden // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    q = cfg.num_attention_heads * head_dim
    return [Shape("qkv", q + 2 * kv_heads * head_dim, hidden), Shape("o", hidden, q),
            Shape("gate_up", 2 * cfg.intermediate_size, hidden),
            Shape("down", hidden, cfg.intermediate_size), Shape("lm_head", cfg.vocab_size, hidden)]


def way_peak(way: str, peaks: dict[str, float]) -> float | None:
    """The arithmetic peak (operations/s) of the instructions a way runs on; None where
    none is measured."""
    if way == "int8":
        return 1e9 * peaks.get("int8_vnni", peaks["int8_avx2"])
    if way in ("oneDNN", "torch", "bf16 panels", "fp32 panels"):
        return 1e9 * peaks["fp32"]
    if way in ("oneDNN bf16", "bf16 dot panels") and "bf16" in peaks:
        return 1e9 * peaks["bf16"]
    return None


def roof(way: str, weights: str, shape: Shape, rows: int, peaks: dict[str, float],
         bandwidth: float) -> tuple[float, str]:
    """(operations/s, "compute" | "memory") this way cannot beat at these rows."""
    ops = 2 * rows * shape.n * shape.k
    moved = shape.n * shape.k * WEIGHT_BYTES[weights] + 4 * rows * (shape.n + shape.k)
    memory = bandwidth * ops / moved
    compute = way_peak(way, peaks)
    return (memory, "memory") if compute is None or memory < compute else (compute, "compute")


def ways_for(shape: Shape, weights: str) -> tuple[dict, str]:
    """(name -> layer for each way the engine chooses between, the weights they hold): as
    CausalLM builds them, whose bf16 LM head stays fp32 where bf16 would round the logits."""
    from minivllm.model.linear.int8 import Int8Linear
    from minivllm.model.linear.registry import bf16_logits_stay_fp32, linear_ways

    weight = torch.randn(shape.n, shape.k) * 0.05
    if weights == "int8":
        return {"int8": Int8Linear(weight)}, weights
    head = shape.name == "lm_head"
    if weights == "bf16" and head and not bf16_logits_stay_fp32(weight, True):
        weights = "float32"
    builders = linear_ways(weight, None, True, "bf16" if weights == "bf16" else None, head)
    return {name: build() for name, build in builders.items()}, weights


def gemm_table(cfg, weights: str, rows_list: tuple[int, ...], peaks: dict[str, float],
               bandwidth: float, timer=time_ways) -> list[str]:
    """The table's lines (markdown)."""
    lines = ["| linear | N x K | rows | way: GFLOP/s | chosen | roof GFLOP/s | chosen / roof |",
             "|---|---|---|---|---|---|---|"]
    for shape in model_shapes(cfg):
        ways, held = ways_for(shape, weights)
        for rows in rows_list:
            seconds = timer(ways, shape.k, rows)
            rates = {name: 2 * rows * shape.n * shape.k / s / 1e9 for name, s in seconds.items()}
            chosen = min(seconds, key=seconds.get)
            top, bound = roof(chosen, held, shape, rows, peaks, bandwidth)
            cells = ", ".join(f"{name} {rate:.1f}" for name, rate in rates.items())
            lines.append(f"| {shape.name} | {shape.n} x {shape.k} | {rows} | {cells} | "
                         f"{chosen} | {top / 1e9:.1f} ({bound}) | "
                         f"{rates[chosen] * 1e9 / top:.0%} |")
    return lines


def run_gemm(args, hf_config) -> int:
    threads = torch.get_num_threads()
    weights = ("int8" if args.quantization == "int8"
               else "bf16" if args.dtype == "bfloat16" else "float32")
    peaks, bandwidth = measure_peaks(threads), memory_bandwidth(threads)
    print(f"CPU: {cpu_description()}; {threads} threads; {weights} weights")
    bf16 = f"bf16 dot {peaks['bf16']:.0f} GFLOP/s, " if "bf16" in peaks else ""
    print(f"measured peaks: fp32 FMA {peaks['fp32']:.0f} GFLOP/s, {bf16}int8 "
          f"{peaks.get('int8_vnni', peaks['int8_avx2']):.0f} GOP/s; memory (copy) "
          f"{bandwidth / 1e9:.1f} GB/s")
    for line in gemm_table(hf_config, weights, tuple(args.rows), peaks, bandwidth):
        print(line)
    print(f"measured {when_and_load()} (a loaded machine's figures are low, and its choices "
          "noisy)")
    return 0
