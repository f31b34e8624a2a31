"""Speculative decoding in the scheduler (core/speculative.py): the n-gram proposer, the
config's checks, draft tokens in the step's budget and KV slots, the roll-back past rejected
drafts (no block leaked, no slot read that is not the request's own: the fake model's KV
contents of tests/core/test_scheduler_policies.Sim), the adaptive draft length (priced by the
step times the scheduler is told), disable_by_batch_size and the counters."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.core.policy import POLICIES
from minivllm.core.request import RequestStatus
from minivllm.core.spec_decoding import SpecDecoding
from minivllm.core.speculative import (
    DraftTracker,
    SpeculativeConfig,
    best_draft_length,
    expected_tokens,
    ngram_propose,
    parse_speculative_config,
)
from tests.core.test_scheduler_policies import Sim

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}


class RepeatingSim(Sim):
    """A fake model that continues its history with period `period` (what prompt lookup
    predicts), except for a random token with probability `noise`."""

    def __init__(self, period: int = 5, noise: float = 0.0, seed: int = 0, **config) -> None:
        super().__init__(**config)
        self.period, self.noise, self.noise_rng = period, noise, random.Random(seed)

    def next_token(self, history: list[int]) -> int:
        if len(history) < self.period or self.noise_rng.random() < self.noise:
            return self.noise_rng.randrange(997)
        return history[-self.period]


def test_ngram_proposes_what_followed_the_latest_match_longest_first():
    assert ngram_propose([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2, 1, 3) == [7, 1]
    # the 3-gram (5, 1, 2) occurs once, the 2-gram (1, 2) later: the longer match wins
    assert ngram_propose([5, 1, 2, 8, 1, 2, 6, 5, 1, 2], 1, 2, 3) == [8]
    assert ngram_propose([1, 2, 3, 4], 3, 1, 3) == []  # nothing repeats
    assert ngram_propose([4, 4], 5, 1, 1) == [4]  # what follows stops at the end
    assert ngram_propose([1, 2, 1, 2], 0, 1, 2) == []


def test_config_checks_name_the_key():
    assert SpeculativeConfig.parse('{"method": "ngram"}').num_speculative_tokens == 3
    for bad, match in [
        ('{"method": "ngram", "num_speculative_token": 3}', "unknown key.*num_speculative_token"),
        ('{"method": "medusa"}', "method is not implemented in minivllm yet"),
        ('{"method": "magic"}', "method must be one of ngram"),
        ('{"num_speculative_tokens": 0}', "num_speculative_tokens must be an integer in"),
        ('{"prompt_lookup_min": 4, "prompt_lookup_max": 2}', "prompt_lookup_min must be <="),
        ('{"disable_by_batch_size": 0}', "disable_by_batch_size must be"),
        ('{"method": "draft_model"}', "model must name the draft model's directory"),
        ('{"method": "suffix", "model": "x"}', "model must name .* only then"),
        ('{"method": "suffix", "suffix_decoding_max_tree_depth": 1}',
         "suffix_decoding_max_tree_depth must be an integer in"),
        ('{"suffix_decoding_min_token_prob": 2}', "suffix_decoding_min_token_prob must be in"),
        ("[3]", "must be a JSON object"),
        ("{method: ngram}", "not valid JSON"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_speculative_config(bad)


def test_drafts_count_in_the_budget_get_slots_and_roll_back():
    sim = RepeatingSim(period=4, block_size=2, num_blocks=32, speculative_config=NGRAM)
    request = sim.add("r", prompt=[1, 2, 3, 4, 1, 2, 3, 4], max_tokens=12)
    sim.step()  # the prefill samples one token
    out = sim.step()
    drafts = out.scheduled_spec_decode_tokens["r"]
    assert drafts == [2, 3, 4] and out.num_scheduled_tokens["r"] == 4
    assert request.num_output_tokens == 1 + 4  # all three accepted, and one more
    assert request.num_computed_tokens == request.num_tokens - 1
    sim.run()
    assert request.output_token_ids == ([1, 2, 3, 4] * 3)
    assert request.status is RequestStatus.FINISHED_LENGTH
    stats = sim.scheduler.stats()
    assert stats.spec_num_draft_tokens >= stats.spec_num_accepted_tokens > 0
    assert stats.spec_num_drafts == len(
        [o for o in sim.outputs if o.scheduled_spec_decode_tokens])
    sim.assert_all_free()


def test_rejected_drafts_release_the_blocks_only_they_needed():
    sim = RepeatingSim(period=4, block_size=2, num_blocks=32, speculative_config=NGRAM)
    request = sim.add("r", prompt=[1, 2, 3, 4, 1, 2, 3, 4], max_tokens=12)
    sim.step()
    sim.next_token = lambda history: 999  # the model now disagrees with every draft
    out = sim.step()
    assert out.scheduled_spec_decode_tokens["r"]
    assert request.output_token_ids[-1] == 999 and request.num_new_tokens == 1
    assert request.num_computed_tokens == 9 and len(request.block_ids) == 5  # 10 tokens
    assert sim.scheduler.stats().spec_num_accepted_tokens == 0


def test_drafts_never_pass_max_tokens_and_a_stop_inside_them_ends_the_request():
    sim = RepeatingSim(period=2, block_size=4, num_blocks=32,
                       speculative_config={**NGRAM, "num_speculative_tokens": 8})
    short = sim.add("short", prompt=[5, 6, 5, 6], max_tokens=3)
    sim.run()
    assert short.output_token_ids == [5, 6, 5]
    assert all(len(o.scheduled_spec_decode_tokens.get("short", ())) <= 1 for o in sim.outputs)
    sim = RepeatingSim(period=2, block_size=4, num_blocks=32, speculative_config=NGRAM)
    sim.scheduler.eos_token_ids = frozenset({6})
    stopped = sim.add("eos", prompt=[5, 6, 5, 6, 5], max_tokens=10)
    sim.step()
    assert stopped.output_token_ids == [6] and stopped.status is RequestStatus.FINISHED_STOPPED
    sim = RepeatingSim(period=2, block_size=4, num_blocks=32, speculative_config=NGRAM)
    sim.scheduler.eos_token_ids = frozenset({7})
    request = sim.add("eos2", prompt=[5, 6, 5, 6, 5, 6, 7, 5, 6, 5], max_tokens=10)
    sim.next_token = lambda history: 7 if history[-2:] == [5, 6] else 5 + (history[-1] == 5)
    sim.run()  # drafts [6, 7, 5]: 6 and 7 accepted, the request ends at 7, 5 is dropped
    assert request.output_token_ids == [6, 7]
    assert request.status is RequestStatus.FINISHED_STOPPED
    sim.assert_all_free()


def test_no_drafts_above_disable_by_batch_size():
    config = {**NGRAM, "disable_by_batch_size": 2}
    sim = RepeatingSim(period=2, block_size=4, num_blocks=64, speculative_config=config)
    for i in range(3):
        sim.add(f"r{i}", prompt=[1, 2, 1, 2, 1, 2], max_tokens=6)
    sim.step()
    while len(sim.scheduler.running) > 2:
        assert not sim.step().scheduled_spec_decode_tokens
    sim.run()
    sim.assert_all_free()


def test_the_draft_length_maximizes_tokens_per_second_at_the_row_cost():
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    # The same acceptance: long drafts where a row is cheap (one pass over the weights
    # verifies them all), shorter as it costs more of a step, none where it costs a step.
    lengths = [best_draft_length(0.7, 8, cost) for cost in (0.0, 0.02, 0.1, 0.5, 1.0)]
    assert lengths == [8, 8, 4, 1, 0]
    # The same row cost: shorter drafts as the acceptance falls.
    assert [best_draft_length(a, 8, 0.1) for a in (0.9, 0.7, 0.5, 0.05)] == [8, 4, 2, 0]


def test_draft_length_follows_the_acceptance_and_probes_when_off():
    tracker = DraftTracker()
    assert tracker.draft_length(4, 0.1) == 4
    tracker.record(4, 1)  # one accepted, the second rejected
    assert tracker.acceptance == pytest.approx(1.7 / 2.7)
    for _ in range(3):
        tracker.record(4, 0)
    assert 0.1 < tracker.acceptance < 0.4 and 1 <= tracker.draft_length(4, 0.1) < 4
    for _ in range(5):
        tracker.record(4, 0)
    lengths = [tracker.draft_length(4, 0.1) for _ in range(32)]
    assert lengths.count(1) == 2 and lengths.count(0) == 30  # a probe every 16 steps
    tracker.record(1, 1)
    tracker.record(1, 1)
    assert tracker.draft_length(4, 0.1) > 0


def drafts_per_verification(row_seconds: float, adaptive: bool = True) -> float:
    """A request whose next token is the prompt lookup's 80% of the time, its steps timed as
    1 s plus row_seconds per row: the mean draft length it verifies."""
    sim = RepeatingSim(period=8, noise=0.2, seed=1, block_size=4, num_blocks=256,
                       speculative_config={**NGRAM, "num_speculative_tokens": 6,
                                           "adaptive_draft_length": adaptive})
    sim.add("r", prompt=list(range(1, 9)) * 2, max_tokens=300)
    while sim.scheduler.has_unfinished_requests():
        out = sim.step()
        sim.scheduler.record_step_time(1.0 + row_seconds * out.total_num_scheduled_tokens)
    stats = sim.scheduler.stats()
    return stats.spec_num_draft_tokens / stats.spec_num_drafts


def test_the_scheduler_prices_drafts_by_the_step_times_it_is_told():
    cheap, dear = drafts_per_verification(0.02), drafts_per_verification(0.8)
    assert cheap > 5 and dear < 3.5, (cheap, dear)
    assert drafts_per_verification(0.8, adaptive=False) > 5  # not adaptive: the full length
    spec = SpecDecoding(SpeculativeConfig(), None, None)
    assert spec.row_cost(1) == 0.0  # nothing timed yet: drafts priced as free


@settings(max_examples=200, deadline=None)
@given(policy=st.sampled_from(sorted(POLICIES)),
       block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(6, 24),
       num_swap_blocks=st.integers(0, 12), max_num_batched_tokens=st.integers(2, 24),
       enable_prefix_caching=st.booleans(), enable_chunked_prefill=st.just(True),
       preemption_mode=st.sampled_from([None, "recompute", "swap"]),
       method=st.sampled_from(["ngram", "suffix"]),
       k=st.integers(1, 5), period=st.integers(1, 4), noise=st.sampled_from([0.0, 0.2, 0.6]),
       seed=st.integers(0, 1000),
       requests=st.lists(st.tuples(st.integers(0, 6), st.integers(1, 12), st.integers(1, 12),
                                   st.integers(1, 3)), min_size=1, max_size=6))
def test_random_speculation_loses_nothing_leaks_nothing_reads_only_its_own_kv(
        policy, method, k, period, noise, seed, requests, **config):
    """Random traffic with drafts accepted and rejected at random: the Sim checks budgets,
    block accounting and every KV slot read at every step."""
    sim = RepeatingSim(period=period, noise=noise, seed=seed, policy=policy,
                       speculative_config={**NGRAM, "method": method,
                                           "num_speculative_tokens": k}, **config)
    capacity = config["num_blocks"] * config["block_size"]
    accepted = []
    for step in range(400):
        for i, (when, prompt_len, max_tokens, n) in enumerate(requests):
            if when == step and prompt_len + max_tokens <= capacity:
                prompt = [(i + j) % period for j in range(prompt_len)]
                try:
                    accepted.append(sim.add(f"r{i}", prompt=prompt, max_tokens=max_tokens, n=n))
                except ValueError:  # n seats or blocks it could never have
                    pass
        if step > 6 and not sim.scheduler.has_unfinished_requests():
            break
        sim.step()
    assert not sim.scheduler.has_unfinished_requests(), "a request never finished"
    for request in sim.requests.values():
        assert request.num_output_tokens <= request.max_tokens
    sim.assert_all_free()


def test_no_drafts_after_a_prompt_chunk_of_one_token():
    """A chunk of one prompt token with more to compute (a group of n = 2's head holds its
    last prompt token back until the others can fork) is scheduled without drafts: drafts
    follow a request's last token only (drafts there once left a draft model's request
    unsampled, stuck at that prompt token, step after step)."""
    sim = RepeatingSim(period=4, block_size=4, num_blocks=64, max_num_batched_tokens=6,
                       speculative_config={**NGRAM, "num_speculative_tokens": 2,
                                           "adaptive_draft_length": False})
    sim.add("a", prompt=[1, 2, 3, 4] * 2, max_tokens=30, n=2)  # 6 tokens, then 1 of 2
    drafted_in_prefill = 0
    while sim.scheduler.has_unfinished_requests():
        requests = sim.scheduler.requests
        before = {r: (q.num_computed_tokens, q.num_tokens) for r, q in requests.items()}
        out = sim.step()
        for req_id in out.scheduled_spec_decode_tokens:
            computed, total = before[req_id]
            drafted_in_prefill += computed + 1 < total
    assert drafted_in_prefill == 0
    assert sim.scheduler.stats().spec_num_draft_tokens > 0
