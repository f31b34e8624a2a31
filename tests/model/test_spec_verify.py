"""Draft verification (model/spec_verify.py) keeps the target model's distribution: over many
seeded requests with a fixed draft, the first token follows the model's distribution at that
position (chi-square), a draft is accepted exactly when the model's own draw equals it, and
the token after an accepted draft follows the next position's distribution."""

from __future__ import annotations

import torch

from minivllm.model.sampler import Sampler
from minivllm.model.spec_verify import sample_with_drafts
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
