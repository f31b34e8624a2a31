"""Draft verification (model/spec_verify.py) keeps the target model's distribution: over many
seeded requests with a fixed draft, the first token follows the model's distribution at that
position (chi-square), a draft is accepted exactly when the model's own draw equals it, and
the token after an accepted draft follows the next position's distribution; with sampled
drafts (speculative sampling) the same, at the acceptance rate sum(min(p, q))."""

from __future__ import annotations

import pytest
import torch

from minivllm.model.sampler import Sampler, inverse_cdf
from minivllm.model.spec_verify import DRAFT_STREAM, sample_with_drafts
from minivllm.sampling_params import SamplingParams

VOCAB = 8
# chi-square critical value for 7 degrees of freedom at p = 0.001
CHI2_7DF_P001 = 24.32


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_verified_tokens_follow_the_target_distribution():
    n = 6000
    torch.manual_seed(0)
    rows = torch.randn(2, VOCAB) * 1.5
    logits = rows.repeat(n, 1)  # request i: rows 2i (after its last token), 2i + 1 (after d)
    probs = torch.softmax(rows, dim=-1)
    draft = int(probs[0].argsort()[-2])  # a likely token, not the likeliest
    sampler = Sampler(VOCAB, torch.device("cpu"), seed=0, use_kernel=True)
    params = SamplingParams(temperature=1.0)
    plan = []
    for i in range(n):
        sampler.add_request(f"r{i}", params, [1], [], (), seed=i)
        plan.append((f"r{i}", 2 * i, [draft]))
    verified = sample_with_drafts(sampler, logits, plan)
    first = torch.bincount(torch.tensor([v.token_ids[0] for v in verified.values()]),
                           minlength=VOCAB).double()
    assert chi_square(first, probs[0].double()) < CHI2_7DF_P001
    accepted = [v for v in verified.values() if v.token_ids[0] == draft]
    assert all(len(v.token_ids) == 2 for v in accepted)  # accepted: one more token
    assert all(len(v.token_ids) == 1 for v in verified.values() if v.token_ids[0] != draft)
    second = torch.bincount(torch.tensor([v.token_ids[1] for v in accepted]),
                            minlength=VOCAB).double()
    assert chi_square(second, probs[1].double()) < CHI2_7DF_P001


def test_each_position_is_drawn_as_without_drafts():
    """A seeded request's tokens with drafts are the tokens it samples one at a time."""
    torch.manual_seed(1)
    steps = torch.randn(4, VOCAB)
    params = SamplingParams(temperature=0.9, top_p=0.9, repetition_penalty=1.3)
    alone = Sampler(VOCAB, torch.device("cpu"), seed=0, use_kernel=True)
    alone.add_request("r", params, [1, 2], [], (), seed=5)
    expected = [alone.sample(steps[j:j + 1].contiguous(), ["r"]).token_ids[0] for j in range(4)]
    drafted = Sampler(VOCAB, torch.device("cpu"), seed=0, use_kernel=True)
    drafted.add_request("r", params, [1, 2], [], (), seed=5)
    got = sample_with_drafts(drafted, steps, [("r", 0, expected[:3])])["r"].token_ids
    assert got == expected
    wrong = [expected[0], (expected[1] + 1) % VOCAB, expected[2]]
    drafted = Sampler(VOCAB, torch.device("cpu"), seed=0, use_kernel=True)
    drafted.add_request("r", params, [1, 2], [], (), seed=5)
    assert sample_with_drafts(drafted, steps, [("r", 0, wrong)])["r"].token_ids == expected[:2]


def speculative_tokens(p_logits: torch.Tensor, q: torch.Tensor, n: int,
                       params: SamplingParams) -> list[list[int]]:
    """n seeded requests, each with 2 drafts drawn from q (as the draft model draws them:
    its own stream of uniforms), verified against the target's logits rows p_logits [3, V]."""
    sampler = Sampler(VOCAB, torch.device("cpu"), seed=0, use_kernel=True)
    plan, proposals = [], {}
    for i in range(n):
        sampler.add_request(f"r{i}", params, [1], [], (), seed=i)
        u = [sampler.uniforms([f"r{i}"], DRAFT_STREAM, j) for j in range(2)]
        drafts = [int(inverse_cdf(q[j:j + 1], u[j])) for j in range(2)]
        plan.append((f"r{i}", 3 * i, drafts))
        proposals[f"r{i}"] = q[:2]
    verified = sample_with_drafts(sampler, p_logits.repeat(n, 1), plan, proposals)
    return [v.token_ids for v in verified.values()]


def test_speculative_sampling_keeps_the_target_distribution():
    """Drafts drawn from a q far from p: each position's token (the first; the second,
    given the first draft was kept) follows p (chi-square), drafts are kept at the rate
    sum(min(p, q)), and every rejection ends the request's tokens there. A residual drawn
    from p instead of max(0, p - q) fails the first check (tried by mutation)."""
    n = 20000
    torch.manual_seed(3)
    p_logits = torch.randn(3, VOCAB) * 1.5
    p = torch.softmax(p_logits, dim=-1).double()
    q = torch.softmax(torch.randn(3, VOCAB) * 1.5, dim=-1).double()
    tokens = speculative_tokens(p_logits, q, n, SamplingParams(temperature=1.0))
    first = torch.bincount(torch.tensor([t[0] for t in tokens]), minlength=VOCAB).double()
    assert chi_square(first, p[0]) < CHI2_7DF_P001
    kept = [t for t in tokens if len(t) > 1]
    assert len(kept) / n == pytest.approx(float(torch.minimum(p[0], q[0]).sum()), abs=0.015)
    second = torch.bincount(torch.tensor([t[1] for t in kept]), minlength=VOCAB).double()
    assert chi_square(second, p[1]) < CHI2_7DF_P001
    assert all(len(t) in (1, 2, 3) for t in tokens)


def test_speculative_sampling_under_top_p_and_penalties():
    """p is the request's own distribution: its penalties and filters apply to the target's
    logits (here top-p and a repetition penalty on the prompt's token 1), not to q."""
    n = 20000
    torch.manual_seed(4)
    p_logits = torch.randn(3, VOCAB) * 1.5
    params = SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.5)
    sampler = Sampler(VOCAB, torch.device("cpu"), seed=0, use_kernel=True)
    sampler.add_request("ref", params, [1], [], (), seed=0)
    p = sampler.probabilities(p_logits[:1], ["ref"])[0]
    q = torch.full((3, VOCAB), 1.0 / VOCAB, dtype=torch.float64)
    tokens = speculative_tokens(p_logits, q, n, params)
    first = torch.bincount(torch.tensor([t[0] for t in tokens]), minlength=VOCAB).double()
    support = p > 0
    assert first[~support].sum() == 0  # top-p's dropped tokens never come out
    expected = p[support] * n
    chi = float(((first[support] - expected) ** 2 / expected).sum())
    assert chi < CHI2_7DF_P001


def test_a_seeded_request_draws_the_same_tokens_again():
    torch.manual_seed(5)
    p_logits, q = torch.randn(3, VOCAB), torch.softmax(torch.randn(3, VOCAB), dim=-1).double()
    params = SamplingParams(temperature=1.0)
    assert speculative_tokens(p_logits, q, 50, params) == speculative_tokens(p_logits, q, 50,
                                                                             params)
