"""quantization="gguf": a GGUF file's linear weights and token embeddings run from their
stored blocks (model/gguf.py, linear/gguf.py), on a tiny Llama written here as
llama.cpp's converter writes it (Q/K rows permuted): its token embeddings Q5_0 (looked up a
row at a time; the tied LM head runs from them), layer 0's linears Q8_0, layer 1's q / k
Q4_0 and v Q8_0 (one q/k/v of two types), o_proj Q5_1, gate/up Q4_1 and down_proj BF16
(which runs dequantized, with a warning saying what that costs)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from minivllm import LLM, SamplingParams
from minivllm.config import EngineConfig
from minivllm.model.kernels import library
from minivllm.model.linear.gguf import BlockWeight, GGUFLinear
from minivllm.model.loader import load_state_dict, resolve_model_path
from tests.gguf_writer import write_gguf

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LAYER_1 = {"q_proj": "Q4_0", "k_proj": "Q4_0", "v_proj": "Q8_0", "o_proj": "Q5_1",
           "gate_proj": "Q4_1", "up_proj": "Q4_1", "down_proj": "BF16"}


def qtype_of(name: str) -> GGMLQuantizationType | None:
    """The type the file stores a checkpoint tensor as (None: F32)."""
    if name == "model.embed_tokens.weight":
        return GGMLQuantizationType.Q5_0
    linear = next((linear for linear in LINEARS if f".{linear}." in name), None)
    if linear is None:
        return None
    if name.startswith("model.layers.0."):
        return GGMLQuantizationType.Q8_0
    return GGMLQuantizationType[LAYER_1[linear]]


@pytest.fixture(scope="module")
def blocks_gguf(tiny_llama, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf-blocks") / "tiny-llama.mixed.gguf"
    write_gguf(tiny_llama, path, qtype_of)
    return path


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE", str(tmp_path / "cache"))


def test_linears_and_embeddings_load_as_their_blocks_and_the_log_says_so(blocks_gguf,
                                                                          caplog):
    directory = resolve_model_path(str(blocks_gguf))
    dequantized = load_state_dict(directory)
    with caplog.at_level(logging.INFO, logger="minivllm.model.gguf"):
        kept = load_state_dict(directory, keep_gguf_blocks=True)
    assert set(kept) == set(dequantized)  # no lm_head: the model ties it to the embeddings
    for name, tensor in kept.items():
        qtype = qtype_of(name)
        if qtype not in (None, GGMLQuantizationType.BF16):
            assert isinstance(tensor, BlockWeight) and tensor.qtype == qtype, name
            # q/k rows un-permuted as whole rows of blocks: the same matrix as dequantized
            assert torch.equal(tensor.dequantize(), dequantized[name]), name
        else:
            assert torch.equal(tensor, dequantized[name]), name
    assert ("14 linears run from their stored blocks (Q4_0: 2, Q4_1: 2, Q5_0: 1, Q5_1: 1, "
            "Q8_0: 8), 1 dequantized to float32 (BF16: 1); token embeddings Q5_0, rows "
            "dequantized as looked up (the LM head tied to them)") in caplog.text
    assert ("GGUF tensors by kind (across layers): token_embd Q5_0, ffn_down BF16 + Q8_0, "
            "ffn_gate Q4_1 + Q8_0, ffn_up Q4_1 + Q8_0, attn_k Q4_0 + Q8_0, attn_output Q5_1 + "
            "Q8_0, attn_q Q4_0 + Q8_0, attn_v Q8_0 x2; the other 5 tensors in float32"
            ) in caplog.text
    # Blocks as stored, the kernel reads nothing beside them: the embeddings as the tied
    # head (512 x 64 Q5_0: 22,528 bytes), layer 0's 39,168 and layer 1's 18,944; float32:
    # down_proj's 8,192 values and 320 of norms
    assert ("quantization=gguf: a decode step reads 114.7 kB of weights (blocks 80.6 kB, "
            "float32 34.0 kB)") in caplog.text
    # BF16 down_proj: 64 x 128 values, 4 bytes each instead of 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["quantization=gguf: 1 linears dequantized to float32 (BF16, a type "
                        "the kernels do not run: 1): +16.4 kB read per decoded token"]


PROMPTS = [{"prompt_token_ids": [1] + [(7 * n + 13 * i) % 500 + 3 for i in range(n)]}
           for n in (3, 20, 41)]


def test_engine_matches_the_dequantized_file(blocks_gguf, caplog):
    """Without --quantization a GGUF file runs its blocks (the default, resolved to gguf);
    quantization="none" dequantizes every weight, the reference they are compared with."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    outputs = {}
    kernels_built = library.available(torch.device("cpu"), torch.float32)
    for quantization in ("none", None):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="minivllm"):
            llm = LLM(str(blocks_gguf), dtype="float32", quantization=quantization,
                      block_size=4, num_kv_blocks=64)
        model = llm.llm_engine.runner.model
        if quantization == "none":
            assert not isinstance(model.embed, BlockWeight)
            assert not isinstance(model.lm_head, GGUFLinear)
            assert not isinstance(model.layers[0].self_attn.qkv, GGUFLinear)
            assert "GGUF weights dequantized to float32" in caplog.text
        else:
            assert llm.llm_engine.config.quantization == "gguf"
            assert "quantization=gguf: the GGUF file's blocks run as stored" in caplog.text
            assert "14 linears run from their stored blocks" in caplog.text
            layers = llm.llm_engine.runner.model.layers
            # layer 0: every linear Q8_0; layer 1: q/k/v Q4_0 + Q8_0 (a kernel call per
            # part), o Q5_1, gate/up Q4_1, down BF16 dequantized; the embeddings and the tied
            # LM head from the embeddings' Q5_0 blocks
            assert all(isinstance(lin, GGUFLinear) and lin.use_kernel == kernels_built
                       for lin in (layers[0].self_attn.qkv, layers[0].o_proj,
                                   layers[0].mlp.gate_up, layers[0].mlp.down,
                                   layers[1].self_attn.qkv, layers[1].o_proj,
                                   layers[1].mlp.gate_up, model.lm_head))
            assert not isinstance(layers[1].mlp.down, GGUFLinear)
            assert isinstance(model.embed, BlockWeight) and model.embed.qtype == 6
            assert not kernels_built or layers[1].self_attn.qkv.qtypes == [2, 8]
        outputs[quantization] = [o.outputs[0] for o in llm.generate(PROMPTS, params,
                                                                       use_tqdm=False)]
    assert_close_to_dequantized(outputs[None], outputs["none"])


