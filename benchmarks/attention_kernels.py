"""The C paged-attention kernels, one layer's attention on random paged caches (block size
16, blocks scattered), with the date and load average:

    python benchmarks/attention_kernels.py [--kernels prefill decode] [--threads 2]

- prefill: the kernel against the per-request path it replaced (gather + mask + SDPA), for
  each case (requests x new tokens on top of cached tokens) and attention shape: the best
  milliseconds of --repeats (the two interleaved, so that other load on the machine hits
  both alike), their ratio and their largest difference; then, where the kernels have bf16
  products (AMX tiles, AVX-512 BF16 pair dots), the same cases over a bf16 cache: the
  fp32-math kernel against the bf16-product one;
- decode: the kernel reading an fp32 K/V cache against the same cache in bf16
  (--kv-cache-dtype bfloat16), int8 and fp8 (e4m3; model/kv_quant.py), in SmolLM-135M's
  shape, for each case (sequences x context length): --rounds alternating rounds of
  --decode-calls calls each, the median milliseconds and the median of the per-round
  ratios to fp32. A long context does not fit the caches, so the time is mostly the K/V
  bytes read: bf16 reads half of them, int8 and fp8 a quarter and their scales.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from datetime import datetime
from functools import partial

import torch

from minivllm.bench.timing import alternating, call_seconds, ratio_summary, timed
from minivllm.model.attention import _one_request
from minivllm.model.kernels import attention_ops, library
from minivllm.model.kv_quant import FORMATS, QuantizedKV, quantize

SHAPES = {  # name: (heads, kv heads, head_dim)
    "SmolLM-135M": (9, 3, 64),
    "Qwen2.5-0.5B": (14, 2, 64),
}
PREFILL_CASES = {  # name: (new tokens per request, cached tokens per request)
    "1 x 1024": ([1024], [0]),
    "4 x 512": ([512] * 4, [0] * 4),
    "2048 on 2048": ([2048], [2048]),
}
DECODE_CASES = {"16 x 1024": (16, 1024), "64 x 512": (64, 512), "4 x 4096": (4, 4096),
                "16 x 4096": (16, 4096)}  # issue 51: batch 16 at 4,096 tokens


def make_batch(query_lens, cached, shape, block_size=16, seed=0):
    heads, kv_heads, dim = shape
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [n + c for n, c in zip(query_lens, cached)]
    widths = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(widths) + 1
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables, start = [], 0
    for width in widths:
        tables.append(torch.tensor(order[start:start + width]))
        start += width
    block_table = torch.zeros(len(widths), max(widths), dtype=torch.long)
    for i, table in enumerate(tables):
        block_table[i, :len(table)] = table
    query_start_loc = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()])
    q = torch.randn(sum(query_lens), heads, dim, generator=gen)
    return q, k_cache, v_cache, tables, block_table, query_start_loc, torch.tensor(seq_lens)


def per_request_sdpa(q, k_cache, v_cache, tables, query_start_loc, seq_lens, scale):
    """The engine's prefill path before the kernel: one gathered, masked SDPA per request."""
    out = torch.empty_like(q)
    for i, table in enumerate(tables):
        start, end = query_start_loc[i].item(), query_start_loc[i + 1].item()
        out[start:end] = _one_request(q[start:end], k_cache, v_cache, table,
                                      seq_lens[i].item(), scale)
    return out


def measure_prefill(shape, query_lens, cached, repeats):
    """Best milliseconds of the per-request path and of the kernel, and their largest
    difference."""
    q, k_cache, v_cache, tables, block_table, qsl, seq_lens = make_batch(query_lens, cached,
                                                                         shape)
    scale = shape[2] ** -0.5

    def sdpa():
        return per_request_sdpa(q, k_cache, v_cache, tables, qsl, seq_lens, scale)

    def kernel():
        return attention_ops.paged_prefill_attention(q, k_cache, v_cache, block_table, qsl,
                                                     seq_lens, scale)

    diff = (kernel() - sdpa()).abs().max().item()  # also the warm-up
    times = alternating({"sdpa": lambda: timed(sdpa)[1], "kernel": lambda: timed(kernel)[1]},
                        repeats)
    return min(times["sdpa"]) * 1000, min(times["kernel"]) * 1000, diff


