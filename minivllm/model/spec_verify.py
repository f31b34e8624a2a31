"""Verifying draft tokens: a request with k drafts has k + 1 rows of logits (after its last
token and after each draft); position j = 0, 1, ... keeps draft j or ends the request's
tokens this step with one of the target's.

Deterministic drafts (prompt lookup, suffix, and a draft model's for greedy requests): the
draft is kept iff the target model, sampling at that position exactly as it would without
speculation, picks the same token. This is rejection sampling with a proposal q that puts
all its mass on the draft d — accept d with probability min(1, p(d) / q(d)) = p(d), else draw
from p without d — in another form with the same law: "draw x from p, keep d iff x == d,
else emit x". The sampler's draw is a function of the request's seed and output position
(model/sampler.py), and its state (penalties, min_tokens, the grammar's matcher) advances one
accepted token at a time, so each position is sampled with exactly the state and the random
number it would have had without speculation: the output is the same tokens, seeded or
greedy, up to the floating-point differences between a one-token decode and a (k + 1)-token
verification row.

Sampled drafts (a draft model's, for a request that samples: `proposals`, the draft's
distribution q at each draft): speculative sampling (Leviathan et al., Chen et al.). Draft d
was drawn from q; it is kept with probability min(1, p(d) / q(d)), p being the target's
distribution at that position (the request's grammar, penalties, temperature and filters,
Sampler.probabilities); on the first rejection the token is drawn from the residual
max(0, p - q), normalized, and the request's tokens end there; if every draft is kept, the
target's own next token follows. Each position's token is then distributed as p exactly,
whatever q is, and a q close to p keeps most drafts (the chance is the sum of min(p, q)),
where a deterministic proposal is kept with probability p(d) only. Its random numbers are
functions of the request's seed and output position, one stream each for the draft's draw,
the acceptance test and the residual draw: a seeded request with the same drafts draws the
same tokens. Logprobs are the target's, per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minivllm.model.sampler import Sampler, inverse_cdf
from minivllm.outputs import Logprob

# Sampler.uniforms streams (0 is the sampler's own draw)
DRAFT_STREAM, ACCEPT_STREAM, RESIDUAL_STREAM = 1, 2, 3


@dataclass
class Verified:
    token_ids: list[int] = field(default_factory=list)  # accepted drafts, then the target's
    logprobs: list[dict[int, Logprob] | None] = field(default_factory=list)


def sample_with_drafts(sampler: Sampler, logits: torch.Tensor,
                       rows: list[tuple[str, int, list[int]]],
                       proposals: dict[str, torch.Tensor] | None = None
                       ) -> dict[str, Verified]:
    """rows: (request id, its first row in `logits`, its drafts). proposals: request id ->
    its drafts' distributions [k, V] where they were sampled (speculative sampling), else
    the drafts are deterministic. Position j of every request still accepting is decided
    together, j = 0, 1, ...: row 0 is the usual next-token sample (all a request without
    drafts gets)."""
    proposals = proposals or {}
    results = {req_id: Verified() for req_id, _, _ in rows}
    alive, j = rows, 0
    while alive:
        sampled = [r for r in alive if r[0] in proposals and j < len(r[2])]
        drawn = [r for r in alive if not (r[0] in proposals and j < len(r[2]))]
        still = _speculative(sampler, logits, sampled, proposals, j, results)
        if drawn:
            index = torch.tensor([at + j for _, at, _ in drawn], device=logits.device)
            out = sampler.sample(logits[index].contiguous(), [req_id for req_id, _, _ in drawn])
            for (req_id, at, drafts), token, logprobs in zip(drawn, out.token_ids, out.logprobs):
                verified = results[req_id]
                verified.token_ids.append(token)
                verified.logprobs.append(logprobs)
                if j < len(drafts) and token == drafts[j]:
                    still.append((req_id, at, drafts))
        alive, j = still, j + 1
    return results


def _speculative(sampler: Sampler, logits: torch.Tensor, rows: list, proposals: dict,
                 j: int, results: dict[str, Verified]) -> list:
    """Draft j of each of `rows` (sampled drafts) kept with probability min(1, p / q), else
    the token drawn from the residual; the rows that go on to position j + 1."""
    if not rows:
        return []
    ids = [req_id for req_id, _, _ in rows]
    raw = logits[torch.tensor([at + j for _, at, _ in rows], device=logits.device)]
    p = sampler.probabilities(raw, ids).cpu()
    q = torch.stack([proposals[req_id][j] for req_id in ids]).double().cpu()
    drafts = torch.tensor([d[j] for _, _, d in rows])
    u_accept = sampler.uniforms(ids, ACCEPT_STREAM)
    u_residual = sampler.uniforms(ids, RESIDUAL_STREAM)
    at = torch.arange(len(rows))
    keep = (u_accept * q[at, drafts] < p[at, drafts]).tolist()
    residual = (p - q).clamp(min=0)
    empty = residual.sum(dim=1) <= 0  # p == q up to rounding: rejection is then p's draw
    residual[empty] = p[empty]
    corrected = inverse_cdf(residual, u_residual).tolist()
    still = []
    for i, row in enumerate(rows):
        token = int(drafts[i]) if keep[i] else corrected[i]
        verified = results[row[0]]
        verified.token_ids.append(token)
        verified.logprobs.append(sampler.record(row[0], token, raw[i]))
        if keep[i]:
            still.append(row)
    return still
