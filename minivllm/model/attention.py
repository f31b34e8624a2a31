"""Paged attention on the CPU (or any torch device).

K and V of every layer live in blocks: [num_blocks, block_size, num_kv_heads, head_dim].
Each step writes its new K/V at the tokens' slots, then every request attends over its
own blocks. `reference_attention` gathers each request's blocks and runs one causal SDPA
per request — the oracle. The fast path batches all one-token (decode) requests together —
in the C kernel reading blocks through the block table when it is available (CPU, fp32),
else as one masked SDPA over padded gathered contexts — and keeps per-request SDPA only
for multi-token (prefill) chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minivllm.model.kernels import cpu


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] flat slot (block * block_size + offset) of each new token
    query_lens: list[int]  # new tokens per request, in batch order
    seq_lens: list[int]  # context length per request after this step
    block_tables: list[torch.Tensor]  # per request: its block ids (long)
    block_size: int
    use_reference: bool = False
    use_kernel: bool = False  # decodes through the C kernel (CPU, fp32, kernels built)
    # The fast path's split: decodes batched, prefill chunks one by one.
    decode_token_index: torch.Tensor | None = None  # [B] rows of the decodes in the batch
    decode_block_table: torch.Tensor | None = None  # [B, max_blocks], padded with block 0
    decode_seq_lens: torch.Tensor | None = None  # [B]
    all_decode: bool = False
    prefill_indices: list[int] | None = None  # which requests are prefill chunks


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    num_kv_heads, head_dim = k.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def _one_request(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 table: torch.Tensor, seq_len: int, scale: float) -> torch.Tensor:
    """q: [n, H, D] of one request's new tokens, the last n of its seq_len positions."""
    query_len = q.shape[0]
    k = k_cache[table].flatten(0, 1)[:seq_len].transpose(0, 1).unsqueeze(0)  # [1, KVH, L, D]
    v = v_cache[table].flatten(0, 1)[:seq_len].transpose(0, 1).unsqueeze(0)
    mask = None
    if query_len > 1:  # query i sits at position seq_len - query_len + i
        mask = torch.ones(query_len, seq_len, dtype=torch.bool, device=q.device)
        mask = mask.tril(diagonal=seq_len - query_len)
    out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k, v, attn_mask=mask,
                                         scale=scale, enable_gqa=True)
    return out.squeeze(0).transpose(0, 1)


def reference_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q: [T, num_heads, head_dim] -> [T, num_heads, head_dim]. One SDPA per request."""
    out = torch.empty_like(q)
    start = 0
    for query_len, seq_len, table in zip(meta.query_lens, meta.seq_lens, meta.block_tables):
        out[start:start + query_len] = _one_request(
            q[start:start + query_len], k_cache, v_cache, table, seq_len, scale)
        start += query_len
    return out


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q: [B, H, D], one new token per request."""
    if meta.use_kernel:
        return cpu.paged_decode_attention(q, k_cache, v_cache, meta.decode_block_table,
                                          meta.decode_seq_lens, scale)
    return padded_decode_attention(q, k_cache, v_cache, meta, scale)


def padded_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """The portable decode path: gather padded contexts, one masked SDPA."""
    table, seq_lens = meta.decode_block_table, meta.decode_seq_lens
    max_blocks = table.shape[1]
    k = k_cache[table].flatten(1, 2).transpose(1, 2)  # [B, KVH, L, D]
    v = v_cache[table].flatten(1, 2).transpose(1, 2)
    positions = torch.arange(max_blocks * meta.block_size, device=q.device)
    mask = (positions[None, :] < seq_lens[:, None])[:, None, None, :]  # [B, 1, 1, L]
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, scale=scale,
                                         enable_gqa=True)
    return out.squeeze(2)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    if meta.use_reference:
        return reference_attention(q, k_cache, v_cache, meta, scale)
    if meta.all_decode:
        return decode_attention(q, k_cache, v_cache, meta, scale)
    out = torch.empty_like(q)
    if meta.decode_token_index is not None:
        index = meta.decode_token_index
        out[index] = decode_attention(q[index], k_cache, v_cache, meta, scale)
    starts = [0]
    for query_len in meta.query_lens:
        starts.append(starts[-1] + query_len)
    for i in meta.prefill_indices:
        start, end = starts[i], starts[i + 1]
        out[start:end] = _one_request(q[start:end], k_cache, v_cache, meta.block_tables[i],
                                      meta.seq_lens[i], scale)
    return out
