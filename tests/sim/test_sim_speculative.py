"""Speculative decoding in the simulator: the scheduler's own drafting and roll-back, drafts
that come true at a given acceptance rate, verification priced as the rows it computes."""

from __future__ import annotations

import pytest

from minivllm.bench.workload import Trace, TraceEntry
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.sim.simulator import Simulator
from tests.sim.test_sim import FakeCost

NGRAM = {"method": "ngram", "num_speculative_tokens": 4}


def run(rate: float | None, spec: dict | None = NGRAM):
    config = SchedulerConfig(num_blocks=400, block_size=4, max_num_batched_tokens=64,
                             max_model_len=256, speculative_config=spec)
    trace = Trace("spec", [TraceEntry(0.0, i, 8, 40) for i in range(2)])
    return Simulator(config, "fcfs", FakeCost(), spec_acceptance_rate=rate).run(trace)


def test_accepted_drafts_cut_the_steps_and_the_rate_is_the_acceptance():
    plain = run(None, None)
    assert plain.stats.scheduler.spec_num_draft_tokens == 0
    for rate in (0.5, 0.9):
        result = run(rate)
        stats = result.stats
        assert all(r.success and r.output_tokens == 40 for r in result.results)
        assert stats.num_steps < plain.stats.num_steps
        # k = 4 drafts a step: accepted while right, so fewer than rate * drafted
        assert 0 < stats.scheduler.spec_num_accepted_tokens < rate * stats.scheduler.spec_num_draft_tokens
    assert run(0.9).stats.num_steps < run(0.5).stats.num_steps
    every = run(1.0)
    spec = every.stats.scheduler
    assert spec.spec_num_accepted_tokens > 0.9 * spec.spec_num_draft_tokens


def test_an_acceptance_rate_needs_a_speculative_config():
    with pytest.raises(ValueError, match="spec_acceptance_rate needs a speculative_config"):
        run(0.5, None)
    with pytest.raises(ValueError, match=r"spec_acceptance_rate must be in \[0, 1\]"):
        run(1.5)
