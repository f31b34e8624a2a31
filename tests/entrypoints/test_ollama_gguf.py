"""Ollama's API on a GGUF file served with --runner pooling (a tiny random Llama written to
GGUF by tests/model/test_gguf.py's writer): /api/embed and /api/embeddings through the
ollama client, /api/show's model_info from the file's metadata, /api/tags' details, and a
clear 400 for generation on a pooling runner."""

from __future__ import annotations

import math
import os
from pathlib import Path

import httpx
import ollama
import pytest

from tests.gguf_writer import write_gguf
from tests.server_utils import FAST_ENGINE_ARGS, ServerProcess

NAME = "tiny-llama:f32"
MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("ollama_gguf")
    path = root / "tiny-llama.F32.gguf"
    write_gguf(tiny_llama, path)
    # The file's model directory in a cache of the test's own; the C kernels from the user's
    # (a new cache would compile them again: half a minute on two cores)
    kernels = Path(os.environ.get("MINIVLLM_CACHE") or Path.home() / ".cache" / "minivllm")
    (root / "cache").mkdir()
    if (kernels / "kernels").is_dir():
        (root / "cache" / "kernels").symlink_to(kernels / "kernels")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINIVLLM_CACHE", str(root / "cache"))
        # --quantization none: an F32 file has no blocks to run; the directory's word-level
        # tokenizer (the file's reads no text of made-up words)
        proc = ServerProcess(path, [*FAST_ENGINE_ARGS, "--runner", "pooling",
                                    "--tokenizer", str(tiny_llama),
                                    "--quantization", "none", "--served-model-name", NAME,
                                    "--max-model-len", str(MAX_MODEL_LEN)],
                             root / "server.log", ready_timeout=180)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url)


def status_of(call) -> tuple[int, str]:
    with pytest.raises(ollama.ResponseError) as info:
        call()
    return info.value.status_code, info.value.error


def test_embed_one_and_several_inputs(client):
    one = client.embed(model=NAME, input="w3 w4 w5")
    (vector,) = one.embeddings
    assert len(vector) == 64 and math.isclose(math.hypot(*vector), 1.0, rel_tol=1e-4)
    assert one.model == NAME and one.prompt_eval_count == 3 and one.total_duration > 0
    several = client.embed(model="tiny-llama", input=["w3 w4 w5", "w9 w10"])  # bare name
    assert several.embeddings[0] == pytest.approx(vector, abs=1e-5)
    assert len(several.embeddings) == 2 and several.prompt_eval_count == 5
    assert client.embeddings(model=NAME, prompt="w3 w4 w5").embedding == pytest.approx(
        vector, abs=1e-5)


def test_embed_truncates_unless_told_not_to(client):
    long = " ".join(f"w{3 + i % 400}" for i in range(MAX_MODEL_LEN + 10))
    assert client.embed(model=NAME, input=long).prompt_eval_count == MAX_MODEL_LEN
    status, error = status_of(lambda: client.embed(model=NAME, input=long, truncate=False))
    assert status == 400 and str(MAX_MODEL_LEN) in error
    assert status_of(lambda: client.embed(model=NAME, input=[]))[0] == 400
    assert status_of(lambda: client.embed(model=NAME, input=[""]))[0] == 400


def test_show_reads_the_gguf_metadata(client, server):
    shown = client.show(NAME)
    info = shown.modelinfo
    assert info["general.architecture"] == "llama" and info["general.name"] == "tiny llama"
    assert info["llama.context_length"] == 512 and info["llama.block_count"] == 2
    assert info["llama.attention.head_count_kv"] == 2
    assert info["tokenizer.ggml.tokens"] == []  # long arrays only when verbose
    assert info["general.parameter_count"] > 0
    assert shown.details.format == "gguf" and shown.details.quantization_level == "F32"
    template = info["tokenizer.chat_template"]
    assert template == "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    assert shown.capabilities == ["embedding"]
    # verbose (the client does not send it): the arrays too
    full = httpx.post(f"{server.url}/api/show",
                      json={"model": NAME, "verbose": True}).json()["model_info"]
    assert len(full["tokenizer.ggml.tokens"]) == 512


def test_tags_describe_the_file(client):
    (entry,) = client.list().models
    assert entry.model == NAME and entry.details.format == "gguf"
    assert entry.details.family == "llama" and entry.size > 100_000


def test_generation_on_a_pooling_runner_is_a_clear_400(client):
    status, error = status_of(lambda: client.chat(
        model=NAME, messages=[{"role": "user", "content": "w3"}]))
    assert status == 400 and "pooling" in error
    status, error = status_of(lambda: client.generate(model=NAME, prompt="w3", raw=True))
    assert status == 400 and "pooling" in error
