"""The 7B-class benchmark model (minivllm/bench/synthetic_gguf.py): llama.cpp's Q4_K_M recipe
and the shapes, with no file; then, on Qwen2.5-Coder-0.5B's file (real_model: it is the
source), the recipe reproducing that file's own types, and a tiny file of each architecture
whose tensors follow the recipe, whose blocks are the 0.5B's, and which minivllm loads and
runs."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES

from minivllm import LLM, SamplingParams
from minivllm.bench.qwen25_coder import qwen25_coder_gguf
from minivllm.bench.synthetic_gguf import (
    F32,
    Q4_K,
    Q5_0,
    Q6_K,
    Q8_0,
    SHAPES,
    Source,
    plan,
    q4_k_m_type,
    role_of,
    synthetic_gguf,
)
from minivllm.model.gguf import open_gguf

# The cache the user runs with, read before a session fixture points MINIVLLM_CACHE at a
# temporary one: the 0.5B file is assembled once, not once per session.
USER_CACHE = os.environ.get("MINIVLLM_CACHE")
VOCAB = 151936  # the 0.5B's tokenizer
# The layers whose attn_v and ffn_down get Q6_K (llama.cpp's use_more_bits)
MORE_BITS = {"qwen2.5-7b": [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27],
             "llama-3-8b": [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]}


@pytest.mark.parametrize("name", SHAPES)
def test_q4_k_m_recipe(name):
    shape = SHAPES[name]
    types = {t.name: t.type for t in plan(shape, VOCAB)}
    assert types.pop("token_embd.weight") == Q4_K and types.pop("output.weight") == Q6_K
    assert types.pop("output_norm.weight") == F32
    for layer in range(shape.layers):
        more_bits = Q6_K if layer in MORE_BITS[name] else Q4_K
        expected = {"attn_norm.weight": F32, "ffn_norm.weight": F32,
                    "attn_v.weight": more_bits, "ffn_down.weight": more_bits,
                    **dict.fromkeys(["attn_q.weight", "attn_k.weight", "attn_output.weight",
                                     "ffn_gate.weight", "ffn_up.weight"], Q4_K)}
        if shape.qkv_bias:
            expected.update(dict.fromkeys(["attn_q.bias", "attn_k.bias", "attn_v.bias"], F32))
        assert {role: types.pop(f"blk.{layer}.{role}") for role in expected} == expected
    assert types == {}


def test_row_lengths_off_256_values_fall_back_as_llama_cpp():
    assert q4_k_m_type("attn_q", 0, 24, 896) == Q5_0
    assert q4_k_m_type("attn_v", 0, 24, 896) == q4_k_m_type("output", 0, 24, 896) == Q8_0
    assert q4_k_m_type("ffn_down", 0, 24, 4864) == Q6_K


def test_shapes_have_the_real_models_parameters():
    def parameters(name, vocab):
        return sum(math.prod(t.shape) for t in plan(SHAPES[name], vocab))

    assert parameters("qwen2.5-7b", SHAPES["qwen2.5-7b"].real_vocab) == 7_615_616_512
    assert parameters("llama-3-8b", SHAPES["llama-3-8b"].real_vocab) == 8_030_261_248


@pytest.fixture(scope="module")
def source_path() -> Path:
    with pytest.MonkeyPatch.context() as patch:
        if USER_CACHE is None:
            patch.delenv("MINIVLLM_CACHE", raising=False)
        else:
            patch.setenv("MINIVLLM_CACHE", USER_CACHE)
        try:
            return qwen25_coder_gguf()
        except RuntimeError as exc:
            pytest.fail(f"cannot assemble Qwen2.5-Coder-0.5B's GGUF file: {exc}")


@pytest.mark.real_model
def test_the_recipe_gives_the_0_5b_files_own_types(source_path):
    """llama.cpp counts attn_v / ffn_down tensors in the order it meets them: the file's."""
    reader = open_gguf(source_path)
    seen: dict[str, int] = {}
    for tensor in reader.tensors:
        if tensor.tensor_type != F32:
            role = role_of(tensor.name)
            index = seen[role] = seen.get(role, -1) + 1
            row_length = int(tensor.shape[0])  # GGUF lists a row's length first
            assert q4_k_m_type(role, index, 24, row_length) == tensor.tensor_type, tensor.name
    assert seen["attn_v"] == seen["ffn_down"] == 23


@pytest.fixture(scope="module", params=list(SHAPES))
def tiny(request, source_path, tmp_path_factory):
    """(shape, path): the shape at 2 layers, hidden 256 (a row of K-quant blocks), written."""
    shape = replace(SHAPES[request.param], name=f"tiny-{request.param}", layers=2, hidden=256,
                    intermediate=512, heads=2, kv_heads=1)
    return shape, synthetic_gguf(shape, seed=0, directory=tmp_path_factory.mktemp("synthetic"))


@pytest.mark.real_model
def test_tiny_file_follows_the_recipe_with_the_0_5b_blocks_and_tokenizer(tiny, source_path):
    shape, path = tiny
    source, written = Source(source_path), open_gguf(path)
    assert ({t.name: t.tensor_type for t in written.tensors}
            == {t.name: t.type for t in plan(shape, VOCAB)})
    assert {Q4_K, Q6_K} <= {t.tensor_type for t in written.tensors}  # layer 1 gets more bits
    for key, field in source.reader.fields.items():
        if key.startswith("tokenizer."):
            assert written.fields[key].contents() == field.contents(), key
    rng = np.random.default_rng(1)
    known = {kind: set(map(bytes, source.blocks(kind))) for kind in (Q4_K, Q6_K)}
    for tensor in written.tensors:
        data = np.asarray(tensor.data)
        if tensor.tensor_type == F32:
            assert np.isin(data, source.values[role_of(tensor.name)]).all(), tensor.name
        else:
            blocks = data.reshape(-1, GGML_QUANT_SIZES[tensor.tensor_type][1])
            sample = blocks[rng.choice(len(blocks), 64)]
            assert all(bytes(block) in known[tensor.tensor_type] for block in sample), tensor.name


@pytest.fixture(scope="module")
def engine_cache(tmp_path_factory) -> Path:
    """The engines' cache (the files' model directories, the kernels: built once)."""
    return tmp_path_factory.mktemp("cache")


@pytest.mark.real_model
def test_minivllm_runs_the_tiny_file_ignoring_eos(tiny, engine_cache, monkeypatch):
    shape, path = tiny
    monkeypatch.setenv("MINIVLLM_CACHE", str(engine_cache))
    llm = LLM(str(path), max_model_len=64, num_kv_blocks=16)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=1)
    (output,) = llm.generate(["def quicksort(arr):"], params, use_tqdm=False)
    completion = output.outputs[0]
    assert len(output.prompt_token_ids) > 1  # the 0.5B's tokenizer, from the file
    assert len(completion.token_ids) == 4
    assert all(0 <= token < VOCAB for token in completion.token_ids)
    assert all(math.isfinite(entry.logprob)
               for step in completion.logprobs for entry in step.values())
