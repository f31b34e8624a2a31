"""Ollama's API (/api/*) through the official `ollama` Python client and langchain-ollama's
ChatOllama, against a real `minivllm serve` on a tiny random-weight Qwen2 (the demo
tokenizer, a Hermes-style tools template, the hermes tool parser): chat whole and
streamed, generate (raw, Ollama's template, the chat template, context), the options,
format json and a JSON schema, tools, list, show, ps, version, name:tag forms, and the
501 of the file endpoints. Random weights: greedy answers are compared with each other, not
with expected text."""

from __future__ import annotations

import json
import shutil

import httpx
import jsonschema
import ollama
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from minivllm.entrypoints.ollama import go_template
from minivllm.entrypoints.ollama.serving import OllamaServingGeneration, Run
from minivllm.entrypoints.openai.chat_completion.choice_parser import ChoiceParser
from minivllm.entrypoints.openai.chat_completion.tool_parsers import HermesToolParser
from tests.entrypoints.test_server_tool_calls import DEMO, TOOLS, TOOLS_TEMPLATE, WEATHER
from tests.server_utils import FAST_ENGINE_ARGS, ServerProcess

NAME = "tiny-qwen"
MAX_MODEL_LEN = 768
GREEDY = {"temperature": 0, "num_predict": 8}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMA = {"type": "object", "properties": {"age": {"type": "integer", "maximum": 120},
                                           "ok": {"type": "boolean"}},
          "required": ["age", "ok"], "additionalProperties": False}


def tiny_qwen(root):
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
    return model_dir, root / "tools.jinja"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("ollama")
    model_dir, template = tiny_qwen(root)
    proc = ServerProcess(model_dir, [
        *FAST_ENGINE_ARGS, "--chat-template", str(template), "--served-model-name", NAME,
        "--max-model-len", str(MAX_MODEL_LEN), "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes"], root / "server.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url)


def status_of(call) -> tuple[int, str]:
    with pytest.raises(ollama.ResponseError) as info:
        call()
    return info.value.status_code, info.value.error


def test_chat_whole_and_streamed_say_the_same(client):
    whole = client.chat(model=NAME, messages=ASK, options=GREEDY)
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.model == NAME and whole.created_at.endswith("Z")
    assert 1 <= whole.eval_count <= 8 and whole.prompt_eval_count > 5
    assert whole.load_duration == 0
    assert whole.total_duration >= whole.prompt_eval_duration + whole.eval_duration > 0
    chunks = list(client.chat(model=NAME, messages=ASK, options=GREEDY, stream=True))
    assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert "".join(c.message.content for c in chunks) == whole.message.content
    last = chunks[-1]
    assert (last.eval_count, last.prompt_eval_count, last.done_reason) == (
        whole.eval_count, whole.prompt_eval_count, whole.done_reason)


def test_generate_raw_template_and_chat_template(client):
    raw = client.generate(model=NAME, prompt="Once upon a time", raw=True, options=GREEDY)
    assert raw.response and raw.context is None  # raw mode returns no context
    # Ollama's Go template, here the prompt as it is: the raw prompt's answer
    templated = client.generate(model=NAME, prompt="Once upon a time", options=GREEDY,
                                template="{{ if .System }}{{ .System }} {{ end }}{{ .Prompt }}")
    assert templated.response == raw.response
    with_system = client.generate(model=NAME, prompt="upon a time", system="Once",
                                  options=GREEDY,
                                  template="{{- if .System }}{{ .System }} {{ end }}{{ .Prompt }}")
    assert with_system.response == raw.response
    # the model's chat template (a user turn), and its context carried to the next request
    chat = client.generate(model=NAME, prompt="Once upon a time", options=GREEDY)
    assert chat.prompt_eval_count > raw.prompt_eval_count
    assert len(chat.context) == chat.prompt_eval_count + chat.eval_count
    follow = client.generate(model=NAME, prompt="and then", context=chat.context, raw=True,
                             options=GREEDY)
    assert follow.prompt_eval_count > len(chat.context)
    streamed = list(client.generate(model=NAME, prompt="Once upon a time", raw=True,
                                    options=GREEDY, stream=True))
    assert "".join(c.response for c in streamed) == raw.response and streamed[-1].done


def test_options_reach_the_sampler(client):
    def text(**options):
        return client.generate(model=NAME, prompt="Once upon a time", raw=True,
                               options={"num_predict": 10, **options}).response

    greedy = text(temperature=0)
    assert text(temperature=1.0, top_k=1) == greedy
    assert text(temperature=1.0, min_p=1.0) == greedy
    assert text(temperature=1.5, seed=7) == text(temperature=1.5, seed=7)
    # random weights loop within 30 greedy tokens; the penalty breaks the loop
    assert text(temperature=0, num_predict=30, repeat_penalty=1.3) != text(
        temperature=0, num_predict=30)
    stop = greedy.strip()[3:6]
    assert stop and text(temperature=0, stop=[stop]) == greedy[:greedy.index(stop)]
    short = client.generate(model=NAME, prompt="Once upon a time", raw=True,
                            options={"temperature": 0, "num_predict": 3})
    assert short.eval_count <= 3 and short.response == greedy[:len(short.response)]
    assert short.done_reason == "length" or short.eval_count < 3


def test_num_ctx_bounds_the_answer_and_is_refused_past_the_engine(client):
    prompt_len = client.generate(model=NAME, prompt="Once upon a time", raw=True,
                                 options={"num_predict": 1}).prompt_eval_count
    bounded = client.generate(model=NAME, prompt="Once upon a time", raw=True,
                              options={"temperature": 0, "num_ctx": prompt_len + 4})
    assert bounded.eval_count <= 4
    status, error = status_of(lambda: client.chat(model=NAME, messages=ASK,
                                                  options={"num_ctx": MAX_MODEL_LEN + 1}))
    assert status == 400 and "num_ctx" in error and str(MAX_MODEL_LEN) in error


@pytest.mark.parametrize("endpoint", ["chat", "generate"])
def test_format_json_and_a_schema(client, endpoint):
    def answer(fmt, seed):
        options = {"temperature": 1.0, "seed": seed, "num_predict": 200}
        if endpoint == "chat":
            r = client.chat(model=NAME, messages=ASK, format=fmt, options=options)
            return r.message.content, r.done_reason
        r = client.generate(model=NAME, prompt="Give JSON", format=fmt, options=options)
        return r.response, r.done_reason

    for seed in range(3):
        # random weights rarely close a free string: what the grammar guarantees is an
        # object under way, and a whole one when the model stops
        text, reason = answer("json", seed)
        assert text.startswith("{"), text
        assert reason == "length" or isinstance(json.loads(text), dict), text
        text, reason = answer(SCHEMA, seed)
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)


