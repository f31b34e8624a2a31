"""Sliding-window and logit-capped attention (Gemma 2/3, Mistral): every batched path —
the C decode and prefill kernels and the torch fallbacks — against a dense oracle written
from the definition, and the blocks wholly before a window are never read."""

import pytest
import torch

from minivllm.model.attention import AttentionMetadata, paged_attention
from minivllm.model.kernels import library

KERNEL_BUILT = library.available(torch.device("cpu"), torch.float32)
BLOCK, HEADS, KV_HEADS = 4, 6, 2
# 8: the decode kernel's scalar loops; 32: its vector ones (AVX2, or AVX-512's wide kernel)
DIMS = [8, 32]
# Decodes first (as the runner orders a batch), then prefill chunks, some on cached context;
# the long prefill spans several query tiles of the C kernel (64 rows / GQA group 3).
QUERY_LENS, SEQ_LENS = [1, 1, 1, 5, 3, 70], [9, 3, 40, 5, 31, 90]


def _batch(seed: int = 0, dim: int = 8):
    torch.manual_seed(seed)
    num_blocks = sum(-(-n // BLOCK) for n in SEQ_LENS) + 1
    k_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, dim)
    v_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, dim)
    blocks = torch.randperm(num_blocks - 1).add(1).tolist()  # block 0: the padding entry
    tables, at = [], 0
    for n in SEQ_LENS:
        tables.append(blocks[at:at - (-n // BLOCK)])
        at += len(tables[-1])
    width = max(len(t) for t in tables)
    starts = [0]
    for n in QUERY_LENS:
        starts.append(starts[-1] + n)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(0, dtype=torch.long),
        block_table=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        seq_lens=torch.tensor(SEQ_LENS), query_start_loc=torch.tensor(starts), num_decodes=3,
        num_tokens=sum(QUERY_LENS), block_size=BLOCK)
    q = torch.randn(sum(QUERY_LENS), HEADS, dim)
    return q, k_cache, v_cache, tables, meta


def _dense(q, k_cache, v_cache, tables, scale, window, softcap):
    """Query at position p sees positions max(0, p - window + 1) .. p: plain loops."""
    out, row = torch.empty_like(q), 0
    for table, query_len, seq_len in zip(tables, QUERY_LENS, SEQ_LENS):
        k = k_cache[table].flatten(0, 1)[:seq_len].repeat_interleave(HEADS // KV_HEADS, 1)
        v = v_cache[table].flatten(0, 1)[:seq_len].repeat_interleave(HEADS // KV_HEADS, 1)
        for i in range(query_len):
            pos = seq_len - query_len + i
            lo = max(0, pos - window + 1) if window else 0
            scores = torch.einsum("hd,lhd->hl", q[row], k[lo:pos + 1]) * scale
            if softcap:
                scores = torch.tanh(scores / softcap) * softcap
            out[row] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v[lo:pos + 1])
            row += 1
    return out


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (5, 0.0), (16, 0.0), (8, 2.0), (0, 2.0)])
@pytest.mark.parametrize("path", ["reference", "torch"] + (["kernel"] if KERNEL_BUILT else []))
@pytest.mark.parametrize("dim", DIMS)
def test_window_and_softcap_match_dense_oracle(path, window, softcap, dim):
    q, k_cache, v_cache, tables, meta = _batch(dim=dim)
    meta.use_reference, meta.use_kernel = path == "reference", path == "kernel"
    got = paged_attention(q, k_cache, v_cache, meta, 0.3, window, softcap)
    expected = _dense(q, k_cache, v_cache, tables, 0.3, window, softcap)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("path", ["reference"] + (["kernel"] if KERNEL_BUILT else []))
@pytest.mark.parametrize("dim", DIMS)
def test_blocks_before_the_window_are_never_read(path, dim):
    """NaN in every block that lies wholly before each request's window: NaN would spread
    to the output if a path read it (a zero-weight NaN is still NaN). The C kernels and
    the per-request torch path (the reference, and prefill without the kernels) skip them;
    the padded torch decode path gathers them (then masks them)."""
    window = 9
    q, k_cache, v_cache, tables, meta = _batch(seed=1, dim=dim)
    meta.use_reference, meta.use_kernel = path == "reference", path == "kernel"
    expected = paged_attention(q, k_cache, v_cache, meta, 0.3, window)
    for table, query_len, seq_len in zip(tables, QUERY_LENS, SEQ_LENS):
        first_seen = max(0, seq_len - query_len - window + 1)  # the first query's window
        for block in table[:first_seen // BLOCK]:
            k_cache[block] = v_cache[block] = float("nan")
    got = paged_attention(q, k_cache, v_cache, meta, 0.3, window)
    torch.testing.assert_close(got, expected)
    meta.use_reference, meta.use_kernel = False, False  # the padded decode path reads them:
    assert paged_attention(q, k_cache, v_cache, meta, 0.3, window).isnan().any()
