"""Fuzzing: schemathesis sends valid and invalid requests built from the server's own
/openapi.json to the completion, chat, tokenize and models routes, and hypothesis sends
in-range sampling requests at their extremes (which reach the sampler, where the schema's
cases mostly stop at validation). No answer may be a 5xx, no stream may end in an error, and
the server must answer a normal request afterwards."""

from __future__ import annotations

import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.server_utils import CHAT_TEMPLATE, FAST_ENGINE_ARGS, ServerProcess, stories_model

pytestmark = pytest.mark.e2e  # make test-e2e (also run by CI), not make test

MAX_EXAMPLES = 60  # per route; about 40 s in all on two shared cores
OPERATIONS = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
              ("GET", "/v1/models"), ("POST", "/tokenize"), ("POST", "/detokenize")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    template = tmp / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    # A short context keeps the longest generation a fuzzer can ask for short.
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, "--max-model-len", "128",
                                             "--chat-template", str(template)],
                           tmp / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


@pytest.mark.parametrize("method,path", OPERATIONS, ids=[p for _, p in OPERATIONS])
def test_no_server_errors(api_schema, server, method, path):
    operation = api_schema[path][method]
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                      operation.as_strategy(GenerationMode.NEGATIVE))

    @given(case=cases)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def no_5xx(case):
        response = case.call(base_url=server.url, timeout=60)
        assert response.status_code < 500, (case.as_curl_command(), response.text[:1000])

    no_5xx()


EXTREME_FLOATS = st.sampled_from([1e-30, 1e-5, 0.5, 1.0, 1e5, 1e30])
SAMPLING = st.fixed_dictionaries({}, optional={
    "temperature": st.one_of(st.just(0.0), EXTREME_FLOATS),
    "top_p": st.sampled_from([1e-30, 0.1, 0.9, 1.0]),
    "top_k": st.sampled_from([-1, 0, 1, 5, 10**9]),
    "min_p": st.sampled_from([0.0, 0.5, 1.0]),
    "repetition_penalty": EXTREME_FLOATS,
    "presence_penalty": st.sampled_from([-2.0, 0.0, 2.0]),
    "frequency_penalty": st.sampled_from([-2.0, 0.0, 2.0]),
    "seed": st.sampled_from([-(2**63), 0, 2**63 - 1]),
    "stop": st.lists(st.text(min_size=1, max_size=4), max_size=4),
    "stop_token_ids": st.lists(st.integers(0, 511), max_size=4),
    "min_tokens": st.integers(0, 4),
    "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "n": st.integers(1, 4),
    "stream": st.booleans(),
})
COMPLETION_ONLY = st.fixed_dictionaries({}, optional={
    "logprobs": st.integers(0, 20), "echo": st.booleans(), "best_of": st.integers(1, 6)})
# Short enough that prompt + max_tokens always fit the 128-token context (a character may
# take four byte tokens).
PROMPTS = st.one_of(st.text(min_size=1, max_size=20),
                    st.lists(st.integers(0, 511), min_size=1, max_size=40))


@given(sampling=SAMPLING, extra=COMPLETION_ONLY, prompt=PROMPTS,
       max_tokens=st.integers(4, 16), chat=st.booleans())
@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_sampling_extremes_never_fail(server, sampling, extra, prompt, max_tokens, chat):
    body = {**sampling, "max_tokens": max_tokens}
    if chat:
        path = "/v1/chat/completions"
        content = prompt if isinstance(prompt, str) else "Once upon a time"
        body["messages"] = [{"role": "user", "content": content}]
        body["logprobs"], body["top_logprobs"] = extra.get("echo", False), extra.get("logprobs")
    else:
        path, body["prompt"] = "/v1/completions", prompt
        body.update(extra)
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code in (200, 400), (body, r.text[:500])
    if r.status_code == 400:  # only the combinations the API refuses by design
        assert r.json()["error"]["param"] in ("best_of", "min_tokens", "top_logprobs"), r.text
    elif body.get("stream"):
        events = [line for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and not any(
            "error" in json.loads(e[6:]) for e in events[:-1]), (body, r.text[-500:])


def test_normal_request_after_fuzzing(server):
    r = httpx.post(server.url + "/v1/completions", timeout=30, json={
        "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200
    assert r.json()["choices"][0]["text"] == ", there was a little girl"
    assert httpx.get(server.url + "/health").status_code == 200
    assert "Traceback" not in server.log()
