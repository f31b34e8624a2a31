"""What the scheduler remembers between steps to rank and look up faster -- sjf's predictions
(ShortestJobFirstPolicy.predicted_output) and the prefix hits a waiting request keeps after an
eviction (KVCacheManager.find_cached_blocks) -- changes no decision: each policy, on a
saturated seeded trace, with and without active preemption, schedules exactly as the plain
path does, which asks the predictor at every sort and looks every hit up from scratch."""

from __future__ import annotations

import pytest

from minivllm.core.kv_cache import KVCacheManager
from minivllm.core.length_predictor import LENGTH_PREDICTORS
from minivllm.core.policies.sjf import ShortestJobFirstPolicy
from tests.core.test_unranked_waiting import TRACES
from tests.core.test_unranked_waiting import simulate as run

CASES = ([("sjf", predictor) for predictor in sorted(LENGTH_PREDICTORS)]
         + [(policy, "mean") for policy in ("fcfs", "priority", "mlfq", "residual_sjf",
                                            "hrrn", "edf")])


def plain_path(monkeypatch) -> None:
    """Ask the predictor at every sort; look a request's prefix hits up as if never before."""
    lookup = KVCacheManager.find_cached_blocks

    def from_scratch(kv: KVCacheManager, request):
        kv.prefix_cache._verified_hits.pop(request.request_id, None)
        return lookup(kv, request)

    monkeypatch.setattr(KVCacheManager, "find_cached_blocks", from_scratch)
    monkeypatch.setattr(ShortestJobFirstPolicy, "predicted_output",
                        lambda policy, request: policy.predictor.predict(request))


@pytest.mark.parametrize("trace_name", sorted(TRACES))
@pytest.mark.parametrize("active", [False, True], ids=["plain", "active-preemption"])
@pytest.mark.parametrize("policy, predictor", CASES)
def test_remembered_ranks_and_hits_change_no_decision(monkeypatch, policy, predictor, active,
                                                      trace_name):
    decisions, requests, stats = run(policy, predictor, active, trace_name)
    plain_path(monkeypatch)
    ref_decisions, ref_requests, ref_stats = run(policy, predictor, active, trace_name)
    assert stats["peak_num_waiting"] >= 5  # saturated: requests queue
    assert decisions == ref_decisions
    assert requests == ref_requests
    assert stats == ref_stats
