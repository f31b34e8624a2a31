"""Ollama's clients against `minivllm serve` on Qwen2.5-Coder-0.5B-Instruct's Q4_K_M GGUF
file (its blocks, as Ollama runs it), named as Ollama would name it: the official `ollama`
client's chat (whole and streamed), generate, embed, list, show, ps, a tool call (the
llama3_json parser) and structured output (format json and a schema), and langchain-ollama's
ChatOllama. `make test-real-models`."""

from __future__ import annotations

import json
import math
import os

import jsonschema
import ollama
import pytest

from minivllm.bench.qwen25_coder import qwen25_coder_gguf
from tests.server_utils import ServerProcess

pytestmark = pytest.mark.real_model

NAME = "qwen2.5-coder:0.5b"
MAX_MODEL_LEN = 2048
USER_CACHE = os.environ.get("MINIVLLM_CACHE")  # the file's model directory, built once
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"}},
        "required": ["city"]}}}
CITY = {"type": "object", "properties": {
    "name": {"type": "string"}, "country": {"type": "string"},
    "population_millions": {"type": "number"}},
    "required": ["name", "country", "population_millions"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        if USER_CACHE is None:
            patch.delenv("MINIVLLM_CACHE", raising=False)
        try:
            path = qwen25_coder_gguf()
        except RuntimeError as exc:
            pytest.fail(f"cannot assemble Qwen2.5-Coder-0.5B's GGUF file: {exc}")
        proc = ServerProcess(path, [
            "--served-model-name", NAME, "--max-model-len", str(MAX_MODEL_LEN),
            "--num-kv-blocks", "256", "--max-num-seqs", "4",
            # this 0.5B model writes its calls as bare JSON objects, without Hermes's
            # <tool_call> tags (measured at greedy): the llama3_json parser reads those
            "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"],
            tmp_path_factory.mktemp("ollama_real") / "server.log", ready_timeout=300)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=300)


def ask(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


GREEDY = {"temperature": 0, "num_predict": 32}


def test_chat_whole_and_streamed(client):
    messages = ask("What is 2 + 2? Answer with the number only.")
    whole = client.chat(model=NAME, messages=messages, options=GREEDY)
    assert "4" in whole.message.content and whole.done_reason == "stop"
    assert whole.prompt_eval_count > 10 and whole.eval_count >= 1
    assert whole.eval_duration > 0 and whole.prompt_eval_duration > 0
    chunks = list(client.chat(model="qwen2.5-coder:0.5b", messages=messages, options=GREEDY,
                              stream=True))
    assert "".join(c.message.content for c in chunks) == whole.message.content
    assert chunks[-1].done and chunks[-1].eval_count == whole.eval_count


def test_generate(client):
    answer = client.generate(model=NAME, prompt="Write a Python function add(a, b) that "
                             "returns their sum.", options={"temperature": 0, "num_predict": 64})
    assert "def add(a, b)" in answer.response
    assert len(answer.context) == answer.prompt_eval_count + answer.eval_count
    raw = client.generate(model=NAME, prompt="def fibonacci(n):", raw=True,
                          options={"temperature": 0, "num_predict": 24})
    assert "fibonacci" in raw.response or "return" in raw.response


def test_generate_with_a_suffix_fills_in_the_middle(client):
    middle = client.generate(model=NAME, prompt="def add(a, b):\n    ",
                             suffix="\n\nprint(add(1, 2))\n",
                             options={"temperature": 0, "num_predict": 24})
    # the middle first (this instruct model then goes on writing past the suffix's code)
    assert middle.response.startswith("return a + b")


def test_list_show_ps(client):
    (entry,) = client.list().models
    assert entry.model == NAME and entry.size == qwen25_coder_gguf().stat().st_size
    assert entry.details.format == "gguf" and entry.details.family == "qwen2"
    assert entry.details.quantization_level == "Q4_K_M"
    # every tensor counted, the file's separate LM head too (Ollama's registry copy ties it)
    assert entry.details.parameter_size == "630.17M"
    shown = client.show("qwen2.5-coder")  # a bare name: the served one, tag and all
    assert shown.modelinfo["general.architecture"] == "qwen2"
    assert shown.modelinfo["qwen2.context_length"] == 32768
    assert shown.modelinfo["qwen2.block_count"] == 24
    assert "<|im_start|>" in shown.template
    assert {"completion", "tools", "embedding"} <= set(shown.capabilities)
    (running,) = client.ps().models
    assert running.model == NAME and running.context_length == MAX_MODEL_LEN


def test_tool_call_whole_and_streamed(client):
    messages = ask("What is the weather like in Paris today?")
    whole = client.chat(model=NAME, messages=messages, tools=[WEATHER_TOOL], options=GREEDY)
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather" and "Paris" in call.function.arguments["city"]
    streamed = [c for chunk in client.chat(model=NAME, messages=messages, tools=[WEATHER_TOOL],
                                           options=GREEDY, stream=True)
                for c in chunk.message.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in streamed] == [
        (call.function.name, call.function.arguments)]
    # the call and the tool's answer sent back: the model answers from it
    conversation = messages + [
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
        {"role": "tool", "content": '{"temperature_celsius": 21, "sky": "sunny"}',
         "tool_name": "get_weather"}]
    answer = client.chat(model=NAME, messages=conversation, tools=[WEATHER_TOOL],
                         options={"temperature": 0, "num_predict": 48})
    assert "21" in answer.message.content and not answer.message.tool_calls


def test_structured_output(client):
    text = client.chat(model=NAME, messages=ask("Describe Tokyo as JSON."), format=CITY,
                       options={"temperature": 0, "num_predict": 100}).message.content
    city = json.loads(text)
    jsonschema.validate(city, CITY)
    assert city["name"] == "Tokyo"
    text = client.generate(model=NAME, prompt="List three colors as a JSON object.",
                           format="json", options={"temperature": 0, "num_predict": 100})
    assert isinstance(json.loads(text.response), dict)


def test_embed(client):
    vectors = client.embed(model=NAME, input=["The cat sat on the mat.",
                                              "A cat was sitting on a mat.",
                                              "Quarterly revenue grew by 4 percent."]).embeddings

    def cosine(a, b):
        return sum(x * y for x, y in zip(a, b)) / math.hypot(*a) / math.hypot(*b)

    assert len(vectors) == 3 and len(vectors[0]) == 896
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])


def test_langchain_chat_ollama(server):
    from langchain_ollama import ChatOllama

    llm = ChatOllama(model=NAME, base_url=server.url, temperature=0, num_predict=32)
    assert "4" in llm.invoke("What is 2 + 2? Answer with the number only.").content
    called = llm.bind_tools([WEATHER_TOOL]).invoke("What is the weather like in Paris today?")
    assert called.tool_calls and called.tool_calls[0]["name"] == "get_weather"
