"""Fixtures of the server tests on a real trained model."""

from __future__ import annotations

import openai
import pytest

from tests.server_utils import ServerProcess


@pytest.fixture(scope="module")
def smollm2_client(smollm2_gguf, model_dir, tmp_path_factory):
    """An openai client of a server on SmolLM2-135M-Instruct's GGUF file, dequantized
    (model_dir: its directory built once, in the tests' cache). Not the blocks, the default:
    these tests check the fp32 path's answers, and the blocks' int8 activations take the
    other side of a near-tie there (to "What is the capital of France?" SmolLM2 then answers
    "L'Étoile, ..." rather than "Paris": measured 2026-11-28 on AVX512-VNNI)."""
    server = ServerProcess(smollm2_gguf, ["--quantization", "none"],
                           tmp_path_factory.mktemp("real") / "server.log", ready_timeout=300)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    yield client
    client.close()
    server.stop()
