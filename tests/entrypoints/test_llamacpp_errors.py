"""Bad input to llama-server's API on a real `minivllm serve` (the stories model, which has
no FIM tokens): malformed bodies, wrong types, huge values and unknown fields, hand-picked
and fuzzed, get a 4xx in llama-server's error shape with a message, never a 5xx or a stuck
request, and the server serves the next request."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.entrypoints.llamacpp.protocol import CompletionRequest, InfillRequest
from tests.server_utils import FAST_ENGINE_ARGS, ServerProcess, stories_model

MAX_MODEL_LEN = 64
JSON_HEADERS = {"Content-Type": "application/json"}
BASE = {"prompt": "Once upon a time", "n_predict": 2}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llamacpp_errors")
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, "--max-model-len",
                                             str(MAX_MODEL_LEN), "--max-request-body-mb", "1"],
                           tmp / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(server):
    # a stuck request fails the test by this timeout
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def assert_llama_error(r: httpx.Response, status: int = 400, says: str = "") -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"code", "message", "type"} and error["code"] == status
    assert error["message"] and says in error["message"]


def assert_serving(http) -> None:
    assert http.get("/health").json() == {"status": "ok"}
    r = http.post("/completion", json=BASE)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2


def test_no_fim_tokens_is_a_400_naming_them(http):
    r = http.post("/infill", json={"input_prefix": "def f(", "input_suffix": ")"})
    assert_llama_error(r, says="no fill-in-the-middle tokens")
    for token in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"):
        assert token in r.json()["error"]["message"]
    r = http.post("/v1/completions", json={"prompt": "def f(", "suffix": ")"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    assert "<|fim_middle|>" in r.json()["error"]["message"]


@pytest.mark.parametrize("body", [b"", b"{bad", b"[]", b"null", b"\xff\xfe", b'"text"',
                                  b'{"prompt": NaN}', b'{"prompt": "a", "n_predict": 1e999}'])
def test_malformed_bodies(http, body):
    for path in ("/completion", "/infill"):
        assert_llama_error(http.post(path, content=body, headers=JSON_HEADERS))
    assert_serving(http)


@pytest.mark.parametrize("fields, says", [
    ({"prompt": 3}, "prompt"), ({"prompt": []}, "prompt"), ({"prompt": [[]]}, "prompt"),
    ({"prompt": [-1]}, "outside the vocabulary"), ({"prompt": [2**40]}, "outside"),
    ({"n_predict": "eight"}, "n_predict"), ({"n_predict": -2}, "n_predict"),
    ({"n_predict": 2**70}, "n_predict"), ({"temperature": "hot"}, "temperature"),
    ({"top_p": 7.0}, "top_p"), ({"min_p": -1}, "min_p"), ({"repeat_penalty": 0}, "repeat_penalty"),
    ({"seed": 2**40}, "seed"), ({"stop": "x"}, "stop"), ({"stop": ["x"] * 1000}, "stop"),
    ({"n_probs": 10_000}, "n_probs"), ({"n_probs": -1}, "n_probs"),
    ({"mirostat": 2}, "mirostat"), ({"logit_bias": [[15, 1.0]]}, "logit_bias"), ({"grammar": "root ::= \"a\""}, "grammar"),
    ({"n_cmpl": 2}, "n_cmpl"), ({"prompt": "a " * 200}, "context length"),
    ({"json_schema": {"type": "nope"}}, "json"),
])
def test_bad_fields(http, fields, says):
    assert_llama_error(http.post("/completion", json={**BASE, **fields}), says=says)
    assert_llama_error(http.post("/completion", json={**BASE, **fields, "stream": True}),
                       says=says)  # refused before the stream starts


def test_unknown_fields_are_ignored_as_llama_server_ignores_them(http):
    r = http.post("/completion", json={**BASE, "no_such_field": [1, {"x": None}],
                                       "cache_prompt": False, "id_slot": 3, "n_keep": -1})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2


def test_tokenize_and_detokenize_bad_input(http):
    assert_llama_error_openai(http.post("/tokenize", json={"content": 3}))
    assert_llama_error_openai(http.post("/tokenize", content=b'{"content": "\\ud800"}',
                                        headers=JSON_HEADERS))
    assert_llama_error_openai(http.post("/tokenize", json={}))
    assert_llama_error_openai(http.post("/detokenize", json={"tokens": [10**12]}))
    assert_llama_error_openai(http.post("/detokenize", json={"tokens": "a"}))
    assert_serving(http)


def assert_llama_error_openai(r: httpx.Response) -> None:
    """/tokenize and /detokenize are vLLM's routes too: OpenAI's error shape, which holds
    llama-server's keys (code, message, type) and a param."""
    assert r.status_code == 400, r.text
    assert {"code", "message", "type"} <= set(r.json()["error"])


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                  max_size=2),
    max_leaves=6)
FIELDS = sorted({*CompletionRequest.model_fields, *InfillRequest.model_fields, "unknown"})


@settings(max_examples=120, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(path=st.sampled_from(["/completion", "/infill", "/completions"]),
       fields=st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=3),
       stream=st.booleans())
def test_fuzzed_fields_never_5xx(http, path, fields, stream):
    body = {**BASE, "input_prefix": "a", "input_suffix": "b", "stream": stream, **fields}
    # Python's JSON: NaN and infinities written as such (the server must refuse them)
    r = http.post(path, content=json.dumps(body), headers=JSON_HEADERS)
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        assert set(r.json()["error"]) == {"code", "message", "type"}
        assert r.json()["error"]["message"]


def test_serving_after_the_fuzz(http, server):
    assert_serving(http)
    assert http.get("/props").status_code == http.get("/slots").status_code == 200
    assert "Traceback" not in server.log()  # no input reached an unexpected failure
