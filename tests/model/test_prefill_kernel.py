"""The C prefill attention kernel (several new tokens per request, paged K/V read in place)
against the per-request reference: gathered context, dense causal mask, SDPA."""

import random

import pytest
import torch

from minivllm.model.attention import _one_request
from minivllm.model.kernels import attention_ops, library

pytestmark = pytest.mark.skipif(not library.available(torch.device("cpu"), torch.float32),
                                reason="no C compiler: no kernels built")


def _batch(query_lens, cached, heads, kv_heads, dim, block_size, seed, strided=False,
           q_scale=1.0):
    """Random caches holding each request's context in scattered blocks, its block table
    row padded with junk block ids, and queries for its last query_len positions."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [n + c for n, c in zip(query_lens, cached)]
    widths = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(widths) + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    order = torch.randperm(num_blocks, generator=gen)
    tables, start = [], 0
    for width in widths:
        tables.append(order[start:start + width])
        start += width
    # padding past a request's blocks: ids of other requests' blocks, never to be read
    block_table = torch.randint(0, num_blocks, (len(widths), max(widths) + 2), generator=gen)
    for i, table in enumerate(tables):
        block_table[i, :len(table)] = table
    query_start_loc = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()])
    q = torch.randn(sum(query_lens), heads + (kv_heads if strided else 0), dim,
                    generator=gen) * q_scale
    if strided:  # rows further apart than heads * dim, as q out of the fused q/k/v tensor
        q = q[:, :heads]
    return q, k_cache, v_cache, tables, block_table, query_start_loc, torch.tensor(seq_lens)


def _reference(q, k_cache, v_cache, tables, query_start_loc, seq_lens, scale):
    out = torch.empty(q.shape)
    for i, table in enumerate(tables):
        start, end = query_start_loc[i].item(), query_start_loc[i + 1].item()
        out[start:end] = _one_request(q[start:end], k_cache, v_cache, table,
                                      seq_lens[i].item(), scale)
    return out


def _check(query_lens, cached, heads, kv_heads, dim, block_size, seed=0, strided=False,
           q_scale=1.0, atol=1e-5):
    q, k_cache, v_cache, tables, table, qsl, seq_lens = _batch(
        query_lens, cached, heads, kv_heads, dim, block_size, seed, strided, q_scale)
    scale = dim ** -0.5
    got = attention_ops.paged_prefill_attention(q, k_cache, v_cache, table, qsl, seq_lens, scale)
    assert got.shape == q.shape and got.is_contiguous()
    expected = _reference(q, k_cache, v_cache, tables, qsl, seq_lens, scale)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=atol)
    return got


DIMS, BLOCK_SIZES, GROUPS = [32, 64, 128, 48], [1, 7, 16, 32], [1, 2, 4]


@pytest.mark.parametrize("seed", range(24))
def test_random_batches_match_reference(seed):
    """Every head_dim, block size and GQA ratio over the seeds; random query lengths
    (1..300) on random cached prefixes (chunked prefill), several requests a batch."""
    rng = random.Random(seed)
    dim, block_size = DIMS[seed % 4], BLOCK_SIZES[seed // 4 % 4]
    kv_heads = rng.randint(1, 3)
    heads = kv_heads * GROUPS[seed % 3]
    num_reqs = rng.randint(1, 4)
    query_lens = [rng.choice([1, rng.randint(2, 40), rng.randint(41, 300)])
                  for _ in range(num_reqs)]
    cached = [rng.choice([0, rng.randint(1, 60), rng.randint(61, 400)])
              for _ in range(num_reqs)]
    _check(query_lens, cached, heads, kv_heads, dim, block_size, seed, strided=seed % 2 == 1)


@pytest.mark.parametrize("query_lens,cached,heads,kv_heads,dim,block_size", [
    ([1], [0], 2, 1, 64, 16),  # a one-token prompt
    ([1, 1, 1], [5, 0, 31], 4, 2, 64, 16),  # decode-like rows only
    ([300], [0], 9, 3, 64, 16),  # SmolLM-135M's attention shape, a whole prompt
    ([200, 37], [700, 3], 14, 2, 64, 16),  # Qwen2.5-0.5B's: a chunk on a long prefix
    ([65, 64, 63], [0, 1, 15], 8, 8, 128, 32),  # tile and step edges, no GQA
    ([23, 9], [4, 17], 12, 2, 5, 7),  # head_dim below one register block (any works)
    ([40], [10], 6, 1, 24, 1),  # head_dim with a remainder; MQA; one token per block
    ([17], [0], 80, 1, 16, 16),  # a group wider than an item's target rows
])
def test_shapes_match_reference(query_lens, cached, heads, kv_heads, dim, block_size):
    _check(query_lens, cached, heads, kv_heads, dim, block_size)


def test_peaked_scores_match_reference():
    """Large scores: the running max moves, outputs are rescaled and most exp underflow."""
    _check([150, 20], [90, 300], 8, 2, 64, 16, seed=3, q_scale=30.0, atol=1e-4)


def test_same_result_on_any_thread_count():
    """Each (request, kv head, query tile) is one thread's work: no cross-thread sums."""
    batch = _batch([120, 7, 250], [0, 33, 140], 9, 3, 64, 16, seed=5)
    q, k_cache, v_cache, _, table, qsl, seq_lens = batch
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(attention_ops.paged_prefill_attention(q, k_cache, v_cache, table, qsl,
                                                                 seq_lens, 0.125))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


def test_non_contiguous_q_is_accepted():
    q, k_cache, v_cache, tables, table, qsl, seq_lens = _batch([30, 12], [5, 0], 4, 2, 32, 16,
                                                               seed=7)
    transposed = q.transpose(0, 1).contiguous().transpose(0, 1)  # heads outermost in memory
    got = attention_ops.paged_prefill_attention(transposed, k_cache, v_cache, table, qsl,
                                                seq_lens, 0.2)
    torch.testing.assert_close(got, _reference(q, k_cache, v_cache, tables, qsl, seq_lens,
                                               0.2), rtol=1e-5, atol=1e-5)
