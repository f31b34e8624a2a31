"""The scheduler leaves the waiting queue unranked in a step where no order of it could admit
a request (Scheduler.skip_futile_ranking): every policy, with every length predictor for
those that rank by one, makes the same decisions as when it ranks at every step -- mlfq,
whose levels are set when first asked, and the probe, whose ridge refits when asked,
included. On a saturated seeded trace, with and without active preemption."""

from __future__ import annotations

import numpy as np
import pytest

from minivllm.bench.workload import Trace, TraceEntry, seed_trace
from minivllm.core.length_predictor import LENGTH_PREDICTORS
from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.policy import POLICIES
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.sim.simulator import Simulator
from tests.sim.test_sim import FakeCost

OPTIONS = {"edf": {"ttft_slo_ms": 40_000.0}, "goodput": {"ttft_slo_ms": 40_000.0}}
CASES = [(policy, predictor) for policy in sorted(POLICIES)
         for predictor in (sorted(LENGTH_PREDICTORS)
                           if getattr(POLICIES[policy], "uses_length_predictor", True)
                           else ["mean"])]


def shared_prefix_trace(n: int = 70, seed: int = 5) -> Trace:
    """Prompts that start with blocks from a small pool (a Mooncake-like trace: hash id h
    is 8 given tokens), so what the prefix cache holds -- and so mlfq's skip-join levels and
    sjf's ranks -- changes while requests wait."""
    rng = np.random.default_rng(seed)
    entries, t = [], 0.0
    for i in range(n):
        t += float(rng.exponential(0.4))
        prompt = int(rng.integers(12, 100))
        shared = tuple(int(h) for h in rng.choice(6, size=int(rng.integers(0, 4))))
        unique = tuple(1000 + 100 * i + k for k in range(-(-prompt // 8)))
        entries.append(TraceEntry(t, i % 5, prompt, int(rng.integers(2, 14)),
                                  int(prompt > 50), (shared + unique)[:-(-prompt // 8)]))
    return Trace("shared-prefix", entries, prefix_block_tokens=8)


TRACES = {"seed-high": lambda: seed_trace("high", seed=5, length_scale=1 / 256,
                                          max_model_len=128, priority="length",
                                          num_prompts=70),
          "shared-prefix": shared_prefix_trace}


def simulate(policy: str, predictor: str, active: bool, trace_name: str) -> tuple:
    """(the scheduler's decisions, each request's figures, the run's stats) of a small,
    saturated simulated replica (tests/core/test_ranking_memos.py runs it too)."""
    config = SchedulerConfig(num_blocks=48, block_size=4, max_num_batched_tokens=16,
                             max_model_len=128, max_num_seqs=6, active_preemption=active,
                             min_run_quantum=2, num_swap_blocks=16)
    options = {"mlfq_base_quantum": 1} if policy == "mlfq" else OPTIONS.get(policy, {})
    result = Simulator(config, policy, FakeCost(), send_priority=policy == "priority",
                       length_predictor=predictor, record_decisions=True,
                       policy_options=options).run(TRACES[trace_name]())
    requests = [(r.ttft, r.e2e, tuple(r.itl), r.output_tokens, r.success, r.error,
                 r.predicted_output_tokens, r.queue_s) for r in result.results]
    return result.decisions, requests, result.stats.as_dict()


def run(policy: str, predictor: str, active: bool, trace_name: str, made: list) -> tuple:
    """simulate's, and the steps the schedulers in `made` left the queue unranked."""
    decisions, requests, stats = simulate(policy, predictor, active, trace_name)
    unranked = sum(s.num_unranked_steps for s in made)
    made.clear()
    return decisions, requests, stats, unranked


@pytest.mark.parametrize("trace_name", sorted(TRACES))
@pytest.mark.parametrize("active", [False, True], ids=["plain", "active-preemption"])
@pytest.mark.parametrize("policy, predictor", CASES)
def test_unranked_steps_change_no_decision(monkeypatch, policy, predictor, active, trace_name):
    made: list[Scheduler] = []
    init = Scheduler.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(Scheduler, "__init__", recording_init)
    decisions, requests, stats, unranked = run(policy, predictor, active, trace_name, made)
    monkeypatch.setattr(Scheduler, "skip_futile_ranking", False)
    ref_decisions, ref_requests, ref_stats, ref_unranked = run(policy, predictor, active,
                                                                trace_name, made)
    assert ref_unranked == 0
    assert stats["peak_num_waiting"] >= 5  # saturated: requests queue
    assert decisions == ref_decisions
    assert requests == ref_requests
    assert stats == ref_stats
    if POLICIES[policy].unranked is not SchedulingPolicy.unranked:  # one that can skip did
        assert unranked > 0


def _request(i: int, hidden: list[float] | None, outputs: int = 0):
    from minivllm.core.request import Request

    request = Request.make(str(i), list(range(5 + i)), 64)
    request.prompt_hidden = hidden
    for k in range(outputs):
        request.append_output_token(-1 - k)
    return request


@pytest.mark.parametrize("hidden", [True, False], ids=["prefilled", "not-prefilled"])
def test_the_probe_refits_when_unasked_as_when_asked(hidden):
    """The ridge refits lazily, when a prefilled request is predicted: `unasked` must refit
    exactly then, or a later prediction would come from another fit."""
    import copy

    from minivllm.core.length_predictor import ProbePredictor

    rng = np.random.default_rng(0)
    probe = ProbePredictor(min_samples=4)
    for i in range(6):
        probe.observe(_request(i, rng.normal(size=8).tolist(), outputs=int(rng.integers(2, 30))))
    probe.predict(_request(50, rng.normal(size=8).tolist()))  # a first fit, at 6 samples
    for i in range(6, 9):  # grown by more than a quarter: the next prediction refits
        probe.observe(_request(i, rng.normal(size=8).tolist(), outputs=int(rng.integers(2, 30))))
    queued = [_request(60 + i, rng.normal(size=8).tolist() if hidden else None)
              for i in range(3)]
    asked, unasked = probe, copy.deepcopy(probe)
    for request in queued:
        asked.predict(request)
    assert unasked.unasked(queued) is True
    assert unasked.ridge.fitted_n == asked.ridge.fitted_n == (9 if hidden else 6)
    assert np.array_equal(unasked.ridge.weights, asked.ridge.weights)


def test_mlfq_sets_skip_join_levels_when_unranked_as_when_ranked():
    """A new request's level comes from what the prefix cache holds when it is first asked."""
    from minivllm.core.policies.mlfq import MultiLevelFeedbackQueuePolicy

    cached = {"now": 0}
    requests = [_request(40 + i, None) for i in range(3)]  # 45-47 prompt tokens
    levels = {}
    for way in ("ranked", "unranked"):
        policy = MultiLevelFeedbackQueuePolicy(mlfq_base_quantum=1)
        policy.attach(lambda r: cached["now"], token_budget=4)
        cached["now"] = 0  # first asked with nothing cached: 12 prefill steps, level 4
        if way == "ranked":
            policy.order(requests, 0.0)
        else:
            assert policy.unranked(requests, 0.0) is True
        cached["now"] = 40  # then most of the prompt is cached: it would join at level 1
        levels[way] = [policy.level(r) for r in requests]
    assert levels["ranked"] == levels["unranked"] == [4, 4, 4]
