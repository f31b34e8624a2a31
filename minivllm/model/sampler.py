"""Sampling: penalties, min_tokens, temperature, top-k / top-p / min-p, per-request seeds,
and logprobs of the model's raw distribution (before any of those adjustments, as vLLM).

Greedy rows take the argmax; each seeded row draws from its own generator, so its output
does not depend on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minivllm.model.kernels import cpu
from minivllm.outputs import Logprob
from minivllm.sampling_params import SamplingParams


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


def sample(logits: torch.Tensor, rows: list[SamplingRow], stop_ids: list[set[int]],
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
