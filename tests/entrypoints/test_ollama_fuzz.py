"""Bad input on every /api/* endpoint: malformed JSON, wrong types, huge values, unknown
fields, embeddings asked of a generate runner, a client that leaves mid-stream, then
schemathesis's cases from the server's own /openapi.json and hypothesis's options at their
extremes (those two in `make test-e2e`, with the OpenAI routes' fuzzing). Every answer is a 4xx with
Ollama's {"error": "..."} or a 200, never a 5xx; the server serves a normal request after."""

from __future__ import annotations

import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.entrypoints.test_ollama_api import NAME, tiny_qwen
from tests.server_utils import FAST_ENGINE_ARGS, ServerProcess

MAX_MODEL_LEN = 128
MSG = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("ollama_fuzz")
    model_dir, template = tiny_qwen(root)
    proc = ServerProcess(model_dir, [
        *FAST_ENGINE_ARGS, "--chat-template", str(template), "--served-model-name", NAME,
        "--max-model-len", str(MAX_MODEL_LEN), "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes", "--max-request-body-mb", "1",
        "--runner", "generate"], root / "server.log")
    yield proc
    proc.stop()


def chat(**fields):
    return {"model": NAME, "messages": MSG, "stream": False, **fields}


def gen(**fields):
    return {"model": NAME, "prompt": "Hi", "stream": False, **fields}


