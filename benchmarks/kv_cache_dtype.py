"""Decode attention reading an fp32 K/V cache against the same cache in bf16
(--kv-cache-dtype bfloat16), in the C kernel, alternating.

    python benchmarks/kv_cache_dtype.py [--threads 2 --rounds 5]

For each case (sequences x context length) of SmolLM-135M's attention shape, times one
layer's decode attention over random paged caches (block size 16, blocks scattered), fp32
and bf16 in turn (A B A B ...), and prints each one's median milliseconds and the median of
the per-round ratios, with the date and load average. A long context does not fit the
caches, so the time is mostly the K/V bytes read: bf16 reads half of them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import datetime, timezone

import torch
from prefill_attention import SHAPES, make_batch  # benchmarks/, this script's folder

from minivllm.model.kernels import cpu

CASES = {"16 x 1024": (16, 1024), "64 x 512": (64, 512), "4 x 4096": (4, 4096)}


def time_decode(q, k_cache, v_cache, table, seq_lens, repeats: int) -> float:
    scale = q.shape[-1] ** -0.5
    cpu.paged_decode_attention(q, k_cache, v_cache, table, seq_lens, scale)  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        cpu.paged_decode_attention(q, k_cache, v_cache, table, seq_lens, scale)
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not cpu.available(torch.device("cpu"), torch.float32):
        raise SystemExit("the C kernels are not built (no C compiler?)")
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{now}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"{args.threads} threads, SmolLM-135M attention shape, {args.rounds} rounds")
    print("| case | fp32 cache ms | bf16 cache ms | fp32 / bf16 |\n|---|---|---|---|")
    for name, (seqs, context) in CASES.items():
        q, k_cache, v_cache, _, table, _, seq_lens = make_batch(
            [1] * seqs, [context - 1] * seqs, SHAPES["SmolLM-135M"])
        caches = {"fp32": (k_cache, v_cache), "bf16": (k_cache.bfloat16(), v_cache.bfloat16())}
        times = {kind: [] for kind in caches}
        for _ in range(args.rounds):
            for kind, (k, v) in caches.items():
                times[kind].append(time_decode(q, k, v, table, seq_lens, args.repeats))
        ratios = [a / b for a, b in zip(times["fp32"], times["bf16"])]
        print(f"| {name} | {statistics.median(times['fp32']):.2f} | "
              f"{statistics.median(times['bf16']):.2f} | {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
