"""The engine's admission bounds and queue timeout, exactly, without a server."""

from __future__ import annotations

import time

import pytest

from minivllm import LLM, SamplingParams
from minivllm.config import EngineConfig
from minivllm.engine.errors import EngineOverloadedError
from tests.conftest import assert_all_blocks_free

PARAMS = SamplingParams(temperature=0, max_tokens=4)


def add(llm: LLM, request_id: str, num_tokens: int = 5, **kwargs) -> None:
    llm.llm_engine.add_request(request_id, None, PARAMS, prompt_token_ids=[1] * num_tokens,
                               **kwargs)


def drain(llm: LLM) -> list:
    outputs = []
    while llm.llm_engine.has_unfinished_requests():
        outputs += [o for o in llm.llm_engine.step() if o.finished]
    return outputs


def test_waiting_request_bound(tiny_llama):
    llm = LLM(str(tiny_llama), num_kv_blocks=64, max_num_waiting_requests=2)
    add(llm, "a")
    add(llm, "b")
    with pytest.raises(EngineOverloadedError, match="2 requests are waiting") as rejected:
        add(llm, "c")
    assert rejected.value.reason == "max_num_waiting_requests"
    llm.llm_engine.step()  # both are scheduled: the queue has room again
    add(llm, "c")
    assert sorted(o.request_id for o in drain(llm)) == ["a", "b", "c"]
    assert_all_blocks_free(llm)


def test_waiting_token_bound_lets_a_long_prompt_wait_alone(tiny_llama):
    llm = LLM(str(tiny_llama), num_kv_blocks=64, max_num_waiting_tokens=20)
    add(llm, "long", num_tokens=30)  # over the bound, but nothing else waits
    with pytest.raises(EngineOverloadedError, match="30 tokens are waiting") as rejected:
        add(llm, "short", num_tokens=2)
    assert rejected.value.reason == "max_num_waiting_tokens"
    assert [o.request_id for o in drain(llm)] == ["long"]
    assert llm.llm_engine.groups == {}  # a rejected request leaves nothing behind


def test_request_timeout_fails_only_requests_never_scheduled(tiny_llama):
    llm = LLM(str(tiny_llama), num_kv_blocks=64, request_timeout=0.5)
    add(llm, "running")
    llm.llm_engine.step()
    time.sleep(0.6)  # "running" is now older than the timeout, but it was scheduled
    add(llm, "stale", arrival_time=time.time() - 1.0)
    add(llm, "fresh")
    outputs = {o.request_id: o for o in drain(llm)}
    stale = outputs["stale"]
    assert stale.error.startswith("request timed out: it waited 1.")
    assert "request_timeout=0.5s" in stale.error
    assert stale.outputs[0].finish_reason == "abort" and stale.metrics.first_scheduled_time is None
    assert outputs["running"].error is None and outputs["fresh"].error is None
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("name, value", [("max_num_waiting_requests", 0),
                                         ("max_num_waiting_tokens", -1),
                                         ("request_timeout", 0.0)])
def test_bounds_are_validated(name, value):
    with pytest.raises(ValueError, match=name):
        EngineConfig(**{name: value})
