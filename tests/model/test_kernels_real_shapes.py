"""The C kernels against the torch path at the attention shapes of real published models.

The tiny models of the other tests have two KV heads; real ones do not all: Gemma 3 1B has
one KV head of 256 dims, four query heads, a 512-token window and a 262,144-token vocabulary.
Its per-head k-norm then reads a strided [T, 256] view of the fused qkv, which the C RMSNorm
once took for dense rows: wrong logits from the first token, torch path exact. Each case
here keeps a real model's head_dim, query / KV head counts, windows and vocabulary, with a
small hidden size and two layers, and runs the same prompts with the kernels on and off:
the same tokens, logprobs within 1e-4 (relative, where random weights make them large: fp32
sums in another order differ by ~1e-4 of the value at SmolLM2's width)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen3Config

from minivllm import LLM, SamplingParams
from minivllm.model.kernels import fused_ops
from tests.kernel_marks import needs_kernels
from tests.model_factory import word_tokenizer

_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
              initializer_range=0.2)

# name -> config: a real model's attention shape (from its published config.json).
REAL_SHAPES = {
    # google/gemma-3-1b-pt: head_dim 256, 4 heads / 1 KV head, window 512 (8 here, so that
    # prompts pass it), vocabulary 262,144, sliding and global layers
    "gemma-3-1b": lambda: Gemma3TextConfig(
        **_SMALL, vocab_size=262_144, num_attention_heads=4, num_key_value_heads=1,
        head_dim=256, sliding_window=8, query_pre_attn_scalar=256, tie_word_embeddings=False,
        layer_types=["sliding_attention", "full_attention"]),
    # Qwen/Qwen3-0.6B: head_dim 128, 16 heads / 8 KV heads, per-head q/k norms
    "qwen3-0.6b": lambda: Qwen3Config(**_SMALL, vocab_size=151_936, num_attention_heads=16,
                                      num_key_value_heads=8, head_dim=128),
    # a Qwen3 with one KV head: the strided k-norm view without Gemma's other parts
    "qwen3-1kv": lambda: Qwen3Config(**_SMALL, vocab_size=512, num_attention_heads=4,
                                     num_key_value_heads=1, head_dim=128),
    # HuggingFaceTB/SmolLM2-135M: head_dim 64, 9 heads / 3 KV heads (hidden 576, as it)
    "smollm2-135m": lambda: LlamaConfig(**{**_SMALL, "hidden_size": 576}, vocab_size=49_152,
                                        num_attention_heads=9, num_key_value_heads=3,
                                        head_dim=64),
    # meta-llama/Llama-3.2-1B: head_dim 64, 32 heads / 8 KV heads
    "llama-3.2-1b": lambda: LlamaConfig(**_SMALL, vocab_size=512, num_attention_heads=32,
                                        num_key_value_heads=8, head_dim=64),
}


@pytest.fixture(scope="module")
def real_shape_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("real-shapes")
    built = {}

    def get(name: str):
        if name not in built:
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(REAL_SHAPES[name](), dtype=torch.float32)
            model.save_pretrained(root / name)
            word_tokenizer().save_pretrained(root / name)
            built[name] = root / name
        return built[name]

    return get


@needs_kernels
def test_rms_norm_kernel_reads_a_strided_view():
    qkv = torch.randn(5, 4 * 256 + 2 * 256)
    k = qkv[:, 1024:1280]  # one KV head: a [T, 256] view with qkv's row stride
    weight, eps = torch.randn(256), 1e-6
    ref = weight * (k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps))
    torch.testing.assert_close(fused_ops.rms_norm(k, weight, eps), ref, atol=1e-5, rtol=1e-5)


@needs_kernels
@pytest.mark.parametrize("name", sorted(REAL_SHAPES))
def test_kernels_match_torch_at_real_attention_shapes(name, real_shape_dirs, monkeypatch):
    path = real_shape_dirs(name)
    # past the 8-token window; a prefill in chunks of 16, then decodes
    prompts = [{"prompt_token_ids": [1] + [(i * 7 + n) % 500 + 3 for i in range(n)]}
               for n in (3, 21, 40)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    runs = []
    for disabled in ("", "1"):
        monkeypatch.setenv("MINIVLLM_DISABLE_KERNELS", disabled)
        llm = LLM(str(path), block_size=16, num_kv_blocks=32, max_num_batched_tokens=16)
        runs.append(llm.generate(prompts, params, use_tqdm=False))
    for fast, slow in zip(*runs):
        got, ref = fast.outputs[0], slow.outputs[0]
        assert got.token_ids == ref.token_ids
        assert [e[t].logprob for e, t in zip(got.logprobs, got.token_ids)] == pytest.approx(
            [e[t].logprob for e, t in zip(ref.logprobs, ref.token_ids)], rel=1e-4, abs=1e-4)
