"""Every CPU fast path against its reference: the C decode-attention kernel and the padded
torch decode path against per-request SDPA, the fused C layer ops and oneDNN linear layers
against their torch ops, the one-roll RoPE against transformers' formula, the whole engine
with kernels on and off, and the thread governor's choice."""

import pytest
import torch
import torch.nn.functional as F

from minivllm import LLM, SamplingParams
from minivllm.model.attention import (
    AttentionMetadata,
    padded_decode_attention,
    reference_attention,
    write_kv,
)
from minivllm.model.kernels import attention_ops, fused_ops, library, sampler_ops, threads
from minivllm.model.linear.onednn import Linear
from minivllm.model.rope import RotaryEmbedding, apply_rope
from tests.model_factory import CONFIGS

kernel_built = library.available(torch.device("cpu"), torch.float32)
needs_kernels = pytest.mark.skipif(
    not kernel_built, reason="no C kernels here (no compiler, a failed build, or disabled)")


def _decode_batch(seq_lens, heads, kv_heads, dim, block_size, seed=0):
    """Random paged caches and one decode query per sequence, blocks scattered."""
    gen = torch.Generator().manual_seed(seed)
    widths = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(widths) + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables, start = [], 0
    for w in widths:
        tables.append(order[start:start + w])
        start += w
    width = max(widths)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(0, dtype=torch.long),
        block_table=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        seq_lens=torch.tensor(seq_lens), query_start_loc=torch.arange(len(seq_lens) + 1),
        num_decodes=len(seq_lens), num_tokens=len(seq_lens), block_size=block_size, use_kernel=kernel_built)
    q = torch.randn(len(seq_lens), heads, dim, generator=gen)
    return q, k_cache, v_cache, meta


SHAPES = [  # seq_lens, heads, kv_heads, head_dim, block_size
    ([1, 5, 16, 17, 40, 200], 9, 3, 64, 16),  # SmolLM's heads; partial and full blocks
    ([3, 33, 64], 8, 8, 128, 32),  # no GQA, the other specialised head_dim
    ([7, 2, 11], 4, 2, 24, 4),  # a head_dim with no specialised copy
    ([9, 3, 20], 4, 2, 12, 8),  # not a multiple of 8: the scalar loops, not the AVX2 ones
    # AVX-512's wide kernel scores a group's heads 3 at a time and values 64 dims at a time:
    ([5, 30, 47], 8, 2, 80, 16),  # groups of 4 (3 + 1 heads), 64 + 16 dims
    ([2, 17, 24], 10, 2, 32, 8),  # groups of 5 (3 + 2 heads), a head_dim under 64
]