def measure_bf16_prefill(shape, query_lens, cached, repeats):
    """Over a bf16 cache: best milliseconds of the fp32-math kernel and of the bf16-product
    one this CPU runs (AMX tiles, AVX-512 BF16 pair dots), and their largest difference."""
    q, k_cache, v_cache, _, block_table, qsl, seq_lens = make_batch(query_lens, cached, shape)
    k_cache, v_cache, scale = k_cache.bfloat16(), v_cache.bfloat16(), shape[2] ** -0.5

    def run(bf16_products):
        return attention_ops.paged_prefill_attention(q, k_cache, v_cache, block_table, qsl,
                                                     seq_lens, scale,
                                                     bf16_products=bf16_products)

    diff = (run(True) - run(False)).abs().max().item()  # also the warm-up
    times = alternating({"fp32": lambda: timed(partial(run, False))[1],
                         "bf16": lambda: timed(partial(run, True))[1]}, repeats)
    return min(times["fp32"]) * 1000, min(times["bf16"]) * 1000, diff


def prefill_table(args) -> None:
    print(f"prefill, best of {args.repeats}")
    print(f"{'shape':14} {'case':14} {'SDPA ms':>9} {'kernel ms':>10} {'ratio':>7} "
          f"{'max |diff|':>11}")
    for shape_name, shape in SHAPES.items():
        for case_name, (query_lens, cached) in PREFILL_CASES.items():
            sdpa_ms, kernel_ms, diff = measure_prefill(shape, query_lens, cached, args.repeats)
            print(f"{shape_name:14} {case_name:14} {sdpa_ms:9.2f} {kernel_ms:10.2f} "
                  f"{sdpa_ms / kernel_ms:6.2f}x {diff:11.1e}", flush=True)
    if not library.bf16_prefill_products():
        return
    print(f"\nprefill over a bf16 cache, best of {args.repeats}: the fp32-math kernel against "
          "the bf16 products")
    print(f"{'shape':14} {'case':14} {'fp32 ms':>9} {'bf16 ms':>10} {'ratio':>7} "
          f"{'max |diff|':>11}")
    for shape_name, shape in SHAPES.items():
        for case_name, (query_lens, cached) in PREFILL_CASES.items():
            fp32_ms, bf16_ms, diff = measure_bf16_prefill(shape, query_lens, cached,
                                                          args.repeats)
            print(f"{shape_name:14} {case_name:14} {fp32_ms:9.2f} {bf16_ms:10.2f} "
                  f"{fp32_ms / bf16_ms:6.2f}x {diff:11.1e}", flush=True)


def decode_ms(q, k_cache, v_cache, table, seq_lens, calls: int) -> float:
    scale = q.shape[-1] ** -0.5
    times = call_seconds(
        lambda: attention_ops.paged_decode_attention(q, k_cache, v_cache, table, seq_lens,
                                                     scale),
        calls)
    return statistics.mean(times) * 1e3


def decode_table(args) -> None:
    print(f"\ndecode, SmolLM-135M attention shape, {args.rounds} rounds of "
          f"{args.decode_calls} calls")
    kinds = ("fp32", "bf16", "int8", "fp8")
    print("| case | " + " | ".join(f"{kind} cache ms" for kind in kinds) + " | "
          + " | ".join(f"fp32 / {kind}" for kind in kinds[1:]) + " |\n"
          + "|---" * (2 * len(kinds)) + "|")
    for name, (seqs, context) in DECODE_CASES.items():
        q, k_cache, v_cache, _, table, _, seq_lens = make_batch(
            [1] * seqs, [context - 1] * seqs, SHAPES["SmolLM-135M"])
        caches = {"fp32": (k_cache, v_cache), "bf16": (k_cache.bfloat16(), v_cache.bfloat16()),
                  **{kind: tuple(QuantizedKV(*quantize(c, FORMATS[kind]), FORMATS[kind])
                                 for c in (k_cache, v_cache)) for kind in kinds[2:]}}
        times = alternating({kind: partial(decode_ms, q, k, v, table, seq_lens,
                                           args.decode_calls)
                             for kind, (k, v) in caches.items()}, args.rounds)
        ratios = [ratio_summary([a / b for a, b in zip(times["fp32"], times[kind])])
                  for kind in kinds[1:]]
        print(f"| {name} | " + " | ".join(f"{statistics.median(times[kind]):.2f}"
                                          for kind in kinds)
              + " | " + " | ".join(ratios) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", nargs="+", choices=["prefill", "decode"],
                        default=["prefill", "decode"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="prefill: best of N")
    parser.add_argument("--rounds", type=int, default=5, help="decode: alternating rounds")
    parser.add_argument("--decode-calls", type=int, default=20,
                        help="decode: calls per round (their mean)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not library.available(torch.device("cpu"), torch.float32):
        raise SystemExit("the C kernels are not available (no compiler?)")
    print(f"{datetime.now():%Y-%m-%d %H:%M}; {platform.machine()}, {os.cpu_count()} cores, "
          f"{args.threads} threads; load average {os.getloadavg()[0]:.2f}; torch "
          f"{torch.__version__}; block size 16")
    if "prefill" in args.kernels:
        prefill_table(args)
    if "decode" in args.kernels:
        decode_table(args)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
