"""The policy zoo through the engine: `user` and the SLO fields from the offline API and the
OpenAI API (completions and chat) to the scheduler, edf's shedding as an error, the policy
flags' validation, and the recompute tax and shed counts in /metrics."""

from __future__ import annotations

import argparse
import asyncio

import httpx
import pytest

from minivllm import LLM, SamplingParams
from minivllm.config import EngineConfig
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.messages import EngineCoreRequest
from minivllm.entrypoints.openai.api_server import build_app
from tests.server_utils import CHAT_TEMPLATE

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def test_offline_user_and_slos_reach_the_scheduler(tiny_llama, monkeypatch):
    llm = LLM(str(tiny_llama), num_kv_blocks=64, block_size=4, scheduling_policy="vtc")
    seen = []
    add = llm.llm_engine.core.scheduler.add_request
    monkeypatch.setattr(llm.llm_engine.core.scheduler, "add_request",
                        lambda r: (seen.append((r.core_request.user, r.core_request.ttft_slo_ms,
                                              r.core_request.e2e_slo_ms)), add(r)))
    outs = llm.generate(["a b", "c d", "e f"], GREEDY, use_tqdm=False,
                        user=["alice", "bob", "alice"], ttft_slo_ms=500.0)
    assert [len(o.outputs[0].token_ids) for o in outs] == [6, 6, 6]
    assert seen == [("alice", 500.0, None), ("bob", 500.0, None), ("alice", 500.0, None)]
    assert set(llm.llm_engine.core.scheduler.policy.counters) == {"alice", "bob"}
    with pytest.raises(ValueError, match="got 2 user values for 3 prompts"):
        llm.generate(["a", "b", "c"], GREEDY, use_tqdm=False, user=["x", "y"])


def test_a_new_request_field_reaches_the_policy_as_sent(tiny_llama, monkeypatch):
    """Adding a per-request field is one edit to EngineCoreRequest plus its use: the engine
    passes the object itself down to the scheduler's Requests, copying no field on the way.
    Here the field (`tier`) is a subclass's and its use a policy rule patched in."""

    class Tiered(EngineCoreRequest, tag="add"):
        tier: int = 0

    llm = LLM(str(tiny_llama), num_kv_blocks=64, block_size=4, max_num_seqs=1)
    policy = llm.llm_engine.core.scheduler.policy
    monkeypatch.setattr(policy, "sort_key", lambda request, now: (
        -request.core_request.tier, request.arrival_time, request.request_id))
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    sent = {tier: Tiered(str(tier), [1, 2, 3], params, arrival_time=float(tier), tier=tier)
            for tier in (1, 3, 2)}
    for request in sent.values():
        llm.llm_engine.add_request(request.request_id, request, params)
    assert [id(r.core_request) for r in llm.llm_engine.core.scheduler.waiting] == [
        id(r) for r in sent.values()]
    finished = []
    while llm.llm_engine.has_unfinished_requests():
        finished += [o.request_id for o in llm.llm_engine.step() if o.finished]
    assert finished == ["3", "2", "1"]  # one seat: the highest tier first


def test_offline_edf_sheds_what_cannot_make_its_deadline(tiny_llama):
    llm = LLM(str(tiny_llama), num_kv_blocks=64, block_size=4, max_num_seqs=1,
              scheduling_policy="edf", ttft_slo_ms=60_000.0)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    # The second waits behind the first (one seat) far longer than its 1 ms TTFT deadline.
    outs = llm.generate(["a b c", "d e f"], params, use_tqdm=False, ttft_slo_ms=[None, 1e-3])
    assert len(outs[0].outputs[0].token_ids) == 40
    assert outs[1].outputs[0].finish_reason == "abort" and not outs[1].outputs[0].token_ids
    stats = llm.llm_engine.get_stats()
    assert stats.num_requests_shed == 1 and stats.num_computed_tokens > 0


@pytest.mark.parametrize("setting, message", [
    ({"preemption_victim": "oldest"}, "preemption_victim must be one of lowest_rank"),
    ({"vtc_weights": "1;2"}, "vtc_weights .--vtc-weights. must be two positive numbers"),
    ({"edf_action": "drop"}, "edf_action .--edf-action. must be shed or deprioritize"),
    ({"ttft_slo_ms": 0.0}, "ttft_slo_ms must be > 0"),
    ({"mlfq_base_quantum": 0}, "mlfq_base_quantum must be >= 1"),
])
def test_bad_policy_settings_are_named(setting, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**setting)


def test_api_sheds_a_request_past_its_ttft_deadline(tiny_llama):
    """The app in-process (no server start), its engine on a thread: a request waits behind
    a long one for the only seat, past its 1 ms TTFT deadline, and is shed with a 503 naming
    it, on completions and chat alike; /metrics counts it; a bad SLO is a 400 naming it."""
    engine = AsyncLLM.from_config(EngineConfig(
        model=str(tiny_llama), num_kv_blocks=64, block_size=4, max_num_seqs=1,
        scheduling_policy="edf", edf_action="shed"), log_interval=60, engine_mode="thread")
    app = build_app(engine, argparse.Namespace(chat_template=CHAT_TEMPLATE))

    async def scenario(client: httpx.AsyncClient) -> None:
        for endpoint, prompt in (("completions", {"prompt": "a b c"}),
                                 ("chat/completions",
                                  {"messages": [{"role": "user", "content": "a b c"}]})):
            body = {"max_tokens": 60, "temperature": 0, "ignore_eos": True, "user": "t1",
                    **prompt}
            busy = asyncio.ensure_future(client.post(f"/v1/{endpoint}", json=body))
            while (await engine.get_stats()).num_running == 0:
                await asyncio.sleep(0.005)
            late = await client.post(f"/v1/{endpoint}",
                                     json=body | {"max_tokens": 2, "ttft_slo_ms": 1.0})
            assert (await busy).status_code == 200
            assert late.status_code == 503, late.text
            assert "request shed: it could no longer meet its deadline (ttft_slo_ms=1)" in late.text
        metrics = (await client.get("/metrics")).text
        assert 'minivllm:num_requests_shed_total{model_name="' in metrics
        shed = [line for line in metrics.splitlines()
                if line.startswith("minivllm:num_requests_shed_total")]
        assert shed[0].endswith(" 2.0")
        assert "minivllm:num_recomputed_tokens_total" in metrics
        bad = await client.post("/v1/completions",
                                json={"prompt": "x", "max_tokens": 2, "e2e_slo_ms": -5})
        assert bad.status_code == 400 and "e2e_slo_ms" in bad.text

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await scenario(client)

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
