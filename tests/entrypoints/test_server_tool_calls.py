"""Tool calling and reasoning through a real `minivllm serve` on a tiny random-weight model
(random weights: the hard case for constrained output) with a Hermes-style tools template
written here, with the official openai client: tool_choice "required" and named always give
tool_calls whose arguments validate against the tool's schema, streamed and not; a whole round
trip (call, tool message, answer); the hermes parser (tool_choice auto) and the qwen3
reasoning parser on text the grammar makes the model write; a nested schema on random
weights."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

import minivllm
from tests.entrypoints.test_server_structured_outputs import NESTED
from tests.server_utils import FAST_ENGINE_ARGS, ServerProcess

DEMO = Path(minivllm.__file__).parent / "demo_model"
# Qwen2.5's tool format, on the demo tokenizer's role tokens.
TOOLS_TEMPLATE = """{{ bos_token }}{% if tools %}<|system|>
You may call these functions, one <tool_call>{"name": ..., "arguments": ...}</tool_call> each:
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}{{ eos_token }}
{% endif %}{% for m in messages %}{% if m.role == 'tool' %}<|user|>
<tool_response>{{ m.content }}</tool_response>{{ eos_token }}
{% elif m.role == 'assistant' and m.tool_calls %}<|assistant|>
{% for call in m.tool_calls %}<tool_call>{"name": "{{ call.function.name }}", "arguments": \
{{ call.function.arguments | tojson }}}</tool_call>{% endfor %}{{ eos_token }}
{% else %}<|{{ m.role }}|>
{{ m.content }}{{ eos_token }}
{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>
{% endif %}"""
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "JST"]}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("tools")
    model_dir = root / "random-qwen2"
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=920, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO / name, model_dir / name)
    (root / "tools.jinja").write_text(TOOLS_TEMPLATE)
    proc = ServerProcess(model_dir, [
        *FAST_ENGINE_ARGS, "--chat-template", str(root / "tools.jinja"),
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--reasoning-parser", "qwen3"], root / "server.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    yield client
    client.close()  # no kept-alive connection for the server's shutdown to wait on


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def assert_valid(calls: list[tuple[str, str]], named: str | None = None) -> None:
    assert calls
    for name, arguments in calls:
        assert name == named if named else name in SCHEMAS
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def streamed_calls(stream) -> tuple[list[tuple[str, str]], str]:
    """The calls a stream carried (name from the first delta of each index, arguments
    joined from the fragments) and its finish reason."""
    names, arguments, ids, finish = {}, defaultdict(str), {}, None
    for chunk in stream:
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            if delta.id:
                assert delta.index not in ids and delta.function.name  # id and name first
                ids[delta.index], names[delta.index] = delta.id, delta.function.name
            arguments[delta.index] += delta.function.arguments or ""
    return [(names[i], arguments[i]) for i in sorted(names)], finish


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_tool_calls_are_always_valid_streamed_and_not(client, model, choice):
    tool_choice = ("required" if choice == "required"
                   else {"type": "function", "function": {"name": "get_weather"}})
    named = None if choice == "required" else "get_weather"

    def run(seed: int):
        # One call each: random weights may go on adding parallel calls to max_tokens.
        kwargs = dict(model=model, messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice,
                      seed=seed, temperature=1.0, max_tokens=120, parallel_tool_calls=False)
        if seed % 2:
            return streamed_calls(client.chat.completions.create(stream=True, **kwargs))
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
        assert len({c.id for c in choice.message.tool_calls}) == len(calls)
        return calls, choice.finish_reason

    with ThreadPoolExecutor(8) as pool:
        for calls, finish in pool.map(run, range(6)):
            assert finish == "tool_calls" and len(calls) == 1
            assert_valid(calls, named)


def test_required_parallel_calls_are_each_valid(client, model):
    """Parallel calls: every call begun and completed validates, whether the model closed
    the list or ran into max_tokens."""
    message = client.chat.completions.create(
        model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required", seed=1,
        temperature=1.0, max_tokens=200).choices[0].message
    assert_valid([(c.function.name, c.function.arguments) for c in message.tool_calls])


def test_a_tool_round_trip(client, model):
    asked = client.chat.completions.create(
        model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required", seed=5,
        max_tokens=120)
    first = asked.choices[0].message
    call = first.tool_calls[0]
    conversation = MESSAGES + [
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 21})}]
    response = client.chat.completions.create(
        model=model, messages=conversation, tools=TOOLS, tool_choice="none",
        max_tokens=12, seed=5)
    answer = response.choices[0]
    assert answer.message.tool_calls == [] and answer.message.content
    assert answer.finish_reason in ("stop", "length")
    # The template wrote the call and the tool's answer into the prompt.
    rendered = len(call.function.arguments) + len(call.function.name)
    assert response.usage.prompt_tokens > asked.usage.prompt_tokens + rendered // 4


def test_auto_tool_choice_parses_hermes_calls_and_reasoning(client, model):
    """The grammar makes the random model write what a tool-calling model would: the hermes
    parser must find the call and the qwen3 parser the thinking, whole and streamed."""
    text = ('<think>[a-z]{1,8}</think>Sure\\. <tool_call>\\{"name": "get_time", '
            '"arguments": \\{"zone": "(UTC|CET)"\\}\\}</tool_call>')
    kwargs = dict(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="auto",
                  max_tokens=80, seed=2, extra_body={"structured_outputs": {"regex": text}})
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert whole.message.content == "Sure."
    assert whole.message.reasoning_content.isalpha()
    assert_valid([(c.function.name, c.function.arguments) for c in whole.message.tool_calls],
                 "get_time")
    stream = list(client.chat.completions.create(stream=True, **kwargs))
    calls, finish = streamed_calls(stream)
    assert finish == "tool_calls" and calls == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join(d.reasoning_content or "" for d in deltas) == whole.message.reasoning_content
    assert "".join(d.content or "" for d in deltas).strip() == "Sure."


def test_a_nested_schema_validates_on_random_weights(client, model):
    fmt = {"type": "json_schema", "json_schema": {"name": "review", "schema": NESTED}}
    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(lambda seed: client.chat.completions.create(
            model=model, messages=MESSAGES, response_format=fmt, seed=seed, max_tokens=150,
            temperature=1.0).choices[0].message.content, range(4)))
    for text in texts:
        jsonschema.validate(json.loads(text), NESTED)