# (name, method, path, JSON body or raw bytes, status, words the error must contain)
BAD = [
    ("malformed json", "POST", "/api/chat", b'{"model": "x",', 400, ["JSON"]),
    ("json array", "POST", "/api/generate", b"[1, 2]", 400, ["JSON object"]),
    ("empty body", "POST", "/api/chat", b"", 400, []),
    ("not utf-8", "POST", "/api/embed", b"\xff\xfe{", 400, []),
    ("missing model", "POST", "/api/chat", {"messages": MSG}, 400, ["model"]),
    ("messages not a list", "POST", "/api/chat", chat(messages="hi"), 400, ["messages"]),
    ("bad role", "POST", "/api/chat", chat(messages=[{"role": "wizard", "content": "x"}]),
     400, ["role"]),
    ("content of wrong type", "POST", "/api/chat",
     chat(messages=[{"role": "user", "content": 5}]), 400, ["content"]),
    ("images", "POST", "/api/chat", chat(messages=[{**MSG[0], "images": ["aGk="]}]), 400,
     ["images"]),
    ("tool call arguments not an object", "POST", "/api/chat", chat(messages=[
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "x"}}]}]),
     400, ["arguments"]),
    ("tools of wrong shape", "POST", "/api/chat", chat(tools=[{"function": 3}]), 400,
     ["tools"]),
    ("options not an object", "POST", "/api/chat", chat(options=[1]), 400, ["options"]),
    ("num_predict a string", "POST", "/api/chat", chat(options={"num_predict": "many"}), 400,
     ["num_predict"]),
    ("num_predict zero", "POST", "/api/generate", gen(options={"num_predict": 0}), 400,
     ["options.num_predict"]),
    ("temperature negative", "POST", "/api/chat", chat(options={"temperature": -1}), 400,
     ["options.temperature"]),
    ("top_p above one", "POST", "/api/chat", chat(options={"top_p": 1.5}), 400,
     ["options.top_p"]),
    ("top_k negative", "POST", "/api/generate", gen(options={"top_k": -3}), 400,
     ["options.top_k"]),
    ("repeat_penalty zero", "POST", "/api/chat", chat(options={"repeat_penalty": 0}), 400,
     ["options.repeat_penalty"]),
    ("temperature NaN", "POST", "/api/chat",
     b'{"model": "tiny-qwen", "messages": [], "options": {"temperature": NaN}}', 400,
     ["temperature"]),
    ("seed beyond int64", "POST", "/api/chat", chat(options={"seed": 2**70}), 400, ["seed"]),
    ("stop not strings", "POST", "/api/chat", chat(options={"stop": [1]}), 400, ["stop"]),
    ("too many stop strings", "POST", "/api/chat", chat(options={"stop": ["a"] * 40}), 400,
     ["options.stop"]),
    ("num_ctx past the engine", "POST", "/api/generate", gen(options={"num_ctx": 10**12}),
     400, ["num_ctx", str(MAX_MODEL_LEN)]),
    ("num_ctx zero", "POST", "/api/generate", gen(options={"num_ctx": 0}), 400, ["num_ctx"]),
    ("num_ctx below the prompt", "POST", "/api/generate", gen(options={"num_ctx": 1}), 400,
     ["num_ctx"]),
    ("num_predict past the context", "POST", "/api/generate",
     gen(options={"num_predict": 10**12}), 400, ["128"]),
    ("format a bad string", "POST", "/api/chat", chat(format="yaml"), 400, ["format"]),
    ("format a bad schema", "POST", "/api/chat", chat(format={"type": "nonsense"}), 400,
     ["format"]),
    ("format of wrong type", "POST", "/api/generate", gen(format=3), 400, ["format"]),
    ("keep_alive of wrong type", "POST", "/api/chat", chat(keep_alive=[1]), 400,
     ["keep_alive"]),
    ("stream not a bool", "POST", "/api/chat", chat(stream="yes please"), 400, ["stream"]),
    ("prompt too long", "POST", "/api/generate", gen(prompt="word " * 400, raw=True), 400,
     ["128"]),
    ("context outside the vocabulary", "POST", "/api/generate", gen(context=[1, 10**9]), 400,
     ["context"]),
    ("context of wrong type", "POST", "/api/generate", gen(context="abc"), 400, ["context"]),
    ("template not supported", "POST", "/api/generate",
     gen(template="{{ range .Messages }}x{{ end }}"), 400, ["template"]),
    ("template unclosed", "POST", "/api/generate", gen(template="{{ if .System }}x"), 400,
     ["template"]),
    ("suffix without FIM tokens", "POST", "/api/generate", gen(suffix="return x"), 400,
     ["suffix", "fim"]),
    ("suffix with context", "POST", "/api/generate", gen(suffix="x", context=[1]), 400,
     ["context"]),
    ("lone surrogate", "POST", "/api/generate",
     b'{"model": "tiny-qwen", "prompt": "a\\ud800b", "stream": false}', 400, ["Unicode"]),
    ("unknown model", "POST", "/api/generate", gen(model="gpt-5"), 404, ["gpt-5"]),
    ("embed input of wrong type", "POST", "/api/embed", {"model": NAME, "input": 3}, 400,
     ["input"]),
    ("embed empty input", "POST", "/api/embed", {"model": NAME, "input": []}, 400, ["input"]),
    ("embed too many inputs", "POST", "/api/embed", {"model": NAME, "input": ["a"] * 500},
     400, ["input"]),
    ("embed dimensions zero", "POST", "/api/embed",
     {"model": NAME, "input": "a", "dimensions": 0}, 400, ["dimensions"]),
    ("embeddings without prompt", "POST", "/api/embeddings", {"model": NAME}, 400,
     ["prompt"]),
    ("show without model", "POST", "/api/show", {}, 400, ["model"]),
    ("show unknown model", "POST", "/api/show", {"model": "x:latest"}, 404, ["x:latest"]),
    ("huge body", "POST", "/api/generate", gen(prompt="word " * 300_000), 413,
     ["--max-request-body-mb"]),
    ("huge header", "POST", "/api/chat", b"{}", 431, ["--max-header-kb"]),
    ("pull", "POST", "/api/pull", {"model": "llama3.2"}, 501, ["started with"]),
    ("delete", "DELETE", "/api/delete", {"model": NAME}, 501, ["started with"]),
    ("unknown endpoint", "POST", "/api/nothing", {}, 404, ["/api/nothing"]),
    ("wrong method", "GET", "/api/generate", None, 405, ["GET"]),
]


@pytest.mark.parametrize("name,method,path,body,status,words", BAD, ids=[b[0] for b in BAD])
def test_bad_request(server, name, method, path, body, status, words):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    if name == "huge header":
        kwargs["headers"] = {"X-Big": "x" * 40_000}
    r = httpx.request(method, server.url + path, timeout=30,
                      **(kwargs if body is not None else {}))
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert isinstance(error, str) and error and len(error) <= 600
    for word in words:
        assert word in error, error


def test_embed_on_a_generate_runner_is_a_clear_400(server):
    r = httpx.post(server.url + "/api/embed", json={"model": NAME, "input": "Hi"}, timeout=30)
    assert r.status_code == 400 and "--runner generate" in r.json()["error"], r.text


