"""Where a request's TTFT went: a real `minivllm serve` (stories260K) says in its stream's
usage chunk (`timing`), the parts add up to the server's TTFT, the prefill's steps are the
chunks the token budget cut the prompt into, and `bench serve` reports the split."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.bench.test_bench_client import bench
from tests.server_utils import CHAT_TEMPLATE, FAST_ENGINE_ARGS, ServerProcess, stories_model

BUDGET = 32  # --max-num-batched-tokens: a 100-token prompt takes 4 steps (32 32 32 4)
PARTS = ("frontend_in_s", "queue_s", "prefill_s", "frontend_out_s")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("timing")
    (tmp / "chat.jinja").write_text(CHAT_TEMPLATE)
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, "--max-num-batched-tokens",
                                             str(BUDGET), "--chat-template",
                                             str(tmp / "chat.jinja")], tmp / "server.log")
    yield server
    server.stop()


def stream(url: str, body: dict, path: str = "/v1/completions") -> tuple[float, dict]:
    """(the client's TTFT in seconds, the usage chunk) of one streamed request."""
    body = {"stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, **body}
    start, ttft, usage = time.time(), None, None
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            msg = json.loads(line[len("data: "):])
            if msg.get("usage"):
                usage = msg
            elif ttft is None and any(c.get("text") or c.get("delta", {}).get("content")
                                      for c in msg["choices"]):
                ttft = time.time() - start
    return ttft, usage


def test_timing_parts_add_up_and_count_the_prefill_chunks(server):
    prompt = list(range(3, 103))  # 100 token ids
    ttft, usage = stream(server.url, {"prompt": prompt, "max_tokens": 4})
    timing = usage["timing"]
    assert all(timing[p] >= 0 for p in PARTS), timing
    assert sum(timing[p] for p in PARTS) == pytest.approx(timing["server_ttft_s"], abs=1e-6)
    # the client waited for the server's part, and then the HTTP transfer: on this machine
    # a small remainder
    assert timing["server_ttft_s"] <= ttft < timing["server_ttft_s"] + 0.5
    assert timing["prefill_steps"] == 4  # 100 tokens in steps of 32
    assert timing["prefill_step_tokens"] == 100  # alone: the steps computed only its prompt


def test_chat_streams_carry_timing_too(server):
    _, usage = stream(server.url, {"messages": [{"role": "user", "content": "Once upon"}],
                                   "max_tokens": 3},
                      "/v1/chat/completions")
    assert usage["timing"]["prefill_steps"] >= 1
    assert usage["timing"]["server_ttft_s"] > 0


def test_bench_serve_reports_the_split_per_bucket(server, tmp_path, capsys):
    rc = bench("serve", "--base-url", server.url, "--workload", "random", "--num-prompts", "6",
               "--input-len", "70", "--output-len", "4", "--output", str(tmp_path),
               "--disable-tqdm")
    assert rc == 0
    summary = json.loads((tmp_path / "run.json").read_text())["summary"]
    split = summary["ttft_split"]
    assert split["requests"] == 6
    # means: the parts, the HTTP remainder included, add up to the mean TTFT
    assert sum(split["parts_ms"].values()) == pytest.approx(split["ttft_ms"], rel=1e-9)
    assert split["ttft_ms"] == pytest.approx(summary["ttft_ms"]["mean"], rel=1e-9)
    # all six sent at once: 70-token prompts under a 32-token budget take at least 3 steps
    # each, and steps are shared (more tokens in them than one prompt's)
    assert split["prefill_steps"] >= 3 and split["prefill_step_tokens"] > 70
    assert "Where the TTFT went" in capsys.readouterr().out
