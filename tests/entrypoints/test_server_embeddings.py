"""POST /v1/embeddings on a real stories260K server: vectors equal transformers' pooled
final-norm hidden states within 1e-5 (float and base64, texts and token ids, dimensions),
embeddings mixed with concurrent generation lose nothing, and bad input is a 400 naming
its field."""

from __future__ import annotations

import asyncio
import base64
import struct

import httpx
import openai
import pytest
import torch

from minivllm import LLM, SamplingParams
from tests.server_utils import FAST_ENGINE_ARGS, ServerProcess, stories_model

TEXTS = ["Once upon a time, there was a little girl named Lily. She loved to play outside.",
         "The cat sat on the mat.", "Tom had a big red ball"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server_embeddings")
    # MEAN pooling, prompts in chunks of 16 tokens: the running sum spans steps
    server = ServerProcess(stories_model(), [
        *FAST_ENGINE_ARGS, "--max-num-batched-tokens", "16", "--enable-chunked-prefill",
        "--max-model-len", "128", "--pooler-config", '{"pooling_type": "MEAN"}'],
        tmp / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = stories_model()
    return (AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(path))


def reference(hf, token_ids: list[int], dimensions: int | None = None) -> torch.Tensor:
    with torch.no_grad():
        hidden = hf[0](torch.tensor([token_ids]), output_hidden_states=True).hidden_states[-1]
    return torch.nn.functional.normalize(hidden[0].mean(dim=0)[:dimensions], dim=0)


def post(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)


def test_embeddings_equal_transformers(server, hf):
    tokenizer = hf[1]
    model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
    r = post(server, {"input": TEXTS, "model": model})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == model
    num_tokens = sum(len(tokenizer(t).input_ids) for t in TEXTS)
    assert body["usage"] == {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
    for i, (text, item) in enumerate(zip(TEXTS, body["data"])):
        assert item["object"] == "embedding" and item["index"] == i
        torch.testing.assert_close(torch.tensor(item["embedding"]),
                                   reference(hf, tokenizer(text).input_ids), atol=1e-5, rtol=0)
    # token ids, one list and several, with dimensions: truncated, then re-normalized
    ids = tokenizer(TEXTS[0]).input_ids
    for value in (ids, [ids, ids[:5]]):
        r = post(server, {"input": value, "dimensions": 10})
        assert r.status_code == 200, r.text
        first = r.json()["data"][0]["embedding"]
        torch.testing.assert_close(torch.tensor(first), reference(hf, ids, 10), atol=1e-5,
                                   rtol=0)


def test_base64_through_the_openai_client(server, hf):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    r = post(server, {"input": TEXTS[1], "encoding_format": "base64"})
    packed = base64.b64decode(r.json()["data"][0]["embedding"])
    floats = struct.unpack(f"<{len(packed) // 4}f", packed)
    expected = reference(hf, hf[1](TEXTS[1]).input_ids)
    torch.testing.assert_close(torch.tensor(floats), expected, atol=1e-5, rtol=0)
    # the openai client asks for base64 and decodes it itself
    result = client.embeddings.create(input=TEXTS[1], model=client.models.list().data[0].id)
    torch.testing.assert_close(torch.tensor(result.data[0].embedding), expected, atol=1e-5,
                               rtol=0)


def test_embeddings_mixed_with_generation_lose_nothing(server, hf):
    """Completions and embeddings at once, in one server: every completion equals its greedy
    run alone, every embedding its reference."""
    tokenizer = hf[1]
    offline = LLM(str(stories_model()), max_model_len=128)
    params = SamplingParams(temperature=0.0, max_tokens=40)
    expected_text = {t: offline.generate(t, params, use_tqdm=False)[0].outputs[0].text
                     for t in TEXTS}

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            completions = [client.post("/v1/completions", json={
                "prompt": t, "max_tokens": 40, "temperature": 0.0}) for t in TEXTS * 3]
            embeddings = [client.post("/v1/embeddings", json={"input": [t, TEXTS[0]]})
                          for t in TEXTS * 3]
            return await asyncio.gather(*completions, *embeddings)

    answers = asyncio.run(run())
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    for text, answer in zip(TEXTS * 3, answers[:9]):
        assert answer.json()["choices"][0]["text"] == expected_text[text]
    for text, answer in zip(TEXTS * 3, answers[9:]):
        data = answer.json()["data"]
        for t, item in zip([text, TEXTS[0]], data):
            torch.testing.assert_close(torch.tensor(item["embedding"]),
                                       reference(hf, tokenizer(t).input_ids), atol=1e-5,
                                       rtol=0)


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": ["a", ""]}, "input"),
    ({"input": [[]]}, "input"), ({"input": [10**6]}, "input"),
    ({"input": "x " * 300}, "input"),  # longer than --max-model-len 128
    ({"input": "hi", "dimensions": 0}, "dimensions"),
    ({"input": "hi", "dimensions": 65}, "dimensions"),  # the hidden size is 64
    ({"input": "hi", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "hi", "model": "nope"}, "model"),
])
def test_bad_input_is_400_naming_the_field(server, body, param):
    r = post(server, body)
    assert r.status_code == (404 if param == "model" else 400), r.text
    assert r.json()["error"]["param"] == param, r.text
    assert post(server, {"input": "still serving"}).status_code == 200
