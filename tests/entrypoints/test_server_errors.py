"""Bad requests get the right status and an OpenAI-shaped error; the server goes on serving."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server_utils import (
    ENGINE_MODES,
    FAST_ENGINE_ARGS,
    ServerProcess,
    engine_mode_args,
    stories_model,
)

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_MODEL_LEN = 128


@pytest.fixture(scope="module", params=ENGINE_MODES)
def server(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server_errors")
    # No --chat-template: the stories tokenizer has none, so chat must answer 400.
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS,
                                             *engine_mode_args(request.param), "--api-key", KEY,
                                             "--max-request-body-mb", "1",
                                             "--max-model-len", str(MAX_MODEL_LEN),
                                             "--served-model-name", "stories"],
                           tmp / "server.log")
    yield server
    server.stop()


def completion(**fields):
    return {"model": "stories", "prompt": "Once upon a time", "max_tokens": 4, **fields}


def chat(**fields):
    return {"model": "stories", "messages": [{"role": "user", "content": "Hi"}], **fields}


C, CHAT = "/v1/completions", "/v1/chat/completions"

# (name, path, JSON body or raw bytes, headers, status, param, words the message must contain)
BAD_REQUESTS = [
    ("bad json", C, b'{"prompt": "x",', AUTH, 400, None, ["JSON"]),
    ("json array", C, b"[1, 2]", AUTH, 400, None, ["JSON object"]),
    ("empty body", C, b"", AUTH, 400, None, []),
    ("not utf-8", C, b"\xff\xfe{", AUTH, 400, None, []),
    ("missing prompt", C, {"model": "stories"}, AUTH, 400, "prompt", ["prompt"]),
    ("prompt of wrong type", C, completion(prompt=12), AUTH, 400, "prompt", []),
    ("max_tokens not int", C, completion(max_tokens="many"), AUTH, 400, "max_tokens", []),
    ("max_tokens negative", C, completion(max_tokens=-1), AUTH, 400, "max_tokens", []),
    ("temperature negative", C, completion(temperature=-0.5), AUTH, 400, "temperature", []),
    ("top_p zero", C, completion(top_p=0), AUTH, 400, "top_p", []),
    ("top_p above one", C, completion(top_p=1.5), AUTH, 400, "top_p", []),
    ("top_k negative", C, completion(top_k=-5), AUTH, 400, "top_k", []),
    ("n zero", C, completion(n=0), AUTH, 400, "n", []),
    ("n above --max-n", C, completion(n=17), AUTH, 400, "n", ["16", "--max-n"]),
    ("best_of below n", C, completion(n=3, best_of=2), AUTH, 400, "best_of", ["n (3)"]),
    ("best_of above --max-n", C, completion(best_of=40), AUTH, 400, "best_of", ["--max-n"]),
    ("best_of above n streamed", C, completion(n=2, best_of=3, stream=True), AUTH, 400,
     "best_of", ["stream"]),
    ("chat n above --max-n", CHAT, chat(n=17), AUTH, 400, "n", ["--max-n"]),
    ("logprobs too many", C, completion(logprobs=100), AUTH, 400, "logprobs", ["20"]),
    ("top_logprobs too many", CHAT, chat(logprobs=True, top_logprobs=21), AUTH, 400,
     "top_logprobs", ["20", "--max-logprobs"]),
    ("too many stop strings", C, completion(stop=["a"] * 17), AUTH, 400, "stop",
     ["16", "--max-stop-strings"]),
    ("too many stop token ids", C, completion(stop_token_ids=list(range(17))), AUTH, 400,
     "stop_token_ids", ["--max-stop-strings"]),
    ("stop token id outside vocab", C, completion(stop_token_ids=[99999], min_tokens=2), AUTH,
     400, "stop_token_ids", ["99999"]),
    ("too many prompts", C, completion(prompt=["x"] * 129), AUTH, 400, "prompt",
     ["128", "--max-prompts-per-request"]),
    ("seed beyond int64", C, completion(seed=2**64), AUTH, 400, "seed", []),
    ("lone surrogate", C, b'{"prompt": "a\\ud800b"}', AUTH, 400, "prompt", ["Unicode"]),
    ("temperature NaN", C, b'{"prompt": "a", "temperature": NaN}', AUTH, 400, "temperature",
     []),
    ("repetition_penalty infinite", C, b'{"prompt": "a", "repetition_penalty": Infinity}',
     AUTH, 400, "repetition_penalty", []),
    ("presence_penalty too big", C, completion(presence_penalty=5), AUTH, 400,
     "presence_penalty", []),
    ("min_tokens above max_tokens", C, completion(min_tokens=10), AUTH, 400, "min_tokens", []),
    ("stop not strings", C, completion(stop=[1, 2]), AUTH, 400, "stop", []),
    ("stream_options without stream", C, completion(stream_options={"include_usage": True}),
     AUTH, 400, "stream_options", []),
    ("empty prompt list", C, completion(prompt=[]), AUTH, 400, "prompt", ["empty"]),
    ("token id outside vocab", C, completion(prompt=[1, 99999]), AUTH, 400, "prompt",
     ["99999"]),
    ("prompt too long", C, completion(prompt=[1] + [403] * 99, max_tokens=50), AUTH, 400,
     "prompt", ["128", "100", "150"]),
    ("prompt fills the context", C, completion(prompt=[403] * 128, max_tokens=None), AUTH, 400,
     "prompt", ["128"]),
    ("unknown model", C, completion(model="gpt-5"), AUTH, 404, "model", ["gpt-5"]),
    ("missing messages", CHAT, {"model": "stories"}, AUTH, 400, "messages", []),
    ("empty messages", CHAT, chat(messages=[]), AUTH, 400, "messages", []),
    ("bad role", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), AUTH, 400,
     "messages", []),
    ("no chat template", CHAT, chat(), AUTH, 400, "messages", ["--chat-template"]),
    ("top_logprobs without logprobs", CHAT, chat(top_logprobs=2), AUTH, 400, "top_logprobs", []),
    ("chat unknown model", CHAT, chat(model="nope"), AUTH, 404, "model", []),
    ("huge body", C, completion(prompt="word " * 300_000), AUTH, 413, None, ["--max-request"]),
    ("huge header", C, completion(), {**AUTH, "X-Big": "x" * 40_000}, 431, None,
     ["--max-header-kb"]),
    ("missing key", C, completion(), {}, 401, None, ["API key"]),
    ("wrong key", C, completion(), {"Authorization": "Bearer guess"}, 401, None, ["API key"]),
    ("tokenize both inputs", "/tokenize", {"prompt": "x", "messages": []}, AUTH, 400, "prompt",
     []),
    ("detokenize bad id", "/detokenize", {"tokens": [-3]}, AUTH, 400, "tokens", []),
    ("unknown route", "/v1/no-such-route", {}, AUTH, 404, None, []),
]


@pytest.mark.parametrize("name,path,body,headers,status,param,words", BAD_REQUESTS,
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_request(server, name, path, body, headers, status, param, words):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server.url + path, headers={"Content-Type": "application/json", **headers},
                   timeout=30, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["type"] and error["message"]
    assert error["param"] == param
    for word in words:
        assert word in error["message"]
    assert len(error["message"]) <= 600  # no echo of a huge input


def test_huge_invalid_field_is_not_echoed(server):
    r = httpx.post(server.url + C, headers=AUTH, json=completion(max_tokens="9" * 200_000 + "x"))
    assert r.status_code == 400 and len(r.text) < 1000


def test_key_covers_every_route_but_health_and_metrics(server):
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/metrics").status_code == 200  # no --metrics-require-key
    for path in ("/v1/models", "/version", "/docs", "/openapi.json"):
        assert httpx.get(server.url + path).status_code == 401
        assert httpx.get(server.url + path, headers=AUTH).status_code == 200


def test_openai_client_sees_typed_errors(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-5", prompt="x")
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="stories", prompt="x", temperature=-1)
    bad_key = openai.OpenAI(base_url=server.url + "/v1", api_key="guess", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()


def test_normal_request_after_all_the_bad_ones(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    resp = client.completions.create(model="stories", prompt="Once upon a time", max_tokens=8,
                                     temperature=0)
    assert resp.choices[0].text == ", there was a little girl"
    assert httpx.get(server.url + "/health").status_code == 200
    assert "Traceback" not in server.log()
