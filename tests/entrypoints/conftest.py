"""Fixtures of the server tests on a real trained model."""

from __future__ import annotations

import openai
import pytest

from tests.server_utils import ServerProcess


@pytest.fixture(scope="module")
def smollm2_client(smollm2_gguf, model_dir, tmp_path_factory):
    """An openai client of a server with default flags on SmolLM2-135M-Instruct's GGUF file,
    which then runs its Q4_1 blocks (model_dir: its directory built once, in the tests'
    cache)."""
    server = ServerProcess(smollm2_gguf, [], tmp_path_factory.mktemp("real") / "server.log",
                           ready_timeout=300)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    yield client
    client.close()
    server.stop()
