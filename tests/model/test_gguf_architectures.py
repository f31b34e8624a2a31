"""GGUF files of the architectures llama.cpp and Ollama users download beyond Llama and
Qwen2: Qwen3, Mistral, Phi-3 (longrope, and Phi-4-mini's partial rotary) and Gemma 2. The
registries ship no such checkpoints, so each is a tiny random model that transformers
builds and tests/gguf_writer.py writes as llama.cpp's converter does (that architecture's
tensor names and metadata):
- in float32 the file runs as the safetensors original: the config read back from the
  metadata (head size, rotary dimensions, longrope factors, window, soft-caps) is the
  original's, token for token;
- with its linears and embeddings stored as blocks (Q8_0, Q4_0, Q5_1), they run from the
  blocks and the output matches the same file dequantized (the bound of
  test_gguf_blocks.py)."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType
from transformers import Gemma2Config, MistralConfig, Phi3Config, Qwen3Config

from minivllm import LLM, SamplingParams
from minivllm.model.linear.gguf import BlockWeight, GGUFLinear
from tests.gguf_writer import write_gguf
from tests.model.test_gguf_blocks import assert_close_to_dequantized
from tests.model_factory import COMMON, save_model

LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
            "original_max_position_embeddings": 32,
            "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
            "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0, 64.0]}
CONFIGS = {
    # head_dim 32, not hidden / heads (as Qwen3-0.6B's 128 is not 1024 / 16)
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=False),
    # Mistral Nemo's shape: head_dim not hidden / heads, no sliding window
    "mistral": lambda: MistralConfig(**COMMON, head_dim=32, sliding_window=None),
    # Phi-3.5-mini's longrope (prompts past the original 32 positions take the long
    # factors), with a sliding window
    "phi3": lambda: Phi3Config(**COMMON, pad_token_id=0, sliding_window=24,
                               original_max_position_embeddings=32, rope_parameters=LONGROPE),
    # Phi-4-mini's partial rotary: RoPE on the first 3/4 of each head
    "phi4-mini": lambda: Phi3Config(**COMMON, pad_token_id=0, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}),
    # llama.cpp scales Gemma 2's queries by 1/sqrt(head_dim) (hidden / heads for the 27B):
    # the file has no query_pre_attn_scalar; and it ties the LM head to the embeddings
    "gemma2": lambda: Gemma2Config(**COMMON, head_dim=16, sliding_window=8,
                                   query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
                                   final_logit_softcapping=10.0, tie_word_embeddings=True),
}
PROMPTS = [{"prompt_token_ids": [1] + [(7 * n + 13 * i) % 500 + 3 for i in range(n)]}
           for n in (3, 20, 41)]
# The blocks each kind of tensor is stored as in the quantized file
BLOCKS = {"q_proj": "Q8_0", "k_proj": "Q8_0", "v_proj": "Q8_0", "qkv_proj": "Q8_0",
          "o_proj": "Q5_1", "gate_proj": "Q4_0", "up_proj": "Q4_0", "gate_up_proj": "Q4_0",
          "down_proj": "Q8_0", "embed_tokens": "Q8_0", "lm_head": "Q8_0"}


def stored_as(name: str) -> GGMLQuantizationType | None:
    part = name.removesuffix(".weight").rsplit(".", 1)[-1]
    blocks = BLOCKS.get(part) if name.endswith(".weight") else None
    return GGMLQuantizationType[blocks] if blocks else None


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module", params=list(CONFIGS))
def files(request, tmp_path_factory):
    """kind -> (model directory, float32 GGUF file, GGUF file with blocks)."""
    root = tmp_path_factory.mktemp(request.param)
    directory = save_model(CONFIGS[request.param](), root / "model")
    write_gguf(directory, root / "f32.gguf")
    write_gguf(directory, root / "blocks.gguf", stored_as)
    return directory, root / "f32.gguf", root / "blocks.gguf"


def generate(model, logprobs: int = 0, **kwargs):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=logprobs)
    # float32: a GGUF file names no dtype, so auto would be bf16 on a bf16-capable CPU
    llm = LLM(str(model), dtype="float32", block_size=4, num_kv_blocks=64, **kwargs)
    return llm, [o.outputs[0] for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def test_the_float32_file_runs_as_the_original(files):
    """Each position's top 5 (a tied tiny Gemma 2 repeats one token: its top 5 still show
    every layer's work)."""
    directory, f32, _ = files
    _, outputs = generate(f32, logprobs=5, quantization="none")
    _, references = generate(directory, logprobs=5)
    for out, ref in zip(outputs, references, strict=True):
        assert out.token_ids == ref.token_ids
        for top, ref_top in zip(out.logprobs, ref.logprobs, strict=True):
            assert set(top) == set(ref_top)
            assert ({t: e.logprob for t, e in top.items()} ==
                    pytest.approx({t: e.logprob for t, e in ref_top.items()}, abs=1e-4))


def test_the_blocks_run_as_stored_and_match_the_dequantized_file(files):
    _, _, blocks = files
    llm, outputs = generate(blocks, logprobs=2)
    model = llm.llm_engine.runner.model
    assert llm.llm_engine.config.quantization == "gguf"
    assert isinstance(model.embed, BlockWeight)
    for layer in model.layers:
        for linear in (layer.self_attn.qkv, layer.o_proj, layer.mlp.gate_up, layer.mlp.down):
            assert isinstance(linear, GGUFLinear)
    assert isinstance(model.lm_head, GGUFLinear)
    _, references = generate(blocks, logprobs=2, quantization="none")
    assert_close_to_dequantized(outputs, references)