def assert_close_to_dequantized(outputs, references) -> None:
    """Greedy outputs from the blocks against the dequantized file's (logprobs=2)."""
    for out, ref in zip(outputs, references, strict=True):
        # The kernel quantizes the activations to int8 blocks of 32 (or, on AMX tiles for
        # a prompt of 32 tokens and more, rounds them to bf16): close, not equal. A tiny
        # random model's next-token distribution is flat (top logprobs near -2.5), so the
        # greedy paths may part at a near-tie: up to there, the same tokens with logprobs
        # 0.2 apart (measured: at most 0.154 on a Zen 5, most under 0.07;
        # quantization="int8", W8A8 in blocks of 16, is 1.6 off); there, the token gguf took
        # is in the reference's top 2, 0.15 from the reference's choice.
        same = next((i for i, (a, b) in enumerate(zip(out.token_ids, ref.token_ids))
                     if a != b), len(ref.token_ids))
        logprobs = [out.logprobs[i][t].logprob for i, t in enumerate(out.token_ids[:same])]
        ref_logprobs = [ref.logprobs[i][t].logprob for i, t in enumerate(ref.token_ids[:same])]
        assert np.allclose(logprobs, ref_logprobs, atol=0.2), (logprobs, ref_logprobs)
        if same < len(ref.token_ids):
            top = ref.logprobs[same]
            taken, chosen = out.token_ids[same], ref.token_ids[same]
            assert taken in top and top[chosen].logprob - top[taken].logprob < 0.15, top


def test_bfloat16_runs_the_blocks_with_a_bf16_kv_cache(blocks_gguf):
    """--dtype bfloat16 with the blocks is the CPU's bf16: the blocks as stored, fp32
    activations, bf16 KV cache."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
    outputs = {}
    for dtype in ("float32", "bfloat16"):
        llm = LLM(str(blocks_gguf), dtype=dtype, block_size=4, num_kv_blocks=64)
        runner = llm.llm_engine.runner
        layers = runner.model.layers
        assert isinstance(layers[0].self_attn.qkv, GGUFLinear)
        assert isinstance(runner.model.lm_head, GGUFLinear)
        assert runner.dtype == torch.float32
        assert runner.kv_dtype == getattr(torch, dtype)
        outputs[dtype] = [o.outputs[0] for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    for out, ref in zip(outputs["bfloat16"], outputs["float32"]):
        # Only the KV cache's rounding (and down_proj's bf16) apart: the first token's
        # logprobs close (its K/V rounded once).
        first = out.logprobs[0][out.token_ids[0]].logprob
        assert first == pytest.approx(ref.logprobs[0][out.token_ids[0]].logprob, abs=0.1)


def test_gguf_quantization_errors(tiny_llama, blocks_gguf):
    with pytest.raises(ValueError, match="must be a .gguf file"):
        EngineConfig(model=str(tiny_llama), quantization="gguf")
    with pytest.raises(ValueError, match="dtype='float16' with quantization='gguf'"):
        EngineConfig(model=str(blocks_gguf), dtype="float16")
    # Off the CPU the blocks' products are fp32: bf16 activations are named, with the way out
    with pytest.raises(ValueError, match="dtype='bfloat16' on cuda with quantization='gguf'.*"
                                         "--quantization none --dtype bfloat16"):
        LLM(str(blocks_gguf), dtype="bfloat16", device="cuda", num_kv_blocks=16)
    assert EngineConfig(model=str(blocks_gguf)).model_config.quantization == "gguf"


@pytest.mark.real_model
def test_smollm2_q4_1_linears_and_q8_0_head_run_from_their_blocks(model_dir, caplog):
    """SmolLM2's file is Q4_1 (embeddings Q8_0, the LM head tied to them): every linear
    runs from its blocks."""
    with caplog.at_level(logging.INFO, logger="minivllm.model.gguf"):
        state = load_state_dict(model_dir, keep_gguf_blocks=True)
    assert state["model.embed_tokens.weight"].qtype == GGMLQuantizationType.Q8_0
    assert ("211 linears run from their stored blocks (Q4_1: 210, Q8_0: 1), 0 dequantized to "
            "float32 (none); token embeddings Q8_0, rows dequantized as looked up (the LM "
            "head tied to them)") in caplog.text
