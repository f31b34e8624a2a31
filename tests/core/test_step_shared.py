"""The engine and the simulator run the same step code (core/step.py), so the token-level stop
rule lives in one place, core/stop.py's check_stop, applied by Scheduler.update_from_output:
a rule changed there shows in both. Then the rule itself, case by case."""

from __future__ import annotations

import pytest

import minivllm.core.scheduler as scheduler_module
from minivllm import LLM, SamplingParams
from minivllm.bench.workload import Trace, TraceEntry
from minivllm.core.request import Request, RequestStatus
from minivllm.core.scheduler_config import SchedulerConfig
from minivllm.core.step_batch import StepBatch
from minivllm.core.stop import check_stop
from minivllm.sim.cost_model import CostModel
from minivllm.sim.simulator import Simulator
from tests.conftest import assert_all_blocks_free


class FakeCost(CostModel):
    name = "fake"

    def step_time(self, b: StepBatch) -> float:
        return 1.0


def sim_config() -> SchedulerConfig:
    return SchedulerConfig(num_blocks=100, block_size=4, max_num_batched_tokens=16,
                           max_model_len=64)


def test_a_stop_rule_changed_in_one_place_shows_in_engine_and_simulator(tiny_llama,
                                                                        monkeypatch):
    def stop_at_three(request, max_model_len, eos_token_ids):
        return RequestStatus.FINISHED_STOPPED if request.num_output_tokens >= 3 else None

    monkeypatch.setattr(scheduler_module, "check_stop", stop_at_three)
    llm = LLM(model=str(tiny_llama), num_kv_blocks=64, block_size=4, seed=0)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5, 6, 7, 8, 9]}, {"prompt_token_ids": [10, 11]}]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [3, 3]
    assert [o.outputs[0].finish_reason for o in outputs] == ["stop", "stop"]
    assert_all_blocks_free(llm)

    trace = Trace("t", [TraceEntry(0.0, 1, 6, 10), TraceEntry(0.5, 2, 3, 10)])
    result = Simulator(sim_config(), "fcfs", FakeCost(), record_timeline=True).run(trace)
    assert [r.output_tokens for r in result.results] == [3, 3]
    assert all(r.success for r in result.results)
    assert [e.reason for e in result.timeline if e.state == "finished"] == ["stop", "stop"]


@pytest.mark.parametrize("request_max_tokens, reason", [("trace", "length"),
                                                        ("context", "stop")])
def test_the_simulator_stops_at_the_trace_length_through_the_rule(request_max_tokens, reason):
    """Its stand-in model samples EOS at the trace length, unless max_tokens (the trace
    length, with request_max_tokens trace) ends the request there by length."""
    trace = Trace("t", [TraceEntry(0.0, 1, 6, 5)])
    result = Simulator(sim_config(), "fcfs", FakeCost(), record_timeline=True,
                       request_max_tokens=request_max_tokens).run(trace)
    assert result.results[0].output_tokens == 5
    assert [e.reason for e in result.timeline if e.state == "finished"] == [reason]


EOS = 2


def after(tokens: list[int], max_tokens: int = 10, prompt_len: int = 3, **params) -> Request:
    """A request that has sampled `tokens`."""
    sampling = SamplingParams(max_tokens=max_tokens, **params)
    request = Request.make("r", list(range(100, 100 + prompt_len)), max_tokens, 0.0,
                      sampling_params=sampling)
    for token in tokens:
        request.append_output_token(token)
    return request


@pytest.mark.parametrize("tokens, max_tokens, params, status, stop_reason", [
    ([7], 10, {}, None, None),
    ([7, EOS], 10, {}, RequestStatus.FINISHED_STOPPED, None),
    ([7, EOS], 10, {"ignore_eos": True}, None, None),
    ([7, EOS], 10, {"min_tokens": 3}, None, None),  # EOS is banned below min_tokens
    ([7, 9], 10, {"stop_token_ids": [9]}, RequestStatus.FINISHED_STOPPED, 9),
    ([9], 10, {"stop_token_ids": [9], "min_tokens": 2}, None, None),
    ([7, 8, 9], 3, {}, RequestStatus.FINISHED_LENGTH, None),
    ([7, 8, EOS], 3, {}, RequestStatus.FINISHED_STOPPED, None),  # EOS before length
    ([7, 8, 9], 3, {"stop_token_ids": [9]}, RequestStatus.FINISHED_STOPPED, 9),
])
def test_check_stop(tokens, max_tokens, params, status, stop_reason):
    request = after(tokens, max_tokens, **params)
    assert check_stop(request, 100, {EOS}) is status
    assert request.stop_reason == stop_reason


def test_check_stop_at_the_context_length():
    request = after([7, 8], max_tokens=10, prompt_len=6)
    assert check_stop(request, 9, {EOS}) is None
    request.append_output_token(9)
    assert check_stop(request, 9, {EOS}) is RequestStatus.FINISHED_LENGTH


def test_without_sampling_params_only_eos_and_length_stop():
    request = Request.make("r", [1, 2], 3, 0.0)
    request.append_output_token(9)
    assert check_stop(request, 100, {EOS}) is None
    request.append_output_token(EOS)
    assert check_stop(request, 100, {EOS}) is RequestStatus.FINISHED_STOPPED
