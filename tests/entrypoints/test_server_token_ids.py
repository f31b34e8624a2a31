"""vLLM's return_token_ids and prompt_logprobs on /v1/completions and /v1/chat/completions,
through a real `minivllm serve` on the stories model: the ids and logprobs the server sends
are the offline engine's, whole and streamed, and absent unless asked for."""

from __future__ import annotations

import httpx
import openai
import pytest

from minivllm import LLM, SamplingParams
from tests.server_utils import CHAT_TEMPLATE, FAST_ENGINE_ARGS, ServerProcess, stories_model

PROMPT = "Once upon a time"
MESSAGES = [{"role": "user", "content": "Tell me a story about a cat."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("token_ids")
    template = tmp / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, "--chat-template",
                                             str(template)], tmp / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def offline():
    return LLM(model=str(stories_model()), num_kv_blocks=128, swap_space=0.05)


def greedy(**params) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=12, **params)


def test_completion_token_ids_are_the_engines(client, offline):
    expected = offline.generate(PROMPT, greedy(), use_tqdm=False)[0]
    choice = client.completions.create(model=str(stories_model()), prompt=PROMPT, max_tokens=12, temperature=0,
                                       extra_body={"return_token_ids": True}).choices[0]
    assert choice.prompt_token_ids == expected.prompt_token_ids
    assert choice.token_ids == expected.outputs[0].token_ids
    assert choice.text == expected.outputs[0].text


def test_streamed_completion_token_ids(client, offline):
    expected = offline.generate(PROMPT, greedy(), use_tqdm=False)[0]
    chunks = list(client.completions.create(
        model=str(stories_model()), prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
        extra_body={"return_token_ids": True}))
    assert chunks[0].choices[0].prompt_token_ids == expected.prompt_token_ids
    assert all("prompt_token_ids" not in c.choices[0].model_extra for c in chunks[1:])
    streamed = [t for c in chunks for t in c.choices[0].token_ids]
    assert streamed == expected.outputs[0].token_ids


def test_chat_token_ids_are_the_engines(client, offline):
    expected = offline.chat(MESSAGES, greedy(), use_tqdm=False,
                            chat_template=CHAT_TEMPLATE)[0]
    resp = client.chat.completions.create(model=str(stories_model()), messages=MESSAGES, max_tokens=12,
                                          temperature=0, extra_body={"return_token_ids": True})
    assert resp.prompt_token_ids == expected.prompt_token_ids
    assert resp.choices[0].token_ids == expected.outputs[0].token_ids

    chunks = list(client.chat.completions.create(
        model=str(stories_model()), messages=MESSAGES, max_tokens=12, temperature=0, stream=True,
        extra_body={"return_token_ids": True}))
    assert chunks[0].prompt_token_ids == expected.prompt_token_ids
    assert all("prompt_token_ids" not in c.model_extra for c in chunks[1:])
    streamed = [t for c in chunks for t in c.choices[0].token_ids]
    assert streamed == expected.outputs[0].token_ids


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": PROMPT}),
    ("/v1/chat/completions", {"messages": MESSAGES}),
])
def test_no_token_ids_unless_asked(server, path, body):
    for stream in (False, True):
        text = httpx.post(server.url + path, json={**body, "max_tokens": 4, "stream": stream},
                          timeout=60).text
        assert "token_ids" not in text and "prompt_logprobs" not in text


def _logprobs_of(prompt_logprobs) -> list[dict[int, float] | None]:
    return [None if step is None else {int(t): lp["logprob"] for t, lp in step.items()}
            for step in prompt_logprobs]


def test_prompt_logprobs_are_the_engines(client, offline):
    expected = offline.generate(PROMPT, greedy(prompt_logprobs=2), use_tqdm=False)[0]
    want = [None if step is None else {t: lp.logprob for t, lp in step.items()}
            for step in expected.prompt_logprobs]
    choice = client.completions.create(model=str(stories_model()), prompt=PROMPT, max_tokens=2, temperature=0,
                                       extra_body={"prompt_logprobs": 2}).choices[0]
    got = _logprobs_of(choice.prompt_logprobs)
    assert got[0] is None and len(got) == len(want)
    for g, w in zip(got[1:], want[1:]):
        assert g.keys() == w.keys()
        assert all(g[t] == pytest.approx(w[t], abs=1e-4) for t in w)
    assert choice.prompt_logprobs[1][str(expected.prompt_token_ids[1])]["decoded_token"]

    chat = offline.chat(MESSAGES, greedy(prompt_logprobs=1), use_tqdm=False,
                        chat_template=CHAT_TEMPLATE)[0]
    resp = client.chat.completions.create(model=str(stories_model()), messages=MESSAGES, max_tokens=2,
                                          temperature=0, extra_body={"prompt_logprobs": 1})
    got = _logprobs_of(resp.prompt_logprobs)
    assert len(got) == len(chat.prompt_token_ids)
    for g, w in zip(got[1:], chat.prompt_logprobs[1:]):
        assert g.keys() == w.keys()


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": PROMPT}),
    ("/v1/chat/completions", {"messages": MESSAGES}),
])
def test_prompt_logprobs_refused_when_streaming_or_over_the_cap(server, path, body):
    for extra in ({"stream": True, "prompt_logprobs": 1}, {"prompt_logprobs": 10_000},
                  {"prompt_logprobs": -1}):
        resp = httpx.post(server.url + path, json={**body, **extra}, timeout=60)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "prompt_logprobs"
