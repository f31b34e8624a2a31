"""--kv-cache-dtype bfloat16: the C kernels reading a bf16 cache against the torch reference
on the same cache, the fused K/V write against torch's rounding, and the engine against
the fp32-cache engine on real weights (stories260K), with the tolerances stated here."""

import math

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config import EngineConfig
from minivllm.model.attention import _one_request, padded_decode_attention
from minivllm.model.kernels import attention_ops, library
from tests.kernel_marks import needs_kernels
from tests.model.test_prefill_kernel import _batch


@needs_kernels
@pytest.mark.parametrize("heads, kv_heads, dim, block_size", [(6, 2, 64, 4), (4, 4, 24, 16),
                                                                 (10, 2, 80, 16)])
def test_decode_kernel_reads_bf16_cache(heads, kv_heads, dim, block_size):
    """The kernel widens bf16 to fp32 exactly, so it equals the fp32 math on the widened
    cache up to summation order."""
    q, k_cache, v_cache, _, table, _, seq_lens = _batch(
        [1] * 5, [0, 3, 9, 16, 30], heads, kv_heads, dim, block_size, seed=1)
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    scale = dim ** -0.5
    got = attention_ops.paged_decode_attention(q, k16, v16, table, seq_lens, scale)
    expected = padded_decode_attention(q, k16, v16, table, seq_lens, block_size, scale)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_prefill_kernel_reads_bf16_cache():
    """paged_prefill_attention.c's kernel (bf16_products=False, and where the kernels have
    no bf16 products) as exact as over fp32; on bf16 products (AMX tiles or AVX-512 BF16
    pair dots) within their rounding of q and the probabilities to bf16."""
    q, k_cache, v_cache, tables, table, qsl, seq_lens = _batch(
        [5, 17, 1, 40], [0, 7, 12, 3], 6, 2, 32, 8, seed=2)
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    got = attention_ops.paged_prefill_attention(q, k16, v16, table, qsl, seq_lens, 0.2)
    exact = attention_ops.paged_prefill_attention(q, k16, v16, table, qsl, seq_lens, 0.2,
                                                  bf16_products=False)
    atol = 2e-2 if library.bf16_prefill_products() else 1e-5
    for i, blocks in enumerate(tables):
        start, end = qsl[i].item(), qsl[i + 1].item()
        expected = _one_request(q[start:end], k16, v16, blocks, seq_lens[i].item(), 0.2)
        torch.testing.assert_close(got[start:end], expected, rtol=1e-5, atol=atol)
        torch.testing.assert_close(exact[start:end], expected, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_fused_kv_write_rounds_as_torch():
    """rope_write_kv's fp32 -> bf16 store is torch's round-to-nearest-even, bit for bit."""
    tokens, heads, kv_heads, dim = 7, 4, 2, 16
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim) * 3
    positions = torch.arange(tokens)
    cos, sin = torch.ones(tokens, dim), torch.zeros(tokens, dim)  # rotation by 0
    slots = torch.tensor([5, 0, 9, 3, 11, 2, 7])
    caches = [torch.zeros(12, 1, kv_heads, dim, dtype=torch.bfloat16) for _ in range(2)]
    k = qkv[:, heads * dim:(heads + kv_heads) * dim].clone()
    v = qkv[:, (heads + kv_heads) * dim:].clone()
    attention_ops.rope_write_kv(qkv, positions, (cos, sin), slots, *caches, heads, kv_heads, dim)
    for cache, x in zip(caches, (k, v)):
        assert torch.equal(cache.view(12, -1)[slots], x.bfloat16())


def test_kv_cache_dtype_flag_and_its_errors():
    assert EngineConfig(kv_cache_dtype="bfloat16").kv_cache_dtype == "bfloat16"
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, bfloat16"):
        EngineConfig(kv_cache_dtype="float16")


def test_engine_bf16_cache_against_fp32_cache(stories_dir):
    """16 prompts x 32 greedy tokens on real weights. Twice the blocks in the same space;
    stated tolerances (measured here: 0.0046, -0.06%, 95%): mean |dlogprob| of the
    fp32-cache engine's greedy tokens below 0.02, teacher-forced perplexity within 0.5%,
    and on average at least 75% of each continuation identical before the first
    difference."""
    prompts = [[1] + [(7 * i + 13 * j) % 480 + 20 for j in range(3 + i % 5)] for i in range(16)]
    kwargs = dict(seed=0, dtype="float32", kv_cache_space=0.02, swap_space=0.01)
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    scored = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    runs = {}
    for kv in ("auto", "bfloat16"):
        llm = LLM(str(stories_dir), kv_cache_dtype=kv, **kwargs)
        tokens = [o.outputs[0].token_ids for o in llm.generate(
            [{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)]
        runs[kv] = (llm.llm_engine.runner.num_blocks, tokens)
        if kv == "auto":  # score both engines on the fp32 engine's continuations
            sequences = [p + t for p, t in zip(prompts, tokens)]
        outs = llm.generate([{"prompt_token_ids": s} for s in sequences], scored,
                            use_tqdm=False)
        runs[kv] += ([[e[t].logprob for e, t in zip(o.prompt_logprobs[1:],
                                                    o.prompt_token_ids[1:])] for o in outs],)
    (fp32_blocks, reference, base), (bf16_blocks, tokens, scores) = runs.values()
    assert abs(bf16_blocks - 2 * fp32_blocks) <= 1  # the space holds twice the blocks
    deltas = [abs(a - b) for s, r in zip(scores, base) for a, b in zip(s[-32:], r[-32:])]
    assert sum(deltas) / len(deltas) < 0.02
    nll = lambda rows: -sum(map(sum, rows)) / sum(map(len, rows))  # noqa: E731
    assert abs(math.exp(nll(scores)) / math.exp(nll(base)) - 1) < 0.005
    prefixes = [next((i for i, (a, b) in enumerate(zip(t, r)) if a != b), 32)
                for t, r in zip(tokens, reference)]
    assert sum(prefixes) / (32 * len(prefixes)) >= 0.75