@needs_kernels
@pytest.mark.parametrize("seq_lens,heads,kv_heads,dim,block_size", SHAPES)
def test_c_decode_kernel_matches_reference(seq_lens, heads, kv_heads, dim, block_size):
    q, k_cache, v_cache, meta = _decode_batch(seq_lens, heads, kv_heads, dim, block_size)
    expected = reference_attention(q, k_cache, v_cache, meta, dim ** -0.5)
    got = attention_ops.paged_decode_attention(q, k_cache, v_cache, meta.block_table,
                                        meta.seq_lens, dim ** -0.5)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # q may be a strided view (the engine passes q out of the fused q/k tensor)
    wide = torch.cat([q, torch.randn(q.shape[0], kv_heads, dim)], dim=1)[:, :heads]
    torch.testing.assert_close(attention_ops.paged_decode_attention(
        wide, k_cache, v_cache, meta.block_table, meta.seq_lens, dim ** -0.5),
        expected, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_loading_the_kernels_keeps_subnormal_floats():
    """Linked with -ffast-math, the library would turn on flush-to-zero process-wide."""
    assert 5e-324 * 1.0 > 0.0
    assert torch.tensor([1e-40]).mul(1.0).item() > 0.0


@pytest.mark.parametrize("seq_lens,heads,kv_heads,dim,block_size", SHAPES)
def test_padded_decode_path_matches_reference(seq_lens, heads, kv_heads, dim, block_size):
    q, k_cache, v_cache, meta = _decode_batch(seq_lens, heads, kv_heads, dim, block_size)
    got = padded_decode_attention(q, k_cache, v_cache, meta.block_table, meta.seq_lens,
                                  block_size, 0.2)
    torch.testing.assert_close(got, reference_attention(q, k_cache, v_cache, meta, 0.2))


@needs_kernels
@pytest.mark.parametrize("rows", [1, 5, 3000])  # 3000 rows: split over threads
def test_fused_layer_ops_match_torch(rows):
    gen = torch.Generator().manual_seed(rows)
    x, weight = torch.randn(rows, 48, generator=gen), torch.randn(48, generator=gen)
    expected = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(fused_ops.rms_norm(x, weight, 1e-5), expected)
    gate_up = torch.randn(rows, 64, generator=gen)
    torch.testing.assert_close(fused_ops.silu_and_mul(gate_up),
                               F.silu(gate_up[:, :32]) * gate_up[:, 32:])


@needs_kernels
@pytest.mark.parametrize("rows,cols", [(1, 7), (3, 49152), (64, 5000)])
def test_c_argmax_matches_torch_first_index_on_ties(rows, cols):
    gen = torch.Generator().manual_seed(cols)
    x = torch.randint(-3, 4, (rows, cols), generator=gen).float()  # many ties
    x[0, :2] = float("-inf")
    assert torch.equal(sampler_ops.argmax(x), x.argmax(dim=-1))
    x = torch.randn(rows, cols, generator=gen)
    assert torch.equal(sampler_ops.argmax(x), x.argmax(dim=-1))


@needs_kernels
@pytest.mark.parametrize("tokens", [37, 300])  # 300: split over the threads
@pytest.mark.parametrize("kind", ["llama", "llama3-rope"])
def test_fused_rope_and_kv_write_match_torch(kind, tokens):
    cfg = CONFIGS[kind]()
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    rope = RotaryEmbedding(cfg, dim)
    gen = torch.Generator().manual_seed(1)
    num_slots = 4 * (tokens // 2 + 1)  # blocks of 4 slots, about twice the tokens
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen)
    positions = torch.randint(0, cfg.max_position_embeddings, (tokens,), generator=gen)
    slots = torch.randperm(num_slots, generator=gen)[:tokens]
    caches = [torch.zeros(num_slots // 4, 4, kv_heads, dim) for _ in range(4)]
    qk = qkv[:, :(heads + kv_heads) * dim].view(tokens, heads + kv_heads, dim)
    expected = apply_rope(qk, rope.at(positions, torch.float32))
    v = qkv[:, (heads + kv_heads) * dim:].reshape(tokens, kv_heads, dim)
    write_kv(caches[0], caches[1], expected[:, heads:], v, slots)
    attention_ops.rope_write_kv(qkv, positions, rope.tables, slots, caches[2], caches[3], heads,
                                kv_heads, dim)
    torch.testing.assert_close(qk[:, :heads], expected[:, :heads])
    torch.testing.assert_close(caches[2], caches[0])
    assert torch.equal(caches[3], caches[1])


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_onednn_linear_matches_f_linear(rows, dtype):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 80, generator=gen).to(dtype)
    bias = torch.randn(96, generator=gen).to(dtype)
    x = torch.randn(rows, 80, generator=gen).to(dtype)
    residual = torch.randn(rows, 96, generator=gen).to(dtype)
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)
    fast, plain = Linear(weight, bias), Linear(weight, bias, onednn=False)
    # bf16 packs only where oneDNN has bf16 hardware (avx512_bf16-class); elsewhere F.linear
    packs = dtype == torch.float32 or torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert fast.onednn == (packs and torch.backends.mkldnn.is_available()) and not plain.onednn
    torch.testing.assert_close(fast(x), F.linear(x, weight, bias), **tol)
    torch.testing.assert_close(fast(x, residual=residual),
                               residual + F.linear(x, weight, bias), **tol)
    torch.testing.assert_close(plain(x, residual=residual),
                               residual + F.linear(x, weight, bias))


def test_rope_is_bit_identical_to_rotate_half():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 6, 16, generator=gen)
    cos, sin = torch.randn(5, 1, 16, generator=gen), torch.randn(5, 1, 16, generator=gen)
    rotated = torch.cat([-x[..., 8:], x[..., :8]], dim=-1)
    signed_sin = torch.cat([-sin[..., :8], sin[..., 8:]], dim=-1)
    assert torch.equal(apply_rope(x, (cos, signed_sin)), x * cos + rotated * sin)


@needs_kernels  # else both runs would take the torch path (fallbacks: test_kernel_build.py)
def test_engine_greedy_identical_with_kernels_on_and_off(tiny_llama, monkeypatch):
    prompts = [{"prompt_token_ids": [1] + [(i * 11 + n) % 500 + 3 for i in range(n)]}
               for n in (1, 6, 19, 33, 50)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=0)
    runs = []
    for disabled in ("", "1"):
        monkeypatch.setenv("MINIVLLM_DISABLE_KERNELS", disabled)
        llm = LLM(str(tiny_llama), block_size=4, num_kv_blocks=96, max_num_batched_tokens=32)
        runs.append(llm.generate(prompts, params, use_tqdm=False))
    for fast, slow in zip(*runs):
        assert fast.outputs[0].token_ids == slow.outputs[0].token_ids
        got = [e[t].logprob for e, t in zip(fast.outputs[0].logprobs, fast.outputs[0].token_ids)]
        ref = [e[t].logprob for e, t in zip(slow.outputs[0].logprobs, slow.outputs[0].token_ids)]
        assert got == pytest.approx(ref, abs=1e-4)


@pytest.mark.parametrize("others,expected", [(0.0, 4), (0.4, 4), (0.7, 3), (2.2, 2), (9.0, 1)])
def test_thread_governor_runs_on_the_cores_others_leave(others, expected, monkeypatch):
    clock = iter([0.0, 1.0])
    monkeypatch.setattr(threads.time, "monotonic", lambda: next(clock))
    busy = iter([100.0, 100.0 + 1.0 + others])  # we used 1.0 s of it ourselves
    own = iter([10.0, 11.0])
    monkeypatch.setattr(threads, "_busy_seconds", lambda: next(busy))
    monkeypatch.setattr(threads, "_own_seconds", lambda: next(own))
    chosen = []
    monkeypatch.setattr(threads.torch, "set_num_threads", chosen.append)
    monkeypatch.setattr(threads.torch, "get_num_threads", lambda: 0)
    governor = threads.ThreadGovernor(max_threads=4)
    governor.num_cpus = 4
    governor.update()
    assert chosen == [expected]
