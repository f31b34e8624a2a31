"""Fixtures of the server tests on a real trained model."""

from __future__ import annotations

import openai
import pytest

from tests.server_utils import ServerProcess


@pytest.fixture(scope="module")
def smollm2_client(smollm2_gguf, model_dir, tmp_path_factory):
    """An openai client of a server on SmolLM2-135M-Instruct's GGUF file, dequantized
    (model_dir: its directory built once, in the tests' cache). Not the blocks, the default:
    these tests send a request again and expect the same greedy text, and under the blocks a
    prompt of 24 rows or more prefills in fp32 panels while its cached re-send's few rows run
    the int8 kernel (as llama.cpp's prompt and generation paths differ), which can change it."""
    server = ServerProcess(smollm2_gguf, ["--quantization", "none"],
                           tmp_path_factory.mktemp("real") / "server.log", ready_timeout=300)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    yield client
    client.close()
    server.stop()
