"""Sampler cost per step: the old per-row sampler vs the new batched torch path vs the C kernel.

    python benchmarks/sampler.py [--rows 64 --vocab 49152 151936 --settings greedy full
                                  --history 2048 --repeats 10 --logits lm --threads 1]

Every row is a request with a --history-token past (prompt + 64 output tokens) and the
setting's parameters; each timed step samples all rows (and, in the new sampler, records
the tokens). --logits lm: a long random tail (N(0, 1.5)) plus 32 boosted tokens per row,
which hold most of the mass, as a language model's next-token distribution; flat: N(0, 2)
logits, where top-p keeps thousands of tokens (the kernel's worst case). Prints the median
ms per step of each path.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from dataclasses import dataclass

import torch

from minivllm.model.kernels import cpu
from minivllm.model.sampler import Sampler
from minivllm.outputs import Logprob
from minivllm.sampling_params import SamplingParams

SETTINGS = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=1.0),
    "top_p": dict(temperature=1.0, top_p=0.9),
    "qwen": dict(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05),
    "full": dict(temperature=0.8, top_p=0.95, top_k=50, min_p=0.05, repetition_penalty=1.1),
}


# ---- The per-row sampler this replaces (minivllm/model/sampler.py before it), verbatim ----

@dataclass
class SamplingRow:
    params: SamplingParams
    generator: torch.Generator | None  # None: the engine's shared generator
    prompt_token_ids: list[int]
    output_token_ids: list[int]


@dataclass
class SampleResult:
    token_id: int
    logprobs: dict[int, Logprob] | None  # chosen token + top-N, when asked for


def top_logprobs(logprobs: torch.Tensor, token_id: int, num: int) -> dict[int, Logprob]:
    """The chosen token's logprob and rank, plus the `num` most likely tokens."""
    chosen = logprobs[token_id].item()
    rank = int((logprobs > chosen).sum().item()) + 1
    result = {token_id: Logprob(chosen, rank)}
    if num > 0:
        values, ids = logprobs.topk(num)
        for r, (value, tid) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
            result.setdefault(tid, Logprob(value, r))
    return result


def _apply_penalties(logits: torch.Tensor, row: SamplingRow) -> None:
    p = row.params
    device = logits.device
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(row.prompt_token_ids + row.output_token_ids)),
                            dtype=torch.long, device=device)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / p.repetition_penalty,
                                   values * p.repetition_penalty)
    if row.output_token_ids and (p.frequency_penalty or p.presence_penalty):
        ids, counts = torch.tensor(row.output_token_ids, device=device).unique(return_counts=True)
        logits[ids] -= p.frequency_penalty * counts.to(logits.dtype) + p.presence_penalty


def _filter(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Temperature-scaled logits with top-k, top-p and min-p applied (-inf outside)."""
    logits = logits / p.temperature
    if p.top_k > 0 and p.top_k < logits.shape[-1]:
        kth = logits.topk(p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= p.top_p  # keep the token crossing top_p
        logits = logits.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    if p.min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return logits


def legacy_sample(logits: torch.Tensor, rows: list[SamplingRow], stop_ids: list[set[int]],
                  default_generator: torch.Generator) -> list[SampleResult]:
    """logits: [N, vocab] float32, one row per request that samples this step.
    stop_ids[i] are the tokens banned while row i is below its min_tokens."""
    raw_logprobs = None
    if any(r.params.logprobs is not None for r in rows):
        raw_logprobs = torch.log_softmax(logits, dim=-1)
    greedy_all = all(r.params.greedy and not r.params.needs_penalties and not r.params.min_tokens
                     for r in rows)
    if greedy_all:  # fast path: one argmax for the whole batch
        fast = cpu.available(logits.device, logits.dtype) and logits.is_contiguous()
        token_ids = (cpu.argmax(logits) if fast else logits.argmax(dim=-1)).tolist()
    else:
        logits = logits.clone()
        token_ids = []
        for i, row in enumerate(rows):
            row_logits = logits[i]
            if row.params.needs_penalties:
                _apply_penalties(row_logits, row)
            if len(row.output_token_ids) < row.params.min_tokens and stop_ids[i]:
                banned = torch.tensor(sorted(stop_ids[i]), device=logits.device)
                row_logits[banned] = float("-inf")
            if row.params.greedy:
                token_ids.append(int(row_logits.argmax().item()))
                continue
            probs = _filter(row_logits, row.params).softmax(-1)
            noise = torch.empty_like(probs).exponential_(
                generator=row.generator or default_generator)
            token_ids.append(int((probs / noise).argmax().item()))
    results = []
    for i, (row, token_id) in enumerate(zip(rows, token_ids)):
        lps = None
        if row.params.logprobs is not None:
            lps = top_logprobs(raw_logprobs[i], token_id, row.params.logprobs)
        results.append(SampleResult(token_id, lps))
    return results


# ---- The benchmark ----

def make_logits(rows: int, vocab: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "flat":
        return torch.randn(rows, vocab, generator=gen) * 2
    logits = torch.randn(rows, vocab, generator=gen) * 1.5
    boosted = torch.randint(vocab, (rows, 32), generator=gen)
    logits.scatter_(1, boosted, 10 + 2 * torch.randn(rows, 32, generator=gen))
    return logits


def median_ms(step, repeats: int) -> float:
    step()  # warm-up (and the kernels' build)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run(setting: str, vocab: int, args) -> tuple[float, float, float | None]:
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(**SETTINGS[setting])
    histories = torch.randint(vocab, (args.rows, args.history), generator=gen).tolist()
    logits = make_logits(args.rows, vocab, args.logits, gen)
    ids = [str(i) for i in range(args.rows)]

    legacy_rows = [SamplingRow(params, None, h[:-64], h[-64:]) for h in histories]
    shared = torch.Generator().manual_seed(0)

    def legacy_step():
        for row, r in zip(legacy_rows, legacy_sample(logits, legacy_rows,
                                                     [set()] * args.rows, shared)):
            row.output_token_ids.append(r.token_id)

    def new_step(use_kernel: bool):
        sampler = Sampler(vocab, torch.device("cpu"), 0, use_kernel)
        for i, h in zip(ids, histories):
            sampler.add_request(i, params, h[:-64], h[-64:], [], seed=None)
        return lambda: sampler.sample(logits, ids)

    legacy = median_ms(legacy_step, max(1, args.repeats // 2)) if not args.skip_legacy else None
    torch_ms = median_ms(new_step(False), args.repeats)
    kernel_ms = (median_ms(new_step(True), args.repeats)
                 if cpu.available(torch.device("cpu"), torch.float32) else None)
    return legacy, torch_ms, kernel_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, nargs="+", default=[49152, 151936])
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--history", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--logits", choices=["lm", "flat"], default="lm")
    parser.add_argument("--skip-legacy", action="store_true")
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

    print(f"{'setting':<12} {'vocab':>7} {'old':>9} {'torch':>9} {'C':>9} {'old/C':>7}")
    for setting in args.settings:
        for vocab in args.vocab:
            legacy, torch_ms, kernel_ms = run(setting, vocab, args)
            ratio = f"{legacy / kernel_ms:.0f}x" if legacy and kernel_ms else "-"
            print(f"{setting:<12} {vocab:>7} {fmt(legacy):>9} {fmt(torch_ms):>9} "
                  f"{fmt(kernel_ms):>9} {ratio:>7}", flush=True)


if __name__ == "__main__":
    main()
