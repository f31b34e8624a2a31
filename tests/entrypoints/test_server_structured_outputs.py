"""Structured outputs through a real `minivllm serve` on the demo model, with the official
openai client: parse() with a pydantic model, a nested JSON schema, regex and choice (vLLM's
structured_outputs and guided_* fields), on chat and completions; 400s naming the field; and
unconstrained requests token-identical whether constrained ones share their batch or not."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

import minivllm
from tests.server_utils import FAST_ENGINE_ARGS, ServerProcess

DEMO = Path(minivllm.__file__).parent / "demo_model"
MODEL = str(DEMO)  # the served name: the path it was given
NESTED = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 16},
        "rating": {"enum": ["good", "bad", "fine"]},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                   "minItems": 1, "maxItems": 4},
        "author": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 10},
            "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2}},
            "required": ["name", "pets"], "additionalProperties": False},
    },
    "required": ["title", "rating", "scores", "author"],
    "additionalProperties": False,
}


class Character(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=1, le=99)
    kind: Literal["cat", "dog", "girl", "boy"]
    friends: list[Annotated[str, Field(max_length=8)]] = Field(max_length=2)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("structured") / "server.log"
    proc = ServerProcess(DEMO, FAST_ENGINE_ARGS, log)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert client.models.list().data[0].id == MODEL
    yield client
    client.close()  # no kept-alive connection for the server's shutdown to wait on


def parallel(fn, items):
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(fn, items))


def test_parse_with_a_pydantic_model_for_20_seeded_prompts(client):
    def ask(seed: int):
        return client.chat.completions.parse(
            model=MODEL, response_format=Character, seed=seed, temperature=1.0,
            max_tokens=100, messages=[{"role": "user", "content": f"Tell me about friend {seed}"}])

    for completion in parallel(ask, range(20)):
        assert isinstance(completion.choices[0].message.parsed, Character)


def test_a_nested_schema_always_validates_on_chat_and_completions(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "review", "schema": NESTED,
                                                  "strict": True}}

    def chat(seed: int) -> str:
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Review it"}],
            response_format=fmt, seed=seed, max_tokens=120).choices[0].message.content

    def complete(seed: int) -> str:
        return client.completions.create(
            model=MODEL, prompt="Once upon a time", seed=seed, max_tokens=120,
            temperature=0.0 if seed == 0 else 1.0,
            extra_body={"response_format": fmt}).choices[0].text

    texts = parallel(chat, range(5)) + parallel(complete, range(5))
    for text in texts:
        jsonschema.validate(json.loads(text), NESTED)
    json_object = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "JSON please"}],
        response_format={"type": "json_object"}, max_tokens=80, seed=3)
    if json_object.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(json_object.choices[0].message.content), dict)


def test_regex_and_choice_always_match(client):
    pattern = r"[A-Z][a-z]{1,6} (cat|dog) [0-9]{2}"
    choices = ["Lily", "Tom", "the big red ball"]

    def run(i: int) -> str:
        body = ({"structured_outputs": {"regex": pattern}}, {"guided_regex": pattern},
                {"structured_outputs": {"choice": choices}}, {"guided_choice": choices})[i % 4]
        if i % 2:
            return client.completions.create(
                model=MODEL, prompt="Once", seed=i, max_tokens=30,
                extra_body=body).choices[0].text
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Name one"}],
            seed=i, max_tokens=30, extra_body=body).choices[0].message.content

    for i, text in enumerate(parallel(run, range(16))):
        assert re.fullmatch(pattern, text) if i % 4 < 2 else text in choices, text


@pytest.mark.parametrize("body, field", [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "integr"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {
                              "if": {"type": "string"}, "then": {"minLength": 2}}}}},
     "response_format.json_schema.schema"),
    ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs.regex"),
    ({"guided_grammar": "root ::= ("}, "guided_grammar"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
     "tool_choice"),
])
def test_bad_constraints_are_400s_naming_the_field(server, body, field):
    import httpx

    for stream in (False, True):
        response = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
            "stream": stream, **body})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == field


def test_unconstrained_requests_are_token_identical_beside_constrained_ones(client):
    prompts = ["Once upon a time", "The little dog", "Lily went"]

    def plain(i: int) -> list[str]:
        return client.completions.create(
            model=MODEL, prompt=prompts[i % 3], max_tokens=24, logprobs=0,
            temperature=0.0 if i < 3 else 0.9, seed=i,
            extra_body={"ignore_eos": True}).choices[0].logprobs.tokens

    def constrained(i: int):
        return client.completions.create(
            model=MODEL, prompt=prompts[i % 3], max_tokens=60, seed=i,
            extra_body={"guided_json": NESTED})

    alone = parallel(plain, range(6))
    with ThreadPoolExecutor(8) as pool:
        busy = [pool.submit(constrained, i) for i in range(4)]
        together = list(pool.map(plain, range(6)))
        [f.result() for f in busy]
    assert together == alone
