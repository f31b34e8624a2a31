"""Sampler cost per step: the batched torch path against the C kernel.

    python benchmarks/sampler.py [--rows 64 --vocab 49152 151936 --settings greedy full
                                  --history 2048 --repeats 10 --logits lm --threads 1]

Every row is a request with a --history-token past (prompt + 64 output tokens) and the
setting's parameters; each timed step samples all rows and records the tokens. --logits lm:
a long random tail (N(0, 1.5)) plus 32 boosted tokens per row, which hold most of the mass,
as a language model's next-token distribution; flat: N(0, 2) logits, where top-p keeps
thousands of tokens (the kernel's worst case). Prints the median ms per step of each path.
The per-row torch sampler both replaced was timed beside them up to commit 3c59476 (its
figures: docs/performance.md).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics

import torch

from minivllm.bench.timing import call_seconds
from minivllm.model.kernels import library
from minivllm.model.sampler import Sampler
from minivllm.sampling_params import SamplingParams

SETTINGS = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=1.0),
    "top_p": dict(temperature=1.0, top_p=0.9),
    "qwen": dict(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05),
    "full": dict(temperature=0.8, top_p=0.95, top_k=50, min_p=0.05, repetition_penalty=1.1),
}


def make_logits(rows: int, vocab: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "flat":
        return torch.randn(rows, vocab, generator=gen) * 2
    logits = torch.randn(rows, vocab, generator=gen) * 1.5
    boosted = torch.randint(vocab, (rows, 32), generator=gen)
    logits.scatter_(1, boosted, 10 + 2 * torch.randn(rows, 32, generator=gen))
    return logits


def median_ms(step, repeats: int) -> float:
    """The median of `repeats` steps after a warm-up (and the kernels' build)."""
    return statistics.median(call_seconds(step, repeats)) * 1e3


def run(setting: str, vocab: int, args) -> tuple[float, float | None]:
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(**SETTINGS[setting])
    histories = torch.randint(vocab, (args.rows, args.history), generator=gen).tolist()
    logits = make_logits(args.rows, vocab, args.logits, gen)
    ids = [str(i) for i in range(args.rows)]

    def step(use_kernel: bool):
        sampler = Sampler(vocab, torch.device("cpu"), 0, use_kernel)
        for i, h in zip(ids, histories):
            sampler.add_request(i, params, h[:-64], h[-64:], [], seed=None)
        return lambda: sampler.sample(logits, ids)

    torch_ms = median_ms(step(False), args.repeats)
    kernel_ms = (median_ms(step(True), args.repeats)
                 if library.available(torch.device("cpu"), torch.float32) else None)
    return torch_ms, kernel_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, nargs="+", default=[49152, 151936])
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--history", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--logits", choices=["lm", "flat"], default="lm")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{datetime.datetime.now():%Y-%m-%d %H:%M:%S}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cpus, "
          f"{torch.get_num_threads()} torch threads; {args.rows} rows, {args.history}-token "
          f"histories, {args.logits} logits; median ms per step")

    def fmt(ms: float | None) -> str:
        return "-" if ms is None else f"{ms:.2f}"

    print(f"{'setting':<12} {'vocab':>7} {'torch':>9} {'C':>9} {'torch/C':>8}")
    for setting in args.settings:
        for vocab in args.vocab:
            torch_ms, kernel_ms = run(setting, vocab, args)
            ratio = f"{torch_ms / kernel_ms:.1f}x" if kernel_ms else "-"
            print(f"{setting:<12} {vocab:>7} {fmt(torch_ms):>9} {fmt(kernel_ms):>9} "
                  f"{ratio:>8}", flush=True)


if __name__ == "__main__":
    main()