def test_tools_are_rendered_and_calls_sent_back_render_too(client):
    plain = client.chat(model=NAME, messages=ASK, options={"num_predict": 1})
    with_tools = client.chat(model=NAME, messages=ASK, tools=TOOLS, options={"num_predict": 1})
    assert with_tools.prompt_eval_count > plain.prompt_eval_count + 20  # the tools template
    call = {"function": {"name": "get_weather",
                         "arguments": {"city": "Paris", "unit": "celsius", "days": 1}}}
    conversation = ASK + [{"role": "assistant", "content": "", "tool_calls": [call]},
                          {"role": "tool", "content": '{"temp": 21}', "tool_name": "get_weather"}]
    answer = client.chat(model=NAME, messages=conversation, tools=TOOLS,
                         options={"num_predict": 4})
    assert answer.done and answer.prompt_eval_count > with_tools.prompt_eval_count + 10


def test_a_hermes_call_becomes_ollamas_tool_calls_whole_and_streamed():
    """The mapping of a parsed call (the real model writes one: test_ollama_real_model)."""
    text = ('Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris", '
            '"unit": "celsius", "days": 2}}</tool_call>')
    expected = [{"function": {"name": "get_weather",
                              "arguments": {"city": "Paris", "unit": "celsius", "days": 2}}}]
    body = OllamaServingGeneration._chat_body
    whole = body(Run("m", 0, parser=ChoiceParser("auto", None, HermesToolParser())),
                 text, True, True)
    assert whole["message"] == {"role": "assistant", "content": "Sure.",
                                "tool_calls": expected}
    run = Run("m", 0, parser=ChoiceParser("auto", None, HermesToolParser()))
    pieces = [body(run, text[i:i + 7], i + 7 >= len(text), False)
              for i in range(0, len(text), 7)]
    calls = [c for p in pieces if p for c in p["message"].get("tool_calls", [])]
    content = "".join(p["message"]["content"] for p in pieces if p)
    assert calls == expected and content.strip() == "Sure."
    jsonschema.validate(calls[0]["function"]["arguments"], WEATHER)


