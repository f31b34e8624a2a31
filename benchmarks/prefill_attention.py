"""The C prefill attention kernel against today's per-request path (gather + mask + SDPA).

    python benchmarks/prefill_attention.py [--threads 2 --repeats 5]

For each case (requests x new tokens on top of cached tokens) and attention shape, times
one layer's attention both ways on random paged caches (block size 16, blocks scattered)
and prints the milliseconds per layer and their ratio, with the date and load average.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from datetime import datetime

import torch

from minivllm.model.attention import _one_request
from minivllm.model.kernels import cpu

SHAPES = {  # name: (heads, kv heads, head_dim)
    "SmolLM-135M": (9, 3, 64),
    "Qwen2.5-0.5B": (14, 2, 64),
}
CASES = {  # name: (new tokens per request, cached tokens per request)
    "1 x 1024": ([1024], [0]),
    "4 x 512": ([512] * 4, [0] * 4),
    "2048 on 2048": ([2048], [2048]),
}


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


def today(q, k_cache, v_cache, tables, query_start_loc, seq_lens, scale):
    """The engine's prefill path today: one gathered, masked SDPA per request."""
    out = torch.empty_like(q)
    for i, table in enumerate(tables):
        start, end = query_start_loc[i].item(), query_start_loc[i + 1].item()
        out[start:end] = _one_request(q[start:end], k_cache, v_cache, table,
                                      seq_lens[i].item(), scale)
    return out


def measure(shape, query_lens, cached, repeats):
    """Best milliseconds of today's path and of the kernel (interleaved, so that other load
    on the machine hits both alike), and their largest difference."""
    q, k_cache, v_cache, tables, block_table, qsl, seq_lens = make_batch(query_lens, cached,
                                                                         shape)
    scale = shape[2] ** -0.5

    def sdpa():
        return today(q, k_cache, v_cache, tables, qsl, seq_lens, scale)

    def kernel():
        return cpu.paged_prefill_attention(q, k_cache, v_cache, block_table, qsl, seq_lens,
                                           scale)

    diff = (kernel() - sdpa()).abs().max().item()  # also the warm-up
    times = {sdpa: [], kernel: []}
    for _ in range(repeats):
        for fn, runs in times.items():
            start = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - start)
    return min(times[sdpa]) * 1000, min(times[kernel]) * 1000, diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not cpu.available(torch.device("cpu"), torch.float32):
        raise SystemExit("the C kernels are not available (no compiler?)")
    print(f"{datetime.now():%Y-%m-%d %H:%M}; {platform.machine()}, {os.cpu_count()} cores, "
          f"{args.threads} threads; load average {os.getloadavg()[0]:.2f}; torch "
          f"{torch.__version__}; best of {args.repeats}, block size 16")
    print(f"{'shape':14} {'case':14} {'SDPA ms':>9} {'kernel ms':>10} {'ratio':>7} "
          f"{'max |diff|':>11}")
    for shape_name, shape in SHAPES.items():
        for case_name, (query_lens, cached) in CASES.items():
            sdpa_ms, kernel_ms, diff = measure(shape, query_lens, cached, args.repeats)
            print(f"{shape_name:14} {case_name:14} {sdpa_ms:9.2f} {kernel_ms:10.2f} "
                  f"{sdpa_ms / kernel_ms:6.2f}x {diff:11.1e}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
