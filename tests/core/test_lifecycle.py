"""Request lifecycles (core/lifecycle.py) on the simulator's virtual clock, checked by hand:
queued -> prefill chunks -> decode -> preempted / swapped -> finished, one event per change
of state; the block map's counts and folding; a tracer started mid-run."""

from __future__ import annotations

import pytest

from minivllm.bench.workload import Trace, TraceEntry
from minivllm.core.lifecycle import LifecycleTracer, block_map
from minivllm.core.policy import make_policy
from minivllm.core.request import Request, RequestStatus
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.step_batch import StepBatch
from minivllm.sim.cost_model import CostModel
from minivllm.sim.simulator import Simulator


class OneSecondSteps(CostModel):
    name = "fake"

    def step_time(self, b: StepBatch) -> float:
        return 1.0


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{"num_blocks": 100, "block_size": 4, "max_num_batched_tokens": 8,
                              "max_model_len": 64, **kw})


def by_request(events) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for e in events:
        out.setdefault(e.request_id, []).append((e.t, e.state, e.tokens))
    return out


def test_chunked_prefill_then_decode_then_finished_by_hand():
    # Request 0: 10 prompt tokens, budget 8: chunks of 8 (t=0) and 2 (t=1, which samples its
    # first token), decodes from t=2 (tokens 2 and 3): finished when the step ends, at 4.
    trace = Trace("hand", [TraceEntry(0.0, 7, 10, 3), TraceEntry(2.5, 1, 3, 1)])
    result = Simulator(config(), "fcfs", OneSecondSteps(), record_timeline=True).run(trace)
    events = by_request(result.timeline)
    assert events["0"] == [(0.0, "queued", 10), (0.0, "prefill", 8), (1.0, "prefill", 2),
                           (2.0, "decode", 0), (4.0, "finished", 3)]
    # Request 1 arrives at 2.5 during a step, joins at 3, finishes with one token.
    assert events["1"] == [(2.5, "queued", 3), (3.0, "prefill", 3), (4.0, "finished", 1)]
    first = result.timeline[0]
    # Admitted by the schedule() that first saw it: it never had a place in the queue.
    assert first.user == "user-7" and first.priority == 0 and first.rank is None
    assert [e.reason for e in result.timeline if e.state == "finished"] == ["length", "length"]


def test_preemption_by_recompute_and_by_swap_show_in_order():
    # 4 blocks of 4 tokens cannot hold two requests of 6 + 4 tokens: the later one is
    # preempted, and comes back through a prefill (recompute).
    trace = Trace("tight", [TraceEntry(0.0, 1, 6, 4), TraceEntry(0.0, 2, 6, 4)])
    result = Simulator(config(num_blocks=4), "fcfs", OneSecondSteps(),
                       record_timeline=True).run(trace)
    states = [s for _, s, _ in by_request(result.timeline)["1"]]
    assert "preempted" in states
    after = states[states.index("preempted") + 1]
    assert after == "prefill" and states[-1] == "finished"
    preempted = next(e for e in result.timeline if e.state == "preempted")
    assert preempted.rank == 0  # alone in the waiting queue
    # The same with a swap space: swapped, then back to decode without a prefill.
    swap = Simulator(config(num_blocks=4, num_swap_blocks=8, preemption_mode="swap"), "fcfs",
                     OneSecondSteps(), record_timeline=True).run(trace)
    states = [s for _, s, _ in by_request(swap.timeline)["1"]]
    assert "swapped" in states and states[states.index("swapped") + 1] == "decode"
    times = [t for t, _, _ in by_request(swap.timeline)["1"]]
    assert times == sorted(times)


def test_a_tracer_started_mid_run_sees_present_states_and_aborts():
    sched = Scheduler(config(), make_policy("priority"), clock=lambda: 5.0)
    running = Request.make("a", [1, 2, 3], 4, arrival_time=1.0, priority=2)
    waiting = Request.make("b", [4, 5, 6], 4, arrival_time=2.0, priority=1)
    sched.add_request(running)
    out = sched.schedule()
    sched.update_from_output(out, {"a": 9})
    sched.add_request(waiting)
    tracer = LifecycleTracer(sched, now=5.0)
    sched.finish_request(waiting, RequestStatus.FINISHED_ABORTED)
    tracer.observe(6.0, 6.0)
    sample = tracer.take(6.0, with_block_map=True)
    assert [(e.request_id, e.state, e.t) for e in sample.events] == [
        ("a", "queued", 1.0), ("a", "decode", 5.0), ("b", "queued", 2.0), ("b", "aborted", 6.0)]
    assert sample.block_map["in_use"] == 1 and sample.block_map["total"] == 100
    assert sample.ranks == {}  # nobody waits now
    assert tracer.take(7.0, with_block_map=False).events == []  # taken once


def test_block_map_counts_and_folds():
    sched = Scheduler(config(num_blocks=10, num_swap_blocks=4), make_policy("fcfs"))
    kv = sched.kv
    a = Request.make("a", list(range(9)), 4, arrival_time=0.0)
    kv.allocate_slots(a, 9)  # 3 blocks in use
    a.num_computed_tokens = 9
    kv.cache_full_blocks(a)  # the 2 full ones registered in the prefix cache
    kv.free(a)  # ... and now free but cached (evictable); the partial one plain free
    b = Request.make("b", list(range(100, 105)), 4, arrival_time=0.0)
    kv.allocate_slots(b, 5)
    kv.swap_out(b)
    m = block_map(kv, max_cells=5)
    assert (m["in_use"], m["cached"], m["free"], m["swapped"]) == (0, 2, 8, 2)
    assert m["total"] == 10 and m["swap_total"] == 4
    assert m["cells"]["per_cell"] == 2 and len(m["cells"]["map"]) == 5
    assert m["cells"]["map"].count("c") >= 1 and set(m["swap_cells"]["map"]) <= {"s", "f"}
    assert block_map(kv)["cells"]["map"].count("c") == 2  # one block a cell: exact


@pytest.mark.parametrize("policy", ["fcfs", "priority", "sjf"])
def test_every_request_ends_once_whatever_the_policy(policy):
    trace = Trace("mix", [TraceEntry(i * 0.3, i % 3, 3 + 5 * (i % 4), 2 + i % 5, priority=i % 3)
                          for i in range(20)])
    result = Simulator(config(num_blocks=12), policy, OneSecondSteps(), send_priority=True,
                       record_timeline=True).run(trace)
    events = by_request(result.timeline)
    assert len(events) == 20
    for seq in events.values():
        states = [s for _, s, _ in seq]
        assert states[0] == "queued" and states[-1] == "finished"
        assert states.count("finished") == 1 and states[-2] in ("prefill", "decode")


def test_sim_policies_write_a_timeline_per_run(tmp_path):
    from minivllm.cli import main

    assert main(["sim", "policies", "--preset", "rtx4090-qwen2.5-7b", "--workload",
                 "seed-high", "--num-prompts", "5", "--policies", "fcfs,sjf", "--output",
                 str(tmp_path), "--disable-tqdm"]) == 0
    for policy in ("fcfs", "sjf"):
        page = (tmp_path / policy / "timeline.html").read_text()
        assert "function renderTimeline" in page and "in simulated seconds" in page
        assert page.count('"state":"queued"') == 5 and page.count('"state":"finished"') == 5
        assert "<script src" not in page  # self-contained
