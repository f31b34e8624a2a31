"""The policy zoo in the simulator: tenants from the trace's users reach vtc, edf's sheds fail
their requests, and the recompute tax is in every summary."""

from __future__ import annotations

import pytest

from minivllm.bench import report
from minivllm.bench.workload import Trace, TraceEntry
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.sim.simulator import Simulator
from tests.sim.test_sim import FakeCost


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{"num_blocks": 100, "block_size": 4, "max_num_batched_tokens": 8,
                              "max_model_len": 64, **kw})


def test_vtc_shares_between_the_traces_users():
    """User 1 sends 10 requests at once, user 2 one a little later: vtc serves user 2's next,
    fcfs after all of user 1's."""
    entries = [TraceEntry(0.0, 1, 4, 4) for _ in range(10)] + [TraceEntry(0.5, 2, 4, 4)]
    first = {}
    for policy in ("fcfs", "vtc"):
        results = Simulator(config(max_num_seqs=1), policy, FakeCost()).run(
            Trace("two users", entries)).results
        first[policy] = sorted(results, key=lambda r: r.start + r.ttft).index(results[-1])
    assert first == {"fcfs": 10, "vtc": 1}


def test_edf_sheds_fail_their_requests():
    entries = [TraceEntry(0.0, 1, 4, 8), TraceEntry(0.0, 2, 4, 2), TraceEntry(0.0, 3, 4, 2)]
    result = Simulator(config(max_num_seqs=1), "edf", FakeCost(),
                       policy_options={"ttft_slo_ms": 5000.0, "edf_action": "shed"}).run(
        Trace("deadlines", entries))
    # One at a time, 1.4 s for a prefill and 1 s a token: the first takes ~9 s, so the two
    # behind it pass their 5 s TTFT deadline while queued.
    assert [r.success for r in result.results] == [True, False, False]
    assert all("shed" in r.error for r in result.results[1:])
    assert result.stats.as_dict()["requests_shed"] == 2


def test_recompute_tax_in_the_summary():
    trace = Trace("tight", [TraceEntry(0.0, 1, 6, 4), TraceEntry(0.0, 2, 6, 4)])
    stats = Simulator(config(num_blocks=4, enable_prefix_caching=False), "fcfs",
                      FakeCost()).run(trace).stats
    engine = stats.as_dict()
    assert engine["recomputed_tokens"] > 0
    assert engine["recompute_tax"] == pytest.approx(
        engine["recomputed_tokens"] / engine["computed_tokens"])
    assert "| recompute tax |" in report.ENGINE_HEADER
    assert report.engine_row(engine).endswith(f"| {engine['recompute_tax']:.2%} |")
