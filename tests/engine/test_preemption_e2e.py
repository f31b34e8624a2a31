"""Preemption and policies end to end, with the real stories260K model: greedy outputs are
token-identical with and without preemption (swap and recompute, requests preempted several
times), and with one sequence at a time, `priority` and `sjf` let a later request finish
first."""

from __future__ import annotations

from collections import Counter

import pytest

from minivllm import LLM, SamplingParams
from minivllm.core.request import RequestStatus
from tests.conftest import assert_all_blocks_free

PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to the park", "One day"]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def make_llm(stories_dir, **kwargs) -> LLM:
    return LLM(model=str(stories_dir), **{"block_size": 4, "swap_space": 0.01, **kwargs})


def record_preemptions(llm: LLM) -> Counter:
    """Counts (request id, status right after preemption) for every preemption."""
    scheduler, counts = llm.llm_engine.scheduler, Counter()
    schedule = scheduler.schedule

    def recording_schedule():
        out = schedule()
        counts.update((rid, scheduler.requests[rid].status) for rid in out.preempted_req_ids)
        return out

    scheduler.schedule = recording_schedule
    return counts


@pytest.fixture(scope="module")
def reference(stories_dir):
    llm = make_llm(stories_dir, num_kv_blocks=128)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert llm.stats().num_preemptions == 0
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("mode, swap_space, status", [
    ("swap", 0.01, RequestStatus.SWAPPED),
    ("recompute", 0.01, RequestStatus.WAITING),
    ("swap", 0, RequestStatus.WAITING),  # no swap space: swap falls back to recompute
])
def test_greedy_output_is_the_same_when_preempted(stories_dir, reference, mode, swap_space,
                                                  status):
    # 10 blocks of 4 tokens hold 40 tokens; the four requests need about 30 each.
    llm = make_llm(stories_dir, num_kv_blocks=10, preemption_mode=mode, swap_space=swap_space,
                   enable_prefix_caching=False)
    preemptions = record_preemptions(llm)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == reference
    assert {s for _, s in preemptions} == {status}  # every preemption went the asked way
    assert max(preemptions.values()) >= 2  # some request was preempted (and resumed) twice
    assert llm.stats().num_preemptions == sum(preemptions.values())
    assert_all_blocks_free(llm)


def finish_order(outputs) -> list[str]:
    return [o.request_id for o in sorted(outputs, key=lambda o: o.metrics.finished_time)]


def test_priority_lets_a_later_urgent_request_finish_first(stories_dir):
    llm = make_llm(stories_dir, num_kv_blocks=64, max_num_seqs=1, scheduling_policy="priority")
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outputs = llm.generate(PROMPTS[:3], params, use_tqdm=False, priority=[1, 1, 0])
    assert finish_order(outputs) == ["2", "0", "1"]
    assert_all_blocks_free(llm)


def test_sjf_lets_a_later_short_request_finish_first(stories_dir):
    llm = make_llm(stories_dir, num_kv_blocks=64, max_num_seqs=1, scheduling_policy="sjf")
    long, short = (SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (16, 2))
    outputs = llm.generate(PROMPTS[:3], [long, long, short], use_tqdm=False)
    assert finish_order(outputs) == ["2", "0", "1"]
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_an_urgent_request_actively_preempts_a_running_one(stories_dir, reference, mode):
    llm = make_llm(stories_dir, num_kv_blocks=64, max_num_seqs=1, scheduling_policy="priority",
                   active_preemption=True, min_run_quantum=3, preemption_mode=mode)
    engine, finished = llm.llm_engine, []
    engine.add_request("low", PROMPTS[0], GREEDY, priority=1)
    for _ in range(4):
        engine.step()
    engine.add_request("urgent", PROMPTS[1], GREEDY, priority=0)
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in finished] == ["urgent", "low"]
    assert [o.outputs[0].token_ids for o in finished] == [reference[1], reference[0]]
    assert llm.stats().num_preemptions == 1
    assert_all_blocks_free(llm)
