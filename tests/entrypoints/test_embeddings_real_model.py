"""POST /v1/embeddings on SmolLM2-135M-Instruct (the GGUF file, real_model), served in
fp32: each vector equals transformers' final-norm hidden state of the last token (vLLM's
default pooling for an embedding from a decoder model: LAST, normalized), loading the same
file, within 1e-5."""

from __future__ import annotations

import openai
import pytest
import torch

from tests.server_utils import ServerProcess

pytestmark = pytest.mark.real_model

TEXTS = ["The capital of France is Paris.", "def fibonacci(n):",
         "Machine learning is a field of study in artificial intelligence."]


@pytest.fixture(scope="module")
def fp32_client(smollm2_gguf, model_dir, tmp_path_factory):
    server = ServerProcess(smollm2_gguf, ["--dtype", "float32", "--quantization", "none",
                                         "--num-kv-blocks", "64"],
                           tmp_path_factory.mktemp("embed-real") / "server.log",
                           ready_timeout=300)
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    server.stop()


def test_embeddings_equal_transformers(fp32_client, smollm2_gguf, model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_model = AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = fp32_client.models.list().data[0].id
    result = fp32_client.embeddings.create(input=TEXTS, model=model,
                                              encoding_format="float")
    assert result.usage.prompt_tokens == sum(len(tokenizer(t).input_ids) for t in TEXTS)
    for text, item in zip(TEXTS, result.data):
        with torch.no_grad():
            hidden = hf_model(torch.tensor([tokenizer(text).input_ids]),
                              output_hidden_states=True).hidden_states[-1][0]
        expected = torch.nn.functional.normalize(hidden[-1], dim=0)
        assert len(item.embedding) == hf_model.config.hidden_size
        torch.testing.assert_close(torch.tensor(item.embedding), expected, atol=1e-5, rtol=0)
