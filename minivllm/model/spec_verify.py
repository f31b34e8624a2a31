"""Verifying draft tokens exactly: a request with k drafts has k + 1 rows of logits (after
its last token and after each draft), and keeps each draft only if the target model, sampling
at that position exactly as it would without speculation, picks the same token.

Why this is exact, greedy and sampled alike: the drafts here are deterministic (a proposal
q puts all its mass on one token d), and then rejection sampling's rule — accept d with
probability min(1, p(d) / q(d)) = p(d), else draw from p without d — gives the same law as
"draw x from p, keep d iff x == d, else emit x". The sampler's draw is a function of the
request's seed and output position (model/sampler.py), and its state (penalties, min_tokens,
the grammar's matcher) advances one accepted token at a time, so each position is sampled
with exactly the state and the random number it would have had without speculation: the
output is the same tokens, seeded or greedy, up to the floating-point differences between a
one-token decode and a (k + 1)-token verification row. Logprobs are the target's, per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minivllm.model.sampler import Sampler
from minivllm.outputs import Logprob


@dataclass
class Verified:
    token_ids: list[int] = field(default_factory=list)  # accepted drafts, then the target's
    logprobs: list[dict[int, Logprob] | None] = field(default_factory=list)


def sample_with_drafts(sampler: Sampler, logits: torch.Tensor,
                       rows: list[tuple[str, int, list[int]]]) -> dict[str, Verified]:
    """rows: (request id, its first row in `logits`, its drafts). Position j of every request
    still accepting is sampled in one sampler call, j = 0, 1, ...: row 0 is the usual
    next-token sample (all a request without drafts gets)."""
    results = {req_id: Verified() for req_id, _, _ in rows}
    alive, j = rows, 0
    while alive:
        index = torch.tensor([at + j for _, at, _ in alive], device=logits.device)
        out = sampler.sample(logits[index].contiguous(), [req_id for req_id, _, _ in alive])
        still = []
        for (req_id, at, drafts), token, logprobs in zip(alive, out.token_ids, out.logprobs):
            verified = results[req_id]
            verified.token_ids.append(token)
            verified.logprobs.append(logprobs)
            if j < len(drafts) and token == drafts[j]:
                still.append((req_id, at, drafts))
        alive, j = still, j + 1
    return results
