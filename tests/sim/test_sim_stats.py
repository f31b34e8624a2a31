"""The simulator's stats hold the replicas' SchedulerStats (core/scheduler_stats.py) added up by
sum_stats, as data-parallel replicas' are: a field added once to SchedulerStats reaches the
simulator with no edit in sim/, and SimStats declares none of its fields again."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import partial

import minivllm.core.scheduler as scheduler_module
import minivllm.core.scheduler_stats as scheduler_stats_module
from minivllm.bench.workload import Trace, TraceEntry
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.scheduler_stats import SchedulerStats
from minivllm.core.step_batch import StepBatch
from minivllm.sim.cost_model import CostModel
from minivllm.sim.simulator import SimStats, Simulator


class FakeCost(CostModel):
    name = "fake"

    def step_time(self, b: StepBatch) -> float:
        return 1.0


def run(num_replicas: int) -> SimStats:
    """Two requests per replica that do not fit its KV cache together (so it preempts and
    recomputes), round robin: each replica serves what one replica alone serves."""
    tight = SchedulerConfig(num_blocks=4, block_size=4, max_num_batched_tokens=8,
                            max_model_len=64, enable_prefix_caching=False)
    trace = Trace("tight", [TraceEntry(0.0, i, 6, 4) for i in range(2 * num_replicas)])
    return Simulator(tight, "fcfs", FakeCost(), data_parallel_size=num_replicas,
                     router_policy="round_robin").run(trace).stats


def test_a_field_added_to_scheduler_stats_reaches_the_simulator(monkeypatch):
    @dataclass
    class WithWidgets(SchedulerStats):
        num_widgets: int = 0

    # Added once: Scheduler.stats() fills it in (1 a replica here), sum_stats adds it up.
    monkeypatch.setattr(scheduler_module, "SchedulerStats", partial(WithWidgets, num_widgets=1))
    monkeypatch.setattr(scheduler_stats_module, "SchedulerStats", WithWidgets)
    assert run(2).scheduler.num_widgets == 2


def test_sim_stats_declare_no_scheduler_stats_field_and_add_up_every_counter():
    assert not {f.name for f in fields(SimStats)} & {f.name for f in fields(SchedulerStats)}
    one, two = run(1).scheduler, run(2).scheduler
    assert one.num_preemptions > 0 and one.num_recomputed_tokens > 0
    for f in fields(SchedulerStats):
        if f.name == "max_lora":  # a setting, the same on every replica
            assert two.max_lora == one.max_lora
        elif isinstance(f.default, int):  # queues, blocks and counters: twice one replica's
            assert getattr(two, f.name) == 2 * getattr(one, f.name), f.name
    assert two.kv_cache_usage == one.kv_cache_usage
