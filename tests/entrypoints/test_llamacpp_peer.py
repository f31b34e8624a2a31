"""minivllm's llama-server API beside llama-server itself (the peer `make peer-llama-server`
builds) on the same GGUF file, Qwen2.5-Coder-0.5B-Instruct Q4_K_M: the same requests to
both get the same response keys, with values of the same JSON types, for /completion (whole,
with n_probs, streamed), /infill, /tokenize, /props and /health. The greedy texts are
printed, not compared: minivllm runs the file's blocks with int8 activations, llama.cpp
with its own (the arithmetic differs). `make test-peers`; fails without the peer."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from minivllm.bench.qwen25_coder import qwen25_coder_gguf
from tests.server_utils import ServerProcess, free_port

pytestmark = pytest.mark.peer

LLAMA_SERVER = Path(__file__).resolve().parents[2] / "peers/llama.cpp/build/bin/llama-server"
N_CTX = 8192  # room for the repo-level layout and input_extra (2048 would keep none)
PREFIX = "def square(x):\n"
SUFFIX = "\n\n\nassert square(3) == 9\n"
COMPLETION = {"prompt": "def fibonacci(n):", "n_predict": 8, "temperature": 0}
INFILL = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 8, "temperature": 0,
          "input_extra": [{"filename": "util.py", "text": "def cube(x):\n    return x ** 3\n"}]}


@pytest.fixture(scope="module")
def gguf() -> Path:
    try:
        return qwen25_coder_gguf()
    except RuntimeError as exc:
        pytest.fail(f"cannot assemble Qwen2.5-Coder-0.5B's GGUF file: {exc}")


@pytest.fixture(scope="module")
def peer(gguf, tmp_path_factory):
    if not LLAMA_SERVER.exists():
        pytest.fail(f"{LLAMA_SERVER} is missing: `make peer-llama-server` builds it "
                    "(`make test-peers` does first)")
    port = free_port()
    log = tmp_path_factory.mktemp("peer") / "llama-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(LLAMA_SERVER), "-m", str(gguf), "--host", "127.0.0.1",
                                 "--port", str(port), "-c", str(N_CTX), "-np", "1"],
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited with {proc.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama-server not ready after 300 s:\n{log.read_text()}")
            time.sleep(0.5)
        with httpx.Client(base_url=url, timeout=120) as client:
            yield client
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def ours(gguf, tmp_path_factory):
    server = ServerProcess(gguf, ["--max-model-len", str(N_CTX), "--max-num-seqs", "1"],
                           tmp_path_factory.mktemp("ours") / "server.log", ready_timeout=300)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client
    server.stop()


def json_type(value) -> str:
    for name, kinds in (("bool", bool), ("number", (int, float)), ("string", str),
                        ("array", list), ("object", dict)):
        if isinstance(value, kinds):
            return name
    return "null"


def types(answer: dict) -> dict[str, str]:
    return {key: json_type(value) for key, value in answer.items()}


def both(peer, ours, path: str, body: dict | None = None) -> tuple[dict, dict]:
    answers = []
    for client in (peer, ours):
        r = client.post(path, json=body) if body is not None else client.get(path)
        assert r.status_code == 200, (client.base_url, r.text)
        answers.append(r.json())
    return answers[0], answers[1]


def assert_same_shape(theirs: dict, mine: dict, *nested: str) -> None:
    assert types(mine) == types(theirs)
    for key in nested:
        assert types(mine[key]) == types(theirs[key]), key


def test_health(peer, ours):
    assert both(peer, ours, "/health")[0] == both(peer, ours, "/health")[1] == {"status": "ok"}


def test_completion(peer, ours):
    theirs, mine = both(peer, ours, "/completion", COMPLETION)
    print(f"\nllama-server: {theirs['content']!r}\nminivllm:     {mine['content']!r}")
    assert_same_shape(theirs, mine, "timings", "generation_settings")
    assert mine["tokens_evaluated"] == theirs["tokens_evaluated"]
    assert mine["stop_type"] == theirs["stop_type"] == "limit"
    theirs, mine = both(peer, ours, "/completion", {**COMPLETION, "n_probs": 2})
    first_theirs, first_mine = theirs["completion_probabilities"][0], \
        mine["completion_probabilities"][0]
    assert types(first_mine) == types(first_theirs)
    assert types(first_mine["top_logprobs"][0]) == types(first_theirs["top_logprobs"][0])


def stream(client, body: dict) -> list[dict]:
    with client.stream("POST", "/completion", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return [json.loads(line[len("data: "):]) for line in r.iter_lines()
                if line.startswith("data: ")]


def test_stream(peer, ours):
    theirs, mine = stream(peer, COMPLETION), stream(ours, COMPLETION)
    assert types(mine[0]) == types(theirs[0])  # a token's event
    assert_same_shape(theirs[-1], mine[-1], "timings")  # the last
    assert [e["stop"] for e in mine][-1] is True and theirs[-1]["stop"] is True


def test_infill(peer, ours):
    theirs, mine = both(peer, ours, "/infill", INFILL)
    print(f"\nllama-server: {theirs['content']!r}\nminivllm:     {mine['content']!r}")
    assert_same_shape(theirs, mine, "timings", "generation_settings")
    # the same prompt, to the token
    assert mine["prompt"] == theirs["prompt"] and "<|file_sep|>util.py" in mine["prompt"]
    assert mine["tokens_evaluated"] == theirs["tokens_evaluated"]


def test_tokenize(peer, ours):
    for body in ({"content": "def f(x): return x  # é"}, {"content": "é🦩", "with_pieces": True},
                 {"content": "<|fim_prefix|>x", "add_special": True}):
        theirs, mine = both(peer, ours, "/tokenize", body)
        assert mine == theirs, body  # the same tokenizer: the same ids and pieces
    theirs, mine = both(peer, ours, "/detokenize", {"tokens": [750, 282, 2075]})
    assert mine["content"] == theirs["content"]


def test_props(peer, ours):
    theirs, mine = both(peer, ours, "/props")
    assert_same_shape(theirs, mine, "default_generation_settings", "modalities")
    assert types(mine["default_generation_settings"]["params"]) == types(
        theirs["default_generation_settings"]["params"])
    assert mine["total_slots"] == theirs["total_slots"] == 1
    for key in ("model_ftype", "bos_token", "eos_token"):
        assert mine[key] == theirs[key], key
    # the file's template (transformers ends it with a newline)
    assert mine["chat_template"].strip() == theirs["chat_template"].strip()


def test_error_shape(peer, ours):
    for client in (peer, ours):
        r = client.post("/completion", json={"prompt": 3})
        assert r.status_code == 400
        assert set(r.json()["error"]) == {"code", "message", "type"}
        assert (r.json()["error"]["code"], r.json()["error"]["type"]) == (
            400, "invalid_request_error")
