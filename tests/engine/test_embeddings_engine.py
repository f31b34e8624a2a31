"""Pooling requests (embeddings) in the engine, on stories260K: LLM.embed equals transformers'
pooled final-norm hidden states (LAST and MEAN, normalized) within 1e-5, with the prompt
split over chunked-prefill steps, with prefix-cache hits around, with dimensions; and
pooling requests mixed with generation in one scheduler change neither."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config import EngineConfig
from minivllm.engine.llm_engine import LLMEngine
from minivllm.engine.messages import make_core_request, make_pooling_request
from minivllm.outputs import EmbeddingRequestOutput
from minivllm.pooling_params import PoolingParams, parse_pooler_config
from tests.conftest import assert_all_blocks_free

LONG = ("Once upon a time, there was a little girl named Lily. She loved to play outside in "
        "the park with her friends and her dog. One day, she saw a big red ball")
PROMPTS = [LONG, "The cat sat", "Tom and Sue went to the shop to buy some milk."]


@pytest.fixture(scope="module")
def hf_model(stories_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(stories_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(stories_dir):
    # 16 tokens a step: LONG's prompt is pooled over several chunks
    return LLM(str(stories_dir), max_num_batched_tokens=16, enable_chunked_prefill=True,
               enable_prefix_caching=True, num_kv_blocks=64, block_size=4)


def reference(hf_model, token_ids: list[int], pooling_type: str, dimensions=None,
              normalize=True) -> torch.Tensor:
    """transformers: the last hidden_states entry (after the final norm), pooled."""
    with torch.no_grad():
        hidden = hf_model(torch.tensor([token_ids]), output_hidden_states=True
                          ).hidden_states[-1][0]
    vector = hidden.mean(dim=0) if pooling_type == "MEAN" else hidden[-1]
    vector = vector[:dimensions] if dimensions else vector
    return torch.nn.functional.normalize(vector, dim=0) if normalize else vector


def ids(llm, text: str) -> list[int]:
    return llm.get_tokenizer()(text).input_ids


@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN"])
def test_embed_equals_transformers_pooled_hidden_states(llm, hf_model, pooling_type):
    assert len(ids(llm, LONG)) > 2 * 16  # pooled over three chunks or more
    # Twice: the second time LONG's blocks are in the prefix cache (LAST may use them, MEAN
    # must compute every position again).
    for _ in range(2):
        outputs = llm.embed(PROMPTS, PoolingParams(pooling_type=pooling_type), use_tqdm=False)
        for prompt, output in zip(PROMPTS, outputs):
            assert isinstance(output, EmbeddingRequestOutput)
            expected = reference(hf_model, ids(llm, prompt), pooling_type)
            got = torch.tensor(output.outputs.embedding)
            assert got.shape == expected.shape == (64,)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    if pooling_type == "MEAN":
        assert all(o.num_cached_tokens == 0 for o in outputs)
    else:
        assert outputs[0].num_cached_tokens > 0
    assert_all_blocks_free(llm)


def test_dimensions_and_normalize(llm, hf_model):
    token_ids = ids(llm, LONG)
    short = llm.embed(LONG, PoolingParams(dimensions=8), use_tqdm=False)[0].outputs.embedding
    torch.testing.assert_close(torch.tensor(short), reference(hf_model, token_ids, "LAST", 8),
                               atol=1e-5, rtol=0)
    assert abs(sum(v * v for v in short) - 1) < 1e-5  # re-normalized after truncation
    raw = llm.embed(LONG, PoolingParams(normalize=False, pooling_type="MEAN"),
                    use_tqdm=False)[0].outputs.embedding
    torch.testing.assert_close(torch.tensor(raw),
                               reference(hf_model, token_ids, "MEAN", normalize=False),
                               atol=1e-5, rtol=1e-5)


def test_pooling_mixed_with_generation_in_one_scheduler(stories_dir, hf_model):
    """Generation requests and pooling requests share steps: every generation equals its run
    alone, every embedding its reference, and no block is left behind."""
    engine = LLMEngine(EngineConfig(model=str(stories_dir)))
    params = SamplingParams(temperature=0.0, max_tokens=24)
    prompts = [engine.tokenizer(p).input_ids for p in PROMPTS]
    for i, prompt in enumerate(prompts):
        engine.add_request(f"gen-{i}", make_core_request(f"gen-{i}", prompt, params), params)
        pooling = make_pooling_request(f"emb-{i}", prompt, PoolingParams(pooling_type="MEAN"))
        engine.add_request(f"emb-{i}", pooling, pooling.sampling_params)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    assert sorted(finished) == sorted([f"gen-{i}" for i in range(3)]
                                      + [f"emb-{i}" for i in range(3)])
    alone = LLM(str(stories_dir)).generate([{"prompt_token_ids": p} for p in prompts], params,
                                           use_tqdm=False)
    for i, prompt in enumerate(prompts):
        assert finished[f"gen-{i}"].outputs[0].token_ids == alone[i].outputs[0].token_ids
        torch.testing.assert_close(torch.tensor(finished[f"emb-{i}"].outputs.embedding),
                                   reference(hf_model, prompt, "MEAN"), atol=1e-5, rtol=0)
    stats = engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks


def test_engine_rejects_bad_pooling_input(llm):
    with pytest.raises(ValueError, match="dimensions must be <= the model's hidden size"):
        llm.embed("hi", PoolingParams(dimensions=65), use_tqdm=False)
    with pytest.raises(ValueError, match="dimensions must be an integer >= 1"):
        PoolingParams(dimensions=0)
    with pytest.raises(ValueError, match="maximum context length"):
        llm.embed({"prompt_token_ids": [1] * 10_000}, use_tqdm=False)
    assert_all_blocks_free(llm)


def test_pooler_config_flag(stories_dir, hf_model):
    assert parse_pooler_config('{"pooling_type": "MEAN", "normalize": false}') == {
        "pooling_type": "MEAN", "normalize": False}
    for bad, why in (('{"pooling_type": "CLS"}', "pooling_type must be one of LAST, MEAN"),
                     ('{"pool": "MEAN"}', "unknown key"), ("[1]", "must be a JSON object"),
                     ('{"normalize": 1}', "normalize must be true or false")):
        with pytest.raises(ValueError, match=why):
            parse_pooler_config(bad)
    llm = LLM(str(stories_dir), pooler_config='{"pooling_type": "MEAN"}')
    got = llm.embed(LONG, use_tqdm=False)[0].outputs.embedding
    torch.testing.assert_close(torch.tensor(got), reference(hf_model, ids(llm, LONG), "MEAN"),
                               atol=1e-5, rtol=0)


def test_runner_flags_offline(stories_dir, hf_model):
    """LLM(runner="pooling") embeds and refuses generate (a ValueError naming runner);
    LLM(runner="generate") generates and refuses embed. Nothing refused reaches the core."""
    pooling = LLM(str(stories_dir), runner="pooling", convert="embed", num_kv_blocks=16)
    with pytest.raises(ValueError, match="--runner pooling --convert embed: it serves "
                                         "embeddings only"):
        pooling.generate(PROMPTS, SamplingParams(max_tokens=2), use_tqdm=False)
    got = pooling.embed(LONG, use_tqdm=False)[0].outputs.embedding
    torch.testing.assert_close(torch.tensor(got), reference(hf_model, ids(pooling, LONG),
                                                            "LAST"), atol=1e-5, rtol=0)
    assert_all_blocks_free(pooling)
    generate = LLM(str(stories_dir), runner="generate", num_kv_blocks=16)
    with pytest.raises(ValueError, match="--runner generate: it serves generation only"):
        generate.embed(PROMPTS, use_tqdm=False)
    out = generate.generate("Once upon a time", SamplingParams(max_tokens=2, ignore_eos=True),
                            use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2
    assert_all_blocks_free(generate)