def test_list_show_ps_version(client, server):
    (entry,) = client.list().models
    assert entry.model == NAME and entry.size > 0 and len(entry.digest) == 64
    assert entry.details.format == "safetensors" and entry.details.family == "qwen2"
    assert entry.details.parameter_size.endswith("K") or entry.details.parameter_size.endswith("M")
    assert entry.details.quantization_level == "F32"
    shown = client.show(f"{NAME}:latest")
    assert shown.template == TOOLS_TEMPLATE
    assert shown.modelinfo["general.architecture"] == "qwen2"
    assert shown.modelinfo["qwen2.context_length"] == 1024
    assert shown.modelinfo["qwen2.block_count"] == 2
    assert f"num_ctx{' ' * 24}{MAX_MODEL_LEN}" in shown.parameters
    assert {"completion", "tools"} <= set(shown.capabilities)
    (running,) = client.ps().models
    assert running.model == NAME and running.context_length == MAX_MODEL_LEN
    assert running.size_vram == 0 and running.expires_at.year == 9999
    version = httpx.get(server.url + "/api/version").json()["version"]
    assert version and isinstance(version, str)
    # the heartbeat Ollama's CLI sends first
    assert httpx.head(server.url + "/").status_code == 200
    assert httpx.get(server.url + "/").text == "Ollama is running"


def test_names_with_tags_resolve_and_unknown_ones_are_404(client):
    for name in (NAME, f"{NAME}:latest"):
        assert client.chat(model=name, messages=ASK, options={"num_predict": 1}).model == name
    for name in (f"{NAME}:7b", "llama3.2", "other:latest"):
        status, error = status_of(lambda name=name: client.chat(model=name, messages=ASK))
        assert status == 404 and name in error and NAME in error
    assert status_of(lambda: client.show("nope"))[0] == 404


def test_keep_alive_is_accepted_and_an_empty_request_loads(client):
    for keep_alive in ("5m", 0, -1, 3.5):
        assert client.chat(model=NAME, messages=ASK, keep_alive=keep_alive,
                           options={"num_predict": 1}).done
    loaded = client.chat(model=NAME, messages=[])
    assert loaded.done and loaded.done_reason == "load" and loaded.message.content == ""
    assert client.generate(model=NAME, prompt="", keep_alive=0).done_reason == "load"


def test_file_endpoints_answer_501(client):
    calls = [lambda: client.pull(NAME), lambda: client.push(NAME),
             lambda: client.create("x", from_=NAME), lambda: client.delete(NAME),
             lambda: client.copy(NAME, "y")]
    for call in calls:
        status, error = status_of(call)
        assert status == 501 and "started with" in error


def test_embed_on_a_generate_runner_is_served_or_refused_clearly(client):
    """--runner auto (the default here) serves embeddings too: one vector per input."""
    vectors = client.embed(model=NAME, input=["Once upon a time", "The end"]).embeddings
    assert len(vectors) == 2 and len(vectors[0]) == 64


def test_langchain_chat_ollama(server, client):
    from langchain_ollama import ChatOllama

    llm = ChatOllama(model=NAME, base_url=server.url, temperature=0, num_predict=8)
    reply = llm.invoke("What is the weather in Paris?")
    expected = client.chat(model=NAME, messages=ASK, options=GREEDY).message.content
    assert reply.content == expected
    assert reply.usage_metadata["output_tokens"] >= 1


def test_go_template_subset():
    values = {"System": "S", "Prompt": "P"}
    template = "{{ if .System }}<s>{{ .System }}</s>{{ else }}none{{ end }}\n{{- .Prompt }}"
    assert go_template.render(template, values) == "<s>S</s>P"
    assert go_template.render(template, {"Prompt": "P"}) == "noneP"
    assert go_template.render("{{ .Prompt }} -{{ .Response }}", values) == "P -"
    for bad, words in [("{{ .Prompt }", "never closed"), ("{{ range .Messages }}", "range"),
                       ("{{ if .System }}x", "{{ end }}"), ("{{ .Foo }}", ".Foo")]:
        with pytest.raises(ValueError, match=words):
            go_template.render(bad, values)
