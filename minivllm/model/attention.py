"""Paged attention on the CPU (or any torch device).

K and V of every layer live in blocks: [num_blocks, block_size, num_kv_heads, head_dim].
Each step writes its new K/V at the tokens' slots, then every request attends over its
own blocks. `reference_attention` gathers each request's blocks and runs causal SDPA —
the oracle that faster paths are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] flat slot (block * block_size + offset) of each new token
    query_lens: list[int]  # new tokens per request, in batch order
    seq_lens: list[int]  # context length per request after this step
    block_tables: list[torch.Tensor]  # per request: its block ids (long)
    block_size: int
    # Decode-only batches (every query_len == 1) use a padded batched path.
    decode_block_table: torch.Tensor | None = None  # [B, max_blocks]
    decode_seq_lens: torch.Tensor | None = None  # [B]


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    num_kv_heads, head_dim = k.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def _gather(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[seq_len, num_kv_heads, head_dim] of one request's context."""
    return cache[block_table].flatten(0, 1)[:seq_len]


def reference_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q: [T, num_heads, head_dim] -> [T, num_heads, head_dim]. One SDPA per request."""
    out = torch.empty_like(q)
    start = 0
    for query_len, seq_len, table in zip(meta.query_lens, meta.seq_lens, meta.block_tables):
        qi = q[start:start + query_len].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        ki = _gather(k_cache, table, seq_len).transpose(0, 1).unsqueeze(0)  # [1, KVH, L, D]
        vi = _gather(v_cache, table, seq_len).transpose(0, 1).unsqueeze(0)
        mask = None
        if query_len > 1:  # query i sits at position seq_len - query_len + i
            mask = torch.ones(query_len, seq_len, dtype=torch.bool, device=q.device)
            mask = mask.tril(diagonal=seq_len - query_len)
        oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale,
                                            enable_gqa=True)
        out[start:start + query_len] = oi.squeeze(0).transpose(0, 1)
        start += query_len
    return out


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """All requests decode one token: gather padded contexts, one masked SDPA."""
    table, seq_lens = meta.decode_block_table, meta.decode_seq_lens
    batch, max_blocks = table.shape
    k = k_cache[table].flatten(1, 2).transpose(1, 2)  # [B, KVH, L, D]
    v = v_cache[table].flatten(1, 2).transpose(1, 2)
    positions = torch.arange(max_blocks * meta.block_size, device=q.device)
    mask = (positions[None, :] < seq_lens[:, None])[:, None, None, :]  # [B, 1, 1, L]
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, scale=scale,
                                         enable_gqa=True)
    return out.squeeze(2)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    if meta.decode_block_table is not None:
        return decode_attention(q, k_cache, v_cache, meta, scale)
    return reference_attention(q, k_cache, v_cache, meta, scale)