def test_unknown_fields_are_ignored_as_ollama_ignores_them(server):
    r = httpx.post(server.url + "/api/chat", timeout=30, json=chat(
        options={"num_predict": 2, "num_gpu": 99, "mirostat": 2, "numa": True},
        unknown_field={"x": 1}, think=True))
    assert r.status_code == 200 and r.json()["done"]


def test_a_client_leaving_mid_stream_stops_its_request(server):
    with httpx.stream("POST", server.url + "/api/generate", timeout=30,
                      json={"model": NAME, "prompt": "Hi", "raw": True}) as r:
        first = next(r.iter_lines())
        assert json.loads(first)["done"] is False
    r = httpx.post(server.url + "/api/generate", timeout=30,
                   json=gen(raw=True, options={"num_predict": 4, "temperature": 0}))
    assert r.status_code == 200 and r.json()["eval_count"] == 4


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


OPERATIONS = [("POST", "/api/chat"), ("POST", "/api/generate"), ("POST", "/api/embed"),
              ("POST", "/api/embeddings"), ("POST", "/api/show"), ("GET", "/api/tags"),
              ("GET", "/api/ps"), ("GET", "/api/version")]


@pytest.mark.e2e  # the fuzzers run in make test-e2e, as the OpenAI routes' do
@pytest.mark.parametrize("method,path", OPERATIONS, ids=[p for _, p in OPERATIONS])
def test_schema_cases_get_no_server_error(api_schema, server, method, path):
    operation = api_schema[path][method]
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                      operation.as_strategy(GenerationMode.NEGATIVE))

    @given(case=cases)
    @settings(max_examples=25, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def no_5xx(case):
        response = case.call(base_url=server.url, timeout=60)
        assert response.status_code < 500, (case.as_curl_command(), response.text[:1000])
        if response.status_code >= 400:
            assert isinstance(response.json()["error"], str)

    no_5xx()
    assert_still_serving(server)


OPTIONS = st.fixed_dictionaries({}, optional={
    "temperature": st.sampled_from([0.0, 1e-30, 0.5, 1.0, 1e5, 1e30]),
    "top_p": st.sampled_from([1e-30, 0.1, 1.0]),
    "top_k": st.sampled_from([-1, 0, 1, 5, 10**9]),
    "min_p": st.sampled_from([0.0, 0.5, 1.0]),
    "repeat_penalty": st.sampled_from([1e-5, 1.0, 2.0, 1e5]),
    "presence_penalty": st.sampled_from([-2.0, 0.0, 2.0]),
    "frequency_penalty": st.sampled_from([-2.0, 0.0, 2.0]),
    "seed": st.sampled_from([-(2**63), 0, 2**63 - 1]),
    "stop": st.lists(st.text(min_size=1, max_size=4), max_size=4),
    "num_predict": st.sampled_from([-2, -1, 1, 16]),
    "num_ctx": st.sampled_from([64, 128]),
})


@pytest.mark.e2e
@given(options=OPTIONS, stream=st.booleans(), endpoint=st.sampled_from(["chat", "generate"]),
       prompt=st.text(min_size=1, max_size=20))
@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_options_at_their_extremes_never_fail(server, options, stream, endpoint, prompt):
    body = {"model": NAME, "options": options, "stream": stream}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    r = httpx.post(f"{server.url}/api/{endpoint}", json=body, timeout=60)
    assert r.status_code in (200, 400), (body, r.text[:500])
    if r.status_code == 400:  # only a prompt the num_ctx asked for cannot hold
        assert "num_ctx" in r.json()["error"], r.text
        return
    lines = [json.loads(x) for x in r.text.splitlines()] if stream else [r.json()]
    assert lines[-1]["done"] and not any("error" in x for x in lines), (body, r.text[-500:])


def assert_still_serving(server):
    r = httpx.post(server.url + "/api/chat", timeout=30,
                   json=chat(options={"num_predict": 4, "temperature": 0}))
    assert r.status_code == 200 and r.json()["eval_count"] >= 1
    assert httpx.get(server.url + "/health").status_code == 200
    assert "Traceback" not in server.log()


def test_a_normal_request_after_all_the_bad_ones(server):
    assert_still_serving(server)
