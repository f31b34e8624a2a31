"""Prefill attention on bf16 products, which a bf16 K/V cache runs: on AMX tiles
(amx_attention.c) on a CPU with AMX, else on AVX-512 BF16 pair dots (dpbf16_attention.c).
Each kernel against the per-request reference (gathered context, dense causal mask, SDPA in
fp32) within what rounding the queries and the probabilities to bf16 costs, on random batches
of every head_dim it takes, GQA ratio and block size; window, softcap and other head dims fall
back to paged_prefill_attention.c's kernel (the fp32 reference's tolerance)."""

import random

import pytest
import torch

from minivllm.model.attention import _one_request
from minivllm.model.kernels import attention_ops, library
from tests.model.test_prefill_kernel import _batch, _reference


def _runs(kernel: str) -> bool:
    """Whether this library runs the kernel: AMX where amx(), the pair dots where it was built
    with AVX512-BF16 (the avx512_bf16 and amx levels: a library with AMX has them too)."""
    if not library.available(torch.device("cpu"), torch.float32):
        return False
    return library.amx() if kernel == "amx" else library.bf16_prefill_products()


KERNELS = [pytest.param(kernel, marks=pytest.mark.skipif(
    not _runs(kernel), reason=f"the kernels run no {kernel} here (no such CPU feature, no "
                              "compiler, or MINIVLLM_ISA forced a lower level)"))
    for kernel in ("amx", "dpbf16")]
# the kernel a bf16 cache's prefill runs here (the dispatch's first choice)
DISPATCHED = "amx" if _runs("amx") else "dpbf16"

DIMS, BLOCK_SIZES, GROUPS = [32, 64, 128, 96, 256], [1, 7, 16, 32], [1, 3, 4, 7]  # 7: Qwen2.5-0.5B
PAIR_DIMS = [16, 64, 80, 128, 48]  # the pair dots take any multiple of 16


def _bf16_batch(query_lens, cached, heads, kv_heads, dim, block_size, seed):
    q, k_cache, v_cache, tables, table, qsl, seq_lens = _batch(
        query_lens, cached, heads, kv_heads, dim, block_size, seed)
    return q, k_cache.bfloat16(), v_cache.bfloat16(), tables, table, qsl, seq_lens


def _call(kernel, q, k_cache, v_cache, table, qsl, seq_lens, scale) -> tuple[int, torch.Tensor]:
    """The kernel itself (not the dispatch): its status (0, or -1 where it refuses the batch)
    and its output."""
    _, heads, dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    out = torch.empty_like(q)
    run = getattr(library._library(), f"paged_prefill_attention_{kernel}")
    status = run(
        q=q.data_ptr(), k_cache=k_cache.data_ptr(), v_cache=v_cache.data_ptr(),
        block_table=table.data_ptr(), query_start_loc=qsl.data_ptr(),
        seq_lens=seq_lens.data_ptr(), out=out.data_ptr(), num_reqs=seq_lens.shape[0],
        num_heads=heads, num_kv_heads=kv_heads, head_dim=dim, block_size=block_size,
        max_blocks=table.shape[1], q_stride=q.stride(0), scale=scale,
        num_threads=torch.get_num_threads())
    return status, out


def _run(kernel, *batch) -> torch.Tensor:
    """The kernel's output, which must take the batch."""
    status, out = _call(kernel, *batch)
    assert status == 0
    return out


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("seed", range(20))
def test_random_batches_match_reference_within_bf16(kernel, seed):
    """Random query lengths (1..300) on random cached prefixes (chunked prefill), several
    requests a batch. q x scale and the probabilities are rounded to bf16 (8 significant
    bits): outputs (averages of unit-normal values) within 2e-2, 1e-3 on average, of the
    fp32 reference over the same bf16 cache."""
    rng = random.Random(seed)
    dim = (DIMS if kernel == "amx" else PAIR_DIMS)[seed % 5]
    block_size = BLOCK_SIZES[seed // 5 % 4]
    kv_heads = rng.randint(1, 3)
    heads = kv_heads * GROUPS[seed % 4]
    num_reqs = rng.randint(1, 4)
    query_lens = [rng.choice([1, rng.randint(2, 40), rng.randint(41, 300)])
                  for _ in range(num_reqs)]
    cached = [rng.choice([0, rng.randint(1, 60), rng.randint(61, 400)])
              for _ in range(num_reqs)]
    q, k_cache, v_cache, tables, table, qsl, seq_lens = _bf16_batch(
        query_lens, cached, heads, kv_heads, dim, block_size, seed)
    scale = dim ** -0.5
    got = _run(kernel, q, k_cache, v_cache, table, qsl, seq_lens, scale)
    expected = _reference(q, k_cache, v_cache, tables, qsl, seq_lens, scale)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-2)
    assert (got - expected).abs().mean() < 1e-3
    if kernel == DISPATCHED:  # the dispatch runs it for a bf16 cache
        assert torch.equal(attention_ops.paged_prefill_attention(q, k_cache, v_cache, table, qsl,
                                                                 seq_lens, scale), got)


@pytest.mark.parametrize("kernel", KERNELS)
def test_long_prompt_and_sharp_scores(kernel):
    """A 1,000-token prompt with scores up to ~30 apart (the running max moves often, many
    probabilities underflow): still within bf16's error of the reference."""
    q, k_cache, v_cache, tables, table, qsl, seq_lens = _bf16_batch(
        [1000], [24], 9, 3, 64, 16, seed=5)
    q = q * 4
    scale = 64 ** -0.5
    got = _run(kernel, q, k_cache, v_cache, table, qsl, seq_lens, scale)
    expected = _reference(q, k_cache, v_cache, tables, qsl, seq_lens, scale)
    torch.testing.assert_close(got, expected, rtol=0, atol=5e-2)
    assert (got - expected).abs().mean() < 2e-3


@pytest.mark.skipif(not library.available(torch.device("cpu"), torch.float32),
                    reason="no kernels here")
@pytest.mark.parametrize("dim,window,softcap", [(40, 0, 0.0), (64, 20, 0.0), (64, 0, 5.0)])
def test_what_it_does_not_take_runs_the_fp32_kernel(dim, window, softcap):
    """head_dim 40 (both kernels return -1), a sliding window, a softcap:
    paged_prefill_attention.c's kernel, fp32 math over the bf16 cache."""
    q, k_cache, v_cache, tables, table, qsl, seq_lens = _bf16_batch(
        [30, 9], [5, 40], 4, 2, dim, 8, seed=1)
    scale = dim ** -0.5
    got = attention_ops.paged_prefill_attention(q, k_cache, v_cache, table, qsl, seq_lens, scale,
                                                window, softcap)
    for i, blocks in enumerate(tables):
        start, end = qsl[i].item(), qsl[i + 1].item()
        expected = _one_request(q[start:end], k_cache, v_cache, blocks, seq_lens[i].item(),
                                scale, window, softcap)
        # 1e-4: fp32 rounding (torch's reduction order varies with its thread count), 200x
        # under what the bf16 tiles are allowed
        torch.testing.assert_close(got[start:end], expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kernel", KERNELS)
def test_head_dim_it_does_not_take_is_refused(kernel):
    """A head_dim off the kernel's multiple returns -1 and leaves the output to the caller."""
    q, k_cache, v_cache, _, table, qsl, seq_lens = _bf16_batch([5], [3], 2, 1, 40, 8, seed=2)
    status, _ = _call(kernel, q, k_cache, v_cache, table, qsl, seq_lens, 40 ** -0.5)
    assert status == -1
