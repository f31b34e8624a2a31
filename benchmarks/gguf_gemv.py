"""The decode GEMVs of a real GGUF file's linears on gguf_gemm.c, against the machine's
memory bandwidth.

    python benchmarks/gguf_gemv.py [--gguf FILE] [--rows 1 2 4 8] [--threads 2] [--per-type]

Every linear of the file stored as a block type the kernel runs (the tied LM head, the
token embeddings, among them), called in file order as a decode step calls them, at each
row count: milliseconds per pass, the bytes the kernel reads per pass (GGUFLinear.
step_bytes: the blocks, and anything it keeps beside them) and the GB/s that makes, against
a large torch copy's (read + write) and sum's (read) bandwidth on the same threads. Default
file: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (minivllm.bench.qwen25_coder). A shared machine's
figures are rough: the load is printed with them.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from minivllm.bench.machine import cpu_description, when_and_load
from minivllm.bench.timing import call_seconds
from minivllm.model.gguf import open_gguf
from minivllm.model.kernels import library
from minivllm.model.kernels.gguf_blocks import TYPE_NAMES
from minivllm.model.linear.gguf import BlockWeight, GGUFLinear

COPY_BYTES = 512 << 20  # far past the last-level cache


def file_linears(path: Path) -> list[GGUFLinear]:
    """The 2-D tensors of a block type the kernel runs, as GGUFLinears, in file order; the
    token embeddings only when no output.weight (then they are the LM head)."""
    reader = open_gguf(path)
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    linears = []
    for t in reader.tensors:
        if (len(t.shape) != 2 or int(t.tensor_type) not in TYPE_NAMES
                or (t.name == "token_embd.weight" and not tied)):
            continue
        blocks = torch.from_numpy(np.array(t.data, dtype=np.uint8))
        linears.append(GGUFLinear(BlockWeight(int(t.tensor_type), blocks)))
    return linears


def bandwidth(threads: int) -> tuple[float, float]:
    """GB/s of a COPY_BYTES copy (bytes read + written) and of a sum over them (read)."""
    src = torch.ones(COPY_BYTES // 4)
    dst = torch.empty_like(src)
    copy = min(call_seconds(lambda: dst.copy_(src), repeats=5))
    read = min(call_seconds(lambda: src.sum(), repeats=5))
    return 2 * COPY_BYTES / copy / 1e9, COPY_BYTES / read / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, help="default: Qwen2.5-Coder-0.5B Q4_K_M")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seconds", type=float, default=3.0, help="timed per row count")
    parser.add_argument("--per-type", action="store_true",
                        help="also each block type's linears alone (a linear of several "
                             "types counts for the first)")
    args = parser.parse_args()
    if not library.available(torch.device("cpu"), torch.float32):
        raise SystemExit("the C kernels are not available here: nothing to measure")
    if args.gguf is None:
        from minivllm.bench.qwen25_coder import qwen25_coder_gguf
        args.gguf = qwen25_coder_gguf()
    torch.set_num_threads(args.threads)
    linears = file_linears(args.gguf)
    step = sum(linear.step_bytes for linear in linears)
    types = Counter(TYPE_NAMES[q] for linear in linears for q in linear.qtypes)
    print(f"{args.gguf.name}: {len(linears)} linears "
          f"({', '.join(f'{n} {q}' for q, n in sorted(types.items()))}), "
          f"the kernel reads {step / 1e6:.1f} MB per pass")
    print(f"CPU: {cpu_description()}; kernels: {library.isa_summary()}; {args.threads} threads")
    copy, read = bandwidth(args.threads)
    print(f"bandwidth: copy {copy:.1f} GB/s (read + write), sum {read:.1f} GB/s (read)")
    groups = {"all": linears}
    if args.per_type:
        for linear in linears:
            groups.setdefault(TYPE_NAMES[linear.qtypes[0]], []).append(linear)
    print(f"{'linears':>7} {'rows':>4} {'ms/pass':>8} {'GB/s':>6} {'of sum':>7}")
    for name, group in groups.items():
        group_bytes = sum(linear.step_bytes for linear in group)
        for rows in args.rows:
            xs = {linear.in_features: torch.randn(rows, linear.in_features) for linear in group}

            def one_pass(xs: dict[int, torch.Tensor] = xs, group=group) -> None:
                for linear in group:
                    linear(xs[linear.in_features])

            seconds = statistics.median(call_seconds(one_pass, repeats=3,
                                                     min_seconds=args.seconds))
            rate = group_bytes / seconds / 1e9
            print(f"{name:>7} {rows:>4} {seconds * 1e3:>8.2f} {rate:>6.1f} {rate / read:>6.0%}")
    print(f"measured {when_and_load()}")


if __name__ == "__main__":
    main()
