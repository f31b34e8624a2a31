"""The policy zoo through the engine: `user` and the SLO fields from the offline API and the
OpenAI API (completions and chat) to the scheduler, edf's shedding as an error, the policy
flags' validation, and the recompute tax and shed counts in /metrics."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from minivllm import LLM, SamplingParams
from minivllm.config import EngineConfig
from tests.server_utils import CHAT_TEMPLATE, ServerProcess, stories_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def test_offline_user_and_slos_reach_the_scheduler(tiny_llama, monkeypatch):
    llm = LLM(str(tiny_llama), num_kv_blocks=64, block_size=4, scheduling_policy="vtc")
    seen = []
    add = llm.llm_engine.core.scheduler.add_request
    monkeypatch.setattr(llm.llm_engine.core.scheduler, "add_request",
                        lambda r: (seen.append((r.user, r.ttft_slo_ms, r.e2e_slo_ms)), add(r)))
    outs = llm.generate(["a b", "c d", "e f"], GREEDY, use_tqdm=False,
                        user=["alice", "bob", "alice"], ttft_slo_ms=500.0)
    assert [len(o.outputs[0].token_ids) for o in outs] == [6, 6, 6]
    assert seen == [("alice", 500.0, None), ("bob", 500.0, None), ("alice", 500.0, None)]
    assert set(llm.llm_engine.core.scheduler.policy.counters) == {"alice", "bob"}
    with pytest.raises(ValueError, match="got 2 user values for 3 prompts"):
        llm.generate(["a", "b", "c"], GREEDY, use_tqdm=False, user=["x", "y"])


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
    ({"edf_action": "drop"}, "edf_action must be shed or deprioritize"),
    ({"ttft_slo_ms": 0.0}, "ttft_slo_ms must be > 0"),
    ({"mlfq_base_quantum": 0}, "mlfq_base_quantum must be >= 1"),
])
def test_bad_policy_settings_are_named(setting, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**setting)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("policy_serving")
    template = tmp / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    server = ServerProcess(stories_model(), [
        "--num-kv-blocks", "128", "--swap-space", "0.05", "--max-num-seqs", "1",
        "--scheduling-policy", "edf", "--edf-action", "shed", "--chat-template", str(template),
    ], tmp / "server.log")
    yield server
    server.stop()


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_api_sheds_a_request_past_its_ttft_deadline(server, endpoint):
    body = {"max_tokens": 200, "temperature": 0, "ignore_eos": True, "user": "tenant-a"}
    body |= ({"prompt": "Once upon a time"} if endpoint == "completions"
             else {"messages": [{"role": "user", "content": "Once upon a time"}]})
    url = f"{server.url}/v1/{endpoint}"
    busy = threading.Thread(target=httpx.post, args=(url,), kwargs={"json": body, "timeout": 60})
    busy.start()  # holds the one seat for 200 tokens
    try:
        while server.metrics().get("vllm:num_requests_running", 0) < 1:
            time.sleep(0.01)
        late = httpx.post(url, json=body | {"max_tokens": 2, "ttft_slo_ms": 1.0}, timeout=60)
    finally:
        busy.join()
    assert late.status_code == 503, late.text
    assert "request shed: it could no longer meet its deadline (ttft_slo_ms=1)" in late.text
    metrics = server.metrics()
    assert metrics["minivllm:num_requests_shed_total"] >= 1
    assert metrics["minivllm:num_computed_tokens_total"] > 200
    assert metrics["minivllm:num_recomputed_tokens_total"] == 0  # nothing was preempted


def test_api_refuses_a_bad_slo_naming_the_field(server):
    resp = httpx.post(f"{server.url}/v1/completions",
                      json={"prompt": "x", "max_tokens": 2, "e2e_slo_ms": -5})
    assert resp.status_code == 400 and "e2e_slo_ms" in resp.text
