"""llama-server's infill on a real code model, Qwen2.5-Coder-0.5B-Instruct (its Q4_K_M GGUF
file, served as its blocks): /infill of a function body that its prefix and suffix pin is,
token for token (greedy), what the model writes for the raw FIM prompt through /completion,
and ends at the model's end of text; the openai SDK's completions.create(suffix=...) gets
the same middle."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from minivllm.bench.qwen25_coder import qwen25_coder_gguf
from tests.server_utils import ServerProcess

pytestmark = pytest.mark.real_model

# The suffix pins the body; the 0.5B Instruct model then goes on past it, as FIM models do
# without llama.vim's n_indent (measured: "    return x * x\n\n\nassert square(5) == 25\n")
PREFIX = "def square(x):\n"
SUFFIX = "\n\n\nassert square(3) == 9\n"
BODY = "    return x * x\n"
# llama-server's layout for a model with repo and file tokens (no input_extra)
RAW_FIM = ("<|repo_name|>myproject\n<|file_sep|>filename\n<|fim_prefix|>" + PREFIX
           + "<|fim_suffix|>" + SUFFIX + "<|fim_middle|>")
GREEDY = {"temperature": 0, "n_predict": 32, "return_tokens": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    try:
        gguf = qwen25_coder_gguf()
    except RuntimeError as exc:
        pytest.fail(f"cannot assemble Qwen2.5-Coder-0.5B's GGUF file: {exc}")
    # 8192: room for llama-server's repo-level header (a context of at most its 2048-token
    # batch keeps none)
    server = ServerProcess(gguf, ["--max-model-len", "8192", "--max-num-seqs", "4",
                                  "--served-model-name", "qwen-coder"],
                           tmp_path_factory.mktemp("llamacpp_real") / "server.log",
                           ready_timeout=300)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def test_infill_is_the_raw_fim_prompt_token_for_token(http):
    infill = http.post("/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX,
                                        **GREEDY}).json()
    raw = http.post("/completion", json={"prompt": RAW_FIM, **GREEDY}).json()
    assert infill["tokens"] == raw["tokens"] and infill["content"] == raw["content"]
    assert infill["tokens_evaluated"] == raw["tokens_evaluated"]
    assert infill["content"].startswith(BODY)
    # the middle ends at <|endoftext|>, an end-of-generation token for llama.cpp
    assert infill["stop_type"] == "eos" and infill["tokens_predicted"] < 32


def test_n_indent_ends_the_middle_with_the_body(http):
    """llama.vim's n_indent (the cursor's indentation): the first line less indented ends
    the answer before it."""
    infill = http.post("/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX,
                                        "n_indent": 4, **GREEDY}).json()
    assert infill["content"] == BODY and infill["stop_type"] == "limit"
    with http.stream("POST", "/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX,
                                              "n_indent": 4, "stream": True, **GREEDY}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == BODY and events[-1]["stop"] is True


def test_t_max_predict_ms_ends_at_a_newline(http):
    """llama-server's time limit: past it, the answer ends once it has a newline."""
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, **GREEDY}
    whole = http.post("/infill", json=body).json()
    limited = http.post("/infill", json={**body, "t_max_predict_ms": 1}).json()
    assert limited["stop_type"] == "limit" and "\n" in limited["content"]
    assert limited["tokens_predicted"] < whole["tokens_predicted"]
    assert whole["content"].startswith(limited["content"])


def test_openai_sdk_suffix(server, http):
    infill = http.post("/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX,
                                        **GREEDY}).json()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    completion = client.completions.create(model="qwen-coder", prompt=PREFIX, suffix=SUFFIX,
                                           max_tokens=32, temperature=0)
    assert completion.choices[0].text == infill["content"]
    assert completion.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="qwen-coder", prompt=PREFIX, suffix=SUFFIX,
                                         max_tokens=32, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == infill["content"]


def test_fim_tokens_and_pieces(http):
    """A piece is its text, or its bytes where a token holds part of a character (🦩's
    four bytes are two tokens here: 3 + 1)."""
    pieces = http.post("/tokenize", json={"content": "<|fim_prefix|>é🦩",
                                          "with_pieces": True}).json()["tokens"]
    assert pieces[:2] == [{"id": 151659, "piece": "<|fim_prefix|>"}, {"id": 963, "piece": "é"}]
    assert [p["piece"] for p in pieces[2:]] == [[240, 159, 166], [169]]
    assert bytes([240, 159, 166, 169]).decode() == "🦩"


def test_json_schema(http):
    """llama-server's json_schema, through minivllm's structured output backend."""
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
              "required": ["answer"], "additionalProperties": False}
    r = http.post("/completion", json={"prompt": "2 + 3 as JSON: ", "json_schema": schema,
                                       "n_predict": 32, "temperature": 0})
    assert r.status_code == 200, r.text
    assert isinstance(json.loads(r.json()["content"])["answer"], int)
